// CPU implementation of the dense MLA decode. The s_q × H query rows of a request are stacked
// into row blocks (the MTP trick: one pass over the pages serves every head and draft token);
// each block walks its request's readable tokens in tiles of 64, gathered from the pages (ids
// out of range are skipped, never read), and runs Sᵀ = K·Qᵀ and O += P·V through
// cpu::GemmF32PackedB (Qᵀ packed once per block, V converted straight into packed panels) with
// an online softmax in log2 units (FAST rounds P to bf16 after the sums). A per-tensor FP8 cache
// row is dequantised (e4m3 × kv_scale in f32) into the same K tile and V panels. Long contexts with
// few blocks split the tokens across threads and combine the partial (O, max, sum) afterwards; an
// empty split reads nothing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/common/cpu/attention_tile.h"
#include "kernels/common/cpu/gemm.h"
#include "kernels/common/fp8.h"
#include "kernels/common/math.h"
#include "kernels/common/thread_pool.h"
#include "kernels/mla_decode/invariant_plan.h"
#include "kernels/mla_decode/mla_decode.h"

namespace attnd::kernels::mla_decode::internal {
namespace {

using cpu::kVec;

constexpr int64_t kTileTokens = 64;       // tokens per S tile (one model page)
constexpr int64_t kMaxBlockRows = 64;     // query rows (s_q × H) per block
constexpr int64_t kMinSplitTokens = 256;  // a context split covers at least this many tokens

// How the rows and tokens of a call are cut into work items.
struct Plan {
  int64_t rows = 0;        // s_q · H per request
  int64_t num_blocks = 0;  // row blocks per request
  int64_t block_rows = 0;  // rows per block (the last may have fewer)
  int64_t splits = 1;      // token ranges per (request, block)
  bool invariant = false;  // splits of fixed size (invariant_plan.h), not even shares
};

Plan MakePlan(const Params& p, const ExecContext& ctx) {
  Plan plan;
  plan.rows = p.q.dim(1) * p.q.dim(2);
  plan.num_blocks = CeilDiv(plan.rows, kMaxBlockRows);
  plan.block_rows = plan.num_blocks == 0 ? 0 : CeilDiv(plan.rows, plan.num_blocks);
  const int64_t threads = ctx.pool == nullptr ? 1 : ctx.pool->num_threads();
  const int64_t items = p.q.dim(0) * plan.num_blocks;
  if (p.batch_invariant) {
    // Each request's context in InvariantSplitTiles' fixed-size ranges (docs/KERNELS.md "Batch
    // invariance"); enough splits for the longest request. One split writes the rows directly,
    // which the combine of one non-empty split reproduces exactly (weight 1).
    for (int64_t b = 0; b < p.q.dim(0); ++b) {
      plan.splits =
          std::max(plan.splits, InvariantSplitsOfRequest(ClampedSeqlen(p, b), kTileTokens));
    }
    plan.invariant = true;
    return plan;
  }
  if (threads > 1 && items > 0 && items < 4 * threads) {
    int64_t max_seqlen = 0;
    for (int64_t b = 0; b < p.q.dim(0); ++b) max_seqlen = std::max(max_seqlen, ClampedSeqlen(p, b));
    plan.splits = std::clamp<int64_t>(CeilDiv(4 * threads, items), 1,
                                      std::max<int64_t>(1, max_seqlen / kMinSplitTokens));
  }
  return plan;
}

// Per-thread buffers for one block of up to `block_rows` rows.
struct Scratch {
  Scratch(int64_t block_rows, int64_t d_qk)
      : rp(CeilDiv(block_rows, kVec) * kVec),
        qp(cpu::GemmPackedBSize(rp, d_qk)),
        kf(kTileTokens * d_qk),
        vp(cpu::GemmPackedBSize(kDv, kTileTokens)),
        st(kTileTokens * rp),
        p(rp * kTileTokens),
        o(rp * kDv),
        m(rp),
        l(rp),
        alpha(rp),
        limit(rp),
        pos(kTileTokens),
        token(kTileTokens) {}
  int64_t rp;             // rows padded to a multiple of kVec (columns of Qᵀ and Sᵀ)
  std::vector<float> qp;  // scaled Qᵀ [d_qk][rp] in GemmPackB layout, padding zero
  std::vector<float> kf;  // [64][d_qk] gathered K, row-major: A of Sᵀ = K·Qᵀ
  std::vector<float> vp;  // V = K[:, :512] in GemmPackB layout: B of O += P·V
  std::vector<float> st;  // [64][rp] scores, then probabilities
  std::vector<float> p;   // [rows][64] probabilities, row-major for O += P·V
  std::vector<float> o;   // [rows][512] unnormalised output
  std::vector<float> m, l, alpha;
  std::vector<int32_t> limit;      // per row: positions >= limit are invisible
  std::vector<int32_t> pos;        // per gathered token: its position in the request
  std::vector<const void*> token;  // its cache row (bf16, or per-tensor FP8 codes)
};

// One per-tensor FP8 row (params.h) to f32: kf = e4m3(codes) × scale (d columns), and its first
// kDv columns as row t of the k-row packed V.
void DequantRowToTile(const uint8_t* codes, int64_t d, float scale, int64_t t, int64_t k, float* kf,
                      float* vp) {
  for (int64_t c = 0; c < d; ++c) kf[c] = Fp8E4M3ToFloat(codes[c]) * scale;
  for (int64_t j = 0; j < kDv; j += cpu::kGemmNr) {
    std::memcpy(vp + j * k + t * cpu::kGemmNr, kf + j, cpu::kGemmNr * sizeof(float));
  }
}

// Attends rows [r0, r0 + nr) of request b to its readable tokens in [begin, end), leaving the
// unnormalised output in s.o and the running max / sum (log2 units) in s.m / s.l.
void AttendBlock(const Params& p, int64_t b, int64_t r0, int64_t nr, int64_t begin, int64_t end,
                 Scratch& s) {
  const int64_t s_q = p.q.dim(1), heads = p.q.dim(2), d = p.q.dim(3);
  const int64_t rp = s.rp;
  const int64_t seqlen = ClampedSeqlen(p, b);
  std::fill(s.o.begin(), s.o.begin() + nr * kDv, 0.0f);
  std::fill(s.m.begin(), s.m.end(), kNegInf);
  std::fill(s.l.begin(), s.l.end(), 0.0f);
  int64_t min_limit = seqlen, max_limit = 0;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t lim = VisibleLimit(seqlen, s_q, (r0 + r) / heads, p.causal);
    s.limit[r] = static_cast<int32_t>(lim);
    min_limit = std::min(min_limit, lim);
    max_limit = std::max(max_limit, lim);
  }
  for (int64_t r = nr; r < rp; ++r) s.limit[r] = static_cast<int32_t>(max_limit);
  end = std::min(end, max_limit);
  if (begin >= end) return;

