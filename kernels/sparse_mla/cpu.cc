// CPU sparse MLA. A work item is one token t and a block of its heads. Its valid KV rows are
// gathered in chunks of 64 and converted to f32 (K row-major, V straight into GemmF32's packed-B
// layout); Sᵀ[64, heads] = K_chunk · Qᵀ with Qᵀ packed once per item (scaled by sm_scale·log2e,
// so scores are in log2 units); an online softmax runs down each head's column with 8 heads per
// vector (FAST rounds P to bf16 after the sums); O[heads, 512] += P · V_chunk. Masked slots
// are skipped while gathering: never read. The next chunk's rows are prefetched a few cache lines
// at a time between the slices of this chunk's products (one micro-tile row group of Sᵀ, one
// 16-column panel of O per slice). An FP8 cache row (params.h) is dequantised once per gather, e4m3
// × scale in f32, into the same f32 K and V tiles; the math after that is the bf16 path's. A
// per-tensor FP8 row (d_qk codes, one kv_scale) is dequantised the same way.
#include "kernels/sparse_mla/cpu.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/common/cpu/attention_tile.h"
#include "kernels/common/cpu/gemm.h"
#include "kernels/common/fp8.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/sparse_mla/sparse_mla.h"

namespace attnd::kernels::sparse_mla {
namespace {

constexpr int64_t kChunk = 64;         // valid KV rows per step (rows of Sᵀ, depth of P·V)
constexpr int64_t kMaxHeadBlock = 64;  // heads per work item: keeps Qᵀ and O in L2 at H128
constexpr int64_t kLanes = cpu::kVec;  // f32 lanes per vector
// Floats between consecutive V panels and K rows: one cache line more than the data, so the 32
// panels a converted row is spread over (and consecutive K rows) do not share an L1 set.
constexpr int64_t kVPanelStride = kChunk * cpu::kGemmNr + 16;
constexpr int64_t kRowPad = 16;
constexpr double kLn2Double = 0.6931471805599453;  // the LSE is formed in double

// The slots of token t, from either selection form (CSR indptr checked by CheckSelectionData).
struct SlotRow {
  const int32_t* slots;
  int64_t count;
};

SlotRow Slots(const Params& p, int64_t t) {
  if (p.is_csr()) {
    const int32_t* ptr = p.indptr.ptr<const int32_t>();
    return {p.indices.ptr_at<const int32_t>(ptr[t]), static_cast<int64_t>(ptr[t + 1]) - ptr[t]};
  }
  const int64_t k = p.indices.dim(1);
  int64_t count = k;
  if (p.topk_length.present()) {
    count = std::clamp<int64_t>(p.topk_length.ptr<const int32_t>()[t], 0, k);
  }
  return {p.indices.ptr_at<const int32_t>(t * p.indices.stride(0)), count};
}

// Per-thread buffers for one work item of up to `heads` heads (padded to whole vectors).
struct Scratch {
  Scratch(int64_t heads, int64_t d_qk)
      : q_rows(heads * d_qk),
        q_packed(cpu::GemmPackedBSize(heads, d_qk)),
        k_tile(kChunk * (d_qk + kRowPad)),
        v_packed(kDimV / cpu::kGemmNr * kVPanelStride),
        scores(kChunk * RoundUp(heads)),
        probs(heads * kChunk),
        acc(heads * kDimV),
        m(RoundUp(heads)),
        l(RoundUp(heads)),
        alpha(RoundUp(heads)) {}
  static int64_t RoundUp(int64_t h) { return CeilDiv(h, kLanes) * kLanes; }

  std::vector<float> q_rows;       // [heads, d_qk] q·sm_scale·log2e
  std::vector<float> q_packed;     // Qᵀ [d_qk, heads] in the packed-B layout
  std::vector<float> k_tile;       // [kChunk, d_qk + kRowPad] gathered K rows
  std::vector<float> v_packed;     // V [rows, 512]: 32 packed-B panels, kVPanelStride apart
  std::vector<float> scores;       // Sᵀ [kChunk, heads8], overwritten by the probabilities
  std::vector<float> probs;        // P [heads, kChunk]
  std::vector<float> acc;          // O [heads, 512], unnormalised
  std::vector<float> m, l, alpha;  // [heads8] running max (log2 units), sum, last rescale
  int32_t rows[2][kChunk];         // this chunk's rows and the next one's (being prefetched)
};

// Gathers up to kChunk valid rows starting at slot *pos; returns how many.
int64_t GatherRows(const SlotRow& sel, int64_t s, int64_t* pos, int32_t* rows) {
  int64_t n = 0;
  while (*pos < sel.count && n < kChunk) {
    const int32_t idx = sel.slots[(*pos)++];
    if (idx >= 0 && idx < s) rows[n++] = idx;
  }
  return n;
}

// Prefetches the next chunk's rows a few cache lines at a time between the slices of this
// chunk's products: random rows defeat the hardware prefetcher, and a burst of a whole chunk
// (over a thousand lines) would stall on the few outstanding misses a core can track.
class RowPrefetcher {
 public:
  RowPrefetcher(const Params& p, const int32_t* rows, int64_t n)
      : kv_(static_cast<const char*>(p.kv.data)),
        stride_bytes_(p.kv.stride(0) * DTypeSize(p.kv.dtype)),
        lines_per_row_((p.kv.dim(1) * DTypeSize(p.kv.dtype) + 63) / 64),
        rows_(rows),
        total_(n * lines_per_row_) {}

