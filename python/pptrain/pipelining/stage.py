"""torch.distributed.pipelining.stage over pptrain: PipelineStage, build_stage, and how this
process joins pptrain's runtime beside the program's own torch.distributed process group.

pptrain's runtime talks over its own transport (a c10d group of the C++ library), which meets
through a TCPStore of its own. torch's default group, made by the program's
`dist.init_process_group("gloo")`, already serves MASTER_PORT on rank 0, so pptrain's store goes
to another port: rank 0 takes a free one, serves it (under torchrun too, whose agent serves
MASTER_PORT) and tells the others over torch's group (broadcast_object_list). A program that
made no group gets one from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
without RANK and without a group, the world is this one process.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist

from .. import runtime as _pptrain

__all__ = ["PipelineStage", "build_stage"]

_ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
_joined = None  # (rank, size) once this process has joined pptrain's runtime


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _join_world() -> tuple[int, int]:
    """(rank, size): joins pptrain's runtime once, with torch's default group as the world."""
    global _joined
    if _joined is not None:
        return _joined
    if not dist.is_initialized() and "RANK" in os.environ:
        dist.init_process_group("gloo")
    saved = {name: os.environ.get(name) for name in _ENVIRONMENT}
    try:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            os.environ.pop("RANK", None)  # pptrain's world of one process: no rendezvous
        else:
            rank, size = dist.get_rank(), dist.get_world_size()
            # MASTER_ADDR is where rank 0 runs; a group made without it (tcp://, file://)
            # meets at rank 0's host name.
            where = [os.environ.get("MASTER_ADDR") or socket.gethostname(), _free_port()]
            dist.broadcast_object_list(where, src=0)
            # That store is rank 0's, not torchrun's agent's (which serves MASTER_PORT).
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR=where[0],
                              MASTER_PORT=str(where[1]), TORCHELASTIC_USE_AGENT_STORE="False")
        _joined = _pptrain.world()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return _joined


def _check_device(device, where):
    if device is None:
        return torch.device("cpu")
    device = torch.device(device)
    if device.type != "cpu":
        raise ValueError(f"{where}: device {device} is not supported: pptrain's runtime runs "
                         "on the CPU; give device='cpu'")
    return device


def _check_group(group, where):
    """The process group a stage may take: torch's default one (or None)."""
    if group is None:
        return
    if dist.get_world_size(group) != dist.get_world_size():
        raise NotImplementedError(
            f"{where}: group of {dist.get_world_size(group)} ranks: pptrain's pipeline spans "
            f"every rank of the default group ({dist.get_world_size()}); give group=None")


class PipelineStage(_pptrain.PipelineStage):
    """torch.distributed.pipelining.PipelineStage: stage `stage_index` of `num_stages`, run by
    `submodule` on this rank. A pptrain.PipelineStage too, so pptrain.schedule() takes it.

    input_args and output_args (example tensors) are not needed: every message carries its
    tensors' shapes, which may change from batch to batch."""

    def __init__(self, submodule: torch.nn.Module, stage_index: int, num_stages: int,
                 device: Union[str, torch.device, None], input_args: Any = None,
                 output_args: Any = None, group: Optional[dist.ProcessGroup] = None,
                 dw_builder: Optional[Callable[[], Callable[..., None]]] = None) -> None:
        where = f"PipelineStage(stage_index={stage_index})"
        if not isinstance(submodule, torch.nn.Module):
            raise TypeError(f"{where}: submodule must be a torch.nn.Module, got "
                            f"{type(submodule).__name__}")
        if not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"{where}: num_stages must be a whole number >= 1, got {num_stages!r}")
        if not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index!r} is not in 0..{num_stages - 1} "
                             f"(num_stages={num_stages})")
        if dw_builder is not None:
            raise NotImplementedError(
                f"{where}: dw_builder is not supported: pptrain splits a backward into its "
                "input and weight parts itself (the linear products' weight gradients wait for "
                "W); give dw_builder=None")
        self.device = _check_device(device, where)
        _check_group(group, where)
        self.group_rank, self.group_size = _join_world()
        super().__init__(submodule, stage_index, num_stages)
        self.submod = submodule
        self.stage_index = stage_index
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1


def build_stage(stage_module: torch.nn.Module, stage_index: int, pipe_info: Any,
                device: Union[str, torch.device, None],
                group: Optional[dist.ProcessGroup] = None) -> PipelineStage:
    """A stage of a model split by pipeline(): `stage_module` is pipe.get_stage_module(i) and
    `pipe_info` pipe.info()."""
    return PipelineStage(stage_module, stage_index, pipe_info.num_stages, device, group=group)
