"""pptrain's schedules from Python, without torch: make one by name, look at it, simulate it, and
hand its CSV to torch.distributed.pipelining (docs/PYTHON.md).

    from pptrain import plan
    s = plan.schedule("zb-v", pp=4, microbatches=8)
    s.actions()[0][:4]              # ['0F0', '0F1', '0F2', '0F3']
    s.simulate("F=1,I=1,W=1")       # {'makespan': ..., 'bubble_ratio': ..., 'ranks': [...]}
    open("zb-v.csv", "w").write(s.to_csv())
    plan.from_csv(open("zb-v.csv").read()).simulate()
    plan.compare(out="cmp", only="1f1b,pipedream", steps=3)   # pptrain compare, as a dict

Errors are ValueError (pptrain.plan.PlanError) with the CLI's one-line message; an invalid
schedule's (ScheduleError, a PlanError) names the rank, the position and the action, then shows
the grid, and carries them as `rank`, `position` and `reason`.
"""

import json
import os
import shutil
import tempfile

from . import _plan

PlanError = _plan.PlanError
ScheduleError = _plan.ScheduleError
DEFAULT_COST = "F=1,I=1,W=1,comm=0"


class Schedule:
    """A validated schedule: its actions per rank (torch's text form), and what the simulator
    makes of it under a cost model ("F=1,I=1,W=1,comm=0": `pptrain schedule --cost`; a planned
    candidate's schedule simulates under the candidate's own costs unless given one)."""

    def __init__(self, planned, cost=DEFAULT_COST, mem_w_ratio=0.5, memory_limit=0):
        self._planned = planned
        self._cost = cost
        self._mem_w_ratio = mem_w_ratio
        self._memory_limit = memory_limit

    name = property(lambda self: self._planned.name)
    num_ranks = property(lambda self: self._planned.num_ranks)
    num_stages = property(lambda self: self._planned.num_stages)
    num_microbatches = property(lambda self: self._planned.num_microbatches)
    chunks = property(lambda self: self._planned.chunks)
    synchronous = property(lambda self: self._planned.synchronous)
    skips = property(lambda self: self._planned.skips)

    def actions(self, with_comms=False):
        """Each rank's actions in order, e.g. '0F1', '2I0', '1SEND_F3' (with_comms)."""
        return self._planned.actions(with_comms)

    def simulate(self, cost=None, memory_limit=None, cores=0):
        """What `pptrain schedule --json` prints: makespan, bubble_ratio, and per rank busy,
        idle, peak_activations, peak_memory and weight_versions."""
        return json.loads(self._planned.summary_json(
            cost or self._cost, self._mem_w_ratio,
            self._memory_limit if memory_limit is None else memory_limit, cores))

    def trace(self, cost=None, cores=0):
        """The simulated timeline as Chrome trace-event JSON text (chrome://tracing,
        Perfetto), as `pptrain schedule --trace` writes it."""
        return self._planned.trace(cost or self._cost, self._mem_w_ratio, cores)

    def to_csv(self, with_comms=False):
        """torch.distributed.pipelining's CSV: one row per rank (compute only, or lowered)."""
        return self._planned.to_csv(with_comms)

    def svg(self, cost=None, with_comms=False, cores=0):
        """The simulated timeline as an SVG picture."""
        return self._planned.svg(cost or self._cost, self._mem_w_ratio, with_comms, cores)

    def grid(self, with_comms=False):
        """The text grid of `pptrain schedule --grid`."""
        return self._planned.grid(with_comms)

    def __repr__(self):
        return (f"<pptrain.plan.Schedule {self.name}: P={self.num_ranks}, V={self.chunks}, "
                f"M={self.num_microbatches}>")


def schedule_names():
    """Every schedule of the registry, in its order (`pptrain schedule --list`)."""
    return list(_plan.schedule_names())


def schedule(name, pp=None, microbatches=None, chunks=0, cost=DEFAULT_COST, mem_w_ratio=0.5,
             memory_limit=0, solver="heuristic", time_limit_s=60, dp=1, steps=3,
             vertical_sync=False, replicas=(), skips=()):
    """The schedule `pptrain schedule --schedule NAME` makes with these flags: zb-auto plans
    under `cost` and `memory_limit` (solver "ilp": its integer program), `dp` adds the
    data-parallel reductions, `skips` ((from, to) stage pairs) the skip connections' messages."""
    planned = _plan.make_schedule(name, pp, microbatches, chunks, cost, mem_w_ratio, memory_limit,
                                  solver, time_limit_s, dp, steps, vertical_sync, list(replicas),
                                  [tuple(s) for s in skips])
    return Schedule(planned, cost, mem_w_ratio, memory_limit)


def from_csv(text, name="imported", dp=1, cost=DEFAULT_COST, mem_w_ratio=0.5):
    """A schedule from CSV text in torch's format (`Schedule.to_csv`, or torch's own writer),
    validated: a ValueError names the rank, the position and the action of a problem."""
    return Schedule(_plan.import_csv(text, name, dp), cost, mem_w_ratio)


