// The decode-step benchmark's in-process baseline (docs/BENCHMARKS.md "Decode step"): the paged
// DsaAttention that attnd would run, called in the caller's own process on the caller's stream,
// through the same operator entry the daemon uses (validate, then the first implementation of
// the GPU backend that supports the call) with a caller-owned workspace. A C ABI for ctypes:
//   bytes = attnd_inproc_dsa_paged(&shape, &ptrs, stream, nullptr, 0, err, n)  // workspace query
//   rc    = attnd_inproc_dsa_paged(&shape, &ptrs, stream, ws, bytes, err, n)   // launches only
// Returns >= 0 (the workspace bytes, or 0 after a launch) or -1 with the reason in err. Nothing
// here synchronises or allocates, so a torch stream keeps its order and can run ahead.
//   rc    = attnd_inproc_stamp(at, stream)  // one thread stores %globaltimer (ns) into *at
// (the benchmark's --trace: the daemon's trace of device-ordered calls is on the same clock).
//   h     = attnd_inproc_capture(&shape, &ptrs, ws, bytes, form, err, n)  // a graph of the call
//   rc    = attnd_inproc_launch(h, stream)
// The call captured once into a CUDA graph (its pointers fixed), as a serving engine that captures
// its decode step would run it: form 0 the op's launches alone; form 1 the daemon's
// device-ordered form around them (gate kernel → conditional IF body → done kernel, the call words
// in mapped host memory; server/engine/gpu/ ordered_queue.cc), with no wait and no signal; form 2
// the same gate, an empty IF body and the op after it (what the conditional costs without the op
// inside); form 3 the IF body one child-graph node holding the op; form 4 the op in the IF body
// with its memset nodes moved before the gate.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/gpu/ordered_gate.h"
#include "kernels/common/registry.h"
#include "kernels/common/tensor.h"
#include "kernels/dsa/dsa.h"
#include "kernels/dsa/params.h"

namespace {

using attnd::kernels::DType;
using attnd::kernels::MakeTensor;
using attnd::kernels::Tensor;
namespace dsa = attnd::kernels::dsa;

// attnd_inproc_capture's graphs (kept for the process's life) and its call words.
std::mutex g_mu;
std::vector<cudaGraphExec_t> g_graphs;
attnd::kernels::ordered::CallWords* g_words = nullptr;  // host-mapped

}  // namespace

