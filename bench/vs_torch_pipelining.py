"""torch.distributed.pipelining against pptrain.pipelining, side by side (issue 68): the same
program, its import line swapped, on the same ranks over Gloo on this CPU.

    .venv/bin/python bench/vs_torch_pipelining.py [--ranks 2,4] [--seq-lens 32,128]
        [--schedules GPipe,1F1B,Interleaved1F1B,ZBVZeroBubble,DualPipeV] [--rounds 3]
        [--steps 6] [--warmup 2] [--layers 8] [--d-model 256] [--heads 4] [--vocab 10000]
        [--batch 16] [--microbatches 8] [--timeout 300]

The model is the shape of torch's pipelining tutorial: an embedding, blocks in a ModuleDict
(torch.nn.TransformerDecoderLayer, batch first, no dropout), a norm and the output layer; each
stage a copy of the whole with the other blocks deleted, stage 0 keeping the embedding and the
last stage the norm and output. For each rank count, sequence length and schedule class, the
driver (this script without --worker) starts `pptrain run --nproc P` of itself; every rank
builds the stages of its rank both ways (torch's PipelineStage and pptrain.pipelining's, from
the same parameters) and trains them side by side, a step of one then a step of the other
(each first in every other round), the program's own SGD after each step, ROUNDS rounds of
fresh stages and schedules. A step's time is the slowest rank's wall clock around step() and
the optimizer's step; medians of the steps after the first WARMUP of each round.

After the two pipelines, in every round, each rank runs its stages' work alone, with no pipeline
("stages alone": each stage's forward and backward of every microbatch, no message, all ranks
at once; with more ranks than cores, also one rank after the other, so that each has a core).
pptrain's simulation of the schedule with each stage's median forward and backward alone (the
backward split into I and W as pptrain's run split it: that stage's measured I over I + W, or
half and half without a W), no communication time, gives the limit the machine sets: its
makespan is the shortest step those costs allow in that order, the stages' imbalance included
(the last stage's output layer makes it the heaviest). With more ranks than cores the
simulation shares the cores out among the ranks computing at each moment (processor sharing),
so that one rank's idle time is another's compute. Peak memory is each rank's resident set
growth (ru_maxrss) in a run of one API alone (more launches), the largest over the ranks: for
pptrain twice, with its workers' memory settings (they keep what their tensors free for the
next step's: the large blocks by size, device/memory.h, the small in glibc's heap,
common/malloc.h) and with glibc's own (PPTRAIN_MALLOC=system), which torch's run has.

A third table says where pptrain.pipelining's step went (its compare_sim(), the figures of
`pptrain train --compare-sim`, over each round's steps after the first): the schedule simulated
with the costs the run measured against the step (a step much longer than its simulation waited
where the simulation does not), the thread CPU time of a step's compute actions on all ranks
(the reports' compute_s) against all stages alone, each with a core (above 1: the same work
costs more in the pipeline, such as a backward split into I and W, or caches shared by ranks on
one core), the share of the cores (one per rank, at most the machine's) that this CPU time
filled, I's share of a backward, and the gaps the runtime leaves after a compute action, a send
and a receive.

A torch class that fails is named with its error, in one line; one that hangs past --timeout is
named as hanging; one whose losses differ from pptrain's beyond 1e-5 is named with the largest
difference. The driver prints one line per case and a table of the ratios pptrain/torch.

Then, unless --without-train, each case once more as `pptrain train` runs it on pptrain's own
gpt of the same blocks, width, heads, sequence, batch and microbatches (its byte vocabulary of
256, its blocks a GPT's: no cross-attention, so less work per block than the tutorial's decoder
layers), ROUNDS runs of STEPS steps after the case's Python runs: its tokens/s
(the median step after the first WARMUP of each run), the idle fraction the run measured (the
metrics' bubble_ratio), and each rank's peak from pptrain's counting allocator (what the
tensors held, not the resident set: not comparable with the table above), in a second table
beside pptrain.pipelining's tokens/s of the case.
"""
import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

