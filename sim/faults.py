"""The scenario's faults on the virtual clock: chaos/scenario.py's Scenario, fired as chaos/driver.py does.

Triggers: `at_s` (seconds after the first epoch forms, when the driver starts), `at_useful_tokens`
and `at_step` (at the first commit past them, `fault_poll_s` later: the driver polls the
coordinator's log). Kinds modeled so far: site_crash (SIGKILL; restarted after duration_s when
`restart`), site_restart (kill and start again at once). Any other kind is refused before the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaos.scenario import Fault, Scenario

if TYPE_CHECKING:
    from sim.world import World

MODELED_KINDS = ("site_crash", "site_restart", "noop")


class UnsupportedFault(ValueError):
    pass


def check_supported(scenario: Scenario) -> None:
    bad = sorted({f.kind for f in scenario.faults} - set(MODELED_KINDS))
    if bad:
        raise UnsupportedFault(f"the simulator does not model fault kind(s) {bad} yet (modeled: {list(MODELED_KINDS)})")


class SimChaos:
    def __init__(self, w: World, scenario: Scenario | None) -> None:
        self.w, self.scenario = w, scenario
        self.log = w.log_for("chaos") if scenario is not None else None
        self.t0_ns: int | None = None
        self.status: dict[int, str] = {}
        self.fired: set[int] = set()

    def on_commit(self, fields: dict[str, Any]) -> None:
        if self.scenario is None:
            return
        for i, f in enumerate(self.scenario.faults):
            if i in self.fired or not f.trigger.by_progress:
                continue
            key, val = f.trigger.key, f.trigger.value
            got = fields.get("useful_tokens", 0) if key == "at_useful_tokens" else fields.get("step", 0)
            if got >= val:
                self.fired.add(i)
                self.w.clock.after(self.w.model.fault_poll_s, self.inject, i, f, dict(fields))

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
            if not f.trigger.by_progress:
                self.fired.add(i)
                self.w.clock.after(float(f.trigger.value), self.inject, i, f, {})

    def _t_s(self) -> float:
        return (self.w.clock.now_ns - (self.t0_ns or 0)) / 1e9

    def inject(self, i: int, f: Fault, progress: dict[str, Any]) -> None:
        assert self.log is not None and self.scenario is not None
        result: dict[str, Any] = {}
        if f.kind in ("site_crash", "site_restart"):
            site = self.w.sites[f.target]
            result = {"process": f.target, "pid": site.pid, "signal": "SIGKILL", "exited": True}
            site.kill()
        self.status[i] = "injected"
        heal = f.duration_s if f.kind == "site_crash" else (0.0 if f.kind == "site_restart" else None)
        self.log.emit("fault_injected", scenario=self.scenario.name, fault=i, kind=f.kind, target=f.target,
                      params=dict(f.params), heal_at={"after_s": heal} if heal is not None else None, note=f.note,
                      noop=f.kind == "noop", result=result, t_s=self._t_s(),
                      progress={"useful_tokens": progress.get("useful_tokens"), "step": progress.get("step")},
                      trigger=f.trigger.to_dict())
        restart = f.kind == "site_restart" or (f.kind == "site_crash" and bool(f.params.get("restart", True)))
        if heal is not None and restart:
            self.w.clock.after(heal, self.heal, i, f)

    def heal(self, i: int, f: Fault) -> None:
        assert self.log is not None and self.scenario is not None
        site = self.w.sites[f.target]
        site.start(self.w.model.restart_s)
        self.status[i] = "healed"
        self.log.emit("fault_healed", scenario=self.scenario.name, fault=i, kind=f.kind, target=f.target,
                      result={"process": f.target, "restarted": True}, reason="duration", t_s=self._t_s())

    def finish(self) -> None:
        if self.scenario is None or self.log is None:
            return
        never = [i for i in range(len(self.scenario.faults)) if i not in self.status]
        self.log.emit("scenario_finished", scenario=self.scenario.name, started=self.t0_ns is not None,
                      t_s=self._t_s(), statuses={str(k): v for k, v in self.status.items()}, never_fired=never,
                      failed=[], taken_down=[])
