"""pipeline(): a module cut into stages as torch's pipelining cuts one: torch.export (non-strict)
traces its forward on the example microbatch, and the ATen graph it records is cut before or
after the submodules `split_spec` names and at the pipe_split() calls of the forward.

The trace follows shapes: a block that builds its causal mask from its input's length
(`T = x.shape[1]; torch.triu(torch.ones(T, T), 1)`) is traced with the example's T. As in
torch's, the graph holds every size the forward reads as the example's number, and which ones
it read it does not say, so a schedule's step() takes only microbatches of the example's shape
(schedules.py refuses another); and the graph keeps the train() or eval() mode the module was
traced in (a dropout's, a BatchNorm's). The forward runs once, on fake
tensors: nothing is computed and the model's parameters and buffers are left as they were.

Each stage is a torch.fx.GraphModule over the original module's own parameters and buffers,
under their original names ("layers.2.ff.weight"), so a stage's state_dict is the part of the
model's it runs. A stage takes what the one before it returns: the values computed before the
cut that this stage or a later one still needs (a mask the last stage reads passes through the
stages between); the first stage takes the model's inputs (as the forward does: positional and
keyword, nested structures too) and the last returns the model's output (the forward's
structure; one holding a class of its own, as a Hugging Face ModelOutput, as torch's returns it:
its tensors, the one alone, several in a tuple).
"""

from __future__ import annotations

import enum
import operator
from typing import Any, Callable, Optional, Union

import torch
import torch.fx
import torch.utils._pytree as pytree

from .stage import PipelineStage

# pipe_split()'s marker in the traced graph: an operator of its own, which torch.export keeps
# (as torch's pipelining keeps its pippy::_pipe_split) because fx counts it side-effectful.
if not hasattr(torch.ops.pptrain, "pipe_split"):
    torch.library.define("pptrain::pipe_split", "() -> ()")
    torch.library.impl("pptrain::pipe_split", "BackendSelect")(lambda: None)
    torch.library.register_fake("pptrain::pipe_split")(lambda: None)
_MARK = torch.ops.pptrain.pipe_split.default
torch.fx.node._side_effectful_functions.add(_MARK)

_splitting = False  # True while pipeline() traces: pipe_split() marks the graph only then


class SplitPoint(enum.Enum):
    """Where a submodule of split_spec cuts: before it runs, or after."""
    BEGINNING = 1
    END = 2


def pipe_split() -> None:
    """A cut between two stages, called in a model's forward: nothing outside pipeline()."""
    if _splitting:
        _MARK()


def _is_cut(node):
    """pipe_split()'s marker, or that of torch's own pipe_split() (a model written for torch's
    pipelining, cut by pptrain's pipeline())."""
    return node.op == "call_function" and (node.target is _MARK
                                           or str(node.target) == "pippy._pipe_split.default")


def _linear(input, weight, bias=None):
    """A traced graph's linear product (aten.linear), as torch.nn.functional.linear computes it
    at the call: in the step of a schedule whose backward is split (weight_split="deferred",
    pptrain.runtime._deferred_linears) that is pptrain's product, its weight gradient left to
    W, as for a stage made by hand."""
    return torch.nn.functional.linear(input, weight, bias)


