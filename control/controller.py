"""The adaptive controller: a pure function from measured observations to a setting decision.

    decide(observations, current setting, n_members, config) -> Decision(action, setting, reason, evidence)

action is `change` (the new setting takes effect at the next round boundary, as a new epoch),
`keep`, or `abstain` (keep, because the evidence cannot support a decision; the reason says why).

Time model (DiLoCo's; docs/consistency.md). One round of setting
(H, compression c) costs
    T_inner(H) = H x t_step                         compute, measured per inner step
    T_comm(c)  = payload(c) / B_eff                 the collective, paid once per round
where payload(c) = 2(n-1)/n x P x bytes_per_value(c) is what each member sends, and B_eff is the
collective's own achieved goodput (payload / its wall time, so the latency terms are inside it:
conservative for small payloads). H does not change the payload, so the fraction of a round spent
communicating is f(H, c) = T_comm(c) / (H x t_step). The controller picks the least compression,
then the smallest H (H = 1 is sync when allowed), with f <= comm_fraction_max: few syncs only
when the link forces them (fewer syncs cost learning per token; AdaComm, DeCo-SGD).

Hysteresis (no flapping), in level and in time: when the current setting's fraction (at the
window's median goodput) exceeds comm_fraction_max it moves to the preferred setting predicted to
fit; it moves back down only once the current fraction at the window's SLOWEST cycle falls under
comm_fraction_shrink (< comm_fraction_max), to the preferred setting that fits even at that
slowest cycle. Between the thresholds it keeps the setting. And it never returns to a setting the
run left within reverse_guard_cycles cycles, so a noisy estimate cannot make it oscillate.
Disagreement: when the members' contributions disagree (mean cosine to the cluster mean below
disagreement_cos_min) and the link allows it (f <= comm_fraction_max), it steps one H down.

Abstention: fewer than min_cycles observations in the current setting (also the cooldown after a
change); a membership change inside the window; any stall in the window; goodput varying by more
than max_goodput_cv (coefficient of variation): the link is in flux.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from control.observations import Observation
from ground.setting import ConsistencySetting
from ground.config import AdaptiveConfig

BYTES_PER_VALUE = {"none": 4, "fp16": 2, "int8": 1}
COMPRESSION_ORDER = ("none", "fp16", "int8")


@dataclass(frozen=True)
class Decision:
    action: Literal["change", "keep", "abstain"]
    setting: ConsistencySetting  # what the next rounds train in (the current one unless action = change)
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def setting_of(h: int, compression: str = "none") -> ConsistencySetting:
    """The setting of H inner steps per round (H = 1 is sync)."""
    return ConsistencySetting("sync", 1, compression) if h == 1 else ConsistencySetting("local", h, compression)


def _candidates(cfg: AdaptiveConfig) -> list[ConsistencySetting]:
    """Allowed settings in order of preference: least compression first, then smallest H."""
    comps = COMPRESSION_ORDER[:COMPRESSION_ORDER.index(cfg.compression_when_h_max) + 1]
    return [setting_of(h, c) for c in comps for h in sorted(set(cfg.h_choices)) if h != 1 or cfg.allow_sync]


def payload_for(s: ConsistencySetting, payload_now_b: float, comp_now: str) -> float:
    """What a member would send per round in setting s, from what it sends now under compression `comp_now`."""
    return payload_now_b * BYTES_PER_VALUE[s.compression] / BYTES_PER_VALUE[comp_now]


def window_in_setting(observations: Sequence[Observation], current: ConsistencySetting,
                      n: int) -> tuple[list[Observation], int]:
    """The newest `n` of the latest run of cycles trained in `current` (oldest first), and that run's length."""
    mine: list[Observation] = []
    for o in reversed(observations):
        if o.setting != current.label():
            break
        mine.append(o)
    return list(reversed(mine[:n])), len(mine)


def _rank(s: ConsistencySetting) -> tuple[int, int]:
    return COMPRESSION_ORDER.index(s.compression), s.steps_per_round


def comm_fraction(s: ConsistencySetting, t_step_s: float, payload_now_b: float, comp_now: str,
                  goodput_bps: float) -> float:
    """Predicted fraction T_comm / T_inner of setting s, from what the current setting measured."""
    return (payload_for(s, payload_now_b, comp_now) / goodput_bps) / (s.steps_per_round * t_step_s)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _recently_left(observations: Sequence[Observation], current: ConsistencySetting, cycles: int) -> dict[str, int]:
    """Settings (labels) the run trained in within the last `cycles` observations, other than the
    current one, with how many cycles ago each was last seen."""
    out: dict[str, int] = {}
    for age, o in enumerate(reversed(observations[-cycles:] if cycles > 0 else []), start=1):
        if o.setting != current.label() and o.setting not in out:
            out[o.setting] = age
    return out


def _unusable_window(window: list[Observation], current: ConsistencySetting, cfg: AdaptiveConfig,
                     ev: dict[str, Any]) -> str | None:
    """Why the window cannot support a decision (abstain), or None. Adds the stall count to `ev`."""
    if len(window) < cfg.min_cycles:
        return f"too few samples: {len(window)} cycle(s) in {current.label()}, need {cfg.min_cycles}"
    if any(o.members_changed for o in window) or len({o.n_members for o in window}) > 1:
        return "membership changing inside the window"
    stalls = sum(o.stalls for o in window)
    if stalls:
        ev["stalls"] = stalls
        return f"link in flux: {stalls} stall/timeout event(s) in the window"
    if min(o.goodput_bps for o in window) <= 0 or min(o.t_step_s for o in window) <= 0:
        return "no goodput or compute time measured in the window"
    return None


