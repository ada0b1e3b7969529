"""torch.distributed.pipelining.schedules over pptrain: torch's schedule classes, each running
an order of pptrain's registry (or a CSV) with torch's calling convention.

    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=loss_fn)
    schedule.step(x)                            # on the first stage's rank
    output = schedule.step(target=y, losses=losses)   # on the last stage's rank
    schedule.step()                             # on the ranks between

`losses` gets the loss of each microbatch (the list is cleared first) and step() returns the
microbatches' outputs concatenated on the rank that holds the last stage, None elsewhere (and
with return_outputs=False). The gradients are left in the stages' parameters: their mean over
the microbatches, or their sum with scale_grads=False. schedule.eval(...), called as step() is,
runs the forwards alone (and the losses, given the target), as does step() on a schedule made
without a loss_fn.
"""

from __future__ import annotations

import inspect
import io
import os
import tempfile
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
import torch.fx
import torch.utils._pytree as pytree

from .. import runtime as _pptrain
from .stage import PipelineStage

__all__ = [
    "get_schedule_class",
    "PipelineScheduleSingle",
    "PipelineScheduleMulti",
    "Schedule1F1B",
    "ScheduleGPipe",
    "ScheduleInterleaved1F1B",
    "ScheduleLoopedBFS",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
]

# torch's class -> pptrain's schedule of the same order (or None: an order written here).
_ORDERS: dict[type, str] = {}


def _check_chunk_specs(name, args_chunk_spec, kwargs_chunk_spec, output_merge_spec):
    """pptrain splits every input and target along dimension 0 and concatenates the outputs so:
    torch's default, or a spec that says the same."""
    specs = list(args_chunk_spec or ()) + list((kwargs_chunk_spec or {}).values())
    if any(getattr(spec, "split_dim", None) != 0 for spec in specs):
        raise NotImplementedError(f"{name}: a chunk spec other than dimension 0 is not "
                                  "supported: pptrain splits the inputs along dimension 0")
    if output_merge_spec is not None:
        raise NotImplementedError(f"{name}: output_merge_spec is not supported: the outputs are "
                                  "concatenated along dimension 0; give None")


def _check_backward_requires_autograd(name, backward_requires_autograd):
    """torch's False is for stages whose backward needs no autograd (a dw_builder's): pptrain's
    backward always runs through autograd, and takes no dw_builder."""
    if not backward_requires_autograd:
        raise NotImplementedError(f"{name}: backward_requires_autograd=False is not supported: "
                                  "pptrain's backward always runs through autograd; give True")


def _detach(value):
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value)
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    return value


