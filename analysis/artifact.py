"""The analysis artifact: one schema-versioned JSON document for one run or a comparison.

`build_artifact(run_dirs, index)` reads only the runs' logs and manifests (analysis.load),
derives the ledgers (analysis.summary), the timelines (analysis.timeline) and the checks
(analysis.checkers), and returns a dict that `validate_artifact` checks against
`artifact.schema.json`. Every number in it says what it is: a quantity is
`{"value", "unit", "evidence"}` with evidence one of measured / modeled / prior / unavailable,
and every section carries the evidence class of all the numbers in it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from analysis.checkers import run_checkers
from analysis.commit_ledger import commit_ledger
from analysis.energy import energy_metric, energy_section
from analysis.learning_refs import learning_refs
from analysis.load import RunHistory, load_run
from analysis.proofs import fault_schedule, prove_frontier
from analysis.ledgers import lineage
from analysis.simulated import as_modeled, sim_manifest
from analysis.run_numbers import RunNumbers, matched_frontier, nll_curve, run_numbers
from ground.faults import links_hit
from analysis.timeline import (PHASES, extract_marks, extract_phases, frontier_progress, run_end_ns,
                               run_t0_ns)

SCHEMA_VERSION = 1
SCHEMA_ID = "xdc-artifact/1"
SCHEMA_PATH = Path(__file__).with_name("artifact.schema.json")
EVIDENCE = ("measured", "modeled", "prior", "unavailable")
# FLOPs are not read from a counter per step: they are a measured rate times a count, so "modeled".
FLOPS_DERIVED = ("flops_per_token (measured once per site process by torch.utils.flop_counter.FlopCounterMode on "
                 "one forward + backward of one batch; matmuls and attention only) x tokens counted from the sites' "
                 "work_attempted events; assumes every step costs what the probe step did")


PHASE_COLUMNS = ("site", "phase", "start_ns", "end_ns", "event_id")


def columns(rows: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, list[Any]]:
    """Rows -> one list per column: a long run has ~10^5 phases, and columns keep the artifact small
    and quick to validate."""
    return {n: [r[n] for r in rows] for n in names}


def quantity(value: Any, unit: str, evidence: str = "measured", **extra: Any) -> dict[str, Any]:
    """A quantity with its unit and evidence class."""
    assert evidence in EVIDENCE, evidence
    return {"value": value, "unit": unit, "evidence": evidence, **extra}


def _connections(h: RunHistory) -> dict[str, int]:
    """Connections made per link (first connect, reconnects, failed handshakes): each costs handshake bytes."""
    n: dict[str, int] = defaultdict(lambda: 1)
    for proc in h.logs:
        for e in h.events(proc, "link_up") + h.events(proc, "handshake_failed"):
            if e.get("link"):
                n[e["link"]] += 1
    return dict(n)


def _killed_in_flight(h: RunHistory) -> dict[str, int]:
    """Bytes per link that a killed sender may have had in flight when it died.

    An incarnation (pid) that never logged its `final` counters was killed. A message it was
    handing over at that moment may have partly entered the proxy, so Toxiproxy counts bytes
    that neither its last counters nor any receiver (who never got a whole message) hold. That
    is at most the collective round it was sending: per link it sends on, the largest
    `payload_bytes_sent` of its `collective` events (all peers together, so an upper bound).
    """
    links = {e["proxy"] for p in ("launcher", "prepare") for e in h.logs.get(p, []) if e["event"] == "proxy_created"}
    out: dict[str, int] = defaultdict(int)
    for proc, evs in h.logs.items():
        final = {e.get("pid") for e in evs if e["event"] == "wan_counters" and e.get("final")}
        largest: dict[Any, int] = defaultdict(int)
        pids = set()
        for e in evs:
            pids.add(e.get("pid"))
            if e["event"] == "collective" and "payload_bytes_sent" in e:
                largest[e.get("pid")] = max(largest[e.get("pid")], int(e["payload_bytes_sent"]))
        killed = pids - final
        allowance = sum(largest[p] for p in killed)
        if not allowance:
            continue
        for link in links:
            if link.startswith(f"{proc}_to_") or link.endswith(f"_to_{proc}"):
                out[link] += allowance
    return dict(out)


def _retransmitted(h: RunHistory) -> dict[str, int]:
    """Wire bytes each link carried again after a reconnect or a stall (`retransmit` events).

    A sender counts a message when it hands it to ZeroMQ; if the peer is gone, ZeroMQ may drop
    the queued copy and the resend is counted again. So on such a link the classes may exceed
    Toxiproxy's count by up to these bytes (copies that never reached the wire).
    """
    links = {e["proxy"] for e in h.logs.get("launcher", []) + h.logs.get("prepare", []) if e["event"] == "proxy_created"}
    out: dict[str, int] = defaultdict(int)
    for proc in h.logs:
        for e in h.events(proc, "retransmit"):
            if e.get("dest"):
                fwd, back = f"{proc}_to_{e['dest']}", f"{e['dest']}_to_{proc}"
                out[fwd if fwd in links or back not in links else back] += int(e.get("wire_bytes", 0))
    return dict(out)


def _faulted_links(h: RunHistory) -> set[str]:
    """Links with an end in a process that a fault hit, or that a link fault cut or shaped
    (ground/faults.py says which), or in a process that was restarted."""
    links = {e["proxy"] for p in ("launcher", "prepare") for e in h.events(p, "proxy_created")}
    out = {lk for e in h.events("chaos", "fault_injected")
           for lk in links_hit(str(e.get("kind", "")), str(e.get("target", "")), links)}
    restarted = {p for p, evs in h.logs.items() if evs and evs[0].get("pid") != evs[-1].get("pid")}
    return out | {lk for lk in links if any(lk.startswith(f"{x}_to_") or lk.endswith(f"_to_{x}") for x in restarted)}


def _fate_of_lost_units(h: RunHistory, work: dict[str, Any]) -> dict[str, Any]:
    """Why each lost unit was lost: its round never committed (aborted / rolled back), or the round
    committed without this site, or committed on a branch the final lineage abandoned."""
    commits = h.events("coord", "commit")
    kept = {(c["epoch"], c["round"]) for c in lineage(commits)}
    any_commit = {(c["epoch"], c["round"]): c for c in commits}
    fates: dict[str, int] = defaultdict(int)
    units = []
    for u in work["lost_units"]:
        key = (u["epoch"], u["round"])
        if key in any_commit and key not in kept:
            why = "abandoned_branch"
        elif key in any_commit:
            why = "committed_without_site"
        else:
            why = "round_never_committed"
        fates[why] += u["tokens"]
        units.append({**u, "fate": why})
    return {"lost_tokens_by_reason": dict(fates), "lost_units": units}


def _learning(n: RunNumbers, t0: int) -> dict[str, Any]:
    """The NLL curve, the evaluation set it was measured on (hash, size, standard error) and the
    count baselines of that set (measured by the launcher), or why they are unavailable."""
    evals = n.evals
    curve = nll_curve(evals, t0)
    final = curve[-1]["heldout_nll"] if curve else None
    last = evals[-1] if evals else {}
    if last.get("eval_set"):
        sets = sorted({str(e.get("eval_set")) for e in evals})
        def mq(v: Any, unit: str, **kw: Any) -> dict[str, Any]:
            return quantity(v, unit, "measured" if v is not None else "unavailable", **kw)

        eval_set = {"evidence": "measured", "id": last["eval_set"], "tokens": mq(last.get("eval_tokens"), "tokens"),
                    "final_nll_se": mq(last.get("heldout_nll_se"), "nats/token", note="standard error of the mean "
                                       "NLL over the evaluation windows"),
                    "eval_cpu_s": mq(last.get("eval_cpu_s"), "s", note="CPU time of the last evaluation"),
                    **({"all_ids": sets} if len(sets) > 1 else {})}
    else:
        eval_set = {"evidence": "unavailable",
                    "reason": "no eval events" if not evals else "the eval events do not name their evaluation set "
                                                                 "(older logs)"}
    return {"evidence": "measured", "unit": "nats/token", "curve": curve,
            "initial_heldout_nll": curve[0]["heldout_nll"] if curve else None, "final_heldout_nll": final,
            "eval_set": eval_set, "baselines": n.baselines}


def _provenance(h: RunHistory) -> dict[str, Any]:
    started = next((e for p in ("launcher", "prepare") for e in h.logs.get(p, []) if e["event"] == "run_started"), None)
    site = next((e for s in h.sites for e in h.logs.get(s, []) if e["event"] == "site_started"), {})
    rev = (started or {}).get("code_revision") or {
        "commit": None, "evidence": "unavailable", "reason": "no run_started event in the logs (older run)"}
    runtime = dict((started or {}).get("runtime") or {})
    runtime.update({"device": site.get("device"), "torch_in_site": site.get("torch"), "threads": site.get("threads")})
    scen = h.scenario
    return {
        "code_revision": rev,
        "dataset_id": site.get("dataset_id"),
        "runtime": runtime,
        "scenario": {"name": scen.get("name"), "description": scen.get("description"),
                     "sha256": h.input_hashes.get("scenario.json")} if scen else None,
        "policy": h.policy,
        "config_sha256": h.input_hashes.get("config.json"),
        "input_hashes": dict(sorted(h.input_hashes.items())),
        "n_params": site.get("n_params"),
        "flops_per_token": quantity(site.get("flops_per_token"), "FLOP/token", "measured",
                             source="torch.utils.flop_counter.FlopCounterMode"),
    }


WALL_STEP_NOTED_S = 0.5  # a step of the host's wall clock (NTP) larger than this is said on the page


def _elapsed_ns(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Nanoseconds from event a to event b on the monotonic clock, which every process on the host
    shares and no clock adjustment steps (wall_ns only where an event lacks it). A wall-clock step
    of 19.6 s during one emulated run once put its time to target 15 % off its repeat's."""
    if a.get("mono_ns") is not None and b.get("mono_ns") is not None:
        return int(b["mono_ns"]) - int(a["mono_ns"])
    return int(b["wall_ns"]) - int(a["wall_ns"])