def _keep_reason(now: float, current: ConsistencySetting, cfg: AdaptiveConfig) -> str:
    """Why the current setting is kept when no move is called for (`now`: its communication fraction)."""
    if now > cfg.comm_fraction_max:
        return (f"communication {now:.0%} of compute > {cfg.comm_fraction_max:.0%}, "
                f"but {current.label()} is the cheapest allowed setting")
    if now < cfg.comm_fraction_shrink:
        return (f"communication {now:.0%} of compute, but no smaller H or lighter "
                f"compression fits under {cfg.comm_fraction_max:.0%} at the window's slowest cycle")
    return (f"communication {now:.0%} of compute is within "
            f"[{cfg.comm_fraction_shrink:.0%}, {cfg.comm_fraction_max:.0%}]")


def decide(observations: Sequence[Observation], current: ConsistencySetting, cfg: AdaptiveConfig) -> Decision:
    """One decision after a finished communication cycle (the newest observation is the last)."""
    window, n_mine = window_in_setting(observations, current, cfg.window_cycles)
    ev: dict[str, Any] = {"cycles_in_setting": n_mine, "window_rounds": [o.round for o in window]}
    why = _unusable_window(window, current, cfg, ev)
    if why is not None:
        return Decision("abstain", current, why, ev)
    gp = [o.goodput_bps for o in window]
    steps = [o.t_step_s for o in window]
    mean_gp = sum(gp) / len(gp)
    cv = math.sqrt(sum((g - mean_gp) ** 2 for g in gp) / len(gp)) / mean_gp
    ev.update(goodput_bps=round(mean_gp, 1), goodput_cv=round(cv, 3))
    t_step = _median(steps)
    payload = _median([float(o.payload_bytes) for o in window])
    # Robust estimates: the median goodput decides a move up (one slow cycle is not a collapse);
    # a move down is judged on the window's SLOWEST cycle (it must fit even then).
    med_gp, worst_gp, best_gp = _median(gp), min(gp), max(gp)
    frac = lambda s, g=med_gp: comm_fraction(s, t_step, payload, current.compression, g)  # noqa: E731
    now, now_worst, now_best = frac(current), frac(current, worst_gp), frac(current, best_gp)
    ev.update(t_step_s=round(t_step, 4), payload_bytes=int(payload), comm_fraction=round(now, 3),
              comm_fraction_worst=round(now_worst, 3), comm_fraction_best=round(now_best, 3),
              t_comm_s=round(payload / med_gp, 4), t_inner_s=round(current.steps_per_round * t_step, 4))
    # A varying link is evidence enough when every cycle of the window points the same way (even
    # the fastest is comm-bound, or even the slowest is well under): the variance does not change
    # the decision then. Otherwise the decision hinges on which cycle is representative: abstain.
    clear = now_best > cfg.comm_fraction_max or now_worst < cfg.comm_fraction_shrink
    if cv > cfg.max_goodput_cv and not clear:
        return Decision("abstain", current, f"link in flux: goodput varies by {cv:.2f} (> {cfg.max_goodput_cv}) "
                                            f"and the window's cycles disagree on the decision", ev)
    cands = _candidates(cfg)
    fits = [s for s in cands if frac(s) <= cfg.comm_fraction_max]
    best = fits[0] if fits else cands[-1]  # nothing fits: the cheapest communication there is
    ev["predicted_fraction"] = round(frac(best), 3)
    left = _recently_left(observations, current, cfg.reverse_guard_cycles)
    if _rank(best) > _rank(current):
        if best.label() in left:
            return Decision("keep", current, f"hysteresis: {best.label()} was left {left[best.label()]} cycle(s) ago "
                                             f"(guard {cfg.reverse_guard_cycles}); communication {now:.0%}", ev)
        return Decision("change", best, f"communication {now:.0%} of compute > {cfg.comm_fraction_max:.0%}: "
                                        f"{best.label()} predicts {frac(best):.0%}", ev)
    down = [s for s in cands if frac(s, worst_gp) <= cfg.comm_fraction_max]
    if now_worst < cfg.comm_fraction_shrink and down and _rank(down[0]) < _rank(current):
        target = down[0]
        ev["predicted_fraction"] = round(frac(target, worst_gp), 3)
        if target.label() in left:
            return Decision("keep", current, f"hysteresis: {target.label()} was left {left[target.label()]} "
                                             f"cycle(s) ago (guard {cfg.reverse_guard_cycles})", ev)
        return Decision("change", target, f"link recovered: communication {now_worst:.0%} of compute (slowest "
                                          f"cycle) < {cfg.comm_fraction_shrink:.0%}; {target.label()} predicts "
                                          f"{frac(target, worst_gp):.0%}", ev)
    cos = [o.cos_to_mean for o in window if o.cos_to_mean is not None]
    if cos:
        ev["cos_to_mean"] = round(sum(cos) / len(cos), 3)
        smaller = [s for s in fits if _rank(s) < _rank(current)]
        if ev["cos_to_mean"] < cfg.disagreement_cos_min and smaller:
            step_down = smaller[-1]  # the nearest smaller setting that the link allows
            ev["predicted_fraction"] = round(frac(step_down), 3)
            return Decision("change", step_down, f"sites disagree (cos {ev['cos_to_mean']:.2f} < "
                                                 f"{cfg.disagreement_cos_min}); the link allows {step_down.label()}",
                            ev)
    return Decision("keep", current, _keep_reason(now, current, cfg), ev)
