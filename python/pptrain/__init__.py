"""pptrain: pipeline-parallel training for PyTorch models (docs/PYTHON.md).

The runtime's names (PipelineStage, schedule, split, world, placement, Linear, train) load torch
on first use, so that a module which only plans (pptrain.plan) never imports it.
"""

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

