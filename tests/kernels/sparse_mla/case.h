// Random sparse MLA calls for the tests: q, a KV cache view with NaN guard rows on both sides (an
// index -2, -1, S or S+1 that were read would poison the output), the selection in both forms
// (table + optional topk_length, and the equivalent CSR), and NaN-poisoned outputs. The cache is
// bf16 or the FP8 format (params.h: e4m3 codes, random ones subnormals included, never NaN;
// random scales per row and 128-column tile; bf16 rope).
//   SparseMlaCase c(spec, rng);
//   sparse_mla::Params p = c.MakeParams(/*csr=*/false);
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/sparse_mla/params.h"
#include "kernels/sparse_mla/reference.h"
#include "tests/harness/fp8_kv.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/vendor.h"
#endif

namespace attnd::testing {

// kFp8PerTensor: the per-tensor FP8 cache (u8 [S, d_qk], one kv_scale) built the frontend's
// way (tests/harness/fp8_kv.h QuantizeMlaRowPerTensor), at the spec's d_qk (512 or 576).
enum class KvFormat { kBf16, kFp8, kFp8PerTensor };
std::string KvFormatName(KvFormat f);  // "Bf16" / "Fp8" / "Fp8PerTensor" (test name suffixes)
inline void PrintTo(KvFormat f, std::ostream* os) { *os << KvFormatName(f); }

struct SparseMlaSpec {
  int64_t t = 3;
  int64_t h = 16;
  int64_t d_qk = 576;
  int64_t s = 700;                // cache rows
  int64_t k = 130;                // table width
  int64_t kv_row_stride = 0;      // 0: dense (d_qk)
  int64_t q_pad = 0;              // extra elements after each q head row (dim 1 stride > d_qk)
  int64_t indices_row_pad = 0;    // extra elements after each table row
  double masked_fraction = 0.15;  // slots replaced by invalid indices (-1, ≥ S, int32 extremes)
  bool with_topk_length = false;  // random lengths in [-2, K + 2] (clamped by the op)
  bool with_lse = true;
  // lse's layout (docs/CONTRACTS.md "Strided lse"): [T, H] rows H + lse_pad apart, or, head
  // major, a view of the caller's [H, T + lse_pad] (vLLM's merge layout: strides (1, T + pad)).
  // The gaps hold poison that must survive every run (ExpectLseGapsPoisoned).
  bool lse_head_major = false;
  int64_t lse_pad = 0;
  // kFp8: the FP8 cache, [S, 656] bytes with row stride max(kv_row_stride, 656) bytes; d_qk is
  // then always 576 (the only one it serves), whatever d_qk says.
  KvFormat kv_format = KvFormat::kBf16;
  // FP8 scales (FillFp8Row): random powers of two (what FlashMLA's and vLLM's quantisers write;
  // bf16 holds every e4m3 × scale exactly) or, when false, any f32 in the same ranges.
  bool pow2_scales = true;
  // kFp8PerTensor: the cache's kv_scale (0: 2^-5 with pow2_scales, else 0.0371, a calibrated
  // amax / 448 style scale that bf16 cannot hold times every code).
  float kv_scale = 0;
};

class SparseMlaCase {
 public:
  // Random data; slots[t] (K entries per token) drawn per the spec.
  SparseMlaCase(const SparseMlaSpec& spec, std::mt19937_64& rng);
  // The same with caller-chosen slots (each row exactly K entries) and topk lengths (empty:
  // no topk_length tensor).
  SparseMlaCase(const SparseMlaSpec& spec, std::mt19937_64& rng,
                const std::vector<std::vector<int32_t>>& slots,
                const std::vector<int32_t>& topk_length);

  // A call in the table form or the equivalent CSR form (row t = the first
  // clamp(topk_length[t], 0, K) slots, masked ones kept).
  kernels::sparse_mla::Params MakeParams(bool csr);
  std::vector<HostTensor*> Outputs();

  const SparseMlaSpec& spec() const { return spec_; }
  float kv_scale() const { return spec_.kv_scale; }  // kFp8PerTensor: the cache's scale
  HostTensor& out() { return out_; }
  HostTensor& lse() { return lse_; }

