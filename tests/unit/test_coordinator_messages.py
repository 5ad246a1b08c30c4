"""The coordinator never dies on a bad body and never adopts an epoch it did not announce.

A real `Coordinator` (its journal, its event log, its WAN endpoint, not started: what it would
send stays in the endpoint's outbox) is fed decoded messages exactly as its loop feeds them,
through `Coordinator.handle`. Pure logic: no sockets are needed to decide what to do with a body.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from coordinator import membership
from ground.messages import BadMessage, RoundDone, Telemetry, parse
from coordinator.service import Coordinator
from wan.frames import Message, decode
from ground.config import load_config
from ground.eventlog import EventLog
from ground.topology import plan_topology

SITES = ("a", "b", "c")
CFG = {"run_id": "tc", "cluster": {"sites": list(SITES)}, "wan": {"curve": False},
       "train": {"per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 98_304}}
INC = {"a": 11, "b": 22, "c": 33}


def make(tmp_path: Path, **recovery: Any) -> Coordinator:
    cfg = load_config({**CFG, "recovery": recovery} if recovery else CFG)
    log = EventLog(tmp_path / "logs" / "coord.jsonl", cfg.run_id, "coord")
    return Coordinator(tmp_path, cfg, plan_topology(SITES), log)


def msg(kind: str, src: str, body: Any, epoch: int = 0) -> Message:
    return Message(kind=kind, cls="control", run="tc", epoch=epoch, step=0, src=src, inc=INC.get(src, 1), seq=1,
                   body=body)


def logged(c: Coordinator, name: str) -> list[dict]:
    path = c.run_dir / "logs" / "coord.jsonl"
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]


def sent(c: Coordinator) -> list[tuple[str, Message]]:
    """(destination, message) of everything the coordinator queued to send."""
    w = c.cfg.wan
    return [(d, decode(f, max_frame_bytes=w.max_frame_bytes, max_header_bytes=w.max_header_bytes))
            for d, f, *_ in list(c.node._outbox)]


def formed(tmp_path: Path, **recovery: Any) -> Coordinator:
    """Every site joined; epoch 1 formed with a, b, c."""
    c = make(tmp_path, **recovery)
    for s in SITES:
        c.handle(msg("join", s, {"pid": 100}), 0)
    c.step_membership(1)
    assert c.membership.epoch == 1 and c.membership.members == SITES
    return c


def round_done(rnd: int, cs: int, ce: int, **over: Any) -> dict:
    return {"round": rnd, "step": (rnd + 1) * 4, "param_hash": "ab" * 8, "cursor_start": cs, "cursor_end": ce,
            "samples": list(range(cs, ce)), "tokens": (ce - cs) * 128, "flops": 1e9, **over}


BAD_BODIES = [
    ("round_done", {"round": "x"}, "field 'round' must be an integer, got str 'x'"),
    ("round_done", {k: v for k, v in round_done(0, 0, 96).items() if k != "param_hash"}, "missing field 'param_hash'"),
    ("round_done", round_done(0, 0, 96, flops=math.nan), "field 'flops' must be finite"),
    ("round_done", round_done(0, 0, 96, flops=math.inf), "field 'flops' must be finite"),
    ("round_done", round_done(0, 0, 96, cursor_start=-5), "field 'cursor_start' = -5 is outside"),
    ("round_done", round_done(0, 0, 96, tokens=10**400), "an integer of 401 digits"),
    ("round_done", round_done(0, 0, 96, samples=["x"]), "field 'samples'[0] = 'x' is not an integer"),
    ("round_done", round_done(0, 0, 96, samples={"a": 1}), "field 'samples' must be a list of integers"),
    ("round_done", round_done(0, 96, 0, tokens=0), "cursor_end 0 < cursor_start 96"),
    ("round_done", [1, 2], "body is list, expected a map"),
    ("heartbeat", {"sent_mono_ns": "soon"}, "field 'sent_mono_ns' must be an integer"),
    ("join", {"pid": 1.5}, "field 'pid' must be an integer, got float"),
    ("join", {"rejoin": "yes"}, "field 'rejoin' must be true or false"),
    ("site_done", {}, "missing field 'round'"),
    ("telemetry", {"loss": math.nan}, "field 'loss' must be finite"),
    ("telemetry", {"loss": [1.0]}, "metric 'loss' must be a number"),
    ("telemetry", {f"m{i}": 1 for i in range(40)}, "40 metrics, limit 32"),
    ("preempt_notice", {"grace_s": -1}, "field 'grace_s' = -1.0 is outside"),
    ("checkpoint_durable", {"manifest_hash": "zz", "round": 1, "cursor": 96}, "field 'manifest_hash'"),
    ("checkpoint_durable", {"manifest_hash": "0" * 64, "round": True, "cursor": 96}, "field 'round' must be an int"),
    ("peer_unreachable", {"peer": {"x": 1}}, "field 'peer' must be a string"),
]


@pytest.mark.parametrize("kind,body,reason", BAD_BODIES, ids=[f"{k}-{i}" for i, (k, _b, _r) in enumerate(BAD_BODIES)])
def test_a_bad_body_is_rejected_with_its_reason_and_changes_nothing(tmp_path: Path, kind: str, body: Any,
                                                                   reason: str) -> None:
    c = formed(tmp_path)
    before = (c.membership, c.committed_cursor, c.frontier, dict(c.reports), len(c.commits))
    c.handle(msg(kind, "a", body, epoch=1), 2)  # must not raise
    got = logged(c, "report_rejected")
    assert len(got) == 1 and got[0]["kind"] == kind and got[0]["src"] == "a", got
    assert got[0]["reason"].startswith(f"bad_body: {kind}: ") and reason in got[0]["reason"], got[0]["reason"]
    assert (c.membership, c.committed_cursor, c.frontier, dict(c.reports), len(c.commits)) == before


def test_telemetry_is_logged_nested_so_a_key_named_event_cannot_collide(tmp_path: Path) -> None:
    c = formed(tmp_path)
    c.handle(msg("telemetry", "b", {"event": "boom", "site": "mallory", "loss": 2.5, "round": 3}, epoch=1), 2)
    m = logged(c, "site_metrics")
    assert len(m) == 1 and m[0]["site"] == "b", m
    assert m[0]["metrics"] == {"event": "boom", "site": "mallory", "loss": 2.5, "round": 3}
    assert not logged(c, "report_rejected")


def test_a_message_from_an_epoch_never_announced_is_rejected_not_adopted(tmp_path: Path) -> None:
    c = formed(tmp_path)
    for kind, body in [("round_done", round_done(0, 0, 96)), ("preempt_notice", {"grace_s": 1.0, "round": 0}),
                       ("checkpoint_durable", {"manifest_hash": "0" * 64, "round": 0, "cursor": 96}),
                       ("join", {"pid": 5, "rejoin": True}), ("site_done", {"round": 0})]:
        c.handle(msg(kind, "a", body, epoch=10**9), 2)
    c.handle(msg("heartbeat", "a", {"epoch": 10**9, "round": 0}, epoch=1), 2)
    rej = logged(c, "report_rejected")
    assert len(rej) == 6 and all(r["reason"].startswith("future_epoch:") for r in rej), rej
    assert "message epoch 1000000000 was never announced (current epoch 1)" in rej[0]["reason"]
    assert c.membership.epoch == 1 and c.membership.sites["a"].state == membership.SiteState.ACTIVE and c.frontier is None
    assert c.node.fence.epoch <= 1


def test_a_report_absurdly_far_ahead_of_the_commit_record_is_rejected(tmp_path: Path) -> None:
    c = formed(tmp_path)
    c.handle(msg("round_done", "a", round_done(10**6, 0, 96), epoch=1), 2)
    rej = logged(c, "report_rejected")
    assert len(rej) == 1 and "round 1000000 is more than 8 rounds past the commit record (-1)" in rej[0]["reason"]
    assert c.reports == {}


def test_a_report_of_a_committed_round_is_rejected_and_holds_nothing(tmp_path: Path) -> None:
    """Round reports are bounded below by the commit record too (negative ones are bad bodies): a
    duplicate of a committed round, or any earlier round an insider sends, would otherwise keep a set
    of reports that can never complete, one per round sent."""
    c = formed(tmp_path)
    for rnd in (0, 1):
        for s in SITES:
            c.handle(msg("round_done", s, round_done(rnd, 96 * rnd, 96 * (rnd + 1)), epoch=1), 2)
    assert [e["commit_id"] for e in logged(c, "commit")] == ["e1r0", "e1r1"] and c.reports == {}
    for rnd in (1, 0):
        c.handle(msg("round_done", "a", round_done(rnd, 96 * rnd, 96 * (rnd + 1)), epoch=1), 3)
    rej = [r["reason"] for r in logged(c, "report_rejected")]
    assert rej == [f"stale: round {r} is not past the commit record (1)" for r in (1, 0)], rej
    assert c.reports == {} and [e["commit_id"] for e in logged(c, "commit")] == ["e1r0", "e1r1"]


def test_a_handler_bug_is_logged_and_the_loop_goes_on(tmp_path: Path) -> None:
    c = formed(tmp_path)
    c.journal.close()  # appending a commit now raises ValueError inside the handler
    for s in SITES:
        c.handle(msg("round_done", s, round_done(0, 0, 96), epoch=1), 2)
    rej = logged(c, "report_rejected")
    assert rej and rej[-1]["reason"].startswith("internal_error: ValueError"), rej
    c.handle(msg("telemetry", "a", {"loss": 1.0}, epoch=1), 3)  # still handling messages
    assert logged(c, "site_metrics")


def test_good_reports_commit_with_typed_fields(tmp_path: Path) -> None:
    c = formed(tmp_path)
    for s in SITES:
        c.handle(msg("round_done", s, round_done(0, 0, 96), epoch=1), 2)
    (commit,) = logged(c, "commit")
    assert commit["cursor_end"] == 96 and commit["flops"] == {"a": 1e9, "b": 1e9, "c": 1e9}
    assert not logged(c, "report_rejected")


def test_typed_parsers_accept_what_sites_send() -> None:
    assert parse("round_done", round_done(2, 192, 288)) == RoundDone(2, 12, "ab" * 8, 192, 288, 96 * 128, 1e9,
                                                                      tuple(range(192, 288)))
    assert parse("telemetry", {"round": 1, "loss": 3}) == Telemetry((("loss", 3), ("round", 1)))
    assert parse("preempt_notice", {"grace_s": None, "round": 4}).grace_s is None
    with pytest.raises(BadMessage, match="unknown message kind"):
        parse("launch_missiles", {})


def test_a_body_built_typed_by_the_simulator_is_taken_as_the_parse_of_its_map(tmp_path: Path) -> None:
    """ground.messages.Built: the simulator hands the core the typed report (and its cycle) that
    parsing the map would give; the core commits the same round with the same observation."""
    from control.observations import SiteCycle
    from ground.messages import Built, Heartbeat

    cyc = {"compute_s": 1.5, "inner_steps": 4, "comm_s": 0.25, "payload_bytes": 4096, "stalls": 0, "loss": 3.0,
           "update_norm": 1.0, "update_dot_mean": 0.25, "mean_norm": 0.5}
    commits, observed = [], []
    for i, built in enumerate((False, True)):
        c = formed(tmp_path / str(i))
        for s in SITES:
            body = round_done(0, 0, 96, cycle=cyc)
            if built:
                body = Built(parse("round_done", body), {"cycle": SiteCycle.from_json(cyc)}, body)
            c.handle(msg("round_done", s, body, epoch=1), 2)
        assert not logged(c, "report_rejected")
        commits.append([{k: v for k, v in e.items() if k not in ("wall_ns", "mono_ns")} for e in logged(c, "commit")])
        observed.append([{k: v for k, v in e.items() if k not in ("wall_ns", "mono_ns")}
                         for e in logged(c, "cycle_observed")])
    assert commits[0] == commits[1] and len(commits[0]) == 1
    assert observed[0] == observed[1] and len(observed[0]) == 1
    # A built body of the wrong type is refused as a bad body, never taken.
    with pytest.raises(BadMessage, match="holds a Heartbeat, not a RoundDone"):
        parse("round_done", Built(Heartbeat(0, 1, 0)))
