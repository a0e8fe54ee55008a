"""Hand-written decoders for the NumPy cross-check: nothing here shares code with attnd.

bf16: the upper 16 bits of an IEEE f32. fp8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa
bits, subnormals at exponent 0, S.1111.111 is NaN, no infinities (OCP spec).
"""

import numpy as np


def bf16_to_f64(u16):
    u32 = np.asarray(u16, dtype=np.uint32) << np.uint32(16)
    return u32.view(np.float32).astype(np.float64)


def fp8_e4m3_to_f64(u8):
    c = np.asarray(u8, dtype=np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = (c & 0x7).astype(np.float64)
    normal = np.ldexp(1.0 + man / 8.0, (exp - 7).astype(np.int32))
    sub = np.ldexp(man / 8.0, -6)
    mag = np.where(exp == 0, sub, normal)
    mag = np.where((exp == 0xF) & ((c & 0x7) == 0x7), np.nan, mag)
    return sign * mag


def decode(array, dtype):
    if dtype == "bf16":
        return bf16_to_f64(array)
    if dtype == "fp8_e4m3":
        return fp8_e4m3_to_f64(array)
    if dtype == "f32":
        return np.asarray(array, dtype=np.float64)
    return np.asarray(array)  # integers and raw bytes stay as they are


def assert_close(name, got, ref, rtol=1e-9, atol=1e-9):
    """fp64 against fp64: only summation order differs. Infinities must match exactly."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} vs reference {ref.shape}"
    inf_ref = np.isinf(ref)
    assert np.array_equal(np.isinf(got), inf_ref), f"{name}: infinities differ"
    assert np.array_equal(got[inf_ref], ref[inf_ref]), f"{name}: infinity signs differ"
    assert not np.isnan(ref).any(), f"{name}: reference has NaN"
    finite = ~inf_ref
    err = np.abs(got[finite] - ref[finite])
    bound = atol + rtol * np.abs(ref[finite])
    if err.size and not (err <= bound).all():
        i = int(np.argmax(err - bound))
        raise AssertionError(
            f"{name}: max excess at {i}: numpy {got[finite][i]!r} reference {ref[finite][i]!r}"
        )
