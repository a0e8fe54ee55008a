#include "kernels/dsa/dsa.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/common/status_details.h"
#include "kernels/dsa/cpu.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "kernels/topk/topk.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/dsa/gpu.h"
#endif

namespace attnd::kernels::dsa {
namespace {

// Rows [begin, begin + count) of t (rank >= 1); absent tensors stay absent.
Tensor Rows(const Tensor& t, int64_t begin, int64_t count) {
  if (!t.present()) return t;
  Tensor r = t;
  if (count > 0) {
    r.data = static_cast<char*>(t.data) + begin * t.strides[0] * DTypeSize(t.dtype);
  }
  r.shape[0] = count;
  return r;
}

// A step's message names its own tensors; say them as this op's caller knows them.
absl::Status Rename(absl::Status s,
                    std::initializer_list<std::pair<const char*, const char*>> names) {
  if (s.ok()) return s;
  std::string msg(s.message());
  for (const auto& [from, to] : names) {
    const std::string prefix = absl::StrCat(from, ":");
    if (msg.rfind(prefix, 0) == 0) {
      msg = absl::StrCat(to, ":", msg.substr(prefix.size()));
      break;
    }
  }
  absl::Status out = WithMessage(s, msg);  // the payloads too: the bad field, renamed
  for (const auto& [from, to] : names) RenameBadField(&out, from, to);
  return out;
}

// Validation stands in for internally allocated scratch with a view that is never read.
alignas(64) char placeholder[64];

// The paged form: each step's constraints under this op's names, plus what only the fused call
// has (both forms' tensors mixed, the shared token count T = B·next_n).
absl::Status ValidatePaged(const Params& p) {
  const std::pair<const char*, const Tensor*> gathered[] = {
      {"index_k", &p.index_k}, {"index_k_scale", &p.index_k_scale}, {"ks", &p.ks}, {"ke", &p.ke}};
  for (const auto& [name, t] : gathered) {
    if (t->present()) {
      return InvalidField(name, absl::StrCat(name,
                                             ": given with index_cache; the paged form reads the "
                                             "keys from index_cache and each token's window from "
                                             "context_lens (leave it unset)"));
    }
  }
  const std::pair<const char*, const Tensor*> required[] = {
      {"index_block_table", &p.index_block_table}, {"context_lens", &p.context_lens}};
  for (const auto& [name, t] : required) {
    if (!t->present()) {
      return InvalidField(name, absl::StrCat(name,
                                             ": missing; the paged form (index_cache given) "
                                             "needs it"));
    }
  }
  ATTND_RETURN_IF_ERROR(CheckCacheLayout("index_cache_layout", "index_cache", p.index_cache_layout,
                                         p.index_cache, indexer_logits_paged::kKvCacheLayouts));
  ATTND_RETURN_IF_ERROR(
      CheckCacheLayout("kv_layout", "kv", p.kv_layout, p.kv, sparse_mla::kKvLayouts));
  ATTND_RETURN_IF_ERROR(
      CheckTensor(p.index_q, "index_q", DType::kFp8E4M3, {kAnyDim, kAnyDim, kAnyDim, kAnyDim}));
  const int64_t batch = p.index_q.dim(0), next_n = p.index_q.dim(1);
  if (next_n < 1) {
    return InvalidField(TensorDimField("index_q", 1),
                        absl::StrCat("index_q: dim 1 (next_n) is ", next_n, ", want >= 1"));
  }
  int64_t t;
  if (MulOverflow(batch, next_n, &t)) {
    return InvalidField("index_q", "index_q: B · next_n overflows int64");
  }
  if (p.index_block_size < 1) {
    return InvalidField("index_block_size",
                        absl::StrCat("index_block_size: is ", p.index_block_size, ", want >= 1"));
  }
  if (p.kv_block_size < 0) {
    return InvalidField("kv_block_size", absl::StrCat("kv_block_size: is ", p.kv_block_size,
                                                      ", want >= 1 (or 0: index_block_size)"));
  }
  if (p.kv_block_stride < 0 || (p.kv_block_stride != 0 && p.kv_block_stride < KvBlockSize(p))) {
    return InvalidField("kv_block_stride", absl::StrCat("kv_block_stride: is ", p.kv_block_stride,
                                                        ", want >= ", KvBlockSize(p),
                                                        " (kv_block_size) or 0 (= kv_block_size)"));
  }
  ATTND_RETURN_IF_ERROR(
      CheckTensor(p.index_block_table, "index_block_table", DType::kI32, {batch, kAnyDim}));
  ATTND_RETURN_IF_ERROR(
      CheckOptionalTensor(p.kv_block_table, "kv_block_table", DType::kI32, {batch, kAnyDim}));
  // Every tensor the steps see in token slices (dim 0 = T): the slices would hide a wrong T.
  ATTND_RETURN_IF_ERROR(CheckTensor(p.index_weights, "index_weights", DType::kF32, {t, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kBF16, {t, kAnyDim, kAnyDim}));
  // bf16, sparse_mla's FP8 cache or its per-tensor FP8 rows (u8 [S, d_qk], with kv_scale);
  // sparse_mla::Validate below checks the width and kv_scale.
  const bool kv_u8 = p.kv.dtype == DType::kU8;
  ATTND_RETURN_IF_ERROR(
      CheckTensor(p.kv, "kv", kv_u8 ? DType::kU8 : DType::kBF16, {kAnyDim, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.out, "out", DType::kBF16, {t, kAnyDim, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.lse, "lse", DType::kF32, {t, kAnyDim}));
  if (p.topk < 1 || p.topk > kMaxTopk) {
    return InvalidField("topk", absl::StrCat("topk: is ", p.topk, ", want 1..", kMaxTopk));
  }
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.logits, "logits", DType::kF32, {t, kAnyDim}));
  int64_t n = 0;
  if (p.logits.present()) {
    n = p.logits.dim(1);
  } else if (MulOverflow(p.index_block_table.dim(1), p.index_block_size, &n)) {
    return InvalidField("index_block_table",
                        "index_block_table: max_blocks · index_block_size overflows int64");
  }
  if (n > std::numeric_limits<int32_t>::max()) {
    return InvalidField(p.logits.present() ? TensorDimField("logits", 1) : "index_block_table",
                        absl::StrCat(p.logits.present() ? "logits: dim 1"
                                                        : "index_block_table: max_blocks · "
                                                          "index_block_size",
                                     " is ", n, ", want <= ", std::numeric_limits<int32_t>::max(),
                                     " positions (i32 top-k positions)"));
  }
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.indices, "indices", DType::kI32, {t, p.topk}));
  const Tensor logits =
      p.logits.present() ? p.logits : MakeTensor(placeholder, DType::kF32, {t, n});
  const Tensor indices =
      p.indices.present() ? p.indices : MakeTensor(placeholder, DType::kI32, {t, p.topk});
  const Tensor lengths = MakeTensor(placeholder, DType::kI32, {t});
  ATTND_RETURN_IF_ERROR(Rename(indexer_logits_paged::Validate(PagedIndexerStep(p, 0, t, logits)),
                               {{"q", "index_q"},
                                {"kv_cache_layout", "index_cache_layout"},
                                {"kv_cache", "index_cache"},
                                {"block_table", "index_block_table"},
                                {"block_size", "index_block_size"},
                                {"weights", "index_weights"}}));
  const char* table = p.kv_block_table.present() ? "kv_block_table" : "index_block_table";
  ATTND_RETURN_IF_ERROR(
      Rename(topk::Validate(PagedTopkStep(p, 0, t, logits, lengths, indices)),
             {{"block_table", table},
              {"page_size", p.kv_block_size != 0 ? "kv_block_size" : "index_block_size"},
              {"block_stride", "kv_block_stride"}}));
  return sparse_mla::Validate(SparseMlaStep(p, 0, t, indices));
}

}  // namespace

