"""Controller v2 (`adaptive.rule = progress_rate`): pick the setting with the most learning per second.

    decide_after_cycle(observations, current, cfg) -> Decision      after each committed round
    decide_in_cycle(observations, current, elapsed_ns, cfg) -> Decision | None
                                                                     while a round is in flight

Learning per second of a setting s = (H, c) is predicted as
    rate(s) = rho(s) x tokens per second(s),    tokens per second(s) ~ H / (H x t_step + T_comm(c))
(members, batch and sequence length are the same in every setting, so they cancel in a comparison).
`t_step` and the collective's goodput are measured (the window's cycles in the current setting;
control/observations.py); T_comm(c) = payload(c) / goodput. `rho(s)` is learning per token relative
to a token of sync training, a prior of the recipe: rho = H ** -token_efficiency_exponent x the
compression's factor (config `AdaptiveConfig`, with where each number was measured). With rho = 1
for every H the rule would always choose the largest H (fewest syncs); with the exponent > 0 a
smaller H wins whenever the link is fast enough to pay for its syncs, which is what fixed H = 8
showed against H = 32 in controller-heldout v5.

Evidence and noise. The rate of every allowed setting is predicted at the window's median goodput,
and again at its slowest and its fastest cycle. A change needs the best setting at the median to
beat the current one by `min_gain` (hysteresis in level), and to beat it at the slowest and the
fastest cycle too; when those disagree the evidence is inside the link's own noise: abstain. A
change resets the count of cycles in the setting (`min_cycles_progress` before the next decision).

Inside a cycle. The round in flight is compared with its prediction (H x t_step + T_comm from the
newest observations, whatever setting they were in, scaled to the current one): once it has run
`overrun_factor` times as long as predicted, and at least `min_overrun_s` longer, its collective
has been running for at least elapsed - H x t_step, so the link's goodput is at most
payload / that. Evidence that far beyond the noise is acted on at once: the best setting at that
goodput bound is announced for the boundary after the round in flight (not three cycles later).
A slow compute (a straggler) looks the same from the coordinator; the next finished cycle measures
compute and link apart, and the after-cycle rule moves back if the link was not the cause.

The train loss of a round and its drop per second are reported in the evidence, not used: a
round's loss at its own H is not comparable across settings while the model is still learning
fast (a later round always has a lower loss), so it cannot rank settings without a model of the
curve. A learning floor (`learning_reference_h`, `max_token_efficiency_loss`) restricts the choice to
settings that learn at least about as much per token as a reference setting: then the controller
saves time and bytes (compression, fewer syncs where they cost nothing per token) without trading
learning per token for speed. The rule predicts every setting from the current one's measurements
instead of trying them, so it never pays for exploration. The members' agreement is used: when their contributions disagree (cos to the mean under
`disagreement_cos_min`) no larger H is chosen after a cycle (more local steps would drift further).
"""

from __future__ import annotations

from typing import Any, Sequence

from control.controller import Decision, _candidates, _median, payload_for, setting_of, window_in_setting
from control.observations import Observation
from ground.config import AdaptiveConfig
from ground.setting import ConsistencySetting


def token_efficiency(s: ConsistencySetting, cfg: AdaptiveConfig) -> float:
    """rho(s): the prior learning per token of setting s, relative to sync (H = 1, no compression)."""
    comp = {"none": 1.0, "fp16": cfg.fp16_token_efficiency, "int8": cfg.int8_token_efficiency}[s.compression]
    return float(s.steps_per_round) ** -cfg.token_efficiency_exponent * comp


def round_time_s(s: ConsistencySetting, t_step_s: float, payload_now_b: float, comp_now: str, goodput_bps: float) -> float:
    """Predicted wall seconds of one round of s: H inner steps, then the collective at `goodput_bps`."""
    return s.steps_per_round * t_step_s + payload_for(s, payload_now_b, comp_now) / goodput_bps


