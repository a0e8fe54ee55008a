// mla_prefill: every implementation against the fp64 reference on fresh random data, one named
// case per edge case of the contract (docs/CONTRACTS.md "mla_prefill").
#include "kernels/mla_prefill/mla_prefill.h"

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/mla_prefill/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/sparse_buffer.h"
#include "tests/kernels/mla_prefill/prefill_case.h"

namespace attnd::kernels::mla_prefill {
namespace {

using testing::ExpectClose;

// Runs every implementation in both precisions and checks out / lse against the reference;
// returns the reference lse so callers can assert the case has the empty rows it claims.
std::vector<double> CheckCase(const PrefillCase& c) {
  auto rng = testing::MakeRng();
  PrefillTensors t(c, rng);
  Params p = t.params();
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  EXPECT_TRUE(CheckCuSeqlens(p).ok()) << CheckCuSeqlens(p);
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const int runs =
        testing::RunEachImpl(Implementations(), p, t.outputs(), [&](const std::string& impl) {
          testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                      kOutTol, impl + " out");
          if (c.with_lse) {
            ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, impl + " lse");
          }
        });
    EXPECT_GE(runs, 1);
  }
  return ref_lse;
}

int CountEmptyRows(const std::vector<double>& lse) {
  int n = 0;
  for (double v : lse) n += std::isinf(v) ? 1 : 0;
  return n;
}

TEST(MlaPrefill, EqualLengthsCausal) {
  PrefillCase c;
  c.lens = {{130, 130}};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), 0);
}

TEST(MlaPrefill, EqualLengthsNonCausal) {
  PrefillCase c;
  c.causal = false;
  c.lens = {{130, 130}};
  CheckCase(c);
}

// More keys than queries (chunked prefill over a cached prefix): query i sees i + Lk − Lq + 1.
TEST(MlaPrefill, KeysLongerThanQueriesCausal) {
  PrefillCase c;
  c.lens = {{37, 150}, {64, 65}};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), 0);
}

TEST(MlaPrefill, KeysLongerThanQueriesNonCausal) {
  PrefillCase c;
  c.causal = false;
  c.lens = {{37, 150}, {64, 65}};
  CheckCase(c);
}

// More queries than keys: with bottom-right alignment the first Lq − Lk queries see nothing.
TEST(MlaPrefill, QueriesLongerThanKeysCausal) {
  PrefillCase c;
  c.lens = {{150, 37}, {70, 1}};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), ((150 - 37) + (70 - 1)) * c.heads);
}

TEST(MlaPrefill, QueriesLongerThanKeysNonCausal) {
  PrefillCase c;
  c.causal = false;
  c.lens = {{150, 37}};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), 0);
}

// The diagonal sits at every offset inside a 64-key tile across the query blocks.
TEST(MlaPrefill, CausalBottomRightAlignment) {
  PrefillCase c;
  c.heads = c.heads_kv = 2;
  c.lens = {{65, 129}, {63, 64}, {1, 200}, {128, 128}, {100, 37}};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), (100 - 37) * c.heads);
}

TEST(MlaPrefill, EmptySequences) {
  for (bool causal : {true, false}) {
    PrefillCase c;
    c.causal = causal;
    // Lq = 0 with keys, Lk = 0 with queries (all empty rows), both 0, and a normal one between.
    c.lens = {{0, 50}, {20, 0}, {0, 0}, {30, 40}, {0, 0}};
    const auto lse = CheckCase(c);
    EXPECT_EQ(CountEmptyRows(lse), 20 * c.heads);
  }
}

// Rows past cu_seqlens_q[B] belong to no sequence: out 0, lse -inf (never stale memory);
// key rows past cu_seqlens_k[B] are NaN and must never be read.
TEST(MlaPrefill, RowsPastTheLastSequence) {
  PrefillCase c;
  c.lens = {{40, 50}, {30, 30}};
  c.extra_q_rows = 7;
  c.extra_k_rows = 9;
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), 7 * c.heads);
}

// Sequences of several 128-key tiles and query tiles: the GPU kernels' stages are refilled many
// times (every pipeline phase and both stages), lengths not multiples of any tile.
TEST(MlaPrefill, LongSequencesManyTiles) {
  for (bool causal : {true, false}) {
    PrefillCase c;
    c.causal = causal;
    c.heads = 2;
    c.heads_kv = 1;
    c.lens = {{600, 700}, {517, 517}, {3, 389}};
    c.extra_k_rows = 5;
    CheckCase(c);
  }
}

// More work items (query tile x head) than a GPU has SMs, each over several key tiles: a
// persistent kernel's CTAs take many items in turn, its pipeline running on across them. GPU
// machines only (the fp64 reference takes seconds).
TEST(MlaPrefill, ManyItemsOfSeveralTiles) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU: the CPU cases above cover the math";
  PrefillCase c;
  c.heads = 4;
  c.heads_kv = 2;
  auto rng = testing::MakeRng();
  c.lens.clear();
  for (int b = 0; b < 90; ++b) {
    const int32_t lq = 1 + static_cast<int32_t>(rng() % 400);
    c.lens.push_back({lq, lq + static_cast<int32_t>(rng() % 64)});
  }
  c.extra_k_rows = 3;
  CheckCase(c);
}

TEST(MlaPrefill, ManySequences) {
  PrefillCase c;
  c.heads = c.heads_kv = 2;
  auto rng = testing::MakeRng();
  c.lens.clear();
  for (int b = 0; b < 9; ++b) {
    c.lens.push_back({static_cast<int32_t>(rng() % 90), static_cast<int32_t>(rng() % 90)});
  }
  CheckCase(c);
}