int64_t TokenRows(const Params& p) {
  return p.paged() ? p.index_q.dim(0) * p.index_q.dim(1) : p.index_q.dim(0);
}

int64_t LogitsColumns(const Params& p) {
  if (!p.paged()) return p.index_k.dim(0);
  if (p.logits.present()) return p.logits.dim(1);
  return p.index_block_table.dim(1) * p.index_block_size;
}

int64_t RequestRows(const Params& p) { return p.paged() ? p.index_q.dim(1) : 1; }

const Tensor& KvBlockTable(const Params& p) {
  return p.kv_block_table.present() ? p.kv_block_table : p.index_block_table;
}

int64_t KvBlockSize(const Params& p) {
  return p.kv_block_size != 0 ? p.kv_block_size : p.index_block_size;
}

indexer_logits_paged::Params PagedIndexerStep(const Params& p, int64_t t0, int64_t count,
                                              const Tensor& logits) {
  const int64_t next_n = std::max<int64_t>(RequestRows(p), 1);
  const int64_t b0 = t0 / next_n, requests = count / next_n;
  indexer_logits_paged::Params ip;
  ip.q = Rows(p.index_q, b0, requests);
  ip.kv_cache = p.index_cache;
  ip.kv_cache_layout = p.index_cache_layout;
  ip.block_size = p.index_block_size;
  ip.block_table = Rows(p.index_block_table, b0, requests);
  ip.context_lens = Rows(p.context_lens, b0, requests);
  ip.weights = Rows(p.index_weights, t0, count);
  ip.precision = p.index_precision;
  ip.logits = logits;
  return ip;
}