def _merge(chunks):
    """The microbatches' outputs as one batch: tensors concatenated along dimension 0, tuples
    and dicts element by element."""
    first = chunks[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(chunks) if first.dim() > 0 else torch.stack(chunks)
    if isinstance(first, (tuple, list)):
        return type(first)(_merge([c[i] for c in chunks]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _merge([c[k] for c in chunks]) for k in first}
    return chunks


_FORWARD_ONLY: Any = object()  # the order of a schedule made without a loss_fn


def _shape_text(shapes):
    return ", ".join(str(list(shape)) for shape in shapes)


def _example_shapes(module):
    """The shapes of the example microbatch's tensors that pipeline() traced `module` (a first
    stage) on, from its graph's placeholders, sorted; None for a module not traced so (a stage
    made by hand, whose messages may take any shape) or traced with a size left symbolic."""
    if not isinstance(module, torch.fx.GraphModule):
        return None
    shapes = [tuple(node.meta["val"].shape) for node in module.graph.nodes
              if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)]
    if not shapes or not all(isinstance(size, int) for shape in shapes for size in shape):
        return None
    return sorted(shapes)


def _chunk(value, n):
    """A batch (a tensor, a tuple or a dict of them) as its n microbatches along dimension 0
    (torch.tensor_split's, as torch's schedules split)."""
    if isinstance(value, torch.Tensor):
        return list(torch.tensor_split(value, n))
    if isinstance(value, (tuple, list)):
        parts = [_chunk(v, n) for v in value]
        return [type(value)(p[m] for p in parts) for m in range(n)]
    if isinstance(value, dict):
        parts = {k: _chunk(v, n) for k, v in value.items()}
        return [{k: p[m] for k, p in parts.items()} for m in range(n)]
    raise TypeError(f"the inputs hold a {type(value).__name__}; expected tensors")


def _call(module, value):
    """A stage's forward on what the previous stage gave, as pptrain passes it."""
    if isinstance(value, dict):
        return module(**value)
    if isinstance(value, (tuple, list)):
        return module(*value)
    return module(value)


def _send(value, rank, tag):
    """Posts `value` (any structure of tensors) to `rank` without waiting: the works to wait
    for, which hold its buffers. A rank never waits on a send, so ranks that each run their
    stages in ascending order never wait for each other in a circle."""
    payload = io.BytesIO()
    torch.save(value, payload)
    data = torch.frombuffer(bytearray(payload.getvalue()), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    return [dist.isend(size, rank, tag=2 * tag), dist.isend(data, rank, tag=2 * tag + 1)]


def _receive(rank, tag):
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, rank, tag=2 * tag)
    data = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(data, rank, tag=2 * tag + 1)
    return torch.load(io.BytesIO(data.numpy().tobytes()))


def _forward_only(stages, n_microbatches, inputs):
    """The forwards of one batch, without gradients, as a schedule made without a loss_fn runs
    them (torch's convention for evaluation): each rank runs its stages in ascending order, each
    on every microbatch in turn, receiving a stage's input from the rank of the stage before
    and sending its output to the rank of the next, over the program's torch.distributed group.
    Returns the last stage's outputs, one per microbatch, on its rank (else an empty list)."""
    num_stages = stages[0].num_stages
    mine = [s.stage_index for s in stages]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        rank_of = {s: r for r, held in enumerate(everyone) for s in held}
        me = dist.get_rank()
    else:
        rank_of, me = {s: 0 for s in range(num_stages)}, 0
    missing = [s for s in range(num_stages) if s not in rank_of]
    if missing:
        raise ValueError(f"no rank holds stage {missing[0]} of {num_stages}")
    local: dict[tuple[int, int], Any] = {}  # (stage, microbatch) -> its input, from this rank
    outputs = []
    sends = []
    with torch.no_grad():
        for stage in sorted(stages, key=lambda s: s.stage_index):
            index = stage.stage_index
            if index == 0:
                chunks = _chunk(inputs, n_microbatches)
            for m in range(n_microbatches):
                if index == 0:
                    value = chunks[m]
                elif rank_of[index - 1] == me:
                    value = local.pop((index, m))
                else:
                    value = _receive(rank_of[index - 1], index * n_microbatches + m)
                out = _call(stage.submod, value)
                if index == num_stages - 1:
                    outputs.append(out)
                elif rank_of[index + 1] == me:
                    local[(index + 1, m)] = out
                else:
                    sends += _send(out, rank_of[index + 1], (index + 1) * n_microbatches + m)
    for work in sends:
        work.wait()
    return outputs


class _PipelineSchedule:
    """What every class has in common: this rank's stages, the loss, step()."""

    _pptrain_name = ""  # pptrain's schedule of the class's order
    scale_grads: bool  # True: the gradients are the microbatches' mean; False: their sum

    def __init__(self, stages: Union[PipelineStage, list[PipelineStage]], n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]], scale_grads: bool, single: bool,
                 options: Optional[dict[str, Any]] = None) -> None:
        name = type(self).__name__
        if single and isinstance(stages, (list, tuple)):
            raise TypeError(f"{name} takes one stage (a PipelineStage), got a "
                            f"{type(stages).__name__} of {len(stages)}; several stages per rank "
                            "take ScheduleInterleaved1F1B, ScheduleZBVZeroBubble, ...")
        if not single and not isinstance(stages, (list, tuple)):
            raise TypeError(f"{name} takes a list of this rank's stages, got a "
                            f"{type(stages).__name__}; one stage per rank takes Schedule1F1B or "
                            "ScheduleGPipe")
        stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        if not stages:
            raise ValueError(f"{name}: no stages")
        for stage in stages:
            if not isinstance(stage, PipelineStage):
                raise TypeError(f"{name}: a stage must be a pptrain.pipelining.PipelineStage "
                                f"(or one of Pipe.build_stage), got {type(stage).__name__}")
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"{name}: n_microbatches must be a whole number >= 1, got "
                             f"{n_microbatches!r}")
        self._stages = stages
        self._stage = stages[0]
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self.scale_grads = scale_grads
        self._options = dict(options or {})
        self._has_first = any(s.is_first for s in stages)
        self._has_last = any(s.is_last for s in stages)
        self._outputs: list[Any] = []  # this step's microbatch outputs, on the last stage
        self._internal_losses: list[torch.Tensor] = []
        self._keep_outputs = True  # this step's return_outputs
        self._schedule: Any = None

    def _run(self, name="", schedule_file=""):
        """Makes pptrain's schedule of this order over the stages (without a loss_fn, the
        forwards alone run, in _forward_only())."""
        if self._loss_fn is None:
            self._schedule = _FORWARD_ONLY
            return
        chunks = len(self._stages) if len(self._stages) > 1 and not schedule_file else 0
        self._schedule = _pptrain.schedule(
            name=name, stages=self._stages, n_microbatches=self._n_microbatches,
            loss_fn=self._loss, chunks=chunks, schedule_file=schedule_file, **self._options)

    def _loss(self, output, target):
        """The program's loss of one microbatch, kept for `losses` with its output; times the
        microbatches for scale_grads=False, since pptrain's gradients are their mean."""
        loss = self._loss_fn(output, target)
        if self._keep_outputs:
            self._outputs.append(_detach(output))
        self._internal_losses.append(loss.detach())
        return loss if self.scale_grads else loss * self._n_microbatches

    def _inputs(self, args, kwargs):
        """The first stage's input as pptrain takes it: one tensor, a tuple, or a dict bound to
        the first stage's forward (keywords, or positions and keywords together)."""
        if not kwargs:
            return args[0] if len(args) == 1 else tuple(args)
        if not args:
            return dict(kwargs)
        first = next(s for s in self._stages if s.is_first)
        bound = inspect.signature(first.submod.forward).bind(*args, **kwargs)
        return dict(bound.arguments)

    def _check_traced_shapes(self, name, inputs):
        """A first stage traced by pipeline() holds the example microbatch's sizes as constants
        of its graph: a microbatch of another shape would fail in it, or compute with the
        example's sizes where its forward read one (a mean over `x.shape[1]`), silently. Which
        sizes the forward read the graph does not say, so every microbatch must have the
        example's shape, as torch's stages require."""
        example = _example_shapes(next(s for s in self._stages if s.is_first).submod)
        if example is None:
            return
        for m, chunk in enumerate(_chunk(inputs, self._n_microbatches)):
            shapes = sorted(tuple(leaf.shape) for leaf in pytree.tree_leaves(chunk)
                            if isinstance(leaf, torch.Tensor))
            if len(shapes) == len(example) and shapes != example:
                raise ValueError(
                    f"{name}: microbatch {m} of this batch has the shape {_shape_text(shapes)}, "
                    f"and stage 0 was traced by pipeline() on {_shape_text(example)}: a traced "
                    "graph holds the example's sizes, so every microbatch must have its shape "
                    "(split the batch so, or trace a new Pipe on this shape; stages made by hand, "
                    "PipelineStage(module, ...), take any shape)")

    def step(self, *args: Any, target: Any = None, losses: Optional[list] = None,
             return_outputs: bool = True, **kwargs: Any) -> Any:
        """One training step on a batch split into the microbatches along dimension 0: the
        inputs on the first stage's rank, `target` (and `losses`) on the last stage's. Returns
        the microbatches' outputs concatenated on the last stage's rank (with
        return_outputs=False, they are not kept: None), None elsewhere. Made without a
        loss_fn, the schedule runs the forwards alone, as eval() does."""
        if self._loss_fn is not None and not torch.is_grad_enabled():
            raise RuntimeError(f"{type(self).__name__}.step(): gradients are disabled (under "
                               "torch.no_grad()), and a step runs the backward; call eval() "
                               "for the forwards alone")
        return self._step("step", args, kwargs, target, losses, return_outputs,
                          forward_only=self._loss_fn is None)

    def eval(self, *args: Any, target: Any = None, losses: Optional[list] = None,
             **kwargs: Any) -> Any:
        """The forwards of one batch alone, without gradients, as step() takes it: returns the
        microbatches' outputs concatenated on the last stage's rank, None elsewhere; with a
        loss_fn and `target` there, `losses` gets each microbatch's loss. The parameters and
        their gradients are left as they were."""
        return self._step("eval", args, kwargs, target, losses, True, forward_only=True)

    def report(self) -> Optional[dict[str, Any]]:
        """pptrain's, beyond torch's API: the latest step's figures on rank 0 (the line `pptrain
        train --metrics` writes: step_time_s, bubble_ratio, and per rank compute_s,
        peak_memory_bytes, ...; pptrain.Schedule.report()). None elsewhere, before the first
        step, and for a schedule made without a loss_fn."""
        if self._schedule is None or self._schedule is _FORWARD_ONLY:
            return None
        return self._schedule.report()

    def compare_sim(self) -> Optional[dict[str, Any]]:
        """pptrain's, beyond torch's API: where the steps' time went. The schedule simulated
        with the costs measured in the steps since the last call (the first step left out as a
        warm-up) against their measured makespan, as `pptrain train --compare-sim` reports it:
        per-stage F, I, W and B seconds, the overheads between actions, the predicted and
        measured makespan and bubble (pptrain.Schedule.compare_sim()). On rank 0; None
        elsewhere, before a second step, and for a schedule made without a loss_fn."""
        if self._schedule is None or self._schedule is _FORWARD_ONLY:
            return None
        return self._schedule.compare_sim()

    def _step(self, call, args, kwargs, target, losses, return_outputs, forward_only):
        name = f"{type(self).__name__}.{call}()"
        if self._schedule is None and not forward_only:
            raise RuntimeError(f"{name}: no order to run yet; call _load_csv(path) first (a "
                               "PipelineScheduleMulti runs the order of a CSV)")
        if self._has_first and not args and not kwargs:
            raise ValueError(f"{name}: this rank holds stage 0, the first; pass the batch's "
                             f"inputs: {call}(x)")
        if self._has_last and target is None and not forward_only:
            last = self._stages[0].num_stages - 1
            raise ValueError(f"{name}: this rank holds stage {last}, the last; pass the "
                             "batch's target: step(target=y, losses=losses)")
        if (self._has_last and forward_only and losses is not None
                and (self._loss_fn is None or target is None)):
            raise ValueError(f"{name}: `losses` takes each microbatch's loss, which needs the "
                             f"schedule's loss_fn ({'none' if self._loss_fn is None else 'given'}) "
                             f"and the target ({'none' if target is None else 'given'})")
        self._outputs, self._internal_losses = [], []
        self._keep_outputs = return_outputs
        inputs = self._inputs(args, kwargs) if self._has_first else None
        if inputs is not None:
            self._check_traced_shapes(name, inputs)
        if forward_only:
            outputs = _forward_only(self._stages, self._n_microbatches, inputs)
            if not self._has_last:
                return None
            if self._loss_fn is not None and target is not None:
                with torch.no_grad():
                    self._internal_losses = [
                        self._loss_fn(output, part).detach()
                        for output, part in zip(outputs, _chunk(target, self._n_microbatches))]
            if losses is not None:
                losses.clear()
                losses.extend(self._internal_losses)
            return _merge(outputs) if return_outputs else None
        given = () if inputs is None else (inputs,)
        self._schedule.step(*given, target=target if self._has_last else None)
        if not self._has_last:
            return None
        if losses is not None:
            if self._pptrain_name == "" and len(self._internal_losses) != self._n_microbatches:
                raise RuntimeError(f"{name}: expected {self._n_microbatches} losses, got "
                                   f"{len(self._internal_losses)}")
            losses.clear()
            losses.extend(self._internal_losses)
        return _merge(self._outputs) if self._outputs else None


