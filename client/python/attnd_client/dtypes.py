"""Element types of attnd tensors and hand-written bf16 / fp8 e4m3fn codecs for NumPy.

NumPy has no bf16 or fp8 dtype: attnd_client carries bf16 as uint16 arrays (the upper half of an
IEEE f32) and fp8 e4m3fn as uint8 arrays (OCP e4m3fn: bias 7, no infinities, S.1111.111 = NaN).
When ml_dtypes is installed, arrays of ml_dtypes.bfloat16 / float8_e4m3fn are taken as they are
(their bits are the same) and replies come back as such arrays (value_dtype, as_values).

    q_bf16 = to_bf16(np.random.randn(4, 16, 576))  # uint16, round to nearest even
    q_f32 = from_bf16(q_bf16)
    k_fp8 = to_fp8_e4m3(x)            # uint8, nearest even, saturating at +-448 (like the kernels)
"""

import importlib
from types import ModuleType

import numpy as np
import numpy.typing as npt

from . import _proto

# attnd dtype names (kernels::DTypeName) -> (proto enum, NumPy storage dtype, bytes per element).
F32 = "f32"
BF16 = "bf16"
FP8_E4M3 = "fp8_e4m3"
I32 = "i32"
U8 = "u8"

_TABLE: dict[str, tuple[int, np.dtype]] = {
    F32: (_proto.pb.DTYPE_F32, np.dtype(np.float32)),
    BF16: (_proto.pb.DTYPE_BF16, np.dtype(np.uint16)),
    FP8_E4M3: (_proto.pb.DTYPE_FP8_E4M3, np.dtype(np.uint8)),
    I32: (_proto.pb.DTYPE_I32, np.dtype(np.int32)),
    U8: (_proto.pb.DTYPE_U8, np.dtype(np.uint8)),
}
_BY_PROTO = {proto: name for name, (proto, _) in _TABLE.items()}
_ALIASES = {"fp8": FP8_E4M3, "float32": F32, "int32": I32, "uint8": U8, "bfloat16": BF16}

FP8_E4M3_MAX = 448.0


def canonical(name: str) -> str:
    """The attnd name of a dtype given by name or alias ("fp8" -> "fp8_e4m3")."""
    name = _ALIASES.get(name, name)
    if name not in _TABLE:
        raise ValueError(f"unknown attnd dtype {name!r}; want one of {sorted(_TABLE)}")
    return name


def to_proto(name: str) -> int:
    """The attnd.v1.DType enum value of an attnd dtype name."""
    return _TABLE[canonical(name)][0]


def from_proto(proto_dtype: int) -> str:
    """The attnd dtype name of an attnd.v1.DType enum value."""
    try:
        return _BY_PROTO[proto_dtype]
    except KeyError:
        raise ValueError(f"unknown attnd.v1.DType {proto_dtype}") from None


def storage_dtype(name: str) -> np.dtype:
    """The NumPy dtype that holds the raw elements of an attnd dtype."""
    return _TABLE[canonical(name)][1]


def itemsize(name: str) -> int:
    """Bytes per element of an attnd dtype."""
    return storage_dtype(name).itemsize


def field_dtype(
    want: str | tuple[str, ...], have: str | None, raw: np.dtype | None = None
) -> str | None:
    """The attnd dtype a tensor goes as for a field taking `want` (one dtype, or alternatives):
    its own attnd dtype `have` when the field takes it, else the field's first dtype with the
    same storage as the tensor (`raw`, by default storage_dtype(have)): a uint8 tensor for an
    fp8 field, a float8_e4m3fn one for a u8 field, its bits as they are. None when neither."""
    choices = want if isinstance(want, tuple) else (want,)
    if have is not None and have in choices:
        return have
    if raw is None and have is not None:
        raw = storage_dtype(have)
    for choice in choices:
        if raw is not None and storage_dtype(choice) == raw:
            return choice
    return None


# ---- ml_dtypes (optional) ----


def _load_ml_dtypes() -> ModuleType | None:
    try:
        return importlib.import_module("ml_dtypes")
    except ImportError:
        return None


ml_dtypes = _load_ml_dtypes()  # the module, or None when it is not installed
# NumPy dtype of the values (ml_dtypes) -> attnd dtype whose raw bits it holds.
_ML: dict[np.dtype, str] = (
    {}
    if ml_dtypes is None
    else {np.dtype(ml_dtypes.bfloat16): BF16, np.dtype(ml_dtypes.float8_e4m3fn): FP8_E4M3}
)


def ml_name(dtype: npt.DTypeLike) -> str | None:
    """The attnd dtype of an ml_dtypes dtype (bfloat16 -> "bf16", float8_e4m3fn -> "fp8_e4m3"),
    None for any other dtype."""
    return _ML.get(np.dtype(dtype)) if _ML else None


