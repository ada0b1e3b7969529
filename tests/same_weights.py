"""Fails unless two checkpoints hold the same parameters to a relative tolerance: every
layer_<i>.pt of the first is in the second, with the same tensor blobs (by name in the archive)
equal as float32 to `tol` x the largest magnitude of each tensor.

    python3 tests/same_weights.py DIR_A DIR_B [TOL]      # TOL default 1e-5
"""
import pathlib
import sys
import zipfile

import numpy as np


def blobs(path):
    with zipfile.ZipFile(path) as archive:
        return {name.split("/data/", 1)[1]: np.frombuffer(archive.read(name), dtype=np.float32)
                for name in archive.namelist() if "/data/" in name}


def main():
    first, second = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    layers = sorted(first.glob("layer_*.pt"))
    if not layers:
        sys.exit(f"no layer files in {first}")
    worst = 0.0
    for path in layers:
        a, b = blobs(path), blobs(second / path.name)
        if a.keys() != b.keys():
            sys.exit(f"{path.name}: the tensors differ: {sorted(a)} vs {sorted(b)}")
        for name in a:
            scale = max(float(np.abs(a[name]).max(initial=0)), 1e-12)
            worst = max(worst, float(np.abs(a[name] - b[name]).max(initial=0)) / scale)
    print(f"{len(layers)} layers, largest relative difference {worst:.2e}")
    sys.exit(0 if worst <= tol else 1)


main()