def progress_rate(s: ConsistencySetting, t_step_s: float, payload_now_b: float, comp_now: str, goodput_bps: float,
                  cfg: AdaptiveConfig) -> float:
    """Predicted learning per second of s, in sync-token equivalents per inner-step-sample-second
    (a relative unit: only ratios between settings are used)."""
    return token_efficiency(s, cfg) * s.steps_per_round / round_time_s(s, t_step_s, payload_now_b, comp_now, goodput_bps)


def admissible(cfg: AdaptiveConfig) -> list[ConsistencySetting]:
    """The allowed settings (control.controller's order of preference) that keep the learning floor:
    prior learning per token at least (1 - max_token_efficiency_loss) x that of the reference setting."""
    cands = _candidates(cfg)
    if cfg.learning_reference_h <= 0:
        return cands
    floor = (1.0 - cfg.max_token_efficiency_loss) * token_efficiency(setting_of(cfg.learning_reference_h), cfg)
    return [s for s in cands if token_efficiency(s, cfg) >= floor * (1 - 1e-12)]


def _loss_evidence(window: list[Observation], ev: dict[str, Any]) -> None:
    """The window's train-loss drop per round and per second (reported, not used: see the docstring)."""
    losses = [o.loss for o in window if o.loss is not None]
    if len(losses) >= 2:
        secs = sum(o.inner_steps_h * o.t_step_s + o.t_comm_s for o in window[1:])
        ev["loss_drop_per_round"] = round((losses[0] - losses[-1]) / (len(losses) - 1), 5)
        if secs > 0:
            ev["loss_drop_per_s"] = round((losses[0] - losses[-1]) / secs, 5)


def decide_after_cycle(observations: Sequence[Observation], current: ConsistencySetting,
                       cfg: AdaptiveConfig) -> Decision:
    """One decision after a finished communication cycle (the newest observation is the last)."""
    window, n_mine = window_in_setting(observations, current, cfg.window_cycles)
    ev: dict[str, Any] = {"rule": "progress_rate", "cycles_in_setting": n_mine,
                          "window_rounds": [o.round for o in window]}
    if len(window) < cfg.min_cycles_progress:
        return Decision("abstain", current, f"too few samples: {len(window)} cycle(s) in {current.label()}, "
                                            f"need {cfg.min_cycles_progress}", ev)
    if any(o.members_changed for o in window) or len({o.n_members for o in window}) > 1:
        return Decision("abstain", current, "membership changing inside the window", ev)
    if min(o.goodput_bps for o in window) <= 0 or min(o.t_step_s for o in window) <= 0:
        return Decision("abstain", current, "no goodput or compute time measured in the window", ev)
    gp = [o.goodput_bps for o in window]
    t_step = _median([o.t_step_s for o in window])
    payload = _median([float(o.payload_bytes) for o in window])
    g_med, g_slow, g_fast = _median(gp), min(gp), max(gp)
    _loss_evidence(window, ev)

    def rate(s: ConsistencySetting, g: float = g_med) -> float:
        return progress_rate(s, t_step, payload, current.compression, g, cfg)

    cands = admissible(cfg)
    below_floor = current not in cands  # a start setting (or the first rule's) the floor does not allow
    cos = [o.cos_to_mean for o in window if o.cos_to_mean is not None]
    if cos:
        ev["cos_to_mean"] = round(sum(cos) / len(cos), 3)
        if ev["cos_to_mean"] < cfg.disagreement_cos_min:  # no more local drift than now
            cands = [s for s in cands if s.steps_per_round <= current.steps_per_round]
    if current not in cands and (not below_floor or not cands):
        cands.append(current)
    best = max(cands, key=rate)  # the first of the best: ties go to the preferred setting
    gain = rate(best) / rate(current) - 1.0
    ev.update(t_step_s=round(t_step, 4), payload_bytes=int(payload), goodput_bps=round(g_med, 1),
              goodput_slowest_bps=round(g_slow, 1), goodput_fastest_bps=round(g_fast, 1),
              round_s=round(round_time_s(current, t_step, payload, current.compression, g_med), 4),
              best=best.label(), predicted_gain=round(gain, 4),
              rates={s.label(): round(rate(s) / rate(current), 4) for s in cands})
    if below_floor and best != current:
        return Decision("change", best, f"{current.label()} learns less per token than the learning floor allows "
                                        f"({cfg.max_token_efficiency_loss:.0%} under H={cfg.learning_reference_h}): "
                                        f"{best.label()}, the best allowed, predicts {gain:+.0%} learning per second", ev)
    if best == current or gain < cfg.min_gain:
        why = (f"{current.label()} is predicted best ({rate(current):.4g} per s)" if best == current else
               f"{best.label()} predicts {gain:+.0%} learning per second, under the {cfg.min_gain:.0%} needed to move")
        return Decision("keep", current, why, ev)
    slow_gain, fast_gain = rate(best, g_slow) / rate(current, g_slow) - 1, rate(best, g_fast) / rate(current, g_fast) - 1
    ev.update(gain_at_slowest=round(slow_gain, 4), gain_at_fastest=round(fast_gain, 4))
    if slow_gain <= 0 or fast_gain <= 0:
        return Decision("abstain", current, f"inside the noise: {best.label()} predicts {gain:+.0%} at the median "
                                            f"goodput but {slow_gain:+.0%} at the slowest cycle and {fast_gain:+.0%} "
                                            f"at the fastest", ev)
    return Decision("change", best, f"{best.label()} predicts {gain:+.0%} learning per second over "
                                    f"{current.label()} (goodput {g_med / 1e6:.3g} MB/s, step {t_step * 1e3:.0f} ms)", ev)


