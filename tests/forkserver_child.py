"""A module the fork server tests fork into (`python -m tests.forkserver_child MODE`): print, then
exit with a code, raise, or sleep until signalled."""

from __future__ import annotations

import gc
import os
import sys
import time


def main(argv: list[str]) -> int:
    print(f"child {os.getpid()} argv={argv} stdin={sys.stdin.read()!r} frozen={gc.get_freeze_count()}", flush=True)
    mode = argv[0]
    if mode.startswith("exit"):
        return int(mode[4:])
    if mode == "raise":
        raise RuntimeError("the child failed on purpose")
    while True:  # "sleep": until a signal ends it
        time.sleep(0.1)