topk::Params PagedTopkStep(const Params& p, int64_t t0, int64_t count, const Tensor& logits,
                           const Tensor& lengths, const Tensor& indices) {
  const int64_t next_n = std::max<int64_t>(RequestRows(p), 1);
  topk::Params tp;
  tp.logits = logits;
  tp.lengths = lengths;
  tp.k = p.topk;
  tp.block_table = Rows(KvBlockTable(p), t0 / next_n, count / next_n);
  tp.page_size = KvBlockSize(p);
  tp.block_stride = p.kv_block_stride;
  tp.rows_per_request = next_n;
  tp.indices = indices;
  return tp;
}

absl::Status InStep(const char* step, absl::Status s) {
  if (s.ok()) return s;
  return WithPrefix(s, absl::StrCat(step, ": "));
}

absl::Status RunBlock(const Params& p, int64_t t0, int64_t count, const BlockScratch& scratch,
                      const ExecContext& ctx) {
  if (p.paged()) {
    ATTND_RETURN_IF_ERROR(
        InStep("indexer_logits_paged",
               indexer_logits_paged::Run(PagedIndexerStep(p, t0, count, scratch.logits), ctx)));
    ATTND_RETURN_IF_ERROR(InStep("topk", topk::Run(PagedTopkStep(p, t0, count, scratch.logits,
                                                                 scratch.lengths, scratch.indices),
                                                   ctx)));
  } else {
    ATTND_RETURN_IF_ERROR(InStep(
        "indexer_logits", indexer_logits::Run(IndexerStep(p, t0, count, scratch.logits), ctx)));
    ATTND_RETURN_IF_ERROR(
        InStep("topk", topk::Run(TopkStep(p, t0, count, scratch.logits, scratch.indices), ctx)));
  }
  return InStep("sparse_mla", sparse_mla::Run(SparseMlaStep(p, t0, count, scratch.indices), ctx));
}

indexer_logits::Params IndexerStep(const Params& p, int64_t t0, int64_t count,
                                   const Tensor& logits) {
  indexer_logits::Params ip;
  ip.q = Rows(p.index_q, t0, count);
  ip.k = p.index_k;
  ip.k_scale = p.index_k_scale;
  ip.weights = Rows(p.index_weights, t0, count);
  ip.ks = Rows(p.ks, t0, count);
  ip.ke = Rows(p.ke, t0, count);
  ip.clean_logits = true;
  // The fused op's `precision` is its attention output's; the indexer runs index_precision
  // (HIGH unless FAST is asked for; docs/ACCURACY.md "Indexer logits, FAST").
  ip.precision = p.index_precision;
  ip.logits = logits;
  return ip;
}

topk::Params TopkStep(const Params& p, int64_t t0, int64_t count, const Tensor& logits,
                      const Tensor& indices) {
  topk::Params tp;
  tp.logits = logits;
  tp.ks = Rows(p.ks, t0, count);
  tp.ke = Rows(p.ke, t0, count);
  tp.k = p.topk;
  tp.indices = indices;
  return tp;
}

