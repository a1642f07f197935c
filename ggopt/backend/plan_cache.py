"""Structural signatures of graphs, and the scheduler's cache of compiled plans keyed by them.

A training loop with dynamic graphs (ggml-opt's ``prepare_alloc`` -> ``alloc`` -> ``eval``)
builds a fresh graph for every micro-batch, and the fresh graph has the structure of the last
one. Two graphs have equal signatures when their tensors, taken in order (leafs, then nodes),
agree in everything that compiling them reads: element type, shape, byte strides, op, op
parameters (floats by their bits), flags, sources and view source (as positions in that
order), view offset and the boundary between leafs and nodes; and every tensor that already
has memory (parameters, inputs, persistent accumulators, views of them) has it at the same
offset of the same buffer. Such graphs compile to the same splits, the same memory plan and steps on
the same memory, so a plan compiled for one serves the other: only the tensors' memory
pointers are set again.

Graphs the signature cannot describe (a source outside the graph, op parameters of a kind it
does not know) have no signature and are always compiled.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import struct
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from ..graph import Graph
from ..tensor import Tensor

__all__ = ["graph_signature", "PlanCache"]

_float_bits = struct.Struct("<d").pack
_fields: dict[type, Callable[[Any], Any]] = {}
_SCALARS = (int, bool, str)


class _NoSignature(Exception):
    """The graph holds something the signature cannot describe exactly."""


def _params_key(p: object) -> Hashable:
    """A key equal for two op parameters exactly when they compile the same: floats by their
    bits (0.0 and -0.0 differ, so do NaN payloads), ints, strings, enums, tuples of ints."""
    if p is None or isinstance(p, enum.Enum):
        return p
    kind = type(p)
    get = _fields.get(kind)
    if get is None:
        if not dataclasses.is_dataclass(p):
            raise _NoSignature
        names = [f.name for f in dataclasses.fields(p)]
        one = operator.attrgetter(*names)
        get = (lambda x: (one(x),)) if len(names) == 1 else one
        _fields[kind] = get
    key: list[object] = [kind]
    for v in get(p):
        vt = type(v)
        if vt is float:
            key.append(_float_bits(v))
        elif vt in _SCALARS or isinstance(v, enum.Enum):
            key.append(v)
        elif vt is tuple and all(type(x) is int for x in v):
            key.append(v)
        else:
            raise _NoSignature
    return tuple(key)


def graph_signature(g: Graph) -> tuple[Hashable, ...] | None:
    """The structural signature of ``g`` (see the module docstring), or None."""
    tensors = g.leafs + g.nodes
    pos: dict[Tensor | None, int] = {None: -1}
    for i, t in enumerate(tensors):
        pos[t] = i
    items: list[Hashable] = [len(g.leafs)]
    append = items.append
    try:
        for t in tensors:
            p = t.op_params
            item: tuple[Hashable, ...] = (
                t.type, t.ne, t.nb, t.op, p if p is None else _params_key(p), t.flags,
                tuple([pos[s] for s in t.src]), pos[t.view_src], t.view_offs)
            buf = t.buffer
            if buf is not None:  # memory outside the plan: there
                item += (id(buf), t.offset)
            append(item)
    except (KeyError, _NoSignature):
        return None
    return tuple(items)


P = TypeVar("P")


class PlanCache(Generic[P]):
    """The ``size`` most recently used plans by signature (``size`` 0: none kept).

    A plan must keep alive the buffers whose ``id`` its signature holds, so that no other
    buffer can take their ids while it is cached.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._plans: OrderedDict[tuple[Hashable, ...], P] = OrderedDict()

    def get(self, key: tuple[Hashable, ...]) -> P | None:
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        return plan

    def put(self, key: tuple[Hashable, ...], plan: P) -> None:
        if self.size < 1:
            return
        self._plans[key] = plan
        self._plans.move_to_end(key)
        while len(self._plans) > self.size:
            self._plans.popitem(last=False)

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
