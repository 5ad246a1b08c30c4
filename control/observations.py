"""What one finished communication cycle measured: the controller's only input.

A communication cycle is one round: H inner steps of compute, then the collective. Each member
reports, with its `round_done`, what it measured itself (`SiteCycle`): the compute time and how
many inner steps it took, the collective's wall time and the bytes it sent, its mean train loss,
and the norm of its pseudo-gradient and its dot product with the cluster mean (which every member
holds after the collective, so the disagreement costs no extra traffic). The coordinator joins the
members' reports of a committed round into one `Observation` and logs it (`cycle_observed`).

Goodput is the collective's own: bytes a member sent in the round over the time its collective
took. A member's collective time also holds its wait for peers still computing (a straggler, or
CPU contention on a shared machine), which is no property of the link; so the observation takes
the collective time of the member that finished computing LAST (it waits for nobody's compute)
as the round's communication time, and reports the others' extra wait as `straggler_wait_s`.
Nothing here comes from the configured toxics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from itertools import repeat
from operator import is_
from typing import Any, Mapping


@dataclass(frozen=True)
class SiteCycle:
    """One member's measurements of one round (sent in its round_done, field `cycle`)."""

    compute_s: float  # wall seconds of the round's compute span
    inner_steps: int  # inner steps it took (1 in sync mode)
    comm_s: float  # wall seconds of the collective (send + wait for every peer)
    payload_bytes: int  # collective payload bytes this site sent
    loss: float | None  # mean train loss over the round's inner steps
    update_norm: float  # L2 norm of this site's contribution (pseudo-gradient or gradient)
    update_dot_mean: float  # dot product of its contribution with the cluster mean
    mean_norm: float  # L2 norm of the cluster mean (the same at every member)
    stalls: int = 0  # parts rejected or retransmitted while waiting (the collective's own count)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SiteCycle:
        def num(k: str, lo: float = 0.0) -> float:
            v = d.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise ValueError(f"cycle field {k!r} = {v!r} is not a finite number >= {lo}")
            return float(v)

        loss = d.get("loss")
        if loss is not None:
            loss = num("loss")
        steps = d.get("inner_steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"cycle field 'inner_steps' = {steps!r} is not a count")
        stalls = d.get("stalls", 0)
        if isinstance(stalls, bool) or not isinstance(stalls, int) or stalls < 0:
            raise ValueError(f"cycle field 'stalls' = {stalls!r} is not a count")
        return SiteCycle(compute_s=num("compute_s"), inner_steps=steps, comm_s=num("comm_s"),
                         payload_bytes=int(num("payload_bytes")), loss=loss, update_norm=num("update_norm"),
                         update_dot_mean=num("update_dot_mean", lo=-math.inf), mean_norm=num("mean_norm"),
                         stalls=stalls)


@dataclass(frozen=True)
class Observation:
    """One committed round, as the controller sees it (units in the names)."""

    round: int
    epoch: int
    setting: str  # the setting's label the round was trained in
    inner_steps_h: int
    n_members: int
    members_changed: bool  # the round's members differ from the previous observed round's
    t_step_s: float  # median over members of compute_s / inner_steps
    t_comm_s: float  # the collective's wall time at the member that finished computing last
    straggler_wait_s: float  # the longest extra wait of another member (peers' compute skew)
    payload_bytes: int  # per member (the median)
    goodput_bps: float  # that member's payload_bytes / t_comm_s (bytes per second)
    stalls: int
    loss: float | None  # mean over members
    cos_to_mean: float | None  # mean over members of cos(contribution, cluster mean); None: n < 2
    norm_ratio: float | None  # max / min member contribution norm
    # Inner steps since the members last agreed on the parameters: the local model a contribution
    # comes from is this many steps older than the last agreement (H; 1 in sync). Every commit is
    # an agreement here (no asynchronous or delayed outer steps), so the age is the setting's H.
    update_age_steps: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def observe(rnd: int, epoch: int, setting_label: str, h: int, cycles: Mapping[str, SiteCycle],
            prev_members: tuple[str, ...] | None) -> Observation:
    """Join the members' measurements of one committed round into one observation (pure)."""
    members = tuple(sorted(cycles))
    cs = [cycles[m] for m in members]
    if cs and all(map(is_, cs, repeat(cs[0], len(cs)))):
        # Every member's the same record (the simulator's members of a plain round share one): the
        # same lists, made by repetition (a round of 1,000 members, once per commit).
        c, n = cs[0], len(cs)
        steps = [c.compute_s / c.inner_steps] * n if c.inner_steps > 0 else []
        last: SiteCycle | None = c
        losses = [c.loss] * n if c.loss is not None else []
        cos = [c.update_dot_mean / (c.update_norm * c.mean_norm)] * n if c.update_norm > 0 and c.mean_norm > 0 else []
        norms = [c.update_norm] * n if c.update_norm > 0 else []
        comms, payloads, stalls = [c.comm_s] * n, [float(c.payload_bytes)] * n, [c.stalls] * n
    else:
        steps = [c.compute_s / c.inner_steps for c in cs if c.inner_steps > 0]
        last = max(cs, key=lambda c: c.compute_s) if cs else None  # waited for nobody's compute
        losses = [c.loss for c in cs if c.loss is not None]
        cos = [c.update_dot_mean / (c.update_norm * c.mean_norm) for c in cs if c.update_norm > 0 and c.mean_norm > 0]
        norms = [c.update_norm for c in cs if c.update_norm > 0]
        comms, payloads, stalls = [c.comm_s for c in cs], [float(c.payload_bytes) for c in cs], [c.stalls for c in cs]
    return Observation(
        round=rnd, epoch=epoch, setting=setting_label, inner_steps_h=h, n_members=len(members),
        members_changed=prev_members is not None and prev_members != members,
        t_step_s=_median(steps) if steps else 0.0, t_comm_s=last.comm_s if last else 0.0,
        straggler_wait_s=max(comms) - last.comm_s if last else 0.0,
        payload_bytes=int(_median(payloads)) if cs else 0,
        goodput_bps=last.payload_bytes / last.comm_s if last and last.comm_s > 0 else 0.0,
        stalls=sum(stalls),
        loss=sum(losses) / len(losses) if losses else None,
        cos_to_mean=sum(cos) / len(cos) if len(cos) >= 2 else None,
        norm_ratio=max(norms) / min(norms) if len(norms) >= 2 else None,
        update_age_steps=h)
