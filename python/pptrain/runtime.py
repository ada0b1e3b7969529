"""Pipeline-parallel training of your own torch.nn.Module, shaped after torch.distributed.pipelining.

    import torch, pptrain
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    rank, size = pptrain.world()                      # torchrun's, `pptrain run`'s, srun's, mpirun's
    stage = pptrain.PipelineStage(pptrain.split(model, [2])[rank], rank, size)
    schedule = pptrain.schedule("zb-h1", [stage], n_microbatches=4,
                                loss_fn=torch.nn.functional.mse_loss)
    loss = schedule.step(x, target=y)   # the mean loss on the last stage's rank, else None
    optimizer.step()                    # the gradients are in the module's own parameters

Every rank builds the same model (same seed) and calls step() with the same batch; the first
stage's rank reads the inputs, the last stage's rank the targets. A stage's input and output may
be a tensor, a tuple of tensors or a dict of them (ids and masks travel forward only); their
shapes may change from batch to batch. Any synchronous schedule of `pptrain schedule --list` runs;
the zero-bubble ones split each backward into I and W, the linear layers' weight products
waiting for W. Errors in your module or loss stop the run with the Python traceback on that
rank and a ValueError naming the stage.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections import OrderedDict
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import torch

from . import _build


def _check_torch() -> None:
    """Stops the import in one line when the torch imported is not the one the extension was
    built against: its C++ symbols would not match (a crash or an unresolved symbol)."""
    built, running = _build.TORCH_VERSION, str(torch.__version__)
    if running == built:
        return

    def minor(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", version)[:2])

    if minor(running) < minor(_build.TORCH_MINIMUM):
        raise ImportError(f"pptrain: torch {running} is older than {_build.TORCH_MINIMUM}, the "
                          f"oldest pptrain supports (this pptrain was built against torch {built})")
    raise ImportError(f"pptrain: this pptrain was built against torch {built}, but torch "
                      f"{running} is imported (from {os.path.dirname(torch.__file__)}): build "
                      f"pptrain again in this environment (pip install .)")


_check_torch()

from . import _runtime  # noqa: E402  (after the check: it links the torch it was built with)

# What a stage takes and returns, and what step() takes: a tensor, a tuple or list of them, or a
# dict of them.
Tensors = Union[torch.Tensor, Sequence[torch.Tensor], Mapping[str, torch.Tensor]]

PipelineError = _runtime.PipelineError


def world() -> tuple[int, int]:
    """(rank, size) of this process; joins the run on first use (started by torchrun, `pptrain
    run`, srun or mpirun: docs/CLI.md, "Several nodes"; else a world of one)."""
    return _runtime.world()


def placement(name: str, n_microbatches: int, chunks: int = 0, schedule_file: str = "",
              data_parallel: int = 1) -> tuple[int, list[int]]:
    """(number of stages, the stages this rank holds) for the schedule: with zb-v on 2 ranks,
    (4, [0, 3]) on rank 0 and (4, [1, 2]) on rank 1. With data_parallel D, the world holds D
    copies of the pipeline: rank r runs the stages of pipeline rank r % (size / D) in copy
    r // (size / D)."""
    num_stages, local = _runtime.placement(name, n_microbatches, chunks, schedule_file,
                                           data_parallel)
    return num_stages, list(local)


def split(model: torch.nn.Module | Sequence[torch.nn.Module],
          split_points: Sequence[int]) -> list[torch.nn.Sequential]:
    """Cuts an nn.Sequential (or a list of modules) before each split point: [2, 5] gives the
    parts [0, 2), [2, 5) and [5, len). The parts share the modules of `model` and name them as
    `model` does ("2", "3", ...), so a part's state_dict is its share of the model's: what lets a
    checkpoint load at another pipeline depth."""
    layers = list(model)
    names = [str(i) for i in range(len(layers))]
    if isinstance(model, torch.nn.Sequential):
        names = list(model._modules)
    bounds = [0] + list(split_points) + [len(layers)]
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"split points {list(split_points)} must be ascending in 1..{len(layers) - 1}")
    return [torch.nn.Sequential(OrderedDict(zip(names[a:b], layers[a:b])))
            for a, b in zip(bounds, bounds[1:])]


