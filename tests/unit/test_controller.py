"""The adaptive controller as a pure function, on synthetic observation sequences: it follows the
time model, keeps hysteresis (no flapping), steps down when sites disagree, and abstains when the
evidence is insufficient (too few cycles, membership change, stalls, a link in flux)."""

from __future__ import annotations

from dataclasses import replace

from control.controller import _candidates, comm_fraction, decide
from control.observations import Observation, SiteCycle, observe
from ground.setting import ConsistencySetting
from ground.config import AdaptiveConfig

CFG = AdaptiveConfig()  # comm <= 25 % of compute; shrink only under 10 %
P_BYTES = 2 * 2 / 3 * 850_000 * 4  # what each of 3 members sends per round, float32 (~4.5 MB)
T_STEP = 0.1  # seconds per inner step


def obs(rnd: int, s: ConsistencySetting, goodput_bps: float, *, n: int = 3, changed: bool = False, stalls: int = 0,
        cos: float | None = 0.8) -> Observation:
    payload = int(P_BYTES * {"none": 1, "fp16": 0.5, "int8": 0.25}[s.compression])
    return Observation(round=rnd, epoch=1, setting=s.label(), inner_steps_h=s.steps_per_round, n_members=n,
                       members_changed=changed, t_step_s=T_STEP, t_comm_s=payload / goodput_bps, straggler_wait_s=0.0,
                       payload_bytes=payload, goodput_bps=goodput_bps, stalls=stalls, loss=3.0, cos_to_mean=cos,
                       norm_ratio=1.1, update_age_steps=s.steps_per_round)


def run(seq: list[float], start: ConsistencySetting, **kw) -> list[tuple[str, ConsistencySetting]]:
    """Feed goodputs one cycle at a time, applying each change as the coordinator would (the next
    observation is trained in the new setting). Returns (action, setting) per cycle."""
    cur, hist, out = start, [], []
    for r, g in enumerate(seq):
        hist.append(obs(r, cur, g, **kw))
        d = decide(hist, cur, CFG)
        out.append((d.action, d.setting))
        assert d.reason and isinstance(d.evidence, dict)
        cur = d.setting
    return out


L = lambda h, c="none": ConsistencySetting("local", h, c)  # noqa: E731
SYNC = ConsistencySetting("sync", 1)


def test_time_model_numbers():
    # 4.5 MB at 20 MB/s = 0.227 s; H=8 x 0.1 s = 0.8 s of compute -> 28 %.
    f = comm_fraction(L(8), T_STEP, P_BYTES, "none", 20e6)
    assert abs(f - (P_BYTES / 20e6) / 0.8) < 1e-12
    assert abs(comm_fraction(L(8, "int8"), T_STEP, P_BYTES, "none", 20e6) - f / 4) < 1e-12
    cands = _candidates(CFG)
    assert cands[0] == SYNC and cands[-1] == L(32, "int8")


def test_abstains_on_too_few_cycles_then_decides():
    d = decide([obs(0, L(8), 20e6)], L(8), CFG)
    assert d.action == "abstain" and "too few samples" in d.reason and d.setting == L(8)
    d = decide([obs(0, L(8), 20e6), obs(1, L(8), 20e6)], L(8), CFG)
    assert d.action == "abstain" and f"need {CFG.min_cycles}" in d.reason
    d = decide([obs(r, L(8), 20e6) for r in range(3)], L(8), CFG)
    assert d.action == "change" and d.setting == L(16)  # 28 % > 25 %: the smallest H under it
    assert d.evidence["comm_fraction"] > 0.25 and d.evidence["predicted_fraction"] <= 0.25


def test_bandwidth_collapse_moves_to_larger_h_then_compression_and_back_after_heal():
    fast, slow = 20e6, 200e3
    seq = [fast] * 4 + [slow] * 6 + [fast] * 14
    out = run(seq, L(16))
    settings = [s for _a, s in out]
    # Steady at H=16 on the fast link (28 % at H=8 > 25 %; 14 % at 16 is inside the hysteresis band).
    assert set(settings[:4]) == {L(16)}
    # The collapse: abstains while the window straddles it (goodput varies), then changes.
    first_slow = out[4:]
    assert first_slow[0][0] == "abstain" and "flux" in first_slow[0][1].label() or first_slow[0][0] == "abstain"
    changed_at = next(i for i, (a, _s) in enumerate(out) if i >= 4 and a == "change")
    # The window is all slow at cycle 4 + window - 1: the change comes at that decision.
    assert changed_at == 4 + CFG.window_cycles - 1, out[4:changed_at + 1]
    assert settings[changed_at] == L(32, "int8")  # at 200 KB/s even H=32 float32 is comm-bound
    # After the heal it comes back to a smaller H, less compression (once the reverse guard allows).
    assert settings[-1] in (L(16), L(8), L(4)) and settings[-1].compression == "none", out[10:]
    assert sum(a == "change" for a, _s in out) == 2


def test_steady_link_does_not_flap():
    for g in (20e6, 5e6, 1e6):
        out = run([g] * 30, L(8))
        changes = [s for a, s in out if a == "change"]
        assert len(changes) <= 1, (g, changes)


def test_noisy_link_inside_the_band_does_not_flap():
    # Goodput alternates +-15 % around a value that puts H=16 in the hysteresis band.
    seq = [20e6 * (1.15 if i % 2 else 0.85) for i in range(30)]
    out = run(seq, L(16))
    assert sum(a == "change" for a, _s in out) <= 1


