"""Faults as small parts: one nemesis per fault kind, each with its own healing step.

    n = nemesis_for(fault, index)
    what = n.inject(handle)          # a dict, logged as the `fault_injected` event's `result`
    n.tick(handle, since_inject_s)   # follow-up while injected (the preemption's SIGKILL after grace)
    what = n.heal(handle)            # a dict, logged as `fault_healed`'s `result`
    n.heal(handle, final=True)       # the run is ending: undo what must be undone (SIGCONT, links),
                                     # but start no process again

A nemesis acts only through a `ClusterHandle` (chaos/handle.py) and keeps no clock of its own:
the driver passes elapsed time to `tick`, so everything here runs on a virtual clock in tests.
Injections that touch several proxies are all-or-nothing (what was added is rolled back before
the error propagates); heals try every part and then raise one error naming what failed.
`NoOp` stands in for any fault (`nemesis_for(fault, noop=True)`): it does nothing and says what
it would have done.
"""

from __future__ import annotations

import time

import signal
from typing import Any, ClassVar, TypeVar

from chaos.handle import DOWNSTREAM, UPSTREAM, ChaosError, ClusterHandle, proxies_for_reset
from chaos.scenario import Fault, Trigger
from ground.faults import FAULT_KINDS
from wan.toxiproxy import ToxiproxyError

EXIT_WAIT_S = 10.0  # how long a SIGKILLed process may take to be gone before a restart
# Tries per toxic removal within one heal (each may wait out the control client's 5 s timeout);
# the driver tries a failed heal again later, so one heal never holds the driver for long.
REMOVE_ATTEMPTS = 2


NEMESES: dict[str, type["Nemesis"]] = {}  # kind -> its nemesis class, filled by @register


