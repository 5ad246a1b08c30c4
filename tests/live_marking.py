"""Which tests are live: they start real processes, a real Toxiproxy, real sockets or real training.

The suite is two folders: tests/unit/ holds the pure-logic tests (`make test-fast` runs them while
editing), tests/live/ the tests that start something; `make test` runs both. tests/conftest.py marks
every test under tests/live `live` by its folder, and uses `is_live` here as a guard on tests/unit: a
test there that is live is a collection error naming it (`misplaced`). A test is live when it carries
the `integration` marker, or when its own source, a fixture it uses, or a module-level helper either of
them calls (followed through the names they reference, in the test's module and in conftest) starts
one of those things.
"""

from __future__ import annotations

import inspect
import re
import types
from typing import Any, Callable, Iterable

# What starting a real thing looks like in this suite's code: a process, the launcher or a
# comparison, a Toxiproxy server, ZeroMQ sockets, a WAN node, a browser, a compose engine, the fork server.
LIVE_SOURCE = re.compile(
    r"subprocess\.|Popen\(|BackgroundRun\(|ToxiproxyServer\(|run_comparison\(|\blaunch\(|Launcher\(|run_cluster\("
    r"|zmq\.Context|WanNode\(|multiprocessing|sync_playwright|xdc_main\(\[\"(?:run|compare|demo|prepare|study)\""
    r"|docker|mp\.spawn|LocalCluster|ProcessPool|run_local\(|socket\.socket|BenchCluster\(|soak_one\(|ForkServer\(")


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _callables_named(code_names: Iterable[str], namespace: dict[str, Any]) -> list[Any]:
    out = []
    for name in code_names:
        v = inspect.unwrap(namespace[name]) if callable(namespace.get(name)) else None
        # the suite's own helpers and the benchmarks' (several tests drive a bench's cluster)
        if isinstance(v, (types.FunctionType, type)) and getattr(v, "__module__", "").startswith(("tests", "bench")):
            out.append(v)
    return out


def _names(obj: Any) -> set[str]:
    """The global names a function (or a class's methods) refers to, nested code objects included."""
    codes = []
    if isinstance(obj, type):
        codes = [f.__code__ for f in vars(obj).values() if isinstance(f, types.FunctionType)]
    elif isinstance(obj, types.FunctionType):
        codes = [obj.__code__]
    names: set[str] = set()
    while codes:
        c = codes.pop()
        names.update(c.co_names)
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def starts_something(obj: Any, namespace: dict[str, Any], _seen: set[int] | None = None) -> bool:
    """True when obj's source, or a tests-module helper it names (transitively), starts a real thing."""
    seen = _seen if _seen is not None else set()
    obj = inspect.unwrap(obj) if isinstance(obj, types.FunctionType) else obj
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if LIVE_SOURCE.search(_source(obj)):
        return True
    helpers = _callables_named(_names(obj), {**namespace, **getattr(obj, "__globals__", {})})
    return any(starts_something(h, namespace, seen) for h in helpers)


def is_live(test: Callable[..., Any], fixtures: Iterable[Callable[..., Any]], has_integration_marker: bool) -> bool:
    if has_integration_marker:
        return True
    namespace = getattr(test, "__globals__", {})
    return starts_something(test, namespace) or any(
        starts_something(f, getattr(f, "__globals__", {})) for f in fixtures
        if getattr(f, "__module__", "").startswith("tests"))  # pytest's own fixtures start nothing


def misplaced(nodeid: str, folder: str | None, live: bool) -> str | None:
    """Why a collected test is in the wrong folder, or None. `folder` is the first folder under tests/
    ("unit", "live"), None for a file directly in tests/; `live` is `is_live` of the test."""
    if folder is None:
        return (f"{nodeid}: a test file directly in tests/; put it in tests/unit/ (pure logic) or tests/live/ "
                "(it starts real processes, Toxiproxy, sockets or training)")
    if folder == "unit" and live:
        return (f"{nodeid}: starts a process, a server, a socket, a browser or the engine, or is marked "
                "`integration` (tests/live_marking.py); move it to tests/live/ (tests/unit/ is pure logic only)")
    return None
