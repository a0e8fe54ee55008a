// Encoding a kernels Params struct into its request and applying replies (client/op_codec.h),
// without a daemon: the replies are built by hand as the server builds them.
#include "client/op_codec.h"

#include <cstring>

#include "gtest/gtest.h"

namespace attnd::client {
namespace {

using kernels::DType;

struct SparseMlaFixture {
  SparseMlaFixture() {
    q = HostArray::Dense(DType::kBF16, {2, 8, 576});
    kv = HostArray::Dense(DType::kBF16, {16, 576});
    indices = HostArray::Dense(DType::kI32, {2, 4});
    out = HostArray::Dense(DType::kBF16, {2, 8, 512});
    std::memset(q.data(), 1, q.span_bytes());
    std::memset(kv.data(), 2, kv.span_bytes());
    std::memset(indices.data(), 0, indices.span_bytes());
    std::memset(out.data(), 0, out.span_bytes());
    p.q = q.view();
    p.kv = kv.view();
    p.indices = indices.view();
    p.sm_scale = 0.125f;
    p.out = out.view();  // lse left absent
  }
  HostArray q, kv, indices, out;
  kernels::sparse_mla::Params p;
};

TEST(OpCodecTest, InputsInARegionTravelAsSlicesOthersInline) {
  SparseMlaFixture f;
  RegionTable table;
  table.Add("inputs", f.q.data(), f.q.span_bytes());
  v1::SparseMlaRequest r;
  ASSERT_TRUE(BuildRequest(f.p, &table, /*inline_only=*/false, &r).ok());
  EXPECT_FLOAT_EQ(r.sm_scale(), 0.125f);
  ASSERT_TRUE(r.q().has_region());
  EXPECT_EQ(r.q().region().region(), "inputs");
  EXPECT_EQ(r.q().region().offset(), 0u);
  EXPECT_EQ(r.q().shape_size(), 3);
  ASSERT_TRUE(r.kv().has_inline_data());
  EXPECT_EQ(r.kv().inline_data().size(), f.kv.span_bytes());
  EXPECT_EQ(r.indices().inline_data().size(), f.indices.span_bytes());
  EXPECT_FALSE(r.has_indptr());  // absent optional inputs are not sent
  EXPECT_FALSE(r.has_topk_length());
  // An output with a host buffer outside any region: a placement without data (inline reply).
  ASSERT_TRUE(r.has_out());
  EXPECT_EQ(r.out().data_case(), v1::Tensor::DATA_NOT_SET);
  EXPECT_EQ(r.out().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(r.out().shape(2), 512);
  EXPECT_FALSE(r.has_lse());  // absent: the server derives it

  v1::SparseMlaRequest all_inline;
  ASSERT_TRUE(BuildRequest(f.p, &table, /*inline_only=*/true, &all_inline).ok());
  EXPECT_TRUE(all_inline.q().has_inline_data());
}

// Every attention request names the precision its params ask for (FAST by default).
TEST(OpCodecTest, AttentionRequestsCarryThePrecision) {
  SparseMlaFixture f;
  v1::SparseMlaRequest fast;
  ASSERT_TRUE(BuildRequest(f.p, nullptr, /*inline_only=*/true, &fast).ok());
  EXPECT_EQ(fast.precision(), v1::PRECISION_FAST);
  f.p.precision = kernels::Precision::kHigh;
  v1::SparseMlaRequest high;
  ASSERT_TRUE(BuildRequest(f.p, nullptr, /*inline_only=*/true, &high).ok());
  EXPECT_EQ(high.precision(), v1::PRECISION_HIGH);

  kernels::mla_decode::Params decode;
  decode.precision = kernels::Precision::kHigh;
  v1::MlaDecodeRequest decode_req;
  OpTraits<kernels::mla_decode::Params>::SetScalars(decode, &decode_req);
  EXPECT_EQ(decode_req.precision(), v1::PRECISION_HIGH);
  kernels::mla_prefill::Params prefill;
  prefill.precision = kernels::Precision::kHigh;
  v1::MlaPrefillRequest prefill_req;
  OpTraits<kernels::mla_prefill::Params>::SetScalars(prefill, &prefill_req);
  EXPECT_EQ(prefill_req.precision(), v1::PRECISION_HIGH);
  kernels::dsa::Params dsa;
  dsa.precision = kernels::Precision::kHigh;
  v1::DsaAttentionRequest dsa_req;
  OpTraits<kernels::dsa::Params>::SetScalars(dsa, &dsa_req);
  EXPECT_EQ(dsa_req.precision(), v1::PRECISION_HIGH);
}

// indexer_logits requests name their precision too: HIGH by default, FAST when asked for.
TEST(OpCodecTest, IndexerLogitsRequestsCarryThePrecision) {
  kernels::indexer_logits::Params p;
  v1::IndexerLogitsRequest high;
  OpTraits<kernels::indexer_logits::Params>::SetScalars(p, &high);
  EXPECT_EQ(high.precision(), v1::PRECISION_HIGH);
  p.precision = kernels::Precision::kFast;
  v1::IndexerLogitsRequest fast;
  OpTraits<kernels::indexer_logits::Params>::SetScalars(p, &fast);
  EXPECT_EQ(fast.precision(), v1::PRECISION_FAST);
}

// indexer_logits_paged's precision and dsa_attention's index_precision travel like
// indexer_logits' precision: HIGH by default, FAST when asked for, through the wire format;
// dsa_attention's precision (of out) stays apart from its index_precision.
TEST(OpCodecTest, IndexerPrecisionsRoundTrip) {
  kernels::indexer_logits_paged::Params paged;
  for (const kernels::Precision precision :
       {kernels::Precision::kHigh, kernels::Precision::kFast}) {
    paged.precision = precision;
    v1::IndexerLogitsPagedRequest sent, got;
    OpTraits<kernels::indexer_logits_paged::Params>::SetScalars(paged, &sent);
    ASSERT_TRUE(got.ParseFromString(sent.SerializeAsString()));
    EXPECT_EQ(got.precision(), PrecisionField(precision));
  }
  v1::IndexerLogitsPagedRequest paged_default;
  OpTraits<kernels::indexer_logits_paged::Params>::SetScalars(
      kernels::indexer_logits_paged::Params{}, &paged_default);
  EXPECT_EQ(paged_default.precision(), v1::PRECISION_HIGH);

  kernels::dsa::Params dsa;
  v1::DsaAttentionRequest dsa_default;
  OpTraits<kernels::dsa::Params>::SetScalars(dsa, &dsa_default);
  EXPECT_EQ(dsa_default.index_precision(), v1::PRECISION_HIGH);
  EXPECT_EQ(dsa_default.precision(), v1::PRECISION_FAST);
  dsa.index_precision = kernels::Precision::kFast;
  dsa.precision = kernels::Precision::kHigh;
  v1::DsaAttentionRequest sent, got;
  OpTraits<kernels::dsa::Params>::SetScalars(dsa, &sent);
  ASSERT_TRUE(got.ParseFromString(sent.SerializeAsString()));
  EXPECT_EQ(got.index_precision(), v1::PRECISION_FAST);
  EXPECT_EQ(got.precision(), v1::PRECISION_HIGH);
}

TEST(OpCodecTest, OutputsInARegionArePlacedThere) {
  SparseMlaFixture f;
  RegionTable table;
  std::vector<char> region(f.out.span_bytes() + 128);
  table.Add("outs", region.data(), region.size());
  f.p.out.data = region.data() + 64;
  v1::SparseMlaRequest r;
  ASSERT_TRUE(BuildRequest(f.p, &table, false, &r).ok());
  ASSERT_TRUE(r.out().has_region());
  EXPECT_EQ(r.out().region().region(), "outs");
  EXPECT_EQ(r.out().region().offset(), 64u);
}

TEST(OpCodecTest, ApplyReplyCopiesIntoBuffersAndReturnsTheRest) {
  SparseMlaFixture f;
  v1::SparseMlaResponse reply;
  HostArray out = HostArray::Dense(DType::kBF16, {2, 8, 512});
  std::memset(out.data(), 0x3f, out.span_bytes());
  ASSERT_TRUE(EncodeInline(out.view(), "out", reply.mutable_out()).ok());
  HostArray lse = HostArray::Dense(DType::kF32, {2, 8});
  for (int i = 0; i < 16; ++i) static_cast<float*>(lse.data())[i] = 0.5f * i;
  ASSERT_TRUE(EncodeInline(lse.view(), "lse", reply.mutable_lse()).ok());
  reply.mutable_stats()->set_compute_seconds(0.25);
  reply.mutable_stats()->set_copied_bytes_out(123);

  CallResult result;
  ASSERT_TRUE(ApplyReply(f.p, reply, &result).ok());
  EXPECT_EQ(std::memcmp(f.out.data(), out.data(), out.span_bytes()), 0);
  const HostArray* got_lse = result.Returned("lse");
  ASSERT_NE(got_lse, nullptr);
  EXPECT_FLOAT_EQ(static_cast<const float*>(got_lse->data())[15], 7.5f);
  EXPECT_EQ(result.Returned("out"), nullptr);  // it went into p.out
  EXPECT_DOUBLE_EQ(result.stats.compute_seconds(), 0.25);
  EXPECT_EQ(result.stats.copied_bytes_out(), 123u);
}

TEST(OpCodecTest, ApplyReplyLeavesRegionOutputsAlone) {
  SparseMlaFixture f;
  v1::SparseMlaResponse reply;
  EncodeRegion(f.out.view(), "outs", 0, reply.mutable_out());
  std::memset(f.out.data(), 0x11, f.out.span_bytes());
  CallResult result;
  ASSERT_TRUE(ApplyReply(f.p, reply, &result).ok());
  EXPECT_EQ(static_cast<const uint8_t*>(f.out.data())[7], 0x11);
  EXPECT_TRUE(result.returned.empty());
}

TEST(OpCodecTest, ApplyReplyRefusesBrokenReplies) {
  SparseMlaFixture f;
  v1::SparseMlaResponse missing;  // no `out` although p.out is a host buffer
  CallResult result;
  EXPECT_EQ(ApplyReply(f.p, missing, &result).code(), absl::StatusCode::kDataLoss);

  v1::SparseMlaResponse wrong_shape;
  HostArray small = HostArray::Dense(DType::kBF16, {1, 8, 512});
  ASSERT_TRUE(EncodeInline(small.view(), "out", wrong_shape.mutable_out()).ok());
  EXPECT_EQ(ApplyReply(f.p, wrong_shape, &result).code(), absl::StatusCode::kInvalidArgument);

  v1::SparseMlaResponse no_data;
  SetLayout(f.out.view(), no_data.mutable_out());
  EXPECT_EQ(ApplyReply(f.p, no_data, &result).code(), absl::StatusCode::kDataLoss);
}

TEST(OpCodecTest, OptionalOutputsAreRequestedOnlyWhenPresent) {
  HostArray logits = HostArray::Dense(DType::kF32, {4, 100});
  HostArray lengths = HostArray::Dense(DType::kI32, {4});
  kernels::topk::Params p;
  p.logits = logits.view();
  p.lengths = lengths.view();
  p.k = 8;
  v1::TopKRequest r;
  ASSERT_TRUE(BuildRequest(p, nullptr, false, &r).ok());
  EXPECT_EQ(r.k(), 8);
  EXPECT_EQ(r.rows_per_request(), 1);
  EXPECT_FALSE(r.has_indices());
  EXPECT_FALSE(r.has_values());
  EXPECT_FALSE(r.has_ks());
  // Present with a null data pointer: requested, returned in CallResult::returned.
  p.values = kernels::MakeTensor(nullptr, DType::kF32, {4, 8});
  v1::TopKRequest with_values;
  ASSERT_TRUE(BuildRequest(p, nullptr, false, &with_values).ok());
  ASSERT_TRUE(with_values.has_values());
  EXPECT_EQ(with_values.values().data_case(), v1::Tensor::DATA_NOT_SET);

  v1::TopKResponse reply;
  HostArray idx = HostArray::Dense(DType::kI32, {4, 8});
  HostArray val = HostArray::Dense(DType::kF32, {4, 8});
  ASSERT_TRUE(EncodeInline(idx.view(), "indices", reply.mutable_indices()).ok());
  ASSERT_TRUE(EncodeInline(val.view(), "values", reply.mutable_values()).ok());
  CallResult result;
  ASSERT_TRUE(ApplyReply(p, reply, &result).ok());
  EXPECT_NE(result.Returned("indices"), nullptr);
  EXPECT_NE(result.Returned("values"), nullptr);
}

// Every tensor of every op's Params must name a Tensor field of its request (a typo would make
// BuildRequest fail with INTERNAL).
template <class P>
void ExpectEveryTensorHasAField() {
  P p;
  std::vector<HostArray> storage;
  p.ForEachTensor([&](const char*, kernels::Tensor& t, kernels::Role) {
    storage.push_back(HostArray::Dense(DType::kF32, {2}));
    t = storage.back().view();
  });
  typename OpTraits<P>::Request r;
  absl::Status s = BuildRequest(p, nullptr, false, &r);
  EXPECT_TRUE(s.ok()) << OpTraits<P>::kName << ": " << s;
  if (!s.ok()) return;
  typename OpTraits<P>::Response reply;
  p.ForEachTensor([&](const char* name, kernels::Tensor& t, kernels::Role role) {
    if (role == kernels::Role::kOutput) {
      ASSERT_TRUE(EncodeInline(t, name,
                               static_cast<v1::Tensor*>(reply.GetReflection()->MutableMessage(
                                   &reply, reply.GetDescriptor()->FindFieldByName(name))))
                      .ok());
    }
  });
  CallResult result;
  s = ApplyReply(p, reply, &result);
  EXPECT_TRUE(s.ok()) << OpTraits<P>::kName << ": " << s;
}

// TopK's KV-slot mapping by per-row request ids, with a block stride: the tensor travels as
// req_id_per_row and the stride as block_stride (docs/CONTRACTS.md "topk").
TEST(OpCodecTest, TopKRequestMapFields) {
  HostArray logits = HostArray::Dense(DType::kF32, {3, 100});
  HostArray lengths = HostArray::Dense(DType::kI32, {3});
  HostArray table = HostArray::Dense(DType::kI32, {2, 4});
  HostArray ids = HostArray::Dense(DType::kI32, {3});
  kernels::topk::Params p;
  p.logits = logits.view();
  p.lengths = lengths.view();
  p.k = 8;
  p.block_table = table.view();
  p.page_size = 32;
  p.block_stride = 64;
  p.req_id_per_row = ids.view();
  v1::TopKRequest r;
  ASSERT_TRUE(BuildRequest(p, nullptr, false, &r).ok());
  EXPECT_EQ(r.block_stride(), 64);
  EXPECT_EQ(r.page_size(), 32);
  ASSERT_TRUE(r.has_req_id_per_row());
  EXPECT_EQ(r.req_id_per_row().shape_size(), 1);
  EXPECT_EQ(r.req_id_per_row().shape(0), 3);
  EXPECT_FALSE(r.has_cu_seqlens_q());
}

TEST(OpCodecTest, EveryOpsTensorsMatchItsProtoFields) {
  ExpectEveryTensorHasAField<kernels::indexer_logits::Params>();
  ExpectEveryTensorHasAField<kernels::indexer_logits_paged::Params>();
  ExpectEveryTensorHasAField<kernels::topk::Params>();
  ExpectEveryTensorHasAField<kernels::sparse_mla::Params>();
  ExpectEveryTensorHasAField<kernels::mla_decode::Params>();
  ExpectEveryTensorHasAField<kernels::mla_prefill::Params>();
  ExpectEveryTensorHasAField<kernels::dsa::Params>();
}

}  // namespace
}  // namespace attnd::client