class Linear(torch.nn.Linear):  # type: ignore[misc]  # torch has no types here
    """torch.nn.Linear (the same parameters, initialisation and state_dict) whose backward can
    leave its weight gradients to the W of a zero-bubble schedule, in every step (a
    torch.nn.Linear does so only inside the step of a schedule with weight_split="deferred",
    _deferred_linears()). Elsewhere it computes what torch.nn.Linear does."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _runtime.linear(input, self.weight, self.bias)


_plain_linear = torch.nn.functional.linear
_deferring = 0  # the steps of deferring schedules under way (nested: one_process in a step)


def _deferrable_linear(input: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """torch.nn.functional.linear as pptrain.Linear computes it when its weight takes a gradient:
    W adds the weight product to the parameter's .grad, or to the rows of it a weight that is a
    slice of one covers (the query and key-value parts of MultiheadAttention's packed
    projection); any other weight's gradient (one computed from parameters) goes through
    autograd in I. A weight without a gradient goes to torch's."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return _runtime.linear(input, weight, bias)
    return _plain_linear(input, weight, bias)


@contextlib.contextmanager
def _deferred_linears() -> Any:
    """While a step of a schedule with weight_split="deferred" runs: every product of
    torch.nn.functional.linear whose weight is a parameter (torch.nn.Linear's, the projections
    of torch.nn.MultiheadAttention and so of the Transformer layers, a module's own F.linear)
    is pptrain.Linear's, so the I of a split backward computes only its input's gradient and W
    its weight's. torch.nn.functional.linear is swapped for the step, in the whole process: a
    product on another thread meanwhile computes what torch's does (no W guard there), and a
    hook on such a parameter never sees its gradient, which W adds to .grad itself."""
    global _deferring
    if _deferring == 0:
        torch.nn.functional.linear = _deferrable_linear
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if _deferring == 0:
            torch.nn.functional.linear = _plain_linear


class PipelineStage:
    """Stage `stage_index` of `num_stages`: `module` runs it on the rank that makes it.

    batch_inputs: names of the batch's inputs (a dict) this stage, not the first, also reads
    straight from the batch (a mask, position ids), beside what the previous stage sends it, so
    that the stages before it need not pass them on; they reach its forward as keywords.

    keep_dtype: names of this stage's outputs (a dict) that keep their dtype under a schedule's
    precision="bf16" or "fp16", where its other float32 outputs are cast to it (a float32 scale
    the next stage needs in full)."""

    def __init__(self, module: torch.nn.Module, stage_index: int, num_stages: int,
                 batch_inputs: Iterable[str] = (), keep_dtype: Iterable[str] = ()) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        self.module = module
        self._stage = _runtime.Stage(module, stage_index, num_stages)
        if batch_inputs:
            self._stage.take_from_batch(list(batch_inputs))
        if keep_dtype:
            self._stage.keep_dtype(list(keep_dtype))

    @property
    def index(self) -> int:
        return self._stage.index

    @property
    def num_stages(self) -> int:
        return self._stage.num_stages

    def tie(self, name: str, parameter: torch.Tensor) -> None:
        """Declares `parameter` (one of this stage's) this stage's copy of the parameter `name`
        shared between stages (a language model's token embedding on the first stage and its
        output head on the last), which schedule(..., tied={name: [stages]}) lists. pptrain
        makes the copies equal before the first step (the lowest stage's values) and sums their
        gradients over the copies in every step, so they stay equal bit for bit and training
        equals one model holding one shared tensor."""
        self._stage.tie(name, parameter)


LossFn = Callable[[Any, Any], torch.Tensor]


