"""A non-finite float in a logged field (a peer's body logged as received, `{"x": inf}`) is written as a
string, so the line stays strict JSON and the run's log_integrity holds (issue 54)."""

from __future__ import annotations

import json

import numpy as np
import orjson

from ground.eventlog import EventLog, read_events


def test_infinity_and_nan_are_logged_as_strings_and_the_log_parses(tmp_path):
    log = EventLog(tmp_path / "a.jsonl", "r1", "a")
    log.emit("bad_message", body={"x": float("inf"), "y": [float("-inf"), float("nan"), 1.5]}, z=np.float32("inf"))
    log.emit("ok", value=2.0)
    log.close()
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    first = orjson.loads(lines[0])  # strict: would raise on Infinity / NaN
    assert first["body"] == {"x": "inf", "y": ["-inf", "nan", 1.5]} and first["z"] == "inf"
    assert json.loads(lines[1])["value"] == 2.0
    assert [e["event"] for e in read_events(tmp_path / "a.jsonl")] == ["bad_message", "ok"]
