"""pptrain's schedules from Python, without torch: make one by name, look at it, simulate it, and
hand its CSV to torch.distributed.pipelining (docs/PYTHON.md).

    from pptrain import plan
    s = plan.schedule("zb-v", pp=4, microbatches=8)
    s.actions()[0][:4]              # ['0F0', '0F1', '0F2', '0F3']
    s.simulate("F=1,I=1,W=1")       # {'makespan': ..., 'bubble_ratio': ..., 'ranks': [...]}
    s.simulate({"F": 1, "comm": 0.1}).makespan   # the cost as a dict; keys read as attributes
    open("zb-v.csv", "w").write(s.to_csv())
    plan.from_csv(open("zb-v.csv").read()).simulate()
    plan.compare(out="cmp", only="1f1b,pipedream", steps=3)   # pptrain compare, as a dict

Errors are ValueError (pptrain.plan.PlanError) with the CLI's one-line message; an invalid
schedule's (ScheduleError, a PlanError) names the rank, the position and the action, then shows
the grid, and carries them as `rank`, `position` and `reason`.
"""

from __future__ import annotations

import json
import numbers
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, Union

from . import _plan

PlanError = _plan.PlanError
ScheduleError = _plan.ScheduleError
DEFAULT_COST = "F=1,I=1,W=1,comm=0"

# A cost model: the text of `pptrain schedule --cost` ("F=1,I=1,W=1,comm=0.1") or the same as a
# dict of numbers ({"F": 1, "I": 1, "W": 1, "comm": 0.1}, or dict(F=1, comm=0.1)); a key left
# out keeps its default (F=1,I=1,W=1,comm=0).
Cost = Union[str, Mapping[str, float]]
StrPath = Union[str, "os.PathLike[str]"]  # a file or folder: text, or a pathlib.Path


