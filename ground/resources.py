"""What a process used, as it reports it in its last event: its peak resident set size."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (Linux reports ru_maxrss in KiB). Pages a forked
    process shares with its parent count in full, as they do in its RSS."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
