"""`xdc analyze` on a real four-policy comparison, and its checkers on deliberately broken logs.

The comparison is the session's (tests/conftest.py `comparison`): real processes, the real
Toxiproxy, site b SIGKILLed and restarted. The broken copies take only the logs and manifests
of those runs and change one thing each, the way a bug would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from analysis import checkers as chk
from analysis.analyze import analyze
from analysis.artifact import build_artifact, validate_artifact
from analysis.sql import query
from tests.conftest import independent_ledger
from xdc.cli import main as xdc_main

MANIFESTS = ("config.json", "topology.json", "scenario.json")


@pytest.fixture(scope="module")
def analysed(comparison, tmp_path_factory) -> tuple[Path, dict]:
    out_dir, _index = comparison
    res = analyze([out_dir], tmp_path_factory.mktemp("analysis"))
    return res.out_dir, res.artifact


def _copy_logs(run_dir: Path, dest: Path) -> Path:
    """The logs and manifests of a run (not its checkpoint blobs): all the analysis reads."""
    (dest / "logs").mkdir(parents=True)
    for name in MANIFESTS:
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, dest / name)
    for p in (run_dir / "logs").glob("*.jsonl"):
        shutil.copy(p, dest / "logs" / p.name)
    return dest


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, evs: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))


def _run(index: dict, policy: str) -> Path:
    return Path(next(r["run_dir"] for r in index["runs"] if r["policy"] == policy))


def _status(art: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in art["checks"]}


# ------------------------------------------------------------------------------- the real comparison
def test_analysis_of_a_real_comparison_passes_every_checker(analysed):
    out_dir, art = analysed
    validate_artifact(art)  # and it was validated before it was written
    on_disk = json.loads((out_dir / "artifact.json").read_text())
    assert on_disk["schema"] == "xdc-artifact/1" and on_disk["kind"] == "comparison"
    assert [r["policy"] for r in art["runs"]] == ["stall", "restart", "elastic", "oracle"]
    assert _status(art) == {name: "pass" for name, _ in chk.CHECKERS}, json.dumps(art["checks"], indent=1)
    assert art["comparison"]["matched_frontier"]
    for r in art["runs"]:
        m = r["metrics"]
        # attempted = retained + lost across independent sources, not from a summary that derives one from the
        # others: attempted and lost from the sites' own logs, retained from the coordinator's commit record.
        ledger = independent_ledger(Path(r["run_dir"]))
        for site, (attempted, retained, lost) in ledger.items():
            assert attempted == retained + lost, (r["policy"], site, attempted, retained, lost)
            assert r["work"]["per_site"][site]["attempted_tokens"] == attempted, (r["policy"], site)
        assert m["attempted_tokens"]["value"] == sum(v[0] for v in ledger.values())
        assert m["retained_tokens"]["value"] == sum(v[1] for v in ledger.values())
        assert m["lost_tokens"]["value"] == sum(v[2] for v in ledger.values())
        assert r["frontier"]["proof"]["status"] == "proven", r["frontier"]["proof"]
        assert m["useful_tokens"]["value"] == 98_304 and m["useful_tokens"]["evidence"] == "measured"
        assert m["energy"]["value"] is None and m["energy"]["evidence"] == "unavailable"
        assert r["reconciliation"]["evidence"] == "measured"  # Toxiproxy's counters came from the logs
        kinds = {mk["kind"] for mk in r["timeline"]["marks"]}
        assert "failure" in kinds, (r["policy"], kinds)
        if r["policy"] in ("stall", "restart"):  # they wait for b; elastic and oracle may finish without it
            assert "rejoin" in kinds, (r["policy"], kinds)
        phases = set(r["timeline"]["phases"]["phase"])
        assert {"compute", "collective", "checkpoint"} <= phases, (r["policy"], phases)
        assert r["provenance"]["code_revision"]["evidence"] == "measured"
        assert len(r["provenance"]["dataset_id"]) == 64
        assert all(len(h) == 64 for h in r["provenance"]["input_hashes"].values())
    by = {r["policy"]: r for r in art["runs"]}
    assert any(mk["kind"] == "replay" for mk in by["restart"]["timeline"]["marks"])  # restart redoes work
    assert any(mk["kind"] == "restore" for mk in by["restart"]["timeline"]["marks"])
    assert "waiting" in by["stall"]["timeline"]["phases"]["phase"]  # stall waits
    # The report and the on-demand traces sit beside the artifact.
    html = (out_dir / "report" / "index.html").read_text()  # self-contained: checked in the browser test
    assert len(list((out_dir / "report" / "traces").glob("*.js"))) == 4
    for r in art["runs"]:
        assert r["run_id"] in html
    # Learning: every run's NLL is read against count baselines measured on the same evaluation windows.
    sets = set()
    for r in art["runs"]:
        lr = r["learning"]
        assert lr["baselines"]["evidence"] == "measured" and lr["baselines"]["eval_set"] == lr["eval_set"]["id"], lr
        assert lr["eval_set"]["tokens"]["value"] == 128 * 128 and lr["eval_set"]["final_nll_se"]["value"] > 0
        assert r["metrics"]["final_heldout_nll"]["se"] == lr["eval_set"]["final_nll_se"]["value"]
        sets.add(lr["eval_set"]["id"])
    assert len(sets) == 1  # one evaluation set for every policy
    assert "data-learning-verdict=" in html and "data-baselines='measured'" in html


def test_artifact_schema_rejects_a_number_without_its_evidence_class(analysed):
    _out, art = analysed
    broken = json.loads(json.dumps(art))
    broken["runs"][0]["metrics"]["lost_tokens"] = {"value": 5, "unit": "tokens"}
    with pytest.raises(jsonschema.ValidationError):
        validate_artifact(broken)
    broken = json.loads(json.dumps(art))
    broken["runs"][0]["metrics"]["energy"] = {"value": 12.5, "unit": "J", "evidence": "unavailable"}
    with pytest.raises(jsonschema.ValidationError):  # an unavailable number has no value
        validate_artifact(broken)


# ------------------------------------------------------------------------------- deliberately broken
def test_a_removed_commit_fails_the_lineage_and_ledger_checkers(comparison, tmp_path):
    _out, index = comparison
    run = _copy_logs(_run(index, "elastic"), tmp_path / "run")
    coord = _read(run / "logs" / "coord.jsonl")
    commits = [i for i, e in enumerate(coord) if e["event"] == "commit"]
    removed = coord.pop(commits[len(commits) // 2])
    _write(run / "logs" / "coord.jsonl", coord)
    art = build_artifact([run])
    st = _status(art)
    assert st["lineage"] == "fail" and st["work_ledger"] == "fail", st
    lineage = next(c for c in art["checks"] if c["name"] == "lineage")
    assert any(f"names parent {removed['commit_id']}" in line for line in lineage["evidence"]), lineage


def test_a_duplicated_sample_fails_the_work_ledger(comparison, tmp_path):
    _out, index = comparison
    run = _copy_logs(_run(index, "stall"), tmp_path / "run")
    log = run / "logs" / "a.jsonl"
    evs = _read(log)
    victim = next(e for e in evs if e["event"] == "work_attempted" and e["round"] == 1)
    dup = {**victim, "id": f"a:{len(evs)}", "inner_step": victim["inner_step"] + 100,
           "wall_ns": evs[-1]["wall_ns"] + 1, "mono_ns": evs[-1]["mono_ns"] + 1}
    _write(log, evs + [dup])  # the same samples trained again in the same committed round
    art = build_artifact([run])
    assert _status(art)["work_ledger"] == "fail"
    ev = next(c for c in art["checks"] if c["name"] == "work_ledger")["evidence"]
    assert any("retained more than once" in line for line in ev), ev
    assert any("coordinator records" in line for line in ev), ev


def test_a_stale_epoch_apply_fails_the_fencing_checker(comparison, tmp_path):
    _out, index = comparison
    run = _copy_logs(_run(index, "elastic"), tmp_path / "run")
    log = run / "logs" / "a.jsonl"
    evs = _read(log)
    last_round = [e for e in evs if e["event"] == "round_done"][-1]
    assert last_round["epoch"] > 1, "elastic changes membership, so a is past epoch 1"
    stale = {**last_round, "id": f"a:{len(evs)}", "epoch": 1, "round": last_round["round"] + 1,
             "wall_ns": evs[-1]["wall_ns"] + 1, "mono_ns": evs[-1]["mono_ns"] + 1}
    _write(log, evs + [stale])  # a applied a round of an epoch it had already left
    art = build_artifact([run])
    fencing = next(c for c in art["checks"] if c["name"] == "fencing")
    assert fencing["status"] == "fail", fencing
    assert any(stale["id"] in line and "epoch 1 after" in line for line in fencing["evidence"]), fencing


def test_different_frontiers_fail_the_same_frontier_checker(comparison, tmp_path):
    _out, index = comparison
    a = _copy_logs(_run(index, "stall"), tmp_path / "a")
    b = _copy_logs(_run(index, "oracle"), tmp_path / "b")
    for site in ("a", "b", "c"):
        log = b / "logs" / f"{site}.jsonl"
        _write(log, [{**e, "samples_sha256": "0" * 64} if e["event"] == "checkpoint_write" else e for e in _read(log)])
    st = _status(build_artifact([a, b]))
    assert st["same_frontier"] == "fail", st


def test_a_malformed_line_in_the_middle_of_a_log_is_reported_not_dropped(comparison, tmp_path):
    _out, index = comparison
    run = _copy_logs(_run(index, "oracle"), tmp_path / "run")
    log = run / "logs" / "b.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    lines.insert(5, '{"id": "b:x", "event": \n')
    log.write_text("".join(lines))
    art = build_artifact([run])
    integ = next(c for c in art["checks"] if c["name"] == "log_integrity")
    assert integ["status"] == "fail" and any("b.jsonl:6" in line for line in integ["evidence"]), integ


def test_an_event_with_a_malformed_envelope_fails_log_integrity_and_the_report_still_renders(comparison, tmp_path):
    """A line that parses but whose stamped fields are of the wrong type (a string mono_ns, a span's
    end missing) is named by log_integrity, and the analysis does not crash on it."""
    _out, index = comparison
    run = _copy_logs(_run(index, "oracle"), tmp_path / "run")
    log = run / "logs" / "c.jsonl"
    evs = _read(log)
    i_mono = next(i for i, e in enumerate(evs) if e["event"] == "work_attempted")
    evs[i_mono] = {**evs[i_mono], "mono_ns": "soon"}
    i_span = next(i for i, e in enumerate(evs) if e["event"] == "compute")
    evs[i_span] = {k: v for k, v in evs[i_span].items() if k != "end_mono_ns"}
    _write(log, evs)
    res = analyze([run], tmp_path / "out")
    integ = next(c for c in res.artifact["checks"] if c["name"] == "log_integrity")
    assert integ["status"] == "fail", integ
    assert any(f"c.jsonl:{i_mono + 1}: malformed envelope (event {evs[i_mono]['id']!r}" in line
               and "'mono_ns' is str 'soon', not int" in line for line in integ["evidence"]), integ["evidence"]
    assert any(f"c.jsonl:{i_span + 1}: malformed envelope (event {evs[i_span]['id']!r}" in line
               and "span bound 'end_mono_ns' is null, not int" in line for line in integ["evidence"]), integ["evidence"]
    assert "log_integrity" in res.report_path.read_text()


def test_a_crashing_checker_yields_unknown_and_the_report_still_renders(comparison, tmp_path, monkeypatch):
    _out, index = comparison
    run = _copy_logs(_run(index, "stall"), tmp_path / "run")

    def explodes(runs, ctx):
        raise KeyError("members")

    monkeypatch.setattr(chk, "CHECKERS", chk.CHECKERS + (("explodes", explodes),))
    monkeypatch.setattr("analysis.artifact.run_checkers",
                        lambda runs, ctx: chk.run_checkers(runs, ctx, chk.CHECKERS))
    res = analyze([run], tmp_path / "out")
    got = next(c for c in res.artifact["checks"] if c["name"] == "explodes")
    assert got["status"] == "unknown" and "KeyError" in got["error"], got
    assert "explodes" in res.report_path.read_text()


def test_logs_from_before_baselines_still_analyse_and_say_baselines_are_unavailable(comparison, tmp_path):
    _out, index = comparison
    run = _copy_logs(_run(index, "oracle"), tmp_path / "run")
    launcher = _read(run / "logs" / "launcher.jsonl")
    _write(run / "logs" / "launcher.jsonl", [e for e in launcher if e["event"] != "baselines"])
    for site in ("a", "b", "c"):  # older eval events carried only heldout_nll
        evs = _read(run / "logs" / f"{site}.jsonl")
        _write(run / "logs" / f"{site}.jsonl", [{k: v for k, v in e.items() if k not in (
            "eval_set", "eval_tokens", "heldout_nll_se", "eval_cpu_s")} if e["event"] == "eval" else e for e in evs])
    res = analyze([run], tmp_path / "out")
    lr = res.artifact["runs"][0]["learning"]
    assert lr["baselines"]["evidence"] == "unavailable" and lr["eval_set"]["evidence"] == "unavailable", lr
    assert lr["final_heldout_nll"] is not None  # the NLL itself is still there
    html = res.report_path.read_text()
    assert "data-learning-verdict='unavailable'" in html and "Baselines unavailable" in html
    assert "baselines unavailable" in html  # the chart's own note


# ------------------------------------------------------------------------------- sql
def test_sql_over_the_logs_agrees_with_the_artifact(comparison, analysed):
    out_dir, index = comparison
    _adir, art = analysed
    cols, rows = query([out_dir], "SELECT run, sum(tokens) AS tokens, count(*) AS n FROM work GROUP BY run")
    assert cols == ["run", "tokens", "n"]
    got = {run: tokens for run, tokens, _n in rows}
    want = {Path(r["run_dir"]).name: r["metrics"]["attempted_tokens"]["value"] for r in art["runs"]}
    assert got == want
    _c, rows = query([out_dir], "SELECT run, count(*) FROM commits GROUP BY run")
    assert {run: n for run, n in rows} == {Path(r["run_dir"]).name: r["work"]["commits"] for r in art["runs"]}


def test_xdc_sql_prints_a_table_and_reports_a_bad_query(comparison, capsys):
    out_dir, _ = comparison
    assert xdc_main(["sql", str(out_dir), "SELECT event, count(*) AS n FROM events GROUP BY event ORDER BY n DESC"]) == 0
    out = capsys.readouterr().out
    assert "event" in out and "commit" in out and "rows)" in out
    assert xdc_main(["sql", str(out_dir), "SELECT nope FROM events"]) == 2
    assert "nope" in capsys.readouterr().err
