"""The coordinator's durable journal: the commit record (lineage) of every round, fsynced.

One JSON object per line. A record is durable once `append` returns (write + fsync). On
restart `load` returns every complete record; a torn last line (crash mid-write) is
reported and ignored, never silently merged.
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
