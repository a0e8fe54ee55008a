#include "kernels/dsa/gpu.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/common/supports.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "kernels/topk/topk.h"

#if defined(ATTND_GPU_CUDA)
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/topk/gpu/filter.h"
#endif

namespace attnd::kernels::dsa {
namespace {

constexpr int64_t kAlign = 256;

// Stands in for scratch in Supports/workspace queries (aligned like the real workspace; never
// dereferenced on the host).
alignas(kAlign) char placeholder[kAlign];

int64_t AlignUp(int64_t bytes) { return CeilDiv(bytes, kAlign) * kAlign; }

Tensor Rows(const Tensor& t, int64_t begin, int64_t count) {
  Tensor r = t;
  if (count > 0) r.data = static_cast<char*>(t.data) + begin * t.strides[0] * DTypeSize(t.dtype);
  r.shape[0] = count;
  return r;
}

// The block of token rows each pass handles (whole requests in the paged form), and the
// scratch it needs, in this order in the workspace.
struct Layout {
  int64_t block = 1;
  int64_t logits_bytes = 0;   // 0 when the caller placed the logits
  int64_t indices_bytes = 0;  // 0 when the caller placed the indices
  int64_t lengths_bytes = 0;  // paged form: top-k's whole-row lengths
  int64_t scratch() const { return logits_bytes + indices_bytes + lengths_bytes; }
};

Layout MakeLayout(const Params& p) {
  const int64_t t = std::max<int64_t>(TokenRows(p), 1), n = std::max<int64_t>(LogitsColumns(p), 1);
  const int64_t unit = std::max<int64_t>(RequestRows(p), 1);
  Layout l;
  l.block = p.logits.present() ? t
                               : std::clamp<int64_t>(kGpuLogitsScratchBytes / (unit * n * 4), 1,
                                                     std::max<int64_t>(t / unit, 1)) *
                                     unit;
  if (!p.logits.present()) l.logits_bytes = AlignUp(l.block * n * 4);
  if (!p.indices.present()) l.indices_bytes = AlignUp(l.block * p.topk * 4);
  if (p.paged()) l.lengths_bytes = AlignUp(l.block * 4);
  return l;
}

// The scratch views of rows [t0, t0 + count): the caller's logits / indices when placed, else
// the given scratch addresses (the workspace's, or the placeholder in queries).
BlockScratch Views(const Params& p, int64_t t0, int64_t count, char* logits, char* indices,
                   char* lengths) {
  BlockScratch s;
  s.logits = p.logits.present() ? Rows(p.logits, t0, count)
                                : MakeTensor(logits, DType::kF32, {count, LogitsColumns(p)});
  s.indices = p.indices.present() ? Rows(p.indices, t0, count)
                                  : MakeTensor(indices, DType::kI32, {count, p.topk});
  if (p.paged()) s.lengths = MakeTensor(lengths, DType::kI32, {count});
  return s;
}

template <class P>
const Impl<P>* Pick(const std::vector<Impl<P>>& impls, const P& sp, std::string* why) {
  ExecContext ctx;
  ctx.backend = kGpuBackend;
  return SelectImpl(impls, sp, ctx, why);
}

template <class P>
int64_t WorkspaceOf(const std::vector<Impl<P>>& impls, const P& sp) {
  std::string why;
  const Impl<P>* impl = Pick(impls, sp, &why);
  return impl != nullptr && impl->workspace ? impl->workspace(sp) : 0;
}

// Calls f(step name, implementation or null, refusals, workspace bytes) for each step of the
// first block, with scratch views as RunGpu lays them out (placeholders).
template <class F>
void ForEachStep(const Params& p, F&& f) {
  const Layout l = MakeLayout(p);
  const int64_t count = std::min(l.block, TokenRows(p));
  const BlockScratch s = Views(p, 0, count, placeholder, placeholder, placeholder);
  auto visit = [&](const char* step, const auto& impls, const auto& sp) {
    std::string why;
    const auto* impl = Pick(impls, sp, &why);
    f(step, impl != nullptr, why, impl != nullptr && impl->workspace ? impl->workspace(sp) : 0);
  };
  if (p.paged()) {
    visit("indexer_logits_paged", indexer_logits_paged::Implementations(),
          PagedIndexerStep(p, 0, count, s.logits));
    visit("topk", topk::Implementations(),
          PagedTopkStep(p, 0, count, s.logits, s.lengths, s.indices));
  } else {
    visit("indexer_logits", indexer_logits::Implementations(), IndexerStep(p, 0, count, s.logits));
    visit("topk", topk::Implementations(), TopkStep(p, 0, count, s.logits, s.indices));
  }
  visit("sparse_mla", sparse_mla::Implementations(), SparseMlaStep(p, 0, count, s.indices));
}

}  // namespace

bool GpuSupports(const Params& p, std::string* why) {
  bool ok = true;
  ForEachStep(p, [&](const char* step, bool found, const std::string& w, int64_t) {
    if (ok && !found) {
      *why = absl::StrCat(step, " step: ", w);
      ok = false;
    }
  });
  return ok;
}

int64_t GpuWorkspaceBytes(const Params& p) {
  int64_t steps = 0;
  ForEachStep(p, [&](const char*, bool, const std::string&, int64_t bytes) {
    steps = std::max(steps, bytes);
  });
  return MakeLayout(p).scratch() + AlignUp(steps);
}

absl::Status RunGpu(const Params& p, const ExecContext& ctx) {
  const int64_t t = TokenRows(p);
  if (t == 0) return absl::OkStatus();
  const Layout l = MakeLayout(p);
  const int64_t scratch = l.scratch();
  if (scratch > 0 && (ctx.workspace == nullptr || ctx.workspace_bytes < scratch)) {
    return absl::InternalError(
        absl::StrCat("dsa: workspace of ", ctx.workspace_bytes, " bytes, want at least ", scratch));
  }
  char* ws = static_cast<char*>(ctx.workspace);
  char* const logits = ws;
  char* const indices = l.logits_bytes > 0 ? ws + l.logits_bytes : ws;
  char* const lengths = l.lengths_bytes > 0 ? ws + l.logits_bytes + l.indices_bytes : ws;
  ExecContext step_ctx = ctx;
  step_ctx.workspace = ctx.workspace_bytes > scratch ? ws + scratch : nullptr;
  step_ctx.workspace_bytes = ctx.workspace_bytes > scratch ? ctx.workspace_bytes - scratch : 0;
  if (p.paged()) {  // top-k's window: every column (dsa.h kWholeRowLength), stream-ordered
    GPU_RETURN_IF_ERROR(gpu::MemsetAsync(lengths, kWholeRowByte, static_cast<size_t>(l.block * 4),
                                         static_cast<gpu::Stream>(ctx.stream)));
  }
  for (int64_t t0 = 0; t0 < t; t0 += l.block) {
    // Host-side: no further launches once the call is asked to stop (what is enqueued runs).
    if (StopRequested(ctx)) return StoppedStatus();
    const int64_t count = std::min(l.block, t - t0);
    ATTND_RETURN_IF_ERROR(
        RunBlock(p, t0, count, Views(p, t0, count, logits, indices, lengths), step_ctx));
  }
  return absl::OkStatus();
}

#if defined(ATTND_GPU_CUDA)

// ---- The indexer → top-k candidate form (docs/KERNELS.md "Indexer → top-k candidates").

namespace {

// The block of token rows each pass handles and its scratch, in this order in the workspace:
// every row's candidates (N pairs of u32: a row's window never overflows them), counts, floors,
// and the indices when the caller does not place them.
struct FusedLayout {
  int64_t block = 1;
  int64_t entries_bytes = 0, counts_bytes = 0, floors_bytes = 0, indices_bytes = 0;
  int64_t scratch() const { return entries_bytes + counts_bytes + floors_bytes + indices_bytes; }
};

FusedLayout MakeFusedLayout(const Params& p) {
  const int64_t t = std::max<int64_t>(TokenRows(p), 1), n = std::max<int64_t>(LogitsColumns(p), 1);
  FusedLayout l;
  l.block = std::clamp<int64_t>(kGpuCandidateScratchBytes / (n * 8), 1, t);
  l.entries_bytes = AlignUp(l.block * n * 8);
  l.counts_bytes = AlignUp(l.block * 4);
  l.floors_bytes = AlignUp(l.block * 4);
  if (!p.indices.present()) l.indices_bytes = AlignUp(l.block * p.topk * 4);
  return l;
}

// The top-k call the candidates stand in for: its logits tensor gives the shape only.
topk::Params FusedTopkStep(const Params& p, int64_t t0, int64_t count, const Tensor& indices) {
  return TopkStep(
      p, t0, count,
      MakeTensor(placeholder, DType::kF32, {count, std::max<int64_t>(LogitsColumns(p), 1)}),
      indices);
}

Tensor IndicesView(const Params& p, int64_t t0, int64_t count, char* scratch) {
  return p.indices.present() ? Rows(p.indices, t0, count)
                             : MakeTensor(scratch, DType::kI32, {count, p.topk});
}

}  // namespace

bool FusedTopkSupports(const Params& p, std::string* why) {
  if (p.paged()) return Refuse(why, "the paged form runs its steps (cuda_steps)");
  if (p.logits.present()) return Refuse(why, "the logits are asked for (cuda_steps writes them)");
  if (p.index_precision != Precision::kFast) {
    return Refuse(why,
                  "index_precision is not FAST (the candidates come from the FP8 wgmma "
                  "indexer)");
  }
  const FusedLayout l = MakeFusedLayout(p);
  const int64_t count = std::min(l.block, TokenRows(p));
  const Tensor indices = IndicesView(p, 0, count, placeholder);
  std::string w;
  if (!indexer_logits::gpu::WgmmaCandidatesSupports(IndexerStep(p, 0, count, Tensor{}), p.topk,
                                                    &w)) {
    return Refuse(why, "indexer step: ", w);
  }
  if (!topk::gpu::SupportsTopkFromCandidates(FusedTopkStep(p, 0, count, indices), &w)) {
    return Refuse(why, "topk step: ", w);
  }
  if (Pick(sparse_mla::Implementations(), SparseMlaStep(p, 0, count, indices), &w) == nullptr) {
    return Refuse(why, "sparse_mla step: ", w);
  }
  return true;
}

int64_t FusedTopkWorkspaceBytes(const Params& p) {
  const FusedLayout l = MakeFusedLayout(p);
  const int64_t count = std::min(l.block, TokenRows(p));
  return l.scratch() +
         AlignUp(WorkspaceOf(sparse_mla::Implementations(),
                             SparseMlaStep(p, 0, count, IndicesView(p, 0, count, placeholder))));
}

namespace {

absl::Status RunFusedTopkWith(const Params& p, const ExecContext& ctx, bool helpers) {
  const int64_t t = TokenRows(p);
  if (t == 0) return absl::OkStatus();
  const FusedLayout l = MakeFusedLayout(p);
  const int64_t scratch = l.scratch();
  if (ctx.workspace == nullptr || ctx.workspace_bytes < scratch) {
    return absl::InternalError(
        absl::StrCat("dsa: workspace of ", ctx.workspace_bytes, " bytes, want at least ", scratch));
  }
  char* ws = static_cast<char*>(ctx.workspace);
  auto* const entries = reinterpret_cast<uint32_t*>(ws);
  auto* const counts = reinterpret_cast<uint32_t*>(ws + l.entries_bytes);
  auto* const floors = reinterpret_cast<uint32_t*>(ws + l.entries_bytes + l.counts_bytes);
  char* const indices = ws + l.entries_bytes + l.counts_bytes + l.floors_bytes;
  ExecContext step_ctx = ctx;
  step_ctx.workspace = ctx.workspace_bytes > scratch ? ws + scratch : nullptr;
  step_ctx.workspace_bytes = ctx.workspace_bytes > scratch ? ctx.workspace_bytes - scratch : 0;
  const auto stream = static_cast<gpu::Stream>(ctx.stream);
  const int64_t n = LogitsColumns(p);
  for (int64_t t0 = 0; t0 < t; t0 += l.block) {
    if (StopRequested(ctx)) return StoppedStatus();
    const int64_t count = std::min(l.block, t - t0);
    const Tensor idx = IndicesView(p, t0, count, indices);
    indexer_logits::gpu::WgmmaCandidates c;
    c.entries = entries;
    c.ld = std::max<int64_t>(n, 1);
    c.counts = counts;
    c.floors = floors;
    c.k = static_cast<uint32_t>(p.topk);
    c.helpers = helpers;
    ATTND_RETURN_IF_ERROR(InStep("indexer_logits", [&]() -> absl::Status {
      GPU_RETURN_IF_ERROR(indexer_logits::gpu::LaunchWgmmaCandidates(
          IndexerStep(p, t0, count, Tensor{}), c, stream));
      return absl::OkStatus();
    }()));
    topk::gpu::TopkCandidateRows rows;
    rows.entries = entries;
    rows.ld = c.ld;
    rows.counts = counts;
    rows.floors = floors;
    ATTND_RETURN_IF_ERROR(InStep("topk", [&]() -> absl::Status {
      GPU_RETURN_IF_ERROR(
          topk::gpu::LaunchTopkFromCandidates(FusedTopkStep(p, t0, count, idx), rows, stream));
      return absl::OkStatus();
    }()));
    ATTND_RETURN_IF_ERROR(
        InStep("sparse_mla", sparse_mla::Run(SparseMlaStep(p, t0, count, idx), step_ctx)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunFusedTopk(const Params& p, const ExecContext& ctx) {
  return RunFusedTopkWith(p, ctx, /*helpers=*/false);
}

absl::Status RunFusedTopkHelpers(const Params& p, const ExecContext& ctx) {
  return RunFusedTopkWith(p, ctx, /*helpers=*/true);
}

#endif  // defined(ATTND_GPU_CUDA)

}  // namespace attnd::kernels::dsa
