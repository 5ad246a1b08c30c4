"""A step of the host's wall clock during a run (NTP) must not change its time to target.

Found in `make sim-validate`: one emulated elastic run over slow links measured 145.5 s to target
against its repeat's 126.0 s, with the same commits at the same monotonic times; every process's
wall_ns had jumped 19.6 s against mono_ns mid-run. A simulated run's logs stand in here (the same
event records), with the same step written into them.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.artifact import build_artifact
from analysis.clock import RunClock, measure, put_on_steady_axis
from analysis.load import load_run
from ground.config import load_config, merge
from sim.model import SimModel
from sim.world import simulate
from tests.conftest import COMPARE_CFG

STEP_NS = 19_600_000_000


def _step_wall_clock(run: Path, after_mono_ns: int) -> None:
    """Every event logged after `after_mono_ns` gets its wall times STEP_NS later, as after an NTP step."""
    for f in (run / "logs").glob("*.jsonl"):
        out = []
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["mono_ns"] > after_mono_ns:
                for k in ("wall_ns", "start_wall_ns", "end_wall_ns"):
                    if k in e:
                        e[k] += STEP_NS
            out.append(json.dumps(e))
        f.write_text("\n".join(out) + "\n")


def test_a_wall_clock_step_mid_run_leaves_the_time_to_target_and_is_said(tmp_path: Path) -> None:
    out = tmp_path / "run"
    simulate(load_config(merge(COMPARE_CFG, {"run_id": "step"})), None, SimModel(), out=out)
    before = build_artifact([out])["runs"][0]["metrics"]["active_time"]
    assert before["value"] > 10 and "stepped" not in before["note"]
    commits = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
    commits = [e for e in commits if e["event"] == "commit"]
    _step_wall_clock(out, commits[len(commits) // 2]["mono_ns"])
    after = build_artifact([out])["runs"][0]["metrics"]["active_time"]
    assert after["value"] == before["value"]  # the monotonic clock did not move
    assert "the host's wall clock stepped by 19.6 s" in after["note"]


def _without_volatile(art: dict) -> dict:
    """The artifact less what must differ: the logs' hashes, the clock note, when it was generated."""
    art = json.loads(json.dumps(art))
    art.pop("generated")
    for r in art["runs"]:
        r["provenance"].pop("input_hashes")
        r["metrics"]["active_time"].pop("note")
    return art


def test_a_wall_clock_step_mid_run_moves_no_timeline(tmp_path: Path) -> None:
    """Timelines, the commit ledger and the run's end are drawn on the run's steady axis (analysis/clock.py):
    the artifact of the stepped logs is the artifact of the unstepped ones (before, every phase and
    commit after the step was drawn 19.6 s late, and the run 'ended' 19.6 s later)."""
    out = tmp_path / "run"
    simulate(load_config(merge(COMPARE_CFG, {"run_id": "step"})), None, SimModel(), out=out)
    before = build_artifact([out])
    commits = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
    commits = [e for e in commits if e["event"] == "commit"]
    _step_wall_clock(out, commits[len(commits) // 2]["mono_ns"])
    h = load_run(out)
    assert h.clock.steady and h.clock.step_ns == STEP_NS
    after = build_artifact([out])
    assert _without_volatile(after) == _without_volatile(before)
    assert after["runs"][0]["timeline"]["phases"]["start_ns"] == before["runs"][0]["timeline"]["phases"]["start_ns"]


def test_logs_without_monotonic_stamps_stay_on_the_wall_clock() -> None:
    """A log that lacks mono_ns anywhere is left as logged (mixing the two axes would be worse)."""
    logs = {"coord": [{"event": "a", "wall_ns": 5_000, "mono_ns": 1_000}, {"event": "b", "wall_ns": 9_000}],
            "a": [{"event": "c", "wall_ns": 7_000, "mono_ns": 2_000, "start_wall_ns": 6_000, "start_mono_ns": 1_500,
                   "end_wall_ns": 7_000, "end_mono_ns": 2_000}]}
    clock = measure(logs)
    assert clock == RunClock(False, 4_000, 1_000)
    put_on_steady_axis(logs, clock)
    assert logs["coord"][1]["wall_ns"] == 9_000 and logs["a"][0]["wall_ns"] == 7_000
    del logs["coord"][1]
    clock = measure(logs)
    assert clock == RunClock(True, 4_000, 1_000)  # the earliest event (mono 1,000) anchors the axis
    put_on_steady_axis(logs, clock)
    assert logs["a"][0]["wall_ns"] == 6_000 and logs["a"][0]["start_wall_ns"] == 5_500


def test_a_study_places_the_learning_curve_on_the_tick_axis_across_a_wall_clock_step(tmp_path: Path) -> None:
    """studies/metrics.py reads the tick times from the logs itself and the curve's times from the
    run's summary (load_run's steady axis): both must be on one axis, or a stepped run's curve
    points land 19.6 s of ticks late."""
    from analysis.summary import summarize
    from studies.metrics import opportunity_ticks, ticks_at

    out = tmp_path / "run"
    simulate(load_config(merge(COMPARE_CFG, {"run_id": "step"})), None, SimModel(), out=out)

    def curve_ticks() -> list[int]:
        summary = summarize(out, proxy_bytes={}, exit_codes={})
        ticks = opportunity_ticks(out, ["a", "b", "c"])
        return [ticks_at(ticks["at_wall_ns"], p["wall_ns"]) for p in summary["heldout_nll_curve"]]

    before = curve_ticks()
    assert len(before) >= 3 and before == sorted(before) and before[-1] > before[0]
    commits = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
    commits = [e for e in commits if e["event"] == "commit"]
    _step_wall_clock(out, commits[len(commits) // 2]["mono_ns"])
    assert curve_ticks() == before


def test_a_study_trace_keeps_its_times_and_order_across_a_wall_clock_step(tmp_path: Path) -> None:
    """The study page's per-run trace (studies/report.write_traces) is on the run's steady axis too:
    sorted by the raw wall clock, a step moved every later commit and eval by 19.6 s, and a step
    back would have put them before the events that preceded them."""
    from studies.report import write_traces

    out = tmp_path / "run"
    simulate(load_config(merge(COMPARE_CFG, {"run_id": "trace"})), None, SimModel(), out=out)
    art = {"runs": [{"run_dir": str(out), "key": "elastic/seed 1"}]}

    def trace() -> list[dict]:
        write_traces(art, tmp_path / "page")
        text = (tmp_path / "page" / "traces" / "elastic_seed_1.js").read_text()
        return json.loads(text[text.index(", ") + 2:text.rindex(");")])["events"]

    before = trace()
    assert sum(e["event"] == "commit" for e in before) >= 3
    assert [e["wall_ns"] for e in before] == sorted(e["wall_ns"] for e in before)
    commits = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
    commits = [e for e in commits if e["event"] == "commit"]
    _step_wall_clock(out, commits[len(commits) // 2]["mono_ns"])
    assert trace() == before