extern "C" {

// The call's sizes (the paged form with one block table for both caches, as vLLM keeps them).
struct AttndInprocShape {
  int64_t batch, next_n, heads, d_qk, index_heads, index_dim, topk;
  int64_t num_index_blocks, index_block_size, max_blocks, kv_rows, kv_row_bytes;
  float sm_scale;
};

// Device pointers (contiguous tensors; lse may be null).
struct AttndInprocPointers {
  void *index_q, *index_weights, *index_cache, *block_table, *context_lens, *q, *kv, *out, *lse;
};

int64_t attnd_inproc_dsa_paged(const AttndInprocShape* s, const AttndInprocPointers* d,
                               void* stream, void* workspace, int64_t workspace_bytes, char* err,
                               int64_t err_len) {
  auto fail = [&](const std::string& why) -> int64_t {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", why.c_str());
    return -1;
  };
  const int64_t t = s->batch * s->next_n;
  dsa::Params p;
  p.index_q =
      MakeTensor(d->index_q, DType::kFp8E4M3, {s->batch, s->next_n, s->index_heads, s->index_dim});
  p.index_weights = MakeTensor(d->index_weights, DType::kF32, {t, s->index_heads});
  p.index_cache = MakeTensor(d->index_cache, DType::kU8,
                             {s->num_index_blocks, s->index_block_size * (s->index_dim + 4)});
  p.index_block_size = s->index_block_size;
  p.index_block_table = MakeTensor(d->block_table, DType::kI32, {s->batch, s->max_blocks});
  p.context_lens = MakeTensor(d->context_lens, DType::kI32, {s->batch});
  p.q = MakeTensor(d->q, DType::kBF16, {t, s->heads, s->d_qk});
  p.kv = s->kv_row_bytes == 2 * s->d_qk
             ? MakeTensor(d->kv, DType::kBF16, {s->kv_rows, s->d_qk})
             : MakeTensor(d->kv, DType::kU8, {s->kv_rows, s->kv_row_bytes});
  p.topk = s->topk;
  p.sm_scale = s->sm_scale;
  p.out = MakeTensor(d->out, DType::kBF16, {t, s->heads, 512});
  if (d->lse != nullptr) p.lse = MakeTensor(d->lse, DType::kF32, {t, s->heads});

  attnd::kernels::ExecContext ctx;
  ctx.backend = attnd::kernels::kGpuBackend;
  ctx.stream = stream;
  if (absl::Status v = dsa::Validate(p); !v.ok()) return fail(v.ToString());
  std::string why;
  const auto* impl = attnd::kernels::SelectImpl(dsa::Implementations(), p, ctx, &why);
  if (impl == nullptr) return fail("no GPU implementation: " + why);
  const int64_t need = impl->workspace ? impl->workspace(p) : 0;
  if (workspace == nullptr) return need;
  if (workspace_bytes < need) {
    return fail("workspace of " + std::to_string(workspace_bytes) + " bytes, want " +
                std::to_string(need));
  }
  ctx.workspace = workspace;
  ctx.workspace_bytes = workspace_bytes;
  std::string name;
  if (absl::Status st = dsa::Run(p, ctx, &name); !st.ok()) return fail(name + ": " + st.ToString());
  return 0;
}

// Captures attnd_inproc_dsa_paged's launches (form 0) or the daemon's form around them (form 1)
// and instantiates the graph; returns its handle (>= 0) or -1 with the reason in err.
int64_t attnd_inproc_capture(const AttndInprocShape* s, const AttndInprocPointers* d,
                             void* workspace, int64_t workspace_bytes, int64_t form, char* err,
                             int64_t err_len) {
  namespace ko = attnd::kernels::ordered;
  auto fail = [&](const std::string& why) -> int64_t {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", why.c_str());
    return -1;
  };
  auto cuda = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    fail(std::string(what) + ": " + cudaGetErrorString(e));
    return false;
  };
  if (form < 0 || form > 4) return fail("form: 0 to 4");
  const bool gated = form != 0;
  std::lock_guard<std::mutex> lock(g_mu);
  if (gated && g_words == nullptr) {
    void* h = nullptr;
    if (!cuda(cudaHostAlloc(&h, sizeof(ko::CallWords), cudaHostAllocMapped), "cudaHostAlloc")) {
      return -1;
    }
    std::memset(h, 0, sizeof(ko::CallWords));
    g_words = static_cast<ko::CallWords*>(h);
  }
  ko::CallWords* dwords = nullptr;
  if (gated && !cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dwords), g_words, 0),
                     "cudaHostGetDevicePointer")) {
    return -1;
  }
  cudaStream_t cap = nullptr;
  if (!cuda(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), "cudaStreamCreate")) return -1;
  cudaGraph_t g = nullptr;
  cudaGraph_t target = nullptr;  // where the op's launches are captured
  cudaGraph_t child = nullptr;   // form 3: the op's own graph
  cudaGraphNode_t cond = nullptr;
  bool ok = cuda(cudaGraphCreate(&g, 0), "cudaGraphCreate");
  cudaGraphConditionalHandle handle = 0;
  cudaKernelNodeParams kp{};
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  cudaGraph_t body = nullptr;
  if (ok && gated) {
    ok = cuda(cudaGraphConditionalHandleCreate(&handle, g, 0, 0), "conditional handle");
    void* gate_args[] = {&handle, &dwords};
    kp.func = const_cast<void*>(ko::GateKernel());
    kp.kernelParams = gate_args;
    cudaGraphNode_t gate = nullptr;
    ok = ok && cuda(cudaGraphAddKernelNode(&gate, g, nullptr, 0, &kp), "gate node");
    cudaGraphNodeParams cp{};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = handle;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 1;
    ok = ok && cuda(cudaGraphAddNode(&cond, g, &gate, nullptr, 1, &cp), "conditional node");
    body = ok ? cp.conditional.phGraph_out[0] : nullptr;
  }
  target = form == 0 || form == 2 ? g : body;  // forms 1, 3 (child, below), 4: the body
  if (ok && form == 3) {
    ok = cuda(cudaGraphCreate(&child, 0), "cudaGraphCreate");
    target = child;
  }
  if (ok) {
    const bool after_cond = form == 2;
    ok = cuda(cudaStreamBeginCaptureToGraph(cap, target, after_cond ? &cond : nullptr, nullptr,
                                            after_cond ? 1 : 0, cudaStreamCaptureModeThreadLocal),
              "begin capture");
  }
  if (ok) {
    char why[512] = {0};
    const int64_t rc =
        attnd_inproc_dsa_paged(s, d, cap, workspace, workspace_bytes, why, sizeof(why));
    cudaGraph_t captured = nullptr;
    const cudaError_t end = cudaStreamEndCapture(cap, &captured);
    if (rc < 0) {
      fail(std::string("capture: ") + why);
      ok = false;
    } else {
      ok = cuda(end, "end capture");
    }
  }
  if (ok && form == 4) {  // the body's memset nodes moved before the gate
    size_t count = 0;
    ok = cuda(cudaGraphGetNodes(body, nullptr, &count), "body nodes");
    std::vector<cudaGraphNode_t> nodes(count);
    ok = ok && cuda(cudaGraphGetNodes(body, nodes.data(), &count), "body nodes");
    cudaGraphNode_t gate = nullptr;
    size_t roots = 1;
    ok = ok && cuda(cudaGraphGetRootNodes(g, &gate, &roots), "gate");
    for (size_t i = 0; ok && i < count; ++i) {
      cudaGraphNodeType t{};
      ok = cuda(cudaGraphNodeGetType(nodes[i], &t), "node type");
      if (!ok || t != cudaGraphNodeTypeMemset) continue;
      cudaMemsetParams mp{};
      ok = cuda(cudaGraphMemsetNodeGetParams(nodes[i], &mp), "memset params");
      cudaGraphNode_t m = nullptr;
      ok = ok && cuda(cudaGraphAddMemsetNode(&m, g, nullptr, 0, &mp), "memset node");
      ok = ok && cuda(cudaGraphAddDependencies(g, &m, &gate, nullptr, 1), "memset -> gate");
      ok = ok && cuda(cudaGraphDestroyNode(nodes[i]), "memset out of the body");
    }
  }
  if (ok && form == 3) {
    cudaGraphNode_t node = nullptr;
    ok = cuda(cudaGraphAddChildGraphNode(&node, body, nullptr, 0, child), "child graph node");
  }
  if (ok && gated) {
    // The done kernel after every leaf of the graph (the conditional node, or the op's last
    // launches when they follow it).
    size_t count = 0;
    ok = cuda(cudaGraphGetNodes(g, nullptr, &count), "graph nodes");
    std::vector<cudaGraphNode_t> all(count), leaves;
    ok = ok && cuda(cudaGraphGetNodes(g, all.data(), &count), "graph nodes");
    for (size_t i = 0; ok && i < count; ++i) {
      size_t outs = 0;
      ok = cuda(cudaGraphNodeGetDependentNodes(all[i], nullptr, nullptr, &outs), "dependents");
      if (outs == 0) leaves.push_back(all[i]);
    }
    unsigned long long value = 1;
    void* done_ptr = &dwords->scratch;
    void* done_args[] = {&done_ptr, &value, &dwords};
    kp.func = const_cast<void*>(ko::DoneKernel());
    kp.kernelParams = done_args;
    cudaGraphNode_t done = nullptr;
    ok = ok &&
         cuda(cudaGraphAddKernelNode(&done, g, leaves.data(), leaves.size(), &kp), "done node");
  }
  if (ok && std::getenv("ATTND_INPROC_VERBOSE") != nullptr) {
    static bool said[5] = {false, false, false, false, false};
    if (!said[form]) {
      said[form] = true;
      cudaGraph_t op = form == 0 || form == 2 ? g : (form == 3 ? child : body);
      size_t count = 0;
      (void)cudaGraphGetNodes(op, nullptr, &count);
      std::vector<cudaGraphNode_t> all(count);
      (void)cudaGraphGetNodes(op, all.data(), &count);
      std::fprintf(stderr, "inproc form %ld: %zu nodes:", static_cast<long>(form), count);
      for (cudaGraphNode_t n : all) {
        cudaGraphNodeType t{};
        (void)cudaGraphNodeGetType(n, &t);
        std::fprintf(stderr, " %d", static_cast<int>(t));
        if (t == cudaGraphNodeTypeKernel) {
          cudaKernelNodeParams p{};
          const char* name = nullptr;
          if (cudaGraphKernelNodeGetParams(n, &p) == cudaSuccess &&
              cudaFuncGetName(&name, p.func) == cudaSuccess && name != nullptr) {
            std::fprintf(stderr, "(%.60s grid %u,%u,%u block %u smem %u)", name, p.gridDim.x,
                         p.gridDim.y, p.gridDim.z, p.blockDim.x, p.sharedMemBytes);
          }
        }
      }
      std::fprintf(stderr, "\n");
      (void)cudaGetLastError();
    }
  }
  if (child != nullptr) (void)cudaGraphDestroy(child);
  cudaGraphExec_t exec = nullptr;
  if (ok) ok = cuda(cudaGraphInstantiate(&exec, g, 0), "instantiate");
  if (g != nullptr) (void)cudaGraphDestroy(g);
  (void)cudaStreamDestroy(cap);
  if (!ok) return -1;
  g_graphs.push_back(exec);
  return static_cast<int64_t>(g_graphs.size() - 1);
}

// Launches graph `handle` of attnd_inproc_capture on `stream`: 0, or -1.
int64_t attnd_inproc_launch(int64_t handle, void* stream) {
  cudaGraphExec_t exec = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (handle < 0 || static_cast<size_t>(handle) >= g_graphs.size()) return -1;
    exec = g_graphs[static_cast<size_t>(handle)];
  }
  return cudaGraphLaunch(exec, static_cast<cudaStream_t>(stream)) == cudaSuccess ? 0 : -1;
}

int64_t attnd_inproc_stamp(unsigned long long* at, void* stream) {
  return attnd::kernels::ordered::LaunchStamp(at, static_cast<cudaStream_t>(stream)) == cudaSuccess
             ? 0
             : -1;
}

}  // extern "C"