def decide_in_cycle(observations: Sequence[Observation], current: ConsistencySetting, elapsed_ns: int,
                    cfg: AdaptiveConfig) -> Decision | None:
    """A change called for by the round in flight (running `elapsed_ns` nanoseconds), or None."""
    elapsed_s = elapsed_ns / 1e9
    recent = [o for o in observations[-cfg.window_cycles:] if o.goodput_bps > 0 and o.t_step_s > 0]
    if not recent:
        return None
    t_step = _median([o.t_step_s for o in recent])
    # Payload and goodput of the newest cycles, each scaled to the current setting's compression.
    pay_now = _median([payload_for(current, o.payload_bytes, ConsistencySetting.from_label(o.setting).compression)
                       for o in recent])
    predicted = _median([round_time_s(current, t_step, pay_now, current.compression, o.goodput_bps) for o in recent])
    if elapsed_s < cfg.overrun_factor * predicted or elapsed_s - predicted < cfg.min_overrun_s:
        return None
    comm_s = elapsed_s - current.steps_per_round * t_step
    if comm_s <= 0:
        return None
    g_bound = pay_now / comm_s  # the collective has not finished: the link's goodput is at most this

    def rate(s: ConsistencySetting) -> float:
        return progress_rate(s, t_step, pay_now, current.compression, g_bound, cfg)

    cands = admissible(cfg)
    best = max(cands + ([] if current in cands else [current]), key=rate)
    gain = rate(best) / rate(current) - 1.0
    if best == current or gain < cfg.min_gain:
        return None
    ev = {"rule": "progress_rate", "in_cycle": True, "elapsed_ns": elapsed_ns,
          "predicted_round_s": round(predicted, 4), "goodput_at_most_bps": round(g_bound, 1),
          "t_step_s": round(t_step, 4), "best": best.label(), "predicted_gain": round(gain, 4)}
    return Decision("change", best, f"round in flight for {elapsed_s:.1f} s, {elapsed_s / predicted:.0f}x its "
                                    f"predicted {predicted:.2f} s: goodput at most {g_bound / 1e6:.3g} MB/s; "
                                    f"{best.label()} predicts {gain:+.0%} learning per second", ev)
