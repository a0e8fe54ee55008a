"""attnd.v1.Tensor <-> NumPy: inline arrays, slices of registered regions, output placements.

An argument of an op call may be
  * a NumPy array: sent inline, or, when its memory lies inside a host region registered through
    this client (a view from HostRegion.array()), passed zero-copy as a slice of that region;
  * typed(array, "fp8_e4m3"): an array whose raw dtype is ambiguous (uint8 as fp8 or u8), or
    typed(array, inline=True) to force inline;
  * RegionRef(region, dtype, shape, offset, strides): an explicit slice of any registered region;
  * a torch tensor (CPU: as its NumPy view; CUDA: a device region, see torch_support.py), as the
    attnd dtype its torch dtype names; a field with alternatives (kv, kv_cache: bf16 or u8) takes
    the one it names or whose storage it has (uint8 and float8_e4m3fn go as u8, bits as they
    are), and a bf16 / fp8 tensor for a field of other storage is converted by value;
  * any other DLPack tensor (`__dlpack__`): a CPU one through numpy.from_dlpack (zero copy), a
    CUDA one (or a dtype NumPy lacks, such as bf16) through torch.from_dlpack when torch is
    installed;
  * ml_dtypes.bfloat16 / float8_e4m3fn arrays for bf16 / fp8 fields (their bits as they are).
Outputs also accept Placement(...) and True (return inline, e.g. the optional top-k `values`).
    ref = RegionRef("kv", "bf16", (4096, 576), offset=0)
    out = region.array("bf16", (4, 16, 512))
    client.sparse_mla(q=q, kv=ref, indices=idx, sm_scale=0.07, out=out)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard

import numpy as np
import numpy.typing as npt

from . import dtypes
from ._proto import pb

if TYPE_CHECKING:
    import torch


class RegionRef:
    """A tensor in a registered region: `offset` bytes from the region's start, `strides` in
    elements (None = dense row-major)."""

    def __init__(
        self,
        region: str,
        dtype: str,
        shape: Iterable[int],
        offset: int = 0,
        strides: Iterable[int] | None = None,
    ) -> None:
        self.region = region
        self.dtype = dtypes.canonical(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.offset = int(offset)
        self.strides = None if strides is None else tuple(int(s) for s in strides)

    def __repr__(self) -> str:
        return (
            f"RegionRef({self.region!r}, {self.dtype!r}, {self.shape}, offset={self.offset}, "
            f"strides={self.strides})"
        )


class Placement:
    """An output placement: in `region` (a RegionRef, written in place) or inline (region None),
    with an optional dtype / shape / element strides (e.g. a logits row stride ld > N)."""

    def __init__(
        self,
        dtype: str | None = None,
        shape: Iterable[int] | None = None,
        strides: Iterable[int] | None = None,
        region: RegionRef | None = None,
    ) -> None:
        self.dtype = None if dtype is None else dtypes.canonical(dtype)
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.strides = None if strides is None else tuple(int(s) for s in strides)
        self.region = region


class Typed:
    """An array with an explicit attnd dtype and/or forced inline transfer."""

    def __init__(
        self, array: npt.ArrayLike, dtype: str | None = None, inline: bool = False
    ) -> None:
        self.array = array
        self.dtype = None if dtype is None else dtypes.canonical(dtype)
        self.inline = inline


def typed(array: npt.ArrayLike, dtype: str | None = None, inline: bool = False) -> Typed:
    """`array` sent as attnd dtype `dtype` (when its raw dtype is ambiguous) and/or inline."""
    return Typed(array, dtype, inline)


# An input of an op call: an array (anything np.asarray takes; a torch tensor too), typed(...),
# or a RegionRef.
TensorArg: TypeAlias = npt.ArrayLike | Typed | RegionRef
# An output of an op call: None / False (not requested), True (inline), a writable array to fill
# (or typed(array)), a RegionRef or a Placement.
OutputArg: TypeAlias = npt.ArrayLike | Typed | RegionRef | Placement | bool | None
# Where a decoded output goes: ("view", the object whose memory the daemon wrote) or ("copy",
# the array to copy the inline reply into).
Sink: TypeAlias = tuple[str, Any]


def _is_torch(value: object) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


# DLPack device types (dlpack.h DLDeviceType): kDLCPU, kDLCUDA, kDLCUDAHost.
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST = 1, 2, 3


def is_dlpack(value: object) -> bool:
    """Whether `value` is a DLPack producer that is neither a NumPy array nor a torch tensor."""
    return (
        hasattr(value, "__dlpack__")
        and not isinstance(value, np.ndarray | RegionRef | Typed)
        and not _is_torch(value)
    )


def from_dlpack(name: str, value: Any) -> Any:
    """A NumPy array (CPU memory NumPy can type) or a torch tensor (anything else, when torch is
    installed) sharing the memory of DLPack tensor `value`."""
    device = value.__dlpack_device__()[0] if hasattr(value, "__dlpack_device__") else DLPACK_CPU
    error: Exception | None = None
    if device in (DLPACK_CPU, DLPACK_CUDA_HOST):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            error = e  # e.g. bf16, which NumPy has no dtype for: torch may take it
    try:
        import torch
    except ImportError:
        why = f" ({error})" if error is not None else ""
        raise ValueError(
            f"{name}: a DLPack tensor on device type {device} needs torch to be imported{why}"
        ) from None
    return torch.from_dlpack(value)


def array_address(array: np.ndarray) -> int:
    """The address of an array's first element."""
    return array.__array_interface__["data"][0]