def wall_clock_step_s(h: RunHistory) -> float:
    """How far the wall clock moved against the monotonic one over the run (0 if it never stepped),
    measured as the logs were loaded (analysis/clock.py)."""
    return h.clock.step_ns / 1e9


def _clock_note(h: RunHistory, step_s: float) -> str:
    """What the page says about a step of the host's wall clock ('' for none worth saying)."""
    if step_s <= WALL_STEP_NOTED_S:
        return ""
    where = ("every time on this page is on the monotonic clock, anchored to the wall clock at the run's "
             "first event" if h.clock.steady else
             "the logs lack monotonic stamps, so timelines drawn on the wall clock are off by as much")
    return f"; the host's wall clock stepped by {step_s:.1f} s during the run ({where})"


def _metrics(h: RunHistory, n: RunNumbers, site_seconds: dict[str, dict[str, float]], learning: dict[str, Any],
             energy: dict[str, Any]) -> dict[str, Any]:
    """The run's headline quantities, each with its unit and evidence class."""
    total = n.work["total"]
    first_epoch = next(iter(h.events("coord", "membership_epoch")), None)
    active_ns = _elapsed_ns(first_epoch, n.commits[-1]) if (n.commits and first_epoch) else None
    step_s = wall_clock_step_s(h)
    lc, final = learning["curve"], learning["final_heldout_nll"]

    def flops(k: str) -> dict[str, Any]:
        return quantity(float(total.get(k, 0)), "FLOP", "modeled", derived=FLOPS_DERIVED)

    return {
        "useful_tokens": quantity(n.work["useful_tokens"], "tokens"),
        "target_useful_tokens": quantity(int(h.config["train"]["target_useful_tokens"]), "tokens", "prior",
                                  note="the configured target"),
        **{k: quantity(int(total.get(k, 0)), "tokens") for k in ("attempted_tokens", "retained_tokens", "lost_tokens",
                                                          "replayed_tokens")},
        **{k: flops(k) for k in ("attempted_flops", "retained_flops", "lost_flops")},
        "final_heldout_nll": quantity(final, "nats/token", "measured" if final is not None else "unavailable",
                               se=lc[-1]["heldout_nll_se"] if lc else None),
        "active_time": quantity(active_ns / 1e9 if active_ns is not None else None, "s",
                         "measured" if active_ns is not None else "unavailable",
                         note="first membership epoch to the last commit, on the monotonic clock"
                              + _clock_note(h, step_s)),
        "idle_time_all_sites": quantity(sum(v["idle_s"] for v in site_seconds.values()), "s"),
        "energy": energy_metric(energy),
    }


