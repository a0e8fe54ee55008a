"""attnd's decode-path operators as torch custom ops (`torch.library`, namespace "attnd"), so a
model compiled with torch.compile(fullgraph=True) calls attnd without a graph break. Imported only
on demand (it imports torch, >= 2.4); the package itself never imports it.

    import attnd_client, attnd_client.torch_ops as attnd_ops
    attnd_ops.bind(attnd_client.Client("unix:/run/attnd/attnd.sock"))   # or a Session
    torch.ops.attnd.mla_decode(q, kv_cache, block_table, cache_seqlens, 0.0417, out, lse)
    out, lse = attnd_ops.mla_decode(q, kv_cache, block_table, cache_seqlens, 0.0417)

The ops mutate caller-allocated outputs (`out`, and `lse` / `indices` when given) and return
nothing, so buffers keep their addresses (CUDA tensors are device regions the daemon writes in
place, docs/SERVICE.md) and compiled graphs reuse them. Each op has a fake implementation that
checks shapes and dtypes and touches no daemon, for tracing. The real one runs the bound client's
typed call (ops.OpCalls): CPU tensors travel as their NumPy views, CUDA tensors as device regions
(torch_support.DeviceRegionCache through the client). Schemas, shapes: client/python/README.md
"torch.compile", docs/CONTRACTS.md.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import dtypes, torch_support
from . import ops as _ops
from .aio import AsyncClient
from .ordered import OrderedCaller
from .tensors import typed

if not hasattr(torch.library, "register_fake"):
    raise ImportError(
        f"attnd_client.torch_ops needs torch >= 2.4 (torch.library.register_fake); this is "
        f"torch {torch.__version__}"
    )

NAMESPACE = "attnd"
D_V = 512  # the latent (value) width of every MLA output
FP8_656_ROW = 656  # the FlashMLA FP8 cache row (docs/CONTRACTS.md "FP8 KV cache")
DEFAULT_TOPK = 2048  # dsa_attention's topk when unset
DEFAULT_INDEX_BLOCK_SIZE = 64  # dsa_attention's index_block_size when unset

# ---- the bound client ----

_lock = threading.Lock()
_bound: _ops.OpCalls[_ops.OpResult] | None = None
_ordered: OrderedCaller | None = None  # bind(..., ordered=True)


def bind(
    target: _ops.OpCalls[_ops.OpResult] | None, ordered: bool = False, **caller_options: Any
) -> _ops.OpCalls[_ops.OpResult] | None:
    """Makes `target` (a Client or a Session) the one every attnd op of this process calls, and
    returns the previous binding; None unbinds. Thread-safe; a call already running keeps the
    client it started with. TypeError for anything else (an aio.AsyncClient cannot serve a
    synchronous op).

    ordered=True: an op whose tensors are all CUDA tensors runs stream-ordered on the current
    torch stream of its tensors' device, through an ordered.OrderedCaller of `target` (made
    here; `caller_options` are its options): it returns once the call is queued, with no
    synchronize and no RPC after the first call with the same tensors, and the stream's later
    work sees the outputs. A failure is raised by a later op or by synchronize(). Ops with CPU
    tensors stay blocking. The previous binding's ordered caller is closed (after its calls are
    over)."""
    global _bound, _ordered
    if target is not None and (
        not isinstance(target, _ops.OpCalls) or isinstance(target, AsyncClient)
    ):
        raise TypeError(
            f"attnd_client.torch_ops.bind: want an attnd_client.Client or Session, "
            f"got {type(target).__name__}"
        )
    if caller_options and not ordered:
        raise TypeError(f"bind: options {sorted(caller_options)} need ordered=True")
    caller = target.ordered_caller(**caller_options) if ordered and target is not None else None
    with _lock:
        previous, _bound = _bound, target
        old, _ordered = _ordered, caller
    if old is not None:
        old.close()  # raises an unreported failure of its calls, after the new binding is made
    return previous


def unbind() -> _ops.OpCalls[_ops.OpResult] | None:
    """Removes the binding; returns it."""
    return bind(None)


def bound() -> _ops.OpCalls[_ops.OpResult] | None:
    """The bound Client or Session (None when unbound)."""
    with _lock:
        return _bound


def ordered_caller() -> OrderedCaller | None:
    """The ordered caller of the binding (bind(..., ordered=True)), else None."""
    with _lock:
        return _ordered


def synchronize(timeout: float | None = None) -> None:
    """Waits on the host until every stream-ordered op call made so far is over and raises the
    first failure among them (AttndError ABORTED); a no-op without an ordered binding. It does
    not synchronise the device: the caller's streams may still have work queued."""
    caller = ordered_caller()
    if caller is not None:
        caller.wait(timeout=timeout)