  const float scale = p.sm_scale * kLog2e;
  const int64_t rp_packed = CeilDiv(rp, cpu::kGemmNr) * cpu::kGemmNr;
  for (int64_t r = 0; r < rp_packed; ++r) {
    const int64_t i = (r0 + r) / heads, h = (r0 + r) % heads;
    const bf16_t* row =
        r < nr ? p.q.ptr_at<const bf16_t>(b * p.q.stride(0) + i * p.q.stride(1) + h * p.q.stride(2))
               : nullptr;
    cpu::Bf16ColumnToPacked(row, d, r, scale, s.qp.data());
  }

  auto process_tile = [&](int64_t nt) {
    for (int64_t t = 0; t < nt; ++t) {
      if (p.kv_is_fp8()) {
        DequantRowToTile(static_cast<const uint8_t*>(s.token[t]), d, p.kv_scale, t, nt,
                         s.kf.data() + t * d, s.vp.data());
        continue;
      }
      const auto* row = static_cast<const bf16_t*>(s.token[t]);
      cpu::Bf16ToF32Row(row, d, s.kf.data() + t * d);
      cpu::Bf16RowToPacked(row, kDv, t, nt, s.vp.data());
    }
    cpu::GemmF32PackedB(nt, rp, d, s.kf.data(), d, s.qp.data(), s.st.data(), rp,
                        /*accumulate=*/false);
    if (s.pos[nt - 1] >= min_limit) {
      cpu::MaskByLimit(nt, rp, s.pos.data(), s.limit.data(), s.st.data(), rp);
    }
    cpu::OnlineSoftmaxColumns(nt, rp, s.st.data(), rp, s.m.data(), s.l.data(), s.alpha.data());
    if (p.precision == Precision::kFast) cpu::RoundTileToBf16(nt, rp, s.st.data(), rp);
    cpu::RescaleRows(nr, kDv, s.alpha.data(), s.o.data(), kDv);
    cpu::TransposeTile(nt, rp, s.st.data(), rp, s.p.data(), kTileTokens);
    cpu::GemmF32PackedB(nr, kDv, nt, s.p.data(), kTileTokens, s.vp.data(), s.o.data(), kDv,
                        /*accumulate=*/true);
  };

  const int64_t page_size = p.kv_cache.dim(1), num_pages = p.kv_cache.dim(0);
  // An empty block table has no data (then no position is read): ptr_at gives null.
  const int32_t* table = p.block_table.ptr_at<const int32_t>(b * p.block_table.stride(0));
  const char* kv = static_cast<const char*>(p.kv_cache.data);
  const int64_t elem = DTypeSize(p.kv_cache.dtype);  // bf16, or u8 codes
  int64_t nt = 0;
  for (int64_t pos = begin; pos < end;) {
    const int64_t page = pos / page_size, slot = pos % page_size;
    const int64_t run = std::min(page_size - slot, end - pos);
    const int64_t id = table[page * p.block_table.stride(1)];
    if (id < 0 || id >= num_pages) {  // masked page: its tokens are never read
      pos += run;
      continue;
    }
    const char* base = kv + (id * p.kv_cache.stride(0) + slot * p.kv_cache.stride(1)) * elem;
    for (int64_t j = 0; j < run; ++j) {
      s.token[nt] = base + j * p.kv_cache.stride(1) * elem;
      s.pos[nt] = static_cast<int32_t>(pos + j);
      if (++nt == kTileTokens) {
        process_tile(nt);
        nt = 0;
      }
    }
    pos += run;
  }
  if (nt > 0) process_tile(nt);
}

// Writes out / lse for one row from its normalised output (or 0 / -inf when l is 0).
void WriteRow(const Params& p, int64_t b, int64_t row, const float* o, float m, float l) {
  const int64_t heads = p.q.dim(2);
  const int64_t i = row / heads, h = row % heads;
  bf16_t* out =
      p.out.ptr_at<bf16_t>(b * p.out.stride(0) + i * p.out.stride(1) + h * p.out.stride(2));
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  for (int64_t c = 0; c < kDv; ++c) out[c] = FloatToBf16(l > 0 ? o[c] * inv : 0.0f);
  if (p.lse.present()) {
    p.lse.ptr<float>()[b * p.lse.stride(0) + i * p.lse.stride(1) + h * p.lse.stride(2)] =
        l > 0 ? (m + std::log2(l)) * kLn2 : kNegInf;
  }
}

}  // namespace

absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  const int64_t batch = p.q.dim(0), d = p.q.dim(3);
  const Plan plan = MakePlan(p, ctx);
  if (batch == 0 || plan.rows == 0) return absl::OkStatus();
  const int64_t blocks = batch * plan.num_blocks;
  auto block_range = [&](int64_t blk, int64_t* r0) {
    *r0 = (blk % plan.num_blocks) * plan.block_rows;
    return std::min(plan.block_rows, plan.rows - *r0);
  };

  if (plan.splits == 1) {
    ParallelFor(ctx.pool, blocks, 1, [&](int64_t first, int64_t last) {
      Scratch s(plan.block_rows, d);
      for (int64_t blk = first; blk < last; ++blk) {
        if (StopRequested(ctx)) return;
        const int64_t b = blk / plan.num_blocks;
        int64_t r0;
        const int64_t nr = block_range(blk, &r0);
        AttendBlock(p, b, r0, nr, 0, ClampedSeqlen(p, b), s);
        for (int64_t r = 0; r < nr; ++r) {
          WriteRow(p, b, r0 + r, s.o.data() + r * kDv, s.m[r], s.l[r]);
        }
      }
    });
    return absl::OkStatus();
  }

  // Split the tokens: partial results per (block, split), then a combine per block.
  const int64_t splits = plan.splits, br = plan.block_rows;
  std::vector<float> part_o(static_cast<size_t>(blocks * splits * br * kDv));
  std::vector<float> part_m(static_cast<size_t>(blocks * splits * br), kNegInf);
  std::vector<float> part_l(static_cast<size_t>(blocks * splits * br), 0.0f);
  ParallelFor(ctx.pool, blocks * splits, 1, [&](int64_t first, int64_t last) {
    Scratch s(br, d);
    for (int64_t item = first; item < last; ++item) {
      if (StopRequested(ctx)) return;
      const int64_t blk = item / splits, split = item % splits, b = blk / plan.num_blocks;
      int64_t r0;
      const int64_t nr = block_range(blk, &r0);
      const int64_t seqlen = ClampedSeqlen(p, b);
      const int64_t chunk = CeilDiv(CeilDiv(seqlen, splits), kTileTokens) * kTileTokens;
      int64_t begin = std::min(seqlen, split * chunk);
      int64_t end = std::min(seqlen, begin + chunk);
      if (plan.invariant) {
        const TileSpan span = InvariantSplitTiles(seqlen, seqlen, split, kTileTokens);
        begin = span.begin;
        end = span.end;
      }
      if (begin >= end) continue;  // an empty split issues no loads; its m stays -inf
      AttendBlock(p, b, r0, nr, begin, end, s);
      std::copy(s.o.begin(), s.o.begin() + nr * kDv, part_o.begin() + item * br * kDv);
      std::copy(s.m.begin(), s.m.begin() + nr, part_m.begin() + item * br);
      std::copy(s.l.begin(), s.l.begin() + nr, part_l.begin() + item * br);
    }
  });
  if (StopRequested(ctx)) return StoppedStatus();  // the partials are incomplete
  ParallelFor(ctx.pool, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> o(kDv);
    for (int64_t blk = first; blk < last; ++blk) {
      int64_t r0;
      const int64_t nr = block_range(blk, &r0);
      for (int64_t r = 0; r < nr; ++r) {
        float m = kNegInf;
        for (int64_t sp = 0; sp < splits; ++sp) {
          m = std::max(m, part_m[(blk * splits + sp) * br + r]);
        }
        float l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t sp = 0; sp < splits && m != kNegInf; ++sp) {
          const int64_t at = (blk * splits + sp) * br + r;
          if (part_m[at] == kNegInf) continue;  // nothing visible: partial O never written
          const float w = std::exp2(part_m[at] - m);
          l += part_l[at] * w;
          const float* po = part_o.data() + at * kDv;
          for (int64_t c = 0; c < kDv; ++c) o[c] += po[c] * w;
        }
        WriteRow(p, blk / plan.num_blocks, r0 + r, o.data(), m, l);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace attnd::kernels::mla_decode::internal
