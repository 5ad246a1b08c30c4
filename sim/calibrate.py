"""Fit the simulator's timing parameters from emulator run directories' logged spans.

Each parameter is the median of its per-event estimates across the given runs, with half the
interquartile range as its uncertainty and the runs it came from; the calibration file names
every input file with its sha256. What is fitted:

  compute_s_per_token   compute span / (samples x seq_len)          (site logs, every round)
  collective_cpu_s, collective_per_peer_s
                        the round's end beyond the modeled links (latency, shard bytes / bandwidth,
                        per-part overhead): from the last member's compute end of a round to the last
                        member's compute start of the next (the collective, the outer step, the report:
                        the sites end a round together, on one machine's cores), per round of one
                        epoch with every member in both; a line through the per-peer-count medians
                        (weighted by their rounds), its uncertainty from their half interquartile
                        ranges, when the rounds have two peer counts or more with ROUND_END_MIN rounds
                        each (an epoch without a member gives the fit rounds of two members); else
                        one median for the fixed part and no per-peer part
  state_transfer_fixed_s  a joiner's state_received - its donor's restore span start - the modeled
                        link (latency + bytes / bandwidth): packing, the chunks' framing, unpacking
  checkpoint_write_bytes_per_s   checkpoint_save bytes / duration
  checkpoint_read_bytes_per_s    checkpoint_load bytes / duration
  eval_s                eval span
  restart_s             fault_healed (chaos) -> the restarted site's site_joined (coordinator),
                        for restarts the launcher started cold
  standby_restart_s     the same, for restarts the launcher handed to its warm standby
                        (process_started with warm_standby), less any wait for its preparation
  standby_prepare_s     a standby's own record of its preparation (site_started.warm_standby:
                        started -> ready)
  start_s               the launcher's process_started -> the site's first site_joined
  preempt_exit_s        a site's SIGTERM (`signal`) -> its `preemption_announced` (it notices the
                        signal at its next check: within an inner step; a site signalled while it
                        waited at a fault gate, which noticed within the wait's poll, is left out)
  fault_poll_s          the triggering commit -> the fault's action began (fault_injected's
                        start_mono_ns: a crash's SIGKILL; the event itself is logged after the action)
  crash_teardown_s      a site_crash's action: SIGKILL -> the process has exited (fault_injected's
                        start_mono_ns -> end_mono_ns; the chaos driver waits for the exit)
  crash_close_s         a site_crash's SIGKILL -> the coordinator's `peer_disconnected` of that site,
                        less the modeled link (its disconnect grace starts there: before the driver
                        sees the exit)
  ack_bytes             control bytes / messages on the links between sites (only acks cross them)
  frame_overhead_bytes  per site: (collective bytes it counted on its links - its collective spans'
                        payload_bytes_sent - what it resent to sites) / (collective messages - resent ones)
  telemetry_message_bytes  telemetry bytes / messages
  store_message_bytes   the store's replies: its checkpoint-class bytes / messages, in runs where no
                        site restored from the store (then every one is a small reply, no blob part)
  control_message_bytes, heartbeat_message_bytes
                        the links to the coordinator, both directions, per run: control bytes -
                        ack_bytes x acks = heartbeat size x heartbeats + control size x others, where
                        the heartbeats are the coordinator's logged heartbeat inputs, acks = (messages
                        - heartbeats) / 2 (each reliable message has one) and others the rest; the
                        two sizes by least squares over the runs (their mixes differ: a stall adds
                        heartbeats, not reports), each with its standard error. Runs that cannot
                        tell them apart (one run, or the same mix) give one mean for both.
The byte sizes come from each process's last `wan_counters` per incarnation (sim/wan_bytes.py).

A parameter without evidence in the runs is left out (it stays `prior` in SimModel).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from analysis.load import AnalysisInputError, expand_inputs
from analysis.simulated import MANIFEST
from ground.config import config_from_json
from ground.eventlog import process_events as _events
from sim.learning_fit import fit_learning
from sim.model import SimModel, collective_s, link_one_way_s, n_params

VERSION = "xdc-sim-calibration-v1"


def _dur_s(e: dict[str, Any]) -> float:
    return (e["end_mono_ns"] - e["start_mono_ns"]) / 1e9


def samples_of(run: Path) -> dict[str, list[Any]]:
    """Per-event estimates of each parameter in one emulator run (`round_end`: (peers, seconds) pairs;
    `control_mix`: (bytes, heartbeats, others) triples; the rest: numbers)."""
    cfg = config_from_json(run / "config.json")
    sites = list(cfg.cluster.sites)
    est: dict[str, list[Any]] = {k: [] for k in ("compute_s_per_token", "round_end", "state_transfer_fixed_s",
                                                   "checkpoint_write_bytes_per_s", "checkpoint_read_bytes_per_s",
                                                   "eval_s", "restart_s", "standby_restart_s", "standby_prepare_s",
                                                   "start_s", "preempt_exit_s", "fault_poll_s",
                                                   "crash_teardown_s", "crash_close_s", "ack_bytes",
                                                   "frame_overhead_bytes", "telemetry_message_bytes",
                                                   "control_mix", "store_message_bytes")}
    computes: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}  # (epoch, round) -> site -> (start, end) ns
    donors: dict[tuple[int, str], tuple[str, int]] = {}  # (epoch, joiner) -> (donor, its restore span's start ns)
    received: list[tuple[int, str, dict[str, Any]]] = []
    members: dict[int, tuple[str, ...]] = {}
    standbys: dict[str, list[tuple[int, int]]] = {}  # site -> (site_started ns, standby ready ns), in order
    coord, chaos, launcher = _events(run, "coord"), _events(run, "chaos"), _events(run, "launcher")
    for e in coord:
        if e["event"] == "membership_epoch":
            members[e["epoch"]] = tuple(e["members"])
    for s in sites:
        signalled: int | None = None  # the mono time of the SIGTERM this incarnation has not yet announced
        for e in _events(run, s):
            ev = e["event"]
            if ev in ("signal", "site_started", "preemption_announced"):
                if ev == "preemption_announced" and signalled is not None:
                    est["preempt_exit_s"].append((e["mono_ns"] - signalled) / 1e9)
                # A SIGTERM waits for its announcement; a new incarnation (or the announcement) ends
                # the wait (a site that was no member announces nothing).
                signalled = e["mono_ns"] if ev == "signal" else None
            elif ev == "fault_gate" and e.get("outcome") == "left" and signalled is not None:
                # Signalled while it waited at a fault gate: it noticed within the wait's poll, not at
                # its next check between inner steps (the simulator models that part itself).
                signalled = None
            if ev == "compute" and "error" not in e:
                if e.get("samples"):
                    est["compute_s_per_token"].append(_dur_s(e) / (e["samples"] * cfg.model.seq_len))
                if isinstance(e.get("round"), int):
                    computes.setdefault((e["epoch"], e["round"]), {})[s] = (e["start_mono_ns"], e["end_mono_ns"])
            elif ev == "restore" and e.get("sent_to") and "error" not in e:
                for j in e["sent_to"]:
                    donors[(e["epoch"], j)] = (s, e["start_mono_ns"])
            elif ev == "state_received" and e.get("bytes"):
                received.append((e["epoch"], s, e))
            elif ev == "checkpoint_save" and e.get("bytes") and "error" not in e:
                est["checkpoint_write_bytes_per_s"].append(e["bytes"] / max(_dur_s(e), 1e-6))
            elif ev == "checkpoint_load" and e.get("bytes") and "error" not in e:
                est["checkpoint_read_bytes_per_s"].append(e["bytes"] / max(_dur_s(e), 1e-6))
            elif ev == "eval" and "error" not in e:
                est["eval_s"].append(_dur_s(e))
            elif ev == "site_started" and isinstance(e.get("warm_standby"), dict):
                w = e["warm_standby"]
                if w.get("ready_mono_ns"):
                    standbys.setdefault(s, []).append((e["mono_ns"], w["ready_mono_ns"]))
                if w.get("ready_mono_ns") and w.get("started_mono_ns"):
                    est["standby_prepare_s"].append((w["ready_mono_ns"] - w["started_mono_ns"]) / 1e9)
    base = SimModel(collective_cpu_s=0.0, collective_per_peer_s=0.0)
    for (epoch, rnd), ends in computes.items():
        m, nxt = members.get(epoch), computes.get((epoch, rnd + 1))
        if not m or nxt is None or set(ends) != set(m) or set(nxt) != set(m):
            continue
        gap_s = (max(b for b, _ in nxt.values()) - max(e for _, e in ends.values())) / 1e9
        est["round_end"].append((len(m) - 1, gap_s - collective_s(cfg, base, m, n_params(cfg.model))))
    for epoch, joiner, e in received:
        got = donors.get((epoch, joiner))
        if got is not None and got[0] == e.get("donor") and e["mono_ns"] > got[1]:
            est["state_transfer_fixed_s"].append((e["mono_ns"] - got[1]) / 1e9
                                                 - link_one_way_s(cfg, got[0], joiner, int(e["bytes"])))
    joins = [(e["mono_ns"], e["site"]) for e in coord if e["event"] == "site_joined"]
    starts = [e for e in launcher if e["event"] == "process_started"]
    for e in chaos:
        if e["event"] == "fault_healed" and (e.get("result") or {}).get("restarted"):
            nxt = next((t for t, s in joins if s == e.get("target") and t >= e["mono_ns"]), None)
            if nxt is None:
                continue
            # The launcher's start of this restart: its last process_started of the site before the heal.
            began = [x for x in starts if x.get("name") == e.get("target") and x["mono_ns"] <= e["mono_ns"]]
            # The emulator's launcher says so in process_started; the simulator in the heal's result.
            if (began and began[-1].get("warm_standby")) or e["result"].get("warm_standby"):
                wait = _standby_wait_s(standbys.get(e["target"], []), began[-1]["mono_ns"]) if began else 0.0
                est["standby_restart_s"].append(max(0.0, (nxt - e["mono_ns"]) / 1e9 - wait))
            else:
                est["restart_s"].append((nxt - e["mono_ns"]) / 1e9)
        elif e["event"] == "fault_injected" and (c := triggering_commit(coord, e)) is not None:
            began = e.get("start_mono_ns", e["mono_ns"])  # (a simulated run logs its fault at once)
            if c["mono_ns"] <= began:
                est["fault_poll_s"].append((began - c["mono_ns"]) / 1e9)
        if e["event"] == "fault_injected" and e.get("kind") in ("site_crash", "site_restart") \
                and (e.get("result") or {}).get("exited") and e.get("end_mono_ns") and e.get("start_mono_ns"):
            est["crash_teardown_s"].append((e["end_mono_ns"] - e["start_mono_ns"]) / 1e9)
            closed = next((c["mono_ns"] for c in coord if c["event"] == "peer_disconnected"
                           and c.get("peer") == e.get("target") and c["mono_ns"] >= e["start_mono_ns"]), None)
            if closed is not None and closed - e["start_mono_ns"] <= e["end_mono_ns"] - e["start_mono_ns"] + 1e9:
                # (less the modeled link to the coordinator, which the simulated close crosses too)
                est["crash_close_s"].append(max(0.0, (closed - e["start_mono_ns"]) / 1e9
                                                - link_one_way_s(cfg, e["target"], "coord")))
    _byte_sizes(run, sites, coord, est)
    for e in launcher:
        if e["event"] == "process_started" and e.get("name") in sites:
            nxt = next((t for t, s in joins if s == e["name"] and t >= e["mono_ns"]), None)
            if nxt is not None and not any(t < e["mono_ns"] for t, s in joins if s == e["name"]):
                est["start_s"].append((nxt - e["mono_ns"]) / 1e9)
    return est


def triggering_commit(coord: list[dict[str, Any]], fault: dict[str, Any]) -> dict[str, Any] | None:
    """The commit that fired a progress-triggered fault (`fault`: its fault_injected event): the first
    of the coordinator's commits at or past its trigger's useful tokens; None for a fault triggered
    otherwise, or one no commit reached."""
    want = (fault.get("trigger") or {}).get("at_useful_tokens")
    if want is None:
        return None
    return next((x for x in coord if x["event"] == "commit" and x.get("useful_tokens", 0) >= want), None)


def _last_counters(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tx rows of each incarnation's last `wan_counters` (cumulative per pid)."""
    last: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["event"] == "wan_counters":
            last[e.get("pid", 0)] = e
    return [r for e in last.values() for r in e.get("counters", []) if r.get("side") == "tx"]


