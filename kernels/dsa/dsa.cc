#include "kernels/dsa/dsa.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status.h"
#include "kernels/common/status_details.h"
#include "kernels/dsa/cpu.h"
#include "kernels/indexer_logits/indexer_logits.h"
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

}  // namespace

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
  sp.indices = indices;
  sp.sm_scale = p.sm_scale;
  sp.precision = p.precision;
  sp.out = Rows(p.out, t0, count);
  sp.lse = Rows(p.lse, t0, count);
  return sp;
}

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(
      CheckCacheLayout("kv_layout", "kv", p.kv_layout, p.kv, sparse_mla::kKvLayoutsWithoutScale));
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
  // bf16, or sparse_mla's FP8 cache (u8 [N, 656]; not the per-tensor FP8 rows, which need a
  // kv_scale this op does not take); sparse_mla::Validate below checks the rest.
  const bool kv_u8 = p.kv.dtype == DType::kU8;
  ATTND_RETURN_IF_ERROR(CheckTensor(p.kv, "kv", kv_u8 ? DType::kU8 : DType::kBF16,
                                    {n, kv_u8 ? sparse_mla::kFp8RowBytes : kAnyDim}));
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

WorkCount Count(const Params& p) {
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
  const double kv_row_bytes =
      p.kv.dtype == DType::kU8 ? static_cast<double>(sparse_mla::kFp8RowBytes) : 2.0 * d_qk;
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
        CpuImpl(RunCpu),
  };
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  ATTND_RETURN_IF_ERROR(Validate(p));
  return Dispatch(Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::dsa
