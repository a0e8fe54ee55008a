// mla_prefill::Validate and the CPU implementation's cu_seqlens check: one row per malformed
// input, each rejected with INVALID_ARGUMENT and a message that starts with the offending
// tensor's (or scalar's) name.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/mla_prefill/mla_prefill.h"
#include "tests/harness/harness.h"
#include "tests/kernels/mla_prefill/prefill_case.h"

namespace attnd::kernels::mla_prefill {
namespace {

struct Mutation {
  const char* what;
  const char* name;  // the tensor or scalar the message must start with
  std::function<void(Params&)> apply;
};

void SetDim(Tensor& t, int d, int64_t v) { t.shape[d] = v; }

void ExpectRejected(const absl::Status& s, const Mutation& m) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.what << ": " << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), std::string(m.name) + ":") ||
              absl::StartsWith(s.message(), std::string(m.name) + " "))
      << m.what << ": message \"" << s.message() << "\" does not name " << m.name;
}

const std::vector<Mutation>& ShapeMutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"q missing", "q", [](Params& p) { p.q = Tensor(); }},
      {"q dtype", "q", [](Params& p) { p.q.dtype = DType::kF32; }},
      {"q rank", "q", [](Params& p) { p.q.rank = 4; }},
      {"q negative tokens", "q", [](Params& p) { SetDim(p.q, 0, -1); }},
      {"q zero heads", "q", [](Params& p) { SetDim(p.q, 1, 0); }},
      {"q d_qk 0", "q", [](Params& p) { SetDim(p.q, 2, 0); }},
      {"q d_qk 257", "q", [](Params& p) { SetDim(p.q, 2, 257); }},
      {"q last dim strided", "q", [](Params& p) { p.q.strides[2] = 2; }},
      {"q token stride overlaps", "q", [](Params& p) { p.q.strides[0] = 192; }},
      {"q null data", "q", [](Params& p) { p.q.data = nullptr; }},
      {"k missing", "k", [](Params& p) { p.k = Tensor(); }},
      {"k dtype", "k", [](Params& p) { p.k.dtype = DType::kFp8E4M3; }},
      {"k rank", "k", [](Params& p) { p.k.rank = 2; }},
      {"k d_qk differs from q", "k", [](Params& p) { SetDim(p.k, 2, 128); }},
      {"k zero kv heads", "k", [](Params& p) { SetDim(p.k, 1, 0); }},
      {"k kv heads not dividing", "k", [](Params& p) { SetDim(p.k, 1, 3); }},
      {"k negative stride", "k", [](Params& p) { p.k.strides[1] = -1; }},
      {"v missing", "v", [](Params& p) { p.v = Tensor(); }},
      {"v dtype", "v", [](Params& p) { p.v.dtype = DType::kF32; }},
      {"v rank", "v", [](Params& p) { p.v.rank = 2; }},
      {"v tokens differ from k", "v", [](Params& p) { SetDim(p.v, 0, 5); }},
      {"v kv heads differ from k", "v", [](Params& p) { SetDim(p.v, 1, 1); }},
      {"v d_v 0", "v", [](Params& p) { SetDim(p.v, 2, 0); }},
      {"v d_v 300", "v", [](Params& p) { SetDim(p.v, 2, 300); }},
      {"cu_seqlens_q missing", "cu_seqlens_q", [](Params& p) { p.cu_seqlens_q = Tensor(); }},
      {"cu_seqlens_q dtype", "cu_seqlens_q", [](Params& p) { p.cu_seqlens_q.dtype = DType::kF32; }},
      {"cu_seqlens_q rank", "cu_seqlens_q", [](Params& p) { p.cu_seqlens_q.rank = 2; }},
      {"cu_seqlens_q empty", "cu_seqlens_q", [](Params& p) { SetDim(p.cu_seqlens_q, 0, 0); }},
      {"cu_seqlens_k missing", "cu_seqlens_k", [](Params& p) { p.cu_seqlens_k = Tensor(); }},
      {"cu_seqlens_k dtype", "cu_seqlens_k",
       [](Params& p) { p.cu_seqlens_k.dtype = DType::kBF16; }},
      {"cu_seqlens_k batch differs", "cu_seqlens_k",
       [](Params& p) { SetDim(p.cu_seqlens_k, 0, 2); }},
      {"out missing", "out", [](Params& p) { p.out = Tensor(); }},
      {"out dtype", "out", [](Params& p) { p.out.dtype = DType::kF32; }},
      {"out rank", "out", [](Params& p) { p.out.rank = 2; }},
      {"out tokens", "out", [](Params& p) { SetDim(p.out, 0, 1); }},
      {"out heads", "out", [](Params& p) { SetDim(p.out, 1, 3); }},
      {"out width d_qk", "out", [](Params& p) { SetDim(p.out, 2, 192); }},
      {"lse dtype", "lse", [](Params& p) { p.lse.dtype = DType::kBF16; }},
      {"lse rank", "lse", [](Params& p) { p.lse.rank = 3; }},
      {"lse heads", "lse", [](Params& p) { SetDim(p.lse, 1, 5); }},
      {"lse last dim strided", "lse", [](Params& p) { p.lse.strides[1] = 2; }},
      {"sm_scale NaN", "sm_scale", [](Params& p) { p.sm_scale = std::nanf(""); }},
      {"sm_scale inf", "sm_scale",
       [](Params& p) { p.sm_scale = std::numeric_limits<float>::infinity(); }},
      {"sm_scale zero", "sm_scale", [](Params& p) { p.sm_scale = 0; }},
      {"sm_scale negative", "sm_scale", [](Params& p) { p.sm_scale = -1; }},
  };
  return *rows;
}

