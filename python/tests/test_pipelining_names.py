"""pptrain.pipelining against the torch.distributed.pipelining of the torch installed: every
public name of torch's (the __all__ of the package and of its modules schedules, stage and
microbatch) is pptrain's too, and every parameter of torch's schedule classes (their
constructors, step() and eval()), PipelineStage, pipeline(), build_stage(), Pipe's methods and
TensorChunkSpec's is pptrain's, of the same kind, at the same position and with the same
default, so that a program written for torch's calls pptrain's the same way. Skipped with a
torch that has no pipelining (before 2.4)."""
import enum
import importlib
import inspect

import pytest
import torch

torch_pipelining = pytest.importorskip("torch.distributed.pipelining")
from pptrain import pipelining  # noqa: E402

MODULES = ["", ".schedules", ".stage", ".microbatch"]
# Methods compared besides the constructors: torch's documented calls of its classes. A
# PipelineStage's public methods (forward_one_chunk, get_fwd_send_ops, ...) are the workings of
# torch's own schedules, which a program does not call; pptrain's schedules need none.
METHODS = {
    "Pipe": ["build_stage", "get_stage_module", "info", "forward"],
    "TensorChunkSpec": ["from_tuple", "from_dict"],
}
SCHEDULE_METHODS = ["step", "eval"]
# torch's private runtime of a CSV, which docs/PYTHON.md offers as pptrain's way in.
PRIVATE = {".schedules": ["_PipelineScheduleRuntime"]}


def module(api, suffix):
    """torch's module `suffix` of pipelining (api="torch"), or pptrain's (None if it has
    none)."""
    if api == "torch":
        return importlib.import_module(torch_pipelining.__name__ + suffix)
    try:
        return importlib.import_module(pipelining.__name__ + suffix)
    except ModuleNotFoundError:
        return None


def public_names():
    """(module suffix, name) of every name torch exports, with the private ones pptrain
    offers."""
    names = []
    for suffix in MODULES:
        for name in list(getattr(module("torch", suffix), "__all__", [])) + PRIVATE.get(suffix, []):
            names.append((suffix, name))
    return names


def is_schedule(cls):
    return inspect.isclass(cls) and issubclass(cls, torch_pipelining.schedules._PipelineSchedule)


def calls():
    """(label, torch's callable, the path to pptrain's: module suffix, name, attribute or None)
    of every signature compared; a name both torch and pptrain export from two modules (the
    package's Schedule1F1B is schedules') is compared once."""
    out = []
    seen = set()
    for suffix, name in public_names():
        theirs = getattr(module("torch", suffix), name)
        ours = getattr(module("pptrain", suffix), name, None)
        if (id(theirs), id(ours)) in seen:
            continue
        seen.add((id(theirs), id(ours)))
        label = f"pipelining{suffix}.{name}"
        if isinstance(theirs, enum.EnumMeta):
            continue  # SplitPoint: its members are compared in test_split_point
        if inspect.isclass(theirs):
            methods = ["__init__"] + METHODS.get(name, [])
            if is_schedule(theirs):
                methods += SCHEDULE_METHODS
                if hasattr(theirs, "_load_csv"):
                    methods.append("_load_csv")
            for method in methods:
                out.append((f"{label}.{method}", getattr(theirs, method), (suffix, name, method)))
        elif callable(theirs):
            out.append((label, theirs, (suffix, name, None)))
    return out


CALLS = calls()


def same_default(a, b):
    if a is inspect.Parameter.empty or b is inspect.Parameter.empty:
        return a is b
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return repr(a) == repr(b)


def differences(theirs, ours):
    """What a call written for `theirs` (a list of inspect.Parameter) would find wrong in
    `ours`: each a line."""
    out = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ours_by_name = {p.name: p for p in ours}
    our_positions = [p.name for p in ours if p.kind in positional]
    their_positions = [p.name for p in theirs if p.kind in positional]
    for p in theirs:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if not any(q.kind == p.kind for q in ours):
                out.append(f"takes no {'*' if p.kind == p.VAR_POSITIONAL else '**'}{p.name}")
            continue
        q = ours_by_name.get(p.name)
        if q is None:
            out.append(f"has no parameter {p.name!r}")
            continue
        if q.kind != p.kind:
            out.append(f"{p.name!r} is {q.kind.description}, torch's {p.kind.description}")
        elif p.kind in positional and our_positions.index(p.name) != their_positions.index(p.name):
            out.append(f"{p.name!r} is at position {our_positions.index(p.name)}, torch's at "
                       f"{their_positions.index(p.name)}")
        if p.default is not inspect.Parameter.empty and not same_default(p.default, q.default):
            out.append(f"{p.name!r} defaults to "
                       f"{'nothing' if q.default is q.empty else repr(q.default)}, torch's to "
                       f"{p.default!r}")
    their_names = {p.name for p in theirs}
    for q in ours:
        if (q.name not in their_names and q.default is inspect.Parameter.empty
                and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)):
            out.append(f"requires {q.name!r}, which torch's has not")
    return out


