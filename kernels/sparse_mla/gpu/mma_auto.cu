// cuda_mma_auto (launch.h): the low-head union kernel (mma_lowh.cuh) where neighbouring tokens
// share rows, elsewhere the ping-pong wgmma kernel (wgmma_pp.cuh, its rows padded to 64) where
// it runs and the one-token kernel (mma.cuh) where it does not, chosen on the device. A memset
// and the estimate kernel sample token groups as kMmaLowH stacks them into MmaAutoHeader; both
// kernels are then launched, each gated by the header's choice (the other's CTAs return at
// entry).
// Its cost over the chosen kernel alone is the estimate plus the empty grid of the kernel not
// chosen (docs/BENCHMARKS.md "`cuda_mma_auto`: the union kernel where neighbours share rows").
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include <stdint.h>

#include <algorithm>
#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/common/supports.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/mma_lowh.cuh"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {
namespace {

// The decision (launch.h's MmaAutoPicksLowh): kMmaLowH when x = union_rows / walked_slots over the
// sampled blocks is below 1/2 with 2 tokens a group (H 17-32), 9/20 with 4 (H 9-16), 2/5 with 8 (H
// <= 8). Why the walked slots: kMma walks every slot of a token's row in 64-slot tiles (a masked
// slot is not gathered but still computed: its kpool4 prefix-0 time, half the slots -1, is 94 % of
// prefix 32K's), while kMmaLowH gathers and computes the union of the stacked tokens' valid rows (a
// block with no valid row costs little). Each threshold sits at or just below the overlap x at
// which the two kernels' measured times are equal for that group size (ties go to kMma); the
// measurements are in docs/BENCHMARKS.md
// "`cuda_mma_auto`: the union kernel where neighbours share rows". The more tokens a CTA stacks,
// the more a union row costs it (deduplication over 8 tokens' entries, multiplicities per token),
// hence the lower threshold at H8. Against kWgmmaPp the thresholds are where the same measured
// kMmaLowH / kMma ratios reach kWgmmaPp / kMma (0.69 at H16, measured; its time does not depend
// on H below 64, so about 0.55 at H32): docs/BENCHMARKS.md "Low heads through the ping-pong
// kernel".

constexpr int kWarpsPerBlock = 2;  // two warps hash one sampled block
constexpr int kEstimateThreads = 32 * kWarpsPerBlock * kAutoBlocksPerGroup;
constexpr int kMaxGroupTokens = 8;                            // 64 / 8 head slots
constexpr int kMaxEntries = kMaxGroupTokens * 64;             // a block: tokens x kBlockN slots
constexpr int kRounds = kMaxEntries / (32 * kWarpsPerBlock);  // entries per lane
constexpr int kHashBits = 10;
constexpr int kHashSlots = 1 << kHashBits;  // load factor <= 1/2
// MmaAutoHeader::sums: walked slots, union rows and arrived CTAs in one 64-bit word, so one
// atomicAdd per CTA both sums and tells the last CTA the totals.
constexpr int kUnionShift = 24, kArrivedShift = 48;
constexpr uint64_t kFieldMask = (uint64_t{1} << kUnionShift) - 1;

int64_t Align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// CTA c (of n = min(kAutoSampleGroups, groups)) samples token group (2c + 1)·groups / (2n) of
// the groups of `tokens` consecutive tokens kMmaLowH stacks; its warps 2j and 2j + 1 take the
// group's lockstep block (2j + 1)·blocks / (2·nb) of `block_n` slots (nb = min(kAutoBlocksPer-
// Group, blocks), blocks over the longest of the tokens' rows; each row whole, clamped as
// SplitSlots clamps it; the blocks of kMmaLowH with one split: with more at d576 its 48-slot
// blocks restart at each split's start). Per block: the walked slots (inside a row), the valid
// entries (0 <= index < S; others are never used as addresses) and the distinct valid rows (an
// open-addressing hash in shared memory). The sums go to the header by atomics (zeroed by the
// launcher's memset); the last CTA to arrive writes the totals and the choice. A CTA per group
// spreads the shared atomics over SMs (one CTA for every group serialises them on one SM).
__global__ void __launch_bounds__(kEstimateThreads)
    SparseMlaAutoEstimateKernel(const KernelArgs a, int tokens, int block_n, int32_t alternative,
                                MmaAutoHeader* header) {
  __shared__ int32_t hash_s[kAutoBlocksPerGroup][kHashSlots];
  __shared__ const int32_t* slots_s[kMaxGroupTokens];
  __shared__ int64_t len_s[kMaxGroupTokens];
  __shared__ int32_t count_s[kEstimateThreads / 32][3];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int j = warp / kWarpsPerBlock, half = warp % kWarpsPerBlock;
  const int64_t groups = (static_cast<int64_t>(a.tokens) + tokens - 1) / tokens;
  const int64_t group = (2 * static_cast<int64_t>(blockIdx.x) + 1) * groups / (2 * gridDim.x);

  if (tid < kMaxGroupTokens) {  // a.splits is 1: SplitSlots gives the whole row
    const int64_t t = group * tokens + tid;
    const int32_t* slots = a.indices;
    int64_t len = 0;
    if (tid < tokens && t < a.tokens) {
      const SlotRange r = SplitSlots(a, t, 0);
      slots = r.slots;
      len = r.end;
    }
    slots_s[tid] = slots;
    len_s[tid] = len;
  }
  for (int x = tid; x < kAutoBlocksPerGroup * kHashSlots / 4; x += kEstimateThreads) {
    reinterpret_cast<int4*>(&hash_s[0][0])[x] = make_int4(-1, -1, -1, -1);
  }
  __syncthreads();
  int64_t longest = 0;
  for (int u = 0; u < tokens; ++u) longest = max(longest, len_s[u]);
  const int64_t blocks = (longest + block_n - 1) / block_n;
  const int nb = static_cast<int>(min(blocks, static_cast<int64_t>(kAutoBlocksPerGroup)));

  int walked = 0, valid = 0, distinct = 0;
  if (j < nb) {
    const int64_t blk = (2 * j + 1) * blocks / (2 * nb);
    int32_t raw[kRounds];
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {  // all loads first; never past a row's end
      const int e = (k * kWarpsPerBlock + half) * 32 + lane;
      raw[k] = -1;
      if (e < tokens * block_n) {
        const int u = e / block_n;
        const int64_t i = blk * block_n + e % block_n;
        if (i < len_s[u]) {
          raw[k] = slots_s[u][i];
          ++walked;
        }
      }
    }
    int32_t* hash = hash_s[j];
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      const int32_t row = raw[k];
      if (row < 0 || static_cast<int64_t>(row) >= a.kv_rows) continue;
      ++valid;
      uint32_t h = (static_cast<uint32_t>(row) * 0x9e3779b1u) >> (32 - kHashBits);
      for (;;) {
        const int32_t prev = atomicCAS(&hash[h], -1, row);
        if (prev == -1) {
          ++distinct;
          break;
        }
        if (prev == row) break;
        h = (h + 1) % kHashSlots;
      }
    }
  }
  walked = __reduce_add_sync(0xffffffffu, walked);
  valid = __reduce_add_sync(0xffffffffu, valid);
  distinct = __reduce_add_sync(0xffffffffu, distinct);
  if (lane == 0) {
    count_s[warp][0] = distinct;
    count_s[warp][1] = valid;
    count_s[warp][2] = walked;
  }
  __syncthreads();
  if (tid == 0) {
    uint64_t u = 0, w = 0;
    int v = 0;
    for (int x = 0; x < kEstimateThreads / 32; ++x) {
      u += static_cast<uint64_t>(count_s[x][0]);
      v += count_s[x][1];
      w += static_cast<uint64_t>(count_s[x][2]);
    }
    atomicAdd(&header->valid_entries, v);
    const uint64_t mine = w | (u << kUnionShift) | (uint64_t{1} << kArrivedShift);
    const uint64_t total = mine + atomicAdd(reinterpret_cast<unsigned long long*>(&header->sums),
                                            static_cast<unsigned long long>(mine));
    if ((total >> kArrivedShift) == gridDim.x) {  // the last CTA: the totals are final
      const int64_t un = static_cast<int64_t>((total >> kUnionShift) & kFieldMask);
      const int64_t wa = static_cast<int64_t>(total & kFieldMask);
      header->union_rows = static_cast<int32_t>(un);
      header->walked_slots = static_cast<int32_t>(wa);
      header->choice = MmaAutoPicksLowh(un, wa, tokens, alternative == kAutoChosePp)
                           ? kAutoChoseLowh
                           : alternative;
    }
  }
}

