"""Prints a digest of each optimizer state file of a checkpoint (optim_<i>.pt) that two runs
with the same state share: LibTorch names the file's entries by the addresses of the tensors
they belong to, which change from run to run, and orders its tensor blobs by them; the sorted
checksums of the blobs do not.

    python3 scripts/optim_state_digest.py ckpt/optim_*.pt
"""
import hashlib
import sys
import zipfile

for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as archive:
        blobs = sorted(hashlib.sha256(archive.read(name)).hexdigest()
                       for name in archive.namelist() if "/data/" in name)
    digest = hashlib.sha256("".join(blobs).encode()).hexdigest()
    print(f"{digest[:16]}  {path} ({len(blobs)} tensors)")
