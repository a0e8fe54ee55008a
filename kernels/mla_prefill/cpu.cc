// CPU implementation of the dense MLA prefill: one work item per (sequence, head, block of 64
// queries). Each walks its sequence's keys in tiles of 64 (stopping at the block's last visible
// key, so fully masked tiles are never touched), computes Sᵀ = K·Qᵀ and O += P·V through
// cpu::GemmF32PackedB (Qᵀ packed once per item, V converted straight into packed panels) with
// an online softmax in log2 units (FAST rounds P to bf16 after the sums), and masks only the tiles
// that cross the causal diagonal. Items are ordered longest first so the dynamic chunks of
// ParallelFor balance.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/common/cpu/attention_tile.h"
#include "kernels/common/cpu/gemm.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/common/thread_pool.h"
#include "kernels/mla_prefill/mla_prefill.h"

namespace attnd::kernels::mla_prefill::internal {
namespace {

using cpu::kVec;

constexpr int64_t kBlockQ = 64;  // queries per work item
constexpr int64_t kTileK = 64;   // keys per tile

int64_t CuAt(const Tensor& cu, int64_t i) { return cu.ptr<const int32_t>()[i * cu.stride(0)]; }

struct Item {
  int64_t seq;
  int64_t head;
  int64_t q0;  // first query of the block, relative to the sequence
};

// Per-thread buffers.
struct Scratch {
  Scratch(int64_t d_qk, int64_t d_v)
      : qp(cpu::GemmPackedBSize(kBlockQ, d_qk)),
        kf(kTileK * d_qk),
        vp(cpu::GemmPackedBSize(d_v, kTileK)),
        st(kTileK * kBlockQ),
        p(kBlockQ * kTileK),
        o(kBlockQ * d_v),
        m(kBlockQ),
        l(kBlockQ),
        alpha(kBlockQ),
        limit(kBlockQ),
        pos(kTileK) {}
  std::vector<float> qp;  // scaled Qᵀ [d_qk][rp] in GemmPackB layout, padding columns zero
  std::vector<float> kf;  // [64][d_qk] row-major: the A operand of Sᵀ = K·Qᵀ
  std::vector<float> vp;  // V [nt][d_v] in GemmPackB layout: the B operand of O += P·V
  std::vector<float> st;  // [64][rp] scores, then probabilities
  std::vector<float> p;   // [rows][64]
  std::vector<float> o;   // [rows][d_v] unnormalised output
  std::vector<float> m, l, alpha;
  std::vector<int32_t> limit;  // per query: keys >= limit are invisible
  std::vector<int32_t> pos;    // per key of the tile: its index in the sequence
};

void WriteRow(const Params& p, int64_t token, int64_t h, const float* o, float m, float l) {
  const int64_t d_v = p.v.dim(2);
  bf16_t* out = p.out.ptr_at<bf16_t>(token * p.out.stride(0) + h * p.out.stride(1));
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  for (int64_t c = 0; c < d_v; ++c) out[c] = FloatToBf16(l > 0 ? o[c] * inv : 0.0f);
  if (p.lse.present()) {
    p.lse.ptr<float>()[token * p.lse.stride(0) + h * p.lse.stride(1)] =
        l > 0 ? (m + std::log2(l)) * kLn2 : kNegInf;
  }
}

void AttendBlock(const Params& p, const Item& item, Scratch& s) {
  const int64_t heads = p.q.dim(1), d_qk = p.q.dim(2), d_v = p.v.dim(2);
  const int64_t group = heads / p.k.dim(1), h = item.head, g = h / group;
  const int64_t q_start = CuAt(p.cu_seqlens_q, item.seq);
  const int64_t k_start = CuAt(p.cu_seqlens_k, item.seq);
  const int64_t lq = CuAt(p.cu_seqlens_q, item.seq + 1) - q_start;
  const int64_t lk = CuAt(p.cu_seqlens_k, item.seq + 1) - k_start;
  const int64_t nr = std::min(kBlockQ, lq - item.q0);
  const int64_t rp = CeilDiv(nr, kVec) * kVec;
  const int64_t rp_packed = CeilDiv(nr, cpu::kGemmNr) * cpu::kGemmNr;

  int64_t min_limit = lk, max_limit = 0;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t lim = KeyLimit(item.q0 + r, lq, lk, p.causal);
    s.limit[r] = static_cast<int32_t>(lim);
    min_limit = std::min(min_limit, lim);
    max_limit = std::max(max_limit, lim);
  }
  for (int64_t r = nr; r < rp; ++r) s.limit[r] = static_cast<int32_t>(max_limit);
  std::fill(s.o.begin(), s.o.begin() + nr * d_v, 0.0f);
  std::fill(s.m.begin(), s.m.end(), kNegInf);
  std::fill(s.l.begin(), s.l.end(), 0.0f);

