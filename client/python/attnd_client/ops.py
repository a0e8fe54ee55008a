"""The operators of attnd.v1 as data: each op's request fields with their dtypes, outputs and
scalar options (docs/CONTRACTS.md, proto/attnd/v1/attention.proto), the typed call methods shared by
Client and Session, and OpResult.

    res = client.sparse_mla(q=q, kv=kv, indices=idx, sm_scale=0.0417)
    res.out      # uint16 bf16 bits [T, H, 512] (dtypes.from_bf16 for floats)
    res.lse      # float32 [T, H]
    res.stats    # attnd.v1.CallStats: queue/compute seconds, flops, copied bytes, request id
"""

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
from google.protobuf.message import Message

from . import dtypes, torch_support
from ._proto import pb
from .tensors import OutputArg, Sink, TensorArg, TensorCodec, decode_tensor

F32, BF16, FP8, I32, U8 = dtypes.F32, dtypes.BF16, dtypes.FP8_E4M3, dtypes.I32, dtypes.U8


class OpSpec(NamedTuple):
    """One operator of attnd.v1: its name, RPC method, request message class, field in
    SessionRequest, inputs and outputs by field name with their attnd dtypes (an input with
    alternatives as a tuple, the default first), the outputs returned only when asked for, and
    the scalar option fields."""

    name: str
    rpc: str
    request: type[Message]
    session_field: str
    inputs: dict[str, str | tuple[str, ...]]
    outputs: dict[str, str]
    optional_outputs: tuple[str, ...]
    scalars: tuple[str, ...]


OPS = {
    spec.name: spec
    for spec in [
        OpSpec(
            "indexer_logits",
            "IndexerLogits",
            pb.IndexerLogitsRequest,
            "indexer_logits",
            {"q": FP8, "k": FP8, "k_scale": F32, "weights": F32, "ks": I32, "ke": I32},
            {"logits": F32},
            (),
            ("clean_logits", "precision"),
        ),
        OpSpec(
            "indexer_logits_paged",
            "IndexerLogitsPaged",
            pb.IndexerLogitsPagedRequest,
            "indexer_logits_paged",
            {"q": FP8, "kv_cache": U8, "block_table": I32, "context_lens": I32, "weights": F32},
            {"logits": F32},
            (),
            ("clean_logits", "max_context_len", "block_size", "kv_cache_layout", "precision"),
        ),
        OpSpec(
            "topk",
            "TopK",
            pb.TopKRequest,
            "top_k",
            {
                "logits": F32,
                "ks": I32,
                "ke": I32,
                "lengths": I32,
                "block_table": I32,
                "req_id_per_row": I32,
                "cu_seqlens_q": I32,
            },
            {"indices": I32, "values": F32},
            ("values",),
            ("k", "page_size", "rows_per_request", "index_base", "block_stride"),
        ),
        # kv: bf16 [S, d_qk], or uint8: the FP8 cache [S, 656], or the per-tensor FP8 cache
        # [S, d_qk] with kv_scale (sent as u8).
        OpSpec(
            "sparse_mla",
            "SparseMla",
            pb.SparseMlaRequest,
            "sparse_mla",
            {"q": BF16, "kv": (BF16, U8), "indices": I32, "indptr": I32, "topk_length": I32},
            {"out": BF16, "lse": F32},
            (),
            ("sm_scale", "precision", "batch_invariant", "kv_layout", "kv_scale"),
        ),
        # kv_cache: bf16, or uint8 e4m3 codes with kv_scale (the per-tensor FP8 cache).
        OpSpec(
            "mla_decode",
            "MlaDecode",
            pb.MlaDecodeRequest,
            "mla_decode",
            {"q": BF16, "kv_cache": (BF16, U8), "block_table": I32, "cache_seqlens": I32},
            {"out": BF16, "lse": F32},
            (),
            ("sm_scale", "causal", "precision", "batch_invariant", "kv_cache_layout", "kv_scale"),
        ),
        OpSpec(
            "mla_prefill",
            "MlaPrefill",
            pb.MlaPrefillRequest,
            "mla_prefill",
            {"q": BF16, "k": BF16, "v": BF16, "cu_seqlens_q": I32, "cu_seqlens_k": I32},
            {"out": BF16, "lse": F32},
            (),
            ("causal", "sm_scale", "precision"),
        ),
        OpSpec(
            "dsa_attention",
            "DsaAttention",
            pb.DsaAttentionRequest,
            "dsa_attention",
            {
                "index_q": FP8,
                "index_k": FP8,
                "index_k_scale": F32,
                "index_weights": F32,
                "ks": I32,
                "ke": I32,
                "q": BF16,
                "kv": (BF16, U8),
                # The paged form (index_cache given; index_k, index_k_scale, ks, ke unset).
                "index_cache": U8,
                "index_block_table": I32,
                "context_lens": I32,
                "kv_block_table": I32,
            },
            {"out": BF16, "lse": F32, "indices": I32, "logits": F32},
            ("indices", "logits"),
            (
                "topk",
                "sm_scale",
                "precision",
                "index_precision",
                "batch_invariant",
                "kv_layout",
                "kv_scale",
                "index_block_size",
                "kv_block_size",
                "kv_block_stride",
                "index_cache_layout",
            ),
        ),
    ]
}


