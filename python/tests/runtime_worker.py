"""One rank of a Python training run on pptrain's runtime (started by `pptrain run`).

    runtime_worker.py SCHEDULE[,SCHEDULE...] OUT [--fail-forward STAGE | --bad-output STAGE]
                      [--pptrain-sgd [--one-process STAGES]]

Trains the MLP of mlp() for 3 steps with SGD (the program's own torch.optim.SGD, or with
--pptrain-sgd pptrain's, which the asynchronous schedules need, fed by a batch source) and writes
OUT.<rank>.json: the loss this rank saw at each step (None but on a last stage's rank; each
replica of a replicated last stage sees its share) and the parameters of its stages, by stage
and name. --one-process S runs the schedule's one-process rule over S stages.

With several schedules (a comma-separated list), the same processes train a fresh MLP with each
in turn, one pipeline after the other, and write OUT.<schedule>.<rank>.json as each schedule
finishes (result_path()): a launch then pays for its processes' start (importing torch) once.
"""
import argparse
import json
import os

import torch

import pptrain

MICROBATCHES = 8  # dualpipev on 4 ranks needs 8
STEPS = 3


LAYERS = 8


def mlp(linear=torch.nn.Linear):
    """Eight blocks of Linear and Tanh: up to 8 stages, each with weights. `linear`:
    torch.nn.Linear or pptrain.Linear (the same parameters)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(linear(8, 8), torch.nn.Tanh())
                                 for _ in range(LAYERS)])


def batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)


class Failing(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        raise ZeroDivisionError("the user's forward failed on purpose")


class WrongOutput(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return {"hidden": self.inner(x)}, 3  # a tuple holding a dict and an int


def result_path(out, schedules, schedule, rank):
    """The file in which `rank` writes what `schedule` of the launch's `schedules` trained:
    OUT.<rank>.json for a launch of one schedule, OUT.<schedule>.<rank>.json for several."""
    if len(schedules) == 1:
        return f"{out}.{rank}.json"
    return f"{out}.{schedule}.{rank}.json"


def train(schedule_name, args, rank):
    """Trains a fresh MLP (the same initial weights every time) with `schedule_name` on this
    rank's stages; returns what the rank writes: the losses it saw, its stages' parameters, the
    stages it held and the reports it got."""
    if args.one_process:
        num_stages, local = args.one_process, list(range(args.one_process))
    else:
        num_stages, local = pptrain.placement(schedule_name, args.microbatches)
    # Stage s of S holds blocks [s * 8 // S, (s + 1) * 8 // S).
    points = [s * LAYERS // num_stages for s in range(1, num_stages)]
    parts = pptrain.split(mlp(pptrain.Linear if args.pptrain_linear else torch.nn.Linear), points)
    modules = {s: parts[s] for s in local}
    if args.fail_forward in modules:
        modules[args.fail_forward] = Failing(modules[args.fail_forward])
    if args.bad_output in modules:
        modules[args.bad_output] = WrongOutput(modules[args.bad_output])
    stages = [pptrain.PipelineStage(modules[s], s, num_stages) for s in local]
    losses, reports, compared = [], [], []
    if args.pptrain_sgd:
        schedule = pptrain.schedule(schedule_name, stages, n_microbatches=args.microbatches,
                                    loss_fn=torch.nn.functional.mse_loss,
                                    optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0},
                                    steps=STEPS, one_process=args.one_process > 0,
                                    **({"pipemare_warmup": args.pipemare_warmup}
                                       if schedule_name == "pipemare" else {}),
                                    **({"vertical_sync": True} if args.vertical_sync else {}))
        data = list(batches())
        for _ in range(STEPS):
            loss = schedule.step(lambda step: data[step])
            losses.append(None if loss is None else float(loss))
    else:
        files = {}
        if args.reports:
            files = dict(metrics=args.reports + ".jsonl", svg=args.reports + ".svg",
                         trace=args.reports + ".json")
        schedule = pptrain.schedule(schedule_name, stages, n_microbatches=MICROBATCHES,
                                    loss_fn=torch.nn.functional.mse_loss,
                                    weight_split="deferred" if args.deferred else "autograd",
                                    **files)
        optimizer = torch.optim.SGD([p for s in stages for p in s.module.parameters()], lr=0.1)
        if args.forever:
            x, y = next(iter(batches()))
            schedule.step(x, target=y)
            with open(f"{args.out}.{rank}.pid", "w") as f:
                f.write(str(os.getpid()))
            while True:
                schedule.step(x, target=y)
        for x, y in batches():
            optimizer.zero_grad()
            loss = schedule.step(x, target=y)
            optimizer.step()
            losses.append(None if loss is None else float(loss))
            if schedule.report() is not None:
                reports.append(schedule.report())
        if args.reports:  # the steps' measured costs against their simulation, then nothing
            compared = [schedule.compare_sim(), schedule.compare_sim()]
        del schedule  # writes the SVG and the trace
    params = {f"{s.index}/{name}": p.detach().tolist()
              for s in stages for name, p in s.module.named_parameters()}
    return {"losses": losses, "params": params, "stages": local, "reports": reports,
            "compare_sim": compared}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("schedule", help="a schedule, or several separated by commas")
    parser.add_argument("out")
    parser.add_argument("--fail-forward", type=int, default=-1)
    parser.add_argument("--bad-output", type=int, default=-1)
    parser.add_argument("--pptrain-sgd", action="store_true")
    parser.add_argument("--one-process", type=int, default=0)
    parser.add_argument("--pipemare-warmup", type=int, default=100)
    parser.add_argument("--microbatches", type=int, default=MICROBATCHES)
    parser.add_argument("--vertical-sync", action="store_true", help="pipedream's family option")
    parser.add_argument("--deferred", action="store_true",
                        help="weight_split='deferred' (else 'autograd')")
    parser.add_argument("--pptrain-linear", action="store_true",
                        help="pptrain.Linear layers instead of torch.nn.Linear")
    parser.add_argument("--forever", action="store_true",
                        help="train until stopped, after writing OUT.RANK.pid at the first step")
    parser.add_argument("--reports", help="also write FILE.jsonl, FILE.svg and FILE.json")
    args = parser.parse_args()
    schedules = args.schedule.split(",")
    if len(schedules) > 1 and (args.forever or args.reports):
        parser.error("--forever and --reports take one schedule")
    torch.set_num_threads(1)
    rank, _ = pptrain.world()
    for name in schedules:
        result = train(name, args, rank)
        # Written whole or not at all: a file that exists holds the schedule's finished run.
        path = result_path(args.out, schedules, name, rank)
        with open(path + ".part", "w") as f:
            json.dump(result, f)
        os.replace(path + ".part", path)


if __name__ == "__main__":
    main()
