#include "kernels/indexer_logits_paged/indexer_logits_paged.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits_paged/cpu.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/indexer_logits_paged/gpu/launch.h"
#endif

namespace attnd::kernels::indexer_logits_paged {

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckCacheLayout("kv_cache_layout", "kv_cache", p.kv_cache_layout,
                                         p.kv_cache, kKvCacheLayouts));
  ATTND_RETURN_IF_ERROR(
      CheckTensor(p.q, "q", DType::kFp8E4M3, {kAnyDim, kAnyDim, kAnyDim, kAnyDim}));
  const int64_t batch = p.q.dim(0), next_n = p.q.dim(1), h = p.q.dim(2), d = p.q.dim(3);
  if (next_n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("q: dim 1 (next_n) is ", next_n, ", want >= 1"));
  }
  ATTND_RETURN_IF_ERROR(indexer_logits::CheckHeadShape(p.q, 2));
  if (p.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block_size: is ", p.block_size, ", want >= 1"));
  }
  const int64_t tile_tokens = KeyTileTokens(p.kv_cache_layout);
  if (p.block_size % tile_tokens != 0) {  // D is a multiple of 16 (CheckHeadShape)
    return InvalidField(
        "block_size",
        absl::StrCat("block_size: is ", p.block_size, ", want a multiple of ", tile_tokens,
                     " with kv_cache_layout ", CacheLayoutName(p.kv_cache_layout),
                     " (its keys come in tiles of ", tile_tokens, " tokens)"));
  }
  int64_t block_bytes;
  if (MulOverflow(p.block_size, d + 4, &block_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: ", p.block_size, " · (D + 4) overflows int64"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.kv_cache, "kv_cache", DType::kU8, {kAnyDim, block_bytes}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.block_table, "block_table", DType::kI32, {batch, kAnyDim}));
  if (p.context_lens.rank == 2) {  // per token
    ATTND_RETURN_IF_ERROR(
        CheckTensor(p.context_lens, "context_lens", DType::kI32, {batch, next_n}));
  } else if (p.context_lens.rank > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_lens: rank is ", p.context_lens.rank,
                     ", want 1 ([B]: per request) or 2 ([B, next_n]: per token)"));
  } else {
    ATTND_RETURN_IF_ERROR(CheckTensor(p.context_lens, "context_lens", DType::kI32, {batch}));
  }
  int64_t rows;
  if (MulOverflow(batch, next_n, &rows)) {
    return absl::InvalidArgumentError("q: batch · next_n overflows int64");
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.weights, "weights", DType::kF32, {rows, h}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.logits, "logits", DType::kF32, {rows, kAnyDim}));
  return absl::OkStatus();
}

int64_t VisibleLength(const Params& p, int64_t b, int64_t j) {
  const int64_t max_blocks = p.block_table.dim(1);
  // min(N, max_blocks · block_size) without overflow.
  const int64_t cap = max_blocks > p.logits.dim(1) / p.block_size
                          ? p.logits.dim(1)
                          : std::min(p.logits.dim(1), max_blocks * p.block_size);
  const int32_t* lens = p.context_lens.ptr<const int32_t>();
  const int64_t visible = p.context_lens.rank == 2
                              ? int64_t{lens[b * p.context_lens.stride(0) + j]}
                              : lens[b * p.context_lens.stride(0)] - p.q.dim(1) + j + 1;
  return std::clamp(visible, int64_t{0}, cap);
}

WorkCount Count(const Params& p) {
  const int64_t batch = p.q.dim(0), next_n = p.q.dim(1), h = p.q.dim(2), d = p.q.dim(3);
  const int64_t n = p.logits.dim(1), rows = batch * next_n;
  double pairs = 0, keys = 0, table = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t longest = 0;  // per-token lengths need not grow with j
    for (int64_t j = 0; j < next_n; ++j) {
      const int64_t len = VisibleLength(p, b, j);
      pairs += static_cast<double>(len);
      longest = std::max(longest, len);
    }
    keys += static_cast<double>(longest);
    table += static_cast<double>(CeilDiv(longest, p.block_size));
  }
  WorkCount w;
  w.flops = 2.0 * static_cast<double>(h * d) * pairs;
  w.bytes = static_cast<double>(rows * h * d) + keys * static_cast<double>(d + 4) + 4.0 * table +
            4.0 * static_cast<double>(p.context_lens.rank == 2 ? rows : batch) +
            4.0 * static_cast<double>(rows * h) +
            4.0 * static_cast<double>(rows) * static_cast<double>(n);
  return w;
}

// GPU implementations first (dispatch picks by backend, then by Supports; `wgmma2p` has
// `wgmma`'s rules and `wgmma_bal` a subset of them, so they run only when asked for by name). They
// read context_lens and block_table on the device only; nothing here calls Count or VisibleLength
// (they read context_lens on the host).
const std::vector<Impl<Params>>& Implementations() {
  static const auto* impls = new std::vector<Impl<Params>>{
      ATTND_IF_CUDA(GpuImpl("wgmma", gpu::WgmmaSupports, gpu::LaunchWgmma))            //
      ATTND_IF_CUDA(GpuImpl("wgmma2p", gpu::WgmmaSupports, gpu::LaunchWgmma2p))        //
      ATTND_IF_CUDA(GpuImpl("wgmma_bal", gpu::WgmmaBalSupports, gpu::LaunchWgmmaBal))  //
      ATTND_IF_CUDA(GpuImpl("mma", gpu::MmaSupports, gpu::LaunchMma))                  //
      ATTND_IF_GPU(GpuImpl("simt", gpu::SimtSupports, gpu::LaunchSimt))                //
      CpuImpl(RunCpu)};
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  return ValidateAndDispatch(Validate, Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::indexer_logits_paged
