"""`xdc study ...`: register, check, run and report studies.

  xdc study register FILE [--registry R]     freeze the protocol: canonical SHA-256 + code revision
  xdc study check FILE [--registry R]        validate it, resolve every arm's run config, show registration
  xdc study run FILE [--out DIR] [--registry R] [--max-runs N] [--timeout-s S]
                                             run what the study's ledger has not finished, then report
  xdc study report DIR [--registry R]        artifact.json + report/index.html from the study's ledger
  xdc study paired-floor ARTIFACT            a published pilot's paired differences, for the next version's
                                             registration check (studies/paired_floor.py)

`run` refuses a protocol whose canonical hash is not its latest registration, and an arm whose run
config the config loader refuses (e.g. `train.mode: adaptive` before the adaptive controller lands).
The study directory (default runs/studies/<name>-v<version>) holds ledger.jsonl, study.json (which
protocol, which hash), protocol.yaml (a copy of the file as run), runs/, artifact.json, report/.
`register` checks first that every gate can decide (studies/decidability.py) and refuses one that cannot.
A finished study's conclusion reaches the committed registry through `xdc publish` only, so `make
studies` from a clean clone leaves the tree clean (every study's runs at one clean commit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from studies.protocol import arm_configs, load_protocol, parse_protocol, run_config_dict
from studies.protocol_model import Protocol, ProtocolError
from studies.registry import REGISTRY, RegistrationError, check, protocol_hash, read_registry, register, versions
from studies.registry import write_registry

ROOT = Path(__file__).resolve().parent.parent


def default_dir(p: Protocol, version: int) -> Path:
    return ROOT / "runs" / "studies" / f"{p.name}-v{version}"


def earlier_versions(name: str, version: int, registry: Path) -> list[dict[str, Any]]:
    out = []
    for e in versions(name, registry):
        if e["version"] >= version:
            continue
        res = (e.get("results") or [None])[-1]
        out.append({"version": e["version"], "sha256": e["sha256"], "registered_utc": e.get("registered_utc"),
                    "artifact_path": res["artifact_path"] if res else None,
                    "artifact_sha256": res["artifact_sha256"] if res else None,
                    "conclusion": res["conclusion"] if res else "not run to completion under this version"})
    return out


def record_result(name: str, sha: str, artifact_path: Path, art: dict[str, Any], registry: Path) -> None:
    """Keep the conclusion of a complete study with its registry entry (for later versions' pages)."""
    data = read_registry(registry)
    here = artifact_path.resolve()
    # Relative to the repository where it lies inside it: the registry is committed, machines differ.
    path = str(here.relative_to(ROOT)) if here.is_relative_to(ROOT) else str(artifact_path)
    for e in data["studies"].get(name, []):
        if e["sha256"] == sha:
            res = [r for r in e.get("results", []) if r["artifact_path"] != path]
            res.append({"artifact_path": path, "conclusion": art["conclusion"]["text"],
                        "status": art["conclusion"]["status"],
                        "artifact_sha256": hashlib.sha256(artifact_path.read_bytes()).hexdigest()})
            e["results"] = res
    write_registry(data, registry)


def make_report(study_dir: Path, registry: Path, notes: list[str] | None = None) -> dict[str, Any]:
    from studies.artifact import build_artifact, validate
    from studies.ledger import Ledger
    from studies.report import write_report

    meta = json.loads((study_dir / "study.json").read_text())
    p = parse_protocol((study_dir / "protocol.yaml").read_text(), meta["protocol_file"], Path(meta["protocol_dir"]))
    if protocol_hash(p) != meta["sha256"]:
        raise RegistrationError(f"{study_dir}/protocol.yaml no longer hashes to the study's {meta['sha256'][:16]}… "
                                "(a scenario file it names changed since the run)")
    entry = next((e for e in versions(p.name, registry) if e["sha256"] == meta["sha256"]), None)
    if entry is None:
        raise RegistrationError(f"study {p.name!r} sha256 {meta['sha256'][:16]}… is not in {registry}")
    ledger = Ledger(study_dir / "ledger.jsonl")
    art = build_artifact(p, entry, ledger.finished(), earlier_versions(p.name, entry["version"], registry), study_dir,
                         notes)
    validate(art)
    path = study_dir / "artifact.json"
    path.write_text(json.dumps(art, indent=1, sort_keys=True))
    report = write_report(art, study_dir / "report")
    # The committed registry records published results only (`xdc publish`): writing it here would make the
    # tree dirty, and the next study run from the same clean clone would be recorded as dirty. A scratch
    # registry keeps every finished study's conclusion.
    if art["study"]["complete"] and registry.resolve() != REGISTRY.resolve():
        record_result(p.name, meta["sha256"], path, art, registry)
    return {"artifact": art, "artifact_path": path, "report_path": report}


def refuse_dirty_registration(rev: dict[str, Any], registry: Path) -> None:
    """The committed registry (studies/registry.json) takes a registration only from a clean tree at a
    recorded commit: otherwise "frozen before the runs" cannot be proven from the history. A registry
    elsewhere (a scratch one) records the tree as it was, dirty or not."""
    if registry.resolve() != REGISTRY.resolve():
        return
    if not rev.get("commit") or rev.get("dirty") is not False:
        why = "uncommitted changes in tracked files" if rev.get("dirty") else rev.get("reason", "no git revision")
        raise RegistrationError(f"refusing to register in {registry} from a dirty tree ({why}) at "
                                f"{str(rev.get('commit'))[:12]}: commit first, so the registration names a "
                                "revision that holds exactly this protocol and code")


def control_noise_floor(p: Protocol) -> dict[str, Any]:
    """The noise-floor record measured for this protocol's control arm at its recipe (`xdc noise-floor --study
    FILE --arm ARM`, bench/results/): a record of this study and a candidate control arm whose learning config,
    recomputed from this protocol at the record's stratum, hashes as the record's. With several candidates (a
    comparator rule), the largest threshold (the one that asks most of a margin). Else why none applies."""
    from analysis.learning_refs import noise_floor_records
    from analysis.noise_floor_record import learning_config_hash, record_config_hash
    from ground.config import ConfigError, load_config, to_dict

    arms = list(p.comparator.choose_from) if p.comparator is not None else [p.control]
    found: list[dict[str, Any]] = []
    for path in noise_floor_records():
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        src = rec.get("source") or {}
        if src.get("study") != p.name or src.get("arm") not in arms:
            continue
        stratum = next((s for s in p.strata if s.name == src.get("stratum")), None)
        if stratum is None:
            continue
        try:
            cfg = to_dict(load_config(run_config_dict(p, stratum, p.arm(src["arm"]))))
        except ConfigError:
            continue
        if learning_config_hash(cfg) == record_config_hash(rec):
            found.append({"evidence": "measured", "record_file": path.name, "arm": src["arm"],
                          **{k: rec.get(k) for k in ("threshold_nats", "mean_nll", "std_nll", "n_seeds")}})
    if not found:
        return {"evidence": "unavailable",
                "reason": f"no noise-floor record in bench/results for {p.name}'s control arm ({', '.join(arms)}) at "
                          f"this recipe; measure it first: xdc noise-floor --study {p.source} --arm {arms[0]}"}
    return max(found, key=lambda r: r["threshold_nats"] or 0.0)


def pre_run_checks(p: Protocol) -> dict[str, Any]:
    """Whether each gate can pass and can fail with this protocol's pairs, alpha and margin, against the
    control arm's noise floor (studies/decidability.py)."""
    from studies.decidability import check_protocol

    from studies.paired_floor import find_record

    floor = control_noise_floor(p)
    n_pairs = sum(1 for s in p.strata if s.split == p.evaluation_split)
    controls = list(p.comparator.choose_from) if p.comparator is not None else [p.control]
    evaluated = [s.name for s in p.strata if s.split == p.evaluation_split]
    pilot = find_record(p.name, p.version, p.treatment, controls, strata=evaluated, split=p.evaluation_split)
    # A gate on a named contrast (a factorial block) is not a treatment - control pair: no pilot applies.
    gates = [{"name": g.name, "metric": g.metric, "kind": g.kind, "margin": g.margin, "alpha": g.alpha,
              "relative": g.relative, "direction": g.direction, "contrast": g.contrast} for g in p.gates]
    plain = check_protocol([g for g in gates if not g["contrast"]], n_pairs, floor, pilot)
    contrast = check_protocol([g for g in gates if g["contrast"]], n_pairs, floor)
    by_name = {c["gate"]: c for c in plain + contrast}
    return {"noise_floor": floor, "n_pairs": n_pairs,
            "paired_floor": ({"evidence": "measured", "record_file": pilot["record_file"], **pilot["source"]}
                             if pilot else {"evidence": "unavailable",
                                            "reason": f"no pilot for {p.name} v{p.version} in bench/results "
                                                      f"(xdc study paired-floor results/{p.name}-v<N>/artifact.json)"}),
            "gates": [by_name[g["name"]] for g in gates]}


def cmd_register(a: argparse.Namespace) -> int:
    from ground.provenance import code_revision

    p = load_protocol(a.file)
    try:
        arm_configs(p)
    except ProtocolError as e:
        print(f"warning: {e}\n  (registered anyway: the design is frozen; `xdc study run` refuses it until the "
              "config loader accepts it)", file=sys.stderr)
    # The registry's own earlier registrations of this commit do not make the tree dirty: several
    # protocols are registered at one commit, then the registry is committed.
    reg = Path(a.registry).resolve()
    own = (str(reg.relative_to(ROOT)),) if reg.is_relative_to(ROOT) else ()
    rev = code_revision(ignoring=own)
    refuse_dirty_registration(rev, Path(a.registry))
    checks = None
    if not any(e["sha256"] == protocol_hash(p) for e in versions(p.name, Path(a.registry))):
        from studies.decidability import refusal

        checks = pre_run_checks(p)
        for c in checks["gates"]:
            print(f"  gate {c['gate']:<30} {c['status']:<13} {c['reason']}")
        why = refusal(checks["gates"])
        if why:
            raise RegistrationError(f"refusing to register {p.name}: a gate cannot decide with {checks['n_pairs']} "
                                    f"pairs: {why}. Change the margin, alpha or the number of pairs")
    entry = register(p, a.file, rev, Path(a.registry), decidability=checks)
    if entry.get("already"):
        print(f"{p.name}: already registered as version {entry['version']} (sha256 {entry['sha256']})")
    else:
        print(f"registered {p.name} version {entry['version']}: sha256 {entry['sha256']} at code revision "
              f"{str(rev.get('commit'))[:12]}{' (dirty)' if rev.get('dirty') else ''} in {a.registry}")
    return 0


def cmd_check(a: argparse.Namespace) -> int:
    p = load_protocol(a.file)
    print(f"{p.name}: {len(p.arms)} arms, {len(p.strata)} strata, {len(p.gates)} gates; sha256 {protocol_hash(p)}")
    arm_configs(p)
    entry = check(p, Path(a.registry))
    print(f"registered version {entry['version']} ({entry.get('registered_utc')}): matches")
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    from studies.runner import run_study

    p = load_protocol(a.file)
    registry = Path(a.registry)
    entry = check(p, registry)
    out = Path(a.out) if a.out else default_dir(p, entry["version"])
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "study.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta["sha256"] != entry["sha256"]:
            print(f"study error: {out} holds version {meta.get('version')} (sha256 {meta['sha256'][:16]}…) of "
                  f"{p.name}; use another --out for version {entry['version']}", file=sys.stderr)
            return 2
    else:
        meta_path.write_text(json.dumps({"name": p.name, "version": entry["version"], "sha256": entry["sha256"],
                                         "protocol_file": str(a.file),
                                         "protocol_dir": str(Path(a.file).resolve().parent),
                                         "registry": str(registry.resolve())}, indent=1))
        (out / "protocol.yaml").write_text(Path(a.file).read_text())
    res = run_study(p, entry, out, timeout_s=a.timeout_s, max_runs=a.max_runs)
    print(f"study {p.name}: ran {len(res['ran'])}, skipped {len(res['skipped'])} already finished"
          + (f"; {res['stopped']}" if res["stopped"] else ""))
    rep = make_report(out, registry, res["notes"])
    art = rep["artifact"]
    print(f"conclusion: {art['conclusion']['text']}")
    for g in art["gates"]:
        print(f"  gate {g['name']:<22} {g['status']:<7}{' VACUOUS' if g['vacuous'] else ''}  {g['reason']}")
    print(f"artifact: {rep['artifact_path']}\nreport:   {rep['report_path']}")
    if res["done"]:
        print(f"publish:  xdc publish {out} --name {p.name}  (into results/, the committed record)")
    return 0 if res["done"] else 3


def cmd_report(a: argparse.Namespace) -> int:
    rep = make_report(Path(a.dir), Path(a.registry))
    print(f"conclusion: {rep['artifact']['conclusion']['text']}\nartifact: {rep['artifact_path']}\n"
          f"report:   {rep['report_path']}")
    return 0


def cmd_paired_floor(a: argparse.Namespace) -> int:
    from studies.paired_floor import write_record

    src = Path(a.artifact)
    if not src.is_file():
        raise ProtocolError(f"{src}: no such artifact (a published study: results/<study>-v<N>/artifact.json)")
    try:
        out = write_record(src)
    except (ValueError, KeyError) as e:
        raise ProtocolError(f"{src}: not a study artifact with paired differences ({type(e).__name__}: {e})") from e
    rec = json.loads(out.read_text())
    for m, v in sorted(rec["metrics"].items()):
        if v.get("evidence") != "unavailable":
            rel = v.get("relative_robust_sd")
            print(f"  {m:<20} n {v['n']}  robust sd {v['robust_sd']:.4g}"
                  + (f"  relative {rel:.4g}" if rel is not None else ""))
    print(f"paired floor of {rec['source']['study']} v{rec['source']['version']} "
          f"({rec['source']['treatment']} - {rec['source']['control']}): {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from chaos.scenario import ScenarioError
    from chaos.reach import ScenarioBeyondRun

    ap = argparse.ArgumentParser(prog="xdc study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("register", "check", "run"):
        sp = sub.add_parser(name)
        sp.add_argument("file", help="a protocol file (studies/protocols/*.yaml)")
        sp.add_argument("--registry", default=str(REGISTRY), help="the registry file (default studies/registry.json)")
        if name == "run":
            sp.add_argument("--out", help="the study directory (default runs/studies/<name>-v<version>)")
            sp.add_argument("--max-runs", type=int, help="stop after this many runs (resume later)")
            sp.add_argument("--timeout-s", type=float, default=3600.0, help="limit per run")
    sp = sub.add_parser("report")
    sp.add_argument("dir", help="a study directory")
    sp.add_argument("--registry", default=str(REGISTRY))
    sp = sub.add_parser("paired-floor", help="the paired differences of a published pilot, for the next version's "
                                             "registration check (bench/results/paired_floor_<study>-v<N>.json)")
    sp.add_argument("artifact", help="a published study artifact (results/<study>-v<N>/artifact.json)")
    a = ap.parse_args(argv)
    try:
        return {"register": cmd_register, "check": cmd_check, "run": cmd_run, "report": cmd_report,
                "paired-floor": cmd_paired_floor}[a.cmd](a)
    except ProtocolError as e:
        print(f"protocol error: {e}", file=sys.stderr)
        return 2
    except RegistrationError as e:
        print(f"registration error: {e}", file=sys.stderr)
        return 2
    except (ScenarioError, ScenarioBeyondRun) as e:
        print(f"scenario error: {e}", file=sys.stderr)
        return 2