CLASSES = ["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"]
# pptrain's registry name of each class, for the simulated bubble.
REGISTRY = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b",
            "ZBVZeroBubble": "zb-v", "DualPipeV": "dualpipev"}
LR = 0.01


def flags(argv=None):
    p = argparse.ArgumentParser(prog="vs_torch_pipelining.py")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--seq-lens", default="32,128")
    p.add_argument("--schedules", default=",".join(CLASSES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--timeout", type=int, default=300)
    # How pptrain's zero-bubble classes split a backward (its default when not given: deferred).
    p.add_argument("--weight-split", default="", choices=["", "deferred", "autograd"])
    p.add_argument("--without-train", action="store_true", help="no `pptrain train` table")
    # Worker mode (one rank of a launch): the case and where rank 0 writes its result.
    p.add_argument("--worker", default="")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--schedule", default="1F1B")
    p.add_argument("--only", default="", choices=["", "torch", "pptrain"])
    p.add_argument("--without-torch", action="store_true")
    o = p.parse_args(argv)
    if o.steps <= o.warmup:
        p.error(f"--steps ({o.steps}) must exceed --warmup ({o.warmup})")
    for name in o.schedules.split(","):
        if name not in CLASSES:
            p.error(f"--schedules: {name} is not one of {','.join(CLASSES)}")
    most = 2 * max(int(r) for r in o.ranks.split(","))  # the stages of a V or interleaved run
    if not o.worker and o.layers < most:
        p.error(f"--layers ({o.layers}) must be at least {most}: a stage of every schedule on "
                f"--ranks {o.ranks} holds a block")
    return o


# --- the worker: one rank ----------------------------------------------------------------------

def transformer(o):
    import torch

    class Transformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = torch.nn.Embedding(o.vocab, o.d_model)
            self.layers = torch.nn.ModuleDict({
                str(i): torch.nn.TransformerDecoderLayer(o.d_model, o.heads, dropout=0.0,
                                                         batch_first=True)
                for i in range(o.layers)})
            self.norm = torch.nn.LayerNorm(o.d_model)
            self.output = torch.nn.Linear(o.d_model, o.vocab)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
            for layer in self.layers.values():
                h = layer(h, h)
            h = self.norm(h) if self.norm is not None else h
            return self.output(h).float() if self.output is not None else h

    torch.manual_seed(0)
    return Transformer()


def stage_module(whole, stage, num_stages, o):
    """Stage `stage` of `num_stages`: a copy of the model without the other stages' parts."""
    part = copy.deepcopy(whole)
    per = o.layers // num_stages
    keep = range(stage * per, (stage + 1) * per if stage < num_stages - 1 else o.layers)
    for i in range(o.layers):
        if i not in keep:
            del part.layers[str(i)]
    if stage > 0:
        part.tok_embeddings = None
    if stage < num_stages - 1:
        part.norm = None
        part.output = None
    return part


def stages_of_rank(name, rank, ranks):
    """(this rank's stage indices, the number of stages) for torch's placement of `name`."""
    if name in ("GPipe", "1F1B"):
        return [rank], ranks
    if name == "Interleaved1F1B":
        return [rank, rank + ranks], 2 * ranks
    return [rank, 2 * ranks - 1 - rank], 2 * ranks  # the V: ZBVZeroBubble, DualPipeV


def loss_fn(output, target):
    import torch
    return torch.nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())


def batches(o):
    import torch
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, o.vocab, (o.batch, o.seq_len), generator=g),
             torch.randint(0, o.vocab, (o.batch, o.seq_len), generator=g))
            for _ in range(o.steps)]


