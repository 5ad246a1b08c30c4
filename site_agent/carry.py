"""Keeping the inner steps of an interrupted round: what a survivor carries into the next epoch.

When a member fails mid-round, elastic's survivors take the same round over as a smaller group
(`Plan.carry`, `ground.schedule.carried_steps`): the new layout asks each survivor first for the
very steps it was taking (same samples, same lr frontier, from the same round-start state). So
the steps a survivor already took are still valid, and it resumes after them instead of rolling
back to the round's start and redoing them. Nothing is assumed: a step is kept only if the new
layout asks for exactly the (samples, frontier) it was taken with, in order, in the same mode
and H; otherwise the site rolls back as before.

`RoundProgress` is the record of the round in flight (kept by `site_agent.rounds`): the (sample
ids, frontier) of every inner step taken, their losses and epochs, and one copy of the trainer's
mid-round state taken before the first step a single failure would not keep
(`ground.schedule.kept_steps`), so a survivor that ran past what it keeps can go back to it.
`MidState` is that copy: the local parameters and the inner AdamW state (the outer state does not
change within a round). Each copy costs one clone of 3 x P floats (P = 0.84M: about 10 MB, a
few ms), once per round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ground.schedule import steps_to_keep


@dataclass
class MidState:
    """The trainer's local parameters and inner AdamW state after `steps` inner steps of a round."""

    steps: int
    params: list[torch.Tensor]
    inner: list[dict[str, Any]]  # per parameter, in model.parameters() order
    inner_steps: int  # the trainer's counter

    @staticmethod
    def take(trainer: Any, steps: int) -> MidState:
        ps = list(trainer.model.parameters())
        inner = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in trainer.inner_opt.state.get(p, {}).items()}
                 for p in ps]
        return MidState(steps, [p.detach().clone() for p in ps], inner, trainer.inner_steps)

    def restore(self, trainer: Any) -> None:
        ps = list(trainer.model.parameters())
        with torch.no_grad():
            for p, saved in zip(ps, self.params):
                p.copy_(saved)
        trainer.inner_opt.state.clear()
        for p, st in zip(ps, self.inner):
            if st:
                trainer.inner_opt.state[p] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
        trainer.inner_steps = self.inner_steps


@dataclass
class RoundProgress:
    """The inner steps taken so far in the round in flight (`round`, starting at sample `cursor`)."""

    round: int
    cursor: int
    mode: str
    steps_h: int
    done: list[tuple[tuple[int, ...], int]] = field(default_factory=list)  # (sample ids, frontier tokens)
    losses: list[float | None] = field(default_factory=list)  # None: an empty step (a cut last round)
    epochs: list[int] = field(default_factory=list)  # the epoch each step was taken in
    mid: MidState | None = None


@dataclass(frozen=True)
class Resume:
    """Where the first round of a carried epoch resumes: after `steps` steps already taken."""

    round: int
    steps: int
    ids: list[int]
    losses: list[float]


def reusable_steps(progress: RoundProgress, wanted: list[tuple[tuple[int, ...], int]]) -> tuple[int, bool]:
    """(steps to keep, whether that needs the mid-round copy): ground.schedule.steps_to_keep on what
    this trainer took and the mid-round copy it holds."""
    return steps_to_keep(progress.done, wanted, progress.mid.steps if progress.mid is not None else None)
