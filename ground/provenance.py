"""Where a run came from: the code revision and the runtime, logged once per run as `run_started`.

The analysis reads provenance from the logs only, so the launcher (and `xdc prepare`, for
compose and several hosts) records it at the start of every run. A revision that cannot be read
(no git, an installed package) is recorded as unavailable with the reason, never guessed.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def code_revision(root: Path = ROOT, *, ignoring: tuple[str, ...] = ()) -> dict[str, Any]:
    """{"commit": sha, "dirty": bool} of the source tree, or {"evidence": "unavailable", ...}. `ignoring`:
    paths (relative to the root) whose changes do not make it dirty (a registration's own registry file)."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 *(f":(exclude){p}" for p in ignoring)],
                                capture_output=True, text=True, timeout=5, check=True).stdout
        return {"commit": sha, "dirty": bool(status.strip()), "evidence": "measured"}
    except (OSError, subprocess.SubprocessError) as e:
        return {"commit": None, "dirty": None, "evidence": "unavailable", "reason": f"{type(e).__name__}: {e}"}


def runtime() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "machine": platform.machine(), "executable": sys.executable}
    try:  # the installed version, without importing torch (the launcher stays light)
        from importlib.metadata import version

        out["torch"] = version("torch")
    except Exception as e:  # provenance never fails a run
        out["torch"] = f"unavailable: {type(e).__name__}"
    return out


def run_started_fields() -> dict[str, Any]:
    return {"code_revision": code_revision(), "runtime": runtime(), "argv": sys.argv}