def _work(h: RunHistory, work: dict[str, Any]) -> dict[str, Any]:
    return {"evidence": "measured", "unit": "tokens / FLOP", "flops_evidence": "modeled",
            "flops_derived": FLOPS_DERIVED, "per_site": work["per_site"],
            "total": dict(work["total"]), "balanced": work["balanced"],
            "useful_samples": work["useful_samples"], "replayed_samples": work["replayed_samples"],
            "commits": work["commits"], "lineage_length": work["lineage_length"], **_fate_of_lost_units(h, work)}


def analyse_run(h: RunHistory) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run's artifact section, the derived data the checkers need)."""
    cfg, sites = h.config, h.sites
    n = run_numbers(h)  # the numbers summary.json shows too (analysis/run_numbers.py)
    work, nbytes = n.work, n.bytes
    t0, t1 = run_t0_ns(h), run_end_ns(h)
    proof = prove_frontier(h)
    frontier = {**n.frontier, "proof": proof.to_dict()}
    faults = fault_schedule(h)
    energy = energy_section(h, work["useful_tokens"])  # analysis/energy.py: validity first, then phases
    learning = _learning(n, t0)
    section = {
        "run_id": h.run_id, "policy": h.policy, "mode": cfg["train"]["mode"], "sites": sites,
        "run_dir": str(h.run_dir), "n_events": h.n_events(), "t0_wall_ns": t0, "end_wall_ns": t1,
        "duration": quantity((t1 - t0) / 1e9, "s"),
        "metrics": _metrics(h, n, n.site_time, learning, energy),
        "work": _work(h, work),
        "bytes": {"evidence": "measured", "unit": "bytes", "by_class": nbytes["by_class"],
                  "by_link": nbytes["by_link"], "by_link_class": nbytes["by_link_class"],
                  "processes_without_counters": nbytes["processes_without_counters"]},
        "reconciliation": n.reconciliation,
        "frontier": frontier,
        "frontier_progress": frontier_progress(h, int(cfg["model"]["seq_len"])),
        "checkpoint_tree": n.checkpoint_tree,
        "learning": learning,
        "site_time": {"evidence": "measured", "unit": "s", "per_site": n.site_time},
        "timeline": {"evidence": "measured", "unit": "wall-clock ns",
                     "phases": columns(extract_phases(h), PHASE_COLUMNS),
                     "marks": extract_marks(h, work["first_replays"])},
        "faults": [{"kind": e.get("kind"), "target": e.get("target"), "event_id": e["id"],
                    "wall_ns": e["wall_ns"], "t_s": (int(e["wall_ns"]) - t0) / 1e9}
                   for e in h.events("chaos", "fault_injected")],
        "fault_schedule": faults.to_dict(),
        "provenance": _provenance(h),
        "energy": energy,
        "bad_lines": [b.__dict__ for b in h.bad_lines],
        "config": cfg,
        # The optimizer-commit ledger: setting, decision, disagreement, work, WAN per commit (issue 12).
        "commit_ledger": commit_ledger(h.events("coord"), h.events("chaos"),
                                       [e for site in sites for e in h.events(site, "eval")], cfg),
    }
    derived = {"work": work, "bytes": nbytes, "reconciliation": n.reconciliation, "frontier": frontier,
               "duration_s": (t1 - t0) / 1e9, "connections": _connections(h), "faulted_links": _faulted_links(h),
               "retransmitted": _retransmitted(h), "in_doubt": nbytes["in_doubt"],
               "killed_in_flight": _killed_in_flight(h), "proof": proof, "faults": faults}
    return section, derived


