"""The full observable state of ggopt objects, for tests that promise "nothing changed".

:func:`observable_state` walks objects the way a debugger would: every attribute (``__dict__``
and ``__slots__``), list, dict, set and NumPy array reachable from them, and for each tensor its
metadata (name, flags, type, shape, strides, op, op parameters, sources, view) and a copy of its
data when it has memory. Two snapshots compare equal exactly when nothing observable differs,
so a refactoring that renames private attributes needs no change here.
"""

from __future__ import annotations

import enum
import types
from typing import Any

import numpy as np
import pytest

import ggopt
from ggopt.errors import GgoptError

_OPAQUE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           type, types.CodeType)


def observable_state(*objs: Any) -> tuple:
    """A comparable snapshot of ``objs`` and everything reachable from them."""
    seen: dict[int, tuple[int, object]] = {}  # keeps every visited object alive: ids stay unique
    return tuple(_snap(o, seen) for o in objs)


def _tensor_data(t: ggopt.Tensor) -> object:
    try:
        return t.numpy().tobytes()
    except GgoptError:  # no memory (yet, or any more)
        return "no memory"


def _snap(obj: Any, seen: dict[int, tuple[int, object]]) -> object:
    if obj is None or isinstance(obj, (bool, int, str, bytes, enum.Enum)):
        return obj
    if isinstance(obj, (float, np.generic)):
        return ("scalar", type(obj).__name__, repr(obj))  # NaN compares equal to NaN
    if isinstance(obj, _OPAQUE) or callable(obj) and not hasattr(obj, "__dict__"):
        return ("opaque", id(obj))
    if id(obj) in seen:
        return ("seen", seen[id(obj)][0])  # shared or cyclic: position of first visit
    seen[id(obj)] = (len(seen), obj)
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, np.random.BitGenerator):
        return ("bitgen", _snap(obj.state, seen))
    if isinstance(obj, ggopt.Tensor):
        return ("Tensor", obj.name, int(obj.flags), obj.type, obj.ne, obj.nb, obj.op,
                _snap(obj.op_params, seen), tuple(_snap(s, seen) for s in obj.src),
                _snap(obj.view_src, seen), obj.view_offs, _tensor_data(obj))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(_snap(x, seen) for x in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((_snap(k, seen), _snap(v, seen)) for k, v in obj.items()))
    if isinstance(obj, (set, frozenset)):
        return ("set", frozenset(id(x) for x in obj))
    attrs = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in ("__weakref__", "__dict__") and hasattr(obj, name):
                attrs[name] = getattr(obj, name)
    if not attrs:
        return ("opaque", type(obj).__name__, id(obj))
    return (type(obj).__name__, tuple((k, _snap(v, seen)) for k, v in sorted(attrs.items())))


def first_difference(before: object, after: object, path: str = "") -> str | None:
    """Where two snapshots first differ (a readable path), or None when they are equal."""
    if before == after:
        return None
    if (isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after)):
        for i, (x, y) in enumerate(zip(before, after)):
            label = x[0] if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) else i
            found = first_difference(x, y, f"{path}/{label}")
            if found:
                return found
    return f"{path}: {str(before)[:200]} -> {str(after)[:200]}"


def assert_unchanged(ctx: ggopt.Context, fn, exc, match: str) -> None:
    """``fn()`` raises ``exc`` matching ``match`` and changes nothing in ``ctx``: no tensor added,
    no flag, name, shape or datum of any of its tensors changed."""
    before = observable_state(ctx)
    with pytest.raises(exc, match=match) as info:
        fn()
    assert isinstance(info.value, GgoptError)
    assert observable_state(ctx) == before