def _has_weight_actions(csv: str) -> bool:
    """Whether a schedule's CSV (torch's form) splits a backward: it holds a W (such as 2W0)."""
    return re.search(r"(^|[,;(])\d+W\d+", csv, re.MULTILINE) is not None


class Schedule:
    """A schedule running this rank's stages; make it with pptrain.schedule()."""

    def __init__(self, name: str, stages: PipelineStage | Sequence[PipelineStage],
                 n_microbatches: int, loss_fn: LossFn, chunks: int = 0, schedule_file: str = "",
                 recompute: bool = False, optimizer: Mapping[str, Any] | None = None,
                 steps: int = 0, one_process: bool = False, metrics: str = "", svg: str = "",
                 trace: str = "", weight_split: str = "deferred", tokens_per_sample: float = 1,
                 data_parallel: int = 1, zero: int = 0,
                 tied: Mapping[str, Sequence[int]] | None = None,
                 skips: Sequence[tuple[str, int, int]] = (),
                 data_parallel_shares: Sequence[int] = (), precision: str = "fp32",
                 weight_casts: str = "microbatch", **family: Any) -> None:
        if isinstance(stages, PipelineStage):
            stages = [stages]
        self.stages = list(stages)
        self._schedule = _runtime.Schedule(
            [s._stage for s in self.stages], name, n_microbatches, loss_fn, chunks=chunks,
            schedule_file=schedule_file, recompute=recompute, optimizer=optimizer, steps=steps,
            one_process=one_process, metrics=metrics, svg=svg, trace=trace, family=family,
            weight_split=weight_split, tokens_per_sample=tokens_per_sample,
            data_parallel=data_parallel, zero=zero, tied=dict(tied or {}), skips=list(skips),
            data_parallel_shares=list(data_parallel_shares), precision=precision,
            weight_casts=weight_casts)
        # Whether this rank's steps run its linear layers' weight products in W.
        self._defers = weight_split == "deferred" and _has_weight_actions(self._schedule.csv())

    def _step_context(self) -> Any:
        return _deferred_linears() if self._defers else contextlib.nullcontext()

    def step(self, *args: Any, target: Tensors | None = None) -> torch.Tensor | None:
        """One training step on a mini-batch split into the microbatches; returns the mean loss on
        the rank holding the last stage, None elsewhere. Without `optimizer`, the gradients of
        the mini-batch mean are left in the stages' parameters for your optimizer; with it,
        pptrain has stepped them.

        step(source), with `source(step)` returning (inputs, target), takes each step's batch
        from the source instead: what the asynchronous schedules need, since their first stage
        runs ahead into later steps' microbatches."""
        with self._step_context():
            if len(args) == 1 and target is None and callable(args[0]):
                return self._schedule.step_from(args[0])
            inputs = None if not args else args[0] if len(args) == 1 else tuple(args)
            return self._schedule.step(inputs, target)

    def report(self) -> dict[str, Any] | None:
        """The latest step's figures on rank 0 (None on the others, and before the first step):
        the dict of a `pptrain train --metrics` line (step, loss, step_time_s, samples_per_s,
        bubble_ratio, grad_norm, and per rank peak_activation_bytes, bytes_sent, ...)."""
        return self._schedule.report()

    def compare_sim(self) -> dict[str, Any] | None:
        """Where the steps' time went: the schedule simulated with the costs measured in the
        steps since the last call (the first step of the schedule left out as a warm-up; the
        latest 64 at most) against their measured makespan, the dict `pptrain train
        --compare-sim` writes in its --metrics line's "compare_sim" (predicted_makespan_s,
        measured_makespan_s, predicted_bubble_ratio, measured_bubble_ratio, action_overhead_s,
        send_overhead_s, recv_overhead_s, comm_latency_s, stage_forward_s,
        stage_backward_input_s, stage_backward_weight_s, stage_backward_s, ...; docs/PYTHON.md).
        On rank 0; None on the others and when no such step ran."""
        return self._schedule.compare_sim()

    def finish(self) -> None:
        """Waits until every rank is done with the schedule (optional: dropping it waits for
        nobody, so that a rank that failed never hangs the others)."""
        self._schedule.finish()

    def csv(self) -> str:
        """The schedule every rank runs, with its SEND and RECV actions, in torch's CSV form."""
        return self._schedule.csv()

    def save(self, path: str | os.PathLike[str], step: int,
             optimizer: torch.optim.Optimizer | None = None, keep: int = 1) -> None:
        """Every rank, after `step` steps: saves the run as a checkpoint folder at `path`, whole or
        not at all (written into PATH.partial, then swapped into place; a kill at any moment leaves
        the previous checkpoint or the new one). Stage s's parameters go to `stage_<s>.pt`, its
        module's state_dict as torch.save writes it (torch.load reads it back), written once (by
        the first data-parallel copy); pptrain's optimizer state and an asynchronous run's state
        between two steps are added, and with `optimizer` (your own) each rank's
        `optimizer.state_dict()` as `optimizer_rank<r>.pt`. keep: how many checkpoints to keep,
        the older ones beside it as PATH.step-<k>."""
        saved = set(self._schedule.saved_stages())
        files = {f"stage_{s.index}.pt": _bytes_of(s.module.state_dict())
                 for s in self.stages if s.index in saved}
        if optimizer is not None:
            files[_optimizer_file()] = _bytes_of(optimizer.state_dict())
        self._schedule.save(os.fspath(path), step, files, keep)

    def load(self, path: str | os.PathLike[str]) -> int:
        """Loads the parameters of the checkpoint at `path` into this rank's stages, and returns
        the step it was saved after. The checkpoint may be of another pipeline depth or schedule
        when the stage modules name their parameters as the whole model does (pptrain.split's
        parts, pptrain.pipelining's stages): each stage takes its names from whichever stage
        files hold them. Nothing else is loaded: a new run starts from these parameters."""
        path = os.fspath(path)
        return _load_parameters(path, self.stages, _runtime.read_checkpoint(path, "load"))

    def resume(self, save_dir: str | os.PathLike[str],
               optimizer: torch.optim.Optimizer | None = None) -> int:
        """Before the first step: continues the newest whole checkpoint at `save_dir` (or of
        those `keep` left beside it) and returns its step, the next step's index; 0 when there is
        none yet (`pptrain train --resume auto`). The run must have the layout that saved it
        (schedule, stages, ranks, data-parallel copies, pptrain's optimizer, an asynchronous
        run's length). It loads the parameters, pptrain's optimizer state and an asynchronous
        run's state in flight, and with `optimizer` your optimizer's state."""
        path = _runtime.newest_checkpoint(os.fspath(save_dir))
        if not path:
            return 0
        info = self._schedule.resume(path)
        step = _load_parameters(path, self.stages, info)
        if optimizer is not None:
            name = os.path.join(path, _optimizer_file())
            if not os.path.exists(name):
                raise PipelineError(f"resume '{path}': it holds no {os.path.basename(name)}: "
                                    "it was saved without save(..., optimizer=)")
            optimizer.load_state_dict(torch.load(name, map_location="cpu"))
        return step


