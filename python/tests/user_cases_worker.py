"""The failure cases users report of pipeline parallelism, as one training program written for
torch.distributed.pipelining; --api chooses its import line (pipelining_worker.use()), the
program otherwise the same. Started by torchrun on each case's number of ranks (RANKS).

    user_cases_worker.py OUT CASE[,CASE...] [--api pptrain|torch]

Each case trains a fresh model (model_of(): seed 0) on the batches of its `shapes`, one step
each, its own torch.optim.SGD after each step, and writes OUT.<case>.<rank>.json: the `losses`
of each step's microbatches (on the last stage's rank), the `grads` of this rank's parameters
after each step's backward and the `params` after the last step, by name. A case
that fails on a rank is written there as {"error": "<its one-line error>", "seconds": <since
the step it failed in began>}. On torch's pipelining each case runs over a process group of its
own whose operations time out after pipelining_worker.CASE_TIMEOUT_S, the next case following a
failed one (as pipelining_worker.py --keep-going does); on pptrain's a failed case ends the
program, as it ends a user's (the other ranks are left inside that step).

The case "dies" kills its last stage's rank (SIGKILL) inside the loss of its second step's
second microbatch: the other ranks are then inside that step, waiting for its messages. What
they do then is theirs: torchrun's agent, which sends them SIGTERM as soon as it sees the rank
die, does not stop them (they note when it came, as `sigterm_after` seconds into the step), and
the program ends after the case.
"""
import argparse
import datetime
import functools
import os
import signal
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

import pipelining_worker as worker

BATCH, DIM, SEQ = worker.BATCH, worker.DIM, worker.SEQ


class Case(NamedTuple):
    ranks: int
    cut: str  # "manual" (pipelining_worker.manual_stage) or a cut of traced_stages()
    placement: str  # "one" stage per rank, or "loop" (stage s on rank s % P)
    schedule: str  # the class's name in pipelining.schedules
    microbatches: int
    scale_grads: bool = True
    reduction: str = "mean"  # the loss's: mse_loss(..., reduction=...)
    shapes: tuple = ((BATCH, DIM), (BATCH, DIM))  # the batch's input shape at each step
    # "blocks": pipelining_worker.model_of(cut); "skip": SkipModel; "causal": its CausalModel
    # of 4 blocks (each reads the sequence's length)
    model: str = "blocks"
    dies: bool = False


ONE_STEP = ((BATCH, DIM),)
CASES = {
    # Fewer microbatches than stages: 4 stages of one per rank, 8 stages of two per rank.
    "fewer-1f1b": Case(4, "split4", "one", "Schedule1F1B", 2),
    "fewer-interleaved": Case(4, "deep8", "loop", "ScheduleInterleaved1F1B", 2),
    # A value of stage 0 read by stage 2.
    "skip-1f1b": Case(4, "split4", "one", "Schedule1F1B", 4, model="skip"),
    # A loss that averages its microbatch and one that sums it, with scale_grads both ways; one
    # step (a summed loss's gradients, up to M times the mean's, make a second step's rounding
    # differences grow past 1e-5).
    "mean-scaled": Case(2, "manual", "one", "Schedule1F1B", 4, True, "mean", ONE_STEP),
    "mean-unscaled": Case(2, "manual", "one", "Schedule1F1B", 4, False, "mean", ONE_STEP),
    "sum-scaled": Case(2, "manual", "one", "Schedule1F1B", 4, True, "sum", ONE_STEP),
    "sum-unscaled": Case(2, "manual", "one", "Schedule1F1B", 4, False, "sum", ONE_STEP),
    # The input's shape changes between steps: the sequence's length, then the batch's size, of
    # stages made by hand (a stack of Linear and LayerNorm layers reads neither); the sequence's
    # length of a traced split of a causal transformer, whose blocks read it.
    "shape-manual": Case(2, "manual", "one", "Schedule1F1B", 4,
                         shapes=((BATCH, SEQ, DIM), (BATCH, SEQ + 2, DIM),
                                 (BATCH + 4, SEQ + 2, DIM))),
    "shape-traced": Case(4, "split4", "one", "Schedule1F1B", 4, model="causal",
                         shapes=((BATCH, SEQ, DIM), (BATCH, SEQ + 2, DIM))),
    # The last stage's rank dies inside the second step.
    "dies": Case(2, "split2", "one", "Schedule1F1B", 4, dies=True),
}
# The cases of each launch, in its order: a case that ends pptrain's program comes last.
RANKS = {4: ["fewer-1f1b", "fewer-interleaved", "skip-1f1b", "shape-traced"],
         2: ["mean-scaled", "mean-unscaled", "sum-scaled", "sum-unscaled", "shape-manual",
             "dies"]}