class PipelineScheduleSingle(_PipelineSchedule):
    """The schedules of one stage per rank."""

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]] = None,
                 args_chunk_spec: Optional[tuple] = None,
                 kwargs_chunk_spec: Optional[dict] = None, output_merge_spec: Any = None,
                 scale_grads: bool = True) -> None:
        if type(self) not in _ORDERS:
            raise NotImplementedError(
                f"{type(self).__name__}: pptrain runs the orders of its registry, not a "
                "PipelineScheduleSingle of its own; make ScheduleGPipe or Schedule1F1B, or run "
                "a CSV with _PipelineScheduleRuntime._load_csv")
        _check_chunk_specs(type(self).__name__, args_chunk_spec, kwargs_chunk_spec,
                           output_merge_spec)
        super().__init__(stage, n_microbatches, loss_fn, scale_grads, single=True)
        self._run(name=_ORDERS[type(self)])


class PipelineScheduleMulti(_PipelineSchedule):
    """The schedules of several stages per rank. Made as such, it runs the order of a CSV
    file: _load_csv(path)."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]] = None,
                 args_chunk_spec: Optional[tuple] = None,
                 kwargs_chunk_spec: Optional[dict] = None, output_merge_spec: Any = None,
                 use_full_backward: Optional[bool] = None, scale_grads: bool = True,
                 backward_requires_autograd: bool = True, *,
                 weight_split: str = "deferred") -> None:
        # use_full_backward: deprecated in torch, which ignores it; so does pptrain.
        # weight_split (pptrain's, beyond torch's signature): how an order with I and W splits
        # a backward, as pptrain.schedule() takes it.
        _check_chunk_specs(type(self).__name__, args_chunk_spec, kwargs_chunk_spec,
                           output_merge_spec)
        _check_backward_requires_autograd(type(self).__name__, backward_requires_autograd)
        super().__init__(stages, n_microbatches, loss_fn, scale_grads, single=False,
                         options={"weight_split": weight_split})
        order = _ORDERS.get(type(self))
        csv = self._order_csv()
        if csv is not None:
            self._run_text(csv)
        elif order is not None:
            self._run(name=order)

    def _order_csv(self) -> Optional[str]:
        """The class's order written here as a CSV, or None: its order is the registry's (or,
        made as such, a CSV's of _load_csv)."""
        return None

    def _load_csv(self, filename: Union[str, os.PathLike], format: str = "compute_only") -> None:
        """Runs the order of a schedule CSV in torch's form: compute actions only
        ("compute_only") or with their SEND and RECV ("compute_comms"); pptrain reads both."""
        if format not in ("compute_only", "compute_comms"):
            raise ValueError(f"_load_csv: format {format!r} is not compute_only or "
                             "compute_comms")
        if not os.path.isfile(filename):
            raise ValueError(f"_load_csv: no file {filename!r}")
        self._run(schedule_file=os.fspath(filename))

    def _run_text(self, csv):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "schedule.csv")
            with open(path, "w") as f:
                f.write(csv)
            self._run(schedule_file=path)


