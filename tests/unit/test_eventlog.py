"""The event record (ground/eventlog.py): ids, stamps, context, spans, threads, torn lines."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ground.eventlog import EventLog, read_events

STAMP_FIELDS = ("id", "event", "wall_ns", "mono_ns", "run_id", "process", "pid", "epoch", "step")


@pytest.fixture
def log(tmp_path: Path):
    lg = EventLog(tmp_path / "logs" / "site_a.jsonl", run_id="run-7", process="site_a")
    yield lg
    lg.close()


def test_every_event_is_stamped_with_id_clocks_run_process_epoch_step(log: EventLog) -> None:
    wall0, mono0 = time.time_ns(), time.monotonic_ns()
    for i in range(5):
        log.emit("tick", i=i)
    wall1, mono1 = time.time_ns(), time.monotonic_ns()
    evs = read_events(log.path)
    assert [e["id"] for e in evs] == [f"site_a:{i}" for i in range(5)]
    assert [e["i"] for e in evs] == list(range(5))
    for e in evs:
        assert tuple(e)[: len(STAMP_FIELDS)] == STAMP_FIELDS  # stamps first, then the fields
        assert e["event"] == "tick"
        assert e["run_id"] == "run-7" and e["process"] == "site_a" and e["pid"] == os.getpid()
        assert e["epoch"] == 0 and e["step"] == 0
        assert isinstance(e["wall_ns"], int) and wall0 <= e["wall_ns"] <= wall1
        assert isinstance(e["mono_ns"], int) and mono0 <= e["mono_ns"] <= mono1
    monos = [e["mono_ns"] for e in evs]
    assert monos == sorted(monos)


def test_set_context_changes_epoch_and_step_of_later_events(log: EventLog) -> None:
    log.emit("before")
    log.set_context(epoch=2)
    log.emit("epoch_only")
    log.set_context(step=40)
    log.emit("both")
    log.set_context(epoch=3, step=41)
    log.emit("after")
    log.emit("explicit", epoch=9, step=99)  # per-event values win without changing the context
    log.emit("context_kept")
    got = [(e["event"], e["epoch"], e["step"]) for e in read_events(log.path)]
    assert got == [("before", 0, 0), ("epoch_only", 2, 0), ("both", 2, 40), ("after", 3, 41),
                   ("explicit", 9, 99), ("context_kept", 3, 41)]


def test_numpy_and_other_values_are_made_json(log: EventLog) -> None:
    log.emit("vals", f=np.float32(1.5), n=np.int64(7), s={3}, t=(1, 2), b=b"\x01\xff", p=Path("/x/y"))
    (e,) = read_events(log.path)
    assert (e["f"], e["n"], e["s"], e["t"], e["b"], e["p"]) == (1.5, 7, [3], [1, 2], "01ff", "/x/y")


def test_span_records_both_bounds_and_result_fields(log: EventLog) -> None:
    log.set_context(epoch=1, step=5)
    before_wall, before_mono = time.time_ns(), time.monotonic_ns()
    with log.span("round", round=3) as out:
        out["bytes"] = 1024
    after_wall, after_mono = time.time_ns(), time.monotonic_ns()
    (e,) = read_events(log.path)
    assert e["event"] == "round" and e["round"] == 3 and e["bytes"] == 1024
    assert (e["epoch"], e["step"]) == (1, 5)
    assert before_wall <= e["start_wall_ns"] <= e["end_wall_ns"] <= after_wall
    assert before_mono <= e["start_mono_ns"] <= e["end_mono_ns"] <= after_mono
    assert "error" not in e


def test_span_records_error_and_reraises(log: EventLog) -> None:
    with pytest.raises(ValueError, match="boom"):
        with log.span("step", step_kind="inner") as out:
            out["partial"] = True
            raise ValueError("boom")
    (e,) = read_events(log.path)
    assert e["event"] == "step"
    assert e["error"] == "ValueError: boom"
    assert e["partial"] is True and e["step_kind"] == "inner"
    assert e["end_mono_ns"] >= e["start_mono_ns"]


def test_concurrent_emits_give_valid_lines_with_unique_ids(log: EventLog) -> None:
    n_threads, per_thread = 4, 300
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            log.emit("work", thread=t, i=i, pad="x" * (i % 50))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    lines = log.path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == n_threads * per_thread
    evs = [json.loads(line) for line in lines]  # every line is one complete JSON object
    ids = [e["id"] for e in evs]
    assert len(set(ids)) == len(ids)
    assert ids == [f"site_a:{k}" for k in range(len(ids))]  # seq is taken in file order
    for t in range(n_threads):
        assert [e["i"] for e in evs if e["thread"] == t] == list(range(per_thread))


def test_emit_after_close_is_dropped(tmp_path: Path) -> None:
    lg = EventLog(tmp_path / "p.jsonl", run_id="r", process="p")
    lg.emit("one")
    lg.close()
    lg.emit("late")  # no exception
    lg.close()  # idempotent
    assert [e["event"] for e in read_events(lg.path)] == ["one"]


def test_reopening_appends(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    for _ in range(2):
        lg = EventLog(path, run_id="r", process="p")
        lg.emit("start")
        lg.close()
    assert [e["id"] for e in read_events(path)] == ["p:0", "p:1"]  # ids stay unique across restarts


def test_read_events_skips_torn_last_line_and_blank_lines(log: EventLog) -> None:
    log.emit("a")
    log.emit("b")
    log.close()
    text = log.path.read_text(encoding="utf-8")
    last = text.splitlines()[-1]
    with open(log.path, "a", encoding="utf-8") as f:
        f.write("\n" + last[: len(last) // 2])  # a blank line, then a line cut mid-write
    evs = read_events(log.path)
    assert [e["event"] for e in evs] == ["a", "b"]


def test_restarted_process_continues_its_event_sequence(tmp_path):
    from ground.eventlog import EventLog, read_events

    first = EventLog(tmp_path / "b.jsonl", "r", "b")
    first.emit("one")
    first.emit("two")
    first.close()
    again = EventLog(tmp_path / "b.jsonl", "r", "b")  # the same site after a restart
    again.emit("three")
    again.close()
    assert [e["id"] for e in read_events(tmp_path / "b.jsonl")] == ["b:0", "b:1", "b:2"]
