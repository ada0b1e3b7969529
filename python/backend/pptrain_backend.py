"""pptrain's build backend for pip (PEP 517 and PEP 660), named by pyproject.toml.

`pip install .` (or `pip install -e .`) builds pptrain against the torch of the environment it
installs into, the way torch extensions are built: pip runs this backend with that environment's
interpreter, hiding its packages (build isolation); the backend asks the same interpreter, with
its packages visible again, where its torch is, and hands it to CMake as PPTRAIN_PYTHON. So the
extension modules link that torch's libraries and the `pptrain` command (with pptrain-runtime
beside it) comes with them. The CMake tree is build-pip/ in the source folder, kept between
installs, so that a second `pip install .` rebuilds only what changed.

A wheel made here runs only in the environment it was built for (it links that torch by path,
and its metadata pins that torch's version); that is what `pip install .` asks for.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
NAME = "pptrain"
TARGETS = ["pptrain", "pptrain-runtime", "pptrain_python_plan", "pptrain_python_runtime"]


class BuildError(RuntimeError):
    pass


def _version() -> str:
    text = (SOURCE / "CMakeLists.txt").read_text()
    found = re.search(r"project\(pptrain VERSION ([0-9.]+)", text)
    if not found:
        raise BuildError("pptrain: CMakeLists.txt names no project version")
    return found.group(1)


def _target_environment() -> dict[str, str]:
    """The environment variables under which the interpreter sees its own packages again."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONNOUSERSITE"):
        env.pop(name, None)
    return env


def _target_torch() -> str:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, env=_target_environment())
    if probe.returncode != 0:
        raise BuildError(f"pptrain: {sys.executable} has no torch to build against; install "
                         "torch first (pip install torch), then pip install pptrain")
    return probe.stdout.strip()


def _build_tree() -> Path:
    tag = sys.implementation.cache_tag
    return SOURCE / "build-pip" / tag


def _cmake_build() -> Path:
    tree = _build_tree()
    configure = ["cmake", "-S", str(SOURCE), "-B", str(tree), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPPTRAIN_PYTHON={sys.executable}", "-DPPTRAIN_BUILD_TESTS=OFF"]
    jobs = str(os.cpu_count() or 1)
    build = ["cmake", "--build", str(tree), "-j", jobs, "--target", *TARGETS]
    env = _target_environment()
    for command in (configure, build):
        print("pptrain:", " ".join(command), file=sys.stderr)
        if subprocess.run(command, env=env, stdout=sys.stderr).returncode != 0:
            raise BuildError(f"pptrain: `{' '.join(command)}` failed (its output is above)")
    return tree


def _wheel_tag() -> str:
    interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = interpreter + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{interpreter}-{abi}-{platform}"


def _public(version: str) -> str:
    return version.split("+")[0]


def _metadata(torch_version: str) -> str:
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        "Summary: Pipeline-parallel training of deep networks on LibTorch",
        "Requires-Python: >=3.9",
        # The extension links this torch's C++ symbols: another torch needs another build.
        f"Requires-Dist: torch=={_public(torch_version)}",
        "",
    ])


class _Wheel:
    """A wheel being written: files under their archive names, then RECORD."""

    def __init__(self, directory: str, tag: str) -> None:
        self.dist_info = f"{NAME}-{_version()}.dist-info"
        self.data = f"{NAME}-{_version()}.data"
        self.name = f"{NAME}-{_version()}-{tag}.whl"
        self.path = Path(directory) / self.name
        self.zip = zipfile.ZipFile(self.path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records: list[str] = []

    def add(self, archive_name: str, content: bytes, executable: bool = False) -> None:
        info = zipfile.ZipInfo(archive_name, date_time=(2026, 1, 1, 0, 0, 0))
        # A regular file's mode: pip makes an installed script executable only when its entry
        # says it is a regular file with an execute bit.
        info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, content)
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
        self.records.append(f"{archive_name},sha256={digest.decode()},{len(content)}")

    def close(self, tag: str, torch_version: str) -> str:
        self.add(f"{self.dist_info}/METADATA", _metadata(torch_version).encode())
        wheel = f"Wheel-Version: 1.0\nGenerator: pptrain_backend\nRoot-Is-Purelib: false\nTag: {tag}\n"
        self.add(f"{self.dist_info}/WHEEL", wheel.encode())
        record = f"{self.dist_info}/RECORD"
        self.zip.writestr(record, "\n".join(self.records + [f"{record},,"]) + "\n")
        self.zip.close()
        return self.name


def _package_files(tree: Path) -> list[Path]:
    package = tree / "python" / NAME
    return sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    torch_version = _target_torch()
    tree = _cmake_build()
    tag = _wheel_tag()
    wheel = _Wheel(wheel_directory, tag)
    for path in _package_files(tree):
        relative = path.relative_to(tree / "python")
        wheel.add(relative.as_posix(), path.read_bytes())
    for program in ("pptrain", "pptrain-runtime"):
        binary = tree / "tools" / "pptrain" / program
        wheel.add(f"{wheel.data}/scripts/{program}", binary.read_bytes(), executable=True)
    return wheel.close(tag, torch_version)


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """The package from the build tree (build-pip/), through a .pth file; the commands are
    wrappers that run the build tree's programs, so a rebuild there is what runs."""
    torch_version = _target_torch()
    tree = _cmake_build()
    tag = _wheel_tag()
    wheel = _Wheel(wheel_directory, tag)
    wheel.add(f"__editable__.{NAME}.pth", (str(tree / "python") + "\n").encode())
    program = tree / "tools" / "pptrain" / "pptrain"
    wrapper = f"#!/bin/sh\nexec '{program}' \"$@\"\n"
    wheel.add(f"{wheel.data}/scripts/pptrain", wrapper.encode(), executable=True)
    return wheel.close(tag, torch_version)


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []  # CMake and the compilers come from the system, torch from the environment


get_requires_for_build_editable = get_requires_for_build_wheel
get_requires_for_build_sdist = get_requires_for_build_wheel


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    """The tracked source files (git ls-files), under pptrain-VERSION/."""
    listed = subprocess.run(["git", "-C", str(SOURCE), "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        raise BuildError("pptrain: an sdist is made from a git checkout (git ls-files failed)")
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as archive:
        for relative in listed.stdout.decode().split("\0"):
            if relative and (SOURCE / relative).is_file():
                archive.add(SOURCE / relative, arcname=f"{base}/{relative}")
        pkg_info = _metadata("0").replace("Requires-Dist: torch==0\n", "Requires-Dist: torch\n")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info.encode())
        archive.addfile(info, io.BytesIO(pkg_info.encode()))
    return name
