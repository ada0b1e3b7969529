"""A training program written for torch.distributed.pipelining, as torch's documentation writes
one; --api chooses its import line: pptrain.pipelining (the default) or torch's own
torch.distributed.pipelining, the same program otherwise. Started on 2 ranks (the cases of
RANKS2) or 4 (RANKS4) by `pptrain run` or torchrun (the same environment).

    pipelining_worker.py OUT CASE[,CASE...] [--api pptrain|torch] [--keep-going] [--no-init]
                         [--step-without-input]

Each case trains a fresh model() for STEPS steps (its own torch.optim.SGD after each step) and
writes OUT.<case>.<rank>.json: the `losses` list of each step and the merged output step()
returned (on the last stage's rank), and the parameters of this rank's stages by name. A case
whose call is "eval" calls schedule.eval() instead of step() (forwards and losses, no gradient);
"step-no-outputs" calls step(..., return_outputs=False).

The program makes the process group itself (dist.init_process_group("gloo")) unless --no-init,
when pptrain.pipelining makes it from torchrun's environment. --keep-going (for torch's own
classes, some of which fail on Gloo): each case runs over a process group of its own whose
operations time out after CASE_TIMEOUT_S, and a case that fails on a rank is written as
{"error": "<its one-line error>"} there, the next case following. --step-without-input: after
the cases, the first stage's rank calls step() without the batch (a mistake that must stop the
run).
"""
import argparse
import datetime
import importlib
import json
import math
import os
import traceback

import torch
import torch.distributed as dist

DIM = 8
BATCH = 8
SEQ = 5  # the "causal" cut's model reads sequences: its batches are [BATCH, SEQ, DIM]
MICROBATCHES = 4  # DualPipeV on 2 ranks needs 2 x 2
STEPS = 3
LR = 0.1
CASE_TIMEOUT_S = 3  # --keep-going: a case's send or receive that waits longer fails the case

API = {"pptrain": "pptrain.pipelining", "torch": "torch.distributed.pipelining"}
pipelining = None  # the program's import line, made by use()
schedules = None


def use(api):
    """The import line: `from <API[api]> import ...` for the whole program."""
    global pipelining, schedules
    pipelining = importlib.import_module(API[api])
    schedules = importlib.import_module(API[api] + ".schedules")


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
                pipelining.pipe_split()
            h = layer(h)
        return self.output(self.norm(h))


class CausalBlock(torch.nn.Module):
    """A transformer block as a new user writes one: its attention's causal mask is built from
    the length of the sequence it is given, in the two ways users write it (torch.triu of ones,
    and torch's generate_square_subsequent_mask), shapes that torch.fx's symbolic tracing cannot
    follow."""

    def __init__(self, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.ff = torch.nn.Linear(dim, dim)

    def forward(self, h):  # h: [microbatch, seq, dim]
        B, T, D = h.shape
        # q, k, v: [microbatch, heads, seq, dim / heads] each
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2)
                   for t in self.qkv(h).chunk(3, dim=-1))
        future = torch.triu(torch.ones(T, T), 1).bool()  # [seq, seq]: True above the diagonal
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.heads)  # [.., seq, seq]
        scores = scores.masked_fill(future, float("-inf"))
        scores = scores + torch.nn.Transformer.generate_square_subsequent_mask(h.size(1))
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
        h = h + self.proj(attended)
        return h + self.ff(torch.tanh(self.norm(h)))


class CausalModel(torch.nn.Module):
    """Two CausalBlocks between an input and an output projection."""

    def __init__(self, dim=DIM, n_layers=2):
        super().__init__()
        self.embed = torch.nn.Linear(dim, dim)
        self.layers = torch.nn.ModuleList([CausalBlock(dim) for _ in range(n_layers)])
        self.output = torch.nn.Linear(dim, dim)

    def forward(self, tokens):  # tokens: [microbatch, seq, dim]
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(h)


def model(marked=False, n_layers=4):
    torch.manual_seed(0)
    return MarkedModel() if marked else Transformerish(n_layers=n_layers)


def model_of(cut):
    """The model a cut splits: 8 blocks for "deep8", the one marked by pipe_split() for
    "marked", the causal transformer for "causal", else 4 blocks."""
    if cut == "causal":
        torch.manual_seed(0)
        return CausalModel()
    return model(marked=cut == "marked", n_layers=8 if cut == "deep8" else 4)


def batches(cut=None):
    """STEPS batches (x, y): [BATCH, DIM] each, or [BATCH, SEQ, DIM] for the "causal" cut."""
    shape = (BATCH, SEQ, DIM) if cut == "causal" else (BATCH, DIM)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