def _byte_sizes(run: Path, sites: list[str], coord: list[dict[str, Any]], est: dict[str, list[float]]) -> None:
    """Per-message wire sizes from the processes' byte counters (module doc); a run without counters adds none."""
    site_set = set(sites)
    acks = [0, 0]
    tele = [0, 0]
    to_coord = [0, 0]
    replies = [0, 0]
    restored = False
    for s in [*sites, "coord", "store"]:
        evs = _events(run, s)
        rows = _last_counters(evs)
        restored = restored or any(e["event"] == "checkpoint_load" for e in evs)
        if s == "store":
            for r in rows:
                if r["cls"] == "checkpoint":
                    replies[0] += r["bytes"]
                    replies[1] += r["messages"]
            continue
        for r in rows:
            src, _, dst = r["link"].partition("_to_")
            if r["cls"] == "control" and src in site_set and dst in site_set:
                acks[0] += r["bytes"]
                acks[1] += r["messages"]
            elif r["cls"] == "telemetry":
                tele[0] += r["bytes"]
                tele[1] += r["messages"]
            elif r["cls"] == "control" and dst == "coord":
                to_coord[0] += r["bytes"]
                to_coord[1] += r["messages"]
        if s in site_set:
            coll = [r for r in rows if r["cls"] == "collective"]
            n = sum(r["messages"] for r in coll)
            payload = sum(int(e.get("payload_bytes_sent") or 0) for e in evs if e["event"] == "collective")
            # Resent messages are counted again (mostly collective parts by size); the model has none.
            resent = [e for e in evs if e["event"] == "retransmit" and e.get("dest") in site_set]
            n -= sum(int(e.get("messages") or 0) for e in resent)
            extra = sum(r["bytes"] for r in coll) - payload - sum(int(e.get("wire_bytes") or 0) for e in resent)
            if n > 0 and payload and extra >= 0:
                est["frame_overhead_bytes"].append(extra / n)
    if acks[1]:
        est["ack_bytes"].append(acks[0] / acks[1])
    if replies[1] and not restored:
        est["store_message_bytes"].append(replies[0] / replies[1])
    if tele[1]:
        est["telemetry_message_bytes"].append(tele[0] / tele[1])
    beats = sum(1 for e in coord if e["event"] == "coord_input" and e.get("kind") == "heartbeat")
    n_acks = (to_coord[1] - beats) / 2
    if acks[1] and beats and 0 < n_acks < to_coord[1]:
        # (bytes less the acks', heartbeats, other control messages): solved across runs in `calibrate`
        est["control_mix"].append((to_coord[0] - acks[0] / acks[1] * n_acks, beats, to_coord[1] - n_acks - beats))