  if (max_limit > 0) {
    const float scale = p.sm_scale * kLog2e;
    const bf16_t* q =
        p.q.ptr_at<const bf16_t>((q_start + item.q0) * p.q.stride(0) + h * p.q.stride(1));
    for (int64_t r = 0; r < rp_packed; ++r) {
      cpu::Bf16ColumnToPacked(r < nr ? q + r * p.q.stride(0) : nullptr, d_qk, r, scale,
                              s.qp.data());
    }
  }
  const bf16_t* k = p.k.ptr_at<const bf16_t>(k_start * p.k.stride(0) + g * p.k.stride(1));
  const bf16_t* v = p.v.ptr_at<const bf16_t>(k_start * p.v.stride(0) + g * p.v.stride(1));
  for (int64_t k0 = 0; k0 < max_limit; k0 += kTileK) {
    const int64_t nt = std::min(kTileK, max_limit - k0);
    // The next tile's rows are strided by H_kv·d: pull them in under this tile's GEMMs.
    for (int64_t t = k0 + kTileK; t < std::min(k0 + 2 * kTileK, max_limit); ++t) {
      cpu::PrefetchBytes(k + t * p.k.stride(0), d_qk * 2);
      cpu::PrefetchBytes(v + t * p.v.stride(0), d_v * 2);
    }
    for (int64_t t = 0; t < nt; ++t) {
      cpu::Bf16ToF32Row(k + (k0 + t) * p.k.stride(0), d_qk, s.kf.data() + t * d_qk);
      cpu::Bf16RowToPacked(v + (k0 + t) * p.v.stride(0), d_v, t, nt, s.vp.data());
      s.pos[t] = static_cast<int32_t>(k0 + t);
    }
    cpu::GemmF32PackedB(nt, rp, d_qk, s.kf.data(), d_qk, s.qp.data(), s.st.data(), rp,
                        /*accumulate=*/false);
    if (k0 + nt > min_limit) {
      cpu::MaskByLimit(nt, rp, s.pos.data(), s.limit.data(), s.st.data(), rp);
    }
    cpu::OnlineSoftmaxColumns(nt, rp, s.st.data(), rp, s.m.data(), s.l.data(), s.alpha.data());
    if (p.precision == Precision::kFast) cpu::RoundTileToBf16(nt, rp, s.st.data(), rp);
    cpu::RescaleRows(nr, d_v, s.alpha.data(), s.o.data(), d_v);
    cpu::TransposeTile(nt, rp, s.st.data(), rp, s.p.data(), kTileK);
    cpu::GemmF32PackedB(nr, d_v, nt, s.p.data(), kTileK, s.vp.data(), s.o.data(), d_v,
                        /*accumulate=*/true);
  }
  for (int64_t r = 0; r < nr; ++r) {
    WriteRow(p, q_start + item.q0 + r, h, s.o.data() + r * d_v, s.m[r], s.l[r]);
  }
}

}  // namespace

absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  ATTND_RETURN_IF_ERROR(CheckCuSeqlens(p));
  const int64_t total_q = p.q.dim(0), heads = p.q.dim(1), d_qk = p.q.dim(2), d_v = p.v.dim(2);
  const int64_t batch = p.cu_seqlens_q.dim(0) - 1;

  // Longest first: in causal the last query blocks of long sequences see the most keys.
  std::vector<Item> items;
  std::vector<int64_t> work;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lq = CuAt(p.cu_seqlens_q, b + 1) - CuAt(p.cu_seqlens_q, b);
    const int64_t lk = CuAt(p.cu_seqlens_k, b + 1) - CuAt(p.cu_seqlens_k, b);
    for (int64_t q0 = 0; q0 < lq; q0 += kBlockQ) {
      const int64_t keys = KeyLimit(std::min(lq, q0 + kBlockQ) - 1, lq, lk, p.causal);
      for (int64_t h = 0; h < heads; ++h) {
        items.push_back({b, h, q0});
        work.push_back(keys);
      }
    }
  }
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  ParallelFor(ctx.pool, static_cast<int64_t>(items.size()), 1, [&](int64_t first, int64_t last) {
    Scratch s(d_qk, d_v);
    for (int64_t i = first; i < last && !StopRequested(ctx); ++i)
      AttendBlock(p, items[order[i]], s);
  });

  // Rows past the last sequence belong to none: defined output (0, -inf), never stale memory.
  const int64_t covered = CuAt(p.cu_seqlens_q, batch);
  const std::vector<float> zeros(static_cast<size_t>(d_v), 0.0f);
  for (int64_t t = covered; t < total_q; ++t) {
    for (int64_t h = 0; h < heads; ++h) WriteRow(p, t, h, zeros.data(), kNegInf, 0.0f);
  }
  return absl::OkStatus();
}

}  // namespace attnd::kernels::mla_prefill::internal
