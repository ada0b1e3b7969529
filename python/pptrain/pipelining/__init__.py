"""torch.distributed.pipelining's API over pptrain's runtime (docs/PYTHON.md, "torch's
pipelining API"): a program written for torch's pipelining runs on pptrain's runtime when its
import line names pptrain.pipelining instead, with the names and signatures of the torch
installed (python/tests/test_pipelining_names.py compares them).

    import torch.distributed as dist
    from pptrain.pipelining import pipeline, SplitPoint, ScheduleGPipe

    dist.init_process_group("gloo")                  # torchrun's (or `pptrain run`'s) ranks
    pipe = pipeline(model, mb_args=(x_mb,), split_spec={"layers.2": SplitPoint.BEGINNING})
    stage = pipe.build_stage(dist.get_rank(), device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
    if dist.get_rank() == 0:
        schedule.step(x)
    else:
        losses = []
        output = schedule.step(target=y, losses=losses)

Every schedule of pptrain's registry is reachable too: get_schedule_class("zb-h1").
"""

from . import microbatch
from ._split import Pipe, PipeInfo, SplitPoint, pipe_split, pipeline
from .schedules import (PipelineScheduleMulti, PipelineScheduleSingle, Schedule1F1B,
                        ScheduleDualPipeV, ScheduleGPipe, ScheduleInterleaved1F1B,
                        ScheduleInterleavedZeroBubble, ScheduleLoopedBFS, ScheduleZBVZeroBubble,
                        get_schedule_class)
from .stage import PipelineStage, build_stage

__all__ = [
    "Pipe",
    "PipeInfo",
    "pipe_split",
    "SplitPoint",
    "pipeline",
    "PipelineStage",
    "build_stage",
    "PipelineScheduleSingle",
    "PipelineScheduleMulti",
    "Schedule1F1B",
    "ScheduleGPipe",
    "ScheduleInterleaved1F1B",
    "ScheduleLoopedBFS",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
    "get_schedule_class",
]