class ScheduleGPipe(PipelineScheduleSingle):
    """GPipe: all forwards, then all backwards (pptrain's gpipe)."""


class Schedule1F1B(PipelineScheduleSingle):
    """1F1B: warm-up forwards, then one forward one backward (pptrain's 1f1b)."""


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Interleaved 1F1B: stage s on rank s mod P (pptrain's interleaved-1f1b, which takes fewer
    microbatches than ranks as one group of them)."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]] = None,
                 args_chunk_spec: Optional[tuple] = None,
                 kwargs_chunk_spec: Optional[dict] = None, output_merge_spec: Any = None,
                 scale_grads: bool = True, backward_requires_autograd: bool = True, *,
                 weight_split: str = "deferred") -> None:
        # Explicit: the classes of the same signature below share this method (torch's
        # signature for them, without the base's use_full_backward: hence their type: ignore).
        PipelineScheduleMulti.__init__(
            self, stages, n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
            output_merge_spec, scale_grads=scale_grads,
            backward_requires_autograd=backward_requires_autograd, weight_split=weight_split)


def _looped(schedule_name, stage, n_microbatches):
    """(ranks, stages per rank) of a placement of stage s on rank s mod P."""
    ranks, num_stages = stage.group_size, stage.num_stages
    if num_stages % ranks:
        raise ValueError(f"{schedule_name}: {num_stages} stages do not loop over {ranks} "
                         f"ranks; give a multiple of {ranks}")
    return ranks, num_stages // ranks


