"""What the nemeses act through: the `ClusterHandle` of a live cluster (or a recording fake).

A handle can signal a process, start it again, tell whether it runs, reach Toxiproxy, resolve a
link spec into (proxy, stream) pairs, and log. `NativeHandle` is the native (no Docker) cluster
of `xdc run`; `RecordingHandle` records every call and keeps a tiny model of process and proxy
state, for unit tests and dry runs.

Which proxies and streams carry a direction
-------------------------------------------
Every directed link `x_to_y` is one Toxiproxy proxy: x is the client (it dials), y the server.
Its stream "upstream" carries client->server bytes (x -> y), "downstream" server->client bytes
(y -> x: y's replies and acks on the connection x opened). Between two sites there are two
proxies, `a_to_b` and `b_to_a`, so the bytes that travel FROM a TO b are:

    (a_to_b, "upstream")    what a sends to b on the connection a dialled
    (b_to_a, "downstream")  what a sends back to b on the connection b dialled (a's replies/acks)

The rule, used everywhere: direction x->y = (x_to_y, upstream) + (y_to_x, downstream), each
included when that proxy exists. A site-to-service link has one proxy (`a_to_coord`): a->coord
is (a_to_coord, upstream) and coord->a is (a_to_coord, downstream). "a<->b" is both directions
(all four streams); a bare "b" is every stream of every proxy b is an end of.

A link *reset* disables whole proxies (Toxiproxy cannot disable one stream): for x->y it
disables the proxies that carry x->y as their upstream, i.e. `x_to_y`, the connection x dials to
y (which also cuts y's replies on it); when no such proxy exists (coord->a) it disables the
proxies that carry the direction at all (`a_to_coord`).
"""

from __future__ import annotations

import json
import os
import signal as _signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

from ground.faults import SERVICES, parse_link_target
from ground.eventlog import read_events
from wan.toxiproxy import ToxiproxyClient, ToxiproxyError

UPSTREAM, DOWNSTREAM = "upstream", "downstream"
LinkStream = tuple[str, str]  # (proxy name, stream)


class ChaosError(RuntimeError):
    """A fault could not be injected or healed (unknown process, nothing to restart with, ...)."""


class EventSink(Protocol):
    def emit(self, event: str, **fields: Any) -> None: ...

    def set_context(self, *, epoch: int | None = None, step: int | None = None) -> None: ...


@runtime_checkable
class ClusterHandle(Protocol):
    """What a nemesis may do to a cluster."""

    toxiproxy: Any  # a wan.toxiproxy.ToxiproxyClient (or a recording fake with the same methods)
    log: EventSink

    def signal(self, process: str, sig: int) -> None:
        """Send `sig` to the process; raise ChaosError if it is not running."""

    def restart(self, process: str) -> int:
        """Start the (exited) process again; returns its new pid."""

    def is_running(self, process: str) -> bool:
        """True while the process exists and has not exited (a stopped process is running)."""

    def wait_exit(self, process: str, timeout_s: float) -> bool:
        """Wait up to timeout_s for the process to exit; True if it has."""

    def pid(self, process: str) -> int | None: ...

    def links(self, target: str) -> list[LinkStream]:
        """(proxy, stream) pairs that carry a link spec, by the rule in this module's docstring."""


# ------------------------------------------------------------------------------ link specs


