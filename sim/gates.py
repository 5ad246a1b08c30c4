"""Fault gates on the virtual clock (ground/gates.py): a round whose samples reach a gate's tokens is
followed by a wait, before the next round, until the chaos part releases the gate (sim/faults.py
releases it once the fault's action is done); a newer epoch or a SIGTERM ends the wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ground.gates import crossed
from site_core.epochs import interrupts

if TYPE_CHECKING:
    from sim.site import SimSite
    from sim.world import World


class GateWaits:
    """The gates' tokens, those released, and who waits at each. `go_on(site, round)` starts a site's
    next round once it may (sim/rounds.py `Rounds.start`)."""

    def __init__(self, w: World, go_on: Callable[[SimSite, int], None]) -> None:
        self.w = w
        self.go_on = go_on
        self.tokens: tuple[int, ...] = tuple(w.cfg.recovery.fault_gates)
        self.released: set[int] = set()
        # gate -> [(site, its generation, round, cursor start, end, the gates after this one, since ns)]
        self.gated: dict[int, list[tuple[Any, ...]]] = {}

    def wait(self, s: SimSite, rnd: int, cs: int, ce: int, todo: list[int] | None = None) -> bool:
        """Round `rnd` reached fault gates (ground/gates.py): wait at each not yet released
        until the chaos part releases it (`release`), before the next round's first
        step. True while the site waits; `todo`: the gates left after one was released."""
        w = self.w
        if todo is None:
            seq = w.cfg.model.seq_len
            todo = crossed(self.tokens, cs * seq, ce * seq)
        for i, g in enumerate(todo):
            if g in self.released:
                outcome = "open"
            elif s.pending and interrupts(s.pending, s.epoch, rnd + 1):
                outcome = "left"  # a newer epoch already waits (the oracle's drain): the next round's start acts on it
            else:
                s.busy, s.inflight = True, rnd + 1  # a newer epoch or a SIGTERM ends the wait (SimSite.on_control)
                self.gated.setdefault(g, []).append((s, s.gen, rnd, cs, ce, todo[i + 1:], w.clock.now_ns))
                return True
            if w.write_logs:
                s.log.emit("fault_gate", round=rnd, gate_tokens=g, outcome=outcome, waited_s=0.0)
        return False

    def leave(self, s: SimSite, go_on: bool = True) -> None:
        """A newer epoch (or a SIGTERM: `go_on` False, the site's own code acts on it) arrived while the
        site waits at a fault gate: it leaves the wait (and every gate after it) and its
        next round's start acts on the epoch."""
        w = self.w
        for g, waiting in list(self.gated.items()):
            for e in waiting:
                if e[0] is s and e[1] == s.gen:
                    waiting.remove(e)
                    _s, _gen, rnd, _cs, _ce, rest, t0 = e
                    if w.write_logs:
                        for h in (g, *rest):
                            s.log.emit("fault_gate", round=rnd, gate_tokens=h, outcome="left",
                                       waited_s=round((w.clock.now_ns - t0) / 1e9, 6) if h == g else 0.0)
                    if go_on:
                        self.go_on(s, rnd + 1)
                    return

    def waiting(self, s: SimSite) -> bool:
        """The site (this incarnation, this generation) waits at a fault gate now."""
        return any(e[0] is s and e[1] == s.gen for waiting in self.gated.values() for e in waiting)

    def release(self, g: int) -> None:
        """The driver injected every fault at gate `g`: the sites waiting there go on (a site killed,
        preempted or moved to a newer epoch meanwhile is no longer waiting: its generation moved on)."""
        w = self.w
        self.released.add(g)
        for s, gen, rnd, cs, ce, rest, t0 in self.gated.pop(g, []):
            if gen != s.gen or not s.alive:
                continue
            if w.write_logs:
                s.log.emit("fault_gate", round=rnd, gate_tokens=g, outcome="released",
                           waited_s=round((w.clock.now_ns - t0) / 1e9, 6))
            if not self.wait(s, rnd, cs, ce, rest):
                self.go_on(s, rnd + 1)