# Two runs whose heartbeat shares differ by less than this cannot tell the two sizes apart.
MIN_MIX_SPREAD = 0.01


def control_sizes(mix: list[tuple[tuple[float, float, float], str]]) -> dict[str, Any]:
    """heartbeat_message_bytes and control_message_bytes from each run's (bytes less acks,
    heartbeats, other messages): least squares through the origin, with standard errors from the
    residuals; one pooled mean for both when the runs' mixes do not separate them."""
    runs = sorted({r for _, r in mix})
    x = np.array([[b, o] for (_, b, o), _ in mix], dtype=float)
    y = np.array([v for (v, _, _), _ in mix], dtype=float)
    share = x[:, 0] / x.sum(axis=1)
    if len(mix) >= 3 and share.max() - share.min() >= MIN_MIX_SPREAD:
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        dof = len(mix) - 2
        s2 = float(((y - x @ coef) ** 2).sum()) / dof
        se = np.sqrt(np.diag(s2 * np.linalg.inv(x.T @ x)))
        if (coef > 0).all():
            return {k: {"value": float(c), "evidence": "fitted", "n": len(mix),
                        "uncertainty": {"kind": "standard error (least squares over runs)", "value": float(e)},
                        "source_runs": runs}
                    for k, c, e in (("heartbeat_message_bytes", coef[0], se[0]),
                                    ("control_message_bytes", coef[1], se[1]))}
    mean = float(y.sum() / x.sum())
    one = {"value": mean, "evidence": "fitted", "n": len(mix), "source_runs": runs,
           "uncertainty": {"kind": "none: one mean for heartbeats and other control messages (the runs' mixes "
                                   "do not tell them apart)", "value": None}}
    return {"heartbeat_message_bytes": dict(one), "control_message_bytes": dict(one)}