def build_artifact(run_dirs: list[Path], index: dict[str, Any] | None = None,
                   histories: list[RunHistory] | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    hs = histories if histories is not None else [load_run(p) for p in run_dirs]
    sections, ctx = [], {k: {} for k in ("work", "bytes", "reconciliation", "frontier", "duration_s", "connections",
                                         "faulted_links", "retransmitted", "in_doubt", "killed_in_flight", "proof",
                                         "faults")}
    for h in hs:
        sec, derived = analyse_run(h)
        if (manifest := sim_manifest(h.run_dir)) is not None:  # a simulated run: nothing in it was measured
            sec = as_modeled(sec, manifest)
        sections.append(sec)
        for k in ctx:
            ctx[k][h.run_id] = derived[k]
    checks = run_checkers(hs, ctx)
    hashes = [s["frontier"]["hash"] for s in sections]
    proven = [s["frontier"]["proof"]["retained_sha256"] for s in sections]
    proof_ok = all(not s["frontier"]["proof"]["problems"] for s in sections)
    scen = next((h.scenario for h in hs if h.scenario), None)
    scen_hashes = sorted({h.input_hashes.get("scenario.json") for h in hs if h.input_hashes.get("scenario.json")})
    art = {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "kind": "comparison" if len(hs) > 1 else "run",
        "generated": {"wall_ns": time.time_ns(), "by": "xdc analyze",
                      "analysis_s": None},  # filled at the end
        "scenario": {"name": scen.get("name"), "description": scen.get("description"), "faults": scen.get("faults"),
                     "sha256": scen_hashes} if scen else None,
        "runs": sections,
        "comparison": {
            "policies": [s["policy"] for s in sections],
            "frontier_hashes": dict(zip([s["run_id"] for s in sections], hashes)),
            # Matched only when the logged hashes agree *and* the samples recomputed from each run's lineage do.
            "matched_frontier": matched_frontier(hashes, proven, proof_ok),
            "proven_frontier_hashes": dict(zip([s["run_id"] for s in sections], proven)),
            "index": index,
        },
        "checks": [c.to_dict() for c in checks],
        # The single-process reference, the noise floor and the verdict on every policy difference.
        "learning_refs": learning_refs(hs, sections, index, Path(run_dirs[0]).parent if index and run_dirs else None),
    }
    art["generated"]["analysis_s"] = round(time.perf_counter() - t_start, 3)
    return art


def validate_artifact(art: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError if the artifact does not match its schema."""
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator(schema).validate(art)
    # What JSON Schema cannot say: the columns of a table have one length.
    for r in art["runs"]:
        cols = r["timeline"]["phases"]
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) > 1:
            raise jsonschema.ValidationError(f"run {r['run_id']}: timeline.phases columns differ in length {lengths}")
        unknown = set(cols["phase"]) - set(PHASES)
        if unknown:
            raise jsonschema.ValidationError(f"run {r['run_id']}: unknown timeline phases {sorted(unknown)}")


def write_artifact(art: dict[str, Any], path: Path) -> str:
    validate_artifact(art)
    import orjson

    data = orjson.dumps(art, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return hashlib.sha256(data).hexdigest()
