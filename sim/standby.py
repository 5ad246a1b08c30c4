"""The launcher's warm standby (`recovery.warm_standby`, cluster/launcher.py) on the virtual clock.

The emulator's launcher keeps at most one prepared site process. It starts the first one with the
run; a chaos restart of a site is handed to it (the standby finishes preparing if it has not, then
joins as that site), and the next one starts `STANDBY_NEXT_AFTER_S` later. A restart that finds
no standby (the next one is not started yet) starts cold, and the launcher starts a replacement at
once. Only chaos restarts use it, and only a single-process site can be one.

Times (sim/model.py): a standby prepares in `standby_prepare_s` from its start; a restart handed
to a prepared standby joins `standby_restart_s` after it (the name on stdin, then the join), one
handed to a standby still preparing joins that much after its preparation ends; a cold restart
joins `restart_s` after it, as without a standby.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.config import STANDBY_NEXT_AFTER_S, RunConfig
from sim.engine import ns
from sim.model import SimModel


@dataclass
class StandbyPool:
    """When the one standby process started (None: there is none now) and when the next is due."""

    enabled: bool
    started_ns: int | None = None
    due_ns: int | None = None

    @staticmethod
    def for_run(cfg: RunConfig, has_scenario: bool) -> "StandbyPool":
        on = bool(cfg.recovery.warm_standby and has_scenario and cfg.train.workers_per_site == 1)
        return StandbyPool(enabled=on, started_ns=0 if on else None)

    def restart(self, now_ns: int, model: SimModel) -> tuple[float, bool]:
        """A chaos restart at `now_ns`: (seconds until the restarted site joins, whether a standby took it)."""
        if not self.enabled:
            return model.restart_s, False
        if self.started_ns is None and self.due_ns is not None and now_ns >= self.due_ns:
            self.started_ns, self.due_ns = self.due_ns, None  # the launcher's watch loop started it then
        if self.started_ns is None:
            self.started_ns = now_ns  # the launcher replaces the missing one at once; this restart starts cold
            return model.restart_s, False
        ready_ns = self.started_ns + ns(model.standby_prepare_s)
        delay_s = max(0, ready_ns - now_ns) / 1e9 + model.standby_restart_s
        self.started_ns, self.due_ns = None, now_ns + ns(STANDBY_NEXT_AFTER_S)
        return delay_s, True
