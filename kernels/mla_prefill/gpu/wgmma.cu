// Launcher of the Hopper MLA prefill kernel (CUDA only, sm_90a): what it supports, the tensor
// maps of q, k and v, and the launch (the schedule kernel, then the attention kernel).
#if defined(ATTND_GPU_CUDA)
#include <stdint.h>

#include <algorithm>
#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/common/gpu/tma.h"
#include "kernels/mla_prefill/gpu/launch.h"
#include "kernels/mla_prefill/gpu/plan.h"
#include "kernels/mla_prefill/gpu/wgmma.cuh"

namespace attnd::kernels::mla_prefill::gpu {

ATTND_MLA_PREFILL_WGMMA_INSTANCE(extern, 192, 128)

namespace {

constexpr uint32_t kBoxRows = 128;  // WgmmaPrefillTile's kBlockM and kBlockN

// The map of bf16 tensor x [tokens, heads, d] (rows 16-byte aligned): boxes of 64 columns x one
// head x 128 tokens. A dimension of size 1 has no meaningful stride: it gets the packed one.
bool EncodeMap(const Tensor& x, const char* name, CUtensorMap* map, std::string* why) {
  const uint64_t tokens = static_cast<uint64_t>(x.dim(0)), heads = static_cast<uint64_t>(x.dim(1));
  const uint64_t d = static_cast<uint64_t>(x.dim(2));
  const uint64_t stride_h = heads > 1 ? 2 * static_cast<uint64_t>(x.stride(1)) : 2 * d;
  const uint64_t stride_t = tokens > 1 ? 2 * static_cast<uint64_t>(x.stride(0)) : stride_h * heads;
  std::string reason;
  if (!::attnd::gpu::EncodeBf16Map3d(map, x.data, {d, heads, tokens}, {stride_h, stride_t},
                                     {64, 1, kBoxRows}, &reason)) {
    return Refuse(why, name, ": ", reason);
  }
  return true;
}

struct Maps {
  CUtensorMap q, k, v;
};

bool EncodeMaps(const Params& p, Maps* m, std::string* why) {
  return EncodeMap(p.q, "q", &m->q, why) && EncodeMap(p.k, "k", &m->k, why) &&
         EncodeMap(p.v, "v", &m->v, why);
}

}  // namespace

int32_t WgmmaHeadGroup(const Params& p) {
  // Interleave as many heads as keep their K and V (every key row of the call: an upper bound of
  // what the items in flight read) within kL2Budget, whole kv heads' query heads at a time. 12
  // MiB: about what the CTAs in flight read with the heads in order at causal 4K and 8K H128 (132
  // items: 2 heads of 5.2 MB at 8K, 4 of 2.6 MB at 4K), so the order adds no L2 pressure there.
  constexpr int64_t kL2Budget = int64_t{12} << 20;
  const int64_t heads = p.q.dim(1), group = heads / p.k.dim(1);
  const int64_t kv_head_bytes = p.k.dim(0) * (p.q.dim(2) + p.v.dim(2)) * 2;
  const int64_t kv_heads = std::max<int64_t>(1, kL2Budget / std::max<int64_t>(kv_head_bytes, 1));
  return static_cast<int32_t>(std::min(heads, kv_heads * group));
}

KernelShape WgmmaShape(const Params& p) {
  if (p.q.dim(2) == 192 && p.v.dim(2) == 128) return WgmmaPrefillShape<192, 128>();
  return KernelShape{};
}

bool WgmmaSupports(const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  if (d.cc_major != 9 || d.cc_minor != 0) {
    return Refuse(why, "needs compute capability 9.0 (sm_90a wgmma, TMA), device has ", d.cc_major,
                  ".", d.cc_minor);
  }
  if (p.q.dim(2) != 192 || p.v.dim(2) != 128) {
    return Refuse(why, "d_qk ", p.q.dim(2), ", d_v ", p.v.dim(2), ": the kernel has 192, 128");
  }
  // TMA coordinates are 32-bit; a map's dimensions are non-zero.
  if (p.q.dim(0) > kMaxInt32 || p.k.dim(0) > kMaxInt32) {
    return Refuse(why, "more than 2^31 - 1 tokens in q or k");
  }
  if (p.k.dim(0) == 0) return Refuse(why, "k: no tokens (no tensor map of zero rows)");
  if (!TensorCoreOperandsAligned(p, why)) return false;
  Maps maps;
  if (p.q.dim(0) > 0 && !EncodeMaps(p, &maps, why)) return false;
  const KernelShape shape = WgmmaShape(p);
  return FitsDevice(shape.smem_bytes, shape.blocks_per_sm, d, why);
}

::attnd::gpu::Error LaunchMlaPrefillWgmma(const Params& p, void* workspace,
                                          ::attnd::gpu::Stream stream) {
  // Heads in order until the grouped order is measured on a GPU (docs/KERNELS.md "MLA prefill
  // on Hopper", "Work"): WgmmaHeadGroup's choice runs when asked for (head_group 0).
  return LaunchMlaPrefillWgmmaWith(p, 1, workspace, stream);
}

::attnd::gpu::Error LaunchMlaPrefillWgmmaWith(const Params& p, int32_t head_group, void* workspace,
                                              ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;  // no query row: nothing to write
  const KernelShape shape = WgmmaShape(p);
  if (shape.kernel == nullptr || shape.blocks_per_sm < 1) return ::attnd::gpu::kErrorInvalidValue;
  if (workspace == nullptr || !Aligned(workspace, 8)) return ::attnd::gpu::kErrorInvalidValue;
  const int64_t items = SlotsPerHead(p, shape.block_m) * p.q.dim(1);
  if (items > kMaxInt32) return ::attnd::gpu::kErrorInvalidValue;
  // Persistent CTAs: as many as are resident at once, taking items from the counter.
  ::attnd::gpu::DeviceFacts d;
  if (!::attnd::gpu::CurrentDeviceFacts(&d)) return ::attnd::gpu::kErrorInvalidValue;
  const int64_t grid =
      std::min<int64_t>(items, static_cast<int64_t>(d.sm_count) * shape.blocks_per_sm);
  WgmmaPrefillArgs args;
  Maps maps;
  if (!EncodeMaps(p, &maps, nullptr)) return ::attnd::gpu::kErrorInvalidValue;
  args.q_map = maps.q;
  args.k_map = maps.k;
  args.v_map = maps.v;
  args.a = MakePrefillArgs(p, shape.block_m, workspace);
  args.a.head_group = static_cast<int32_t>(
      std::clamp<int64_t>(head_group > 0 ? head_group : WgmmaHeadGroup(p), 1, p.q.dim(1)));
  const ::attnd::gpu::Error e = LaunchPrefillSchedule(args.a, stream);
  if (e != ::attnd::gpu::kSuccess) return e;
  return p.precision == Precision::kHigh
             ? LaunchWgmmaPrefillInstance<192, 128, true>(args, grid, stream)
             : LaunchWgmmaPrefillInstance<192, 128, false>(args, grid, stream);
}

}  // namespace attnd::kernels::mla_prefill::gpu
#endif  // ATTND_GPU_CUDA