  // Issues the next share of the lines, for one of `slices_left` remaining slices of work.
  void Step(int64_t slices_left) {
    int64_t count = (total_ - issued_ + slices_left - 1) / std::max<int64_t>(slices_left, 1);
    issued_ += count;
    for (; count > 0; --count) {
      __builtin_prefetch(kv_ + rows_[row_] * stride_bytes_ + line_ * 64, 0, 3);
      if (++line_ == lines_per_row_) {
        line_ = 0;
        ++row_;
      }
    }
  }

 private:
  const char* kv_;
  int64_t stride_bytes_, lines_per_row_;
  const int32_t* rows_;
  int64_t total_, issued_ = 0, row_ = 0, line_ = 0;
};

// One gathered row to f32: all d_qk columns to k_dst, the first 512 also to the V panels
// (v_dst is this row's place in panel 0). Both stores come from the same registers.
inline void ConvertRow(const bf16_t* src, int64_t d_qk, float* k_dst, float* v_dst) {
#if defined(__AVX2__)
  const auto widen = [](const bf16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  };
  for (int64_t c = 0; c < kDimV; c += cpu::kGemmNr) {
    const __m256 lo = widen(src + c), hi = widen(src + c + kLanes);
    float* v = v_dst + (c / cpu::kGemmNr) * kVPanelStride;
    _mm256_storeu_ps(k_dst + c, lo);
    _mm256_storeu_ps(k_dst + c + kLanes, hi);
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + kLanes, hi);
  }
  for (int64_t c = kDimV; c < d_qk; c += kLanes) _mm256_storeu_ps(k_dst + c, widen(src + c));
#else
  cpu::Bf16ToF32Row(src, d_qk, k_dst);
  for (int64_t panel = 0; panel < kDimV / cpu::kGemmNr; ++panel) {
    std::memcpy(v_dst + panel * kVPanelStride, k_dst + panel * cpu::kGemmNr,
                cpu::kGemmNr * sizeof(float));
  }
#endif
}

// One FP8 cache row (params.h) dequantised to f32: columns 0..511 = e4m3 × their tile's scale
// to k_dst and the V panels, the 64 bf16 rope columns to k_dst[512..575].
inline void DequantRow(const uint8_t* src, float* k_dst, float* v_dst) {
  float scales[kDimV / kFp8ScaleCols];
  std::memcpy(scales, src + kFp8ScaleOffset, sizeof scales);
  const auto* rope = reinterpret_cast<const bf16_t*>(src + kFp8RopeOffset);
#if defined(__AVX2__)
  const float* table = internal::kFp8DecodeTable.value;
  for (int64_t c = 0; c < kDimV; c += cpu::kGemmNr) {
    const __m256 scale = _mm256_set1_ps(scales[c / kFp8ScaleCols]);
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    const __m256 lo = _mm256_mul_ps(
        _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(codes), sizeof(float)), scale);
    const __m256 hi = _mm256_mul_ps(
        _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8)), sizeof(float)),
        scale);
    float* v = v_dst + (c / cpu::kGemmNr) * kVPanelStride;
    _mm256_storeu_ps(k_dst + c, lo);
    _mm256_storeu_ps(k_dst + c + kLanes, hi);
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + kLanes, hi);
  }
#else
  for (int64_t c = 0; c < kDimV; ++c) {
    k_dst[c] = Fp8E4M3ToFloat(src[c]) * scales[c / kFp8ScaleCols];
  }
  for (int64_t panel = 0; panel < kDimV / cpu::kGemmNr; ++panel) {
    std::memcpy(v_dst + panel * kVPanelStride, k_dst + panel * cpu::kGemmNr,
                cpu::kGemmNr * sizeof(float));
  }