def element_strides(array: np.ndarray, name: str) -> list[int]:
    """The element strides of `array`, or ValueError when its layout cannot be described."""
    item = array.itemsize
    strides = []
    for dim, (size, stride) in enumerate(zip(array.shape, array.strides, strict=True)):
        if size > 1 and (stride < 0 or stride % item):
            raise ValueError(
                f"{name}: stride of dim {dim} is {stride} bytes; want a non-negative "
                f"multiple of {item}"
            )
        strides.append(stride // item if size > 1 else 0)
    # Any order of strides is described; whether the op takes it is the daemon's to say (most
    # tensors need a contiguous last dimension, lse does not: docs/CONTRACTS.md "Strided lse").
    return strides


def _set_layout(
    t: pb.Tensor, dtype: str, shape: Iterable[int], strides: Iterable[int] | None
) -> None:
    t.dtype = dtypes.to_proto(dtype)
    t.shape.extend(int(d) for d in shape)
    if strides is not None:
        t.strides.extend(int(s) for s in strides)


def region_tensor(ref: RegionRef) -> pb.Tensor:
    """The attnd.v1.Tensor that addresses a RegionRef."""
    t = pb.Tensor()
    _set_layout(t, ref.dtype, ref.shape, ref.strides)
    t.region.region = ref.region
    t.region.offset = ref.offset
    return t


def decode_tensor(t: pb.Tensor, values: bool = False) -> np.ndarray | None:
    """An inline reply tensor as a read-only NumPy array of its raw storage dtype (bf16 -> uint16,
    fp8 -> uint8), or with `values` of dtypes.value_dtype (ml_dtypes' bfloat16 / float8_e4m3fn
    when installed); None for a tensor written to a region or absent."""
    if t.WhichOneof("data") != "inline_data":
        return None
    name = dtypes.from_proto(t.dtype)
    raw = _decode_raw(t, dtypes.storage_dtype(name))
    return dtypes.as_values(raw, name) if values else raw


def _decode_raw(t: pb.Tensor, dt: np.dtype) -> np.ndarray:
    shape = tuple(t.shape)
    flat = np.frombuffer(t.inline_data, dtype=dt)
    if 0 in shape:
        return np.empty(shape, dt)
    if not t.strides:
        if flat.size != int(np.prod(shape)):
            raise ValueError(f"reply tensor: {flat.size} elements for shape {shape}")
        return flat.reshape(shape)
    byte_strides = tuple(s * dt.itemsize for s in t.strides)
    span = 1 + sum((d - 1) * s for d, s in zip(shape, t.strides, strict=True))
    if flat.size < span:
        raise ValueError(f"reply tensor: {flat.size} elements for a span of {span}")
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=byte_strides, writeable=False)


def _same_storage(a: str, b: str) -> bool:
    return dtypes.storage_dtype(a) == dtypes.storage_dtype(b)


def _pick(want: str | tuple[str, ...] | None, have: str | None, raw: np.dtype | None) -> str | None:
    """The dtype an argument of attnd dtype `have` (None: a NumPy array of raw dtype `raw`) goes
    as for a field taking `want`: dtypes.field_dtype, else the field's (default) dtype."""
    if want is None:
        return have
    return dtypes.field_dtype(want, have, raw) or (want[0] if isinstance(want, tuple) else want)