class Run:
    """One API's pipeline of this rank: fresh stages, schedule and SGD; step() times a step."""

    def __init__(self, api, o, whole, rank, ranks):
        import torch
        import torch.distributed.pipelining as torch_pipelining
        from pptrain import pipelining as pptrain_pipelining
        lib = torch_pipelining if api == "torch" else pptrain_pipelining
        self.api = api
        mine, num_stages = stages_of_rank(o.schedule, rank, ranks)
        self.stages = [lib.PipelineStage(stage_module(whole, s, num_stages, o), s, num_stages,
                                         torch.device("cpu")) for s in mine]
        self.first = any(s.is_first for s in self.stages)
        self.last = any(s.is_last for s in self.stages)
        self.optimizer = torch.optim.SGD(
            [p for s in self.stages for p in s.submod.parameters()], lr=LR)
        cls = getattr(lib, "Schedule" + o.schedule)
        options = {"weight_split": o.weight_split} if api == "pptrain" and o.weight_split else {}
        self.schedule = cls(self.stages[0] if len(self.stages) == 1 else self.stages,
                            n_microbatches=o.microbatches, loss_fn=loss_fn, **options)
        self.losses = []
        self.cpu_s = []  # rank 0, pptrain: the thread CPU seconds of each step's compute

    def step(self, x, y):
        """Wall seconds of one step on this rank."""
        start = time.perf_counter()
        self.optimizer.zero_grad()
        losses = []
        self.schedule.step(*([x] if self.first else []), target=y if self.last else None,
                           losses=losses if self.last else None)
        self.optimizer.step()
        took = time.perf_counter() - start
        if self.last:
            self.losses.append(sum(float(l.detach()) for l in losses) / len(losses))
        report = self.schedule.report() if self.api == "pptrain" else None
        if report:  # rank 0: every rank's CPU time
            self.cpu_s.append(sum(report["compute_s"]))
        return took


def stages_alone(o, whole, rank, ranks, data):
    """This rank's stages' forward and backward of every microbatch of each batch, no pipeline:
    ([seconds of each step], {stage: ([forward s], [backward s]) of each microbatch})."""
    import torch
    mine, num_stages = stages_of_rank(o.schedule, rank, ranks)
    modules = [stage_module(whole, s, num_stages, o) for s in mine]
    rows = o.batch // o.microbatches
    times, samples = [], {s: ([], []) for s in mine}
    for x, y in data:
        start = time.perf_counter()
        for m in range(o.microbatches):
            for s, module in zip(mine, modules):
                if s == 0:
                    inputs = x[m * rows:(m + 1) * rows]
                else:
                    inputs = torch.randn(rows, o.seq_len, o.d_model, requires_grad=True)
                t0 = time.perf_counter()
                out = module(inputs)
                t1 = time.perf_counter()
                if s == num_stages - 1:
                    loss_fn(out, y[m * rows:(m + 1) * rows]).backward()
                else:
                    out.backward(torch.ones_like(out))
                samples[s][0].append(t1 - t0)
                samples[s][1].append(time.perf_counter() - t1)
        times.append(time.perf_counter() - start)
    return times, samples


def median_costs(rounds):
    """The median over the rounds of each figure of pptrain's compare_sim() (each stage's, for
    the per-stage lists)."""
    rounds = [r for r in rounds if r]
    out = {}
    for key, value in rounds[0].items():
        if isinstance(value, list):
            out[key] = [statistics.median(r[key][s] for r in rounds) for s in range(len(value))]
        elif isinstance(value, (int, float)):
            out[key] = statistics.median(r[key] for r in rounds)
    return out


