"""pipeline(): a module cut into stages by tracing it with torch.fx (torch 1.13 has no
torch.export), at the submodules `split_spec` names and at the pipe_split() calls of its forward.

Each stage is a torch.fx.GraphModule over the original module's own submodules and parameters,
under their original names ("layers.2.ff.weight"), so a stage's state_dict is the part of the
model's it runs. A stage takes what the one before it returns: the values computed before the
cut that this stage or a later one still needs (a mask the last stage reads passes through the
stages between); the first stage takes the model's inputs and the last returns the model's
output.
"""

from __future__ import annotations

import enum
import operator
from typing import Any, Callable, Optional, Union

import torch
import torch.fx

from .stage import PipelineStage

_tracer = None  # the tracer of the pipeline() running now: pipe_split() marks its graph


class SplitPoint(enum.Enum):
    """Where a submodule of split_spec cuts: before it runs, or after."""
    BEGINNING = 1
    END = 2


def pipe_split() -> None:
    """A cut between two stages, called in a model's forward: nothing outside pipeline()."""
    if _tracer is not None:
        _tracer.create_node("call_function", pipe_split, (), {})


class _SplittingTracer(torch.fx.Tracer):
    """torch.fx's tracer with a pipe_split() node before or after each call of a submodule
    `split_spec` names."""

    def __init__(self, split_spec):
        super().__init__()
        self.split_spec = split_spec
        self.called = set()

    def call_module(self, m, forward, args, kwargs):
        path = self.path_of_module(m)
        point = self.split_spec.get(path)
        if point is not None:
            self.called.add(path)
        if point is SplitPoint.BEGINNING:
            pipe_split()
        out = super().call_module(m, forward, args, kwargs)
        if point is SplitPoint.END:
            pipe_split()
        return out


def _is_cut(node):
    return node.op == "call_function" and node.target is pipe_split


def _trace(module, split_spec):
    global _tracer
    tracer = _SplittingTracer(split_spec)
    _tracer = tracer
    try:
        graph = tracer.trace(module)
    except Exception as error:
        raise ValueError(f"pipeline(): torch.fx could not trace {type(module).__name__}: "
                         f"{type(error).__name__}: {error}") from error
    finally:
        _tracer = None
    missing = sorted(set(split_spec) - tracer.called)
    if missing:
        raise ValueError(f"pipeline(): split_spec names {', '.join(map(repr, missing))}, which "
                         f"{type(module).__name__}'s forward never calls")
    return graph


def _stage_graphs(graph):
    """The graph cut at its pipe_split() nodes: one graph per stage, and their count."""
    nodes = [n for n in graph.nodes]
    stage_of = {}  # node -> the stage that computes it (placeholders: -1, before stage 0)
    stage = 0
    computed = {0: 0}
    for node in nodes:
        if _is_cut(node):
            stage += 1
            computed[stage] = 0
        elif node.op == "placeholder":
            stage_of[node] = -1
        elif node.op not in ("get_attr", "output"):
            stage_of[node] = stage
            computed[stage] += 1
    num_stages = stage + 1
    empty = [s for s in range(num_stages) if computed[s] == 0]
    if empty:
        raise ValueError(f"pipeline(): stage {empty[0]} of {num_stages} would compute nothing "
                         "(two split points at one place, or one at the very start or end)")

    # live[s]: the values stage s returns for the stages after it, in the graph's order.
    needed_until = {}  # value -> the last stage that reads it
    output = next(n for n in nodes if n.op == "output")
    for node in nodes:
        if node in stage_of and stage_of[node] >= 0 or node is output:
            reader = num_stages - 1 if node is output else stage_of[node]
            for value in node.all_input_nodes:
                if value in stage_of:
                    needed_until[value] = max(needed_until.get(value, -1), reader)
    live = [[v for v in nodes if v in needed_until and stage_of[v] <= s < needed_until[v]]
            for s in range(num_stages)]

    graphs = []
    for s in range(num_stages):
        g = torch.fx.Graph()
        env = {}
        if s == 0:
            for node in nodes:
                if node.op == "placeholder":
                    env[node] = g.node_copy(node)
        else:
            for value in live[s - 1]:
                env[value] = g.placeholder(value.name)
        attributes = {}

        def lookup(value):
            if value.op == "get_attr":  # a parameter or buffer: read where it is used
                if value not in attributes:
                    attributes[value] = g.node_copy(value)
                return attributes[value]
            return env[value]

        for node in nodes:
            if stage_of.get(node) == s:
                env[node] = g.node_copy(node, lookup)
        if s == num_stages - 1:
            g.output(torch.fx.node.map_arg(output.args[0], lookup))
        else:
            values = [env[v] for v in live[s]]
            g.output(values[0] if len(values) == 1 else tuple(values))
        graphs.append(g)
    return graphs


