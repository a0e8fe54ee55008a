"""fp8 e4m3fn and bf16 decoding: attnd's table against the hand decoders in common.py."""

import numpy as np


def check(inputs, scalars, refs):
    del scalars
    for name in ("fp8", "bf16"):
        got, ref = inputs[name], refs[name]
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(got), nan), f"{name}: NaN encodings differ"
        assert np.array_equal(got[~nan], ref[~nan]), f"{name}: decoded values differ"