  // Writes `value` (any float) into every element of cache row `row` (may be a guard row: -2..S+1);
  // FP8: every code is e4m3(value), the scales 1 (NaN for a NaN value), the rope bf16(value);
  // per-tensor FP8: every code is e4m3(value / kv_scale).
  void SetKvRow(int64_t row, float value);

 private:
  void Build(std::mt19937_64& rng, const std::vector<std::vector<int32_t>>& slots,
             const std::vector<int32_t>& topk_length);

  SparseMlaSpec spec_;
  HostTensor q_, kv_storage_, table_, topk_length_, indptr_, csr_indices_, out_, lse_;
  kernels::Tensor kv_;  // S rows of kv_storage_ after the leading guard rows
};

// Random slots: uniform valid indices in [0, S) with masked_fraction of them invalid.
std::vector<std::vector<int32_t>> RandomSlots(const SparseMlaSpec& spec, std::mt19937_64& rng);

// The bounds every sparse MLA implementation is held to against the fp64 reference.
// out is bf16: round-to-nearest-even has relative error ≤ u = 2^-8 ≈ 3.9e-3 per element, so
// ‖err‖/‖ref‖ ≤ 2^-8 from rounding alone. The f32 path adds ~1e-6 relative (scores summed over
// d_qk ≤ 576 products of O(1) values, exp2 polynomial ~2e-7, P·V over ≤ 2051 terms), covered by
// rtol 4e-3 (2^-8 + 1e-4) and atol 2e-5 for outputs near zero (|v| ≲ 5 here).
// That is the HIGH precision's bound; FAST's adds bf16 P's error (ExpectAttentionOut, harness.h).
inline constexpr Tolerance kOutTol{4e-3, 2e-5, 4e-3};
// lse is f32 (|lse| ≲ 10: rounding 1e-6) from f32 scores whose error is ~1e-6 absolute for the
// O(1) scores these tests produce (sm_scale = 1/sqrt(d_qk), unit-normal q and kv); 1e-4 leaves
// room for unlucky sums without hiding a wrong max or sum (errors of those are ≥ 1e-2).
inline constexpr Tolerance kLseTol{1e-5, 1e-4, 0.0};

// c.out() against ref.out in p.precision (ExpectAttentionOut: kOutTol for HIGH, the FAST bound
// from ref.out_abs), and c.lse() against ref.lse (kLseTol) when p has lse.
void ExpectOutputs(SparseMlaCase& c, const kernels::sparse_mla::Params& p,
                   const kernels::sparse_mla::Reference& ref, const std::string& what);

// Every f32 element of lse's span that the view does not address still holds PoisonNaN's
// pattern (a kernel that ignores a stride writes into the gaps).
void ExpectLseGapsPoisoned(const HostTensor& lse, const std::string& what);

// An f32 view of `shape` with `strides` (elements) over storage covering exactly its span.
HostTensor StridedF32(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

inline constexpr int64_t kKvGuardRows = 2;  // NaN rows before and after the S cache rows

// Runs `impl` on device mirrors of `p`, a call a SparseMlaCase built (RunOnGpu: outputs come back
// to p's host tensors). The mirrored KV view is widened by the case's NaN guard rows on both
// sides and narrowed back before impl.run sees it, so a read of index -2, -1, S or S+1 poisons
// the output.
absl::Status RunOnGpuWithKvGuards(const kernels::Impl<kernels::sparse_mla::Params>& impl,
                                  const kernels::sparse_mla::Params& p);

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
// One of kernels/sparse_mla/gpu/launch.h's launchers, with an explicit split count.
using SplitLauncher = std::function<gpu::Error(const kernels::sparse_mla::Params&, int splits,
                                               void* workspace, gpu::Stream stream)>;
// Every (precision, split count) pair, FAST first: the forced-split GPU tests run each.
std::vector<std::pair<kernels::Precision, int>> PrecisionsAndSplits(
    std::initializer_list<int> splits);

// Runs `launch` with exactly `splits` splits (workspace SplitWorkspaceBytes) through
// RunOnGpuWithKvGuards.
absl::Status RunWithSplitsOnGpu(const SplitLauncher& launch, const kernels::sparse_mla::Params& p,
                                int splits);
#endif

}  // namespace attnd::testing