def _interleaved_order(ranks, chunks, n_microbatches):
    """Each rank's actions in interleaved 1F1B: pptrain's interleaved-1f1b (Megatron's rule,
    microbatches in groups of P; fewer than P, one group of them)."""
    from .. import plan
    return plan.schedule("interleaved-1f1b", pp=ranks, microbatches=n_microbatches,
                         chunks=chunks).actions()


class ScheduleLoopedBFS(PipelineScheduleMulti):
    """Looped BFS: stage s on rank s mod P, each stage's microbatches in one run (an order
    written here as a CSV; pptrain's registry has none)."""

    def _order_csv(self):
        """Each rank runs the forwards of all microbatches on its first stage, then on its next
        one, and so on; then the backwards the same way from its last stage."""
        ranks, _ = _looped(type(self).__name__, self._stage, self._n_microbatches)
        microbatches = range(self._n_microbatches)
        rows = []
        for rank in range(ranks):
            local = list(range(rank, self._stage.num_stages, ranks))
            actions = [f"{s}F{m}" for s in local for m in microbatches]
            actions += [f"{s}B{m}" for s in reversed(local) for m in microbatches]
            rows.append(",".join(actions))
        return "\n".join(rows) + "\n"

    def __init__(self, stages: list[PipelineStage], n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]] = None,
                 output_merge_spec: Any = None, scale_grads: bool = True,
                 backward_requires_autograd: bool = True) -> None:
        super().__init__(stages, n_microbatches, loss_fn, output_merge_spec=output_merge_spec,
                         scale_grads=scale_grads,
                         backward_requires_autograd=backward_requires_autograd)


