"""A training program written for torch.distributed.pipelining, as torch's documentation writes
one, with only its import line changed to pptrain.pipelining. Started on 2 ranks (the cases of
RANKS2) or 4 (RANKS4) by `pptrain run` (torchrun's environment).

    pipelining_worker.py OUT CASE[,CASE...] [--no-init] [--step-without-input]

Each case trains a fresh model() for STEPS steps (its own torch.optim.SGD after each step) and
writes OUT.<case>.<rank>.json: the `losses` list of each step and the merged output step()
returned (on the last stage's rank), and the parameters of this rank's stages by name. The
program makes the process group itself (dist.init_process_group("gloo")) unless --no-init, when
pptrain.pipelining makes it from torchrun's environment. --step-without-input: after the cases,
the first stage's rank calls step() without the batch (a mistake that must stop the run).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist

from pptrain import plan
from pptrain.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                ScheduleLoopedBFS, ScheduleZBVZeroBubble, SplitPoint, pipe_split,
                                pipeline)
from pptrain.pipelining.schedules import _PipelineScheduleRuntime, get_schedule_class

DIM = 8
BATCH = 8
MICROBATCHES = 4  # DualPipeV on 2 ranks needs 2 x 2
STEPS = 3
LR = 0.1


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ff1 = torch.nn.Linear(dim, dim)
        self.ff2 = torch.nn.Linear(dim, dim)

    def forward(self, h):
        return h + self.ff2(torch.tanh(self.ff1(h)))


class Transformerish(torch.nn.Module):
    """The shape of torch's documentation's Transformer: a part of it may be set to None, or
    deleted from `layers`, for a stage that does not run it."""

    def __init__(self, dim=DIM, n_layers=4):
        super().__init__()
        self.tok_embeddings = torch.nn.Linear(dim, dim)
        self.layers = torch.nn.ModuleDict({str(i): Block(dim) for i in range(n_layers)})
        self.norm = torch.nn.LayerNorm(dim)
        self.output = torch.nn.Linear(dim, dim)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm else h
        return self.output(h) if self.output else h


class MarkedModel(Transformerish):
    """The same model cut by pipe_split() in its forward, between layers 1 and 2."""

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for i, layer in enumerate(self.layers.values()):
            if i == 2:
                pipe_split()
            h = layer(h)
        return self.output(self.norm(h))


def model(marked=False):
    torch.manual_seed(0)
    return MarkedModel() if marked else Transformerish()


def batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, DIM, generator=g)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


# case -> (how the model is cut, which stages a rank holds, the schedule class, its keywords).
# The cuts: "manual" (torch's documentation's way), "split2" (pipeline() at layers.2),
# "marked" (at the model's pipe_split()), "split4" (pipeline() at layers.1, 2 and 3), "split8"
# (also inside each block, before its ff2: the residual's input and ff1's output cross the cut
# together). A rank holds one stage ("one"), or two: stage s on rank s % P ("loop") or ranks r
# and 2P-1-r ("v").
CASES = {
    "gpipe-manual": ("manual", "one", ScheduleGPipe, {}),
    "1f1b-manual": ("manual", "one", Schedule1F1B, {}),
    "1f1b-sum": ("manual", "one", Schedule1F1B, {"scale_grads": False}),
    "1f1b-split2": ("split2", "one", Schedule1F1B, {}),
    "1f1b-marked": ("marked", "one", Schedule1F1B, {}),
    "interleaved-split4": ("split4", "loop", ScheduleInterleaved1F1B, {}),
    "interleaved-zb-split4": ("split4", "loop", ScheduleInterleavedZeroBubble, {}),
    "loopedbfs-split4": ("split4", "loop", ScheduleLoopedBFS, {}),
    "zbv-split4": ("split4", "v", ScheduleZBVZeroBubble, {}),
    "dualpipev-split4": ("split4", "v", ScheduleDualPipeV, {}),
    "zb-h1-by-name": ("split2", "one", get_schedule_class("zb-h1"), {}),
    "runtime-csv": ("split2", "one", _PipelineScheduleRuntime, {}),
    # Without a loss_fn: the forwards alone, torch's way to evaluate.
    "gpipe-eval-split2": ("split2", "one", ScheduleGPipe, {"loss_fn": None}),
    "zbv-eval-split4": ("split4", "v", ScheduleZBVZeroBubble, {"loss_fn": None}),
    # On 4 ranks: the ranks between call step() without arguments.
    "gpipe-split4": ("split4", "one", ScheduleGPipe, {}),
    "1f1b-split4": ("split4", "one", Schedule1F1B, {}),
    "interleaved-split8": ("split8", "loop", ScheduleInterleaved1F1B, {}),
    "zbv-split8": ("split8", "v", ScheduleZBVZeroBubble, {}),
    "interleaved-eval-split8": ("split8", "loop", ScheduleInterleaved1F1B, {"loss_fn": None}),
}
RANKS4 = ["gpipe-split4", "1f1b-split4", "interleaved-split8", "zbv-split8",
          "interleaved-eval-split8"]
RANKS2 = [case for case in CASES if case not in RANKS4]


def manual_stage(rank, world):
    """torch's documentation's manual split: each stage's model deletes what it does not run."""
    m = model()
    if rank == 0:
        del m.layers["2"]
        del m.layers["3"]
        m.norm = None
        m.output = None
    else:
        m.tok_embeddings = None
        del m.layers["0"]
        del m.layers["1"]
    return [PipelineStage(m, rank, world, torch.device("cpu"))]