# Options every op request may carry when the proto has them (GPU backends): the IPC event the
# daemon waits on before the op, and the device to run on.
COMMON_SCALARS = ("ready_event", "device_uuid")
for _name, _spec in list(OPS.items()):
    _extra = tuple(f for f in COMMON_SCALARS if f in _spec.request.DESCRIPTOR.fields_by_name)
    OPS[_name] = _spec._replace(scalars=_spec.scalars + _extra)


# The `precision` argument (docs/ACCURACY.md). Attention ops: "fast" rounds P to bf16 before
# P·V (the server's default), "high" keeps P as bf16 hi + lo. indexer_logits,
# indexer_logits_paged and dsa_attention's `index_precision`: "high" sums exact fp8 products in
# f32 (the server's default), "fast" opts into FP8 tensor-core accumulation.
PRECISIONS = {"fast": pb.PRECISION_FAST, "high": pb.PRECISION_HIGH}


def precision_value(precision: str) -> int:
    """The proto enum value of a precision name ("fast" or "high"; ValueError otherwise)."""
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ValueError(f"precision {precision!r}; want one of {sorted(PRECISIONS)}") from None


# TopK's `index_base` argument (docs/CONTRACTS.md "topk"): "absolute" writes logits columns (the
# server's default), "row_start" positions from each row's window start (max(ks, 0)).
INDEX_BASES = {
    "absolute": pb.TopKRequest.INDEX_BASE_ABSOLUTE,
    "row_start": pb.TopKRequest.INDEX_BASE_ROW_START,
}


def index_base_value(index_base: str) -> int:
    """The proto enum value of an index base name ("absolute" or "row_start"; ValueError
    otherwise)."""
    try:
        return INDEX_BASES[index_base]
    except KeyError:
        raise ValueError(f"index_base {index_base!r}; want one of {sorted(INDEX_BASES)}") from None


# The cache tensors' named layouts (docs/CONTRACTS.md "Named layouts"): the `kv_layout` /
# `kv_cache_layout` argument takes a name with or without the CACHE_LAYOUT_ prefix, in any case
# ("FLASHMLA_FP8_656"), or the enum's value; None (or "UNSPECIFIED") lets the server infer it from
# the tensor's dtype and shape. GetInfo lists each op's layouts (OpInfo.cache_layouts).
CACHE_LAYOUTS = {
    name.removeprefix("CACHE_LAYOUT_"): value for name, value in pb.CacheLayout.items()
}


def cache_layout_value(layout: str | int) -> int:
    """The proto enum value of a cache layout name ("FLASHMLA_FP8_656" or
    "CACHE_LAYOUT_FLASHMLA_FP8_656", any case) or value (an int goes as it is: the server refuses
    one it does not know); ValueError for an unknown name."""
    if isinstance(layout, bool):
        raise TypeError(f"cache layout {layout!r}; want a name or an int")
    if isinstance(layout, int):
        return layout
    if isinstance(layout, str):
        key = layout.upper().removeprefix("CACHE_LAYOUT_")
        if key in CACHE_LAYOUTS:
            return CACHE_LAYOUTS[key]
        raise ValueError(f"cache layout {layout!r}; want one of {sorted(CACHE_LAYOUTS)}")
    raise TypeError(f"cache layout {layout!r}; want a name or an int")


def cache_layout_name(value: int) -> str:
    """The name of a CacheLayout value without its prefix ("BF16_576"), or str(value) for one
    this client does not know."""
    for name, v in CACHE_LAYOUTS.items():
        if v == value:
            return name
    return str(value)