# case -> (how the model is cut, which stages a rank holds, the schedule class by its name in
# pipelining (or "by-name:NAME": get_schedule_class(NAME)), its keywords, the call).
# The cuts: "manual" (torch's documentation's way), "split2" (pipeline() at layers.2),
# "marked" (at the model's pipe_split()), "split4" (pipeline() at layers.1, 2 and 3), "split8"
# (also inside each block, before its ff2: the residual's input and ff1's output cross the cut
# together; torch's schedules of several stages per rank take no such skip of a stage), "deep8"
# (pipeline() at each block of an 8-block model), "causal" (pipeline() at layers.1 of
# CausalModel, whose blocks build their masks from the sequence's length). A rank holds one
# stage ("one"), or two: stage s on rank s % P ("loop") or ranks r and 2P-1-r ("v"). The call:
# "step", "eval" (schedule.eval(): forwards and losses only), "step-no-outputs" (step(...,
# return_outputs=False)) or "step-autocast" (step() under the program's torch.autocast to bf16).
CASES = {
    "gpipe-manual": ("manual", "one", "ScheduleGPipe", {}, "step"),
    "1f1b-manual": ("manual", "one", "Schedule1F1B", {}, "step"),
    "1f1b-sum": ("manual", "one", "Schedule1F1B", {"scale_grads": False}, "step"),
    "1f1b-split2": ("split2", "one", "Schedule1F1B", {}, "step"),
    "1f1b-marked": ("marked", "one", "Schedule1F1B", {}, "step"),
    "1f1b-causal": ("causal", "one", "Schedule1F1B", {}, "step"),
    # The program's own torch.autocast (bf16) around step(): the stages run under it.
    "1f1b-autocast-manual": ("manual", "one", "Schedule1F1B", {}, "step-autocast"),
    "interleaved-split4": ("split4", "loop", "ScheduleInterleaved1F1B", {}, "step"),
    "interleaved-zb-split4": ("split4", "loop", "ScheduleInterleavedZeroBubble", {}, "step"),
    "loopedbfs-split4": ("split4", "loop", "ScheduleLoopedBFS", {}, "step"),
    "zbv-split4": ("split4", "v", "ScheduleZBVZeroBubble", {}, "step"),
    "zbv-sum-split4": ("split4", "v", "ScheduleZBVZeroBubble", {"scale_grads": False}, "step"),
    "dualpipev-split4": ("split4", "v", "ScheduleDualPipeV", {}, "step"),
    "zb-h1-by-name": ("split2", "one", "by-name:zb-h1", {}, "step"),
    "gpipe-by-name": ("split2", "one", "by-name:GPipe", {}, "step"),
    "runtime-csv": ("split2", "one", "_PipelineScheduleRuntime", {}, "step"),
    "gpipe-no-outputs-split2": ("split2", "one", "ScheduleGPipe", {}, "step-no-outputs"),
    # Without a loss_fn: the forwards alone, torch's way to evaluate.
    "gpipe-eval-split2": ("split2", "one", "ScheduleGPipe", {"loss_fn": None}, "step"),
    "zbv-eval-split4": ("split4", "v", "ScheduleZBVZeroBubble", {"loss_fn": None}, "step"),
    # eval(): the forwards and each microbatch's loss of a schedule that has a loss_fn.
    "1f1b-eval-call-split2": ("split2", "one", "Schedule1F1B", {}, "eval"),
    "interleaved-eval-call-split4": ("split4", "loop", "ScheduleInterleaved1F1B", {}, "eval"),
    # On 4 ranks: the ranks between call step() without arguments.
    "gpipe-split4": ("split4", "one", "ScheduleGPipe", {}, "step"),
    "1f1b-split4": ("split4", "one", "Schedule1F1B", {}, "step"),
    "interleaved-split8": ("split8", "loop", "ScheduleInterleaved1F1B", {}, "step"),
    "interleaved-deep8": ("deep8", "loop", "ScheduleInterleaved1F1B", {}, "step"),
    "zbv-split8": ("split8", "v", "ScheduleZBVZeroBubble", {}, "step"),
    "interleaved-eval-split8": ("split8", "loop", "ScheduleInterleaved1F1B", {"loss_fn": None},
                                "step"),
}
RANKS4 = ["gpipe-split4", "1f1b-split4", "interleaved-split8", "interleaved-deep8", "zbv-split8",
          "interleaved-eval-split8"]
RANKS2 = [case for case in CASES if case not in RANKS4]
# Cases of pptrain alone: torch has no schedule of that name.
PPTRAIN_ONLY = ["zb-h1-by-name"]


def schedule_class(name):
    if name.startswith("by-name:"):
        return schedules.get_schedule_class(name[len("by-name:"):])
    return getattr(schedules, name)


def manual_stage(rank, world, group=None):
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
    return [pipelining.PipelineStage(m, rank, world, torch.device("cpu"), group=group)]