class ScheduleInterleavedZeroBubble(PipelineScheduleMulti):
    """Interleaved zero bubble: stage s on rank s mod P, each backward split into I and W, the
    W's filling the waits (an order written here as a CSV, not torch's own)."""

    __init__ = ScheduleInterleaved1F1B.__init__  # type: ignore[assignment]

    def _order_csv(self):
        """pptrain's interleaved-1f1b order with each B split into I and W, and each W held back
        until the rank's next F (in the cool-down, its next I) has run: the rank then has a W
        to run while it waits for a message. At F = I = W the simulator finds a bubble of 0.077
        instead of interleaved-1f1b's 0.111 on 2 ranks and 4 microbatches, 0.111 instead of 0.158
        on 4 ranks and 8."""
        ranks, chunks = _looped(type(self).__name__, self._stage, self._n_microbatches)
        order = _interleaved_order(ranks, chunks, self._n_microbatches)
        rows = []
        for actions in order:
            row, held = [], []  # held: W's not placed yet, oldest first
            forwards_left = sum(1 for a in actions if "F" in a)
            for action in actions:
                stage, microbatch = action.split("F" if "F" in action else "B")
                if "F" in action:
                    row.append(action)
                    forwards_left -= 1
                else:
                    row.append(f"{stage}I{microbatch}")
                    held.append(f"{stage}W{microbatch}")
                    if forwards_left > 0:
                        continue
                if len(held) > 1:
                    row.append(held.pop(0))
            rows.append(",".join(row + held))
        return "\n".join(rows) + "\n"