def _bytes_of(value: Any) -> bytes:
    """What torch.save writes of `value`."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _optimizer_file() -> str:
    """The checkpoint file of this rank's own optimizer state."""
    return f"optimizer_rank{world()[0]}.pt"


def _load_parameters(path: str, stages: Sequence[PipelineStage], info: dict[str, Any]) -> int:
    """Loads each stage's state_dict from the checkpoint at `path`, whose manifest `info` holds
    (read_checkpoint's dict, its files checked): from the stage's own file when the checkpoint
    has as many stages, else by name from all of them. Returns its step."""
    files = sorted((int(m.group(1)), f) for f in info["files"]
                   if (m := re.fullmatch(r"stage_(\d+)\.pt", f)))
    same_depth = bool(stages) and info["num_stages"] == stages[0].num_stages
    wanted_files = {f"stage_{s.index}.pt" for s in stages} if same_depth else None
    read = {f: torch.load(os.path.join(path, f), map_location="cpu") for _, f in files
            if wanted_files is None or f in wanted_files}
    merged: dict[str, torch.Tensor] = {}
    holder: dict[str, str] = {}
    if not same_depth:
        for _, f in files:
            for key, value in read[f].items():
                if key in merged and not torch.equal(merged[key], value):
                    raise PipelineError(
                        f"load '{path}': {holder[key]} and {f} both hold '{key}', with different "
                        "values; loading at another depth needs stage modules named as in the "
                        "whole model (pptrain.split's parts are)")
                merged.setdefault(key, value)
                holder.setdefault(key, f)
    for stage in stages:
        source = f"stage_{stage.index}.pt"
        if same_depth:
            if source not in read:
                raise PipelineError(f"load '{path}': it holds no {source}")
            state = read[source]
        else:
            source, state = f"any stage file of its {info['num_stages']} stages", merged
        wanted = stage.module.state_dict()
        missing = [k for k in wanted if k not in state]
        if missing:
            raise PipelineError(f"load '{path}': stage {stage.index}'s '{missing[0]}' is not in "
                                f"{source} ({len(missing)} missing)")
        extra = [k for k in state if k not in wanted] if same_depth else []
        if extra:
            raise PipelineError(f"load '{path}': {source} holds '{extra[0]}', which stage "
                                f"{stage.index}'s module does not have")
        for key, value in wanted.items():
            if state[key].shape != value.shape:
                raise PipelineError(f"load '{path}': '{key}' is {list(state[key].shape)} in "
                                    f"{source}, {list(value.shape)} in stage {stage.index}")
        stage.module.load_state_dict({k: state[k] for k in wanted})
    return int(info["step"])