class SkipModel(worker.Transformerish):
    """Transformerish whose third block's output is added to the embedding's: cut at layers.1,
    2 and 3 (the "split4" cut), the embedding made on stage 0 is read on stage 2."""

    def forward(self, tokens):
        e = self.tok_embeddings(tokens)
        h = e
        for i, layer in enumerate(self.layers.values()):
            h = layer(h) + e if i == 2 else layer(h)
        return self.output(self.norm(h))


def model_of(case):
    torch.manual_seed(0)
    if case.model == "skip":
        return SkipModel()
    if case.model == "causal":
        return worker.CausalModel(n_layers=4)
    return worker.model_of(case.cut)


def batches(case):
    """The case's batches (x, y), one per step, of its shapes."""
    g = torch.Generator().manual_seed(1)
    for shape in case.shapes:
        yield torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def loss(case, output, target):
    return torch.nn.functional.mse_loss(output, target, reduction=case.reduction)


def dying_loss(case, calls, output, target):
    """The loss, which kills this process at its call in the second step's second microbatch."""
    calls.append(None)
    if len(calls) == case.microbatches + 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return loss(case, output, target)


def make_schedule(case, rank, world, group):
    """This rank's stages of `case` and their schedule."""
    if case.cut == "manual":
        stages = worker.manual_stage(rank, world, group)
    else:
        x0, _ = next(batches(case))
        stages = worker.traced_stages(case.cut, case.placement, rank, world, x0, group,
                                      microbatches=case.microbatches, module=model_of(case))
    loss_fn = functools.partial(loss, case)
    if case.dies:
        loss_fn = functools.partial(dying_loss, case, [])
    schedule = getattr(worker.schedules, case.schedule)(
        stages[0] if case.placement == "one" else stages, n_microbatches=case.microbatches,
        loss_fn=loss_fn, scale_grads=case.scale_grads)
    return stages, schedule


def train(case, stages, schedule, result):
    """Steps `case` into `result` (a dict: losses, grads, params); `result["started"]` is when
    the step began (time.monotonic())."""
    parameters = [p for s in stages for p in s.submod.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=worker.LR)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    result.update(losses=[], grads=[])
    for x, y in batches(case):
        result["started"] = time.monotonic()
        optimizer.zero_grad()
        losses = []
        given = {"target": y, "losses": losses} if holds_last else {}
        schedule.step(*([x] if holds_first else []), **given)
        if holds_last:
            result["losses"].append([float(value) for value in losses])
        result["grads"].append({name: p.grad.tolist() for s in stages
                                for name, p in s.submod.named_parameters()})
        optimizer.step()
    result["params"] = {name: p.detach().tolist() for s in stages
                        for name, p in s.submod.named_parameters()}


def run_case(name, api, rank, world):
    """`name` on this rank: what train() gives, or {"error": ..., "seconds": ...}. On torch's
    pipelining, over a group of its own between barriers of the default group (the one before
    the steps alone for "dies", whose ranks left do not meet again), as run_keeping_going()
    runs a case."""
    case = CASES[name]
    group = None
    if api == "torch":
        group = dist.new_group(backend="gloo",
                               timeout=datetime.timedelta(seconds=worker.CASE_TIMEOUT_S))
    result = {}
    sigterm = []  # when SIGTERM came (time.monotonic())
    if case.dies:
        signal.signal(signal.SIGTERM, lambda *_: sigterm.append(time.monotonic()))
    made = None
    try:
        made = make_schedule(case, rank, world, group)
    except Exception as error:
        result = {"error": worker.one_line(error), "seconds": 0}
    if api == "torch":
        dist.barrier()
    if made is not None:
        try:
            train(case, *made, result)
        except Exception as error:
            started = result["started"]
            result = {"error": worker.one_line(error),
                      "seconds": round(time.monotonic() - started, 2)}
            if sigterm:
                result["sigterm_after"] = round(sigterm[0] - started, 2)
    if api == "torch" and not case.dies:
        dist.barrier()
    result.pop("started", None)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("cases")
    parser.add_argument("--api", choices=sorted(worker.API), default="pptrain")
    args = parser.parse_args()
    worker.use(args.api)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in args.cases.split(","):
        result = run_case(name, args.api, rank, world)
        worker.write_result(args.out, name, rank, result)
        if "error" in result and (args.api == "pptrain" or CASES[name].dies):
            raise SystemExit(f"rank {rank}: {name}: {result['error']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
