"""attnd_client.dtypes: bf16 and fp8 e4m3fn codecs against brute-force nearest-value searches
over hand-built value tables (round to nearest, ties to even; fp8 saturates at +-448)."""

import numpy as np
import pytest

from attnd_client import dtypes

# fp8 e4m3fn values written out from the OCP spec: code -> value.
FP8_KNOWN = {
    0x00: 0.0,
    0x01: 2.0**-9,
    0x07: 7 * 2.0**-9,
    0x08: 2.0**-6,
    0x38: 1.0,
    0x39: 1.125,
    0x40: 2.0,
    0x7E: 448.0,
    0x77: 240.0,
    0x80: -0.0,
    0xB8: -1.0,
    0xFE: -448.0,
}


def test_fp8_decode_known_values():
    for code, value in FP8_KNOWN.items():
        assert dtypes.from_fp8_e4m3(np.uint8(code), np.float64) == value, hex(code)
    assert np.isnan(dtypes.from_fp8_e4m3(np.array([0x7F, 0xFF], np.uint8))).all()
    finite = dtypes.from_fp8_e4m3(np.arange(256, dtype=np.uint8), np.float64)
    assert np.isfinite(finite).sum() == 254


def _nearest_even(x, codes, values):
    """Brute force: the code whose value is nearest to x; ties to the even code."""
    d = np.abs(values[None, :] - x[:, None])
    best = d.min(axis=1, keepdims=True)
    tied = d == best
    pick = np.where(tied & (codes[None, :] % 2 == 0), codes[None, :], 10**6).min(axis=1)
    first = np.where(tied, codes[None, :], 10**6).min(axis=1)
    return np.where(tied.sum(axis=1) > 1, pick, first)


def test_fp8_encode_is_nearest_even_and_saturates():
    rng = np.random.default_rng(7)
    codes = np.arange(0x00, 0x7F)  # non-negative finite codes
    values = dtypes.from_fp8_e4m3(codes.astype(np.uint8), np.float64)
    mags = np.concatenate(
        [
            rng.uniform(0, 460, 20000),
            2.0 ** rng.uniform(-12, 9, 20000),
            values,
            (values[1:] + values[:-1]) / 2,
        ]
    )  # exact ties included
    mags = mags.astype(np.float32).astype(np.float64)
    want = _nearest_even(np.minimum(mags, 448.0), codes, values)
    got = dtypes.to_fp8_e4m3(mags)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (mags[bad[:5]], got[bad[:5]], want[bad[:5]])
    assert (dtypes.to_fp8_e4m3(-mags) == (want | 0x80)).all()
    assert list(dtypes.to_fp8_e4m3(np.array([np.inf, -np.inf, 1e9, 465.0]))) == [
        0x7E,
        0xFE,
        0x7E,
        0x7E,
    ]
    assert dtypes.to_fp8_e4m3(np.array([np.nan]))[0] & 0x7F == 0x7F


def test_bf16_round_trip_is_nearest_even():
    rng = np.random.default_rng(8)
    x = np.concatenate(
        [
            rng.standard_normal(50000) * 10.0 ** rng.integers(-30, 30, 50000),
            [0.0, -0.0, 1.0, 65504.0, 3.0e38],
        ]
    ).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    lo, hi = bits >> 16, (bits >> 16) + 1

    def to_f(b):
        return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    dl, dh = np.abs(x - to_f(lo)), np.abs(to_f(hi) - x)
    want = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    got = dtypes.to_bf16(x)
    assert (got == want.astype(np.uint16)).all()
    assert (dtypes.from_bf16(got) == to_f(want)).all()
    nan = dtypes.to_bf16(np.array([np.nan], np.float32))
    assert np.isnan(dtypes.from_bf16(nan)).all()
    assert dtypes.to_bf16(np.array([np.inf], np.float32))[0] == 0x7F80


def test_dtype_table():
    assert dtypes.canonical("fp8") == "fp8_e4m3"
    assert dtypes.itemsize("bf16") == 2 and dtypes.itemsize("f32") == 4
    for name in ["f32", "bf16", "fp8_e4m3", "i32", "u8"]:
        assert dtypes.from_proto(dtypes.to_proto(name)) == name
    with pytest.raises(ValueError):
        dtypes.canonical("f16")
    raw = np.array([1, 2], np.uint16)
    assert dtypes.encode(raw, "bf16") is raw or (dtypes.encode(raw, "bf16") == raw).all()
    assert (dtypes.encode(np.array([1.0, 2.0]), "bf16") == [0x3F80, 0x4000]).all()