def test_every_public_name_of_torch_is_pptrains():
    missing = [f"pptrain.pipelining{suffix}.{name}" for suffix, name in public_names()
               if module("pptrain", suffix) is None or not hasattr(module("pptrain", suffix), name)]
    assert not missing, "missing: " + ", ".join(missing)


def signature_differences(label, theirs, path):
    """What differs between torch's callable `theirs` and pptrain's at `path`, each a line."""
    suffix, name, method = path
    ours = getattr(module("pptrain", suffix), name, None)
    if ours is None:
        return [f"{label}: pptrain has no {name}"]
    their_params = list(inspect.signature(theirs).parameters.values())
    static = False
    if method:
        if not hasattr(ours, method):
            return [f"{label}: pptrain's {name} has no {method}"]
        static = isinstance(inspect.getattr_static(ours, method), staticmethod)
        their_class = getattr(module("torch", suffix), name)
        if static != isinstance(inspect.getattr_static(their_class, method), staticmethod):
            return [f"{label}: a staticmethod in one of torch's and pptrain's, not the other"]
        ours = getattr(ours, method)
        if not static:  # without the instance
            their_params = their_params[1:]
    our_params = list(inspect.signature(ours).parameters.values())
    if method and not static:
        our_params = our_params[1:]
    if [p.kind for p in their_params] == [inspect.Parameter.VAR_POSITIONAL,
                                          inspect.Parameter.VAR_KEYWORD]:
        return []  # torch's passes (*args, **kwargs) on to its base, compared on its own
    return [f"{label}: {line}" for line in differences(their_params, our_params)]


def test_every_signature_as_torchs():
    found = [line for call in CALLS for line in signature_differences(*call)]
    assert not found, "pptrain's differs:\n" + "\n".join(found)


def test_microbatch_helpers_as_torchs():
    """split_args_kwargs_into_chunks() and merge_chunks() give what torch's give: a tensor
    split along its spec's dimension (0 without one), a value that is no tensor in each
    microbatch, a batch that does not divide evenly split as torch.tensor_split splits it."""
    theirs = module("torch", ".microbatch")
    ours = module("pptrain", ".microbatch")
    x, mask = torch.randn(10, 3), torch.randn(2, 10)
    for api in (theirs, ours):
        spec = api.TensorChunkSpec
        assert str(spec(1)) == "TensorChunkSpec(1)"
        assert [s.split_dim for s in spec.from_tuple((0, 1))] == [0, 1]
        assert {k: s.split_dim for k, s in spec.from_dict({"mask": 1}).items()} == {"mask": 1}

    def split(api):
        return api.split_args_kwargs_into_chunks(
            (x, 3), {"mask": mask, "h": (x, x)}, 4,
            kwargs_chunk_spec={"mask": api.TensorChunkSpec(1), "h": api.TensorChunkSpec.from_tuple(
                (0, 0))})

    (their_args, their_kwargs), (our_args, our_kwargs) = split(theirs), split(ours)
    assert len(our_args) == len(their_args) == 4
    for a, b in zip(our_args, their_args):
        assert torch.equal(a[0], b[0]) and a[1] == b[1] == 3
    for a, b in zip(our_kwargs, their_kwargs):
        assert torch.equal(a["mask"], b["mask"])
        assert all(torch.equal(p, q) for p, q in zip(a["h"], b["h"]))
    chunks = [(c[0], {"y": c[0] * 2}) for c in our_args]
    for merged in (ours.merge_chunks(chunks, None), theirs.merge_chunks(chunks, None)):
        assert torch.equal(merged[0], x) and torch.equal(merged[1]["y"], x * 2)
    spec = (ours.TensorChunkSpec(1),)
    assert torch.equal(ours.merge_chunks([(m["mask"],) for m in our_kwargs], spec)[0], mask)


def test_split_point():
    theirs = {m.name: m.value for m in torch_pipelining.SplitPoint}
    assert {m.name: m.value for m in pipelining.SplitPoint} == theirs


def test_the_comparison_finds_what_differs():
    """differences() itself: a missing keyword, another default, another position, a keyword
    made positional, a parameter torch's has not that a call must give."""
    def theirs(stage, n, loss_fn=None, *args, scale_grads=True, **kwargs):
        pass

    def ours(n, stage, loss_fn=0, *args, scale_grads=True, extra, **kwargs):
        pass

    def fewer(stage, n, loss_fn=None):
        pass

    def params(f):
        return list(inspect.signature(f).parameters.values())

    assert differences(params(theirs), params(theirs)) == []
    assert differences(params(theirs), params(ours)) == [
        "'stage' is at position 1, torch's at 0", "'n' is at position 0, torch's at 1",
        "'loss_fn' defaults to 0, torch's to None", "requires 'extra', which torch's has not"]
    assert differences(params(theirs), params(fewer)) == [
        "takes no *args", "has no parameter 'scale_grads'", "takes no **kwargs"]