#endif
  cpu::Bf16ToF32Row(rope, kFp8DimQk - kDimV, k_dst + kDimV);
}

// One per-tensor FP8 row (params.h) dequantised to f32: all d_qk columns = e4m3 × scale to
// k_dst, the first 512 also to the V panels.
inline void DequantRowPerTensor(const uint8_t* src, int64_t d_qk, float scale, float* k_dst,
                                float* v_dst) {
#if defined(__AVX2__)
  const float* table = internal::kFp8DecodeTable.value;
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t c = 0; c < d_qk; c += cpu::kGemmNr) {
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    const __m256 lo = _mm256_mul_ps(
        _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(codes), sizeof(float)), vscale);
    const __m256 hi = _mm256_mul_ps(
        _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8)), sizeof(float)),
        vscale);
    _mm256_storeu_ps(k_dst + c, lo);
    _mm256_storeu_ps(k_dst + c + kLanes, hi);
    if (c < kDimV) {
      float* v = v_dst + (c / cpu::kGemmNr) * kVPanelStride;
      _mm256_storeu_ps(v, lo);
      _mm256_storeu_ps(v + kLanes, hi);
    }
  }
#else
  for (int64_t c = 0; c < d_qk; ++c) k_dst[c] = Fp8E4M3ToFloat(src[c]) * scale;
  for (int64_t panel = 0; panel < kDimV / cpu::kGemmNr; ++panel) {
    std::memcpy(v_dst + panel * kVPanelStride, k_dst + panel * cpu::kGemmNr,
                cpu::kGemmNr * sizeof(float));
  }
#endif
}

// Converts the gathered rows: K (all d_qk columns) row-major, V (first 512) packed for P·V.
void ConvertRows(const Params& p, const int32_t* rows, int64_t n, Scratch& sc) {
  const int64_t d_qk = p.q.dim(2), ld = d_qk + kRowPad;
  if (p.kv_is_fp8_per_tensor()) {
    const uint8_t* kv = p.kv.ptr<const uint8_t>();
    for (int64_t r = 0; r < n; ++r) {
      DequantRowPerTensor(kv + static_cast<int64_t>(rows[r]) * p.kv.stride(0), d_qk, p.kv_scale,
                          sc.k_tile.data() + r * ld, sc.v_packed.data() + r * cpu::kGemmNr);
    }
    return;
  }
  if (p.kv_is_fp8()) {
    const uint8_t* kv = p.kv.ptr<const uint8_t>();
    for (int64_t r = 0; r < n; ++r) {
      DequantRow(kv + static_cast<int64_t>(rows[r]) * p.kv.stride(0), sc.k_tile.data() + r * ld,
                 sc.v_packed.data() + r * cpu::kGemmNr);
    }
    return;
  }
  const bf16_t* kv = p.kv.ptr<const bf16_t>();
  for (int64_t r = 0; r < n; ++r) {
    ConvertRow(kv + static_cast<int64_t>(rows[r]) * p.kv.stride(0), d_qk, sc.k_tile.data() + r * ld,
               sc.v_packed.data() + r * cpu::kGemmNr);
  }
}

