"""The coordinator's durable journal: the commit record (lineage) of every round, fsynced.

One JSON object per line. A record is durable once `append` returns (write + fsync). On
restart `load` returns every complete record; a torn last line (crash mid-write) is
reported and ignored, never silently merged.

`JournalTail` and `AnnouncedEpochs` read it from another process: the checkpoint store admits a
write's epoch only if the coordinator journaled (announced) it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()
        self._f = open(self.path, "a", encoding="utf-8")

    def _drop_torn_tail(self) -> None:
        """Cut a partial last line (crash mid-write) so the next record starts on its own line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

    def append(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    @staticmethod
    def load(path: str | Path) -> tuple[list[dict[str, Any]], str | None]:
        """(records, problem): problem describes a torn tail, if any."""
        p = Path(path)
        if not p.exists():
            return [], None
        records, problem = [], None
        lines = p.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                problem = f"{p}:{i + 1}: torn record ignored ({e})"
        return records, problem


class JournalTail:
    """Another process's read-only view of a journal: the complete records appended since the last read.

    Reads only the bytes added since the previous call and never consumes a partial last line
    (a record being written, or a torn tail the coordinator will cut at its next start).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return []
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < self.offset:  # cut or replaced: read it again from the start
                self.offset = 0
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        self.offset += end
        out: list[dict[str, Any]] = []
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


class AnnouncedEpochs:
    """The membership epochs the coordinator announced: the `epoch` records of its journal.

    The coordinator journals (fsynced) every epoch before any site hears of it, so an epoch a
    site can legitimately write in is always there by the time its write arrives.
    """

    def __init__(self, journal_path: str | Path) -> None:
        self._tail = JournalTail(journal_path)
        self.highest = 0
        self._leaders: dict[int, str] = {}  # epoch -> its plan's first member (the one that checkpoints)

    def highest_announced(self, wanted: int = 0) -> int:
        """The highest announced epoch; reads what the journal gained only when `wanted` is above it."""
        if wanted > self.highest:
            for r in self._tail.read_new():
                ep = r.get("epoch")
                if r.get("type") == "epoch" and isinstance(ep, int) and not isinstance(ep, bool):
                    self.highest = max(self.highest, ep)
                    plan = r.get("plan")
                    members = plan.get("members") if isinstance(plan, dict) else None
                    if isinstance(members, list) and members and isinstance(members[0], str):
                        self._leaders[ep] = members[0]
        return self.highest

    def leader_of(self, epoch: int) -> str | None:
        """The leader (first member) of announced epoch `epoch`: the only member that checkpoints in
        it. None when the journal names no members for it (no epoch yet, or a record without a plan)."""
        self.highest_announced(epoch)
        return self._leaders.get(epoch)