def partition(profile, method, pp=0, workers=0, levels=(), bandwidth=0, memory_limit=0):
    """`pptrain partition --json` as a dict: a profile (ours or PipeDream's graph.txt) cut into
    `pp` stages by method "uniform", "params" or "time" (`bandwidth`: bytes/s between stages), or
    by "pipedream" for `workers` (or `levels`: [(workers, bytes_per_s), ...], innermost first;
    `memory_limit`: bytes per worker). The dict has "method", "stages" (each "first_layer",
    "last_layer", "replicas", "compute_s"), "time_per_minibatch_s" and "speedup_vs_single"."""
    text = _plan.partition_json(os.fspath(profile), method, pp, workers,
                                [(int(n), float(b)) for n, b in levels], bandwidth, memory_limit)
    return json.loads(text)


class Plan(dict):
    """A finished joint search: plan.json as a dict ("winner", "ranked", "evaluated",
    "fitting", the settings), and each ranked candidate's schedule."""

    def __init__(self, result):
        super().__init__(json.loads(result.json))
        self._result = result

    def schedule(self, index=0):
        """The schedule of ranked[index] (the winner by default), compute only as the plan
        folder's schedule.csv, with the candidate's own cost model (ms and bytes from the
        profile): simulate()["makespan"] is its step_ms."""
        return Schedule(self._result.candidate(index), cost="")


def plan(profile, workers, memory_limit=0, batch=0, microbatches=(), partitions=(),
         schedules=(), recompute=(False, True), optimizer="adamw", mem_w_ratio=0.5,
         w_fraction=None, max_chunks=4, top=10, memory_margin=0.05, jobs=0, out=None):
    """`pptrain plan`: partition x schedule x microbatches x recomputation for a profile (ours
    or PipeDream's graph.txt) on `workers` ranks under `memory_limit` bytes per rank (0: none),
    ranked by simulated step time; plans are made under memory_limit x (1 - memory_margin), the
    margin kept for the memory model's error and the allocator's slack, on `jobs` threads (0: the
    machine's cores; the same plan for any number). Returns plan.json as a dict (a Plan, whose schedule(i) is
    the i-th ranked candidate's schedule): the search's settings, how many
    candidates it "evaluated" and how many were "fitting", the "winner" and the "ranked" best
    `top` (each with its partition, stage layers, schedule, chunks, microbatches, recompute,
    simulated step time, bubble and per-rank peak bytes); with `out`, also writes the folder that
    `pptrain train --plan OUT/plan.json` runs. Errors: ValueError with the CLI's message."""
    result = _plan.plan(os.fspath(profile), workers, memory_limit, batch, list(microbatches),
                        list(partitions), list(schedules), [bool(r) for r in recompute],
                        optimizer, mem_w_ratio, w_fraction, max_chunks, top, memory_margin,
                        jobs, "" if out is None else os.fspath(out))
    return Plan(result)


def compare(out=None, only=None, pptrain=None, model="gpt", layers=8, d_model=64, heads=4,
            seq_len=64, data="default", pp=4, batch_size=32, microbatches=8, steps=300, seed=1,
            loss_at=0, progress=None):
    """`pptrain compare` (docs/APPROACHES.md): trains one configuration with each approach of the
    survey (`only`: a comma list or a list of survey names or schedules; None: all 14) plus a
    `--pp 1` reference, one `pptrain train` child process after the other, and returns
    compare.json as a dict: "command", "config", "reference", "approaches" (each with its
    "status", "measured" figures and "survey" marks) and "disagreements". With `out`, also writes
    compare.md, compare.json, losses.svg and runs/ there, as the CLI does; without, the runs go to
    a temporary folder, removed afterwards. `pptrain` is the binary that trains (with its
    pptrain-runtime; default: `pptrain` on the PATH); `progress` (e.g. print) gets a line per run
    as it ends. The other keywords are the CLI's flags (`loss_at` 0: steps // 2). Errors:
    ValueError with the CLI's message."""
    if pptrain is None:
        pptrain = shutil.which("pptrain")
        if pptrain is None:
            raise PlanError("compare: no pptrain on the PATH to train with; give "
                            "pptrain=PATH (the binary, with its pptrain-runtime beside it)")
    if only is not None and not isinstance(only, str):
        only = ",".join(only)
    flags = dict(only=only, pptrain=os.fspath(pptrain), model=model, layers=layers,
                 d_model=d_model, heads=heads, seq_len=seq_len, data=os.fspath(data), pp=pp,
                 batch_size=batch_size, microbatches=microbatches, steps=steps, seed=seed,
                 loss_at=loss_at, progress=progress)
    if out is not None:
        return json.loads(_plan.compare(os.fspath(out), True, **flags))
    with tempfile.TemporaryDirectory(prefix="pptrain-compare-") as folder:
        return json.loads(_plan.compare(folder, False, **flags))
