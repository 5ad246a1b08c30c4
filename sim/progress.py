"""Carried rounds on the virtual clock: the inner steps a simulated site took in the round in flight
(`Progress`, the agent's site_agent/carry.py RoundProgress) and what a carried epoch keeps of them.

When a failure's survivors take the round in flight over (`Plan.carry`), a survivor keeps the
leading steps the new layout (ground.schedule.carried_steps) asks of it unchanged, logs them as
`work_carried`, and computes only the rest: all its matching steps when it took no others, else as
many as its mid-round copy holds (ground.schedule.kept_steps). One difference in time, not in work:
the agent notices a new epoch between inner steps, the simulated site at once, counting the step it
had begun as taken (it was attempted either way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ground.plans import EpochPlan
from ground.schedule import kept_steps, round_span, site_round_layout, steps_to_keep
from site_core.adoption import may_carry

if TYPE_CHECKING:
    from sim.site import SimSite
    from sim.world import World

Step = tuple[range, int]  # one inner step: (sample positions, lr frontier in samples) (site_agent/carry.py)


@dataclass(slots=True)
class Progress:
    """The inner steps a site took in the round in flight (site_agent.carry.RoundProgress). Slots: one
    is made per member and round (a million an hour at 1,000 sites), and slots make that cheaper."""

    round: int
    cursor: int
    steps_h: int
    # ground.schedule.kept_steps' arguments: the step before which the agent takes its mid-round
    # copy (`keep`), worked out only if a carried epoch asks (None: no copy).
    keep_of: tuple[Any, ...] | None
    done: list[Step] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)  # the epoch each step was taken in
    # Steps taken after `done` and not made yet: (a whole round's site_round_layout arguments, first
    # step, end, epoch). A run without logs takes whole rounds this way (`Rounds.work`): the steps are
    # made only if a carried epoch asks for them (`taken`), which few rounds see.
    lazy: tuple[tuple[Any, ...], int, int, int] | None = None

    def taken(self) -> tuple[list[Step], list[int]]:
        """(done, epochs): every step taken so far, made if it was recorded lazily."""
        if self.lazy is not None:
            spec, lo, hi, epoch = self.lazy
            self.lazy = None
            self.done += site_round_layout(*spec)[lo:hi]
            self.epochs += [epoch] * (hi - lo)
        return self.done, self.epochs

    def keep(self) -> int:
        """The step before which the agent takes its mid-round copy (0: none)."""
        return kept_steps(*self.keep_of) if self.keep_of is not None else 0


def new_progress(rnd: int, cursor: int, steps_h: int, keep_of: tuple[Any, ...] | None) -> Progress:
    """Progress(rnd, cursor, steps_h, keep_of), nothing taken yet, its slots filled by hand: one per
    member and round (a million an hour at 1,000 sites), where the generated __init__ with its default
    factories costs twice as much (tests/unit/test_sim.py checks that the two are equal)."""
    p = _NEW(Progress)
    p.round, p.cursor, p.steps_h, p.keep_of, p.done, p.epochs, p.lazy = rnd, cursor, steps_h, keep_of, [], [], None
    return p


_NEW = object.__new__


def carry_over(w: World, s: SimSite, plan: EpochPlan, sp: dict[str, Any],
               layout: Callable[..., list[Step]]) -> bool:
    """Keep the inner steps already taken in the round a carried epoch takes over (site_agent/carry.py's
    rule, by the same site_core.adoption.may_carry and ground.schedule.steps_to_keep): True if some
    were kept; they are logged as `work_carried` in the new epoch. `layout`: sim/rounds.py
    `Rounds.layout`, the site's steps of a round."""
    prog = s.progress
    cfg = w.effective(s.setting)
    held = (prog.round, prog.cursor, "local", prog.steps_h) if prog is not None else None  # (local rounds only)
    if not may_carry(plan, s.next_round, held, cfg.train.mode, cfg.train.inner_steps_h)[0]:
        return False
    assert prog is not None
    n = len(plan.members)
    cs, ce = round_span(cfg, n, plan.start_round, plan.start_cursor, plan.start_round, w.target)
    wanted = layout(s, cfg, plan.start_round, n, cs, ce, prog.steps_h)
    done, epochs = prog.taken()
    k, from_copy = steps_to_keep(done, wanted, prog.keep())
    if k == 0:
        return False
    dropped = len(done) - k
    seq = w.cfg.model.seq_len
    for h in range(k):
        ids = list(done[h][0])
        s.log.emit("work_carried", round=prog.round, inner_step=h, from_epoch=epochs[h], samples=ids,
                   tokens=len(ids) * seq)
    del done[k:], epochs[k:]
    s.resume = (prog.round, k)
    sp.update(rolled_back=False, carried_steps=k, from_mid_copy=from_copy, dropped_steps=dropped)
    return True


def carried(s: SimSite, rnd: int) -> bool:
    """Whether round `rnd` follows the carried layout (the first round of a carried epoch)."""
    return bool(s.plan is not None and s.plan.carry and rnd == s.plan.start_round)


def take_whole(s: SimSite, rnd: int, layout: tuple[Any, ...], lo: int, hi: int) -> None:
    """Record the inner steps lo..hi-1 of a whole round (`layout`: its site_round_layout arguments)
    as taken, unmade (Progress.lazy)."""
    prog = s.progress
    if prog is not None and prog.round == rnd:
        prog.taken()  # (nothing is pending in a round taken whole; kept in order if it were)
        prog.lazy = (layout, lo, hi, s.epoch)
