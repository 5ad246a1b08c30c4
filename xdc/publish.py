"""`xdc publish`: copy a finished, clean result into results/, the committed published record.

    xdc publish SOURCE --name NAME [--results DIR] [--registry FILE]
    xdc publish --not-run NAME --section SECTION --state not-run|unavailable --reason TEXT --regenerate CMD
                [--detail TEXT ...]

SOURCE is a comparison directory (`xdc demo` / `xdc compare`, analysed), a study directory
(`xdc study run`) or a simulator report directory (`xdc sim report`). Publishing writes
results/NAME/result.json (what the result is, its state and provenance), a compact copy of the
artifact, and compact raw traces (the events a page loads on demand; the SHA-256 of every full log
they came from is recorded, and `regenerate` says how to make them again).

It refuses, naming the reason, a result that cannot be trusted as published:
  - a run made from a dirty tree, or runs made at more than one code revision, or at a commit this
    repository's history does not hold;
  - a study whose protocol no longer hashes to its registered SHA-256, or is not registered;
  - a study whose registry entry disagrees with the artifact (another state or conclusion);
  - a source that was never analysed (no artifact.json).
An invalidated study is published as `invalid`: a state, not a refusal. For a study the registry
entry gets the published artifact's relative path and hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ground.provenance import code_revision

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
KIND = "xdc-result/1"
# The seed page's sections, in its order, and the states a section can be in.
SECTIONS = ("recovery", "learning", "equal-work", "energy-meter", "energy-counter", "controller", "simulator")
STATES = ("claim", "no-claim", "invalid", "not-run", "unavailable")
STUDY_STATE = {"claim": "claim", "no_claim": "no-claim", "invalid": "invalid"}
# Which section a study's result fills, by protocol name.
STUDY_SECTION = {"learning-efficiency": "learning", "equal-work": "equal-work", "controller-heldout": "controller",
                 "cadence-continuation": "energy-counter"}


class PublishRefused(ValueError):
    """The source cannot be published; the message names why."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def commit_in_history(sha: str, root: Path = ROOT) -> bool:
    """Whether this repository holds the commit (so a published result names a revision one can check out)."""
    r = subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True)
    return r.returncode == 0


def one_clean_commit(revisions: list[tuple[str, dict[str, Any] | None]], root: Path = ROOT) -> str:
    """The one commit every run was made at. `revisions` is (run name, its code_revision) per run.
    Refuses a dirty tree, mixed revisions, an unrecorded revision and a commit not in the history."""
    if not revisions:
        raise PublishRefused("no run records: nothing to publish")
    missing = [name for name, rev in revisions if not rev or not rev.get("commit")]
    if missing:
        raise PublishRefused(f"no code revision recorded for {', '.join(missing[:5])}: provenance cannot be proven")
    dirty = [f"{name} (at {rev['commit'][:12]})" for name, rev in revisions if rev.get("dirty")]
    if dirty:
        raise PublishRefused(f"dirty tree at run time: {', '.join(dirty[:5])}"
                             f"{' and more' if len(dirty) > 5 else ''} ran with uncommitted changes; rerun from a "
                             "clean clone at one commit")
    commits = sorted({rev["commit"] for _, rev in revisions})
    if len(commits) > 1:
        raise PublishRefused(f"mixed code revisions: the runs were made at {len(commits)} commits "
                             f"({', '.join(c[:12] for c in commits)}); rerun from a clean clone at one commit")
    if not commit_in_history(commits[0], root):
        raise PublishRefused(f"commit {commits[0][:12]} is not in this repository's history: the result's code "
                             "cannot be checked out")
    return commits[0]


def _runtime(runtime: dict[str, Any] | None) -> dict[str, Any]:
    r = runtime or {}
    return {"python": r.get("python"), "torch": r.get("torch_in_site") or r.get("torch"),
            "device": r.get("device"), "platform": r.get("platform")}


