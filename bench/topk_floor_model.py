#!/usr/bin/env python3
"""A CPU model of the threshold-filter top-k's sampled, refined floor (docs/KERNELS.md "Top-k,
threshold filter"; kernels/topk/gpu/filter.cu, filter_plan.h): for the bench's prefill preset
(4096 causal rows over 32768 columns, N(0, 1) logits, k 2048, 256-thread CTAs with their
4608-entry buffer) it counts the rows whose floor admits fewer than k logits (the kernel's exact
path, which re-reads the window) or more than the buffer holds, at each floor margin. The same
arithmetic as the kernel: the sample is each thread's first 16-byte group (the window's first
4 * threads columns), FloorRank's rank in f32, the level-0 bin of the sample holding that rank,
then the level-1 bin inside it, the floor at that bin's lower edge; keys are the radix sign-flip
map. Only the draw differs (numpy's generator, not the bench's device fill).
    /work/venv-torch/bin/python bench/topk_floor_model.py [--seeds 1 2 3] [--sigmas 3 4]
Prints a line per seed and margin (docs/BENCHMARKS.md "Top-k: the floor's margin").
"""

import argparse

import numpy as np


def keys_of(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32)
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def floor_rank(k: int, sample: int, length: int, sigmas: float) -> int:
    mean = np.float32(k) * (np.float32(sample) / np.float32(length))
    rank = mean + np.float32(sigmas) * np.sqrt(mean, dtype=np.float32) + np.float32(2)
    return 0 if rank >= sample else int(rank) + 1


def holding_bin(hist: np.ndarray, need: int) -> tuple[int, int]:
    """The bin holding rank `need` counted from the top, and the count above it."""
    above = 0
    for b in range(len(hist) - 1, -1, -1):
        if above + int(hist[b]) >= need:
            return b, above
        above += int(hist[b])
    raise ValueError("rank past the sample")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=32768)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--threads", type=int, default=256)
    p.add_argument("--capacity", type=int, default=4608)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--sigmas", type=float, nargs="+", default=[3.0, 4.0])
    a = p.parse_args()
    for seed in a.seeds:
        rng = np.random.default_rng(seed)
        admitted = {s: [] for s in a.sigmas}
        for r in range(a.rows):
            length = a.cols - a.rows + r + 1  # causal: the last rows of the context
            keys = keys_of(rng.standard_normal(length, dtype=np.float32))
            sample = keys[: 4 * a.threads]
            for s in a.sigmas:
                rank = floor_rank(a.k, len(sample), length, s)
                if rank == 0:
                    admitted[s].append(length)
                    continue
                b0, above = holding_bin(np.bincount(sample >> 21, minlength=2048), rank)
                inside = sample[(sample >> 21) == b0]
                b1, _ = holding_bin(
                    np.bincount((inside >> 10) & 0x7FF, minlength=2048), rank - above
                )
                floor_key = (b0 << 21) | (b1 << 10)
                admitted[s].append(int(np.count_nonzero(keys >= floor_key)))
        for s in a.sigmas:
            n = np.array(admitted[s])
            print(
                f"seed {seed} sigma {s:g}: {int((n < a.k).sum())} of {a.rows} rows below k "
                f"(exact path), {int((n > a.capacity).sum())} past the buffer; admitted mean "
                f"{n.mean():.0f}, min {n.min()}, max {n.max()}"
            )


if __name__ == "__main__":
    main()
