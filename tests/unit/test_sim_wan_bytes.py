"""The simulator's modeled WAN byte counters (sim/wan_bytes.py) and their calibration (sim/calibrate.py)."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.artifact import build_artifact
from chaos.scenario import Scenario
from ground.config import load_config
from sim.calibrate import samples_of
from sim.model import SimModel, checkpoint_blob_bytes
from sim.wan_bytes import WanTally
from sim.world import simulate

MODEL = SimModel(frame_overhead_bytes=100.0, ack_bytes=50.0, control_message_bytes=200.0, telemetry_message_bytes=70.0,
                 store_message_bytes=30.0, heartbeat_message_bytes=120.0)


def rows(t: WanTally, proc: str, pid: int) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    return {(r["side"], r["link"], r["direction"], r["cls"]): (r["bytes"], r["messages"]) for r in t.snapshot(proc, pid)}


def test_a_payload_between_sites_travels_the_senders_link_and_is_acked_over_the_receivers() -> None:
    pids = {"a": 1, "b": 2, "coord": 11}
    t = WanTally(1_000_000, MODEL, pids.get)
    t.payload("a", "b", "collective", 2_500_000)  # three chunks of at most 1,000,000 bytes
    assert rows(t, "a", 1) == {("tx", "a_to_b", "up", "collective"): (2_500_300, 3),
                               ("rx", "b_to_a", "up", "control"): (150, 3)}
    assert rows(t, "b", 2) == {("rx", "a_to_b", "up", "collective"): (2_500_300, 3),
                               ("tx", "b_to_a", "up", "control"): (150, 3)}


def test_the_coordinator_answers_on_the_sites_link_and_heartbeats_are_not_acked() -> None:
    pids = {"a": 1, "coord": 11}
    t = WanTally(1_000_000, MODEL, pids.get)
    t.control("coord", "a")
    t.control("a", "coord", reliable=False)  # a heartbeat
    t.control("a", "coord", reliable=False, cls="telemetry")
    assert rows(t, "coord", 11) == {("tx", "a_to_coord", "down", "control"): (200, 1),
                                    ("rx", "a_to_coord", "up", "control"): (120 + 50, 2),  # a heartbeat, an ack
                                    ("rx", "a_to_coord", "up", "telemetry"): (70, 1)}


def test_nothing_is_received_or_acked_by_a_process_that_is_not_running() -> None:
    pids = {"a": 1, "b": None}
    t = WanTally(1_000_000, MODEL, pids.get)
    t.payload("a", "b", "state_transfer", 10)
    assert rows(t, "a", 1) == {("tx", "a_to_b", "up", "state_transfer"): (110, 1)}
    assert t.snapshot("b", None) == []


def test_a_checkpoint_speaks_the_stores_protocol_blob_by_blob() -> None:
    """As checkpoint_store/client.py: per blob its chunks and a finish the store answers, then the
    manifest the store answers; every one of them reliable, so acked."""
    pids = {"a": 1, "store": 21}
    t = WanTally(1_000_000, MODEL, pids.get)
    t.checkpoint_upload("a", (1_500_000, 3_000_000, 1_500_000, 80))  # 2 + 3 + 2 + 1 chunks
    assert rows(t, "a", 1) == {("tx", "a_to_store", "up", "checkpoint"): (6_000_080 + 8 * 100 + 5 * 30, 13),
                               ("rx", "a_to_store", "down", "checkpoint"): (5 * 30, 5),
                               ("rx", "a_to_store", "down", "control"): (13 * 50, 13),
                               ("tx", "a_to_store", "up", "control"): (5 * 50, 5)}
    t2 = WanTally(1_000_000, MODEL, pids.get)
    t2.checkpoint_read("a", (1_500_000, 80))  # the manifest, then 2 + 1 ranges, each asked for
    assert rows(t2, "store", 21) == {("rx", "a_to_store", "up", "checkpoint"): (4 * 30, 4),
                                     ("tx", "a_to_store", "down", "checkpoint"): (1_500_080 + 3 * 100 + 30, 4),
                                     ("tx", "a_to_store", "down", "control"): (4 * 50, 4),
                                     ("rx", "a_to_store", "up", "control"): (4 * 50, 4)}


def test_a_simulated_runs_ledger_counts_payload_plus_framing_and_an_ack_per_part(tmp_path: Path) -> None:
    cfg = load_config({"run_id": "wan-bytes", "train": {"target_useful_tokens": 98_304, "checkpoint_every_rounds": 2}})
    simulate(cfg, None, MODEL, tmp_path / "run")
    run = build_artifact([tmp_path / "run"])["runs"][0]
    assert run["bytes"]["processes_without_counters"] == []
    by_class = run["bytes"]["by_class"]
    spans = [json.loads(line) for s in cfg.cluster.sites
             for line in (tmp_path / "run" / "logs" / f"{s}.jsonl").read_text().splitlines()]
    coll = [e for e in spans if e["event"] == "collective"]
    saves = [e for e in spans if e["event"] == "checkpoint_save"]
    assert coll and saves
    parts = sum(e["messages_sent"] for e in coll)
    assert by_class["collective"] == sum(e["payload_bytes_sent"] for e in coll) + 100 * parts
    # Each blob travels in its own chunks; five requests (four finishes, the manifest) and their replies.
    params_bytes = sum(checkpoint_blob_bytes(cfg.model, 0))  # what does not grow with the retained ids (8 B each)
    blobs = [checkpoint_blob_bytes(cfg.model, (e["bytes_uploaded"] - params_bytes) // 8) for e in saves]
    assert all(sum(b) == e["bytes_uploaded"] for b, e in zip(blobs, saves))
    chunks = sum(-(-size // cfg.wan.chunk_bytes) for b in blobs for size in b)
    assert by_class["checkpoint"] == sum(e["bytes_uploaded"] for e in saves) + 100 * chunks + 30 * 10 * len(saves)
    # Every part is acked; the control messages between the sites are those acks alone.
    site_links = {k: v for k, v in run["bytes"]["by_link_class"].items() if not k.endswith(("_to_coord", "_to_store"))}
    assert sum(v.get("control", 0) for v in site_links.values()) == 50 * parts
    assert by_class["telemetry"] == 70 * len(coll)  # one per round and site


def test_calibration_reads_the_sizes_back_from_a_simulated_runs_counters(tmp_path: Path) -> None:
    """The fit inverts the model: on a simulated run it recovers the sizes the run was made with."""
    cfg = load_config({"run_id": "wan-fit", "train": {"target_useful_tokens": 98_304}})
    simulate(cfg, Scenario.build("none", "no faults"), MODEL, tmp_path / "run")
    est = samples_of(tmp_path / "run")
    assert est["ack_bytes"] == [50.0]
    assert est["telemetry_message_bytes"] == [70.0]
    assert est["frame_overhead_bytes"] == [100.0] * len(cfg.cluster.sites)
    [(rest, beats, others)] = est["control_mix"]  # control bytes less the acks' = 120 x beats + 200 x others
    assert beats > 0 and others > 0 and rest == 120 * beats + 200 * others
    assert est["store_message_bytes"] == [30.0]  # no restore: every store message is a small reply  # acks told apart by the coordinator's heartbeat inputs


def test_heartbeats_and_other_control_messages_are_told_apart_by_runs_with_different_mixes(tmp_path: Path) -> None:
    """One mean for every control message was 1.5-4.7 % off over slower links (longer rounds: more
    heartbeats per report). Runs whose rounds differ in length carry different mixes, and the fit
    recovers both sizes; one run alone cannot, and says so."""
    from sim.calibrate import calibrate

    runs = []
    for i, latency_ms in enumerate((5, 400, 1500)):
        cfg = load_config({"run_id": f"mix-{i}", "train": {"target_useful_tokens": 98_304},
                           "wan": {"site_link": {"up": {"latency_ms": latency_ms}, "down": {"latency_ms": latency_ms}}}})
        simulate(cfg, Scenario.build("none", "no faults"), MODEL, tmp_path / f"run{i}")
        runs.append(tmp_path / f"run{i}")
    shares = [samples_of(r)["control_mix"][0] for r in runs]
    assert len({round(b / (b + o), 3) for _, b, o in shares}) == 3  # the mixes differ
    got = calibrate(runs, allow_simulated=True)["parameters"]  # a round trip: simulated runs
    assert round(got["heartbeat_message_bytes"]["value"], 6) == 120.0
    assert round(got["control_message_bytes"]["value"], 6) == 200.0
    assert got["heartbeat_message_bytes"]["uncertainty"]["kind"].startswith("standard error")
    one = calibrate(runs[:1], allow_simulated=True)["parameters"]
    assert one["heartbeat_message_bytes"]["value"] == one["control_message_bytes"]["value"]
    assert one["control_message_bytes"]["uncertainty"]["value"] is None