class Nemesis:
    """How one kind of fault (its entry in ground/faults.py) is injected and healed."""

    kind: ClassVar[str] = "noop"
    instant: ClassVar[bool] = False  # heals itself inside inject (site_restart): from the kind's entry

    def __init__(self, fault: Fault | None = None, index: int = 0) -> None:
        self.fault = fault if fault is not None else Fault(self.kind, "", Trigger(at_s=0.0))
        self.index = index

    @property
    def target(self) -> str:
        return self.fault.target

    @property
    def params(self) -> Any:
        return self.fault.params

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        raise NotImplementedError

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        raise NotImplementedError

    def tick(self, handle: ClusterHandle, since_inject_s: float) -> dict[str, Any] | None:
        """Called by the driver on every poll while the fault is injected; a dict is logged."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(f{self.index} {self.fault.kind} {self.target!r})"


N = TypeVar("N", bound=type[Nemesis])


def register(cls: N) -> N:
    """Make `cls` the nemesis of its kind, which must be registered in ground/faults.py."""
    if cls.kind not in FAULT_KINDS:
        raise TypeError(f"{cls.__name__}.kind {cls.kind!r} is not a registered fault kind (ground/faults.py)")
    if cls.kind in NEMESES:
        raise TypeError(f"two nemeses for {cls.kind!r}: {NEMESES[cls.kind].__name__} and {cls.__name__}")
    cls.instant = FAULT_KINDS[cls.kind].instant
    NEMESES[cls.kind] = cls
    return cls


@register
class NoOp(Nemesis):
    """Does nothing; reports what it stands in for (any kind, with noop=True) or marks (kind noop)."""

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        return {"noop": True, "stands_for": self.fault.kind, "target": self.target}

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        return {"noop": True}


# ------------------------------------------------------------------------------ processes


def _kill(handle: ClusterHandle, process: str) -> dict[str, Any]:
    pid = handle.pid(process)
    handle.signal(process, signal.SIGKILL)
    exited = handle.wait_exit(process, EXIT_WAIT_S)
    return {"process": process, "pid": pid, "signal": "SIGKILL", "exited": exited}


def _restart(handle: ClusterHandle, process: str, *, wanted: bool, final: bool) -> dict[str, Any]:
    if not wanted:
        return {"process": process, "restarted": False, "reason": "restart: false"}
    if final:
        return {"process": process, "restarted": False, "reason": "run ending"}
    if handle.is_running(process):
        return {"process": process, "restarted": False, "reason": "already running", "pid": handle.pid(process)}
    pid = handle.restart(process)
    return {"process": process, "restarted": True, "pid": pid}


def _cont(handle: ClusterHandle, process: str) -> dict[str, Any]:
    if not handle.is_running(process):
        return {"process": process, "signal": None, "skipped": "not running"}
    handle.signal(process, signal.SIGCONT)
    return {"process": process, "signal": "SIGCONT", "pid": handle.pid(process)}


@register
class SiteCrash(Nemesis):
    """SIGKILL the site. Heal: start it again (params.restart, default true)."""

    kind = "site_crash"

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        return _kill(handle, self.target)

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        return _restart(handle, self.target, wanted=self.params.get("restart", True), final=final)


@register
class SitePreempt(Nemesis):
    """SIGTERM the site: its preemption notice (the site announces it and leaves). If it is still
    alive `grace_s` later, SIGKILL. Heal: (kill it if it still runs, then) start it again."""

    kind = "site_preempt"

    def __init__(self, fault: Fault | None = None, index: int = 0) -> None:
        super().__init__(fault, index)
        self._settled = False

    @property
    def grace_s(self) -> float:
        return float(self.params.get("grace_s", 5.0))

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        pid = handle.pid(self.target)
        handle.signal(self.target, signal.SIGTERM)
        self._settled = False
        return {"process": self.target, "pid": pid, "signal": "SIGTERM", "grace_s": self.grace_s}

    def tick(self, handle: ClusterHandle, since_inject_s: float) -> dict[str, Any] | None:
        if self._settled:
            return None
        if not handle.is_running(self.target):
            self._settled = True
            return {"action": "exited_within_grace", "process": self.target,
                    "seen_exited_after_s": round(since_inject_s, 3), "grace_s": self.grace_s}
        if since_inject_s >= self.grace_s:
            self._settled = True
            return {"action": "sigkill_after_grace", **_kill(handle, self.target), "grace_s": self.grace_s,
                    "after_s": round(since_inject_s, 3)}
        return None

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if not final and handle.is_running(self.target):
            extra["killed_at_heal"] = _kill(handle, self.target)
            self._settled = True
        return {**_restart(handle, self.target, wanted=self.params.get("restart", True), final=final), **extra}


@register
class SiteHang(Nemesis):
    """SIGSTOP the site (it holds its sockets and answers nothing). Heal: SIGCONT."""

    kind = "site_hang"

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        pid = handle.pid(self.target)
        handle.signal(self.target, signal.SIGSTOP)
        return {"process": self.target, "pid": pid, "signal": "SIGSTOP"}

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        return _cont(handle, self.target)


@register
class SiteRestart(Nemesis):
    """SIGKILL the site and start it again at once: it must rejoin. Heals itself in inject."""

    kind = "site_restart"

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        killed = _kill(handle, self.target)
        if not killed["exited"]:
            raise ChaosError(f"{self.target!r} did not exit within {EXIT_WAIT_S:g} s of SIGKILL; not restarted")
        pid = handle.restart(self.target)
        return {"process": self.target, "old_pid": killed["pid"], "signal": "SIGKILL", "restarted": True, "pid": pid}

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        return {"process": self.target, "instant": True}


@register
class StoreOutage(Nemesis):
    """The checkpoint store goes away: mode "stop" = SIGSTOP (heal SIGCONT), "kill" = SIGKILL
    (heal: start it again)."""

    kind = "store_outage"

    @property
    def mode(self) -> str:
        return str(self.params.get("mode", "stop"))

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        if self.mode == "kill":
            return {"mode": "kill", **_kill(handle, self.target)}
        pid = handle.pid(self.target)
        handle.signal(self.target, signal.SIGSTOP)
        return {"mode": "stop", "process": self.target, "pid": pid, "signal": "SIGSTOP"}

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        if self.mode == "kill":
            return {"mode": "kill", **_restart(handle, self.target, wanted=True, final=final)}
        return {"mode": "stop", **_cont(handle, self.target)}


@register
class CoordinatorCrash(Nemesis):
    """SIGKILL the coordinator. Heal: start it again (it recovers from its journal)."""

    kind = "coord_crash"

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        return _kill(handle, self.target)

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        return _restart(handle, self.target, wanted=self.params.get("restart", True), final=final)


# ------------------------------------------------------------------------------ links

_SHORT = {UPSTREAM: "up", DOWNSTREAM: "down"}


def _remove_toxics(handle: ClusterHandle, toxics: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Remove (proxy, stream, name) toxics; one already gone is `missing`, not an error."""
    removed, missing, errors = [], [], []
    for proxy, _stream, name in toxics:
        # Toxiproxy's API can stall while a toxic with queued data is removed under load (it
        # flushes first): a timed-out DELETE may still complete, so retry and accept a 404.
        last: ToxiproxyError | None = None
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                handle.toxiproxy.remove_toxic(proxy, name)
                removed.append(f"{proxy}/{name}")
                last = None
                break
            except ToxiproxyError as e:
                if e.status == 404:  # gone: never there, or an earlier timed-out attempt removed it
                    (missing if attempt == 0 else removed).append(f"{proxy}/{name}")
                    last = None
                    break
                last = e
                time.sleep(0.5)
        if last is not None:
            errors.append(str(last))
    if errors:
        raise ChaosError(f"could not remove {len(errors)} toxic(s): " + "; ".join(errors))
    return {"removed": removed, "missing": missing}