# A peer count's rounds enter the line only with at least this many of them (fewer: one median).
ROUND_END_MIN = 3


def median_half_iqr(xs: list[float]) -> tuple[float, float]:
    """(median, half the interquartile range) of xs (one value: its half-IQR is 0)."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return statistics.median(xs), (q[2] - q[0]) / 2


def round_end_fit(ends: list[tuple[tuple[int, float], str]]) -> dict[str, Any]:
    """collective_cpu_s and collective_per_peer_s from each round's (peers, seconds beyond the links)
    (module doc): a line through the per-peer-count medians, weighted by their rounds, when two peer
    counts or more have ROUND_END_MIN rounds; else one median for the fixed part."""
    runs = sorted({r for _, r in ends})
    groups: dict[int, list[float]] = {}
    for (peers, y), _r in ends:
        groups.setdefault(peers, []).append(y)
    rows = [(peers, *median_half_iqr(ys), len(ys)) for peers, ys in sorted(groups.items())]
    used = [r for r in rows if r[3] >= ROUND_END_MIN]
    common = {"evidence": "fitted", "n": len(ends), "source_runs": runs,
              "by_peers": {str(p): {"median_s": m, "half_iqr_s": h, "rounds": n} for p, m, h, n in rows}}
    if len(used) >= 2:
        x = np.array([[1.0, p] for p, *_ in used])
        y = np.array([m for _p, m, _h, _n in used])
        w = np.diag([float(n) for *_, n in used])
        xtwx_inv = np.linalg.inv(x.T @ w @ x)
        gain = xtwx_inv @ x.T @ w  # coef = gain @ y
        coef = gain @ y
        se = np.sqrt(np.diag(gain @ np.diag([h * h for _p, _m, h, _n in used]) @ gain.T))
        kind = "the per-peer-count medians' half interquartile ranges, through the weighted line"
        return {k: {**common, "value": float(c), "uncertainty": {"kind": kind, "value": float(e)}}
                for k, c, e in (("collective_cpu_s", coef[0], se[0]), ("collective_per_peer_s", coef[1], se[1]))}
    med, half = median_half_iqr([y for (_p, y), _r in ends])
    counts = {p: n for p, _m, _h, n in rows}
    return {"collective_cpu_s": {**common, "value": med,
                                 "uncertainty": {"kind": f"half interquartile range (one median: rounds by peer "
                                                         f"count {counts}, too few counts for a per-peer part)",
                                                 "value": half}}}


def _standby_wait_s(standbys: list[tuple[int, int]], assigned_ns: int) -> float:
    """How long a standby named at `assigned_ns` was still preparing (0 when it was ready), from the
    site's (site_started ns, ready ns) records."""
    for started_ns, ready_ns in standbys:
        if started_ns >= assigned_ns:
            return max(0.0, (ready_ns - assigned_ns) / 1e9)
    return 0.0