def precision_name(value: int) -> str | None:
    """The name ("fast" or "high") of a proto Precision (CallStats.precision), None for
    UNSPECIFIED."""
    for name, v in PRECISIONS.items():
        if v == value:
            return name
    return None


def spec(op: str) -> OpSpec:
    """The OpSpec of an op name (ValueError for an unknown one)."""
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; want one of {sorted(OPS)}") from None


class OpResult:
    """The outputs of one call by name (inline ones as read-only NumPy arrays of raw storage,
    region ones as the array / tensor / RegionRef they were placed in), `stats` (CallStats) and
    the raw `response` message."""

    def __init__(self, op: str, response: Message, outputs: dict[str, Any]) -> None:
        self.op = op
        self.response = response
        self.stats = response.stats
        # The precision that ran ("fast" / "high"; None for ops without the option).
        self.precision = precision_name(response.stats.precision)
        # dsa_attention: the precision its indexer step ran ("fast" / "high"; None for other
        # ops).
        self.index_precision = precision_name(response.stats.index_precision)
        # Whether the call ran the batch-invariant plan (False for ops without the option).
        self.batch_invariant = response.stats.batch_invariant
        self.outputs = outputs
        for name, value in outputs.items():
            setattr(self, name, value)

    def __getitem__(self, name: str) -> Any:
        return self.outputs[name]

    def __repr__(self) -> str:
        shapes = {k: getattr(v, "shape", v) for k, v in self.outputs.items()}
        return f"OpResult({self.op}, {shapes}, request_id={self.stats.request_id})"


def build_request(
    op_spec: OpSpec, codec: TensorCodec, kwargs: Mapping[str, Any]
) -> tuple[Message, dict[str, Sink]]:
    """(request message, sinks) for an op call's keyword arguments."""
    known = set(op_spec.inputs) | set(op_spec.outputs) | set(op_spec.scalars)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{op_spec.name}: unknown argument(s) {unknown}; want {sorted(known)}")
    with torch_support.one_synchronize_per_device():
        return _build_request(op_spec, codec, kwargs)


def _build_request(
    op_spec: OpSpec, codec: TensorCodec, kwargs: Mapping[str, Any]
) -> tuple[Message, dict[str, Sink]]:
    request = op_spec.request()
    for name, dtype in op_spec.inputs.items():
        value = kwargs.get(name)
        if value is not None:
            getattr(request, name).CopyFrom(codec.encode_input(name, value, dtype))
    sinks = {}
    for name, dtype in op_spec.outputs.items():
        placement, sink = codec.encode_output(name, kwargs.get(name), dtype)
        if placement is not None:
            getattr(request, name).CopyFrom(placement)
            getattr(request, name).SetInParent()
        if sink is not None:
            sinks[name] = sink
    for name in op_spec.scalars:
        value = kwargs.get(name)
        if value is not None:
            if name in ("precision", "index_precision"):
                value = precision_value(value)
            elif name == "index_base":
                value = index_base_value(value)
            elif name.endswith("_layout"):
                value = cache_layout_value(value)
            setattr(request, name, value)
    return request, sinks


def decode_response(op_spec: OpSpec, response: Message, sinks: Mapping[str, Sink]) -> OpResult:
    """The OpResult of an op's response message (outputs copied into or viewed from `sinks`)."""
    outputs = {}
    for name in op_spec.outputs:
        if not response.HasField(name):
            continue
        sink = sinks.get(name)
        array = decode_tensor(getattr(response, name), values=sink is None)
        if sink is not None and sink[0] == "copy" and array is not None:
            np.copyto(dtypes.as_raw(sink[1]), array.reshape(sink[1].shape))
            array = sink[1]
        elif sink is not None and sink[0] == "view":
            array = sink[1]
        outputs[name] = array
    return OpResult(op_spec.name, response, outputs)


def _arguments(method_locals: dict[str, Any]) -> dict[str, Any]:
    """A typed call's arguments (its locals() on entry) as call() keywords: the named ones, then
    **options."""
    arguments = {k: v for k, v in method_locals.items() if k not in ("self", "options")}
    arguments.update(method_locals["options"])
    return arguments


# What an OpCalls subclass's call() returns: OpResult (Client, Session) or an awaitable of one
# (aio.AsyncClient).
R = TypeVar("R")