sparse_mla::Params SparseMlaStep(const Params& p, int64_t t0, int64_t count,
                                 const Tensor& indices) {
  sparse_mla::Params sp;
  sp.q = Rows(p.q, t0, count);
  sp.kv = p.kv;
  sp.kv_scale = p.kv_scale;
  sp.kv_layout = p.kv_layout;
  sp.indices = indices;
  sp.sm_scale = p.sm_scale;
  sp.precision = p.precision;
  sp.batch_invariant = p.batch_invariant;
  sp.out = Rows(p.out, t0, count);
  sp.lse = Rows(p.lse, t0, count);
  return sp;
}

absl::Status Validate(const Params& p) {
  // Both forms' indexer step; named here, as the steps name it `precision` (the output's).
  if (!CheckPrecision(p.index_precision).ok()) {
    return InvalidField("index_precision",
                        absl::StrCat("index_precision: is ", static_cast<int>(p.index_precision),
                                     ", want fast (0) or high (1)"));
  }
  if (p.paged()) return ValidatePaged(p);
  const std::pair<const char*, const Tensor*> paged_only[] = {
      {"index_block_table", &p.index_block_table},
      {"context_lens", &p.context_lens},
      {"kv_block_table", &p.kv_block_table}};
  for (const auto& [name, t] : paged_only) {
    if (t->present()) {
      return InvalidField(name, absl::StrCat(name,
                                             ": given without index_cache; it belongs to "
                                             "the paged form (give index_cache too)"));
    }
  }
  ATTND_RETURN_IF_ERROR(
      CheckCacheLayout("kv_layout", "kv", p.kv_layout, p.kv, sparse_mla::kKvLayouts));
  ATTND_RETURN_IF_ERROR(
      CheckTensor(p.index_q, "index_q", DType::kFp8E4M3, {kAnyDim, kAnyDim, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.index_k, "index_k", DType::kFp8E4M3, {kAnyDim, kAnyDim}));
  const int64_t t = p.index_q.dim(0), n = p.index_k.dim(0);
  if (n > std::numeric_limits<int32_t>::max()) {
    return InvalidField(TensorDimField("index_k", 0),
                        absl::StrCat("index_k: dim 0 is ", n, ", want <= ",
                                     std::numeric_limits<int32_t>::max(), " (i32 indices)"));
  }
  // Every tensor the steps see in token slices (dim 0 = T): the slices would hide a wrong T.
  ATTND_RETURN_IF_ERROR(CheckTensor(p.index_weights, "index_weights", DType::kF32, {t, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.ks, "ks", DType::kI32, {t}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.ke, "ke", DType::kI32, {t}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kBF16, {t, kAnyDim, kAnyDim}));
  // bf16, sparse_mla's FP8 cache (u8 [N, 656]) or its per-tensor FP8 rows (u8 [N, d_qk], with
  // kv_scale); sparse_mla::Validate below checks the width, kv_scale and the rest.
  const bool kv_u8 = p.kv.dtype == DType::kU8;
  ATTND_RETURN_IF_ERROR(CheckTensor(p.kv, "kv", kv_u8 ? DType::kU8 : DType::kBF16, {n, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.out, "out", DType::kBF16, {t, kAnyDim, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.lse, "lse", DType::kF32, {t, kAnyDim}));
  if (p.topk < 1 || p.topk > kMaxTopk) {
    return InvalidField("topk", absl::StrCat("topk: is ", p.topk, ", want 1..", kMaxTopk));
  }
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.logits, "logits", DType::kF32, {t, n}));
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.indices, "indices", DType::kI32, {t, p.topk}));
  const Tensor logits =
      p.logits.present() ? p.logits : MakeTensor(placeholder, DType::kF32, {t, n});
  const Tensor indices =
      p.indices.present() ? p.indices : MakeTensor(placeholder, DType::kI32, {t, p.topk});
  ATTND_RETURN_IF_ERROR(Rename(indexer_logits::Validate(IndexerStep(p, 0, t, logits)),
                               {{"q", "index_q"},
                                {"k", "index_k"},
                                {"k_scale", "index_k_scale"},
                                {"weights", "index_weights"}}));
  ATTND_RETURN_IF_ERROR(topk::Validate(TopkStep(p, 0, t, logits, indices)));
  return sparse_mla::Validate(SparseMlaStep(p, 0, t, indices));
}