def _hashes(run: Path) -> dict[str, str]:
    files = [run / "config.json", *sorted((run / "logs").glob("*.jsonl"))]
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.exists()}


class CalibrationError(ValueError):
    """What `xdc sim calibrate` was given is not a set of finished emulator runs."""


def run_dirs(paths: Iterable[str | Path], allow_simulated: bool = False) -> list[Path]:
    """The emulator run directories named by `paths`, each once: a run directory (config.json and
    logs/) as it is, a comparison directory (index.json, from `xdc compare`) as its policy runs (the
    reference run is one process, no cluster: not a calibration input; found as `xdc analyze` finds
    them, beside the index when the comparison was moved). A simulated run is
    refused unless `allow_simulated` (a round trip of the fit itself): fitting the simulator to its
    own output says nothing about the emulator."""
    out: list[Path] = []
    seen: set[Path] = set()

    def one(p: Path, named_as: str) -> None:
        if not p.is_dir():
            raise CalibrationError(f"{named_as}: " + ("not a directory" if p.exists() else "no such directory"))
        if (p / "config.json").is_file():
            if (p / MANIFEST).is_file() and not allow_simulated:
                raise CalibrationError(f"{p}: a simulated run (sim.json): calibration fits the simulator to "
                                       f"emulator runs, not to its own output (--allow-simulated: a round "
                                       f"trip of the fit)")
            if not (p / "logs").is_dir():
                raise CalibrationError(f"{p}: no logs/ directory: not a finished emulator run")
            if p.resolve() not in seen:  # named twice (a run and its comparison): its samples count once
                seen.add(p.resolve())
                out.append(p)
        elif (p / "index.json").is_file():  # a comparison: its policy runs, as `xdc analyze` finds them
            try:
                listed, _index, _cmp = expand_inputs([p])
            except AnalysisInputError as e:
                raise CalibrationError(str(e)) from None
            for r in listed:
                one(r, str(r))
        else:
            raise CalibrationError(f"{named_as}: neither an emulator run directory (config.json and logs/) nor a "
                                   f"comparison directory (index.json)")

    for raw in paths:
        one(Path(raw), str(raw))
    if not out:
        raise CalibrationError("no run directories given")
    return out


