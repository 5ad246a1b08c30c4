"""The published page (`make report`) on a fresh clone: a git clone of this repository's HEAD builds
the page with the standard library only (no torch, no training process), under 60 s. The page's
contents: tests/unit/test_results_page.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from xdc.publish import SECTIONS, STATES
from tests.helpers_results_page import sections_of

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_clone_builds_the_page_from_the_committed_results_without_torch_in_seconds(tmp_path):
    clone = tmp_path / "xdc"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert not (clone / "runs").exists()
    (clone / "results" / "site" / "index.html").unlink()
    probe = ("import sys; import xdc.results_page as r; r.main([]); "
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'zmq', 'duckdb')); "
             "assert not heavy, heavy")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", probe], cwd=clone, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(clone)})
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < 60, f"the page took {took:.1f} s"
    page = (clone / "results" / "site" / "index.html").read_text(encoding="utf-8")
    assert [s for s, _, _ in sections_of(page)] == list(SECTIONS)
    assert all(state in STATES and len(sentence) > 20 for _, state, sentence in sections_of(page))
    assert json.loads((clone / "results" / "demo" / "result.json").read_text())["state"] in STATES
