"""What a process used, as it reports it in its last event: its peak resident set size."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: the high-water mark of its own address space
    (Linux `VmHWM`, which an exec resets), else getrusage's `ru_maxrss`. Not `ru_maxrss` on Linux: it
    survives exec, so a process started by fork+exec from a large parent (the launcher under pytest,
    with torch loaded: 350 MiB) reported the parent's size as its own (a coordinator that peaked at
    117 MiB said 350). Pages a forked process shares with its parent count in full, as in its RSS."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except (OSError, ValueError, IndexError):
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux KiB; not reached there