def _last_first(toxics: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The toxics in removal order: stream by stream (as added), each stream's chain last-first."""
    chains: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for t in toxics:
        chains.setdefault((t[0], t[1]), []).append(t)
    return [t for chain in chains.values() for t in reversed(chain)]


class _ToxicNemesis(Nemesis):
    """Adds toxics to every (proxy, stream) of the target link; heal removes exactly those."""

    def __init__(self, fault: Fault | None = None, index: int = 0) -> None:
        super().__init__(fault, index)
        self.added: list[tuple[str, str, str]] = []

    def toxics(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(short type name, toxiproxy type, attributes) to add on each stream."""
        raise NotImplementedError

    def toxic_name(self, short: str, stream: str) -> str:
        return f"chaos_{short}_f{self.index}_{_SHORT[stream]}"

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        streams = handle.links(self.target)
        toxicity = float(self.params.get("toxicity", 1.0))
        self.added = []
        try:
            for proxy, stream in streams:
                for short, typ, attrs in self.toxics():
                    name = self.toxic_name(short, stream)
                    handle.toxiproxy.add_toxic(proxy, name, typ, stream, attrs, toxicity=toxicity)
                    self.added.append((proxy, stream, name))
        except Exception:
            added, self.added = self.added, []
            try:
                _remove_toxics(handle, _last_first(added))
            except ChaosError:
                pass  # the original error is the one worth reporting
            raise
        return {"link": self.target, "toxics": [{"proxy": p, "stream": s, "name": n} for p, s, n in self.added],
                "types": [t for _s, t, _a in self.toxics()]}

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        # Last added, first removed: Toxiproxy flushes a removed toxic's queued data into the next
        # toxic of the chain, so removing `latency` while `bandwidth` (after it) still throttles
        # blocks the API at the throttled rate (a soak run saw a heal block the driver for 55 s).
        out = _remove_toxics(handle, _last_first(self.added))
        self.added = []
        return {"link": self.target, **out}


@register
class LinkBlackhole(_ToxicNemesis):
    """A `timeout` toxic with timeout 0 on each stream of the link: the TCP connections stay up and
    nothing passes (only heartbeats notice). Heal removes it, which closes the held connections."""

    kind = "link_blackhole"

    def toxics(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [("blackhole", "timeout", {"timeout": 0})]


@register
class LinkDegrade(_ToxicNemesis):
    """Toxics on each stream of the link, on top of the configured WAN profile: latency/jitter (ms),
    bandwidth (KB/s, never 0), slicer (small delayed chunks), and the two cuts: timeout (no data,
    close after N ms) and reset_peer (at the first data, wait N ms, RST), which pass NO data
    while they wait and so make sense with toxicity < 1. Heal removes them."""

    kind = "link_degrade"

    def toxics(self) -> list[tuple[str, str, dict[str, Any]]]:
        p = self.params
        out: list[tuple[str, str, dict[str, Any]]] = []
        if p.get("latency_ms") is not None or p.get("jitter_ms") is not None:
            out.append(("latency", "latency", {"latency": int(p.get("latency_ms") or 0),
                                               "jitter": int(p.get("jitter_ms") or 0)}))
        if p.get("bandwidth_kbps") is not None:
            rate = int(p["bandwidth_kbps"])
            if rate <= 0:
                raise ChaosError("bandwidth_kbps must be > 0 (a rate of 0 hangs the link; use link_blackhole)")
            out.append(("bandwidth", "bandwidth", {"rate": rate}))
        if p.get("slicer") is not None:
            s = p["slicer"]
            out.append(("slicer", "slicer", {"average_size": int(s["average_size"]),
                                             "size_variation": int(s.get("size_variation", 0)),
                                             "delay": int(s.get("delay_us", 0))}))
        if p.get("timeout_ms") is not None:
            out.append(("timeout", "timeout", {"timeout": int(p["timeout_ms"])}))
        if p.get("reset_peer_ms") is not None:
            out.append(("reset_peer", "reset_peer", {"timeout": int(p["reset_peer_ms"])}))
        if not out:
            raise ChaosError("link_degrade needs at least one of latency_ms, jitter_ms, bandwidth_kbps, "
                             "timeout_ms, reset_peer_ms, slicer")
        return out


@register
class LinkReset(Nemesis):
    """Disable the link's proxies: open connections close, new ones are refused (a reset, which
    the peers see at once). Heal: enable them (same listen address)."""

    kind = "link_reset"

    def __init__(self, fault: Fault | None = None, index: int = 0) -> None:
        super().__init__(fault, index)
        self.disabled: list[str] = []

    def inject(self, handle: ClusterHandle) -> dict[str, Any]:
        proxies = proxies_for_reset(handle.links(self.target))
        self.disabled = []
        try:
            for p in proxies:
                handle.toxiproxy.set_enabled(p, False)
                self.disabled.append(p)
        except Exception:
            for p in self.disabled:
                try:
                    handle.toxiproxy.set_enabled(p, True)
                except Exception:
                    pass
            self.disabled = []
            raise
        return {"link": self.target, "disabled": list(self.disabled)}

    def heal(self, handle: ClusterHandle, *, final: bool = False) -> dict[str, Any]:
        enabled, errors = [], []
        for p in self.disabled:
            try:
                handle.toxiproxy.set_enabled(p, True)
                enabled.append(p)
            except ToxiproxyError as e:
                errors.append(str(e))
        self.disabled = [p for p in self.disabled if p not in enabled]
        if errors:
            raise ChaosError(f"could not re-enable {len(errors)} proxy(ies): " + "; ".join(errors))
        return {"link": self.target, "enabled": enabled}


# ------------------------------------------------------------------------------ registry

# NEMESES is filled by @register above: one class per kind of ground/faults.py (a test checks).


def nemesis_for(fault: Fault, index: int = 0, *, noop: bool = False) -> Nemesis:
    """The nemesis of a fault (`index` is its position in the scenario: it names its toxics).
    noop=True gives the no-op stand-in for any kind."""
    if noop:
        return NoOp(fault, index)
    try:
        cls = NEMESES[fault.kind]
    except KeyError:
        raise ChaosError(f"no nemesis for fault kind {fault.kind!r}; known: {sorted(NEMESES)}") from None
    return cls(fault, index)
