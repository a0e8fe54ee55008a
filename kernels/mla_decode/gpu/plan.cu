// Host side of the MLA decode GPU path: what each kernel supports, the split-K plan and its
// workspace, the kernels' argument block and the common launch sequence. Portable CUDA/HIP.
#include <stdint.h>

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"

namespace attnd::kernels::mla_decode::gpu {
namespace {

// The fewest tiles a split of a full-capacity context gets (GpuSplits' cap); the split-K sweep
// (attn_gpu_bench op mla_decode_splits, docs/BENCHMARKS.md) measures counts past it.
constexpr int64_t kMinSplitTiles = 2;

KernelShape ShapeOf(GpuKernel kernel, const Params& p) {
#if defined(ATTND_GPU_CUDA)
  if (kernel == GpuKernel::kMma) return MmaShape(p);
  if (kernel == GpuKernel::kWgmma) return WgmmaShape(p);
  if (kernel == GpuKernel::kWgmmaPp) return WgmmaPpShape(p);
  if (kernel == GpuKernel::kWgmmaSf) return WgmmaSfShape(p);
#endif
  if (kernel == GpuKernel::kSimt) return SimtShape(p);
  return KernelShape{};
}

int64_t Rows(const Params& p) { return p.q.dim(1) * p.q.dim(2); }

int64_t Capacity(const Params& p) {
  int64_t capacity;
  if (MulOverflow(p.block_table.dim(1), p.kv_cache.dim(1), &capacity)) {
    capacity = std::numeric_limits<int64_t>::max();
  }
  return capacity;
}

}  // namespace

int64_t WorkItems(const Params& p, int block_m) { return p.q.dim(0) * CeilDiv(Rows(p), block_m); }

DecodeArgs MakeDecodeArgs(const Params& p, int block_m, int splits, void* workspace) {
  DecodeArgs a{};
  a.q = p.q.ptr<const uint16_t>();
  a.q_stride_b = p.q.stride(0);
  a.q_stride_s = p.q.stride(1);
  a.q_stride_h = p.q.stride(2);
  if (p.kv_is_fp8()) {
    a.kv_fp8 = p.kv_cache.ptr<const uint8_t>();
    a.kv_scale = p.kv_scale;
  } else {
    a.kv = p.kv_cache.ptr<const uint16_t>();
  }
  a.kv_stride_page = p.kv_cache.stride(0);
  // No L2 prefetch of the next pages unless asked for (DecodeLaunchOptions::prefetch_l2 1):
  // with it, the dense decode ran up to 9 % slower and never faster (H100, interleaved,
  // docs/BENCHMARKS.md "Session of 2026-12-07, 23:14 UTC"). The sparse decode's is its own.
  a.prefetch_l2 = false;
  a.kv_stride_slot = p.kv_cache.stride(1);
  a.num_pages = p.kv_cache.dim(0);
  a.page_size = p.kv_cache.dim(1);
  a.block_table = p.block_table.ptr<const int32_t>();
  a.table_stride_b = p.block_table.stride(0);
  a.table_stride_page = p.block_table.stride(1);
  a.capacity = Capacity(p);
  a.seqlens = p.cache_seqlens.ptr<const int32_t>();
  a.seqlens_stride = p.cache_seqlens.stride(0);
  a.out = p.out.ptr<uint16_t>();
  a.out_stride_b = p.out.stride(0);
  a.out_stride_s = p.out.stride(1);
  a.out_stride_h = p.out.stride(2);
  if (p.lse.present()) {
    a.lse = p.lse.ptr<float>();
    a.lse_stride_b = p.lse.stride(0);
    a.lse_stride_s = p.lse.stride(1);
    a.lse_stride_h = p.lse.stride(2);
  }
  a.batch = static_cast<int32_t>(p.q.dim(0));
  a.s_q = static_cast<int32_t>(p.q.dim(1));
  a.heads = static_cast<int32_t>(p.q.dim(2));
  a.rows = static_cast<int32_t>(Rows(p));
  a.block_m = block_m;
  a.m_blocks = static_cast<int32_t>(CeilDiv(Rows(p), block_m));
  a.splits = splits;
  a.causal = p.causal ? 1 : 0;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.exact_p = p.precision == Precision::kHigh;
  a.invariant_splits = p.batch_invariant;
  if (splits > 1) {
    a.partial_o = static_cast<float*>(workspace);
    a.partial_lse = a.partial_o + static_cast<int64_t>(splits) * p.q.dim(0) * Rows(p) * kDimV;
  }
  return a;
}

bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  if (p.q.dim(0) > kMaxInt32) return Refuse(why, "q: batch ", p.q.dim(0), " >= 2^31");
  if (Rows(p) > kMaxInt32) {
    return Refuse(why, "q: s_q x H is ", Rows(p), ", want < 2^31");
  }
  // The ping-pong math (kWgmmaPp, and kWgmmaSf's) rounds P to bf16 once: FAST only.
  const bool pp = kernel == GpuKernel::kWgmmaPp || kernel == GpuKernel::kWgmmaSf;
  if (pp && p.precision != Precision::kFast) {
    return Refuse(why, "precision HIGH runs on cuda_wgmma (this kernel rounds P to bf16 once)");
  }
  if (kernel == GpuKernel::kWgmmaSf) {
    // Every block is one page by TMA: page coordinates are 32-bit.
    if (p.kv_cache.dim(1) != 64) {
      return Refuse(why, "kv_cache: page size ", p.kv_cache.dim(1), ", want 64");
    }
    if (p.kv_cache.dim(0) > kMaxInt32) {
      return Refuse(why, "kv_cache: ", p.kv_cache.dim(0), " pages, want < 2^31");
    }
  }
  const bool wgmma = kernel == GpuKernel::kWgmma || pp;
  if (wgmma) {
    if (d.cc_major != 9 || d.cc_minor != 0) {
      return Refuse(why, "needs compute capability 9.0 (sm_90a wgmma), device has ", d.cc_major,
                    ".", d.cc_minor);
    }
    if (p.kv_is_fp8()) return Refuse(why, "kv_cache: the per-tensor FP8 cache is not read here");
    const int64_t heads = p.q.dim(2);
    // All three also take H < 64 where every row of a 64-row block sees the same positions
    // (s_q 1, or not causal): the block's rows are padded to 64 (WgmmaPpRowsShareLimit).
    if (heads < 64) {
      if (!WgmmaPpRowsShareLimit(p)) {
        return Refuse(why, "q: H ", heads, " < 64 with causal s_q ", p.q.dim(1),
                      " > 1: a 64-row block would mix MTP tokens' causal limits");
      }
    } else if (heads % 64 != 0) {
      return Refuse(why, "q: dim 2 (heads) is ", heads,
                    ", want a multiple of 64 (or < 64 with s_q 1 or not causal)");
    }
  }
  if (kernel == GpuKernel::kMma || wgmma) {
    if (kernel == GpuKernel::kMma && !RunsMmaSync(d, why)) return false;
    if (!Bf16RowsAligned16(p.q)) {
      return Refuse(why, "q: needs 16-byte alignment (base and leading strides multiples of 8)");
    }
    if (p.kv_is_fp8()) {  // u8 codes: strides are bytes
      if (!Aligned(p.kv_cache.data, 16) || !StridesMultipleOf(p.kv_cache, 16)) {
        return Refuse(why,
                      "kv_cache: per-tensor FP8 needs 16-byte alignment (base and leading strides "
                      "multiples of 16)");
      }
    } else if (!Bf16RowsAligned16(p.kv_cache)) {
      return Refuse(why,
                    "kv_cache: needs 16-byte alignment (base and leading strides multiples of 8)");
    }
    if (!Aligned(p.out.data, 4) || !StridesMultipleOf(p.out, 2)) {
      return Refuse(why, "out: needs 4-byte alignment (base and leading strides even)");
    }
  }
#if defined(ATTND_GPU_CUDA)
  // After the device, cache-type and alignment checks, so their reasons come first; a driver
  // call (the map is encoded again at launch).
  if (kernel == GpuKernel::kWgmmaSf && !WgmmaSfMapsKv(p, why)) return false;
#endif
  const KernelShape shape = ShapeOf(kernel, p);
  if (shape.kernel == nullptr) return Refuse(why, "no kernel instance for this shape");
  if (!FitsDevice(shape.smem_bytes, shape.blocks_per_sm, d, why)) return false;
  // With splits > 1 there are fewer than SMs x resident CTAs items, so B · row blocks bounds
  // the grid of every plan.
  const int64_t items = WorkItems(p, shape.block_m);
  if (items > kMaxInt32 / 2) {
    return Refuse(why, "B x row blocks is ", items, ", want < 2^30");
  }
  if (p.batch_invariant) {  // the invariant plan splits however many items there are
    const int64_t splits =
        InvariantGridSplitsFor(std::min<int64_t>(Capacity(p), kMaxInt32), shape.block_n);
    if (items * splits > kMaxInt32) {
      return Refuse(why, "batch_invariant: B x row blocks x splits is ", items * splits,
                    ", want < 2^31");
    }
  }
  return true;
}