class OpCalls(Generic[R]):
    """Typed calls per op, written once for the sync and the asyncio clients: each method passes
    its arguments to call(op, timeout=None, **arguments), which a subclass implements, and
    returns what call returns (OpResult, or a coroutine of it for aio.AsyncClient). Tensor
    arguments: see tensors.py; outputs default to inline replies. **options: the proto's
    per-call options (COMMON_SCALARS: ready_event, device_uuid) where it has them."""

    def call(self, op: str, timeout: float | None = None, **arguments: Any) -> R:
        """Runs op `op` with keyword `arguments` (subclasses)."""
        raise NotImplementedError

    def indexer_logits(
        self,
        *,
        q: TensorArg,
        k: TensorArg,
        k_scale: TensorArg,
        weights: TensorArg,
        ks: TensorArg,
        ke: TensorArg,
        clean_logits: bool | None = None,
        precision: str | None = None,
        logits: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """logits[m,n] = sum_h relu(q[m,h].k[n]) k_scale[n] weights[m,h] on row m's window.
        precision: "high" (None: the default; exact fp8 products summed in f32) or "fast" (FP8
        tensor-core accumulation, DeepGEMM's numerics: the fp8 wgmma kernel on Hopper; its bound
        in docs/ACCURACY.md)."""
        return self.call("indexer_logits", **_arguments(locals()))

    def indexer_logits_paged(
        self,
        *,
        q: TensorArg,
        kv_cache: TensorArg,
        block_table: TensorArg,
        context_lens: TensorArg,
        weights: TensorArg,
        max_context_len: int | None = None,
        block_size: int | None = None,
        clean_logits: bool | None = None,
        kv_cache_layout: str | int | None = None,
        precision: str | None = None,
        logits: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """Decode indexer over a paged fp8 key cache, uint8 [blocks, block_size*(D+4)].
        kv_cache_layout: "INDEXER_FP8_BLOCKS" or None (the same: each block's keys, then their
        f32 scales; at block_size 1 also vLLM's NORMAL and SGLang's HIP cache on ROCm), or
        "INDEXER_AITER_SHUFFLE_16" (vLLM's / AITER's SHUFFLE cache on ROCm: the keys in 16-token x
        16-byte tiles; block_size a multiple of 16; must be named). precision as in
        indexer_logits: "high" (None: the default) or "fast" (the fp8 wgmma kernel on Hopper)."""
        return self.call("indexer_logits_paged", **_arguments(locals()))

    def topk(
        self,
        *,
        logits: TensorArg,
        k: int,
        ks: TensorArg | None = None,
        ke: TensorArg | None = None,
        lengths: TensorArg | None = None,
        block_table: TensorArg | None = None,
        page_size: int | None = None,
        rows_per_request: int | None = None,
        index_base: str | None = None,
        req_id_per_row: TensorArg | None = None,
        cu_seqlens_q: TensorArg | None = None,
        block_stride: int | None = None,
        indices: OutputArg = None,
        values: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """Row-wise top-k of logits in each row's window (values=True to get them back).
        index_base: "absolute" (None: the default) writes logits columns, "row_start" positions
        from each row's window start (ks), as a prefill frontend holds them.
        With block_table, the request of each row is row // rows_per_request (the default),
        req_id_per_row[row] (vLLM's req_id_per_token) or the b with cu_seqlens_q[b] <= row <
        cu_seqlens_q[b + 1] (SGLang's extend); block_stride: slots per block in the pool."""
        return self.call("topk", **_arguments(locals()))

    def sparse_mla(
        self,
        *,
        q: TensorArg,
        kv: TensorArg,
        indices: TensorArg,
        sm_scale: float,
        indptr: TensorArg | None = None,
        topk_length: TensorArg | None = None,
        precision: str | None = None,
        batch_invariant: bool | None = None,
        kv_layout: str | int | None = None,
        kv_scale: float | None = None,
        out: OutputArg = None,
        lse: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """Sparse MLA: each token attends to its selected kv rows (top-k table or CSR). kv is
        bf16 [S, d_qk]; or, with d_qk 576, the FP8 cache as uint8 [S, 656] (512 e4m3 codes, 4 f32
        scales, 64 bf16 rope per row); or the per-tensor FP8 cache as uint8 [S, d_qk] (e4m3
        codes, vLLM's kv_cache_dtype "fp8") with kv_scale, the layer's k_scale (value = code x
        kv_scale). precision: "fast" (None: the default) or "high". kv_layout: "BF16_576",
        "BF16_512", "FLASHMLA_FP8_656", "FP8_576_PER_TENSOR", "FP8_512_PER_TENSOR" (None:
        inferred from kv). batch_invariant=True: each token's out and lse are bitwise the same
        whatever else is in the call (slower; docs/KERNELS.md "Batch invariance")."""
        return self.call("sparse_mla", **_arguments(locals()))

    def mla_decode(
        self,
        *,
        q: TensorArg,
        kv_cache: TensorArg,
        block_table: TensorArg,
        cache_seqlens: TensorArg,
        sm_scale: float,
        causal: bool | None = None,
        precision: str | None = None,
        batch_invariant: bool | None = None,
        kv_cache_layout: str | int | None = None,
        kv_scale: float | None = None,
        out: OutputArg = None,
        lse: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """Dense absorbed MLA decode over a paged latent cache: kv_cache bf16 [pages,
        page_size, d_qk], or the per-tensor FP8 cache as uint8 e4m3 codes of that shape with
        kv_scale (vLLM's kv_cache_dtype "fp8": value = code x kv_scale). precision: "fast" (None:
        the default) or "high". kv_cache_layout: "BF16_576", "BF16_512", "FP8_576_PER_TENSOR" or
        "FP8_512_PER_TENSOR" (None: inferred). batch_invariant=True: each request's out and lse
        are bitwise the same whatever else is in the call (docs/KERNELS.md "Batch invariance")."""
        return self.call("mla_decode", **_arguments(locals()))

    def mla_prefill(
        self,
        *,
        q: TensorArg,
        k: TensorArg,
        v: TensorArg,
        cu_seqlens_q: TensorArg,
        cu_seqlens_k: TensorArg,
        sm_scale: float,
        causal: bool | None = None,
        precision: str | None = None,
        out: OutputArg = None,
        lse: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """Dense non-absorbed MLA prefill over packed variable-length sequences. precision:
        "fast" (None: the default) or "high"."""
        return self.call("mla_prefill", **_arguments(locals()))

    def dsa_attention(
        self,
        *,
        index_q: TensorArg,
        index_weights: TensorArg,
        q: TensorArg,
        kv: TensorArg,
        sm_scale: float,
        index_k: TensorArg | None = None,
        index_k_scale: TensorArg | None = None,
        ks: TensorArg | None = None,
        ke: TensorArg | None = None,
        index_cache: TensorArg | None = None,
        index_block_table: TensorArg | None = None,
        context_lens: TensorArg | None = None,
        kv_block_table: TensorArg | None = None,
        index_block_size: int | None = None,
        kv_block_size: int | None = None,
        kv_block_stride: int | None = None,
        index_cache_layout: str | int | None = None,
        topk: int | None = None,
        precision: str | None = None,
        index_precision: str | None = None,
        batch_invariant: bool | None = None,
        kv_layout: str | int | None = None,
        kv_scale: float | None = None,
        out: OutputArg = None,
        lse: OutputArg = None,
        indices: OutputArg = None,
        logits: OutputArg = None,
        timeout: float | None = None,
        **options: Any,
    ) -> R:
        """A whole DSA layer in one call: indexer -> top-k -> sparse MLA (topk None: 2048).
        kv as in sparse_mla: bf16 [N, d_qk], a uint8 array [N, 656] (the FP8 cache, d_qk 576), or
        the per-tensor FP8 cache as uint8 e4m3 codes [N, d_qk] with kv_scale, the layer's k_scale
        (vLLM's kv_cache_dtype "fp8": value = code x kv_scale; either form). indices=True /
        logits=True (or a placement) also return the chosen rows / the cleaned indexer logits.
        precision (of out): "fast" (None: the default) or "high". index_precision (the indexer
        step's, as indexer_logits' precision): "high" (None: the default) or "fast". kv_layout
        and batch_invariant as in sparse_mla.

        Gathered form: index_k, index_k_scale, ks, ke. Paged form (decode; docs/CONTRACTS.md
        "dsa_attention"): index_q [B, next_n, H_i, D_i], index_cache (uint8 block rows, as
        indexer_logits_paged's kv_cache) with index_block_table and context_lens ([B] or
        [B, next_n]); kv the MLA cache's pool of rows, reached through kv_block_table (None: the
        index table), kv_block_size (None: index_block_size) and kv_block_stride; indices then
        returns kv rows. index_cache_layout as indexer_logits_paged's kv_cache_layout."""
        return self.call("dsa_attention", **_arguments(locals()))
