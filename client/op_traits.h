// Per-operator facts the client needs to send a kernels Params struct as an RPC: the request
// and response messages, the scalar fields, where the call sits in a Session message, and the
// unary stub method. Tensor fields are matched by name (Params::ForEachTensor == proto fields).
//   using T = OpTraits<kernels::sparse_mla::Params>;  T::Request req;  T::SetScalars(p, &req);
#pragma once

#include "attnd/v1/attention.grpc.pb.h"
#include "kernels/dsa/params.h"
#include "kernels/indexer_logits/params.h"
#include "kernels/indexer_logits_paged/params.h"
#include "kernels/mla_decode/params.h"
#include "kernels/mla_prefill/params.h"
#include "kernels/sparse_mla/params.h"
#include "kernels/topk/params.h"

namespace attnd::client {

template <class Params>
struct OpTraits;

// The `precision` field (attention ops, the indexer ops; dsa_attention's index_precision too):
// every request names the one its params ask for (so the server's default for UNSPECIFIED never
// applies to a C++ client's call).
inline v1::Precision PrecisionField(kernels::Precision p) {
  return p == kernels::Precision::kHigh ? v1::PRECISION_HIGH : v1::PRECISION_FAST;
}

#define ATTND_CLIENT_OP_COMMON(ParamsT, Name, Rpc, field)                                          \
  using Params = ParamsT;                                                                          \
  using Request = v1::Rpc##Request;                                                                \
  using Response = v1::Rpc##Response;                                                              \
  static constexpr const char* kName = Name;                                                       \
  static constexpr const char* kRpc = #Rpc;                                                        \
  static Request* InSession(v1::SessionRequest* s) { return s->mutable_##field(); }                \
  static const Response* FromSession(const v1::SessionResponse& s) {                               \
    return s.has_##field() ? &s.field() : nullptr;                                                 \
  }                                                                                                \
  static grpc::Status Unary(v1::Attention::Stub* stub, grpc::ClientContext* ctx, const Request& r, \
                            Response* out) {                                                       \
    return stub->Rpc(ctx, r, out);                                                                 \
  }                                                                                                \
  static std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> PrepareAsync(                  \
      v1::Attention::Stub* stub, grpc::ClientContext* ctx, const Request& r,                       \
      grpc::CompletionQueue* cq) {                                                                 \
    return stub->PrepareAsync##Rpc(ctx, r, cq);                                                    \
  }

// A cache tensor's named layout (docs/CONTRACTS.md "Named layouts"): the params' value as the
// proto's (numbered alike; kUnspecified leaves the field unset).
inline v1::CacheLayout CacheLayoutField(kernels::CacheLayout l) {
  return static_cast<v1::CacheLayout>(l);
}

template <>
struct OpTraits<kernels::indexer_logits::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::indexer_logits::Params, "indexer_logits", IndexerLogits,
                         indexer_logits)
  static void SetScalars(const Params& p, Request* r) {
    r->set_clean_logits(p.clean_logits);
    r->set_precision(PrecisionField(p.precision));
  }
};

template <>
struct OpTraits<kernels::indexer_logits_paged::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::indexer_logits_paged::Params, "indexer_logits_paged",
                         IndexerLogitsPaged, indexer_logits_paged)
  static void SetScalars(const Params& p, Request* r) {
    r->set_block_size(p.block_size);
    r->set_kv_cache_layout(CacheLayoutField(p.kv_cache_layout));
    r->set_precision(PrecisionField(p.precision));
    if (p.logits.present()) r->set_max_context_len(p.logits.dim(1));
  }
};

template <>
struct OpTraits<kernels::topk::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::topk::Params, "topk", TopK, top_k)
  static void SetScalars(const Params& p, Request* r) {
    r->set_k(p.k);
    r->set_page_size(p.page_size);
    r->set_rows_per_request(p.rows_per_request);
    r->set_block_stride(p.block_stride);
    if (p.index_base == kernels::topk::IndexBase::kRowStart) {
      r->set_index_base(v1::TopKRequest::INDEX_BASE_ROW_START);
    }
  }
};

template <>
struct OpTraits<kernels::sparse_mla::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::sparse_mla::Params, "sparse_mla", SparseMla, sparse_mla)
  static void SetScalars(const Params& p, Request* r) {
    r->set_sm_scale(p.sm_scale);
    r->set_precision(PrecisionField(p.precision));
    r->set_batch_invariant(p.batch_invariant);
    r->set_kv_layout(CacheLayoutField(p.kv_layout));
    r->set_kv_scale(p.kv_scale);
  }
};

template <>
struct OpTraits<kernels::mla_decode::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::mla_decode::Params, "mla_decode", MlaDecode, mla_decode)
  static void SetScalars(const Params& p, Request* r) {
    r->set_sm_scale(p.sm_scale);
    r->set_causal(p.causal);
    r->set_precision(PrecisionField(p.precision));
    r->set_batch_invariant(p.batch_invariant);
    r->set_kv_cache_layout(CacheLayoutField(p.kv_cache_layout));
    r->set_kv_scale(p.kv_scale);
  }
};

template <>
struct OpTraits<kernels::mla_prefill::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::mla_prefill::Params, "mla_prefill", MlaPrefill, mla_prefill)
  static void SetScalars(const Params& p, Request* r) {
    r->set_sm_scale(p.sm_scale);
    r->set_causal(p.causal);
    r->set_precision(PrecisionField(p.precision));
  }
};

template <>
struct OpTraits<kernels::dsa::Params> {
  ATTND_CLIENT_OP_COMMON(kernels::dsa::Params, "dsa_attention", DsaAttention, dsa_attention)
  static void SetScalars(const Params& p, Request* r) {
    r->set_topk(p.topk);
    r->set_sm_scale(p.sm_scale);
    r->set_precision(PrecisionField(p.precision));
    r->set_index_precision(PrecisionField(p.index_precision));
    r->set_batch_invariant(p.batch_invariant);
    r->set_kv_layout(CacheLayoutField(p.kv_layout));
    r->set_kv_scale(p.kv_scale);
    if (p.paged()) {  // the paged form's scalars (docs/CONTRACTS.md "dsa_attention")
      r->set_index_block_size(p.index_block_size);
      r->set_kv_block_size(p.kv_block_size);
      r->set_kv_block_stride(p.kv_block_stride);
      r->set_index_cache_layout(CacheLayoutField(p.index_cache_layout));
    }
  }
};

#undef ATTND_CLIENT_OP_COMMON

// ATTND_CLIENT_FOR_EACH_PARAMS(X) calls X(ParamsT) for every op's Params: one list for the
// client's explicit template instantiations (client.cc, session.cc, stream_ordered.cc).
#define ATTND_CLIENT_FOR_EACH_PARAMS(X)    \
  X(kernels::indexer_logits::Params)       \
  X(kernels::indexer_logits_paged::Params) \
  X(kernels::topk::Params)                 \
  X(kernels::sparse_mla::Params)           \
  X(kernels::mla_decode::Params)           \
  X(kernels::mla_prefill::Params)          \
  X(kernels::dsa::Params)

}  // namespace attnd::client
