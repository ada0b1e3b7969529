"""pptrain: pipeline-parallel training for PyTorch models (docs/PYTHON.md).

The runtime's names (PipelineStage, schedule, split, world, placement, Linear, train) load torch
on first use, so that a module which only plans (pptrain.plan) never imports it.

Importing pptrain before torch lets it choose OpenBLAS's kernels for this CPU (as `pptrain train`
does: the best set the CPU runs that computes a product right here; PPTRAIN_BLAS=system keeps
OpenBLAS's own choice, and an OPENBLAS_CORETYPE of yours is kept). OpenBLAS reads the choice once,
as torch loads it: imported after torch, pptrain says in one line how to get them when they
differ.
"""

import os as _os
import sys as _sys
from typing import Any as _Any

_RUNTIME_NAMES = {"world", "placement", "split", "PipelineStage", "Schedule", "schedule",
                  "PipelineError", "Linear", "train", "TrainingFailed"}


def __getattr__(name: str) -> _Any:
    if name in _RUNTIME_NAMES:
        from . import runtime
        return getattr(runtime, name)
    raise AttributeError(f"module 'pptrain' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _RUNTIME_NAMES)


def _choose_blas_kernels() -> None:
    from . import _plan
    if "torch" in _sys.modules or _plan.openblas_loaded():
        warning = _plan.blas_warning_after_load()
        if warning:
            print(f"pptrain: warning: {warning}", file=_sys.stderr)
        return
    unset, assigned, line = _plan.choose_blas_kernels()
    for name in unset:
        _os.environ.pop(name, None)
    _os.environ.update(assigned)
    if line:
        print(f"pptrain: {line}", file=_sys.stderr)


_choose_blas_kernels()