static_assert(kAutoSampleGroups * kAutoBlocksPerGroup * kMaxEntries < (1 << kUnionShift) &&
                  kAutoSampleGroups < (1 << (64 - kArrivedShift)),
              "the packed sums cannot overflow into each other");
static_assert(2 * kMaxEntries <= kHashSlots, "hash load factor <= 1/2");
static_assert(LowhTile<8, 512>::kTokens <= kMaxGroupTokens &&
                  LowhTile<8, 512>::kEntries <= kMaxEntries &&
                  LowhTile<8, 576>::kEntries <= kMaxEntries,
              "kMmaLowH's groups fit the estimate's lanes");
static_assert(kMaxGroupTokens <= kEstimateThreads && kMaxEntries % (32 * kWarpsPerBlock) == 0,
              "a thread per token range; whole rounds");

// kMmaLowH's token group and block for p (LowhTile: 64 / Hs tokens, kBlockN slots).
template <int kDqk>
void LowhGroup(int64_t heads, int* tokens, int* block_n) {
  if (heads <= 8) {
    *tokens = LowhTile<8, kDqk>::kTokens;
    *block_n = LowhTile<8, kDqk>::kBlockN;
  } else if (heads <= 16) {
    *tokens = LowhTile<16, kDqk>::kTokens;
    *block_n = LowhTile<16, kDqk>::kBlockN;
  } else {
    *tokens = LowhTile<32, kDqk>::kTokens;
    *block_n = LowhTile<32, kDqk>::kBlockN;
  }
}

