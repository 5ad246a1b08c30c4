"""The one event record: typed JSON-lines events, one file per process.

Every event carries a stable id (`process:seq`), wall-clock and monotonic nanoseconds,
the run id, the process name, the membership epoch and the step. Spans carry both bounds
(`start_wall_ns`/`end_wall_ns`, `start_mono_ns`/`end_mono_ns`). `analysis/` reads only
these files; nothing a live process held only in memory is needed afterwards.

Monotonic nanoseconds come from CLOCK_MONOTONIC, which is system-wide on Linux, so events
of different processes on one machine can be ordered on one clock.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import structlog

from ground.narrate import Narrator

try:  # orjson parses JSON lines ~3x faster than the stdlib; analysis of 1M events relies on it
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _loads = json.loads
    _DecodeError = (json.JSONDecodeError, ValueError)


class EventLog:
    """Append-only JSON-lines log of one process, safe to use from several threads."""

    def __init__(self, path: str | Path, run_id: str, process: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.process = process
        self.epoch = 0
        self.step = 0
        # A restarted process appends to its own log: continue the sequence so ids stay unique.
        self._seq = itertools.count(_next_seq(self.path))
        # Reentrant: a signal handler that logs runs on top of the main thread, which may be inside
        # emit() holding this lock; a plain Lock deadlocked there (a site ignored SIGTERM until SIGKILL).
        self._lock = threading.RLock()
        # Line-buffered append: every event is on disk (page cache) when emit returns, so a
        # SIGKILL loses at most the event being written.
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        # XDC_NARRATE=1 (every compose service): also one human line per event of interest on stdout.
        self._narrator = Narrator() if os.environ.get("XDC_NARRATE") == "1" else None
        self._logger = structlog.wrap_logger(
            structlog.WriteLogger(self._file),
            processors=[self._stamp, structlog.processors.JSONRenderer(serializer=_dumps, sort_keys=False,
                                                                        default=_json_default)],
        )

    def _stamp(self, _logger: Any, _method: str, ev: dict[str, Any]) -> dict[str, Any]:
        name = ev.pop("event")
        head = {
            "id": f"{self.process}:{next(self._seq)}",
            "event": name,
            "wall_ns": time.time_ns(),
            "mono_ns": time.monotonic_ns(),
            "run_id": self.run_id,
            "process": self.process,
            "pid": os.getpid(),
            "epoch": ev.pop("epoch", self.epoch),
            "step": ev.pop("step", self.step),
        }
        for k, v in ev.items():  # user fields never overwrite the stamped ones
            head.setdefault(k, v)
        if self._narrator is not None:
            self._narrate(head)
        return head

    def _narrate(self, ev: dict[str, Any]) -> None:
        try:
            line = self._narrator.line(ev) if self._narrator is not None else None
        except Exception as e:  # a view of the record: it must never cost the record itself
            line = f"(no line for {ev.get('event')}: {type(e).__name__}: {e})"
        if line:
            print(f"{time.strftime('%H:%M:%S', time.localtime(ev['wall_ns'] / 1e9))} {line}", flush=True)

    def set_context(self, *, epoch: int | None = None, step: int | None = None) -> None:
        if epoch is not None:
            self.epoch = epoch
        if step is not None:
            self.step = step

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event. Field values must be JSON-able (numpy/torch scalars are converted)."""
        with self._lock:
            if self._file.closed:
                return  # late events (a signal after shutdown) are dropped, not raised
            self._logger.msg(event, **fields)

    @contextlib.contextmanager
    def span(self, event: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Emit one event when the block ends, with both wall and monotonic bounds.

        The yielded dict may be filled with result fields inside the block. An exception inside
        the block is recorded as `error` and re-raised.
        """
        extra: dict[str, Any] = {}
        start_wall, start_mono = time.time_ns(), time.monotonic_ns()
        try:
            yield extra
        except BaseException as e:
            extra["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.emit(
                event,
                start_wall_ns=start_wall,
                end_wall_ns=time.time_ns(),
                start_mono_ns=start_mono,
                end_mono_ns=time.monotonic_ns(),
                **{**fields, **extra},  # results filled in the block win over the opening fields
            )

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._file.close()


class LogTail:
    """Complete JSON-object lines appended to a file since the last read (a torn last line waits)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        whole, _, self.partial = (self.partial + data).rpartition(b"\n")
        return parse_events(whole + b"\n", str(self.path))[0] if whole else []


def _next_seq(path: Path) -> int:
    """One past the highest sequence number already in `path` (0 for a new file)."""
    if not path.exists():
        return 0
    last = -1
    for e in read_events(path):
        try:
            last = max(last, int(e["id"].rsplit(":", 1)[1]))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
    return last + 1


def _dumps(obj: Any, **kw: Any) -> str:
    """JSON that every reader parses: a non-finite float (a peer's `{"x": inf}` logged as received) is written
    as the string "inf", "-inf" or "nan", never as the bare `Infinity`/`NaN` that strict parsers (orjson,
    the analysis) refuse, which would fail a whole run's log_integrity."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(_finite(obj, 0), allow_nan=False, **kw)


def _finite(o: Any, depth: int) -> Any:
    if depth > 64:  # deeper than any event: a cycle; json.dumps then names it
        return repr(o)
    if hasattr(o, "item") and not isinstance(o, (dict, list, tuple)):
        try:
            o = o.item()
        except (TypeError, ValueError):
            return o
    if isinstance(o, float) and o != o:
        return "nan"
    if isinstance(o, float) and o in (float("inf"), float("-inf")):
        return "inf" if o > 0 else "-inf"
    if isinstance(o, dict):
        return {k: _finite(v, depth + 1) for k, v in o.items()}
    if isinstance(o, (list, tuple, set, frozenset)):
        return [_finite(v, depth + 1) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, bytes):
        return o.hex()
    if isinstance(o, Path):
        return str(o)
    return repr(o)


@dataclass
class BadLine:
    """A line of a log that is not an event: a torn last line (its process was killed mid-write) or
    anything else unreadable, which the analysis reports."""

    path: str
    line_no: int
    torn_tail: bool
    error: str


def parse_events(data: bytes, path: str = "",
                 problem: Callable[[dict[str, Any]], str | None] | None = None) -> tuple[list[dict[str, Any]], list[BadLine]]:
    """The one parser of JSON-lines logs: the events in `data` (a log's bytes) in file order, and
    the lines that are not events (`path` names the file in them). With `problem` (e.g.
    ground.events.envelope_problem), an event it finds fault with is a bad line too, named by it."""
    # Fast path: the whole file as one JSON array in one call (newlines become commas; a blank or
    # bad line makes it fail, and then the file is read line by line below).
    if data.endswith(b"\n"):
        try:
            parsed = _loads(b"[" + data[:-1].replace(b"\n", b",") + b"]")
            if all(isinstance(e, dict) and "event" in e for e in parsed) \
                    and (problem is None or not any(map(problem, parsed))):
                return parsed, []
        except _DecodeError:
            pass
    lines = data.split(b"\n")
    # A file that ends with "\n" splits into a trailing empty element: the real last line is before it.
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    out: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            ev = _loads(raw)
        except _DecodeError as e:
            bad.append(BadLine(path, i + 1, i == last, f"{type(e).__name__}: {e}"))
            continue
        if not isinstance(ev, dict) or "event" not in ev:
            bad.append(BadLine(path, i + 1, False, "not an event object (no 'event' field)"))
            continue
        why = problem(ev) if problem is not None else None
        if why is not None:
            bad.append(BadLine(path, i + 1, False,
                               f"malformed envelope (event {ev.get('id')!r:.40}, {ev.get('event')!r:.40}): {why}"))
            continue
        out.append(ev)
    return out, bad


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Read one process log; a torn last line (process killed mid-write) is skipped."""
    return parse_events(Path(path).read_bytes(), str(path))[0]


def process_events(run_dir: str | Path, process: str) -> list[dict[str, Any]]:
    """The events of `process` in a run directory (`logs/<process>.jsonl`); [] when it left no log."""
    path = Path(run_dir) / "logs" / f"{process}.jsonl"
    return read_events(path) if path.is_file() else []
