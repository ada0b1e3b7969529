"""torch.distributed.pipelining.microbatch over pptrain: TensorChunkSpec, which a schedule's
args_chunk_spec and kwargs_chunk_spec take, and torch's helpers that split a batch into its
microbatches and merge them back.

    spec = TensorChunkSpec.from_tuple((0,))     # the first positional input along dimension 0
    schedule = ScheduleGPipe(stage, 4, loss_fn=loss_fn, args_chunk_spec=spec)

pptrain's schedules split every input along dimension 0 (a spec of another dimension is
refused there); the helpers here take any dimension, as torch's do.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["TensorChunkSpec", "split_args_kwargs_into_chunks", "merge_chunks"]

DEFAULT_CHUNK_DIM = 0


class TensorChunkSpec:
    """A tensor input (or output) split (merged) along dimension `split_dim`."""

    split_dim: int

    def __init__(self, split_dim: int) -> None:
        self.split_dim = split_dim

    def __repr__(self) -> str:
        return f"{self.__class__.__module__}.{self.__class__.__name__}({self.split_dim})"

    def __str__(self) -> str:
        return f"TensorChunkSpec({self.split_dim})"

    @staticmethod
    def from_tuple(chunk_dims: tuple[int, ...]) -> tuple[TensorChunkSpec, ...]:
        """A spec per positional input: from_tuple((0, 0, 1))."""
        return tuple(TensorChunkSpec(dim) for dim in chunk_dims)

    @staticmethod
    def from_dict(chunk_dims: dict[str, int]) -> dict[str, TensorChunkSpec]:
        """A spec per keyword input: from_dict({"id": 0, "mask": 1})."""
        return {name: TensorChunkSpec(dim) for name, dim in chunk_dims.items()}


def _split(values: dict, specs: Optional[dict], chunks: int) -> list[dict]:
    """`values` (name -> input) as `chunks` microbatches: each tensor split along its spec's
    dimension (dimension 0 without a spec), everything else the same in each. An input that is
    a structure (a tuple, a dict) takes a spec of the same structure, or one for all of it."""
    if not values:
        return [{} for _ in range(chunks)]
    names = list(values)
    parts = []
    for name in names:
        leaves, structure = tree_flatten(values[name])
        leaf_specs, _ = tree_flatten((specs or {}).get(name))
        if len(leaf_specs) == 1:
            leaf_specs = leaf_specs * len(leaves)
        if len(leaf_specs) != len(leaves):
            raise ValueError(f"input {name!r}: {len(leaves)} values, and a chunk spec of "
                             f"{len(leaf_specs)}")
        split = []
        for leaf, spec in zip(leaves, leaf_specs):
            if not isinstance(leaf, torch.Tensor):
                split.append([leaf] * chunks)
                continue
            dim = spec.split_dim if isinstance(spec, TensorChunkSpec) else DEFAULT_CHUNK_DIM
            if leaf.size(dim) < chunks:
                raise ValueError(f"input {name!r}: {leaf.size(dim)} rows along dimension {dim} "
                                 f"do not make {chunks} microbatches")
            split.append(list(torch.tensor_split(leaf, chunks, dim)))
        parts.append([tree_unflatten([s[m] for s in split], structure) for m in range(chunks)])
    return [{name: part[m] for name, part in zip(names, parts)} for m in range(chunks)]


def split_args_kwargs_into_chunks(
        args: tuple[Any, ...], kwargs: Optional[dict[str, Any]], chunks: int,
        args_chunk_spec: Optional[tuple[TensorChunkSpec, ...]] = None,
        kwargs_chunk_spec: Optional[dict[str, TensorChunkSpec]] = None
) -> tuple[list[tuple], list[dict]]:
    """The batch's positional and keyword inputs as `chunks` microbatches: a tuple and a dict
    for each."""
    positional = dict(enumerate(args))
    specs = None if args_chunk_spec is None else dict(enumerate(args_chunk_spec))
    args_split = [tuple(part[i] for i in range(len(args)))
                  for part in _split(positional, specs, chunks)]
    return args_split, _split(dict(kwargs or {}), kwargs_chunk_spec, chunks)


def merge_chunks(chunks: list[Any], chunk_spec: Any) -> Any:
    """The microbatches' values (tensors, or structures of them) as one: each tensor
    concatenated along its spec's dimension (dimension 0 with chunk_spec=None); a value that is
    no tensor must be the same in every microbatch."""
    first, structure = tree_flatten(chunks[0])
    if chunk_spec is None:
        specs: list[Any] = [TensorChunkSpec(DEFAULT_CHUNK_DIM)] * len(first)
    else:
        specs, _ = tree_flatten(chunk_spec)
    flat = [tree_flatten(chunk)[0] for chunk in chunks]
    if any(len(values) != len(specs) for values in flat):
        raise ValueError(f"merge_chunks: a microbatch's {len(flat[0])} values do not match the "
                         f"chunk spec's {len(specs)}")
    merged = []
    for i, spec in enumerate(specs):
        values = [f[i] for f in flat]
        if isinstance(spec, TensorChunkSpec):
            merged.append(torch.cat(values, dim=spec.split_dim))
        else:
            if any(v != values[0] for v in values[1:]):
                raise ValueError(f"merge_chunks: value {i} differs between microbatches "
                                 f"({values[0]!r}, ...) and has no TensorChunkSpec")
            merged.append(values[0])
    return tree_unflatten(merged, structure)
