// Parameters of the paged (decode) indexer-logits operator (docs/CONTRACTS.md
// "indexer_logits_paged"): the logits of each of a request's next_n new tokens against its paged
// FP8 key cache, laid out as vLLM writes it.
// Tensors are views owned by the caller; the operator never allocates them.
#pragma once

#include <cstdint>

#include "kernels/common/cache_layout.h"
#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::indexer_logits_paged {

// kv_cache, one row per cache block of `block_size` tokens (B = block_size, D = head dim), in one
// of two named layouts (docs/CONTRACTS.md "Named layouts", "indexer_logits_paged"):
//   kIndexerFp8Blocks (inferred when kv_cache_layout is unspecified):
//     bytes [0, B·D)           the B keys, fp8 e4m3, key t at [t·D, (t+1)·D)
//     bytes [B·D, B·D + 4·B)   their B f32 scales (little-endian), scale t at B·D + 4·t
//     (not interleaved per token). At B = 1 this is also vLLM's NORMAL and SGLang's HIP cache.
//   kIndexerAiterShuffle16 (must be named; B a multiple of 16): the same bytes per block and the
//     same scales, the keys in tiles of 16 tokens × 16 bytes: byte d of key t at
//     (t / 16)·16·D + (d / 16)·256 + (t % 16)·16 + d % 16 (AITER's / vLLM's SHUFFLE on ROCm).
// Rows may be padded: the row stride is >= B·(D + 4) bytes. The scales need no alignment on the
// CPU; GPU implementations state theirs in Supports().
inline constexpr CacheLayoutUse kKvCacheLayouts[] = {{CacheLayout::kIndexerFp8Blocks, true},
                                                     {CacheLayout::kIndexerAiterShuffle16, false}};

// Tokens per key tile of kv_cache's layout: 16 for kIndexerAiterShuffle16, else 1 (a key's D
// bytes contiguous). Byte d of the key in slot t of a block sits at
//   (t / G)·G·D + (d / 16)·16·G + (t % G)·16 + d % 16   (G = KeyTileTokens; G = 1: t·D + d).
inline constexpr int64_t kShuffleTileTokens = 16;
constexpr int64_t KeyTileTokens(CacheLayout layout) {
  return layout == CacheLayout::kIndexerAiterShuffle16 ? kShuffleTileTokens : 1;
}

struct Params : WithTensors<Params> {
  // Inputs.
  Tensor q;         // fp8 e4m3 [batch, next_n, H, D]; next_n >= 1; strides may be padded
  Tensor kv_cache;  // u8 [num_blocks, block_size·(D + 4)], layout above
  // kv_cache's named layout (kKvCacheLayouts), or kUnspecified (= kIndexerFp8Blocks). Checked
  // by Validate; it decides where each key's bytes are (KeyTileTokens).
  CacheLayout kv_cache_layout = CacheLayout::kUnspecified;
  // Tokens per cache block, >= 1 (the model's is 64); a multiple of 16 with the shuffle layout.
  int64_t block_size = 64;
  // Position n of request b lives in block block_table[b, n / block_size], slot n % block_size.
  // Untrusted: an entry outside [0, num_blocks) masks the positions it covers (-inf, never
  // read); entries at or past ceil(context / block_size) are never read.
  Tensor block_table;  // i32 [batch, max_blocks]; row stride >= max_blocks
  // Untrusted lengths (clamped, never rejected), in one of two forms:
  //  [batch]:         tokens in request b's cache, the next_n new ones included; new token j
  //                   sees context_lens[b] − next_n + j + 1 positions;
  //  [batch, next_n]: per token: new token j of request b sees context_lens[b, j] positions (any
  //                   order along j: varlen verification pads with shorter or empty rows).
  Tensor context_lens;  // i32 [batch] or [batch, next_n]
  Tensor weights;       // f32 [batch·next_n, H]; row stride >= H
  // Numerics (indexer_logits::Params::precision, docs/ACCURACY.md "Indexer logits"): kHigh the
  // exact-contract f32 bound, kFast the FP8 tensor-core accumulator's derived bound (opt-in).
  Precision precision = Precision::kHigh;

  // Output. Row b·next_n + j (new token j of request b) sees positions [0, L) with
  //   L = clamp(ctx(b, j), 0, min(N, max_blocks·block_size)),
  //   ctx(b, j) = context_lens[b] − next_n + j + 1 ([batch]) or context_lens[b, j] ([batch,
  //   next_n]);
  // logits[row, n] = Σ_h relu(q[b,j,h]·k[n]) · scale[n] · weights[row, h] there, and -inf on
  // every other column of [0, N) and on masked positions. Columns [N, ld) are never touched.
  Tensor logits;  // f32 [batch·next_n, N]; row stride ld >= N

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("q", self.q, Role::kInput);
    f("kv_cache", self.kv_cache, Role::kInput);
    f("block_table", self.block_table, Role::kInput);
    f("context_lens", self.context_lens, Role::kInput);
    f("weights", self.weights, Role::kInput);
    f("logits", self.logits, Role::kOutput);
  }
};

}  // namespace attnd::kernels::indexer_logits_paged
