#!/usr/bin/env python3
"""List-scheduling model of the Hopper MLA prefill kernel's item order (docs/KERNELS.md
"MLA prefill on Hopper", "Work").

One causal sequence of T tokens, H heads, 128-query items over 128-key tiles: query tile t
(0-based) reads t + 1 key tiles, the diagonal one half masked (counted as half a tile). Persistent
CTAs take items in order, each the next item when it finishes its last (greedy list scheduling);
the model prints the makespan over the ideal (total work / CTAs) for head groups of each size,
heads in order being group size 1. It models no per-item cost, no L2 and no memory system.

    python3 bench/prefill_order_model.py --tokens 4096 8192 --heads 128 --ctas 132
"""

import argparse
import heapq


def items(tokens: int, heads: int, group: int) -> list[float]:
    """Item costs in tile units in the kernel's order for head groups of `group`."""
    tiles = tokens // 128
    widths = [heads % group] if heads % group else []
    widths += [group] * (heads // group)
    out = []
    for width in widths:
        for slot in range(tiles):
            t = tiles - 1 - slot  # the heaviest query tile first
            out += [t + 0.5] * width
    return out


def makespan_over_ideal(costs: list[float], ctas: int) -> float:
    finish = [0.0] * ctas
    for c in costs:
        heapq.heappush(finish, heapq.heappop(finish) + c)
    return max(finish) / (sum(costs) / ctas)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8, 9, 16])
    args = ap.parse_args()
    for tokens in args.tokens:
        row = ", ".join(
            f"{g}: {100 * (makespan_over_ideal(items(tokens, args.heads, g), args.ctas) - 1):.2f} %"
            for g in args.groups
        )
        print(f"T {tokens} H {args.heads}, {args.ctas} CTAs, makespan over ideal by group: {row}")


if __name__ == "__main__":
    main()