def _one_line(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _trace(module, mb_args, mb_kwargs, split_spec):
    """The module's graph, traced by torch.export on the example microbatch with a pipe_split()
    marker before (or after) each call of a submodule split_spec names: a GraphModule whose
    get_attr nodes name the module's parameters and buffers by their qualified names."""
    global _splitting
    called = set()

    def marker(name):
        def mark(*_):
            called.add(name)
            pipe_split()
        return mark

    hooks = []
    for name, point in split_spec.items():
        submodule = module.get_submodule(name)
        if point is SplitPoint.BEGINNING:
            hooks.append(submodule.register_forward_pre_hook(marker(name)))
        else:
            hooks.append(submodule.register_forward_hook(marker(name)))
    _splitting = True
    try:
        program = torch.export.export(module, mb_args, mb_kwargs, strict=False)
    except Exception as error:
        raise ValueError(f"pipeline(): torch.export could not trace {type(module).__name__} on "
                         f"the example microbatch: {_one_line(error)}") from error
    finally:
        _splitting = False
        for hook in hooks:
            hook.remove()
    missing = sorted(set(split_spec) - called)
    if missing:
        raise ValueError(f"pipeline(): split_spec names {', '.join(map(repr, missing))}, which "
                         f"{type(module).__name__}'s forward never calls")
    return program.module(check_guards=False)


def _stage_graphs(graph):
    """The graph cut at its pipe_split() nodes: one graph per stage, in order."""
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

    # torch.export's graph takes and returns flat lists of tensors; its codegen turns the
    # forward's arguments into that list (in_spec) and the list into its output (out_spec). The
    # first stage keeps the first, the last stage the second, unless the output holds a class
    # of its own: then the last stage returns the flat list as torch's does (the one tensor
    # alone), since pptrain's runtime hands the loss_fn a tensor, a tuple or a dict.
    pytree_info = getattr(graph._codegen, "pytree_info", None)
    flat_output = pytree_info is not None and not _plain(pytree_info.out_spec)
    if flat_output:
        pytree_info = pytree_info._replace(out_spec=None)
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
            returned = torch.fx.node.map_arg(output.args[0], lookup)
            if flat_output:
                returned = returned[0] if len(returned) == 1 else tuple(returned)
            g.output(returned)
        else:
            values = [env[v] for v in live[s]]
            g.output(values[0] if len(values) == 1 else tuple(values))
        if pytree_info is not None:
            first, last = s == 0, s == num_stages - 1
            if first or (last and pytree_info.out_spec is not None):
                info = pytree_info  # a namedtuple of immutable specs: _replace copies
                if not first:  # positional, as the stage before returns them
                    inputs = [n.name for n in g.nodes if n.op == "placeholder"]
                    info = info._replace(orig_args=inputs,
                                         in_spec=pytree.tree_structure(tuple(inputs)))
                if not last:
                    info = info._replace(out_spec=None)
                g._codegen = torch.fx.graph._PyTreeCodeGen(info)
        graphs.append(g)
    return graphs


def _plain(spec):
    """Whether an output of this pytree structure is made of tensors, tuples, lists and dicts
    alone (None: the graph's own flat list), not of a class such as a Hugging Face ModelOutput
    (a dict of its own class: pptrain's runtime would hand the loss_fn a plain dict, where
    torch's pipeline() hands it the tensors)."""
    if spec is None or spec.is_leaf():
        return True
    return spec.type in (tuple, list, dict) and all(_plain(c) for c in spec.children())


def _stage_module(module, traced, graph, s):
    """Stage s's GraphModule: `graph` over the module's own parameters and buffers (and the
    trace's constants, such as a tensor the forward makes from a literal)."""
    # The attributes the graph reads, in the order it reads them (GraphModule's own order, so
    # that the stages' parameters come in the model's order), from a root that holds them.
    root = torch.nn.Module()
    values = {}
    for node in graph.nodes:
        if node.op == "get_attr" and node.target not in values:
            try:
                values[node.target] = _attribute(module, node.target)
            except AttributeError:
                values[node.target] = _attribute(traced, node.target)
            owner = root
            *path, field = node.target.split(".")
            for atom in path:
                if not hasattr(owner, atom):
                    owner.add_module(atom, torch.nn.Module())
                owner = getattr(owner, atom)
            setattr(owner, field, values[node.target])
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.linear.default:
            node.target = _linear
    stage = torch.fx.GraphModule(root, graph, class_name=f"submod_{s}")
    # GraphModule registers every tensor that is no parameter as a buffer; one that is none of
    # the model's persistent buffers (a constant of the trace) stays out of the stage's
    # state_dict.
    for target, value in values.items():
        if (isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
                and not _is_persistent_buffer(module, target)):
            owner, _, field = target.rpartition(".")
            stage.get_submodule(owner)._non_persistent_buffers_set.add(field)
    return stage


def _attribute(module, target):
    """The attribute of `module` a qualified name ("layers.0.ff1.weight") names."""
    for atom in target.split("."):
        module = getattr(module, atom)
    return module


def _is_persistent_buffer(module, target):
    owner, _, field = target.rpartition(".")
    try:
        owner = module.get_submodule(owner)
    except AttributeError:
        return False
    return field in owner._buffers and field not in owner._non_persistent_buffers_set


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
    and at each pipe_split() its forward calls, tracing it with torch.export on `mb_args` and
    `mb_kwargs`, a microbatch's inputs (the sizes its forward reads are theirs)."""
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
    traced = _trace(module, mb_args, mb_kwargs, split_spec)
    stages = [_stage_module(module, traced, g, s)
              for s, g in enumerate(_stage_graphs(traced.graph))]
    _check_no_shared_parameters(stages)

    # The whole model as the stages in sequence: split_gm, as torch's Pipe has it. It takes
    # the forward's arguments as the first stage does, and passes them on as they came.
    top = torch.fx.Graph()
    inputs = [top.node_copy(n) for n in traced.graph.nodes if n.op == "placeholder"]
    args, kwargs = tuple(inputs), {}
    pytree_info = getattr(traced.graph._codegen, "pytree_info", None)
    if pytree_info is not None:
        top._codegen = torch.fx.graph._PyTreeCodeGen(pytree_info._replace(out_spec=None))
        args, kwargs = pytree.tree_unflatten(inputs, pytree_info.in_spec)
    values: list[Any] = []
    for s, stage in enumerate(stages):
        if s == 0:
            out = top.call_module("submod_0", tuple(args), dict(kwargs))
        else:
            out = top.call_module(f"submod_{s}", tuple(values))
        returns = [n for n in stage.graph.nodes if n.op == "output"][0].args[0]
        if s < len(stages) - 1 and isinstance(returns, tuple):
            values = [top.call_function(operator.getitem, (out, i)) for i in range(len(returns))]
        else:
            values = [out]
    top.output(values[0])
    split_gm = torch.fx.GraphModule({f"submod_{s}": m for s, m in enumerate(stages)}, top)
    return Pipe(split_gm, len(stages))