def one_line(error):
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def worker(o):
    import torch
    import torch.distributed as dist
    from pptrain.pipelining import stage as pptrain_stage
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if o.only != "torch":
        pptrain_stage._join_world()  # pptrain's runtime beside torch's group
    rank, ranks = dist.get_rank(), dist.get_world_size()
    whole = transformer(o)
    data = batches(o)
    result = {"ranks": ranks, "seq_len": o.seq_len, "schedule": o.schedule}
    apis = [o.only] if o.only else ["pptrain"] if o.without_torch else ["pptrain", "torch"]
    if o.only:
        # Memory: the resident set's growth over the run of one API alone.
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        run = Run(o.only, o, whole, rank, ranks)
        for x, y in data[:3]:
            run.step(x, y)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        every = [None] * ranks
        dist.all_gather_object(every, grown)
        result["peak_rss_growth_bytes"] = max(every)
    else:
        times = {api: [] for api in apis}
        losses = {api: [] for api in apis}
        # (The driver has run each API alone first: a torch class that fails or hangs there is
        # left out here, as a failure on one rank would leave the others waiting in its step.)
        # The stages alone run in every round too, after the pipelines, under the same load.
        alone, own_alone, stage_f, stage_b = [], [], {}, {}
        costs, cpu_s = [], []  # rank 0: pptrain's compare_sim() of each round, CPU of steps
        for round in range(o.rounds):
            order = apis if round % 2 == 0 else apis[::-1]
            runs = [Run(api, o, whole, rank, ranks) for api in order]
            mine = {run.api: [] for run in runs}
            for x, y in data:
                for run in runs:
                    mine[run.api].append(run.step(x, y))
            for run in runs:
                every = [None] * ranks
                dist.all_gather_object(every, mine[run.api])
                steps = [max(step) for step in zip(*every)]
                times[run.api].extend(steps[o.warmup:])
                if round == 0:
                    owned = [None] * ranks
                    dist.all_gather_object(owned, run.losses)
                    losses[run.api] = next(l for l in owned if l)
                if run.api == "pptrain" and rank == 0:
                    costs.append(run.schedule.compare_sim())
                    cpu_s.extend(run.cpu_s[o.warmup:])
            del runs
            dist.barrier()  # all ranks at once
            steps_alone, samples = stages_alone(o, whole, rank, ranks, data)
            every = [None] * ranks
            dist.all_gather_object(every, steps_alone)
            alone.extend([max(step) for step in zip(*every)][o.warmup:])  # the busiest rank's
            if ranks > os.cpu_count():
                # More ranks than cores: the stages' costs with a core each, for the simulation
                # of the limit (which shares the cores out itself), one rank after the other.
                for r in range(ranks):
                    dist.barrier()
                    if r == rank:
                        steps_alone, samples = stages_alone(o, whole, rank, ranks, data)
                dist.barrier()
            own_alone.extend(steps_alone[o.warmup:])
            for s, (forward, backward) in samples.items():
                stage_f.setdefault(s, []).extend(forward)
                stage_b.setdefault(s, []).extend(backward)
        result["stages_alone_s"] = statistics.median(alone)
        # Every rank's stages alone, each with a core: the work of a step on one core.
        owns = [None] * ranks
        dist.all_gather_object(owns, statistics.median(own_alone))
        result["alone_total_s"] = sum(owns)
        # Each stage's median forward and backward alone, with a core.
        every = [None] * ranks
        dist.all_gather_object(every, {s: (statistics.median(stage_f[s]),
                                           statistics.median(stage_b[s])) for s in stage_f})
        stages = {s: fb for mine in every for s, fb in mine.items()}
        result["stage_forward_s"] = [stages[s][0] for s in sorted(stages)]
        result["stage_backward_s"] = [stages[s][1] for s in sorted(stages)]
        if costs:
            result["pptrain_costs"] = median_costs(costs)
            result["pptrain_cpu_s"] = statistics.median(cpu_s)
        result["step_s"] = {api: statistics.median(t) for api, t in times.items() if t}
        if losses.get("torch") and losses.get("pptrain"):
            result["loss_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12)
                                          for a, b in zip(losses["pptrain"], losses["torch"]))
    if rank == 0:
        with open(o.worker, "w") as out:
            json.dump(result, out)
    dist.barrier()  # no rank leaves (rank 0 serves the store) before all are done
    dist.destroy_process_group()


# --- the driver --------------------------------------------------------------------------------

def pptrain_binary():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("PPTRAIN", os.path.join(here, "..", "build", "tools", "pptrain",
                                                  "pptrain"))