def _client(op: str) -> _ops.OpCalls[_ops.OpResult]:
    target = bound()
    if target is None:
        raise RuntimeError(
            f"{NAMESPACE}::{op}: no attnd client is bound; call "
            f"attnd_client.torch_ops.bind(client) with an attnd_client.Client or Session first"
        )
    return target


# ---- tensors as call arguments ----

_TORCH_DTYPES: dict[str, torch.dtype] = {
    dtypes.F32: torch.float32,
    dtypes.BF16: torch.bfloat16,
    dtypes.I32: torch.int32,
    dtypes.U8: torch.uint8,
}
if hasattr(torch, "float8_e4m3fn"):
    _TORCH_DTYPES[dtypes.FP8_E4M3] = torch.float8_e4m3fn


def _field_dtype(tensor: torch.Tensor, want: str | tuple[str, ...]) -> str:
    """The attnd dtype a tensor goes as for a field taking `want` (one dtype, or alternatives):
    its own when the field takes it, else the field's dtype with the same storage (a uint8
    tensor for an fp8 field, a float8_e4m3fn cache for a u8 one), else its own (refused)."""
    have = torch_support.attnd_dtype(tensor.dtype)
    return dtypes.field_dtype(want, have) or have


def _on_cuda(tensor: torch.Tensor) -> bool:
    return bool(tensor.is_cuda)


# (torch dtype, field dtypes) -> the torch dtype a CUDA tensor is viewed as for the field, or
# None when it goes as it is: filled on first use (the per-call path of every op looks it up).
_VIEW_AS: dict[tuple[torch.dtype, str | tuple[str, ...]], torch.dtype | None] = {}


def _arg(tensor: torch.Tensor | None, want: str | tuple[str, ...]) -> Any:
    """A tensor as the client's argument: a CUDA tensor as it is (a device region; viewed as the
    field's dtype when only the name differs), a CPU one as typed(NumPy view, field dtype)."""
    if tensor is None:
        return None
    if _on_cuda(tensor):
        key = (tensor.dtype, want)
        if key not in _VIEW_AS:
            dtype = _field_dtype(tensor, want)
            same = dtype == torch_support.attnd_dtype(tensor.dtype)
            _VIEW_AS[key] = None if same else _TORCH_DTYPES[dtype]
        view = _VIEW_AS[key]
        return tensor if view is None else tensor.view(view)
    array, _ = torch_support.cpu_numpy(tensor)
    return typed(array, _field_dtype(tensor, want))


_FIELDS: dict[str, dict[str, Any]] = {}  # op -> its tensor fields (inputs and outputs) by name

# The current stream's handle without a torch.cuda.Stream object: torch.cuda.current_stream()
# builds one per call (4–7 µs on a GPU host, docs/BENCHMARKS.md "The Python caller's CPU, on the
# host"); torch's own generated code reads the handle through this entry point. Absent (a CPU
# build), the public form.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream_handle(device: torch.device) -> int:
    """The CUstream handle of `device`'s current stream (a CUDA device)."""
    if _RAW_STREAM is not None and device.index is not None:
        return int(_RAW_STREAM(device.index))
    return int(torch.cuda.current_stream(device).cuda_stream)


def _call(op: str, arguments: dict[str, Any]) -> None:
    """Runs op `op` on the bound client with an op's arguments by name (tensors for the fields
    of ops.OPS, the rest scalars; None: unset); its outputs land in the output tensors given:
    stream-ordered on the current stream when the binding is ordered and every tensor is a CUDA
    tensor, else blocking."""
    fields = _FIELDS.get(op)
    if fields is None:
        spec = _ops.spec(op)
        fields = _FIELDS.setdefault(op, {**spec.inputs, **spec.outputs})
    target = _client(op)
    caller = ordered_caller()
    tensors = [v for n, v in arguments.items() if n in fields and v is not None]
    call = {
        name: _arg(value, fields[name]) if name in fields else value
        for name, value in arguments.items()
        if value is not None
    }
    if caller is not None and tensors and all(_on_cuda(t) for t in tensors):
        caller.call(op, stream=_current_stream_handle(tensors[0].device), **call)
    else:
        target.call(op, **call)
    # The outputs were written in place (or will be, on the stream): their version counters
    # say so, as torch's own in-place ops' do (tensors made under inference_mode have none).
    torch.autograd.graph.increment_version(
        [arguments[name] for name in MUTATES[op] if arguments.get(name) is not None]
    )