namespace {

// The bytes of one gathered kv row: 2·d_qk bf16, 656 for the FP8 cache, d_qk per-tensor FP8.
double KvRowBytes(const Params& p, double d_qk) {
  if (p.kv.dtype != DType::kU8) return 2.0 * d_qk;
  return p.kv.dim(p.kv.rank - 1) == sparse_mla::kFp8RowBytes
             ? static_cast<double>(sparse_mla::kFp8RowBytes)
             : d_qk;
}

WorkCount CountPaged(const Params& p) {
  const int64_t t = TokenRows(p), n = LogitsColumns(p), next_n = RequestRows(p);
  const double h = static_cast<double>(p.q.dim(1)), d_qk = static_cast<double>(p.q.dim(2));
  const indexer_logits_paged::Params ip =
      PagedIndexerStep(p, 0, t, MakeTensor(placeholder, DType::kF32, {t, n}));
  const WorkCount indexer = indexer_logits_paged::Count(ip);
  double selections = 0;
  for (int64_t b = 0; b < p.index_q.dim(0); ++b) {
    for (int64_t j = 0; j < next_n; ++j) {
      selections +=
          static_cast<double>(std::min(p.topk, indexer_logits_paged::VisibleLength(ip, b, j)));
    }
  }
  const double td = static_cast<double>(t);
  const double kv_row_bytes = KvRowBytes(p, d_qk);
  WorkCount w;
  w.flops = indexer.flops + 2.0 * h * (d_qk + sparse_mla::kDimV) * selections;
  w.bytes = indexer.bytes - 4.0 * td * static_cast<double>(n)  // the logits are internal
            + 2.0 * td * h * d_qk + kv_row_bytes * selections  // q, kv rows
            + 4.0 * selections                                 // kv block table entries
            + 2.0 * td * h * sparse_mla::kDimV;                // out
  if (p.lse.present()) w.bytes += 4.0 * td * h;
  if (p.indices.present()) w.bytes += 4.0 * td * static_cast<double>(p.topk);
  return w;
}

}  // namespace

WorkCount Count(const Params& p) {
  if (p.paged()) return CountPaged(p);
  const int64_t t = p.index_q.dim(0), n = p.index_k.dim(0);
  const double h_i = static_cast<double>(p.index_q.dim(1));
  const double d_i = static_cast<double>(p.index_q.dim(2));
  const double h = static_cast<double>(p.q.dim(1)), d_qk = static_cast<double>(p.q.dim(2));
  const Tensor logits = MakeTensor(placeholder, DType::kF32, {t, n});
  const WorkCount indexer = indexer_logits::Count(IndexerStep(p, 0, t, logits));
  double selections = 0;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t begin = std::max<int64_t>(p.ks.ptr<const int32_t>()[i], 0);
    const int64_t end = std::min<int64_t>(p.ke.ptr<const int32_t>()[i], n);
    selections += static_cast<double>(std::min(p.topk, std::max<int64_t>(end - begin, 0)));
  }
  WorkCount w;
  w.flops = indexer.flops + 2.0 * h * (d_qk + sparse_mla::kDimV) * selections;
  const double td = static_cast<double>(t), nd = static_cast<double>(n);
  const double kv_row_bytes = KvRowBytes(p, d_qk);
  w.bytes = td * h_i * d_i + nd * d_i + 4.0 * nd + 4.0 * td * h_i + 8.0 * td  // indexer
            + 2.0 * td * h * d_qk + kv_row_bytes * selections                 // q, kv rows
            + 2.0 * td * h * sparse_mla::kDimV;                               // out
  if (p.lse.present()) w.bytes += 4.0 * td * h;
  if (p.indices.present()) w.bytes += 4.0 * td * static_cast<double>(p.topk);
  return w;
}

const std::vector<Impl<Params>>& Implementations() {
  static const std::vector<Impl<Params>>* impls = new std::vector<Impl<Params>> {
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
    GpuImpl<Params>("steps", GpuSupports, RunGpu, GpuWorkspaceBytes),
#endif
#if defined(ATTND_GPU_CUDA)
        GpuImpl<Params>("fused_topk", FusedTopkSupports, RunFusedTopk, FusedTopkWorkspaceBytes),
        GpuImpl<Params>("fused_topk_hw", FusedTopkSupports, RunFusedTopkHelpers,
                        FusedTopkWorkspaceBytes),
#endif
        CpuImpl(RunCpu),
  };
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  ATTND_RETURN_IF_ERROR(Validate(p));
  return Dispatch(Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::dsa