def run_runtime(run_dir: Path) -> dict[str, Any]:
    """Python, torch, device and platform of a run, from its launcher's run_started event and its summary."""
    rt: dict[str, Any] = {}
    log = run_dir / "logs" / "launcher.jsonl"
    if log.is_file():
        with log.open() as f:
            for line in f:
                e = json.loads(line)
                if e.get("event") == "run_started":
                    rt = dict(e.get("runtime") or {})
                    break
    summary = run_dir / "summary.json"
    if summary.is_file():
        sm = json.loads(summary.read_text())
        rt.update({"device": sm.get("device"), "torch_in_site": sm.get("torch")})
    return _runtime(rt)


def _log_hashes(run_dir: Path) -> list[dict[str, Any]]:
    """The SHA-256 and size of every raw log of a run (the full traces, which are not copied)."""
    logs = run_dir / "logs"
    return [{"file": f"{run_dir.name}/logs/{p.name}", "sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(logs.glob("*.jsonl"))] if logs.is_dir() else []


def _write_json(path: Path, data: Any) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"
    path.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


# ---- compacting: what the page needs, not every column the analysis keeps -----------------------

def compact_run(run: dict[str, Any]) -> dict[str, Any]:
    """An analysed run without its per-phase columns (10^4-10^5 rows; the page draws the marks and the
    phases merged per site into spans) and without the full config (its hash stays in provenance)."""
    out = dict(run)
    tl = dict(run.get("timeline") or {})
    cols = tl.pop("phases", None)
    if cols:
        tl["spans"] = merged_spans(cols)
    out["timeline"] = tl
    return out


def merged_spans(cols: dict[str, list[Any]], gap_ns: int = 200_000_000) -> list[dict[str, Any]]:
    """Phases of one kind at one site, merged while less than `gap_ns` apart: a drawable outline of
    what each site was doing (compute, collective, checkpoint, recovery ...)."""
    rows = sorted(zip(cols["site"], cols["phase"], cols["start_ns"], cols["end_ns"]), key=lambda r: (r[0], r[1], r[2]))
    spans: list[dict[str, Any]] = []
    for site, phase, s, e in rows:
        last = spans[-1] if spans else None
        if last and last["site"] == site and last["phase"] == phase and int(s) - last["end_ns"] <= gap_ns:
            last["end_ns"] = max(last["end_ns"], int(e))
            last["n"] += 1
        else:
            spans.append({"site": site, "phase": phase, "start_ns": int(s), "end_ns": int(e), "n": 1})
    return spans


# ---- the three kinds of source ------------------------------------------------------------------

def _comparison(src: Path, art: dict[str, Any]) -> dict[str, Any]:
    commit = one_clean_commit([(r["run_id"], (r.get("provenance") or {}).get("code_revision")) for r in art["runs"]])
    prov = art["runs"][0].get("provenance") or {}
    checks = art.get("checks") or []
    failed = [c["name"] for c in checks if c.get("status") == "fail"]
    state = "no-claim" if failed or not art["comparison"].get("matched_frontier") else "claim"
    compact = {**art, "runs": [compact_run(r) for r in art["runs"]]}
    traces = []
    for r in art["runs"]:
        run_dir = Path(r["run_dir"])
        if not run_dir.is_dir():
            run_dir = src / Path(r["run_dir"]).name
        traces += _log_hashes(run_dir)
    return {"source_kind": "comparison", "sections": ["recovery"], "state": state,
            "artifact": compact, "raw_traces": traces, "code_commit": commit,
            "dataset_id": prov.get("dataset_id"), "runtime": _runtime(prov.get("runtime")),
            "run_dirs": [Path(r["run_dir"]) for r in art["runs"]]}


def _study(src: Path, art: dict[str, Any], registry: Path) -> dict[str, Any]:
    from studies.protocol import parse_protocol
    from studies.registry import protocol_hash, versions

    meta = json.loads((src / "study.json").read_text())
    if not art["study"].get("complete"):
        raise PublishRefused(f"study {meta['name']} is not complete ({art['study'].get('n_runs_finished')} of "
                             f"{art['study'].get('n_runs_planned')} runs): finish it with `xdc study run` first")
    p = parse_protocol((src / "protocol.yaml").read_text(), meta["protocol_file"], Path(meta["protocol_dir"]))
    h = protocol_hash(p)
    if h != meta["sha256"] or h != art["study"]["sha256"]:
        raise PublishRefused(f"protocol hash mismatch: {src}/protocol.yaml hashes to {h[:16]}…, the study recorded "
                             f"{meta['sha256'][:16]}… and its artifact {art['study']['sha256'][:16]}… (the protocol "
                             "or a scenario file it names was changed after the run)")
    entry = next((e for e in versions(p.name, registry) if e["sha256"] == h), None)
    if entry is None:
        raise PublishRefused(f"protocol {p.name} sha256 {h[:16]}… is not registered in {registry}: nothing proves it "
                             "was frozen before the runs")
    if entry["version"] != art["study"]["version"]:
        raise PublishRefused(f"registry entry disagrees: {registry} has {p.name} sha256 {h[:16]}… as version "
                             f"{entry['version']}, the artifact says version {art['study']['version']}")
    state = STUDY_STATE[art["conclusion"]["status"]]
    src_sha = sha256_file(src / "artifact.json")
    for res in entry.get("results", []):
        if res.get("artifact_sha256") == src_sha and (res.get("status") != art["conclusion"]["status"]
                                                      or res.get("conclusion") != art["conclusion"]["text"]):
            raise PublishRefused(f"registry entry disagrees: {p.name} version {entry['version']} records this artifact "
                                 f"as {res.get('status')!r} ({res.get('conclusion')!r}), the artifact says "
                                 f"{art['conclusion']['status']!r} ({art['conclusion']['text']!r})")
    commit = one_clean_commit([(r["key"], r.get("code_revision")) for r in art["runs"]])
    first = art["runs"][0]["record"] if art["runs"] else {}
    if p.arm(p.treatment).mode == "adaptive":
        art = {**art, "controller_view": controller_view(src, art),
               "controller_replay": controller_replay(src, art, {a.name for a in p.arms if a.mode == "adaptive"})}
    reg_rev = entry.get("code_revision") or {}
    traces = [t for r in art["runs"] for t in _log_hashes(_run_dir(src, r["run_dir"]))]
    return {"source_kind": "study", "sections": [STUDY_SECTION.get(p.name, p.name)], "state": state,
            "artifact": art, "raw_traces": traces, "code_commit": commit, "dataset_id": first.get("dataset_id"),
            "runtime": run_runtime(_run_dir(src, art["runs"][0]["run_dir"])) if art["runs"] else _runtime(None),
            "protocol": {"name": p.name, "version": entry["version"], "sha256": h, "file": entry.get("file"),
                         "registered_utc": entry.get("registered_utc"),
                         "registration_commit": reg_rev.get("commit"),
                         "registration_clean": reg_rev.get("dirty") is False},
            "run_dirs": [_run_dir(src, r["run_dir"]) for r in art["runs"]]}


LEDGER_KEYS = ("round", "epoch", "wall_ns", "mode", "inner_steps_h", "compression", "setting_source", "action",
               "action_reason", "members", "stress", "update_age_steps", "cos_to_mean", "useful_tokens",
               "attempted_tokens", "replayed_tokens", "wan_payload_bytes", "wan_time_s", "heldout_nll", "in_lineage")


def controller_view(src: Path, art: dict[str, Any]) -> dict[str, Any]:
    """The controller section's picture of one stratum: the treatment's and the comparator's settings on one
    time axis with their fault, membership, abstention and change marks, and each run's optimizer-commit
    ledger (analysis/controller_report.py on the two runs' logs). The stratum: the first of the evaluation
    split (protocol order) whose treatment run changed its setting, else the first of the split."""
    from analysis.artifact import build_artifact
    from analysis.controller_report import marks, setting_intervals

    st = art["study"]
    by = {(r["stratum"], r["arm"]): r for r in art["runs"] if not r["control"]}
    strata = list(dict.fromkeys(r["stratum"] for r in art["runs"] if r["split"] == st["evaluation_split"]
                                and not r["control"]))
    views: dict[str, Any] = {}
    for name in strata:
        t, c = by.get((name, st["treatment"])), by.get((name, st["control"]))
        if t is None or c is None:
            continue
        a = build_artifact([_run_dir(src, t["run_dir"]), _run_dir(src, c["run_dir"])])
        runs = []
        for arm, run in zip((st["treatment"], st["control"]), a["runs"]):
            runs.append({"arm": arm, "run_id": run["run_id"], "t0_wall_ns": run["t0_wall_ns"],
                         "intervals": setting_intervals(run), "marks": marks(run),
                         "commit_ledger": [{k: row.get(k) for k in LEDGER_KEYS} for row in run.get("commit_ledger") or []]})
        views[name] = runs
        if any(m["kind"] == "change" for m in runs[0]["marks"]):
            return {"stratum": name, "rule": "the first stratum of the evaluation split whose treatment run changed "
                                              "its setting", "runs": runs}
    if not views:
        return {"stratum": None, "rule": "no stratum has both runs", "runs": []}
    name = next(iter(views))
    return {"stratum": name, "rule": "no treatment run changed its setting: the first stratum of the evaluation split",
            "runs": views[name]}


def controller_replay(src: Path, art: dict[str, Any], adaptive_arms: set[str]) -> dict[str, Any]:
    """Every adaptive run's logged decisions replayed through its rule from its logged observations
    (control/replay.py): how many, and every one the replay does not reproduce exactly."""
    from control.replay import replay_decisions
    from ground.config import load_config
    from ground.eventlog import read_events

    n_runs = n_dec = 0
    bad: list[str] = []
    for r in art["runs"]:
        if r["arm"] not in adaptive_arms:
            continue
        d = _run_dir(src, r["run_dir"])
        cfg = load_config(json.loads((d / "config.json").read_text()))
        events = list(read_events(d / "logs" / "coord.jsonl"))
        n_runs += 1
        n_dec += sum(1 for e in events if e.get("event") == "controller_decision")
        bad += [f"{r['key']}: {b}" for b in replay_decisions(events, cfg)]
    return {"runs": n_runs, "decisions": n_dec, "mismatches": bad[:20], "n_mismatches": len(bad)}


def _run_dir(src: Path, recorded: str) -> Path:
    """A study's run directory: where the ledger recorded it, else under the study directory (moved)."""
    p = Path(recorded)
    return p if p.is_dir() else src / "runs" / p.name


def _simulator(src: Path, doc: dict[str, Any]) -> dict[str, Any]:
    emu_path = next(src.glob("emulator-analysis/**/artifact.json"), Path(doc["emulator_dir"]) / "artifact.json")
    emu = json.loads(emu_path.read_text())
    commit = one_clean_commit([(r["run_id"], (r.get("provenance") or {}).get("code_revision")) for r in emu["runs"]])
    sim_rev = doc.get("code_revision") or {}
    if not sim_rev.get("commit") or sim_rev.get("dirty"):
        raise PublishRefused("dirty tree at run time: the simulator ran with uncommitted changes (or recorded no "
                             "revision); rerun `xdc sim report` from a clean tree")
    if not commit_in_history(sim_rev["commit"]):
        raise PublishRefused(f"the simulator's commit {sim_rev['commit'][:12]} is not in this repository's history")
    sim_art = json.loads((src / "sim" / "artifact.json").read_text())
    status = [c["status"] for c in doc["claims"]]
    state = "no-claim" if "falsified" in status or "survived" not in status else "claim"
    prov = emu["runs"][0].get("provenance") or {}
    from sim.page import published_observations

    return {"source_kind": "simulator", "sections": ["simulator"], "state": state,
            "artifact": {"side_by_side": doc, "published_observations": published_observations(), "emulator": {**emu, "runs": [compact_run(r) for r in emu["runs"]]},
                         "simulator": {**sim_art, "runs": [compact_run(r) for r in sim_art["runs"]]}},
            "raw_traces": [t for r in emu["runs"] if Path(r["run_dir"]).is_dir() for t in _log_hashes(Path(r["run_dir"]))],
            "code_commit": commit, "simulator_commit": sim_rev["commit"],
            "extra_files": ({"calibration.json": Path(doc["calibration"])}
                            if doc.get("calibration") and Path(doc["calibration"]).is_file() else {}),
            "dataset_id": prov.get("dataset_id"), "runtime": _runtime(prov.get("runtime")), "run_dirs": []}


def _registry_update(registry: Path, protocol: dict[str, Any], art_path: Path, art: dict[str, Any],
                     commit: str, root: Path, source_sha: str) -> None:
    """The published copy replaces the source's own record (same artifact, a path outside the repository);
    earlier records of this version (other runs) stay beside it."""
    from studies.registry import read_registry, write_registry

    data = read_registry(registry)
    rel = str(art_path.resolve().relative_to(root.resolve())) if art_path.resolve().is_relative_to(root.resolve()) \
        else str(art_path)
    for e in data["studies"].get(protocol["name"], []):
        if e["sha256"] == protocol["sha256"]:
            res = [r for r in e.get("results", [])
                   if r.get("artifact_path") != rel and r.get("artifact_sha256") != source_sha]
            res.append({"artifact_path": rel, "artifact_sha256": sha256_file(art_path),
                        "conclusion": art["conclusion"]["text"], "status": art["conclusion"]["status"],
                        "code_commit": commit, "published": True})
            e["results"] = res
    write_registry(data, registry)


def publish(src: Path, name: str, results: Path = RESULTS, registry: Path | None = None,
            regenerate: str = "", root: Path = ROOT) -> dict[str, Any]:
    """Check and copy one result; returns result.json's content. Raises PublishRefused."""
    from studies.registry import REGISTRY

    registry = registry or REGISTRY
    art_path = src / "artifact.json"
    if not art_path.is_file():
        raise PublishRefused(f"{src}: no artifact.json; analyse it first (`xdc analyze {src}`, `xdc study report "
                             f"{src}` or `xdc sim report`)")
    art = json.loads(art_path.read_text())
    if (src / "study.json").is_file():
        got = _study(src, art, registry)
    elif art.get("kind") == "xdc-sim-side-by-side/1":
        got = _simulator(src, art)
    elif art.get("schema") == "xdc-artifact/1":
        got = _comparison(src, art)
    else:
        raise PublishRefused(f"{src}: not a comparison, study or simulator report (artifact kind "
                             f"{art.get('kind') or art.get('schema')!r})")
    out = results / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = {"artifact.json": _write_json(out / "artifact.json", got["artifact"])}
    for rel, path in got.get("extra_files", {}).items():  # e.g. the simulator's calibration
        shutil.copyfile(path, out / rel)
        files[rel] = sha256_file(out / rel)
    files.update(_write_traces(got, out))
    result = {"kind": KIND, "name": name, "sections": got["sections"], "state": got["state"],
              "source_kind": got["source_kind"], "source": src.name, "source_artifact_sha256": sha256_file(art_path),
              "provenance": {"code_commit": got["code_commit"], "clean_tree": True,
                             **({"simulator_commit": got["simulator_commit"]} if "simulator_commit" in got else {}),
                             "dataset_id": got["dataset_id"], "runtime": got["runtime"],
                             **({"protocol": got["protocol"]} if "protocol" in got else {}),
                             "published_by_commit": code_revision(root).get("commit")},
              "raw_traces": got["raw_traces"],
              "raw_traces_note": "the full JSON-lines logs these hashes name are not committed; `regenerate` makes "
                                 "them again (same commit, same seeds)",
              "files": files, "regenerate": regenerate}
    _write_json(out / "result.json", result)
    if "protocol" in got:
        _registry_update(registry, got["protocol"], out / "artifact.json", got["artifact"], got["code_commit"], root,
                         result["source_artifact_sha256"])
    return result


def _write_traces(got: dict[str, Any], out: Path) -> dict[str, str]:
    """Compact traces the page loads on demand: per run, the events a reader follows (JS files, so a page
    opened from disk can load them with a script tag). Returns {relative path: sha256}."""
    from studies.report import TRACE_EVENTS
    from studies.metrics import steady_logs

    keep = ("id", "event", "epoch", "round", "useful_tokens", "heldout_nll", "wall_ns", "members", "reason",
            "kind", "target", "policy", "site")
    events_of = (*TRACE_EVENTS, "fault_injected", "site_started", "restore", "rejoin", "preempt_notice")
    files: dict[str, str] = {}
    for run_dir in got["run_dirs"]:
        if not run_dir.is_dir():
            continue
        logs = steady_logs(run_dir)
        events = [{k: e[k] for k in keep if k in e}
                  for proc in sorted(logs) for e in logs[proc] if e.get("event") in events_of]
        events.sort(key=lambda e: int(e.get("wall_ns", 0)))
        key = trace_key(got["source_kind"], run_dir.name)
        path = out / "traces" / f"{key}.js"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = f"window.xdcTrace({json.dumps(key)}, {json.dumps({'run': run_dir.name, 'events': events})});\n"
        path.write_text(text)
        files[f"traces/{key}.js"] = hashlib.sha256(text.encode()).hexdigest()
    return files


def trace_key(kind: str, run_name: str) -> str:
    """The file name (and element id) of a run's compact trace: one rule for publish and the page."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{kind}-{run_name}")


def not_run(name: str, section: str, state: str, reason: str, regenerate: str, results: Path = RESULTS,
            details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A section with no publishable result: why, and what would produce one."""
    if section not in SECTIONS:
        raise PublishRefused(f"unknown section {section!r}; one of {', '.join(SECTIONS)}")
    if state not in ("not-run", "unavailable"):
        raise PublishRefused(f"a result without an artifact is not-run or unavailable, not {state!r}")
    if not reason.strip():
        raise PublishRefused("say why there is no result (--reason)")
    out = results / name
    if out.exists():
        shutil.rmtree(out)
    result = {"kind": KIND, "name": name, "sections": [section], "state": state, "reason": reason.strip(),
              "regenerate": regenerate, "details": details or {}}
    _write_json(out / "result.json", result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xdc publish", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", nargs="?", help="a comparison, study or simulator report directory")
    ap.add_argument("--name", help="the result's folder under results/ (default: the source's name)")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--registry", default=None, help="the study registry (default studies/registry.json)")
    ap.add_argument("--regenerate", default="", help="the command that regenerates this result")
    ap.add_argument("--not-run", metavar="NAME", help="record a section without a result instead")
    ap.add_argument("--section", choices=SECTIONS)
    ap.add_argument("--state", choices=("not-run", "unavailable"), default="not-run")
    ap.add_argument("--reason", default="")
    ap.add_argument("--detail", action="append", default=[], help="with --not-run: a paragraph the page shows "
                                                                  "under the reason (repeatable)")
    a = ap.parse_args(argv)
    try:
        if a.not_run:
            if not a.section:
                ap.error("--not-run needs --section")
            res = not_run(a.not_run, a.section, a.state, a.reason, a.regenerate, Path(a.results),
                          {"paragraphs": a.detail} if a.detail else None)
        else:
            if not a.source:
                ap.error("name a source directory (or --not-run NAME)")
            src = Path(a.source)
            res = publish(src, a.name or src.name, Path(a.results), Path(a.registry) if a.registry else None,
                          a.regenerate)
    except PublishRefused as e:
        print(f"xdc publish: refused: {e}", file=sys.stderr)
        return 2
    print(f"published {res['name']}: {', '.join(res['sections'])} -> {res['state']} "
          f"({Path(a.results) / res['name'] / 'result.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
