"""The coordinator's durable journal (ground/journal.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ground.journal import Journal

RECORDS = [
    {"type": "epoch", "epoch": 1, "members": ["a", "b", "c"]},
    {"type": "commit", "round": 0, "epoch": 1, "hash": "ab12", "loss": 5.5},
    {"type": "commit", "round": 1, "epoch": 1, "hash": "cd34", "loss": 5.25, "note": "héllo"},
]


def write(path: Path, records: list[dict]) -> None:
    j = Journal(path)
    for r in records:
        j.append(r)
    j.close()


def test_missing_journal_loads_empty_without_problem(tmp_path: Path) -> None:
    assert Journal.load(tmp_path / "nope.jsonl") == ([], None)


def test_append_then_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "coordinator" / "journal.jsonl"  # parent is created
    write(path, RECORDS)
    assert Journal.load(path) == (RECORDS, None)


def test_one_compact_sorted_json_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write(path, RECORDS[:2])
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # every record ends with a newline
    assert lines[0] == '{"epoch":1,"members":["a","b","c"],"type":"epoch"}'
    assert [json.loads(l) for l in lines[:-1]] == RECORDS[:2]


def test_record_is_on_disk_as_soon_as_append_returns(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.append(RECORDS[0])
    assert Journal.load(path) == ([RECORDS[0]], None)  # readable before close
    j.close()


def test_reopening_appends_after_existing_records(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write(path, RECORDS[:1])
    write(path, RECORDS[1:])
    assert Journal.load(path) == (RECORDS, None)


def test_torn_last_line_is_reported_and_complete_records_kept(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write(path, RECORDS[:2])
    full = json.dumps(RECORDS[2], sort_keys=True, separators=(",", ":"))
    with open(path, "a", encoding="utf-8") as f:
        f.write(full[: len(full) // 2])  # crash mid-write: half a line, no newline
    records, problem = Journal.load(path)
    assert records == RECORDS[:2]
    assert problem is not None
    assert problem.startswith(f"{path}:3: torn record ignored")


def test_record_appended_after_a_torn_tail_survives(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write(path, RECORDS[:1])
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type":"commit","rou')  # crash mid-write
    records, problem = Journal.load(path)
    assert records == RECORDS[:1] and problem is not None
    write(path, RECORDS[1:2])  # the coordinator restarts and commits the next round
    records, _problem = Journal.load(path)
    assert records == RECORDS[:2]