def resolve_links(target: str, proxies: Mapping[str, tuple[str, str]]) -> list[LinkStream]:
    """Resolve a link spec against `proxies` {name: (client, server)}. Raises ChaosError when the
    spec names a process with no link, or a direction no proxy carries."""
    try:
        t = parse_link_target(target)
    except ValueError as e:
        raise ChaosError(str(e)) from None
    ends = {n for client_server in proxies.values() for n in client_server}
    dirs = t.directions()
    out: list[LinkStream] = []
    if dirs is None:
        if t.src not in ends:
            raise ChaosError(f"link spec {target!r}: {t.src!r} is an end of no link; processes: {sorted(ends)}")
        for name in sorted(proxies):
            if t.src in proxies[name]:
                out += [(name, UPSTREAM), (name, DOWNSTREAM)]
        return out
    for x, y in dirs:
        for n in (x, y):
            if n not in ends:
                raise ChaosError(f"link spec {target!r}: unknown process {n!r}; processes: {sorted(ends)}")
        got = []
        if proxies.get(f"{x}_to_{y}") == (x, y):
            got.append((f"{x}_to_{y}", UPSTREAM))
        if proxies.get(f"{y}_to_{x}") == (y, x):
            got.append((f"{y}_to_{x}", DOWNSTREAM))
        if not got:
            raise ChaosError(f"link spec {target!r}: no proxy carries {x}->{y}")
        out += [g for g in got if g not in out]
    return out


def proxies_for_reset(streams: Iterable[LinkStream]) -> list[str]:
    """The proxies a link reset disables for these streams (see the module docstring)."""
    streams = list(streams)
    up = [p for p, s in streams if s == UPSTREAM]
    chosen = up or [p for p, _ in streams]
    return list(dict.fromkeys(chosen))


def _proxies_of_topology(topology: Any) -> dict[str, tuple[str, str]]:
    return {name: (l.client, l.server) for name, l in topology.links.items()}