// More sequences than the GPU schedule scans in one pass (256): tile offsets carry across
// chunks; empty sequences and Lq > Lk ones among them.
TEST(MlaPrefill, ManySequencesPastOneScanChunk) {
  PrefillCase c;
  c.heads = 2;
  c.heads_kv = 1;
  c.d_qk = 64;
  c.d_v = 64;
  auto rng = testing::MakeRng();
  c.lens.clear();
  for (int b = 0; b < 600; ++b) {
    c.lens.push_back({static_cast<int32_t>(rng() % 40), static_cast<int32_t>(rng() % 40)});
  }
  CheckCase(c);
}

class MlaPrefillGqa : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(MlaPrefillGqa, KvHeadsShared) {
  PrefillCase c;
  c.heads = std::get<0>(GetParam());
  c.heads_kv = std::get<1>(GetParam());
  c.lens = {{70, 90}, {33, 33}};
  CheckCase(c);
}
INSTANTIATE_TEST_SUITE_P(Heads, MlaPrefillGqa,
                         ::testing::Values(std::make_tuple(8, 1), std::make_tuple(8, 8),
                                           std::make_tuple(8, 2), std::make_tuple(1, 1)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_Hkv" +
                                  std::to_string(std::get<1>(info.param));
                         });

class MlaPrefillHeadDims : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(MlaPrefillHeadDims, GenericPath) {
  for (bool causal : {true, false}) {
    PrefillCase c;
    c.causal = causal;
    c.heads = 2;
    c.heads_kv = 1;
    c.d_qk = std::get<0>(GetParam());
    c.d_v = std::get<1>(GetParam());
    c.lens = {{70, 100}, {20, 9}};
    CheckCase(c);
  }
}
INSTANTIATE_TEST_SUITE_P(Dims, MlaPrefillHeadDims,
                         ::testing::Values(std::make_tuple(192, 128), std::make_tuple(64, 64),
                                           std::make_tuple(256, 256), std::make_tuple(128, 192),
                                           std::make_tuple(5, 3), std::make_tuple(1, 1),
                                           std::make_tuple(72, 40)),
                         [](const auto& info) {
                           return "Dqk" + std::to_string(std::get<0>(info.param)) + "_Dv" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(MlaPrefill, PaddedStrides) {
  PrefillCase c;
  c.padded_strides = true;
  c.heads = 4;
  c.heads_kv = 2;
  c.lens = {{70, 100}, {50, 20}};
  c.extra_q_rows = 3;
  CheckCase(c);
}

TEST(MlaPrefill, WithoutLse) {
  PrefillCase c;
  c.with_lse = false;
  c.lens = {{70, 80}};
  CheckCase(c);
}

// q, k and v views whose token strides put the last tokens past 2^31 elements (4 GiB): every
// offset must be 64-bit. Only the rows used are backed by memory.
TEST(MlaPrefill, OffsetsPast2To31Elements) {
  constexpr int64_t kTokens = 3, kD = 64, kStride = (int64_t{1} << 30) + kD;
  const int64_t bytes = ((kTokens - 1) * kStride + kD) * 2;
  testing::SparseBuffer q_mem(bytes), k_mem(bytes), v_mem(bytes);
  if (!q_mem.data() || !k_mem.data() || !v_mem.data()) GTEST_SKIP() << "no address space";
  auto rng = testing::MakeRng();
  std::normal_distribution<float> dist;
  Tensor views[3];
  void* mems[3] = {q_mem.data(), k_mem.data(), v_mem.data()};
  for (int i = 0; i < 3; ++i) {
    views[i] = MakeStridedTensor(mems[i], DType::kBF16, {kTokens, 1, kD}, {kStride, kD, 1});
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int64_t c = 0; c < kD; ++c)
        views[i].ptr<bf16_t>()[t * kStride + c] = FloatToBf16(dist(rng));
    }
  }
  PrefillCase c;
  c.heads = c.heads_kv = 1;
  c.d_qk = c.d_v = kD;
  c.lens = {{kTokens, kTokens}};
  PrefillTensors t(c, rng);
  Params p = t.params();
  p.q = views[0];
  p.k = views[1];
  p.v = views[2];
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const int runs =
        testing::RunEachImpl(Implementations(), p, t.outputs(), [&](const std::string& impl) {
          testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                      kOutTol, impl + " out");
          ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, impl + " lse");
        });
    EXPECT_GE(runs, 1);
  }
}

TEST(MlaPrefill, RunDispatchesToCpu) {
  auto rng = testing::MakeRng();
  PrefillCase c;
  c.lens = {{10, 12}};
  PrefillTensors t(c, rng);
  ExecContext ctx;
  ctx.pool = testing::TestPool();
  std::string impl;
  ASSERT_TRUE(mla_prefill::Run(t.params(), ctx, &impl).ok());
  EXPECT_EQ(impl, "cpu");
}

// FLOPs count valid (query, key) pairs with bottom-right alignment.
TEST(MlaPrefill, CountsValidPairs) {
  auto rng = testing::MakeRng();
  PrefillCase c;
  c.heads = 4;
  c.heads_kv = 2;
  c.lens = {{3, 5}, {4, 2}};  // causal pairs: (3+4+5) + (0+0+1+2) = 15
  PrefillTensors t(c, rng);
  WorkCount w = Count(t.params());
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 4 * (192 + 128) * 15);
  EXPECT_DOUBLE_EQ(w.bytes, 2.0 * 7 * 4 * 192 + 2.0 * 7 * 2 * (192 + 128) + 2.0 * 7 * 4 * 128 +
                                4.0 * 7 * 4 + 8.0 * 3);
  Params p = t.params();
  p.causal = false;  // all pairs: 15 + 8 = 23
  EXPECT_DOUBLE_EQ(Count(p).flops, 2.0 * 4 * (192 + 128) * 23);
}

}  // namespace
}  // namespace attnd::kernels::mla_prefill
