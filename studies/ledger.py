"""The study ledger: one JSON line per thing that happened, in the study's directory.

Lines (field `type`):
  study_started   protocol name, version, sha256, code revision (each invocation of `run` adds one)
  run_started     key ("<stratum>/<arm>" or "control/<stratum>/<arm>"), run directory, revision
  run_finished    key, run directory, hashes (config, summary, logs), metrics, record
  run_stopped     key, why (interrupted by the user, failed to start, a refused scenario)

Resuming reads it back: a key with a run_finished line is never run again; a key with only a
run_started line was interrupted and runs again in a new directory (the old one is kept and
named in the ledger). Lines are appended and flushed one at a time, so a killed study loses at
most the line being written; a torn last line is ignored.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a torn last line of a killed study
        return out

    def append(self, rec: dict[str, Any]) -> dict[str, Any]:
        rec = {**rec, "wall_ns": time.time_ns()}
        torn = False
        if self.path.is_file() and self.path.stat().st_size:
            with self.path.open("rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
        with self.path.open("a") as f:
            # after a torn last line, start on a fresh one so this record stays readable
            f.write(("\n" if torn else "") + json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
        return rec

    def finished(self) -> dict[str, dict[str, Any]]:
        """key -> its run_finished line (the last one, should a key ever finish twice)."""
        return {r["key"]: r for r in self.read() if r.get("type") == "run_finished"}

    def interrupted(self) -> dict[str, list[str]]:
        """key -> run directories started but never finished."""
        started: dict[str, list[str]] = {}
        done = set(self.finished())
        for r in self.read():
            if r.get("type") == "run_started" and r["key"] not in done:
                started.setdefault(r["key"], []).append(r["run_dir"])
        return started

    def protocols(self) -> list[tuple[str, int]]:
        return [(r["sha256"], r["version"]) for r in self.read() if r.get("type") == "study_started"]


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def logs_sha256(run_dir: Path) -> str:
    """One hash over every log file of a run (name and content, sorted by name)."""
    h = hashlib.sha256()
    for p in sorted((Path(run_dir) / "logs").glob("*.jsonl")):
        h.update(p.name.encode() + b"\0" + (file_sha256(p) or "").encode() + b"\n")
    return h.hexdigest()