def communicate(command, timeout, env=None):
    """(return code, stderr) of a command in this process's group, killed past `timeout`
    (its ranks die with their launcher); None when it was."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None
    return process.returncode, err


def train_case(o, ranks, seq_len, name):
    """`pptrain train` of pptrain's gpt in the case's shape, ROUNDS runs: {"step_s", "idle",
    "peaks"} (medians; the largest peak of each rank), or {"error": line} / {"hung": True}."""
    steps, idle, peaks = [], [], [0] * ranks
    for _ in range(o.rounds):
        with tempfile.TemporaryDirectory() as folder:
            metrics = os.path.join(folder, "m.jsonl")
            command = [pptrain_binary(), "train", "--model", "gpt", "--layers", str(o.layers),
                       "--d-model", str(o.d_model), "--heads", str(o.heads), "--seq-len",
                       str(seq_len), "--batch-size", str(o.batch), "--microbatches",
                       str(o.microbatches), "--pp", str(ranks), "--schedule", REGISTRY[name],
                       "--steps", str(o.steps), "--lr", str(LR), "--data", "synthetic",
                       "--quiet", "--metrics", metrics]
            if o.weight_split:
                command += ["--weight-split", o.weight_split]
            done = communicate(command, o.timeout)
            if done is None:
                return {"hung": True}
            if done[0] != 0:
                return {"error": (done[1].strip().splitlines() or [f"exit {done[0]}"])[-1][:300]}
            with open(metrics) as f:
                lines = [json.loads(line) for line in f][o.warmup:]
        steps += [line["step_time_s"] for line in lines]
        idle += [line["bubble_ratio"] for line in lines]
        for line in lines:
            peaks = [max(a, b) for a, b in zip(peaks, line["peak_memory_bytes"])]
    return {"step_s": statistics.median(steps), "idle": statistics.median(idle), "peaks": peaks}


def launch(o, ranks, seq_len, name, only="", without_torch=False, glibc_malloc=False):
    """Runs one case on `ranks` processes; its result, or {"hung": True} / {"error": line}.
    `glibc_malloc`: pptrain leaves glibc's malloc settings as they are (PPTRAIN_MALLOC=system)."""
    pptrain = pptrain_binary()
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        model = ["--layers", str(o.layers), "--d-model", str(o.d_model), "--heads", str(o.heads),
                 "--vocab", str(o.vocab), "--batch", str(o.batch), "--microbatches",
                 str(o.microbatches), "--rounds", str(o.rounds), "--steps", str(o.steps),
                 "--warmup", str(o.warmup)]
        if o.weight_split:
            model += ["--weight-split", o.weight_split]
        command = [pptrain, "run", "--nproc", str(ranks), sys.executable, __file__,
                   "--worker", out, "--seq-len", str(seq_len), "--schedule", name] + model
        if only:
            command += ["--only", only]
        if without_torch:
            command += ["--without-torch"]
        # In this process's group (a caller that kills it kills the launch too).
        env = dict(os.environ, PPTRAIN_MALLOC="system") if glibc_malloc else None
        done = communicate(command, o.timeout, env)
        if done is None:
            return {"hung": True}
        returncode, err = done
        if returncode != 0 or not os.path.exists(out):
            # The exception a rank raised (its traceback's last line), else the launcher's line.
            lines = err.splitlines()
            raised = [l for l in lines if l and not l[0].isspace() and ("Error: " in l or
                                                                        "Exception: " in l)]
            said = raised or [l for l in lines if "error" in l.lower()] or lines
            return {"error": (said[0] if said else f"exit {returncode}")[:300]}
        with open(out) as f:
            return json.load(f)


def input_shares(costs, num_stages):
    """Each stage's share of a backward that pptrain's I took in its run (its measured I over
    I + W), or 1/2 on a stage without a W (or a run that measured none)."""
    i = (costs or {}).get("stage_backward_input_s") or [0] * num_stages
    w = (costs or {}).get("stage_backward_weight_s") or [0] * num_stages
    return [a / (a + b) if b > 0 else 0.5 for a, b in zip(i, w)]