def schedule(name: str, stages: PipelineStage | Sequence[PipelineStage], n_microbatches: int,
             loss_fn: LossFn, chunks: int = 0, schedule_file: str = "", recompute: bool = False,
             optimizer: Mapping[str, Any] | None = None, steps: int = 0,
             one_process: bool = False, metrics: str = "", svg: str = "", trace: str = "",
             weight_split: str = "deferred", tokens_per_sample: float = 1,
             data_parallel: int = 1, zero: int = 0,
             tied: Mapping[str, Sequence[int]] | None = None,
             skips: Sequence[tuple[str, int, int]] = (),
             data_parallel_shares: Sequence[int] = (), precision: str = "fp32",
             weight_casts: str = "microbatch", **family: Any) -> Schedule:
    """A schedule of pptrain's registry by name ("gpipe", "1f1b", "zb-h1", "zb-v", "pipedream",
    ...), or a CSV file in torch's format, over this rank's stages.

    optimizer: pptrain steps the stages itself, e.g. {"kind": "sgd", "lr": 0.05, "momentum": 0.9,
    "warmup_steps": 0, "clip": 1.0} ("adamw" too). The asynchronous schedules (pipedream, 2bw,
    pipemare, ...) need it, and `steps`, the run's length: they step each stage between
    microbatches, on weight versions. one_process: run the schedule's rule with every stage on
    this one process, one microbatch after the other (what an asynchronous pipeline must
    reproduce; give it all the stages). metrics, svg, trace: files rank 0 writes as `pptrain
    train` does (a JSON line per step; the measured timeline of the last step as an SVG picture
    and as a Chrome trace), the last two when the schedule is finished or dropped. weight_split: how
    a zero-bubble schedule splits a backward into I and W: "deferred" (the default: the weight
    products of the linear layers, torch.nn.Linear's, pptrain.Linear's, the attention
    projections, wait for W; the other layers compute their weight gradients in I; one pass
    over the graph) or "autograd" (I keeps the gradient that reached each node that also leads to a
    parameter, and W runs those nodes again for the parameters alone: every weight gradient
    in W; for a module whose parameters carry hooks, which never see a deferred product's
    gradient).
    tokens_per_sample: what the reports' tokens_per_s counts per sample (0: the length of the
    input's dimension 1, batch by batch).

    data_parallel: D copies of the pipeline over the world (placement() with the same D says
    which stages a rank holds); each copy's ranks call step() with their copy's share of the
    batch, and a stage's copies average their gradients. data_parallel_shares: each copy's
    samples per step when they are not equal, e.g. [6, 2] (copy d's ranks pass step() that
    many rows, each a multiple of n_microbatches): a copy's gradients are then weighed by its
    share, so a step is still the whole batch's mean. zero=1 shards pptrain's optimizer state
    over the copies (ZeRO stage 1; needs `optimizer`). tied: {name: [stages]}, parameters shared
    between stages, each stage's copy declared with PipelineStage.tie(). skips: [(name, from,
    to)], the tensor `name` of stage `from`'s output (a dict) goes straight to stage `to`,
    arriving as the keyword `name` of its forward, and its gradient straight back (synchronous
    schedules).

    precision: "fp32", "bf16" or "fp16": each stage's forward under autocast to that dtype, its
    float32 outputs (so the messages and their gradients) in it, the loss in float32, the
    parameters, gradients and pptrain's optimizer state float32 (docs/CLI.md, "Precision").
    "fp16" also scales the loss and skips a step whose gradients overflowed on any rank, on
    every rank: it needs `optimizer`. weight_casts="step" (bf16, fp16, synchronous schedules):
    each float32 weight is cast once per step and the copy kept for all its microbatches
    (torch's autocast cache), instead of at every use ("microbatch"): the same results, less
    casting, the copies' memory for the step.

    family: the schedule family's options, as `pptrain train`'s flags without their dashes, '_'
    for '-' (`pptrain train --help` lists them), e.g. update_interval=2 (ampnet), avg_alpha=0.3
    (avgpipe), no_lr_reschedule=True and pipemare_warmup=50 (pipemare); those not given take
    their defaults."""
    return Schedule(name, stages, n_microbatches, loss_fn, chunks=chunks,
                    schedule_file=schedule_file, recompute=recompute, optimizer=optimizer,
                    steps=steps, one_process=one_process, metrics=metrics, svg=svg, trace=trace,
                    weight_split=weight_split, tokens_per_sample=tokens_per_sample,
                    data_parallel=data_parallel, zero=zero, tied=tied, skips=skips,
                    data_parallel_shares=data_parallel_shares, precision=precision,
                    weight_casts=weight_casts, **family)


class TrainingFailed(RuntimeError):
    """A run of pptrain.train() that failed (a worker died, hung or stopped with an error, after
    its restarts); its message is the line naming the rank and the cause."""


def train(**options: Any) -> None:
    """Runs `pptrain train` on pptrain's own models (gpt, mlp, unet) from this process, with its
    flags as keywords: --batch-size is batch_size, a switch such as --sync-save is True.

        pptrain.train(model="gpt", layers=4, pp=2, schedule="1f1b", microbatches=4,
                      batch_size=8, steps=6, save="ckpt", save_every=2, max_restarts=2)

    The same library call as the command (its supervisor): with pp x dp above 1 the workers are
    this process forked, a failed run starts again from the newest whole checkpoint of `save` at
    most `max_restarts` times, and resume="auto" continues the newest one. Call it before this
    process computes with torch on several threads (a fork of a process whose OpenMP team has
    several threads hangs). Bad options raise PipelineError (a ValueError) before any worker
    starts; a failed run raises TrainingFailed."""
    code, message = _runtime.train(options)
    if code != 0:
        raise TrainingFailed(message)
