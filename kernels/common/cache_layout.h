// Named cache layouts (docs/CONTRACTS.md "Named layouts"): the byte layout of a cache tensor an
// operator reads, named so that a frontend states which one it holds instead of leaving it
// implied by dtype and shape. Numbered like the proto's CacheLayout. An op's params carry the
// requested layout (kUnspecified: inferred from the tensor's dtype and last dimension) and its
// Validate checks it against the tensor with CheckCacheLayout; the kernels' math does not read it.
//   inline constexpr CacheLayoutUse kKvLayouts[] = {{CacheLayout::kBf16_576, true}};
//   ATTND_RETURN_IF_ERROR(CheckCacheLayout("kv_layout", "kv", p.kv_layout, p.kv, kKvLayouts));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/dtype.h"
#include "kernels/common/status_details.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels {

enum class CacheLayout : int32_t {
  kUnspecified = 0,       // inferred from dtype and shape where they decide it
  kBf16_576 = 1,          // bf16 rows of 576: 512 latent + 64 rope (DeepSeek)
  kBf16_512 = 2,          // bf16 rows of 512: latent only, K = V (GLM-5.x)
  kFlashMlaFp8_656 = 3,   // u8 rows of 656: FlashMLA's / vLLM's FP8 MLA cache row
  kIndexerFp8Blocks = 4,  // u8 block rows: block_size fp8 keys, then their block_size f32 scales
  kFp8_576PerTensor = 5,  // u8 rows of 576 e4m3 (512 latent + 64 rope), one per-tensor f32 scale
  kFp8_512PerTensor = 6,  // u8 rows of 512 e4m3 (latent only, K = V), one per-tensor f32 scale
  // u8 block rows of kIndexerFp8Blocks' size, keys in 16-token × 16-byte tiles (AITER's SHUFFLE)
  kIndexerAiterShuffle16 = 7,
};
inline constexpr int32_t kMaxCacheLayout = 7;

constexpr const char* CacheLayoutName(CacheLayout l) {
  switch (l) {
    case CacheLayout::kUnspecified: return "CACHE_LAYOUT_UNSPECIFIED";
    case CacheLayout::kBf16_576: return "CACHE_LAYOUT_BF16_576";
    case CacheLayout::kBf16_512: return "CACHE_LAYOUT_BF16_512";
    case CacheLayout::kFlashMlaFp8_656: return "CACHE_LAYOUT_FLASHMLA_FP8_656";
    case CacheLayout::kIndexerFp8Blocks: return "CACHE_LAYOUT_INDEXER_FP8_BLOCKS";
    case CacheLayout::kFp8_576PerTensor: return "CACHE_LAYOUT_FP8_576_PER_TENSOR";
    case CacheLayout::kFp8_512PerTensor: return "CACHE_LAYOUT_FP8_512_PER_TENSOR";
    case CacheLayout::kIndexerAiterShuffle16: return "CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16";
  }
  return nullptr;  // a value outside the enum (cast from untrusted input)
}

// What a layout asks of its tensor: the element dtype and the extent of the last dimension
// (0: any; the op's own checks then decide, e.g. block_size · (D + 4) of the indexer cache).
struct CacheLayoutShape {
  DType dtype = DType::kInvalid;
  int64_t width = 0;
};
constexpr CacheLayoutShape ShapeOfCacheLayout(CacheLayout l) {
  switch (l) {
    case CacheLayout::kBf16_576: return {DType::kBF16, 576};
    case CacheLayout::kBf16_512: return {DType::kBF16, 512};
    case CacheLayout::kFlashMlaFp8_656: return {DType::kU8, 656};
    case CacheLayout::kIndexerFp8Blocks: return {DType::kU8, 0};
    case CacheLayout::kFp8_576PerTensor: return {DType::kU8, 576};
    case CacheLayout::kFp8_512PerTensor: return {DType::kU8, 512};
    case CacheLayout::kIndexerAiterShuffle16: return {DType::kU8, 0};
    case CacheLayout::kUnspecified: break;
  }
  return {};
}

// One layout a cache tensor of an op may have. `inferred`: an unspecified layout resolves to it
// when the tensor's dtype and last dimension match it. A layout added later that shares its
// dtype and width with an existing one is not inferred: a request must name it (the old one
// stays the meaning of "unspecified", so older clients keep working).
struct CacheLayoutUse {
  CacheLayout layout;
  bool inferred;
};