def machine_limit(name, ranks, o, r, shares):
    """The shortest step the machine allows, and the schedule's bubble in it: pptrain's
    simulation of the schedule with each stage's forward and backward alone (the backward split
    into I and W by `shares`), no communication time, and with more ranks than cores the cores
    shared out among the ranks that compute (the simulator's processor sharing: one rank's idle
    time is another's compute)."""
    from pptrain import plan
    per_stage = lambda values: ":".join(repr(v) for v in values)
    forward, backward = r["stage_forward_s"], r["stage_backward_s"]
    cost = (f"F={per_stage(forward)},"
            f"I={per_stage(b * x for b, x in zip(backward, shares))},"
            f"W={per_stage(b * (1 - x) for b, x in zip(backward, shares))},comm=0")
    cores = os.cpu_count() if ranks > os.cpu_count() else 0
    simulated = plan.schedule(REGISTRY[name], pp=ranks, microbatches=o.microbatches,
                              cost=cost).simulate(cores=cores)
    return simulated["makespan"], simulated["bubble_ratio"]


def driver(o):
    load_before = os.getloadavg()
    rows = []
    for ranks in [int(r) for r in o.ranks.split(",")]:
        for seq_len in [int(s) for s in o.seq_lens.split(",")]:
            for name in o.schedules.split(","):
                started = time.perf_counter()
                # Each API alone first (its memory): a class that fails or hangs there is named
                # and left out of the side-by-side run.
                memory = {api: launch(o, ranks, seq_len, name, only=api)
                          for api in ("torch", "pptrain")}
                # pptrain's workers keep the memory they free for their next steps (glibc's
                # malloc settings, common/malloc.h): its peak again with glibc's own, as torch
                # runs alone.
                memory["pptrain-glibc"] = launch(o, ranks, seq_len, name, only="pptrain",
                                                 glibc_malloc=True)
                peak = {api: m.get("peak_rss_growth_bytes") for api, m in memory.items()}
                torch_note = ("torch hangs (no step within --timeout)" if memory["torch"].get("hung")
                              else "torch fails: " + memory["torch"]["error"]
                              if "error" in memory["torch"] else "")
                r = launch(o, ranks, seq_len, name, without_torch=bool(torch_note))
                if "step_s" not in r:
                    print(f"{ranks} ranks seq {seq_len} {name}: pptrain's run "
                          f"{'hung' if r.get('hung') else 'failed: ' + r.get('error', '')}",
                          flush=True)
                    continue
                torch_s = r["step_s"].get("torch")
                if not torch_note and r.get("loss_rel_diff", 0) > 1e-5:
                    torch_note = f"losses differ by {r['loss_rel_diff']:.1e}"
                costs = r.get("pptrain_costs")
                shares = input_shares(costs, len(r["stage_forward_s"]))
                limit_s, b = machine_limit(name, ranks, o, r, shares)
                tokens = o.batch * seq_len
                row = dict(ranks=ranks, seq_len=seq_len, schedule=name,
                           pptrain_s=r["step_s"]["pptrain"], torch_s=torch_s,
                           alone_s=r["stages_alone_s"], stage_forward_s=r["stage_forward_s"],
                           stage_backward_s=r["stage_backward_s"], bubble=b,
                           input_shares=shares, limit_s=limit_s, costs=costs,
                           alone_total_s=r["alone_total_s"], cpu_s=r.get("pptrain_cpu_s"),
                           pptrain_peak=peak.get("pptrain"), torch_peak=peak.get("torch"),
                           pptrain_glibc_peak=peak.get("pptrain-glibc"),
                           note=torch_note, tokens=tokens)
                if not o.without_train:
                    row["train"] = train_case(o, ranks, seq_len, name)
                rows.append(row)
                print(json.dumps(row), f"({time.perf_counter() - started:.0f} s)", flush=True)
    print("load average before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f} "
          "({} cores)".format(*load_before, *os.getloadavg(), os.cpu_count()))
    print(f"transformer layers={o.layers} d_model={o.d_model} heads={o.heads} vocab={o.vocab} "
          f"batch={o.batch} microbatches={o.microbatches}, {o.rounds} rounds of {o.steps} steps "
          f"(first {o.warmup} left out), SGD; one thread per rank")
    print("| ranks | seq | schedule | pptrain tokens/s | torch tokens/s | pptrain/torch | "
          "limit tokens/s | pptrain/limit | rule | peak MiB pptrain / with glibc's malloc / torch | "
          "note |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ours = row["tokens"] / row["pptrain_s"]
        theirs = row["tokens"] / row["torch_s"] if row["torch_s"] and not row["note"] else None
        limit = row["tokens"] / row["limit_s"]
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        # The target: 1.2x torch, unless that passes the machine's limit (or torch has no
        # figure); then 0.95 of the limit.
        rule = "0.95 of limit" if not theirs or 1.2 * theirs > limit else "1.2x torch"
        met = (ours >= 0.95 * limit) if rule == "0.95 of limit" else (
            theirs is not None and ours >= 1.2 * theirs)
        mib = [f"{row[k] / 2**20:.0f}" if row.get(k) is not None else "-"
               for k in ("pptrain_peak", "pptrain_glibc_peak", "torch_peak")]
        print(f"| {row['ranks']} | {row['seq_len']} | {row['schedule']} | {ours:.0f} | "
              f"{f'{theirs:.0f}' if theirs else '-'} | {ratio} | {limit:.0f} | "
              f"{ours / limit:.2f} | {rule}: {'met' if met else 'not met'} | "
              f"{' / '.join(mib)} | {row['note']} |")
    print("Where pptrain.pipelining's step went: its step against the schedule simulated with "
          "the costs it measured (compare_sim(): below 1, waiting the simulation has not), the "
          "CPU time of a step's compute on all ranks against all stages alone with a core each "
          "(above 1: the same work costs more in the pipeline), the share of the cores that "
          "compute kept busy, I's share of a backward, and the mean gaps after a compute "
          "action, a send and a receive")
    print("| ranks | seq | schedule | step s | simulated / step | CPU pipeline / alone | "
          "cores busy | I share | gaps ms: action / send / recv |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        c = row["costs"]
        if not c:
            continue
        i, w = sum(c["stage_backward_input_s"]), sum(c["stage_backward_weight_s"])
        share = f"{i / (i + w):.2f}" if w > 0 else "-"
        cores = min(row["ranks"], os.cpu_count())
        print(f"| {row['ranks']} | {row['seq_len']} | {row['schedule']} | "
              f"{row['pptrain_s']:.3f} | {c['predicted_makespan_s'] / row['pptrain_s']:.2f} | "
              f"{row['cpu_s'] / row['alone_total_s']:.2f} | "
              f"{row['cpu_s'] / (cores * row['pptrain_s']):.2f} | {share} | "
              f"{1e3 * c['action_overhead_s']:.2f} / {1e3 * c['send_overhead_s']:.2f} / "
              f"{1e3 * c['recv_overhead_s']:.2f} |")
    if o.without_train:
        return
    print("`pptrain train`, pptrain's gpt of the same blocks, width, heads and sequence (256-token "
          "vocabulary, GPT blocks), beside pptrain.pipelining's tutorial transformer above")
    print("| ranks | seq | schedule | train tokens/s | train step s | idle | peak MiB per rank "
          "(counted) | pptrain.pipelining tokens/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        train = row["train"]
        ours = row["tokens"] / row["pptrain_s"]
        if "step_s" not in train:
            said = "hangs" if train.get("hung") else "fails: " + train.get("error", "")
            print(f"| {row['ranks']} | {row['seq_len']} | {row['schedule']} | {said} | - | - | "
                  f"- | {ours:.0f} |")
            continue
        peaks = " / ".join(f"{p / 2**20:.1f}" for p in train["peaks"])
        print(f"| {row['ranks']} | {row['seq_len']} | {row['schedule']} | "
              f"{row['tokens'] / train['step_s']:.0f} | {train['step_s']:.3f} | "
              f"{train['idle']:.2f} | {peaks} | {ours:.0f} |")


if __name__ == "__main__":
    options = flags()
    if options.worker:
        try:
            worker(options)
        except Exception:
            traceback.print_exc()
            sys.exit(1)
    else:
        driver(options)