def test_reverse_guard_stops_an_oscillation_that_thresholds_alone_would_follow():
    # Comm estimates that flip between "too slow for H=4" and "fast enough to go back" every 3
    # cycles: thresholds alone would follow every flip (10 changes in 30 cycles); the guard lets a
    # change be reversed only after reverse_guard_cycles cycles.
    seq = ([4e6] * 3 + [60e6] * 3) * 5
    out = run(seq, L(4))
    at = [(i, s) for i, (a, s) in enumerate(out) if a == "change"]
    assert 1 <= len(at) <= 30 // CFG.reverse_guard_cycles + 1, at
    for (i, _s), (j, _t) in zip(at, at[1:]):
        assert j - i >= CFG.reverse_guard_cycles, at
    guarded = decide([obs(0, L(4), 60e6), obs(1, L(8), 60e6), obs(2, L(8), 60e6), obs(3, L(8), 60e6)], L(8), CFG)
    assert guarded.action == "keep" and "hysteresis" in guarded.reason


def test_abstains_on_membership_change_stalls_and_flux():
    base = [obs(0, L(8), 20e6), obs(1, L(8), 20e6), obs(2, L(8), 20e6)]
    d = decide(base + [obs(3, L(8), 20e6, changed=True)], L(8), CFG)
    assert d.action == "abstain" and "membership" in d.reason
    d = decide(base + [obs(3, L(8), 20e6, n=2)], L(8), CFG)
    assert d.action == "abstain" and "membership" in d.reason
    d = decide(base + [obs(3, L(8), 20e6, stalls=2)], L(8), CFG)
    assert d.action == "abstain" and "stall" in d.reason
    # At H=16 the fast cycles say "keep" (14 %) and the slow one "move up" (140 %): in flux.
    d = decide([obs(0, L(16), 20e6), obs(1, L(16), 2e6), obs(2, L(16), 20e6)], L(16), CFG)
    assert d.action == "abstain" and "flux" in d.reason and d.evidence["goodput_cv"] > CFG.max_goodput_cv
    # The same variance when every cycle agrees (even the fastest is comm-bound at H=4) is no reason to wait.
    d = decide([obs(0, L(4), 20e6), obs(1, L(4), 2e6), obs(2, L(4), 20e6)], L(4), CFG)
    assert d.action == "change" and d.evidence["goodput_cv"] > CFG.max_goodput_cv


def test_only_observations_in_the_current_setting_count():
    hist = [obs(0, L(8), 20e6), obs(1, L(8), 20e6), obs(2, L(8), 20e6), obs(3, L(16), 20e6)]
    d = decide(hist, L(16), CFG)
    assert d.action == "abstain" and "1 cycle(s)" in d.reason


def test_disagreement_steps_h_down_when_the_link_allows():
    # A link where H=16 sits in the hysteresis band (11 %) and H=8 would fit (22.5 %): it keeps
    # H=16 unless the sites disagree; then it steps to the nearest smaller H the link allows.
    g = P_BYTES / 0.18  # T_comm 0.18 s: H=16 11 %, H=8 22.5 %, H=4 45 %
    agree = [obs(r, L(16), g, cos=0.9) for r in range(3)]
    assert decide(agree, L(16), CFG).action == "keep"
    disagree = [obs(r, L(16), g, cos=0.05) for r in range(3)]
    d = decide(disagree, L(16), CFG)
    assert d.action == "change" and d.setting == L(8) and "disagree" in d.reason


def test_observe_joins_members_measurements():
    c = lambda comp, comm, norm, dot: SiteCycle(compute_s=comp, inner_steps=8, comm_s=comm,  # noqa: E731
                                                payload_bytes=1000, loss=2.5, update_norm=norm, update_dot_mean=dot,
                                                mean_norm=1.0)
    # c finished computing last (1.2 s): its collective (0.25 s) waited for nobody's compute; a and
    # b waited for c as well (their longer collective times are straggler wait, not the link).
    o = observe(7, 3, "local H=8", 8, {"a": c(0.8, 0.5, 2.0, 1.0), "b": c(0.8, 1.0, 1.0, 1.0),
                                       "c": c(1.2, 0.25, 1.0, 0.5)}, ("a", "b", "c"))
    assert o.t_step_s == 0.1 and o.t_comm_s == 0.25 and o.goodput_bps == 4000.0 and o.n_members == 3
    assert o.straggler_wait_s == 0.75
    assert not o.members_changed and abs(o.cos_to_mean - (0.5 + 1.0 + 0.5) / 3) < 1e-12 and o.norm_ratio == 2.0
    o2 = observe(8, 3, "local H=8", 8, {"a": c(0.8, 0.5, 1, 1), "b": c(0.8, 0.5, 1, 1)}, ("a", "b", "c"))
    assert o2.members_changed
    assert replace(o2, round=9).round == 9


def test_observe_of_members_sharing_one_record_is_what_equal_records_give():
    """observe() makes its lists by repetition when every member's cycle is the same record (the
    simulator's members of a plain round share one): the observation is the one that distinct, equal
    records give (the general pass), for sync and local rounds, with and without loss and norms."""
    from sim.cli import site_names

    for steps, loss, norm, stalls in ((8, 2.5, 1.5, 0), (1, None, 0.0, 2), (4, 0.1, 2.0, 1)):
        fields = dict(compute_s=0.3, inner_steps=steps, comm_s=0.7, payload_bytes=12_345, loss=loss,
                      update_norm=norm, update_dot_mean=0.37, mean_norm=0.9, stalls=stalls)
        one = SiteCycle(**fields)
        for n in (1, 2, 1000):
            names = site_names(n)
            shared = observe(5, 2, "local H=8", steps, {m: one for m in names}, tuple(names))
            distinct = observe(5, 2, "local H=8", steps, {m: SiteCycle(**fields) for m in names}, tuple(names))
            assert shared == distinct and shared.n_members == n and shared.stalls == n * stalls
