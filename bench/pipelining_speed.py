"""torch's pipelining API (pptrain.pipelining) against pptrain's own (pptrain.schedule) on the
same model, schedule and optimizer, alternated in one run (issue 50, "Speed": at least 0.95x).

    pptrain run --nproc 2 .venv/bin/python bench/pipelining_speed.py [--rounds 3] [--steps 8]
        [--warmup 2] [model flags of bench/python_speed.py]

Each rank trains bench/python_speed.py's gpt (pptrain's gpt written as a torch.nn module) with
1f1b and with zb-v through both APIs at once, a step of one then a step of the other, ROUNDS
times: fresh stages and schedules, STEPS steps each, the program's own torch.optim.SGD after
each step. A step's time is the slowest
rank's wall clock around step() and the optimizer's step, and the CPU time the ranks' processes
took for it (what a wrapper's overhead would add to, and which other programs on the machine
disturb less than the wall clock); the first WARMUP steps of every run are left out and the
median taken over the rest of every round. Rank 0 prints one line per schedule and API, and the
ratios torch API / pptrain API of steps per second and per CPU second.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_speed  # noqa: E402  (the model, its cut, batches and loss)

import pptrain  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from pptrain import pipelining  # noqa: E402

SCHEDULES = {"1f1b": pipelining.Schedule1F1B, "zb-v": pipelining.ScheduleZBVZeroBubble}


def stages_of(name, o, api):
    """This rank's stages of the gpt cut for `name`: pptrain.PipelineStage or torch's."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mine = [rank] if name == "1f1b" else [rank, 2 * ranks - 1 - rank]
    num_stages = ranks * (1 if name == "1f1b" else 2)
    model = torch.nn.Sequential(*python_speed.gpt_layers(o))
    parts = pptrain.split(model, python_speed.split_points(o, num_stages))
    if api == "pptrain":
        return [pptrain.PipelineStage(parts[s], s, num_stages) for s in mine]
    return [pipelining.PipelineStage(parts[s], s, num_stages, torch.device("cpu")) for s in mine]


class Run:
    """Training through one API: fresh stages, schedule and optimizer; step() times a step."""

    def __init__(self, name, api, o):
        self.api = api
        stages = stages_of(name, o, api)
        self.optimizer = torch.optim.SGD([p for s in stages for p in s.module.parameters()],
                                         lr=python_speed.LR, momentum=python_speed.MOMENTUM)
        if api == "pptrain":
            self.schedule = pptrain.schedule(name=name, stages=stages,
                                             n_microbatches=o.microbatches,
                                             loss_fn=python_speed.loss_fn)
        else:
            one = len(stages) == 1
            self.schedule = SCHEDULES[name](stages[0] if one else stages,
                                            n_microbatches=o.microbatches,
                                            loss_fn=python_speed.loss_fn)
            self.first = any(s.is_first for s in stages)
            self.last = any(s.is_last for s in stages)

    def step(self, x, y):
        """(wall seconds, CPU seconds) of one step on this rank."""
        start, cpu = time.perf_counter(), time.process_time()
        self.optimizer.zero_grad()
        if self.api == "pptrain":
            self.schedule.step(x, target=y)
        else:
            losses = []
            self.schedule.step(*([x] if self.first else []), target=y if self.last else None,
                               losses=losses if self.last else None)
        self.optimizer.step()
        return time.perf_counter() - start, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    args, rest = parser.parse_known_args()
    o = python_speed.model_flags(rest)
    if o.steps <= args.warmup:
        parser.error(f"--steps ({o.steps}) must exceed --warmup ({args.warmup})")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # pptrain's runtime joins beside torch's group, as pptrain.pipelining's first stage would
    # make it (pptrain.world() alone would take torch's MASTER_PORT).
    pipelining.stage._join_world()
    data = python_speed.batches(o)
    load_before = os.getloadavg()
    kept = {}
    for round in range(args.rounds):
        for name in SCHEDULES:
            # Both pipelines at once, their steps alternated (each API first in every other
            # round), so that a neighbour's load falls on both alike.
            apis = ("pptrain", "torch") if round % 2 == 0 else ("torch", "pptrain")
            runs = [Run(name, api, o) for api in apis]
            mine = {api: [] for api in apis}
            for x, y in data:
                for run in runs:
                    mine[run.api].append(run.step(x, y))
            for api in apis:
                every = [None] * dist.get_world_size()
                dist.all_gather_object(every, mine[api])
                # The slowest rank's wall clock; the CPU time of all ranks.
                steps = [(max(w for w, _ in step), sum(c for _, c in step))
                         for step in zip(*every)]
                kept.setdefault((name, api), []).extend(steps[args.warmup:])
            del runs
    if dist.get_rank() == 0:
        print("load average before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f} "
              "({} cores)".format(*load_before, *os.getloadavg(), os.cpu_count()))
        print(f"gpt layers={o.layers} d_model={o.d_model} seq_len={o.seq_len} "
              f"batch={o.batch_size} microbatches={o.microbatches}, {dist.get_world_size()} "
              f"ranks, {args.rounds} rounds of {o.steps} steps (first {args.warmup} left out)")
        for name in SCHEDULES:
            wall, cpu = {}, {}
            for api in ("pptrain", "torch"):
                wall[api] = statistics.median(w for w, _ in kept[(name, api)])
                cpu[api] = statistics.median(c for _, c in kept[(name, api)])
                print(f"{name:5} {api:8} API  median step {wall[api] * 1e3:8.1f} ms, "
                      f"CPU {cpu[api] * 1e3:8.1f} ms (all ranks)")
            print(f"{name:5} torch API / pptrain API: steps per second "
                  f"{wall['pptrain'] / wall['torch']:.3f}, per CPU second "
                  f"{cpu['pptrain'] / cpu['torch']:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