PrefillCase BaseCase() {
  PrefillCase c;
  c.heads = 4;
  c.heads_kv = 2;
  c.lens = {{20, 30}, {10, 5}, {7, 7}};  // cu_q {0,20,30,37}, cu_k {0,30,35,42}
  return c;
}

TEST(MlaPrefillValidate, BaseCaseIsValid) {
  auto rng = testing::MakeRng();
  PrefillTensors t(BaseCase(), rng);
  EXPECT_TRUE(Validate(t.params()).ok()) << Validate(t.params());
  EXPECT_TRUE(CheckCuSeqlens(t.params()).ok()) << CheckCuSeqlens(t.params());
}

TEST(MlaPrefillValidate, EachMutationIsRejectedNamingTheTensor) {
  auto rng = testing::MakeRng();
  PrefillTensors t(BaseCase(), rng);
  for (const Mutation& m : ShapeMutations()) {
    Params p = t.params();
    m.apply(p);
    ExpectRejected(Validate(p), m);
  }
}

// cu_seqlens are data: Validate cannot see them, the CPU implementation rejects them before it
// writes anything (outputs stay poisoned).
struct CuMutation {
  const char* what;
  const char* name;
  int index;  // entry of cu_seqlens_q (name "cu_seqlens_q") or cu_seqlens_k to overwrite
  int32_t value;
};

TEST(MlaPrefillValidate, MalformedCuSeqlensAreRejectedByRun) {
  const std::vector<CuMutation> rows = {
      {"q does not start at 0", "cu_seqlens_q", 0, 1},
      {"q negative start", "cu_seqlens_q", 0, -1},
      {"q decreasing", "cu_seqlens_q", 2, 19},
      {"q last past total_q", "cu_seqlens_q", 3, 38},
      {"q huge last", "cu_seqlens_q", 3, 2147483647},
      {"k does not start at 0", "cu_seqlens_k", 0, 3},
      {"k decreasing", "cu_seqlens_k", 1, -5},
      {"k last past total_k", "cu_seqlens_k", 3, 43},
  };
  auto rng = testing::MakeRng();
  for (const CuMutation& m : rows) {
    PrefillTensors t(BaseCase(), rng);
    testing::HostTensor& cu =
        std::string(m.name) == "cu_seqlens_q" ? t.cu_seqlens_q() : t.cu_seqlens_k();
    cu.data<int32_t>()[m.index] = m.value;
    EXPECT_TRUE(Validate(t.params()).ok()) << m.what;  // shapes are fine
    ExpectRejected(CheckCuSeqlens(t.params()), {m.what, m.name, nullptr});
    ExecContext ctx;
    ctx.pool = testing::TestPool();
    for (testing::HostTensor* out : t.outputs()) testing::PoisonNaN(*out);
    ExpectRejected(mla_prefill::Run(t.params(), ctx), {m.what, m.name, nullptr});
    const std::vector<double> out = testing::ToDoubles(t.out());
    for (double x : out) ASSERT_TRUE(std::isnan(x)) << m.what << ": output written";
  }
}

// Edges the contract allows: no tokens at all, B = 0, one head, d 1 and 256, lse absent.
TEST(MlaPrefillValidate, EdgeShapesAreAccepted) {
  auto rng = testing::MakeRng();
  for (int64_t d : {1, 256}) {
    PrefillCase c = BaseCase();
    c.d_qk = c.d_v = d;
    c.heads = c.heads_kv = 1;
    c.with_lse = false;
    PrefillTensors t(c, rng);
    EXPECT_TRUE(Validate(t.params()).ok()) << Validate(t.params());
  }
  PrefillCase c;
  c.lens = {};
  PrefillTensors t(c, rng);
  EXPECT_TRUE(Validate(t.params()).ok()) << Validate(t.params());
  ExecContext ctx;
  EXPECT_TRUE(mla_prefill::Run(t.params(), ctx).ok());
}

}  // namespace
}  // namespace attnd::kernels::mla_prefill
