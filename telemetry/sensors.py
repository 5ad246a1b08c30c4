"""The sensor interface, the clock, Linux RAPL and the `modeled` CPU meter.

A sensor has an id, a quantity, a unit, a kind (`counter`: cumulative, `gauge`: a level, `state`:
a label-like number such as a P-state) and an evidence class (`measured` for a hardware meter,
`modeled` for a number computed from a measured one and a declared constant). `read()` returns a
`Sample` (value + sensor id) or an `Unavailable` with a typed reason; it never raises for a
missing or forbidden meter, so the sampler keeps running and the trace says why.

Time is injected (`Clock`), so the sampler and its validity rules can be tested with synthetic
sensors on a fake clock.
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol, Union

Kind = Literal["counter", "gauge", "state"]
Evidence = Literal["measured", "modeled"]


class Reason(str, enum.Enum):
    """Why a sensor gave no value."""

    NO_LIBRARY = "no_library"  # the Python package or the shared library is missing
    NO_DEVICE = "no_device"  # no GPU / no RAPL zone on this machine
    NOT_SUPPORTED = "not_supported"  # the device exists but does not support this call
    PERMISSION_DENIED = "permission_denied"
    DISAPPEARED = "disappeared"  # it read before and stopped (GPU lost, file gone)
    ERROR = "error"  # anything else, with its message


@dataclass(frozen=True)
class Sample:
    sensor: str
    value: float


@dataclass(frozen=True)
class Unavailable:
    sensor: str
    reason: Reason
    detail: str

    def text(self) -> str:
        return f"{self.reason.value}: {self.detail}"


Reading = Union[Sample, Unavailable]


class Sensor(Protocol):
    sensor_id: str
    quantity: str  # e.g. "gpu_energy", "gpu_power", "cpu_energy", "cpu_time"
    unit: str
    kind: Kind
    evidence: Evidence

    def read(self) -> Reading: ...


def describe(s: Sensor) -> dict[str, str]:
    return {"sensor": s.sensor_id, "quantity": s.quantity, "unit": s.unit, "kind": s.kind, "evidence": s.evidence,
            **({"note": s.note} if getattr(s, "note", None) else {})}


class Clock(Protocol):
    def wall_ns(self) -> int: ...
    def mono_ns(self) -> int: ...
    def sleep_until(self, mono_ns: int) -> None: ...


class SystemClock:
    """CLOCK_REALTIME and CLOCK_MONOTONIC (system-wide on Linux, the event logs' clocks)."""

    def wall_ns(self) -> int:
        return time.time_ns()

    def mono_ns(self) -> int:
        return time.monotonic_ns()

    def sleep_until(self, mono_ns: int) -> None:
        dt = (mono_ns - time.monotonic_ns()) / 1e9
        if dt > 0:
            time.sleep(dt)


class FakeClock:
    """A clock that moves only when slept on (tests): wall = mono + a fixed offset."""

    def __init__(self, start_ns: int = 1_000_000_000, wall_offset_ns: int = 1_700_000_000 * 10**9) -> None:
        self.now = start_ns
        self.offset = wall_offset_ns

    def wall_ns(self) -> int:
        return self.now + self.offset

    def mono_ns(self) -> int:
        return self.now

    def sleep_until(self, mono_ns: int) -> None:
        self.now = max(self.now, mono_ns)

    def advance_ns(self, ns: int) -> None:
        self.now += ns


# ------------------------------------------------------------------------------------------ RAPL
class RaplSensor:
    """CPU package energy from Linux RAPL: `<root>/intel-rapl:N/energy_uj` (µJ), as one cumulative J counter.

    Only top-level zones (`intel-rapl:N`) are summed: subzones (`intel-rapl:N:M`, core/uncore/dram) nest
    inside their package, so adding them would count energy twice. A `psys` top-level zone covers the
    whole SoC including the packages, so with a package present it is skipped too. Each zone's counter
    wraps at its `max_energy_range_uj`; a reading smaller than the previous one is a wrap (the energy
    since is `max - prev + now`). Permission errors (root-only since CVE-2020-8694) and absent zones
    (virtual machines, containers) are `Unavailable` with the reason.
    """

    quantity = "cpu_energy"
    unit = "J"
    kind: Kind = "counter"
    evidence: Evidence = "measured"

    def __init__(self, root: str | Path = "/sys/class/powercap", *,
                 read_text: Callable[[Path], str] = lambda p: p.read_text()) -> None:
        self.sensor_id = "rapl.energy"
        self.root = Path(root)
        self._read = read_text
        self.zones: list[Path] = []
        self.skipped: dict[str, str] = {}
        self.max_uj: dict[Path, int] = {}
        self.prev_uj: dict[Path, int] = {}
        self.total_uj = 0
        self.wraps = 0
        self._setup: Unavailable | None = self._discover()
        self._ever_read = False
        self.note = (f"zones {[z.name for z in self.zones]} summed; skipped {self.skipped}" if self.zones else None)

    def _discover(self) -> Unavailable | None:
        if not self.root.is_dir():
            return Unavailable(self.sensor_id, Reason.NO_DEVICE, f"{self.root} does not exist (no powercap/RAPL: "
                                                                 "typical of virtual machines and containers)")
        tops = sorted(p for p in self.root.glob("intel-rapl:*") if p.name.count(":") == 1)
        for sub in sorted(p for p in self.root.glob("intel-rapl:*") if p.name.count(":") >= 2):
            self.skipped[sub.name] = "subzone, nested in its package"
        if not tops:
            return Unavailable(self.sensor_id, Reason.NO_DEVICE, f"no {self.root}/intel-rapl:* zone")
        names = {}
        for z in tops:
            try:
                names[z] = self._read(z / "name").strip()
            except OSError:
                names[z] = ""
        has_package = any(n.startswith("package") for n in names.values())
        for z in tops:
            if has_package and names[z] == "psys":
                self.skipped[z.name] = "psys contains the packages"
                continue
            self.zones.append(z)
        try:
            for z in self.zones:
                self.max_uj[z] = int(self._read(z / "max_energy_range_uj"))
                self.prev_uj[z] = int(self._read(z / "energy_uj"))
        except PermissionError as e:
            return Unavailable(self.sensor_id, Reason.PERMISSION_DENIED,
                               f"{e.filename or self.root}: permission denied (RAPL energy is root-only since the "
                               "CVE-2020-8694 fix)")
        except (OSError, ValueError) as e:
            return Unavailable(self.sensor_id, Reason.ERROR, f"{type(e).__name__}: {e}")
        return None

    def read(self) -> Reading:
        if self._setup is not None:
            return self._setup
        try:
            for z in self.zones:
                now = int(self._read(z / "energy_uj"))
                prev = self.prev_uj[z]
                if now >= prev:
                    self.total_uj += now - prev
                else:  # wrapped at max_energy_range_uj
                    self.total_uj += self.max_uj[z] - prev + now
                    self.wraps += 1
                self.prev_uj[z] = now
        except PermissionError as e:
            return Unavailable(self.sensor_id, Reason.PERMISSION_DENIED, f"{e.filename}: permission denied")
        except FileNotFoundError as e:
            return Unavailable(self.sensor_id, Reason.DISAPPEARED, f"{e.filename} vanished")
        except (OSError, ValueError) as e:
            return Unavailable(self.sensor_id, Reason.ERROR, f"{type(e).__name__}: {e}")
        return Sample(self.sensor_id, self.total_uj / 1e6)


# ------------------------------------------------------------------------- the run's processes' CPU
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """utime + stime of one process in seconds (/proc/<pid>/stat fields 14 and 15, clock ticks), None if gone."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its closing ')'.
    rest = raw[raw.rfind(b")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def run_processes(run_id: str, exclude: set[int], proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> process name of every process started with `--run-dir .../<run_id>` (sites, their workers,
    coordinator, store), found from /proc/<pid>/cmdline. Toxiproxy is not one: it is the WAN emulator."""
    out: dict[int, str] = {}
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) in exclude:
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "--run-dir" not in args:
            continue
        i = args.index("--run-dir")
        if i + 1 >= len(args) or Path(args[i + 1]).name != run_id:
            continue
        out[int(d.name)] = _process_name(args)
    return out