def value_dtype(name: str) -> np.dtype:
    """The NumPy dtype replies of attnd dtype `name` come back as: ml_dtypes.bfloat16 /
    float8_e4m3fn when ml_dtypes is installed, else the raw storage dtype."""
    for dt, attnd in _ML.items():
        if attnd == canonical(name):
            return dt
    return storage_dtype(name)


def as_raw(array: np.ndarray) -> np.ndarray:
    """An ml_dtypes bf16 / fp8 array as a view of its raw bits (uint16 / uint8); others as they
    are."""
    name = ml_name(array.dtype)
    return array if name is None else array.view(storage_dtype(name))


def as_values(raw: np.ndarray, name: str) -> np.ndarray:
    """A raw-storage array of attnd dtype `name` viewed as value_dtype(name) (no copy)."""
    dt = value_dtype(name)
    return raw if raw.dtype == dt else raw.view(dt)


# ---- bf16 ----


def to_bf16(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float array -> bf16 bits (uint16), rounding to nearest even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (u >> np.uint32(16)) | np.uint32(0x40)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def from_bf16(bits: npt.ArrayLike, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """bf16 bits (uint16) -> float array (f32 exactly, or dtype)."""
    u = as_raw(np.asarray(bits)).astype(np.uint16).astype(np.uint32) << np.uint32(16)
    return u.view(np.float32).astype(dtype, copy=False)


# ---- fp8 e4m3fn ----


def _fp8_table() -> npt.NDArray[np.float64]:
    c = np.arange(256, dtype=np.int64)
    exponent = (c >> 3) & 0xF
    mantissa = (c & 0x7).astype(np.float64)
    normal = np.ldexp(1.0 + mantissa / 8.0, (exponent - 7).astype(np.int32))
    subnormal = mantissa / 512.0
    value = np.where(exponent == 0, subnormal, normal)
    value = np.where((exponent == 0xF) & ((c & 0x7) == 0x7), np.nan, value)
    return np.where(c & 0x80, -value, value)


_FP8_DECODE = _fp8_table()


def from_fp8_e4m3(bits: npt.ArrayLike, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """fp8 e4m3fn bits (uint8) -> float array (exact)."""
    return _FP8_DECODE[as_raw(np.asarray(bits)).astype(np.uint8)].astype(dtype)


def to_fp8_e4m3(x: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """float array -> fp8 e4m3fn bits (uint8): nearest even; finite overflow and +-inf saturate to
    +-448; NaN -> S.1111.111."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    sign = ((u >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    a = u & np.uint32(0x7FFFFFFF)
    # Normal range of e4m3 (>= 2^-6): keep 3 mantissa bits, round half to even, rebias 127 -> 7.
    keep = (a + np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
    normal = (keep.astype(np.int64) - ((127 - 7) << 3)).clip(0, 0x7E).astype(np.uint8)
    # Subnormals: multiples of 2^-9 (np.rint rounds half to even; 8 is the smallest normal).
    small = a < np.uint32(0x3C800000)
    magnitude = np.where(small, a, np.uint32(0)).view(np.float32)
    sub = np.rint(magnitude * np.float32(512.0)).astype(np.uint8)
    code = np.where(small, sub, normal)
    code = np.where(a >= np.uint32(0x43E00000), np.uint8(0x7E), code)
    code = np.where(a > np.uint32(0x7F800000), np.uint8(0x7F), code)
    return (code | sign).astype(np.uint8)


def encode(x: npt.ArrayLike, name: str) -> np.ndarray:
    """A float (or already raw) array as the raw storage of attnd dtype `name`."""
    name = canonical(name)
    x = np.asarray(x)
    if ml_name(x.dtype) == name:
        return as_raw(x)
    if name == BF16:
        return x.astype(np.uint16, copy=False) if x.dtype == np.uint16 else to_bf16(x)
    if name == FP8_E4M3:
        return x.astype(np.uint8, copy=False) if x.dtype == np.uint8 else to_fp8_e4m3(x)
    return x.astype(storage_dtype(name), copy=False)


def decode(raw: npt.ArrayLike, name: str, dtype: npt.DTypeLike = np.float64) -> np.ndarray:
    """The values of raw storage of attnd dtype `name` (floats as `dtype`, integers as they are)."""
    name = canonical(name)
    if name == BF16:
        return from_bf16(raw, dtype)
    if name == FP8_E4M3:
        return from_fp8_e4m3(raw, dtype)
    if name == F32:
        return np.asarray(raw).astype(dtype)
    return np.asarray(raw)