int GpuSplits(const Params& p, GpuKernel kernel) {
  ::attnd::gpu::DeviceFacts d;
  if (!::attnd::gpu::CurrentDeviceFacts(&d)) return 1;
  const KernelShape shape = ShapeOf(kernel, p);
  if (shape.kernel == nullptr || shape.blocks_per_sm < 1) return 1;
  if (p.batch_invariant) {  // the request's own length only (invariant_plan.h)
    return InvariantGridSplitsFor(std::min<int64_t>(Capacity(p), kMaxInt32), shape.block_n);
  }
  const int64_t items = WorkItems(p, shape.block_m);
  const int64_t slots = static_cast<int64_t>(d.sm_count) * shape.blocks_per_sm;
  if (items == 0 || items >= slots) return 1;
  const int64_t lower = slots / items;  // >= 1
  int64_t splits = 4 * items * lower >= 3 * slots ? lower : CeilDiv(slots, items);
  const int64_t capacity_tiles = Capacity(p) / shape.block_n;
  splits = std::min<int64_t>(
      {splits, kMaxSplits, std::max<int64_t>(1, capacity_tiles / kMinSplitTiles)});
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

bool WgmmaPrefers(const Params& p, std::string* why) {
  constexpr int64_t kRows = 64, kTile = 64;  // the wgmma kernel's rows and positions a CTA step
  const int64_t heads = p.q.dim(2);
  if (heads % kRows == 0) return true;
  const int splits = GpuSplits(p, GpuKernel::kWgmma);
  const int64_t tiles = CeilDiv(CeilDiv(Capacity(p), kTile), int64_t{splits});
  if (tiles >= kWgmmaPaddedMinTiles) return true;
  return Refuse(why, "H ", heads, " < 64 padded: ", tiles, " tiles a split (", splits,
                " splits), under ", kWgmmaPaddedMinTiles);
}

namespace {

// The CTA groups of both plans (a group: the row blocks of one request, which read the same
// pages together) on the current device, or 0 where neither applies (batch_invariant: its own
// plan).
int64_t PlanGroups(const Params& p, const KernelShape& shape) {
  if (p.batch_invariant || shape.kernel == nullptr || shape.blocks_per_sm < 1) return 0;
  ::attnd::gpu::DeviceFacts d;
  if (!::attnd::gpu::CurrentDeviceFacts(&d)) return 0;
  const int64_t m_blocks = CeilDiv(Rows(p), shape.block_m);
  if (m_blocks < 1) return 0;
  return static_cast<int64_t>(d.sm_count) * shape.blocks_per_sm / m_blocks;
}

}  // namespace

BalancedShape BalancedPlanFor(const Params& p, const KernelShape& shape) {
  const int64_t groups = PlanGroups(p, shape);
  if (groups < 1) return {};
  const int64_t tiles = CeilDiv(std::min<int64_t>(Capacity(p), kMaxInt32), shape.block_n);
  static_assert(kMinSplitTiles == kScheduleMinWidth, "one least width for both plans");
  return BalancedShapeFor(p.q.dim(0), tiles, groups, kMinSplitTiles, kMaxSplits);
}

int BalancedSplits(const Params& p, GpuKernel kernel) {
  return BalancedPlanFor(p, ShapeOf(kernel, p)).max_pieces;
}

int32_t ScheduleGroupsFor(const Params& p, const KernelShape& shape) {
  const int64_t groups = PlanGroups(p, shape);
  // An empty batch launches nothing (LaunchDecode's even path returns at once).
  const int64_t b = p.q.dim(0);
  return b >= 1 && groups >= 1 && b + groups <= kScheduleMaxLaunched ? static_cast<int32_t>(groups)
                                                                     : 0;
}

// Partials of every launched group's piece, then the entries and the per-request arrays.
int64_t ScheduleBytes(const Params& p, int32_t groups) {
  const int64_t launched = groups + p.q.dim(0);
  return launched * Rows(p) * (kDimV + 1) * 4 + (4 * launched + 2 * p.q.dim(0)) * 4;
}

::attnd::gpu::Error LaunchMlaDecodeScheduleOnly(const Params& p, int32_t groups, int32_t block_n,
                                                int32_t even_splits, void* out,
                                                ::attnd::gpu::Stream stream) {
  if (out == nullptr || block_n < 1 || groups < 1 || p.q.dim(0) < 1 ||
      groups + p.q.dim(0) > kScheduleMaxLaunched) {
    return ::attnd::gpu::kErrorInvalidValue;
  }
  DecodeArgs a = MakeDecodeArgs(p, block_n, 1, nullptr);
  const int64_t launched = groups + p.q.dim(0);
  a.sched = static_cast<int32_t*>(out);
  a.sched_first = a.sched + 4 * launched;
  a.sched_pieces = a.sched_first + p.q.dim(0);
  a.sched_groups = static_cast<int32_t>(launched);
  return LaunchMlaDecodeSchedule(a, groups, block_n, even_splits, stream);
}

int64_t ScheduleWorkspaceBytes(const Params& p, GpuKernel kernel) {
  const int32_t groups = ScheduleGroupsFor(p, ShapeOf(kernel, p));
  return groups > 0 ? ScheduleBytes(p, groups) : 0;
}

int64_t SplitWorkspaceBytes(const Params& p, int splits) {
  if (splits <= 1) return 0;
  return static_cast<int64_t>(splits) * p.q.dim(0) * Rows(p) * (kDimV + 1) * 4;
}

int SplitsThatFit(const Params& p, int splits, int64_t bytes) {
  while (splits > 1 && SplitWorkspaceBytes(p, splits) > bytes) --splits;
  return std::max(splits, 1);
}

::attnd::gpu::Error LaunchDecode(const Params& p, const KernelShape& shape, int splits,
                                 void* workspace, ::attnd::gpu::Stream stream,
                                 const void* second_arg, const DecodeLaunchOptions& options) {
  if (shape.kernel == nullptr || shape.blocks_per_sm < 1) return ::attnd::gpu::kErrorInvalidValue;
  DecodeArgs a;
  int64_t grid;
  const int32_t sched_groups = options.schedule ? ScheduleGroupsFor(p, shape) : 0;
  if (sched_groups > 0) {  // the schedule kernel first, then (ScheduleGroupsFor + B) groups
    // `splits`: the even plan's count, whose cut the schedule keeps at near-equal lengths.
    if (splits < 1 || splits > kMaxSplits || workspace == nullptr || !Aligned(workspace, 16) ||
        (options.workspace_bytes >= 0 &&
         options.workspace_bytes < ScheduleBytes(p, sched_groups))) {
      return ::attnd::gpu::kErrorInvalidValue;
    }
    // The partials are laid out here, not by MakeDecodeArgs; splits > 1 marks them in use.
    a = MakeDecodeArgs(p, shape.block_m, 1, nullptr);
    a.splits = kMaxSplits;
    const int64_t launched = sched_groups + p.q.dim(0);
    a.partial_o = static_cast<float*>(workspace);
    a.partial_lse = a.partial_o + launched * Rows(p) * kDimV;
    a.sched = reinterpret_cast<int32_t*>(a.partial_lse + launched * Rows(p));
    a.sched_first = a.sched + 4 * launched;
    a.sched_pieces = a.sched_first + p.q.dim(0);
    a.sched_groups = static_cast<int32_t>(launched);
    grid = launched * a.m_blocks;
    const ::attnd::gpu::Error e =
        LaunchMlaDecodeSchedule(a, sched_groups, shape.block_n, splits, stream);
    if (e != ::attnd::gpu::kSuccess) return e;
  } else {
    const BalancedShape bal = options.balanced ? BalancedPlanFor(p, shape) : BalancedShape{};
    if (bal.ranges > 0 && splits != bal.max_pieces) return ::attnd::gpu::kErrorInvalidValue;
    if (splits < 1 || splits > kMaxSplits) return ::attnd::gpu::kErrorInvalidValue;
    if (splits > 1 && (workspace == nullptr || !Aligned(workspace, 16))) {
      return ::attnd::gpu::kErrorInvalidValue;
    }
    grid = WorkItems(p, shape.block_m) * splits;
    if (grid == 0) return ::attnd::gpu::kSuccess;
    if (grid > kMaxInt32) return ::attnd::gpu::kErrorInvalidValue;
    a = MakeDecodeArgs(p, shape.block_m, splits, workspace);
    if (bal.ranges > 0) {  // (ranges + cut ranges) groups of m_blocks CTAs, at most 2 · 255
      a.bal = bal;
      grid = (static_cast<int64_t>(bal.ranges) + BalancedOrder(bal, a.bal_order)) * a.m_blocks;
    }
  }
  if (options.prefetch_l2 >= 0) a.prefetch_l2 = options.prefetch_l2 != 0;
  void* args[] = {&a, const_cast<void*>(second_arg)};  // the kernel reads what it declares
  ::attnd::gpu::Error e =
      ::attnd::gpu::LaunchKernel(shape.kernel, dim3(static_cast<unsigned>(grid)),
                                 dim3(shape.threads), args, shape.smem_bytes, stream);
  if (e != ::attnd::gpu::kSuccess || a.splits == 1) return e;
  return LaunchMlaDecodeCombine(a, stream);
}

}  // namespace attnd::kernels::mla_decode::gpu
