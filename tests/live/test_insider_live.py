"""An insider with a real cluster key attacks a real three-site run (issue 54); the run does not notice.

Site c is the real site agent with its own key, started as `tests.insider_site`: it trains and
reports as every member does, and meanwhile floods the coordinator with telemetry, claims it cannot
reach a and b, reports a fabricated manifest as durable, puts forged manifests (one blob under 64
names, and under 900), opens uploads it never finishes and reads the largest blob over and over
(tests/insider_site.py says how many of each). Every attack byte goes through c's own node and
Toxiproxy links, so the byte ledger must still reconcile.

Asserted: the run reaches its target and every process exits 0; no honest member (a, b) is failed or
suspected; each claim is refuted by a later commit; the forged durable report and manifests are
refused with their reasons (the 900-name one by the WAN layer: it does not fit a header), and neither the coordinator's frontier nor the store's FRONTIER is ever
a manifest c made; the uploads over the per-sender cap are refused; every process's peak RSS is
under a stated bound; every checker of the artifact passes (the two that need several runs or a
scenario say unknown).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ground.config import load_config, merge
from tests.conftest import COMPARE_CFG, assert_ledger_balanced, events
from tests.insider_site import FORGED_HASH, UPLOADS, launch_with_insider

pytestmark = pytest.mark.integration

TARGET = 16 * 12_288  # 16 rounds of 3 sites x 8 samples x 4 inner steps x 128 tokens
# Peak RSS bounds (MiB). Measured under these attacks: coordinator 49, store 82, sites 910-980 (a
# forked site counts the pages it shares with the fork server; the CUDA build of torch maps ~700 MiB at
# import). A process that held what it was sent (3,000 telemetry bodies, 150 MiB of reads) would show.
RSS_BOUND_MIB = {"coord": 250, "store": 250, "site": 1_600}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("insider")
    return launch_with_insider(load_config(merge(COMPARE_CFG, {"runs_dir": str(out),
                                                               "train": {"target_useful_tokens": TARGET}})))


def test_the_insider_ran_every_attack_and_the_run_still_reached_its_target_cleanly(attacked) -> None:
    run_dir, s = attacked
    sent = json.loads((run_dir / "insider.json").read_text())  # written once every attack was queued
    assert sent["telemetry"] == 3_000 and sent["claims"] == ["a", "b"] and sent["uploads"] == UPLOADS
    assert s["useful_tokens"] == TARGET
    assert all(code == 0 for code in s["exit_codes"].values()), s["exit_codes"]
    assert_ledger_balanced(run_dir, s)
    started = [e for e in events(run_dir, "launcher") if e["event"] == "process_started" and e["name"] == "c"]
    assert started and started[0]["module"] == "tests.insider_site", started


def test_no_honest_member_is_failed_or_suspected_and_each_claim_is_refuted(attacked) -> None:
    run_dir, _s = attacked
    coord = events(run_dir, "coord")
    assert not [e for e in coord if e["event"] in ("site_failed", "site_suspected") and e["site"] in ("a", "b")]
    pending = {(e["reporter"], e["site"]) for e in coord if e["event"] == "claim_pending"}
    refuted = {(e["reporter"], e["site"]) for e in coord if e["event"] == "claim_refuted"}
    assert pending == {("c", "a"), ("c", "b")} and refuted == pending, (pending, refuted)


def test_the_insiders_state_never_becomes_a_frontier(attacked) -> None:
    run_dir, _s = attacked
    coord, store = events(run_dir, "coord"), events(run_dir, "store")
    (forged,) = [e for e in coord if e["event"] == "report_rejected" and e["kind"] == "checkpoint_durable"]
    assert forged["src"] == "c" and "not the leader" in forged["reason"], forged
    durable = [e for e in store if e["event"] == "checkpoint_durable"]
    assert durable and {e["src"] for e in durable} == {"a"}
    honest = {e["manifest_hash"] for e in durable}
    frontiers = [e["manifest_hash"] for e in coord if e["event"] == "frontier"]
    assert frontiers and set(frontiers) <= honest and FORGED_HASH not in frontiers
    assert (run_dir / "store" / "FRONTIER").read_text().strip() in honest
    refused = {e["req"]: e["reason"] for e in store if e["event"] == "ckpt_request_failed" and e["src"] == "c"}
    assert "leader (a) checkpoints: a manifest from c is refused" in refused["insider-m64"], refused
    # 900 names do not fit a message header (64 KiB): the WAN layer refuses it before the store reads it.
    too_large = [e for e in store if e["event"] == "frame_rejected" and e["reason"] == "header_too_large"]
    assert "insider-m900" not in refused and too_large and {e["link"] for e in too_large} == {"c_to_store"}


def test_uploads_past_the_senders_cap_are_refused(attacked) -> None:
    run_dir, _s = attacked
    capped = [e for e in events(run_dir, "store") if e["event"] == "ckpt_request_failed" and e["src"] == "c"
              and "uploads in progress, at most 4" in e["reason"]]
    assert len(capped) == UPLOADS - 4, len(capped)


def test_every_process_stays_under_its_memory_bound_and_every_checker_passes(attacked) -> None:
    from analysis.artifact import build_artifact

    run_dir, _s = attacked
    peaks = {}
    for proc, last in (("coord", "coordinator_stopped"), ("store", "store_stopped"), ("a", "site_stopped"),
                       ("b", "site_stopped"), ("c", "site_stopped")):
        (stopped,) = [e for e in events(run_dir, proc) if e["event"] == last][-1:]
        peaks[proc] = stopped["peak_rss_mib"]
    assert all(peaks[p] < RSS_BOUND_MIB.get(p, RSS_BOUND_MIB["site"]) for p in peaks), peaks
    art = build_artifact([run_dir])
    status = {c["name"]: c["status"] for c in art["checks"]}
    # One run with no fault scheduled: nothing to compare a frontier with, no fault to have fired.
    assert {n: st for n, st in status.items() if st != "pass"} == {"same_frontier": "unknown", "faults_fired": "unknown"}
    assert status["byte_classes"] == "pass" and status["log_integrity"] == "pass"
