#!/usr/bin/env python3
"""NumPy cross-check of attnd's fp64 references: an oracle nobody here wrote.

Runs attn_numpy_dump into a temporary folder (every registered op writes small random cases:
inputs plus attnd's fp64 reference outputs), then recomputes each case with the op's module in
ops/<op>.py and compares. Usage: crosscheck.py <path to attn_numpy_dump>
"""

import importlib.util
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402


def load_op(op):
    spec = importlib.util.spec_from_file_location(f"ops_{op}", HERE / "ops" / f"{op}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    dumper = sys.argv[1]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([dumper, tmp], check=True)
        cases = sorted(p for p in pathlib.Path(tmp).iterdir() if p.is_dir())
        if not cases:
            print("no cases were dumped")
            return 1
        for case in cases:
            meta = json.loads((case / "case.json").read_text())
            inputs = {
                name: common.decode(np.load(case / f"{name}.npy"), dtype)
                for name, dtype in meta["tensors"].items()
            }
            refs = {name: np.load(case / f"ref_{name}.npy") for name in meta["refs"]}
            try:
                load_op(meta["op"]).check(inputs, meta["scalars"], refs)
                passed += 1
                print(f"PASS {case.name}")
            except AssertionError as e:
                failed += 1
                print(f"FAIL {case.name}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