def proxies_for_sites(sites: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{proxy: (client, server)} of a cluster of these sites (the same names `Topology` uses)."""
    from ground.topology import Topology

    return {name: (c, s) for name, c, s in Topology.link_names(tuple(sites))}


# ------------------------------------------------------------------------------ native


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, T, Z, ...), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return "?"
    # "pid (comm) S ..." -- comm may contain spaces and parentheses, so split at the last ')'.
    return data[data.rfind(b")") + 2:][:1].decode() or None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_state(pid) not in (None, "Z", "X")


def launcher_pids(run_dir: str | Path) -> dict[str, int]:
    """name -> pid of the latest `process_started` event of RUN/logs/launcher.jsonl.

    The child's pid is read from `child_pid` when the event has it, else from `pid`. CAUTION:
    EventLog stamps every event with the EMITTING process's own `pid` and a user field of the
    same name does not override it, so `log.emit("process_started", name=..., pid=child.pid)`
    records the launcher's pid. A `pid` equal to the pid stamped on the launcher's other events
    (or shared by two different names) is therefore the launcher's own and is ignored: a chaos
    driver must never signal the launcher.
    """
    from ground.eventlog import read_events

    try:
        events = [ev for ev in read_events(Path(run_dir) / "logs" / "launcher.jsonl") if isinstance(ev, dict)]
    except FileNotFoundError:
        return {}
    own = {ev.get("pid") for ev in events if ev.get("event") != "process_started"}
    by_pid: dict[Any, set[str]] = {}
    for ev in events:
        if ev.get("event") == "process_started" and "child_pid" not in ev:
            by_pid.setdefault(ev.get("pid"), set()).add(str(ev.get("name")))
    own |= {pid for pid, names in by_pid.items() if len(names) > 1}
    out: dict[str, int] = {}
    for ev in events:
        if ev.get("event") != "process_started" or "name" not in ev:
            continue
        pid = ev.get("child_pid", ev.get("pid"))
        if "child_pid" not in ev and pid in own:
            continue
        if isinstance(pid, int) and pid > 0:
            out[str(ev["name"])] = pid
    return out


def toxiproxy_client(api: str, where: Path) -> ToxiproxyClient:
    """A client for the Toxiproxy API at host:port (as recorded in a run's topology)."""
    if not api or ":" not in api:
        raise ChaosError(f"{where}: no toxiproxy_api (host:port) recorded")
    host, port = api.rsplit(":", 1)
    return ToxiproxyClient(host, int(port), timeout_s=5.0)


def chaos_log(run_dir: Path, run_id: str | None) -> "EventSink":
    """RUN/logs/chaos.jsonl as process "chaos" (run id from the run's config unless given)."""
    from ground.eventlog import EventLog

    if run_id is None:
        try:
            run_id = json.loads((run_dir / "config.json").read_text()).get("run_id") or run_dir.name
        except (OSError, ValueError):
            run_id = run_dir.name
    return EventLog(run_dir / "logs" / "chaos.jsonl", run_id, "chaos")


class NativeHandle:
    """The cluster of `xdc run`: local OS processes and the run's toxiproxy-server.

    procs: the launcher's {name: Popen}. Given, signals and restarts go through it (and a
        restart puts the new Popen in this same dict). None: pids come from the latest
        `process_started` event of RUN/logs/launcher.jsonl, re-read on every call.
    spawn: starts a process again by name and returns its Popen (the launcher passes its own);
        without it `restart` raises ChaosError.
    The Toxiproxy API address comes from RUN/topology.json (`toxiproxy_api`), the events go to
    RUN/logs/chaos.jsonl as process "chaos" unless `log` is given.
    """

    def __init__(self, run_dir: str | Path, procs: dict[str, subprocess.Popen] | None = None,
                 spawn: Callable[[str], subprocess.Popen] | None = None, *, toxiproxy: ToxiproxyClient | None = None,
                 log: EventSink | None = None, run_id: str | None = None) -> None:
        from ground.topology import Topology

        self.run_dir = Path(run_dir)
        self.procs = procs
        self.spawn = spawn
        self._spawned: dict[str, subprocess.Popen] = {}
        topo_path = self.run_dir / "topology.json"
        try:
            self.topology = Topology.load(topo_path)
        except FileNotFoundError:
            raise ChaosError(f"{topo_path} not found: is {self.run_dir} a run directory of `xdc run`?") from None
        self._proxies = _proxies_of_topology(self.topology)
        self.toxiproxy = toxiproxy or toxiproxy_client(self.topology.toxiproxy_api, topo_path)
        self.log = log or chaos_log(self.run_dir, run_id)

    # ---- processes ---------------------------------------------------------------------

    def _popen(self, process: str) -> subprocess.Popen | None:
        if process in self._spawned:
            return self._spawned[process]
        if self.procs is not None:
            return self.procs.get(process)
        return None

    def pid(self, process: str) -> int | None:
        p = self._popen(process)
        if p is not None:
            return p.pid
        if self.procs is not None:
            return None
        return launcher_pids(self.run_dir).get(process)

    def _known(self) -> list[str]:
        names = set(self._spawned) | set(self.procs or {}) | (set() if self.procs is not None
                                                              else set(launcher_pids(self.run_dir)))
        return sorted(names)

    def is_running(self, process: str) -> bool:
        p = self._popen(process)
        if p is not None:
            return p.poll() is None
        pid = self.pid(process)
        return pid is not None and _pid_alive(pid)

    def signal(self, process: str, sig: int) -> None:
        name = _signal.Signals(sig).name
        pid = self.pid(process)
        if pid is None:
            hint = "" if self.procs is not None else (
                " (RUN/logs/launcher.jsonl has no usable `process_started` pid for it: the launcher must log "
                "the child's pid as child_pid, because EventLog's own `pid` stamp wins over a `pid` field)")
            raise ChaosError(f"cannot send {name} to {process!r}: no such process; known: {self._known()}{hint}")
        if pid == os.getpid():
            raise ChaosError(f"refusing to send {name} to {process!r}: pid {pid} is this process")
        if not self.is_running(process):
            raise ChaosError(f"cannot send {name} to {process!r} (pid {pid}): it is not running")
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            raise ChaosError(f"cannot send {name} to {process!r} (pid {pid}): it is not running") from None

    def wait_exit(self, process: str, timeout_s: float) -> bool:
        p = self._popen(process)
        if p is not None:
            try:
                p.wait(timeout=timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        end = time.monotonic() + timeout_s
        while self.is_running(process):
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def restart(self, process: str) -> int:
        if self.spawn is None:
            raise ChaosError(f"cannot restart {process!r}: this handle has no spawn function "
                             "(run the scenario from `xdc run --scenario`, or pass spawn=)")
        if self.is_running(process):
            raise ChaosError(f"cannot restart {process!r}: it is still running (pid {self.pid(process)})")
        p = self.spawn(process)
        if self.procs is not None:
            self.procs[process] = p
        else:
            self._spawned[process] = p
        return p.pid

    # ---- links -------------------------------------------------------------------------

    def links(self, target: str) -> list[LinkStream]:
        return resolve_links(target, self._proxies)


def spawn_like_launcher(run_dir: str | Path) -> Callable[[str], subprocess.Popen]:
    """A spawn function for a chaos driver running OUTSIDE the launcher (`xdc chaos --run`): starts
    `python -m <module> --run-dir RUN [--site NAME]` with the module of the process's
    `process_started` event, output appended to RUN/logs/<name>.out. The launcher does not own a
    process started this way; prefer the launcher's own spawn (`xdc run --scenario`)."""
    run_dir = Path(run_dir)
    root = str(Path(__file__).resolve().parent.parent)

    def spawn(name: str) -> subprocess.Popen:
        modules: dict[str, str] = {}
        for ev in read_events(run_dir / "logs" / "launcher.jsonl"):
            if ev.get("event") == "process_started" and ev.get("module"):
                modules[ev["name"]] = ev["module"]
        if name not in modules:
            raise ChaosError(f"cannot restart {name!r}: RUN/logs/launcher.jsonl names no module for it")
        extra = [] if name in SERVICES else ["--site", name]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(run_dir / "logs" / f"{name}.out", "ab") as out:
            return subprocess.Popen([sys.executable, "-m", modules[name], "--run-dir", str(run_dir), *extra],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    return spawn


# ------------------------------------------------------------------------------ recording


class MemoryLog:
    """An in-memory event sink with EventLog's emit/set_context (events as plain dicts)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.epoch = 0
        self.step = 0

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, "epoch": fields.pop("epoch", self.epoch),
                            "step": fields.pop("step", self.step), **fields})

    def set_context(self, *, epoch: int | None = None, step: int | None = None) -> None:
        if epoch is not None:
            self.epoch = epoch
        if step is not None:
            self.step = step

    def close(self) -> None:
        pass

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


class RecordingToxiproxy:
    """The ToxiproxyClient methods the nemeses use, recorded into the handle's call list, with a
    model of proxies (enabled) and toxics that rejects what the real server rejects."""

    def __init__(self, calls: list[tuple], proxies: Iterable[str]) -> None:
        self.calls = calls
        self.enabled = {p: True for p in proxies}
        self.toxics: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in self.enabled}

    def _proxy(self, method: str, proxy: str) -> None:
        if proxy not in self.enabled:
            raise ToxiproxyError(f"toxiproxy: {method} /proxies/{proxy} -> HTTP 404: proxy not found",
                                 method=method, path=f"/proxies/{proxy}", status=404, server_error="proxy not found")

    def set_enabled(self, name: str, enabled: bool) -> Any:
        self.calls.append(("toxiproxy.set_enabled", name, bool(enabled)))
        self._proxy("PATCH", name)
        self.enabled[name] = bool(enabled)
        return {"name": name, "enabled": bool(enabled)}

    def add_toxic(self, proxy: str, name: str, type: str, stream: str, attributes: dict[str, Any],
                  toxicity: float = 1.0) -> dict[str, Any]:
        self.calls.append(("toxiproxy.add_toxic", proxy, name, type, stream, dict(attributes)))
        self._proxy("POST", proxy)
        if "rate" in attributes and not attributes["rate"] > 0:
            raise ValueError(f"toxic {name!r}: bandwidth rate must be > 0 KB/s")
        if name in self.toxics[proxy]:
            raise ToxiproxyError(f"toxiproxy: POST /proxies/{proxy}/toxics -> HTTP 409: toxic already exists",
                                 method="POST", path=f"/proxies/{proxy}/toxics", status=409,
                                 server_error="toxic already exists")
        t = {"name": name, "type": type, "stream": stream, "toxicity": toxicity, "attributes": dict(attributes)}
        self.toxics[proxy][name] = t
        return t

    def remove_toxic(self, proxy: str, name: str) -> None:
        self.calls.append(("toxiproxy.remove_toxic", proxy, name))
        self._proxy("DELETE", proxy)
        if name not in self.toxics[proxy]:
            raise ToxiproxyError(f"toxiproxy: DELETE /proxies/{proxy}/toxics/{name} -> HTTP 404: toxic not found",
                                 method="DELETE", path=f"/proxies/{proxy}/toxics/{name}", status=404,
                                 server_error="toxic not found")
        del self.toxics[proxy][name]

    def list_toxics(self, proxy: str) -> list[dict[str, Any]]:
        self._proxy("GET", proxy)
        return list(self.toxics[proxy].values())


class RecordingHandle:
    """A pure fake cluster: records every call in `calls` (in order) and models process states.

    Calls look like ("signal", "b", "SIGKILL"), ("restart", "b"), ("toxiproxy.add_toxic", proxy,
    name, type, stream, attrs), ("toxiproxy.remove_toxic", proxy, name),
    ("toxiproxy.set_enabled", proxy, False). `state[p]` is "running", "stopped" or "exited".
    A process exits on SIGTERM unless it is in `ignore_term`; signalling an exited process
    raises ChaosError like the native handle does.
    """

    def __init__(self, sites: Iterable[str] = ("a", "b", "c"), *, log: EventSink | None = None,
                 ignore_term: Iterable[str] = ()) -> None:
        self.sites = tuple(sites)
        self._proxies = proxies_for_sites(self.sites)
        self.calls: list[tuple] = []
        self.state = {p: "running" for p in (*SERVICES, *self.sites)}
        self.pids = {p: 1000 + i for i, p in enumerate(self.state)}
        self._next_pid = 2000
        self.ignore_term = set(ignore_term)
        self.toxiproxy = RecordingToxiproxy(self.calls, self._proxies)
        self.log = log if log is not None else MemoryLog()

    def _check(self, process: str) -> None:
        if process not in self.state:
            raise ChaosError(f"no such process {process!r}; known: {sorted(self.state)}")

    def pid(self, process: str) -> int | None:
        return self.pids.get(process)

    def is_running(self, process: str) -> bool:
        self._check(process)
        return self.state[process] != "exited"

    def signal(self, process: str, sig: int) -> None:
        name = _signal.Signals(sig).name
        self.calls.append(("signal", process, name))
        self._check(process)
        if self.state[process] == "exited":
            raise ChaosError(f"cannot send {name} to {process!r}: it is not running")
        if sig == _signal.SIGKILL or (sig == _signal.SIGTERM and process not in self.ignore_term
                                      and self.state[process] == "running"):
            self.state[process] = "exited"
        elif sig == _signal.SIGSTOP:
            self.state[process] = "stopped"
        elif sig == _signal.SIGCONT:
            self.state[process] = "running"

    def wait_exit(self, process: str, timeout_s: float) -> bool:
        return not self.is_running(process)

    def restart(self, process: str) -> int:
        self.calls.append(("restart", process))
        self._check(process)
        if self.state[process] != "exited":
            raise ChaosError(f"cannot restart {process!r}: it is still running")
        self.state[process] = "running"
        self._next_pid += 1
        self.pids[process] = self._next_pid
        return self._next_pid

    def links(self, target: str) -> list[LinkStream]:
        return resolve_links(target, self._proxies)