# ---- checks shared by the fake and the real implementations ----


def _fail(message: str) -> None:
    raise ValueError(message)


def _dims(tensor: torch.Tensor) -> tuple[Any, ...]:
    return tuple(tensor.shape)


def _check_tensor(
    op: str,
    name: str,
    tensor: torch.Tensor,
    allowed: Sequence[torch.dtype],
    rank: int | Sequence[int],
) -> None:
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    if tensor.dim() not in ranks:
        _fail(f"{op}: {name} has rank {tensor.dim()}, want {' or '.join(map(str, ranks))}")
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        _fail(f"{op}: {name} is {tensor.dtype}, want {names}")


def _check_shape(op: str, name: str, tensor: torch.Tensor, want: Sequence[Any]) -> None:
    if _dims(tensor) != tuple(want):
        _fail(f"{op}: {name} has shape {list(_dims(tensor))}, want {list(want)}")


def _check_scalars(
    op: str,
    sm_scale: float,
    precision: str | None,
    layouts: dict[str, str | None],
) -> None:
    if not (math.isfinite(sm_scale) and sm_scale > 0):
        _fail(f"{op}: sm_scale is {sm_scale}, want finite and > 0")
    if precision is not None:
        _ops.precision_value(precision)
    for layout in layouts.values():
        if layout is not None:
            _ops.cache_layout_value(layout)


_FP8 = tuple(d for d in (getattr(torch, "float8_e4m3fn", None),) if d is not None)
_BF16, _F32, _I32 = (torch.bfloat16,), (torch.float32,), (torch.int32,)
_BYTES = (torch.uint8, *_FP8)  # e4m3 codes: uint8 storage or float8_e4m3fn


def _check_kv(op: str, name: str, kv: torch.Tensor, d_qk: Any, kv_scale: float | None) -> None:
    """The MLA cache as rows (its last dimension): bf16 d_qk wide, the FP8 cache's 656 bytes
    (d_qk 576), or the per-tensor FP8 codes d_qk wide (with kv_scale)."""
    width = kv.shape[-1]
    if kv.dtype == torch.bfloat16:
        if width != d_qk:
            _fail(f"{op}: {name} dim {kv.dim() - 1} is {width}, want q's d_qk {d_qk}")
        if kv_scale is not None:
            _fail(f"{op}: kv_scale is {kv_scale}, but {name} is bf16 (not a per-tensor FP8 cache)")
    elif kv.dtype in _BYTES:
        per_tensor = width == d_qk
        if not per_tensor and not (width == FP8_656_ROW and d_qk == 576):
            _fail(f"{op}: {name} rows are {width} bytes, want {FP8_656_ROW} or q's d_qk {d_qk}")
        if per_tensor and kv_scale is None:
            _fail(f"{op}: kv_scale missing: {name} is a per-tensor FP8 cache")
        if not per_tensor and kv_scale is not None:
            _fail(f"{op}: kv_scale is {kv_scale}, but {name} is not a per-tensor FP8 cache")
    else:
        _fail(f"{op}: {name} is {kv.dtype}, want bfloat16 or uint8 / float8_e4m3fn")
    if kv_scale is not None and not (math.isfinite(kv_scale) and kv_scale > 0):
        _fail(f"{op}: kv_scale is {kv_scale}, want finite and > 0")


def _check_q(op: str, q: torch.Tensor, rank: int) -> tuple[Any, ...]:
    _check_tensor(op, "q", q, _BF16, rank)
    dims = _dims(q)
    if dims[-1] not in (512, 576):
        _fail(f"{op}: q dim {rank - 1} is {dims[-1]}, want 512 or 576")
    if not 1 <= dims[-2] <= 128:
        _fail(f"{op}: q dim {rank - 2} is {dims[-2]} heads, want 1..128")
    return dims


def _check_outputs(
    op: str, rows: Sequence[Any], out: torch.Tensor, lse: torch.Tensor | None
) -> None:
    """out bf16 [*rows, 512], lse f32 [*rows] (any strides)."""
    _check_tensor(op, "out", out, _BF16, len(rows) + 1)
    _check_shape(op, "out", out, (*rows, D_V))
    if lse is not None:
        _check_tensor(op, "lse", lse, _F32, len(rows))
        _check_shape(op, "lse", lse, rows)