::attnd::gpu::Error LaunchEstimate(const Params& p, int32_t alternative, MmaAutoHeader* header,
                                   ::attnd::gpu::Stream stream) {
  int tokens = 0, block_n = 0;
  if (p.q.dim(2) == 576) {
    LowhGroup<576>(p.q.dim(1), &tokens, &block_n);
  } else {
    LowhGroup<512>(p.q.dim(1), &tokens, &block_n);
  }
  const int64_t groups = CeilDiv(p.q.dim(0), tokens);
  const int ctas = static_cast<int>(std::min<int64_t>(groups, kAutoSampleGroups));
  ::attnd::gpu::Error e =
      ::attnd::gpu::MemsetAsync(header, 0, sizeof(MmaAutoHeader), stream);  // kMma, 0 sums
  if (e != ::attnd::gpu::kSuccess) return e;
  const KernelArgs a = MakeKernelArgs(p, 1, nullptr);
  SparseMlaAutoEstimateKernel<<<ctas, kEstimateThreads, 0, stream>>>(a, tokens, block_n,
                                                                     alternative, header);
  return ::attnd::gpu::GetLastError();
}

}  // namespace

bool MmaAutoSupports(const Params& p, std::string* why) {
  if (p.batch_invariant) {
    return Refuse(why,
                  "batch_invariant: chooses its kernel from a sample of the neighbouring tokens");
  }
  return GpuSupports(GpuKernel::kMmaLowH, p, why) && GpuSupports(GpuKernel::kMma, p, why);
}

GpuKernel MmaAutoAlternative(const Params& p) {
  return GpuSupports(GpuKernel::kWgmmaPp, p, nullptr) ? GpuKernel::kWgmmaPp : GpuKernel::kMma;
}

int64_t MmaAutoWorkspaceBytes(const Params& p) {
  return static_cast<int64_t>(sizeof(MmaAutoHeader)) +
         Align16(SplitWorkspaceBytes(p, GpuSplits(p, MmaAutoAlternative(p)))) +
         SplitWorkspaceBytes(p, GpuSplits(p, GpuKernel::kMmaLowH));
}

::attnd::gpu::Error LaunchSparseMlaMmaAuto(const Params& p, void* workspace, int64_t bytes,
                                           ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  constexpr int64_t kHeader = sizeof(MmaAutoHeader);
  if (workspace == nullptr || bytes < kHeader) return LaunchSparseMlaMma(p, 1, nullptr, stream);
  auto* header = static_cast<MmaAutoHeader*>(workspace);
  char* alt_ws = static_cast<char*>(workspace) + kHeader;
  const int64_t left = (bytes - kHeader) / 16 * 16;
  const GpuKernel alt = MmaAutoAlternative(p);
  const int32_t alt_choice = alt == GpuKernel::kWgmmaPp ? kAutoChosePp : kAutoChoseMma;
  const int alt_splits = SplitsThatFit(p, GpuSplits(p, alt), left);
  const int64_t alt_bytes = Align16(SplitWorkspaceBytes(p, alt_splits));  // <= left
  const int lowh_splits = SplitsThatFit(p, GpuSplits(p, GpuKernel::kMmaLowH), left - alt_bytes);
  ::attnd::gpu::Error e = LaunchEstimate(p, alt_choice, header, stream);
  if (e != ::attnd::gpu::kSuccess) return e;
  e = LaunchSparseMlaMmaLowh(p, lowh_splits, alt_ws + alt_bytes, stream, &header->choice,
                             kAutoChoseLowh);
  if (e != ::attnd::gpu::kSuccess) return e;
  if (alt == GpuKernel::kWgmmaPp) {
    return LaunchSparseMlaWgmmaPp(p, alt_splits, alt_ws, stream, &header->choice, kAutoChosePp);
  }
  return LaunchSparseMlaMma(p, alt_splits, alt_ws, stream, &header->choice, kAutoChoseMma);
}

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
