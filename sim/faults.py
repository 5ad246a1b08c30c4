"""The scenario's faults on the virtual clock: chaos/scenario.py's Scenario, fired as chaos/driver.py does.

Triggers (injection and heal): `at_s` (seconds after the first epoch forms, when the driver
starts), `at_useful_tokens` and `at_step` (at the first commit past them, `fault_poll_s` later:
the driver polls the coordinator's log); or `duration_s` after the injection. A run with fault
gates (ground/gates.py) has its sites wait after the round whose commit fires an `at_useful_tokens`
fault until every fault at those tokens is injected and its action done (sim/gates.py),
as the driver releases them. Kinds modeled:

  site_crash    SIGKILL: the site's work in flight is lost, its connection closes; with
                `restart`, it starts again at the heal (a new incarnation that joins)
  site_restart  SIGKILL and start again at once
  site_preempt  SIGTERM: the site announces its preemption (`preempt_notice`) and exits
                (`preempt_exit_s` + a round trip, well within any grace_s); with `restart`, it
                starts again at the heal
  site_hang     SIGSTOP: the site does nothing until the heal (SIGCONT): no heartbeats, its compute
                and timers wait (they run later by the time it was stopped), messages to it wait
                and are handled at the heal, in order; its connections stay up, so only the
                heartbeat timeout can fail it (sim/engine.py `Clock.suspend`). A crash, restart or
                preemption of a stopped site first continues it (a SIGKILL ends it either way).
  link_blackhole / link_reset
                the link's proxies pass nothing until the heal (sim/links.py `cut`): a message that
                would cross one waits in its sender's queue and is delivered after the heal, once
                the connection is back (`reconnect_s`); a collective whose members cannot all hear
                each other does not complete, and a member that hears nothing from a peer for
                `wan.collective_stall_ms` reports it (`peer_unreachable`); an upload to the store
                waits. A reset also closes the site's connection to the coordinator at once (the
                coordinator's disconnect grace runs); a blackhole leaves it up (only the heartbeat
                timeout notices).
  store_outage  the store stops (mode stop: SIGSTOP) or dies (mode kill) until the heal: uploads
                and restore reads in flight or begun meanwhile finish only after it (the writer
                waits, as the real uploader does); a killed store starts again at the heal with its
                manifests (they are on disk), after `store_restart_s`
  coord_crash   SIGKILL the coordinator: its timers die with it, what the sites send waits in
                their queues; at the heal (plus `coord_restart_s`) it starts again with the state
                the core's own `recover` rebuilds from its journal, announces the current epoch
                again, and receives what waited (coordinator/service.py's restart)
  link_degrade  `latency_ms` added and `bandwidth_kbps` capped on the link's directions (the
                collective, state transfers and control messages see them) until the heal;
                jitter is taken at its mean (0). A `slicer` (pieces of `average_size` bytes,
                `delay_us` apart) caps the rate at average_size / delay as well (the lower cap
                wins; size_variation is taken at its mean). `timeout_ms` and `reset_peer_ms` pass
                no data (a cut, as a blackhole), and close the connection after that many ms
                (timeout: from the injection; reset_peer: from its first data, which the
                heartbeats send at once) so the coordinator's end of a site's own connection
                closes then (its disconnect grace runs); a timeout of 0 never closes. The heal
                removes them and releases what waited, as a blackhole's does.
  noop          nothing

Any other kind or parameter (link_degrade with toxicity below 1: only some connections affected)
is refused before the run, never silently ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaos.scenario import Fault, Scenario, Trigger
from ground.faults import parse_link_target
from sim.engine import MONO_BASE_NS, ns

if TYPE_CHECKING:
    from sim.world import World

MODELED_KINDS = ("site_crash", "site_restart", "site_preempt", "site_hang", "link_blackhole", "link_reset",
                 "link_degrade", "store_outage", "coord_crash", "noop")
DEGRADE_PARAMS = ("latency_ms", "jitter_ms", "bandwidth_kbps", "toxicity", "slicer", "timeout_ms", "reset_peer_ms")


def degrade_kbps(params: dict[str, Any]) -> int:
    """The rate cap (KB/s, Toxiproxy's 1,000 bytes) of a link_degrade: its bandwidth and its slicer's
    average_size per delay, the lower; 0 when it caps nothing."""
    caps = [int(params["bandwidth_kbps"])] if params.get("bandwidth_kbps") else []
    sl = params.get("slicer") or {}
    if sl and int(sl.get("delay_us") or 0) > 0:
        # bytes per microsecond x 1e6 / 1000 = KB/s; at least 1 (a cap of 0 would mean "no cap")
        caps.append(max(1, int(int(sl["average_size"]) * 1000 / int(sl["delay_us"]))))
    return min(caps) if caps else 0


def degrade_close_ms(params: dict[str, Any]) -> int | None:
    """When a link_degrade's cut closes the connection (ms after the injection), None when it passes
    data or never closes it (timeout 0)."""
    closes = [int(params["timeout_ms"])] if int(params.get("timeout_ms") or 0) > 0 else []  # 0: never closes
    if params.get("reset_peer_ms") is not None:  # RST that long after the first data (at once: heartbeats)
        closes.append(int(params["reset_peer_ms"]))
    return min(closes) if closes else None


def degrade_cuts(params: dict[str, Any]) -> bool:
    return params.get("timeout_ms") is not None or params.get("reset_peer_ms") is not None


class UnsupportedFault(ValueError):
    pass


def check_supported(scenario: Scenario) -> None:
    bad = sorted({f.kind for f in scenario.faults} - set(MODELED_KINDS))
    if bad:
        raise UnsupportedFault(f"the simulator does not model fault kind(s) {bad} yet (modeled: {list(MODELED_KINDS)})")
    for f in scenario.faults:
        if f.kind != "link_degrade":
            continue
        extra = sorted(k for k, v in f.params.items() if v is not None and k not in DEGRADE_PARAMS)
        if extra or f.params.get("toxicity", 1.0) != 1.0:
            raise UnsupportedFault(f"link_degrade on {f.target}: the simulator models its toxics on every connection "
                                   f"({', '.join(DEGRADE_PARAMS)} at toxicity 1), not {extra or ['toxicity < 1']}")


class SimChaos:
    def __init__(self, w: World, scenario: Scenario | None) -> None:
        self.w, self.scenario = w, scenario
        self.log = w.log_for("chaos") if scenario is not None else None
        self.t0_ns: int | None = None
        self.status: dict[int, str] = {}
        self.armed: list[tuple[Trigger, str, int]] = []  # progress triggers waiting for a commit: (when, what, fault)

    # ------------------------------------------------------------------ triggers
    def on_epoch_one(self) -> None:
        if self.scenario is None or self.t0_ns is not None:
            return
        self.t0_ns = self.w.clock.now_ns
        assert self.log is not None
        self.log.emit("scenario_started", scenario=self.scenario.name, seed=self.scenario.seed,
                      description=self.scenario.description, n_faults=len(self.scenario.faults),
                      faults=[f.to_dict() for f in self.scenario.faults], noop=False, clock_s=self.t0_ns / 1e9,
                      started_by={"simulated": True})
        for i, f in enumerate(self.scenario.faults):
            self._arm(f.trigger, "inject", i, {})

    def _arm(self, t: Trigger, what: str, i: int, progress: dict[str, Any]) -> None:
        if t.by_progress:
            self.armed.append((t, what, i))
        else:
            assert self.t0_ns is not None
            self.w.clock.at(self.t0_ns + int(float(t.value) * 1e9), self._fire, what, i, progress)

    def on_commit(self, fields: dict[str, Any]) -> None:
        keep = []
        for t, what, i in self.armed:
            got = fields.get("useful_tokens", 0) if t.key == "at_useful_tokens" else fields.get("step", 0)
            if got >= t.value:
                self.w.clock.after(self.w.model.fault_poll_s, self._fire, what, i, dict(fields))
            else:
                keep.append((t, what, i))
        self.armed = keep

    def _fire(self, what: str, i: int, progress: dict[str, Any]) -> None:
        assert self.scenario is not None
        f = self.scenario.faults[i]
        (self.inject if what == "inject" else self.heal)(i, f, progress)

    def _t_s(self) -> float:
        return (self.w.clock.now_ns - (self.t0_ns or 0)) / 1e9

    # ------------------------------------------------------------------ faults
    def inject(self, i: int, f: Fault, progress: dict[str, Any]) -> None:
        assert self.log is not None and self.scenario is not None
        result: dict[str, Any] = {}
        span: dict[str, int] = {}
        if f.kind in ("site_crash", "site_restart", "site_preempt"):
            self.w.clock.resume(self.w.sites[f.target])  # a stopped site: the signal ends the stop first
        if f.kind in ("site_crash", "site_restart"):
            site = self.w.sites[f.target]
            result = {"process": f.target, "pid": site.pid, "signal": "SIGKILL", "exited": True}
            teardown_s = self.w.model.crash_teardown_s
            site.kill(teardown_s, self.w.model.crash_close_s)
            if teardown_s > 0:  # the action's span, as the emulator's driver logs it: SIGKILL -> exited
                now = self.w.clock.now_ns
                span = {"start_mono_ns": MONO_BASE_NS + now, "end_mono_ns": MONO_BASE_NS + now + ns(teardown_s)}
        elif f.kind == "site_preempt":
            site = self.w.sites[f.target]
            result = {"process": f.target, "pid": site.pid, "signal": "SIGTERM", "grace_s": f.params.get("grace_s")}
            site.terminate()
        elif f.kind == "site_hang":
            site = self.w.sites[f.target]
            result = {"process": f.target, "pid": site.pid, "signal": "SIGSTOP"}
            self.w.clock.suspend(site)
        elif f.kind in ("link_blackhole", "link_reset"):
            pairs = self._pairs(f)
            self.w.links.cut(i, pairs, f.kind)
            names = [f"{a}_to_{b}" for a, b in pairs]
            if f.kind == "link_reset":
                for a, b in pairs:  # the coordinator's end of each site's own connection closes now
                    if b == "coord" and self.w.sites[a].alive:
                        self.w.coord.connection_lost(a)
                result = {"link": f.target, "disabled": names}
            else:
                result = {"link": f.target, "types": ["timeout"], "toxics": [
                    {"proxy": n, "stream": st, "name": f"chaos_blackhole_f{i}_{st[:2]}"}
                    for n in names for st in ("upstream", "downstream")]}
        elif f.kind == "store_outage":
            mode = str(f.params.get("mode", "stop"))
            self.w.store.stop()
            result = {"mode": mode, "process": "store", "pid": 12,
                      "signal": "SIGSTOP" if mode == "stop" else "SIGKILL", **({"exited": True} if mode == "kill" else {})}
        elif f.kind == "coord_crash":
            result = {"process": "coord", "pid": 11, "signal": "SIGKILL", "exited": True}
            self.w.coord.crash()
        elif f.kind == "link_degrade":
            pairs = self._pairs(f)
            self.w.links.degrade(i, pairs, int(f.params.get("latency_ms") or 0), degrade_kbps(f.params))
            result = {"links": [f"{a}_to_{b}" for a, b in pairs]}
            if degrade_cuts(f.params):  # timeout / reset_peer: nothing passes while they are on
                self.w.links.cut(i, pairs, "link_blackhole")
                close_ms = degrade_close_ms(f.params)
                if close_ms is not None:
                    self.w.clock.after(close_ms / 1000.0, self._close_coord_connections, i, pairs)
        self.status[i] = "injected"
        heal_s = 0.0 if f.kind == "site_restart" else f.duration_s
        self.log.emit("fault_injected", scenario=self.scenario.name, fault=i, kind=f.kind, target=f.target,
                      params=dict(f.params), note=f.note, noop=f.kind == "noop", result=result, t_s=self._t_s(),
                      heal_at=({"after_s": heal_s} if heal_s is not None else f.heal.to_dict() if f.heal else None),
                      progress={"useful_tokens": progress.get("useful_tokens"), "step": progress.get("step")},
                      trigger=f.trigger.to_dict(), **span)
        if heal_s is not None:
            self.w.clock.after(heal_s, self._fire, "heal", i, {})
        elif f.heal is not None:
            self._arm(f.heal, "heal", i, {})
        if f.trigger.key == "at_useful_tokens":
            self._release_gate(int(f.trigger.value), span, progress)

    def _release_gate(self, tokens: int, span: dict[str, int], progress: dict[str, Any]) -> None:
        """As the driver: once every fault at these tokens is injected, release their fault gate
        (ground/gates.py), after the action (a crash's: until the process exited); the sites waiting
        there go on."""
        assert self.scenario is not None and self.log is not None
        if tokens not in self.w.rounds.gates.tokens or any(
                self.status.get(j) is None for j, g in enumerate(self.scenario.faults)
                if g.trigger.key == "at_useful_tokens" and int(g.trigger.value) == tokens):
            return
        after_ns = span["end_mono_ns"] - MONO_BASE_NS - self.w.clock.now_ns if span else 0
        self.w.clock.after(after_ns / 1e9, self._released, tokens,
                           {"useful_tokens": progress.get("useful_tokens"), "step": progress.get("step")})

    def _released(self, tokens: int, progress: dict[str, Any]) -> None:
        assert self.log is not None
        self.log.emit("fault_gate_released", gate_tokens=tokens, reason="injected", progress=progress)
        self.w.rounds.gates.release(tokens)

    def _uncut(self, i: int) -> None:
        """A cut proxy passes data again: what waited for it is delivered, stalled collectives go on."""
        self.w.links.uncut(i)
        self.w.release()
        self.w.rounds.on_heal()

    def _close_coord_connections(self, i: int, pairs: list[tuple[str, str]]) -> None:
        """A timeout / reset_peer toxic closes the connections it holds: the coordinator's end of each
        site's own connection on the link closes (if the fault is still on)."""
        if self.status.get(i) != "injected":
            return
        for a, b in pairs:
            if b == "coord" and self.w.sites[a].alive:
                self.w.coord.connection_lost(a)

    def _store_started(self) -> None:
        self.w.store.cont(True)  # scheduled here, not as the store's own event (that would wait for itself)

    def _pairs(self, f: Fault) -> list[tuple[str, str]]:
        sites = list(self.w.sites)
        lt = parse_link_target(f.target, sites)
        got = lt.directions()
        if got is not None:
            return got
        others = [*sites, "coord", "store"]
        return [(lt.src, o) for o in others if o != lt.src] + [(o, lt.src) for o in sites if o != lt.src]

    def heal(self, i: int, f: Fault, _progress: dict[str, Any]) -> None:
        assert self.log is not None and self.scenario is not None
        result: dict[str, Any] = {}
        restart = f.kind in ("site_crash", "site_preempt") and f.params.get("restart", True)
        if f.kind == "site_restart" or restart:
            delay_s, warm = self.w.standby.restart(self.w.clock.now_ns, self.w.model)
            self.w.sites[f.target].start(delay_s)
            result = {"process": f.target, "restarted": True, **({"warm_standby": True} if warm else {})}
        elif f.kind == "site_hang":
            site = self.w.sites[f.target]
            self.w.clock.resume(site)
            result = {"process": f.target, "signal": "SIGCONT", "pid": site.pid} if site.alive else \
                {"process": f.target, "signal": None, "skipped": "not running"}
        elif f.kind in ("link_blackhole", "link_reset"):
            self._uncut(i)
            result = {"link": f.target, **({"enabled": [f"{a}_to_{b}" for a, b in self._pairs(f)]}
                                           if f.kind == "link_reset" else {"removed": True})}
        elif f.kind == "store_outage":
            mode = str(f.params.get("mode", "stop"))
            if mode == "kill":
                self.w.clock.after(self.w.model.store_restart_s, self._store_started)
                result = {"mode": mode, "process": "store", "restarted": True}
            else:
                self.w.store.cont(False)
                result = {"mode": mode, "process": "store", "signal": "SIGCONT", "pid": 12}
        elif f.kind == "coord_crash":
            if f.params.get("restart", True):
                self.w.clock.after(self.w.model.coord_restart_s, self.w.coord.restart)
                result = {"process": "coord", "restarted": True}
            else:
                result = {"process": "coord", "restarted": False, "skipped": "restart: false"}
        elif f.kind == "link_degrade":
            self.w.links.heal(i)
            if degrade_cuts(f.params):
                self._uncut(i)
            result = {"removed": True}
        self.status[i] = "healed"
        self.log.emit("fault_healed", scenario=self.scenario.name, fault=i, kind=f.kind, target=f.target,
                      result=result, reason="trigger", t_s=self._t_s())

    def never_fired(self) -> list[str]:
        """Every fault of the scenario that was never injected, as `faults[i] kind target (trigger k=v)`."""
        if self.scenario is None:
            return []
        return [f"faults[{i}] {f.kind} {f.target or '-'} (trigger {f.trigger.key}={f.trigger.value})"
                for i, f in enumerate(self.scenario.faults) if i not in self.status]

    def finish(self) -> None:
        if self.scenario is None or self.log is None:
            return
        never = [i for i in range(len(self.scenario.faults)) if i not in self.status]
        self.log.emit("scenario_finished", scenario=self.scenario.name, started=self.t0_ns is not None,
                      t_s=self._t_s(), statuses={str(k): v for k, v in self.status.items()}, never_fired=never,
                      failed=[], taken_down=[])