def _cost_text(cost: Cost) -> str:
    """The text form of a cost model given as text or as a dict. The keys are checked where the
    text is parsed (sim/cost_model.h), which names an unknown one; here only what would not
    survive the trip through text: a key with a ',' or '=' in it, a value that is no number."""
    if isinstance(cost, str):
        return cost
    if not isinstance(cost, Mapping):
        raise PlanError(f"cost model: expected text such as 'F=1,comm=0.1' or a dict such as "
                        f"{{'F': 1, 'comm': 0.1}}, got {type(cost).__name__}")
    pieces: list[str] = []
    for key, value in cost.items():
        if not isinstance(key, str) or "," in key or "=" in key:
            raise PlanError(f"cost model: unknown key {key!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise PlanError(f"cost model: value of {key} must be a number, got {value!r}")
        # repr() of a float is the shortest text that reads back as the same double.
        number = str(int(value)) if isinstance(value, numbers.Integral) else repr(float(value))
        pieces.append(f"{key}={number}")
    return ",".join(pieces)


class Result(dict[str, Any]):
    """A result as a dict whose keys also read as attributes: r["makespan"] or r.makespan,
    r["ranks"][0]["busy"] or r.ranks[0].busy. It equals the plain dict of the same items. A key
    named as a dict method ("items", "keys", ...) reads only as a key."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no key {name!r}") from None


def _result(text: str) -> Result:
    """JSON text as a Result, with every object in it one too."""
    out: Result = json.loads(text, object_hook=Result)
    return out


class Schedule:
    """A validated schedule: its actions per rank (torch's text form), and what the simulator
    makes of it under a cost model (a Cost: "F=1,I=1,W=1,comm=0" as `pptrain schedule --cost`,
    or {"F": 1, "comm": 0}; a planned candidate's schedule simulates under the candidate's own
    costs unless given one)."""

    def __init__(self, planned: _plan.Schedule, cost: Cost = DEFAULT_COST,
                 mem_w_ratio: float = 0.5, memory_limit: float = 0) -> None:
        self._planned = planned
        self._cost = _cost_text(cost)
        self._mem_w_ratio = mem_w_ratio
        self._memory_limit = memory_limit

    @property
    def name(self) -> str:
        return self._planned.name

    @property
    def num_ranks(self) -> int:
        return self._planned.num_ranks

    @property
    def num_stages(self) -> int:
        return self._planned.num_stages

    @property
    def num_microbatches(self) -> int:
        return self._planned.num_microbatches

    @property
    def chunks(self) -> int:
        return self._planned.chunks

    @property
    def synchronous(self) -> bool:
        return self._planned.synchronous

    @property
    def skips(self) -> list[tuple[int, int]]:
        return self._planned.skips

    def _cost_or_own(self, cost: Optional[Cost]) -> str:
        return _cost_text(cost) if cost else self._cost

    def actions(self, with_comms: bool = False) -> list[list[str]]:
        """Each rank's actions in order, e.g. '0F1', '2I0', '1SEND_F3' (with_comms)."""
        return self._planned.actions(with_comms)

    def simulate(self, cost: Optional[Cost] = None, memory_limit: Optional[float] = None,
                 cores: float = 0) -> Result:
        """What `pptrain schedule --json` prints, as a Result (a dict): makespan, bubble_ratio,
        and per rank busy, idle, peak_activations, peak_memory and weight_versions."""
        return _result(self._planned.summary_json(
            self._cost_or_own(cost), self._mem_w_ratio,
            self._memory_limit if memory_limit is None else memory_limit, cores))

    def trace(self, cost: Optional[Cost] = None, cores: float = 0) -> str:
        """The simulated timeline as Chrome trace-event JSON text (chrome://tracing,
        Perfetto), as `pptrain schedule --trace` writes it."""
        return self._planned.trace(self._cost_or_own(cost), self._mem_w_ratio, cores)

    def to_csv(self, with_comms: bool = False) -> str:
        """torch.distributed.pipelining's CSV: one row per rank (compute only, or lowered)."""
        return self._planned.to_csv(with_comms)

    def svg(self, cost: Optional[Cost] = None, with_comms: bool = False,
            cores: float = 0) -> str:
        """The simulated timeline as an SVG picture."""
        return self._planned.svg(self._cost_or_own(cost), self._mem_w_ratio, with_comms, cores)

    def grid(self, with_comms: bool = False) -> str:
        """The text grid of `pptrain schedule --grid`."""
        return self._planned.grid(with_comms)

    def __repr__(self) -> str:
        return (f"<pptrain.plan.Schedule {self.name}: P={self.num_ranks}, V={self.chunks}, "
                f"M={self.num_microbatches}>")


def schedule_names() -> list[str]:
    """Every schedule of the registry, in its order (`pptrain schedule --list`)."""
    return list(_plan.schedule_names())


def schedule(name: str, pp: Optional[int] = None, microbatches: Optional[int] = None,
             chunks: int = 0, cost: Cost = DEFAULT_COST, mem_w_ratio: float = 0.5,
             memory_limit: float = 0, solver: str = "heuristic", time_limit_s: float = 60,
             dp: int = 1, steps: int = 3, replicas: Iterable[int] = (),
             skips: Iterable[tuple[int, int]] = (), **family: Union[bool, int, float]) -> Schedule:
    """The schedule `pptrain schedule --schedule NAME` makes with these flags: zb-auto plans
    under `cost` and `memory_limit` (solver "ilp": its integer program), `dp` adds the
    data-parallel reductions, `skips` ((from, to) stage pairs) the skip connections' messages.
    `family`: the schedule family's options, as `pptrain schedule`'s flags without their dashes,
    '_' for '-' (`vertical_sync=True` for pipedream, `update_interval=2` for ampnet)."""
    planned = _plan.make_schedule(name, pp, microbatches, chunks, _cost_text(cost), mem_w_ratio,
                                  memory_limit, solver, time_limit_s, dp, steps, list(replicas),
                                  [(a, b) for a, b in skips], dict(family))
    return Schedule(planned, cost, mem_w_ratio, memory_limit)


def from_csv(text: str, name: str = "imported", dp: int = 1, cost: Cost = DEFAULT_COST,
             mem_w_ratio: float = 0.5) -> Schedule:
    """A schedule from CSV text in torch's format (`Schedule.to_csv`, or torch's own writer),
    validated: a ValueError names the rank, the position and the action of a problem."""
    return Schedule(_plan.import_csv(text, name, dp), cost, mem_w_ratio)


def partition(profile: StrPath, method: str, pp: int = 0, workers: int = 0,
              levels: Iterable[tuple[int, float]] = (), bandwidth: float = 0,
              memory_limit: float = 0) -> Result:
    """`pptrain partition --json` as a Result (a dict): a profile (ours or PipeDream's
    graph.txt) cut into `pp` stages by method "uniform", "params" or "time" (`bandwidth`: bytes/s
    between stages), or by "pipedream" for `workers` (or `levels`: [(workers, bytes_per_s), ...],
    innermost first; `memory_limit`: bytes per worker). The dict has "method", "stages" (each
    "first_layer", "last_layer", "replicas", "compute_s"), "time_per_minibatch_s" and
    "speedup_vs_single"."""
    text = _plan.partition_json(os.fspath(profile), method, pp, workers,
                                [(int(n), float(b)) for n, b in levels], bandwidth, memory_limit)
    return _result(text)


class Plan(Result):
    """A finished joint search: plan.json as a Result (a dict: "winner", "ranked", "evaluated",
    "fitting", the settings), and each ranked candidate's schedule."""

    def __init__(self, result: _plan.PlanResult) -> None:
        super().__init__(_result(result.json))
        self._result = result

    def schedule(self, index: int = 0) -> Schedule:
        """The schedule of ranked[index] (the winner by default), compute only as the plan
        folder's schedule.csv, with the candidate's own cost model (ms and bytes from the
        profile): simulate()["makespan"] is its step_ms."""
        return Schedule(self._result.candidate(index), cost="")


def plan(profile: StrPath, workers: int, memory_limit: float = 0, batch: int = 0,
         microbatches: Iterable[int] = (), partitions: Iterable[str] = (),
         schedules: Iterable[str] = (), recompute: Iterable[bool] = (False, True),
         optimizer: str = "adamw", mem_w_ratio: float = 0.5, w_fraction: Optional[float] = None,
         max_chunks: int = 4, top: int = 10, memory_margin: float = 0.05, jobs: int = 0,
         out: Optional[StrPath] = None) -> Plan:
    """`pptrain plan`: partition x schedule x microbatches x recomputation for a profile (ours
    or PipeDream's graph.txt) on `workers` ranks under `memory_limit` bytes per rank (0: none),
    ranked by simulated step time; plans are made under memory_limit x (1 - memory_margin), the
    margin kept for the memory model's error and the allocator's slack, on `jobs` threads (0: the
    machine's cores; the same plan for any number). Returns plan.json as a Plan (a dict whose
    schedule(i) is the i-th ranked candidate's schedule): the search's settings, how many
    candidates it "evaluated" and how many were "fitting", the "winner" and the "ranked" best
    `top` (each with its partition, stage layers, schedule, chunks, microbatches, recompute,
    simulated step time, bubble and per-rank peak bytes); with `out`, also writes the folder that
    `pptrain train --plan OUT/plan.json` runs. Errors: ValueError with the CLI's message."""
    result = _plan.plan(os.fspath(profile), workers, memory_limit, batch, list(microbatches),
                        list(partitions), list(schedules), [bool(r) for r in recompute],
                        optimizer, mem_w_ratio, w_fraction, max_chunks, top, memory_margin,
                        jobs, "" if out is None else os.fspath(out))
    return Plan(result)


def compare(out: Optional[StrPath] = None, only: Union[str, Iterable[str], None] = None,
            pptrain: Optional[StrPath] = None, model: str = "gpt", layers: int = 8,
            d_model: int = 64, heads: int = 4, seq_len: int = 64, data: StrPath = "default",
            pp: int = 4, batch_size: int = 32, microbatches: int = 8, steps: int = 300,
            seed: int = 1, loss_at: int = 0,
            progress: Optional[Callable[[str], object]] = None) -> Result:
    """`pptrain compare` (docs/APPROACHES.md): trains one configuration with each approach of the
    survey (`only`: a comma list or a list of survey names or schedules; None: all 14) plus a
    `--pp 1` reference, one `pptrain train` child process after the other, and returns
    compare.json as a Result (a dict): "command", "config", "reference", "approaches" (each with
    its "status", "measured" figures and "survey" marks) and "disagreements". With `out`, also
    writes compare.md, compare.json, losses.svg and runs/ there, as the CLI does; without, the
    runs go to a temporary folder, removed afterwards. `pptrain` is the binary that trains (with its
    pptrain-runtime; default: `pptrain` on the PATH); `progress` (e.g. print) gets a line per run
    as it ends. The other keywords are the CLI's flags (`loss_at` 0: steps // 2). Errors:
    ValueError with the CLI's message."""
    if pptrain is None:
        pptrain = shutil.which("pptrain")
        if pptrain is None:
            raise PlanError("compare: no pptrain on the PATH to train with; give "
                            "pptrain=PATH (the binary, with its pptrain-runtime beside it)")
    names = only if only is None or isinstance(only, str) else ",".join(only)
    trainer = os.fspath(pptrain)

    def run(folder: str, write_files: bool) -> Result:
        return _result(_plan.compare(
            folder, write_files, only=names, pptrain=trainer, model=model, layers=layers,
            d_model=d_model, heads=heads, seq_len=seq_len, data=os.fspath(data), pp=pp,
            batch_size=batch_size, microbatches=microbatches, steps=steps, seed=seed,
            loss_at=loss_at, progress=progress))

    if out is not None:
        return run(os.fspath(out), True)
    with tempfile.TemporaryDirectory(prefix="pptrain-compare-") as folder:
        return run(folder, False)