def _check_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    causal: bool = False,
    precision: str | None = None,
    kv_cache_layout: str | None = None,
    kv_scale: float | None = None,
) -> None:
    """attnd::mla_decode's checks (docs/CONTRACTS.md "mla_decode"), and its fake."""
    op = "mla_decode"
    batch, s_q, heads, d_qk = _check_q(op, q, 4)
    _check_tensor(op, "kv_cache", kv_cache, (torch.bfloat16, *_BYTES), 3)
    _check_kv(op, "kv_cache", kv_cache, d_qk, kv_scale)
    if kv_cache.dtype != torch.bfloat16 and kv_cache.shape[-1] != d_qk:
        _fail(f"{op}: kv_cache rows are {kv_cache.shape[-1]} bytes, want q's d_qk {d_qk}")
    _check_tensor(op, "block_table", block_table, _I32, 2)
    if block_table.shape[0] != batch:
        _fail(f"{op}: block_table dim 0 is {block_table.shape[0]}, want q's batch {batch}")
    _check_tensor(op, "cache_seqlens", cache_seqlens, _I32, 1)
    _check_shape(op, "cache_seqlens", cache_seqlens, (batch,))
    _check_outputs(op, (batch, s_q, heads), out, lse)
    _check_scalars(op, sm_scale, precision, {"kv_cache_layout": kv_cache_layout})


def _check_sparse_mla(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    indptr: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    precision: str | None = None,
    kv_layout: str | None = None,
    kv_scale: float | None = None,
) -> None:
    """attnd::sparse_mla's checks (docs/CONTRACTS.md "sparse_mla"), and its fake."""
    op = "sparse_mla"
    tokens, heads, d_qk = _check_q(op, q, 3)
    _check_tensor(op, "kv", kv, (torch.bfloat16, *_BYTES), 2)
    _check_kv(op, "kv", kv, d_qk, kv_scale)
    if indptr is None:
        _check_tensor(op, "indices", indices, _I32, 2)
        if indices.shape[0] != tokens:
            _fail(f"{op}: indices dim 0 is {indices.shape[0]}, want q's tokens {tokens}")
        if topk_length is not None:
            _check_tensor(op, "topk_length", topk_length, _I32, 1)
            _check_shape(op, "topk_length", topk_length, (tokens,))
    else:
        _check_tensor(op, "indices", indices, _I32, 1)
        _check_tensor(op, "indptr", indptr, _I32, 1)
        _check_shape(op, "indptr", indptr, (tokens + 1,))
        if topk_length is not None:
            _fail(f"{op}: topk_length is for the table form; the CSR form (indptr) takes none")
    _check_outputs(op, (tokens, heads), out, lse)
    _check_scalars(op, sm_scale, precision, {"kv_layout": kv_layout})