def traced_stages(cut, placement, rank, world, x):
    """This rank's stages of a split by pipeline()."""
    x_mb = x.chunk(MICROBATCHES)[0]
    if cut == "marked":
        pipe = pipeline(model(marked=True), mb_args=(x_mb,))
    elif cut == "split2":
        pipe = pipeline(model(), mb_args=(x_mb,), split_spec={"layers.2": SplitPoint.BEGINNING})
    else:
        spec = {f"layers.{i}": SplitPoint.BEGINNING for i in (1, 2, 3)}
        if cut == "split8":
            spec.update({f"layers.{i}.ff2": SplitPoint.BEGINNING for i in range(4)})
        pipe = pipeline(model(), mb_args=(x_mb,), split_spec=spec)
    mine = {"one": [rank], "loop": [rank, rank + world], "v": [rank, 2 * world - 1 - rank]}
    return [pipe.build_stage(s, torch.device("cpu")) for s in mine[placement]]


def train(case, out, rank, world):
    cut, placement, schedule_class, keywords = CASES[case]
    x0, _ = next(batches())
    if cut == "manual":
        stages = manual_stage(rank, world)
    else:
        stages = traced_stages(cut, placement, rank, world, x0)
    one = placement == "one" and schedule_class is not _PipelineScheduleRuntime
    keywords = {"loss_fn": loss_fn, **keywords}
    evaluates = keywords["loss_fn"] is None
    schedule = schedule_class(stages[0] if one else stages, n_microbatches=MICROBATCHES,
                              **keywords)
    if schedule_class is _PipelineScheduleRuntime:
        path = f"{out}.{case}.{rank}.csv"
        with open(path, "w") as f:
            f.write(plan.schedule("zb-h1", pp=world, microbatches=MICROBATCHES).to_csv())
        schedule._load_csv(path)
    parameters = [p for s in stages for p in s.submod.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=LR)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    step_losses, outputs = [], []
    for x, y in batches():
        optimizer.zero_grad()
        losses = []
        if holds_first and holds_last:
            output = schedule.step(x, target=y, losses=losses)
        elif holds_first:
            output = schedule.step(x)
        elif holds_last and evaluates:
            output = schedule.step()
        elif holds_last:
            output = schedule.step(target=y, losses=losses)
        else:
            output = schedule.step()
        optimizer.step()
        if holds_last:
            step_losses.append([float(loss) for loss in losses] or ["evaluated"])
            outputs.append(output.tolist())
        else:
            assert output is None
    params = {name: p.detach().tolist() for s in stages for name, p in s.submod.named_parameters()}
    return {"losses": step_losses, "outputs": outputs, "params": params}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("cases")
    parser.add_argument("--no-init", action="store_true")
    parser.add_argument("--step-without-input", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.no_init:
        dist.init_process_group("gloo")
    for case in args.cases.split(","):
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        result = train(case, args.out, rank, world)
        path = f"{args.out}.{case}.{rank}.json"
        with open(path + ".part", "w") as f:
            json.dump(result, f)
        os.replace(path + ".part", path)
    if args.step_without_input:
        stages = manual_stage(dist.get_rank(), dist.get_world_size())
        schedule = Schedule1F1B(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
        x, y = next(batches())
        if dist.get_rank() == 0:
            schedule.step()  # the mistake: the first stage's rank without the batch
        else:
            schedule.step(target=y)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
