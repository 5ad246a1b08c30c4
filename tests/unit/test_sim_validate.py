"""The validation table's machinery (sim/validate.py, bench/sim_validate.py) on simulated stand-ins.

A simulated run stands in for an emulated one here (pure logic, seconds): simulated again from its
own config.json and scenario.json with the same model, every number must agree exactly (the
simulator is deterministic) and every claim survive; with a different model the time claim must be
falsified and name the run; with no runs at all every claim is "not run".
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.sim_validate import run as validate_run
from chaos.scenario import Scenario
from ground.config import load_config, merge
from sim import validate
from sim.model import SimModel
from sim.world import simulate
from tests.conftest import COMPARE_CFG


def _stand_in(tmp: Path, policy: str) -> Path:
    cfg = load_config(merge(COMPARE_CFG, {"run_id": f"v-{policy}", "recovery": {"policy": policy}}))
    scen = Scenario.build("crash-b", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    if policy == "oracle":
        cfg = replace(cfg, recovery=replace(cfg.recovery, oracle_faults=(("b", 36_864),)))
    out = tmp / policy
    simulate(cfg, scen, SimModel(), out=out)
    (out / "scenario.json").write_text(__import__("json").dumps(scen.to_dict()))
    return out


def test_a_run_simulated_again_with_its_own_model_has_no_error_and_every_claim_survives(tmp_path: Path) -> None:
    rows = []
    for policy in ("stall", "elastic"):
        emu = _stand_in(tmp_path / "emu", policy)
        sim = validate.simulate_like(emu, SimModel(), tmp_path / "sim" / policy)
        e, s = validate.measure(emu), validate.measure(sim)
        assert e == s and e["recovery_s"] and e["bytes"]["collective"] > 0 and e["time_to_target_s"] > 0
        err = validate.compare(e, s)
        assert err["time_to_target"] == 0 and err["lost_tokens_diff"] == 0 and set(err["bytes"].values()) <= {0.0, None}
        assert e["wan_bytes"]["collective"] > 0 and set(err["wan_bytes"].values()) <= {0.0, None}
        rows.append({"scenario": "crash-b", "policy": policy, "emulator": e, "simulator": s, "error": err,
                     "progress_triggered": validate.progress_triggered(emu)})
    claims = validate.claims({"stand-in": rows})
    assert [c["status"] for c in claims] == ["survived"] * 5
    # a slower compute model: the time claim is falsified, and says where
    slow = validate.measure(validate.simulate_like(tmp_path / "emu" / "stall", SimModel(compute_s_per_token=0.001),
                                                   tmp_path / "slow"))
    bad = [{**rows[0], "simulator": slow, "error": validate.compare(rows[0]["emulator"], slow)}, rows[1]]
    c = validate.claims({"stand-in": bad})[0]
    assert c["status"] == "falsified" and c["against"][0].startswith("crash-b/stall")


def test_without_emulator_runs_every_claim_is_not_run(tmp_path: Path) -> None:
    raw = validate_run(tmp_path / "no-runs", tmp_path / "out")
    assert {c["status"] for c in raw["claims"]} == {"not run"} and "noise-floor" in raw["why_not_run"]


def test_extra_calibration_runs_are_found_in_a_study_directory(tmp_path: Path) -> None:
    """`--calibration-extra`: a run directory counts as itself, a study directory by its runs/ (the
    `latest` link and anything without a config.json left out)."""
    from bench.sim_validate import extra_runs

    study = tmp_path / "study"
    for name in ("s1--a", "s1--b"):
        (study / "runs" / name).mkdir(parents=True)
        (study / "runs" / name / "config.json").write_text("{}")
    (study / "runs" / "junk").mkdir()
    (study / "runs" / "latest").symlink_to(study / "runs" / "s1--b")
    single = tmp_path / "one-run"
    single.mkdir()
    (single / "config.json").write_text("{}")
    assert [p.name for p in extra_runs([study, single])] == ["s1--a", "s1--b", "one-run"]


def test_a_run_named_twice_through_a_comparisons_latest_link_counts_once(tmp_path: Path) -> None:
    """A comparison directory holds its runs directly; naming it, or naming its `latest` link beside
    the run it points to, adds each run once."""
    from bench.sim_validate import extra_runs

    comp = tmp_path / "compare-preemption"
    for name in ("elastic-1", "stall-2"):
        (comp / name).mkdir(parents=True)
        (comp / name / "config.json").write_text("{}")
    (comp / "latest").symlink_to(comp / "stall-2")
    assert [p.name for p in extra_runs([comp])] == ["elastic-1", "stall-2"]
    named = [comp / "elastic-1", comp / "latest", comp / "stall-2"]
    assert [p.name for p in extra_runs(named)] == ["elastic-1", "latest"]


def test_simulating_again_into_the_same_directory_replaces_the_run_and_never_mixes_histories(tmp_path: Path) -> None:
    # The bench, run twice with the same --out, once counted every simulated lost token twice: the
    # second simulation appended its events to the first one's logs.
    emu = _stand_in(tmp_path / "emu", "stall")
    out = tmp_path / "sim" / "stall"
    first = validate.measure(validate.simulate_like(emu, SimModel(), out))
    again = validate.measure(validate.simulate_like(emu, SimModel(), out))
    assert again == first and first["lost_tokens"] > 0
    # a directory that holds something other than a simulated run is refused, and left as it was
    other = tmp_path / "someone"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no simulated run"):
        validate.simulate_like(emu, SimModel(), other)
    assert (other / "notes.txt").read_text() == "mine" and not (other / "logs").exists()
    # and simulate() itself refuses a run directory whose logs are already written
    with pytest.raises(FileExistsError, match="already holds a run's logs"):
        simulate(load_config(merge(COMPARE_CFG, {"run_id": "again"})), None, SimModel(), out=out)


def _row(scen: str, policy: str, emu_s: float, sim_s: float) -> dict:
    return {"scenario": scen, "policy": policy, "emulator": {"time_to_target_s": emu_s, "bytes": {}, "wan_bytes": {}},
            "simulator": {"time_to_target_s": sim_s, "bytes": {}, "wan_bytes": {}},
            "error": {"time_to_target": abs(sim_s - emu_s) / emu_s, "bytes": {}, "wan_bytes": {},
                      "lost_tokens_diff": 0}, "progress_triggered": False}


def test_a_simulated_time_inside_the_emulators_own_spread_is_undecided_and_one_outside_it_is_falsified() -> None:
    # Two repeats of one scenario on the emulator (its run-to-run noise). stall: the simulator is 15 %
    # off the emulator's mean of 100 s but between its two runs (80 and 120 s): the emulator disagrees
    # with itself by more than the simulator does. restart: 15 % off and faster than either run.
    comps = {"rep1": [_row("s", "stall", 80.0, 115.0), _row("s", "restart", 100.0, 85.0)],
             "rep2": [_row("s", "stall", 120.0, 115.0), _row("s", "restart", 100.0, 85.0)]}
    c = claims_by_name(validate.claims(comps))
    time = c["time to target within 10 % of the emulator's"]
    assert time["status"] == "falsified" and time["against"] == ["s/restart: 15.0% off the emulator's mean of 2 run(s)"]
    assert time["undecided"] == ["s/stall: 15.0% off the mean, inside the emulator's own spread of 40.0%"]
    # without the restart row's miss, the claim is undecided, not survived
    only = {k: [r for r in v if r["policy"] == "stall"] for k, v in comps.items()}
    assert claims_by_name(validate.claims(only))["time to target within 10 % of the emulator's"]["status"] == "undecided"
    # the ranking: the emulator's repeats rank stall first once (80 < 100) and restart first once (100 < 120);
    # by mean (100 vs 100, a tie broken by name) restart leads; the simulator ranks restart first too
    rank = c["the ranking of the policies by time to target is preserved"]
    assert rank["status"] == "survived"


def test_a_ranking_the_emulators_repeats_disagree_on_is_undecided_and_one_they_agree_on_is_falsified() -> None:
    flip = {"rep1": [_row("s", "stall", 80.0, 95.0), _row("s", "restart", 90.0, 90.0)],
            "rep2": [_row("s", "stall", 100.0, 95.0), _row("s", "restart", 95.0, 90.0)]}
    rank = claims_by_name(validate.claims(flip))["the ranking of the policies by time to target is preserved"]
    assert rank["status"] == "undecided" and "repeats rank differently" in rank["undecided"][0]
    agree = {"rep1": [_row("s", "stall", 80.0, 95.0), _row("s", "restart", 90.0, 90.0)],
             "rep2": [_row("s", "stall", 82.0, 95.0), _row("s", "restart", 95.0, 90.0)]}
    rank = claims_by_name(validate.claims(agree))["the ranking of the policies by time to target is preserved"]
    assert rank["status"] == "falsified" and rank["against"] == ["s: emulator ['stall', 'restart'] vs simulator "
                                                                 "['restart', 'stall']"]


def claims_by_name(cs: list[dict]) -> dict[str, dict]:
    return {c["claim"]: c for c in cs}


def test_lost_tokens_must_be_exact_where_the_emulators_repeats_agree_and_inside_their_range_where_they_do_not() -> None:
    def row(policy: str, emu: int, sim: int) -> dict:
        r = _row("s", policy, 100.0, 100.0)
        r["emulator"]["lost_tokens"] = emu
        r["error"]["lost_tokens_diff"] = sim - emu
        r["progress_triggered"] = True
        return r

    comps = {"rep1": [row("stall", 8448, 6400), row("restart", 30976, 30976), row("elastic", 512, 768)],
             "rep2": [row("stall", 6144, 6400), row("restart", 30976, 30976), row("elastic", 512, 768)]}
    lost = claims_by_name(validate.claims(comps))["lost tokens exact for progress-triggered faults"]
    assert lost["status"] == "falsified" and lost["against"] == ["s/elastic: +256"]
    assert lost["undecided"] == ["s/stall: simulated 6,400 between the emulator's repeats [6144, 8448]"]
    comps["rep2"][2] = row("elastic", 1024, 768)
    assert claims_by_name(validate.claims(comps))["lost tokens exact for progress-triggered faults"]["status"] == \
        "undecided"


def test_bytes_are_judged_against_the_emulators_repeats() -> None:
    def row(policy: str, emu_state: int, sim_state: int) -> dict:
        r = _row("s", policy, 100.0, 100.0)
        r["emulator"]["bytes"], r["simulator"]["bytes"] = {"state_transfer": emu_state}, {"state_transfer": sim_state}
        r["emulator"]["wan_bytes"], r["simulator"]["wan_bytes"] = {}, {}
        return r

    # elastic: the restarted site rejoined before the target in one emulator repeat (7.2 MB of state) and
    # not in the other; the simulator's 0 is inside that range. stall: both repeats moved 7.2 MB, the simulator 0.
    comps = {"rep1": [row("elastic", 7_176_442, 0), row("stall", 7_176_442, 0)],
             "rep2": [row("elastic", 0, 0), row("stall", 7_176_442, 0)]}
    b = claims_by_name(validate.claims(comps))["bytes per class (collective, state transfer, checkpoint) within 2 %"]
    assert b["status"] == "falsified"
    assert b["against"] == ["s/stall state_transfer: 100.0% off the emulator's mean of 2 run(s), outside their range "
                            "[7176442, 7176442]"]
    assert b["undecided"] == ["s/elastic state_transfer: 100.0% off the emulator's mean of 2 run(s), inside their "
                              "range [0, 7176442]"]


def _comparison(root: Path, name: str, links: dict, scen: Scenario, sites: tuple[str, ...] = ()) -> None:
    """A stand-in `xdc compare` directory: stall and elastic simulated over `links` (at `sites`, or the
    default three), with its index."""
    import json

    runs = []
    for policy in ("stall", "elastic"):
        cfg = load_config(merge(COMPARE_CFG, {"run_id": f"{name}-{policy}", "recovery": {"policy": policy},
                                              "wan": {"site_link": links},
                                              **({"cluster": {"sites": list(sites)}} if sites else {})}))
        out = root / name / f"{policy}-run"
        simulate(cfg, scen, SimModel(), out=out)
        (out / "scenario.json").write_text(json.dumps(scen.to_dict()))
        runs.append({"policy": policy, "run_dir": str(out)})
    (root / name / "index.json").write_text(json.dumps({"scenario": scen.to_dict(), "runs": runs,
                                                        "interrupted": False}))


SLOW_LINKS = {"up": {"latency_ms": 40, "bandwidth_kbps": 1000}, "down": {"latency_ms": 40, "bandwidth_kbps": 1000}}


def _fitted_root(tmp_path: Path) -> tuple[Path, Path, Scenario]:
    """A runs root with one fault-free calibration run (simulated, three sites over the fitted
    links), its path, and the crash scenario the held-out comparisons run."""
    root = tmp_path / "root"
    fit = root / "noise-floor" / "noise-seed0"
    simulate(load_config(merge(COMPARE_CFG, {"run_id": "fit"})), None, SimModel(), out=fit)
    return root, fit, Scenario.build("crash-b", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)


def test_the_same_scenario_over_links_the_fit_never_saw_is_its_own_held_out_condition(tmp_path: Path) -> None:
    """Held-out link profiles: a comparison over other site links is judged apart (not as a repeat of
    the same scenario over the fitted links), labelled with its links and marked held out."""
    from bench.sim_validate import links_of

    root, fit, scen = _fitted_root(tmp_path)
    slow = SLOW_LINKS
    _comparison(root, "compare-fitted-links", {}, scen)
    _comparison(root, "compare-slow-links", slow, scen)
    assert links_of(fit) == "site links 5±0 ms unshaped"
    assert links_of(root / "compare-slow-links" / "stall-run") == "site links 40±0 ms 1,000 KB/s"
    raw = validate_run(root, tmp_path / "out", allow_simulated=True)  # simulated stand-ins for emulator runs
    assert raw["calibration_links"] == ["site links 5±0 ms unshaped"]
    by_comp = {k: {(r["scenario"], r["links_held_out"]) for r in rs} for k, rs in raw["comparisons"].items()}
    assert by_comp == {
        "compare-fitted-links (crash-b)": {("crash-b", False)},
        "compare-slow-links (crash-b over site links 40±0 ms 1,000 KB/s (held out))":
            {("crash-b over site links 40±0 ms 1,000 KB/s (held out)", True)}}
    # two conditions of one run each, not one condition with two repeats
    groups = validate.time_groups([r for rs in raw["comparisons"].values() for r in rs])
    assert sorted((g["scenario"], g["policy"], len(g["emulator_s"])) for g in groups) == [
        ("crash-b", "elastic", 1), ("crash-b", "stall", 1),
        ("crash-b over site links 40±0 ms 1,000 KB/s (held out)", "elastic", 1),
        ("crash-b over site links 40±0 ms 1,000 KB/s (held out)", "stall", 1)]
    # the stand-ins were simulated with the priors, the bench with the fit: the slower links take longer
    slow_t = {r["policy"]: r["emulator"]["time_to_target_s"] for r in raw["comparisons"][
        "compare-slow-links (crash-b over site links 40±0 ms 1,000 KB/s (held out))"]}
    fast_t = {r["policy"]: r["emulator"]["time_to_target_s"] for r in raw["comparisons"][
        "compare-fitted-links (crash-b)"]}
    assert all(slow_t[p] > fast_t[p] for p in ("stall", "elastic"))


def test_the_same_scenario_at_more_sites_than_the_fit_saw_is_its_own_held_out_condition(tmp_path: Path) -> None:
    """Held-out site counts: a comparison at four sites, over the fitted links, is judged apart from the
    same scenario at the fit's three (not as a repeat), labelled with its site count and marked held out;
    one both over other links and at another count names both."""
    from bench.sim_validate import sites_of

    root, _fit, scen = _fitted_root(tmp_path)
    slow = SLOW_LINKS
    _comparison(root, "compare-three", {}, scen)
    _comparison(root, "compare-four", {}, scen, ("a", "b", "c", "d"))
    _comparison(root, "compare-four-slow", slow, scen, ("a", "b", "c", "d"))
    assert sites_of(root / "compare-three" / "stall-run") == 3
    assert sites_of(root / "compare-four" / "stall-run") == 4
    raw = validate_run(root, tmp_path / "out", allow_simulated=True)  # simulated stand-ins for emulator runs
    assert raw["calibration_sites"] == [3]
    by_comp = {k: {(r["scenario"], r["links_held_out"], r["sites"], r["sites_held_out"]) for r in rs}
               for k, rs in raw["comparisons"].items()}
    assert by_comp == {
        "compare-four (crash-b at 4 sites (held out))": {("crash-b at 4 sites (held out)", False, 4, True)},
        "compare-four-slow (crash-b over site links 40±0 ms 1,000 KB/s at 4 sites (held out))":
            {("crash-b over site links 40±0 ms 1,000 KB/s at 4 sites (held out)", True, 4, True)},
        "compare-three (crash-b)": {("crash-b", False, 3, False)}}
    groups = validate.time_groups([r for rs in raw["comparisons"].values() for r in rs])
    assert sorted((g["scenario"], g["policy"], len(g["emulator_s"])) for g in groups) == [
        ("crash-b", "elastic", 1), ("crash-b", "stall", 1),
        ("crash-b at 4 sites (held out)", "elastic", 1), ("crash-b at 4 sites (held out)", "stall", 1),
        ("crash-b over site links 40±0 ms 1,000 KB/s at 4 sites (held out)", "elastic", 1),
        ("crash-b over site links 40±0 ms 1,000 KB/s at 4 sites (held out)", "stall", 1)]
    # four sites share the target: each round takes 4/3 the samples, so the run needs fewer rounds
    four = {r["policy"]: r["emulator"]["time_to_target_s"] for r in raw["comparisons"][
        "compare-four (crash-b at 4 sites (held out))"]}
    three = {r["policy"]: r["emulator"]["time_to_target_s"] for r in raw["comparisons"]["compare-three (crash-b)"]}
    assert all(four[p] < three[p] for p in ("stall", "elastic"))


def test_a_miss_the_simulators_own_timing_bounds_reach_is_undecided_and_one_they_do_not_is_falsified() -> None:
    # churn at 4a0b003: the chaos driver fired a preemption 236 ms after its commit where the fitted
    # poll delay is 139 ms, so the emulator lost a step more per site than the simulator at its fitted
    # values; simulated at the fitted fewest and most poll delay, the simulator's range reaches it.
    def row(policy: str, emu: int, sim: int, lost_range: list[int] | None, emu_ctl: int, ctl_range: list[int]) -> dict:
        r = _row("s", policy, 100.0, 100.0)
        r["emulator"]["lost_tokens"], r["error"]["lost_tokens_diff"] = emu, sim - emu
        r["progress_triggered"] = True
        r["emulator"]["bytes"], r["simulator"]["bytes"] = {}, {}
        r["emulator"]["wan_bytes"], r["simulator"]["wan_bytes"] = {"control": emu_ctl}, {"control": ctl_range[1]}
        r["error"]["wan_bytes"] = {"control": abs(ctl_range[1] - emu_ctl) / emu_ctl}
        r["simulator_bounds"] = {"lost_tokens": lost_range, "bytes": {}, "wan_bytes": {"control": ctl_range}}
        return r

    comps = {"rep1": [row("stall", 4096, 3072, [1536, 4608], 458_000, [465_000, 470_000]),
                      row("restart", 4352, 3072, [3072, 3072], 458_000, [480_000, 490_000])],
             "rep2": [row("stall", 3840, 3072, [1536, 4608], 458_000, [465_000, 470_000]),
                      row("restart", 3840, 3072, [3072, 3072], 458_000, [480_000, 490_000])]}
    cs = claims_by_name(validate.claims(comps))
    lost = cs["lost tokens exact for progress-triggered faults"]
    assert lost["status"] == "falsified"
    assert lost["against"] == ["s/restart: simulated 3,072 outside the emulator's repeats [3840, 4352]"]
    assert lost["undecided"] == ["s/stall: simulated 3,072 outside the emulator's repeats [3840, 4096], which the "
                                 "simulator's own range [1536, 4608] over the fitted timing spread reaches"]
    wan = next(c for name, c in cs.items() if name.startswith("inter-site bytes"))
    assert wan["status"] == "falsified" and [a.split(":")[0] for a in wan["against"]] == ["s/restart control"]
    assert [u.split(":")[0] for u in wan["undecided"]] == ["s/stall control"]
    # repeats that agree: a miss inside the bounds is undecided, never survived
    comps = {"rep1": [row("stall", 4096, 3072, [1536, 4608], 458_000, [458_000, 458_000])],
             "rep2": [row("stall", 4096, 3072, [1536, 4608], 458_000, [458_000, 458_000])]}
    lost = claims_by_name(validate.claims(comps))["lost tokens exact for progress-triggered faults"]
    assert lost["status"] == "undecided" and "inside the simulator's own range [1536, 4608]" in lost["undecided"][0]


def test_the_timing_bounds_set_the_restart_poll_delay_and_teardown_to_their_fitted_fewest_and_most() -> None:
    cal = {"parameters": {"restart_s": {"value": 4.1, "range": [3.98, 4.29]},
                          "fault_poll_s": {"value": 0.139, "range": [0.033, 0.247]},
                          "crash_teardown_s": {"value": 0.064, "range": [0.041, 0.118]},
                          "eval_s": {"value": 1.0, "range": [0.5, 2.0]}}}
    model = SimModel(restart_s=4.1, fault_poll_s=0.139, crash_teardown_s=0.064, eval_s=1.0)
    b = validate.timing_bounds(model, cal)
    assert (b["fewest"].restart_s, b["fewest"].fault_poll_s, b["fewest"].crash_teardown_s) == (3.98, 0.033, 0.041)
    assert (b["most"].restart_s, b["most"].fault_poll_s, b["most"].crash_teardown_s) == (4.29, 0.247, 0.118)
    assert b["fewest"].eval_s == b["most"].eval_s == 1.0  # only the timing parameters move
    assert validate.timing_bounds(model, {"parameters": {"restart_s": {"value": 4.1}}}) == {}


def test_the_race_diagnostic_measures_a_faults_delay_from_its_triggering_commit_to_the_action_or_the_log(
        tmp_path: Path) -> None:
    """bench/sim_lost_given_race: the delay runs from the first commit at or past the trigger, to the
    action's start (the SIGKILL) or to the logged fault_injected (after the action); a time-triggered
    fault has none."""
    import json

    from bench.sim_lost_given_race import fault_delays_s

    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    commits = [{"event": "commit", "mono_ns": t, "useful_tokens": tok}
               for t, tok in ((1_000_000_000, 300_000), (2_000_000_000, 417_792), (3_000_000_000, 500_000))]
    (logs / "coord.jsonl").write_text("".join(json.dumps(c) + "\n" for c in commits))
    chaos = [{"event": "scenario_started", "mono_ns": 0},
             {"event": "fault_injected", "mono_ns": 2_200_000_000, "start_mono_ns": 2_130_000_000,
              "end_mono_ns": 2_199_000_000, "trigger": {"at_useful_tokens": 400_000}},
             {"event": "fault_injected", "mono_ns": 2_500_000_000, "trigger": {"at_s": 2.5}}]
    (logs / "chaos.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chaos))
    assert fault_delays_s(tmp_path / "run", "start") == pytest.approx([0.13])
    assert fault_delays_s(tmp_path / "run", "logged") == pytest.approx([0.2])