def _check_dsa_attention(
    index_q: torch.Tensor,
    index_weights: torch.Tensor,
    index_cache: torch.Tensor,
    index_block_table: torch.Tensor,
    context_lens: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    kv_block_table: torch.Tensor | None = None,
    topk: int | None = None,
    index_block_size: int | None = None,
    kv_block_size: int | None = None,
    kv_block_stride: int | None = None,
    index_cache_layout: str | None = None,
    precision: str | None = None,
    kv_layout: str | None = None,
    kv_scale: float | None = None,
) -> None:
    """attnd::dsa_attention's checks (docs/CONTRACTS.md "dsa_attention", "Paged form"), and
    its fake."""
    op = "dsa_attention"
    _check_tensor(op, "index_q", index_q, _BYTES, 4)
    batch, next_n, index_heads, index_dim = _dims(index_q)
    tokens = batch * next_n
    _check_tensor(op, "index_weights", index_weights, _F32, 2)
    _check_shape(op, "index_weights", index_weights, (tokens, index_heads))
    _check_tensor(op, "index_cache", index_cache, (torch.uint8,), 2)
    block = DEFAULT_INDEX_BLOCK_SIZE if index_block_size is None else index_block_size
    if block < 1:
        _fail(f"{op}: index_block_size is {block}, want >= 1")
    if index_cache.shape[1] != block * (index_dim + 4):
        _fail(
            f"{op}: index_cache dim 1 is {index_cache.shape[1]}, want index_block_size x "
            f"(D_i + 4) = {block * (index_dim + 4)}"
        )
    _check_tensor(op, "index_block_table", index_block_table, _I32, 2)
    if index_block_table.shape[0] != batch:
        _fail(f"{op}: index_block_table dim 0 is {index_block_table.shape[0]}, want B {batch}")
    _check_tensor(op, "context_lens", context_lens, _I32, (1, 2))
    want_lens = (batch,) if context_lens.dim() == 1 else (batch, next_n)
    _check_shape(op, "context_lens", context_lens, want_lens)
    _, heads, d_qk = _check_q(op, q, 3)
    _check_shape(op, "q", q, (tokens, heads, d_qk))
    _check_tensor(op, "kv", kv, (torch.bfloat16, *_BYTES), 2)
    _check_kv(op, "kv", kv, d_qk, kv_scale)
    if kv_block_table is not None:
        _check_tensor(op, "kv_block_table", kv_block_table, _I32, 2)
        if kv_block_table.shape[0] != batch:
            _fail(f"{op}: kv_block_table dim 0 is {kv_block_table.shape[0]}, want B {batch}")
    for name, value in (("kv_block_size", kv_block_size), ("kv_block_stride", kv_block_stride)):
        if value is not None and value < 0:
            _fail(f"{op}: {name} is {value}, want >= 0 (0: the default)")
    k = DEFAULT_TOPK if topk is None else topk
    if not 1 <= k <= 4096:
        _fail(f"{op}: topk is {k}, want 1..4096")
    _check_outputs(op, (tokens, heads), out, lse)
    if indices is not None:
        _check_tensor(op, "indices", indices, _I32, 2)
        _check_shape(op, "indices", indices, (tokens, k))
    if logits is not None:
        _check_tensor(op, "logits", logits, _F32, 2)
        if logits.shape[0] != tokens:
            _fail(f"{op}: logits dim 0 is {logits.shape[0]}, want T {tokens}")
    layouts = {"index_cache_layout": index_cache_layout, "kv_layout": kv_layout}
    _check_scalars(op, sm_scale, precision, layouts)


# ---- the ops ----

# The schemas, stated rather than inferred from annotations (the same on every torch >= 2.4).
SCHEMAS = {
    "mla_decode": (
        "(Tensor q, Tensor kv_cache, Tensor block_table, Tensor cache_seqlens, float sm_scale, "
        "Tensor(a!) out, Tensor(b!)? lse=None, bool causal=False, str? precision=None, "
        "str? kv_cache_layout=None, float? kv_scale=None) -> ()"
    ),
    "sparse_mla": (
        "(Tensor q, Tensor kv, Tensor indices, float sm_scale, Tensor(a!) out, "
        "Tensor(b!)? lse=None, Tensor? indptr=None, Tensor? topk_length=None, "
        "str? precision=None, str? kv_layout=None, float? kv_scale=None) -> ()"
    ),
    "dsa_attention": (
        "(Tensor index_q, Tensor index_weights, Tensor index_cache, Tensor index_block_table, "
        "Tensor context_lens, Tensor q, Tensor kv, float sm_scale, Tensor(a!) out, "
        "Tensor(b!)? lse=None, Tensor(c!)? indices=None, Tensor(d!)? logits=None, "
        "Tensor? kv_block_table=None, "
        "int? topk=None, int? index_block_size=None, int? kv_block_size=None, "
        "int? kv_block_stride=None, str? index_cache_layout=None, str? precision=None, "
        "str? kv_layout=None, float? kv_scale=None) -> ()"
    ),
}
MUTATES = {
    "mla_decode": ("out", "lse"),
    "sparse_mla": ("out", "lse"),
    "dsa_attention": ("out", "lse", "indices", "logits"),
}


# The ops are defined on a torch.library.Library with a CPU and a CUDA kernel each, not with
# torch.library.custom_op: custom_op's Python layers (autograd, ADInplaceOrView, backend
# dispatch) cost ~150 µs per dsa_attention call on torch 2.5 (they walk the schema once per
# mutated argument) and ~20 µs on torch 2.11, against ~10 µs of our own checks and call
# (docs/BENCHMARKS.md "The torch ops' own cost"). What those layers did for an op without
# autograd, _call does: it bumps the version counters of the mutated outputs.
_LIBRARY = torch.library.Library(NAMESPACE, "DEF")  # held for the process: it owns the schemas