def calibrate(runs: Iterable[str | Path], allow_simulated: bool = False) -> dict[str, Any]:
    runs = run_dirs(runs, allow_simulated)
    pooled: dict[str, list[tuple[float, str]]] = {}
    for r in runs:
        for k, vals in samples_of(r).items():
            pooled.setdefault(k, []).extend((v, r.name) for v in vals)
    params: dict[str, Any] = {}
    mix = pooled.pop("control_mix", [])
    if mix:
        params.update(control_sizes(mix))
    ends = pooled.pop("round_end", [])
    if ends:
        params.update(round_end_fit(ends))
    for k, vals in sorted(pooled.items()):
        if not vals:
            continue
        xs = sorted(v for v, _ in vals)
        med, half = median_half_iqr(xs)
        params[k] = {"value": med, "evidence": "fitted", "n": len(xs),
                     "uncertainty": {"kind": "half interquartile range", "value": half},
                     "range": [xs[0], xs[-1]],  # the fewest and most seen (sim/validate.py's timing bounds)
                     "source_runs": sorted({r for _, r in vals})}
    return {"version": VERSION, "inputs": [{"run": str(r), "sha256": _hashes(r), "simulated": (r / MANIFEST).is_file()}
                                           for r in runs],
            "parameters": params, "learning": fit_learning(runs).to_json(),
            "not_fitted": sorted(set(f for f in SimModel().to_json()["parameters"]) - set(params))}


def read_calibration(path: str | Path) -> dict[str, Any]:
    """A calibration file written by `xdc sim calibrate`, checked: CalibrationError names what is wrong
    (a file that is not one would otherwise be read as "nothing fitted" and run on the prior)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise CalibrationError(f"{p}: cannot read the calibration file: {e.strerror or e}") from None
    except ValueError as e:
        raise CalibrationError(f"{p}: not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        got = doc.get("version") if isinstance(doc, dict) else type(doc).__name__
        raise CalibrationError(f"{p}: not a calibration file (version {got!r}, expected {VERSION!r}; "
                               f"write one with `xdc sim calibrate RUNS... --out FILE`)")
    params = doc.get("parameters")
    if not isinstance(params, dict):
        raise CalibrationError(f"{p}: `parameters` is not a map")
    for k, v in params.items():
        if not isinstance(v, dict) or isinstance(v.get("value"), bool) or not isinstance(v.get("value"), (int, float)):
            raise CalibrationError(f"{p}: parameter {k!r} has no numeric `value`")
    return doc


def write_calibration(runs: Iterable[str | Path], out: str | Path, allow_simulated: bool = False) -> dict[str, Any]:
    doc = calibrate(runs, allow_simulated)
    Path(out).write_text(json.dumps(doc, indent=2, sort_keys=True))
    return doc