class TensorCodec:
    """Turns call arguments into attnd.v1.Tensor messages for one client (or session).

    `find_region(address, nbytes)` -> (region name, region start address) of a registered host
    region containing [address, address + nbytes), or None. `device_region(tensor)` -> RegionRef
    of a CUDA tensor (registers its storage once)."""

    def __init__(
        self,
        find_region: Callable[[int, int], tuple[str, int] | None],
        device_region: Callable[[Any], RegionRef] | None = None,
    ) -> None:
        self._find_region = find_region
        self._device_region = device_region

    def _unwrap(
        self,
        name: str,
        value: TensorArg,
        want: str | tuple[str, ...] | None,
        convert: bool = False,
    ) -> tuple[np.ndarray | RegionRef, str | None, bool]:
        """(NumPy array or RegionRef, attnd dtype, force inline) of an argument. `want` is the
        field's dtype or its alternatives (the default first); the argument goes as the one its
        own dtype names or whose storage it has (dtypes.field_dtype), else the default, unless
        typed() says. With `convert` (an input), a CPU torch bf16 / fp8 tensor going as a dtype
        of other storage is converted by value (through float32), not reinterpreted."""
        dtype, inline = None, False
        if isinstance(value, Typed):
            dtype, inline, value = value.dtype, value.inline, value.array
        if is_dlpack(value):
            value = from_dlpack(name, value)
        if _is_torch(value):
            from . import torch_support

            have = torch_support.attnd_dtype(value.dtype)
            dtype = dtype or _pick(want, have, None)
            if value.is_cuda:
                if self._device_region is None:
                    raise ValueError(f"{name}: CUDA tensors need a client (device regions)")
                ref = self._device_region(value)
                if dtype is not None and dtype != ref.dtype and _same_storage(dtype, ref.dtype):
                    ref = RegionRef(ref.region, dtype, ref.shape, ref.offset, ref.strides)
                return ref, ref.dtype, False
            if convert and have in (dtypes.BF16, dtypes.FP8_E4M3) and dtype is not None:
                if not _same_storage(dtype, have):
                    value = value.float()
            array, _ = torch_support.cpu_numpy(value)
            return array, dtype, inline
        if isinstance(value, RegionRef):
            return value, value.dtype, False
        array = np.asarray(value)
        if dtype is None:
            dtype = _pick(want, dtypes.ml_name(array.dtype), dtypes.as_raw(array).dtype)
        return array, dtype, inline

    def _region_slice(self, name: str, array: np.ndarray, dtype: str) -> RegionRef | None:
        """A RegionRef for an array view inside a registered host region, else None."""
        if array.size == 0:
            return None
        lo = array_address(array)
        span = (
            sum((d - 1) * s for d, s in zip(array.shape, array.strides, strict=True))
            + array.itemsize
        )
        found = self._find_region(lo, span)
        if found is None:
            return None
        region, start = found
        raw = dtypes.storage_dtype(dtype)
        array = dtypes.as_raw(array)
        if array.dtype != raw:
            raise ValueError(
                f"{name}: a region view of {dtype} must hold its raw elements "
                f"({raw}), not {array.dtype}"
            )
        strides = None if array.flags.c_contiguous else element_strides(array, name)
        return RegionRef(region, dtype, array.shape, lo - start, strides)

    def encode_input(
        self, name: str, value: TensorArg, want: str | tuple[str, ...] | None
    ) -> pb.Tensor:
        """The attnd.v1.Tensor of input `name` (`want`: its attnd dtype, or the alternatives the
        field takes, the default first; typed() wins)."""
        value, dtype, inline = self._unwrap(name, value, want, convert=True)
        if isinstance(value, RegionRef):
            return region_tensor(value)
        if dtype is None:
            raise ValueError(f"{name}: dtype unknown; pass typed(array, dtype)")
        if not inline:
            ref = self._region_slice(name, value, dtype)
            if ref is not None:
                return region_tensor(ref)
        raw = dtypes.encode(value, dtype) if value.dtype != dtypes.storage_dtype(dtype) else value
        if dtype == dtypes.I32 and value.dtype.kind in "iu" and value.size:
            if value.min() < -(2**31) or value.max() >= 2**31:
                raise ValueError(f"{name}: values do not fit int32")
        if raw.ndim == 0:
            raise ValueError(f"{name}: a tensor needs rank >= 1 (got a scalar)")
        t = pb.Tensor()
        _set_layout(t, dtype, raw.shape, None)
        t.inline_data = np.ascontiguousarray(raw).tobytes()
        return t

    def encode_output(
        self, name: str, value: OutputArg, want: str
    ) -> tuple[pb.Tensor | None, Sink | None]:
        """(placement Tensor or None, sink): sink is (kind, object) with kind "view" (the output
        lands in that object's memory) or "copy" (copy the inline reply into it), or None."""
        if value is None or value is False:
            return None, None
        if value is True:
            return pb.Tensor(), None
        if isinstance(value, Placement):
            t = pb.Tensor()
            if value.region is not None:
                target = value.region
                t.region.region, t.region.offset = target.region, target.offset
            if value.dtype or value.shape:
                _set_layout(t, value.dtype or want, value.shape or (), value.strides)
            return t, ("view", value.region) if value.region is not None else None
        original = value
        value, unwrapped_dtype, inline = self._unwrap(name, value, want)
        if isinstance(value, RegionRef):
            return region_tensor(value), ("view", original)
        dtype = unwrapped_dtype or want
        raw = dtypes.storage_dtype(dtype)
        if dtypes.as_raw(value).dtype != raw:
            raise ValueError(
                f"{name}: an output array of {dtype} must have dtype {raw}, not {value.dtype}"
            )
        if not inline:
            ref = self._region_slice(name, value, dtype)
            if ref is not None:
                return region_tensor(ref), ("view", original)
        if not value.flags.writeable:
            raise ValueError(f"{name}: the output array is read-only")
        t = pb.Tensor()
        _set_layout(t, dtype, value.shape, None)
        return t, ("copy", value)