class ScheduleZBVZeroBubble(PipelineScheduleMulti):
    """ZB-V: rank r holds stages r and 2P-1-r (pptrain's zb-v)."""

    __init__ = ScheduleInterleaved1F1B.__init__  # type: ignore[assignment]


class ScheduleDualPipeV(PipelineScheduleMulti):
    """DualPipeV: ZB-V's placement, forwards and backwards paired (pptrain's dualpipev)."""

    __init__ = ScheduleInterleaved1F1B.__init__  # type: ignore[assignment]


class _PipelineScheduleRuntime(PipelineScheduleMulti):
    """torch's runtime for a schedule of its CSV form: _load_csv(path, format) then step()."""


class _PptrainSchedule(_PipelineSchedule):
    """A schedule of pptrain's registry by its name, with torch's calling convention: one stage
    or a list of them; keywords beyond torch's go to pptrain.schedule (weight_split, ...)."""

    def __init__(self, stages: Union[PipelineStage, list[PipelineStage]], n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]] = None, scale_grads: bool = True,
                 **options: Any) -> None:
        super().__init__(stages, n_microbatches, loss_fn, scale_grads,
                         single=not isinstance(stages, (list, tuple)), options=options)
        self._run(name=self._pptrain_name)


_ORDERS.update({
    ScheduleGPipe: "gpipe",
    Schedule1F1B: "1f1b",
    ScheduleInterleaved1F1B: "interleaved-1f1b",
    ScheduleZBVZeroBubble: "zb-v",
    ScheduleDualPipeV: "dualpipev",
})

_TORCH_NAMES = {
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "GPipe": ScheduleGPipe,
    "LoopedBFS": ScheduleLoopedBFS,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
    "PipelineScheduleSingle": PipelineScheduleSingle,
    "PipelineScheduleMulti": PipelineScheduleMulti,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
    "DualPipeV": ScheduleDualPipeV,
}
_pptrain_classes: dict[str, type] = {}


def get_schedule_class(schedule_name: str) -> type:
    """The class of a schedule by torch's name (any case: "1F1B", "Interleaved1F1B", "GPipe",
    "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", ...) or by pptrain's
    (`pptrain schedule --list`: "zb-h1", "zb-auto", "v-half", ...)."""
    by_lower = {k.lower(): v for k, v in _TORCH_NAMES.items()}
    if schedule_name.lower() in by_lower:
        return by_lower[schedule_name.lower()]
    from .. import plan
    names = plan.schedule_names()
    if schedule_name not in names:
        raise ValueError(f"unknown schedule name '{schedule_name}': torch's are "
                         f"{', '.join(_TORCH_NAMES)}; pptrain's {', '.join(names)}")
    if schedule_name not in _pptrain_classes:
        class_name = "Schedule_" + schedule_name.replace("-", "_")
        _pptrain_classes[schedule_name] = type(class_name, (_PptrainSchedule,),
                                               {"_pptrain_name": schedule_name})
    return _pptrain_classes[schedule_name]