// Token t, heads [h0, h0 + heads).
void RunItem(const Params& p, int64_t t, int64_t h0, int64_t heads, Scratch& sc) {
  const int64_t d_qk = p.q.dim(2), s_rows = p.kv.dim(0);
  const int64_t heads8 = Scratch::RoundUp(heads);
  const float q_scale = p.sm_scale * kLog2e;
  const bf16_t* q = p.q.ptr_at<const bf16_t>(t * p.q.stride(0));
  for (int64_t h = 0; h < heads; ++h) {
    const bf16_t* src = q + (h0 + h) * p.q.stride(1);
    float* dst = sc.q_rows.data() + h * d_qk;
    cpu::Bf16ToF32Row(src, d_qk, dst);
    for (int64_t d = 0; d < d_qk; ++d) dst[d] *= q_scale;
  }
  cpu::GemmPackB(heads, d_qk, sc.q_rows.data(), d_qk, /*b_transposed=*/true, sc.q_packed.data());
  std::fill(sc.m.begin(), sc.m.end(), kNegInf);
  std::fill(sc.l.begin(), sc.l.end(), 0.0f);

  const SlotRow sel = Slots(p, t);
  int64_t pos = 0;
  bool any = false;
  int cur = 0;
  int64_t n = GatherRows(sel, s_rows, &pos, sc.rows[cur]);
  while (n > 0) {
    ConvertRows(p, sc.rows[cur], n, sc);
    const int64_t n_next = GatherRows(sel, s_rows, &pos, sc.rows[1 - cur]);
    RowPrefetcher prefetch(p, sc.rows[1 - cur], n_next);
    const int64_t row_slices = CeilDiv(n, cpu::kGemmMr);
    const int64_t panels = kDimV / cpu::kGemmNr;
    int64_t slices_left = row_slices + panels;
    // Sᵀ = K·Qᵀ one micro-tile row group at a time. Padded heads (heads..heads8) read Qᵀ's
    // zero columns: finite scores, never used.
    for (int64_t i0 = 0; i0 < n; i0 += cpu::kGemmMr) {
      cpu::GemmF32PackedB(std::min<int64_t>(cpu::kGemmMr, n - i0), heads8, d_qk,
                          sc.k_tile.data() + i0 * (d_qk + kRowPad), d_qk + kRowPad,
                          sc.q_packed.data(), sc.scores.data() + i0 * heads8, heads8,
                          /*accumulate=*/false);
      prefetch.Step(slices_left--);
    }
    cpu::OnlineSoftmaxColumns(n, heads8, sc.scores.data(), heads8, sc.m.data(), sc.l.data(),
                              sc.alpha.data());
    if (p.precision == Precision::kFast) cpu::RoundTileToBf16(n, heads8, sc.scores.data(), heads8);
    cpu::TransposeTile(n, heads, sc.scores.data(), heads8, sc.probs.data(), kChunk);
    if (any) cpu::RescaleRows(heads, kDimV, sc.alpha.data(), sc.acc.data(), kDimV);
    // O += P·V one 16-column panel at a time.
    for (int64_t panel = 0; panel < panels; ++panel) {
      cpu::GemmF32PackedB(heads, cpu::kGemmNr, n, sc.probs.data(), kChunk,
                          sc.v_packed.data() + panel * kVPanelStride,
                          sc.acc.data() + panel * cpu::kGemmNr, kDimV, /*accumulate=*/any);
      prefetch.Step(slices_left--);
    }
    any = true;
    n = n_next;
    cur = 1 - cur;
  }

  bf16_t* out = p.out.ptr_at<bf16_t>(t * p.out.stride(0));
  float* lse = p.lse.present() ? p.lse.ptr_at<float>(t * p.lse.stride(0)) : nullptr;
  for (int64_t h = 0; h < heads; ++h) {
    bf16_t* o = out + (h0 + h) * p.out.stride(1);
    if (!any) {
      std::fill(o, o + kDimV, FloatToBf16(0.0f));
      if (lse != nullptr) lse[(h0 + h) * p.lse.stride(1)] = kNegInf;
      continue;
    }
    const float inv = 1.0f / sc.l[h];
    const float* a = sc.acc.data() + h * kDimV;
    for (int64_t d = 0; d < kDimV; ++d) o[d] = FloatToBf16(a[d] * inv);
    if (lse != nullptr) {
      lse[(h0 + h) * p.lse.stride(1)] = static_cast<float>(
          (static_cast<double>(sc.m[h]) + std::log2(static_cast<double>(sc.l[h]))) * kLn2Double);
    }
  }
}

// Heads per work item: whole head range up to kMaxHeadBlock, halved (in multiples of 8) while
// there are fewer than two items per thread.
int64_t HeadBlock(int64_t t, int64_t h, int threads) {
  int64_t block = std::min(h, kMaxHeadBlock);
  while (block > kLanes && t * CeilDiv(h, block) < 2 * threads) {
    block = Scratch::RoundUp(block / 2);
  }
  return block;
}

}  // namespace

absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  ATTND_RETURN_IF_ERROR(CheckSelectionData(p));
  const int64_t t_count = p.q.dim(0), h = p.q.dim(1), d_qk = p.q.dim(2);
  if (t_count == 0) return absl::OkStatus();
  const int threads = ctx.pool != nullptr ? ctx.pool->num_threads() : 1;
  // batch_invariant: the head block from H alone (not from T and the threads), so a token's
  // items are cut alike whatever else is in the call (docs/KERNELS.md "Batch invariance").
  const int64_t block =
      p.batch_invariant ? std::min(h, kMaxHeadBlock) : HeadBlock(t_count, h, threads);
  const int64_t blocks = CeilDiv(h, block);
  ParallelFor(ctx.pool, t_count * blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch sc(block, d_qk);
    for (int64_t item = begin; item < end; ++item) {
      if (StopRequested(ctx)) return;
      const int64_t t = item / blocks, h0 = (item % blocks) * block;
      RunItem(p, t, h0, std::min(block, h - h0), sc);
    }
  });
  return absl::OkStatus();
}

}  // namespace attnd::kernels::sparse_mla