namespace internal {

inline bool MatchesCacheLayout(CacheLayout l, const Tensor& t) {
  const CacheLayoutShape s = ShapeOfCacheLayout(l);
  return s.dtype == t.dtype && (s.width == 0 || s.width == t.shape[t.rank - 1]);
}

inline std::string DescribeCacheTensor(absl::string_view tensor, const Tensor& t) {
  return absl::StrCat(tensor, " is ", DTypeName(t.dtype), " with last dim ", t.shape[t.rank - 1]);
}

inline std::string DescribeCacheLayout(CacheLayout l) {
  const CacheLayoutShape s = ShapeOfCacheLayout(l);
  return s.width == 0 ? absl::StrCat(CacheLayoutName(l), " (", DTypeName(s.dtype), ")")
                      : absl::StrCat(CacheLayoutName(l), " (", DTypeName(s.dtype), ", last dim ",
                                     s.width, ")");
}

}  // namespace internal

// Checks the requested `layout` of cache tensor `tensor` (`t`) against the layouts the op reads
// (`uses`, `n` of them). INVALID_ARGUMENT naming `field` when the layout is outside the enum or
// not one the op reads, when it contradicts t's dtype or last dimension (both named), or when it
// is unspecified and t's dtype and last dimension match no inferred layout but one that must be
// named, or more than one inferred layout. An absent t is left to the op's own checks, and so is
// an unspecified layout that matches nothing (the op's dtype/shape message is the clearer one).
inline absl::Status CheckCacheLayout(absl::string_view field, absl::string_view tensor,
                                     CacheLayout layout, const Tensor& t,
                                     const CacheLayoutUse* uses, size_t n) {
  std::string accepted;
  for (size_t i = 0; i < n; ++i) {
    absl::StrAppend(&accepted, i ? ", " : "", CacheLayoutName(uses[i].layout));
  }
  if (CacheLayoutName(layout) == nullptr) {
    return InvalidField(field, absl::StrCat(field, ": is ", static_cast<int32_t>(layout),
                                            ", not a CacheLayout; want one of ", accepted,
                                            " or CACHE_LAYOUT_UNSPECIFIED (0)"));
  }
  if (t.rank < 1) return absl::OkStatus();
  if (layout == CacheLayout::kUnspecified) {
    std::string inferred, named;
    int inferred_count = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!internal::MatchesCacheLayout(uses[i].layout, t)) continue;
      std::string& list = uses[i].inferred ? inferred : named;
      absl::StrAppend(&list, list.empty() ? "" : " and ", CacheLayoutName(uses[i].layout));
      inferred_count += uses[i].inferred ? 1 : 0;
    }
    if (inferred_count > 1 || (inferred_count == 0 && !named.empty())) {
      return InvalidField(
          field, absl::StrCat(field, ": required: ", internal::DescribeCacheTensor(tensor, t),
                              ", which fits ", inferred_count > 1 ? inferred : named,
                              "; name the layout"));
    }
    return absl::OkStatus();
  }
  const CacheLayoutUse* use = nullptr;
  for (size_t i = 0; i < n; ++i) {
    if (uses[i].layout == layout) use = &uses[i];
  }
  if (use == nullptr) {
    return InvalidField(
        field,
        absl::StrCat(field, ": is ", CacheLayoutName(layout), ", not a layout ", tensor,
                     " may have here; want one of ", accepted, " or CACHE_LAYOUT_UNSPECIFIED"));
  }
  if (!internal::MatchesCacheLayout(layout, t)) {
    std::string fits;
    for (size_t i = 0; i < n; ++i) {
      if (internal::MatchesCacheLayout(uses[i].layout, t)) {
        absl::StrAppend(&fits, fits.empty() ? " (the shape of " : " or ",
                        CacheLayoutName(uses[i].layout));
      }
    }
    if (!fits.empty()) fits += ")";
    return InvalidField(
        field, absl::StrCat(field, ": is ", internal::DescribeCacheLayout(layout), ", but ",
                            internal::DescribeCacheTensor(tensor, t), fits));
  }
  return absl::OkStatus();
}

template <size_t N>
absl::Status CheckCacheLayout(absl::string_view field, absl::string_view tensor, CacheLayout layout,
                              const Tensor& t, const CacheLayoutUse (&uses)[N]) {
  return CheckCacheLayout(field, tensor, layout, t, uses, N);
}

}  // namespace attnd::kernels