class PipeInfo:
    """What build_stage() needs to know of a Pipe."""

    def __init__(self, num_stages: int, graph: torch.fx.Graph) -> None:
        self.num_stages = num_stages
        self.graph = graph


class Pipe(torch.nn.Module):
    """A model cut into stages by pipeline(): split_gm holds stage i as `submod_i`; forward()
    runs them one after the other (the whole model, in one process). pipeline() makes it;
    has_loss_and_backward and loss_spec (torch's, for a model that computes its own loss) are
    False and None here: the schedule's loss_fn computes the loss."""

    def __init__(self, split_gm: torch.fx.GraphModule, num_stages: int,
                 has_loss_and_backward: bool = False, loss_spec: Any = None) -> None:
        super().__init__()
        self.split_gm = split_gm
        self.num_stages = num_stages
        self.has_loss_and_backward = has_loss_and_backward
        self.loss_spec = loss_spec

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.split_gm(*args, **kwargs)

    def get_stage_module(self, stage_idx: int) -> torch.nn.Module:
        if not isinstance(stage_idx, int) or not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"stage_index {stage_idx!r} is not in 0..{self.num_stages - 1} "
                             f"(the pipe has {self.num_stages} stages)")
        return getattr(self.split_gm, f"submod_{stage_idx}")

    def info(self) -> PipeInfo:
        return PipeInfo(self.num_stages, self.split_gm.graph)

    def build_stage(self, stage_index: int, device: Union[str, torch.device, None],
                    group: Optional[Any] = None) -> PipelineStage:
        """The PipelineStage of stage `stage_index`, run on this rank."""
        return PipelineStage(self.get_stage_module(stage_index), stage_index, self.num_stages,
                             device, group=group)


def _check_no_shared_parameters(stages):
    """A parameter two stages read would be two copies on two ranks, trained apart."""
    holder = {}
    for s, stage in enumerate(stages):
        for name, parameter in stage.named_parameters():
            first = holder.setdefault(id(parameter), (s, name))
            if first[0] != s:
                raise NotImplementedError(
                    f"pipeline(): parameter {name} is used by stages {first[0]} and {s}; "
                    "pptrain.pipelining does not share parameters between stages")


def pipeline(module: torch.nn.Module, mb_args: Union[tuple, Any],
             mb_kwargs: Optional[dict[str, Any]] = None,
             split_spec: Optional[dict[str, SplitPoint]] = None,
             split_policy: Optional[Callable[[torch.fx.GraphModule], torch.fx.GraphModule]] = None
             ) -> Pipe:
    """Cuts `module` into stages: before (SplitPoint.BEGINNING) or after (SplitPoint.END) each
    submodule `split_spec` names by its qualified name ({"layers.2": SplitPoint.BEGINNING}),
    and at each pipe_split() its forward calls. `mb_args` and `mb_kwargs`, a microbatch's
    inputs, are checked against the forward's parameters (fx traces without running it)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"pipeline(): module must be a torch.nn.Module, got "
                        f"{type(module).__name__}")
    if split_policy is not None:
        raise NotImplementedError("pipeline(): split_policy is not supported; cut with "
                                  "split_spec or pipe_split()")
    split_spec = dict(split_spec or {})
    submodules = dict(module.named_modules())
    for name, point in split_spec.items():
        if name not in submodules or name == "":
            raise ValueError(f"pipeline(): split_spec names {name!r}, which is no submodule of "
                             f"{type(module).__name__}")
        if not isinstance(point, SplitPoint):
            raise ValueError(f"pipeline(): split_spec[{name!r}] is {point!r}; expected "
                             "SplitPoint.BEGINNING or SplitPoint.END")
    if not isinstance(mb_args, tuple):
        mb_args = (mb_args,)
    graph = _trace(module, split_spec)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    given = len(mb_args) + len(mb_kwargs or {})
    if given > len(placeholders):
        raise ValueError(f"pipeline(): {given} example inputs for a forward of "
                         f"{len(placeholders)} parameters")
    graphs = _stage_graphs(graph)
    stages = [torch.fx.GraphModule(module, g, class_name=f"submod_{s}")
              for s, g in enumerate(graphs)]
    _check_no_shared_parameters(stages)

    # The whole model as the stages in sequence: split_gm, as torch's Pipe has it.
    top = torch.fx.Graph()
    inputs = [top.node_copy(n) for n in placeholders]
    values = inputs
    for s, stage in enumerate(stages):
        out = top.call_module(f"submod_{s}", tuple(values))
        returns = [n for n in stage.graph.nodes if n.op == "output"][0].args[0]
        if s < len(stages) - 1 and isinstance(returns, tuple):
            values = [top.call_function(operator.getitem, (out, i)) for i in range(len(returns))]
        else:
            values = [out]
    top.output(values[0])
    split_gm = torch.fx.GraphModule({f"submod_{s}": m for s, m in enumerate(stages)}, top)
    return Pipe(split_gm, len(stages))
