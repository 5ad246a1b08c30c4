"""Frozen dataclass values built without their generated `__init__`, for the hottest paths.

A frozen dataclass's `__init__` sets each field through `object.__setattr__` (about 0.9 us for the
five fields of coordinator.core.Received, 1.3 us for ground.messages.RoundDone's eight); at 1,000
sites the simulator builds a million of them an hour, and the coordinator's core a SiteRecord per
heartbeat. `builder(cls)` returns a function that makes the same value (same class, same fields in
the same order: equal, same hash and repr) by filling the instance's `__dict__`, about three times
cheaper. It takes every field, positionally: a field's default is not applied (a call that leaves
one out is a TypeError). Only where that is what `__init__` does: a class with `__post_init__`,
`__slots__`, a default factory, a non-init or keyword-only field, or a hand-written `__init__` gets
its own constructor back (`builder(cls) is cls`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


_OWN = ("_values_new", "_values_cls", "_values_obj")  # the built function's own names (no field may be one)


def _plain(cls: type) -> bool:
    """Whether cls's __init__ is the dataclass-generated one that only stores its arguments."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        return False
    init = cls.__dict__.get("__init__")
    # The generated __init__ is compiled from a string; a hand-written one has a file.
    if init is None or getattr(getattr(init, "__code__", None), "co_filename", None) != "<string>":
        return False
    return all(f.init and not f.kw_only and f.default_factory is dataclasses.MISSING and f.name.isidentifier()
               and f.name not in _OWN for f in dataclasses.fields(cls))


def builder(cls: type) -> Callable[..., Any]:
    """A function (every field, positionally, in order: no defaults) -> cls(...), filling __dict__
    where that is what cls.__init__ does; else cls itself."""
    if not _plain(cls):
        return cls
    names = [f.name for f in dataclasses.fields(cls)]
    args = ", ".join(names)
    # One dict display: the fastest way to fill the instance (a loop over the names costs twice it).
    src = (f"def build({args}):\n"
           f"    _values_obj = _values_new(_values_cls)\n"
           f"    _values_obj.__dict__.update({{{', '.join(f'{n!r}: {n}' for n in names)}}})\n"
           f"    return _values_obj\n")
    scope: dict[str, Any] = {"_values_new": object.__new__, "_values_cls": cls}
    exec(compile(src, f"<ground.values.builder({cls.__qualname__})>", "exec"), scope)
    build = scope["build"]
    build.__doc__ = f"{cls.__qualname__}(...), built by filling its __dict__ (ground/values.py)"
    return build  # type: ignore[no-any-return]
