// The prefill operator's Hopper kernel (wgmma.cuh): instantiations for H {32, 64} at D 128, the
// Supports rules, the tensor maps and the launcher. CUDA only; the kernels trap off sm_90a.
#if defined(ATTND_GPU_CUDA)

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/tma.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/indexer_logits/gpu/prefill_problem.h"
#include "kernels/indexer_logits/gpu/wgmma.cuh"
#include "kernels/indexer_logits/gpu/wgmma_supports.h"

namespace attnd::kernels::indexer_logits::gpu {
namespace {

constexpr int kWgmmaDim = 128;

using ::attnd::gpu::EncodeU8Map;

// q [M, H, 128] as {128 bytes, H, M} with boxes of 128 × H × (256 / H) (one consumer's block),
// k [N, 128] as {128 bytes, N} with boxes of 128 × 64 (one tile). A dimension of size 1 gets the
// packed stride (its own is meaningless).
bool EncodeMaps(const Params& p, WgmmaIndexerArgs* args, std::string* why) {
  const uint64_t m = static_cast<uint64_t>(p.q.dim(0)), h = static_cast<uint64_t>(p.q.dim(1));
  const uint64_t n = static_cast<uint64_t>(p.k.dim(0));
  const uint64_t q_head = static_cast<uint64_t>(p.q.stride(1));
  const uint64_t q_row = m > 1 ? static_cast<uint64_t>(p.q.stride(0)) : q_head * h;
  const cuuint64_t q_dims[3] = {kWgmmaDim, h, m};
  const cuuint64_t q_strides[2] = {q_head, q_row};
  const cuuint32_t q_box[3] = {kWgmmaDim, static_cast<cuuint32_t>(h),
                               static_cast<cuuint32_t>(256 / h)};
  if (!EncodeU8Map(&args->q_map, 3, p.q.data, q_dims, q_strides, q_box, why)) return false;
  const cuuint64_t k_dims[2] = {kWgmmaDim, n};
  const cuuint64_t k_strides[1] = {n > 1 ? static_cast<uint64_t>(p.k.stride(0)) : kWgmmaDim};
  const cuuint32_t k_box[2] = {kWgmmaDim, static_cast<cuuint32_t>(kWgmmaBlockN)};
  return EncodeU8Map(&args->k_map, 2, p.k.data, k_dims, k_strides, k_box, why);
}

// Query blocks of 2·256/H rows; keys cut into chunks (multiples of the 64-key tile) only when
// there are fewer than two blocks per SM (one CTA per SM: shared memory and registers).
IndexerProblem SplitWgmma(const Params& p) {
  IndexerProblem x = MakePrefillProblem(p);
  ChooseSplit(&x, 2 * 256 / x.heads, kWgmmaBlockN,
              int64_t{2} * ::attnd::gpu::CurrentDeviceSmCount());
  return x;
}

template <int kHeads, bool kFused = false, bool kHelpers = false>
::attnd::gpu::Error LaunchInstance(const WgmmaIndexerArgs& args, ::attnd::gpu::Stream stream) {
  using T = WgmmaIndexerTile<kHeads>;
  const auto kernel = IndexerWgmmaKernel<kHeads, kFused, kHelpers>;
  const int smem = kHelpers ? T::kSmemBytesHelpers : kFused ? T::kSmemBytesFused : T::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(GridCtas(args.p)), T::kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaSupports(const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts facts;
  if (!SupportsFp8WgmmaIndexer(p.precision, &facts, why)) return false;
  const int64_t m = p.q.dim(0), h = p.q.dim(1), d = p.q.dim(2), n = p.k.dim(0);
  if (h != 32 && h != 64) return Refuse(why, "H is ", h, ", want 32 or 64");
  if (d != kWgmmaDim) return Refuse(why, "D is ", d, ", want ", kWgmmaDim);
  if (!Aligned(p.q.data, 16) || p.q.stride(0) % 16 != 0 || p.q.stride(1) % 16 != 0 ||
      !Aligned(p.k.data, 16) || p.k.stride(0) % 16 != 0) {
    return Refuse(why, "q and k must be 16-byte aligned (pointers and row strides: TMA)");
  }
  if (!Aligned(p.k_scale.data, 4)) return Refuse(why, "k_scale must be 4-byte aligned");
  // TMA coordinates are 32-bit: query rows up to M + 15, key rows up to N + 63.
  if (m > kMaxInt32 - 16 || n > kMaxInt32 - kWgmmaBlockN) {
    return Refuse(why, "M ", m, " or N ", n, " too large for 32-bit TMA coordinates");
  }
  const int smem = h == 32 ? WgmmaIndexerTile<32>::kSmemBytes : WgmmaIndexerTile<64>::kSmemBytes;
  if (facts.smem_optin < smem) {
    return Refuse(why, "needs ", smem, " bytes of shared memory per block, device allows ",
                  facts.smem_optin);
  }
  if (m > 0 && n > 0) {
    WgmmaIndexerArgs args;
    if (!EncodeMaps(p, &args, why)) return false;
    if (GridCtas(SplitWgmma(p)) >= kMaxGridCtas) {
      return Refuse(why, "grid does not fit one dimension");
    }
  }
  return true;
}

::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0 || p.k.dim(0) == 0) return cudaSuccess;
  WgmmaIndexerArgs args;
  if (!EncodeMaps(p, &args, nullptr)) return cudaErrorInvalidValue;  // refused by WgmmaSupports
  args.p = SplitWgmma(p);
  switch (args.p.heads) {
    case 32: return LaunchInstance<32, false>(args, stream);
    case 64: return LaunchInstance<64, false>(args, stream);
  }
  return cudaErrorInvalidValue;  // refused by WgmmaSupports
}

bool WgmmaCandidatesSupports(const Params& p, int64_t k, std::string* why) {
  if (!WgmmaSupports(p, why)) return false;
  if (p.q.dim(1) != 64) return Refuse(why, "the candidate form needs H 64, have ", p.q.dim(1));
  if (k < 1 || k > kMaxInt32) return Refuse(why, "k is ", k, ", want 1 to 2^31 - 1");
  ::attnd::gpu::DeviceFacts facts;
  // Either form of the epilogue (WgmmaCandidates::helpers) may be asked for: the larger one.
  constexpr int kSmem = WgmmaIndexerTile<64>::kSmemBytesHelpers;
  static_assert(kSmem >= WgmmaIndexerTile<64>::kSmemBytesFused, "the helpers' stages add to it");
  if (!::attnd::gpu::CurrentDeviceFacts(&facts) || facts.smem_optin < kSmem) {
    return Refuse(why, "the candidate form needs ", kSmem, " bytes of shared memory per block");
  }
  const int64_t m = p.q.dim(0);
  if (m > 0 && CeilDiv(m, int64_t{2} * 256 / 64) >= kMaxGridCtas) {
    return Refuse(why, "grid does not fit one dimension");
  }
  return true;
}

::attnd::gpu::Error LaunchWgmmaCandidates(const Params& p, const WgmmaCandidates& c,
                                          ::attnd::gpu::Stream stream) {
  const int64_t m = p.q.dim(0), n = p.k.dim(0);
  if (m == 0) return cudaSuccess;
  if (c.ld < n || c.k == 0 || c.floor_every > 64) return cudaErrorInvalidValue;
  WgmmaIndexerArgs args;
  if (n == 0) {  // nothing to read: every row has no candidates
    const cudaError_t e = cudaMemsetAsync(c.counts, 0, static_cast<size_t>(m) * 4, stream);
    if (e != cudaSuccess) return e;
    return cudaMemsetAsync(c.floors, 0, static_cast<size_t>(m) * 4, stream);
  }
  if (!EncodeMaps(p, &args, nullptr)) return cudaErrorInvalidValue;  // refused by Supports
  args.p = MakePrefillProblem(p);
  if (!p.logits.present()) args.p.logits = nullptr;  // candidates only
  // One key chunk per row: a CTA sees its rows' whole windows (their floors and counts).
  ChooseSplit(&args.p, 2 * 256 / args.p.heads, kWgmmaBlockN, /*target_ctas=*/0);
  args.cand.entries = reinterpret_cast<uint2*>(c.entries);
  args.cand.ld = c.ld;
  args.cand.counts = c.counts;
  args.cand.floors = c.floors;
  args.cand.k = c.k;
  args.cand.floor_every =
      c.floor_every != 0 ? c.floor_every : ::attnd::kernels::topk::gpu::kCandidateFloorEvery;
  if (args.p.heads != 64) return cudaErrorInvalidValue;  // refused by Supports
  if (c.helpers) return LaunchInstance<64, true, true>(args, stream);
  return LaunchInstance<64, true>(args, stream);
}

}  // namespace attnd::kernels::indexer_logits::gpu

#endif  // defined(ATTND_GPU_CUDA)