def _define_op(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Defines attnd::<name> with its stated schema and `fn` as its CPU and CUDA kernel (kept
    from dynamo, as custom_op keeps its kernels: a compiled graph calls it, never traces it);
    tagged cudagraph_unsafe where torch has the tag (a blocking call synchronises the device
    and waits on an RPC, which a CUDA graph capture cannot hold; an ordered call writes its ring
    entry from the host at each call, which a replay would not repeat)."""

    def define(fn: Callable[..., None]) -> Callable[..., None]:
        unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
        _LIBRARY.define(name + SCHEMAS[name], tags=() if unsafe is None else (unsafe,))
        kernel = torch._dynamo.disable(fn)
        for key in ("CPU", "CUDA"):
            _LIBRARY.impl(name, kernel, key)
        return fn

    return define


# The real implementations check as the fake ones do, then call the bound client with their
# arguments (locals() on entry: the tensors by field name, then the scalars).


@_define_op("mla_decode")
def _mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    causal: bool = False,
    precision: str | None = None,
    kv_cache_layout: str | None = None,
    kv_scale: float | None = None,
) -> None:
    arguments = dict(locals())
    _check_mla_decode(**arguments)
    _call("mla_decode", arguments)


@_define_op("sparse_mla")
def _sparse_mla(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    indptr: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    precision: str | None = None,
    kv_layout: str | None = None,
    kv_scale: float | None = None,
) -> None:
    arguments = dict(locals())
    _check_sparse_mla(**arguments)
    _call("sparse_mla", arguments)


@_define_op("dsa_attention")
def _dsa_attention(
    index_q: torch.Tensor,
    index_weights: torch.Tensor,
    index_cache: torch.Tensor,
    index_block_table: torch.Tensor,
    context_lens: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    kv_block_table: torch.Tensor | None = None,
    topk: int | None = None,
    index_block_size: int | None = None,
    kv_block_size: int | None = None,
    kv_block_stride: int | None = None,
    index_cache_layout: str | None = None,
    precision: str | None = None,
    kv_layout: str | None = None,
    kv_scale: float | None = None,
) -> None:
    arguments = dict(locals())
    _check_dsa_attention(**arguments)
    _call("dsa_attention", arguments)


# The fake implementations: the checks (same signatures as the ops), no daemon, return None.
for _name, _fake in (
    ("mla_decode", _check_mla_decode),
    ("sparse_mla", _check_sparse_mla),
    ("dsa_attention", _check_dsa_attention),
):
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fake, lib=_LIBRARY)


# ---- functional forms: allocate the outputs, call the mutating op ----


def _outputs(q: torch.Tensor, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty((*rows, D_V), dtype=torch.bfloat16, device=q.device)
    return out, torch.empty(tuple(rows), dtype=torch.float32, device=q.device)


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    sm_scale: float,
    *,
    causal: bool = False,
    precision: str | None = None,
    kv_cache_layout: str | None = None,
    kv_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out bf16 [B, s_q, H, 512], lse f32 [B, s_q, H]) of attnd::mla_decode, allocated on q's
    device."""
    out, lse = _outputs(q, q.shape[:3])
    torch.ops.attnd.mla_decode(
        q,
        kv_cache,
        block_table,
        cache_seqlens,
        sm_scale,
        out,
        lse,
        causal=causal,
        precision=precision,
        kv_cache_layout=kv_cache_layout,
        kv_scale=kv_scale,
    )
    return out, lse


def sparse_mla(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    indptr: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    precision: str | None = None,
    kv_layout: str | None = None,
    kv_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out bf16 [T, H, 512], lse f32 [T, H]) of attnd::sparse_mla, allocated on q's device."""
    out, lse = _outputs(q, q.shape[:2])
    torch.ops.attnd.sparse_mla(
        q,
        kv,
        indices,
        sm_scale,
        out,
        lse,
        indptr=indptr,
        topk_length=topk_length,
        precision=precision,
        kv_layout=kv_layout,
        kv_scale=kv_scale,
    )
    return out, lse


def dsa_attention(
    index_q: torch.Tensor,
    index_weights: torch.Tensor,
    index_cache: torch.Tensor,
    index_block_table: torch.Tensor,
    context_lens: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    sm_scale: float,
    *,
    indices: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out bf16 [T, H, 512], lse f32 [T, H]) of attnd::dsa_attention (the paged form),
    allocated on q's device; `indices` (i32 [T, topk]), when given, receives the chosen kv
    rows. `options`: the op's other optional arguments by name (kv_block_table, topk, logits,
    ...)."""
    out, lse = _outputs(q, q.shape[:2])
    torch.ops.attnd.dsa_attention(
        index_q,
        index_weights,
        index_cache,
        index_block_table,
        context_lens,
        q,
        kv,
        sm_scale,
        out,
        lse,
        indices=indices,
        **options,
    )
    return out, lse