def _process_name(args: list[str]) -> str:
    def after(flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None

    module = after("-m") or ""
    if "worker" in module:
        return f"{after('--site')}.w{after('--rank')}"
    if after("--site"):
        return str(after("--site"))
    if "coordinator" in module or "coordinator" in args:  # `python -m coordinator.service` or `xdc coordinator`
        return "coord"
    if "checkpoint_store" in module or "store" in args:
        return "store"
    return module or args[0]


class ProcessCpuMeter:
    """Measured CPU seconds of the run's processes, cumulative (a process that exits keeps its last reading).

    `list_pids()` -> {pid: name} is called every `scan_period_ns`; `cpu_s(pid)` reads one process. Both
    are injectable. Resolution: one clock tick (10 ms) per process; CPU a process spends after its last
    poll and before it exits is lost (at most one poll period each).
    """

    quantity = "cpu_time"
    unit = "s"
    kind: Kind = "counter"
    evidence: Evidence = "measured"

    def __init__(self, clock: Clock, list_pids: Callable[[], dict[int, str]],
                 cpu_s: Callable[[int], float | None] = proc_cpu_s, scan_period_ns: int = 10**9) -> None:
        self.sensor_id = "proc.cpu_time"
        self.clock = clock
        self.list_pids = list_pids
        self.cpu_s = cpu_s
        self.scan_period_ns = scan_period_ns
        self.next_scan = 0
        self.pids: dict[int, str] = {}
        self.last: dict[int, float] = {}  # pid -> last CPU seconds read
        self.active: set[int] = set()
        self.note = "utime + stime from /proc/<pid>/stat of every process with this run's --run-dir"

    def read(self) -> Reading:
        now = self.clock.mono_ns()
        if now >= self.next_scan:
            try:
                found = self.list_pids()
            except OSError as e:
                return Unavailable(self.sensor_id, Reason.ERROR, f"process scan: {e}")
            self.pids.update(found)
            # Only processes the last scan found are read: a pid that exited may be reused by another process.
            self.active = set(found)
            self.next_scan = now + self.scan_period_ns
        for pid in self.active:
            v = self.cpu_s(pid)
            if v is None:
                continue  # exited: keep its last value
            self.last[pid] = max(v, self.last.get(pid, 0.0))
        return Sample(self.sensor_id, sum(self.last.values()))

    def by_process(self) -> dict[str, float]:
        """CPU seconds per process name (several incarnations of one name add up)."""
        out: dict[str, float] = {}
        for pid, s in self.last.items():
            name = self.pids.get(pid, str(pid))
            out[name] = out.get(name, 0.0) + s
        return out


class ModeledCpuEnergy:
    """`modeled` CPU energy: the CPU meter's measured seconds x a declared per-core power (a `prior`).

    Never `measured`: no energy gate can pass on it. It reads the CPU meter's last value (the sampler
    polls the CPU meter first in each point), so the two stay consistent.
    """

    quantity = "cpu_energy_modeled"
    unit = "J"
    kind: Kind = "counter"
    evidence: Evidence = "modeled"

    def __init__(self, cpu: ProcessCpuMeter, watts_per_core: float) -> None:
        self.sensor_id = "model.cpu_energy"
        self.cpu = cpu
        self.watts_per_core = watts_per_core
        self.note = (f"measured CPU seconds of the run's processes x {watts_per_core:g} W per busy core "
                     "(declared, prior)")

    def read(self) -> Reading:
        return Sample(self.sensor_id, sum(self.cpu.last.values()) * self.watts_per_core)