def traced_stages(cut, placement, rank, world, x, group=None, microbatches=MICROBATCHES,
                  module=None):
    """This rank's stages of a split by pipeline(): of `module` (default: model_of(cut)) at
    `cut`'s split points, traced on the first of x's `microbatches` microbatches."""
    SplitPoint = pipelining.SplitPoint
    x_mb = x.chunk(microbatches)[0]
    if cut == "marked":
        spec = {}
    elif cut == "split2":
        spec = {"layers.2": SplitPoint.BEGINNING}
    elif cut == "causal":
        spec = {"layers.1": SplitPoint.BEGINNING}
    elif cut == "deep8":
        spec = {f"layers.{i}": SplitPoint.BEGINNING for i in range(1, 8)}
    else:
        spec = {f"layers.{i}": SplitPoint.BEGINNING for i in (1, 2, 3)}
        if cut == "split8":
            spec.update({f"layers.{i}.ff2": SplitPoint.BEGINNING for i in range(4)})
    module = model_of(cut) if module is None else module
    pipe = pipelining.pipeline(module, mb_args=(x_mb,), split_spec=spec)
    mine = {"one": [rank], "loop": [rank, rank + world], "v": [rank, 2 * world - 1 - rank]}
    return [pipe.build_stage(s, torch.device("cpu"), group=group) for s in mine[placement]]


def make_schedule(case, out, rank, world, group=None):
    """This rank's stages of `case` and their schedule."""
    cut, placement, class_name, keywords, _ = CASES[case]
    x0, _ = next(batches(cut))
    if cut == "manual":
        stages = manual_stage(rank, world, group)
    else:
        stages = traced_stages(cut, placement, rank, world, x0, group)
    runtime = class_name == "_PipelineScheduleRuntime"
    one = placement == "one" and not runtime
    keywords = {"loss_fn": loss_fn, **keywords}
    schedule = schedule_class(class_name)(stages[0] if one else stages,
                                          n_microbatches=MICROBATCHES, **keywords)
    if runtime:
        from pptrain import plan
        path = f"{out}.{case}.{rank}.csv"
        with open(path, "w") as f:
            f.write(plan.schedule("zb-h1", pp=world, microbatches=MICROBATCHES).to_csv())
        schedule._load_csv(path)
    return stages, schedule


def train(case, stages, schedule):
    cut, _, _, keywords, call = CASES[case]
    parameters = [p for s in stages for p in s.submod.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=LR)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    evaluates = keywords.get("loss_fn", loss_fn) is None
    plain_run = schedule.eval if call == "eval" else schedule.step

    def run(*args, **kwargs):
        if call != "step-autocast":
            return plain_run(*args, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return plain_run(*args, **kwargs)

    more = {"return_outputs": False} if call == "step-no-outputs" else {}
    step_losses, outputs = [], []
    for x, y in batches(cut):
        optimizer.zero_grad()
        losses = []
        if holds_first and holds_last and evaluates:
            output = run(x, **more)
        elif holds_first and holds_last:
            output = run(x, target=y, losses=losses, **more)
        elif holds_first:
            output = run(x, **more)
        elif holds_last and evaluates:
            output = run(**more)
        elif holds_last:
            output = run(target=y, losses=losses, **more)
        else:
            output = run(**more)
        optimizer.step()
        if holds_last:
            step_losses.append([float(loss) for loss in losses] or ["evaluated"])
            outputs.append(None if output is None else output.tolist())
        else:
            assert output is None
    params = {name: p.detach().tolist() for s in stages for name, p in s.submod.named_parameters()}
    return {"losses": step_losses, "outputs": outputs, "params": params}


def one_line(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def run_keeping_going(case, make):
    """`case` over a process group of its own, whose operations time out: what train() gives
    on the (stages, schedule) that make(group) builds, or {"error": ...} with the first failure
    of this rank. The default group's barriers keep the ranks together: every rank has its
    stages before the first step, and has finished (or failed) the case before the next one."""
    group = dist.new_group(backend="gloo",
                           timeout=datetime.timedelta(seconds=CASE_TIMEOUT_S))
    result = None
    try:
        stages, schedule = make(group)
    except Exception as error:
        traceback.print_exc()
        result = {"error": one_line(error)}
    dist.barrier()
    if result is None:
        try:
            result = train(case, stages, schedule)
        except Exception as error:
            traceback.print_exc()
            result = {"error": one_line(error)}
    dist.barrier()
    return result


def write_result(out, case, rank, result):
    """OUT.<case>.<rank>.json, written whole or not at all: a file that exists holds the case's
    finished run on that rank."""
    path = f"{out}.{case}.{rank}.json"
    with open(path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(path + ".part", path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("cases")
    parser.add_argument("--api", choices=sorted(API), default="pptrain")
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--no-init", action="store_true")
    parser.add_argument("--step-without-input", action="store_true")
    args = parser.parse_args()
    use(args.api)
    torch.set_num_threads(1)
    if not args.no_init:
        dist.init_process_group("gloo")
    for case in args.cases.split(","):
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if args.keep_going:
            result = run_keeping_going(
                case, lambda group: make_schedule(case, args.out, rank, world, group))
        else:
            result = train(case, *make_schedule(case, args.out, rank, world))
        write_result(args.out, case, rank, result)
    if args.step_without_input:
        stages = manual_stage(dist.get_rank(), dist.get_world_size())
        schedule = schedules.Schedule1F1B(stages[0], n_microbatches=MICROBATCHES,
                                          loss_fn=loss_fn)
        x, y = next(batches())
        if dist.get_rank() == 0:
            schedule.step()  # the mistake: the first stage's rank without the batch
        else:
            schedule.step(target=y)
    if not args.keep_going:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
