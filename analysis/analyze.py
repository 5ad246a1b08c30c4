"""`xdc analyze`: run directories (or a comparison) -> artifact.json + report/index.html.

Where the outputs go: a comparison directory gets them beside its index.json; one run
directory gets them inside it; several loose run directories need --out (default: a new
`analysis-<time>` directory next to the first run).
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from analysis.artifact import build_artifact, write_artifact
from analysis.load import expand_inputs, load_run
from analysis.report import write_report


@dataclass
class AnalysisOutput:
    out_dir: Path
    artifact_path: Path
    artifact_sha256: str
    report_path: Path | None
    artifact: dict[str, Any]
    seconds: float


def default_out_dir(runs: list[Path], cmp_dir: Path | None) -> Path:
    if cmp_dir is not None:
        return cmp_dir
    if len(runs) == 1:
        return runs[0]
    return runs[0].parent / f"analysis-{time.strftime('%Y%m%d-%H%M%S')}"


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Millions of small dicts from the logs make the cyclic GC rescan them over and over (it
    doubled the time on 1M events); nothing here builds reference cycles worth collecting."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def analyze(paths: list[str | Path], out_dir: str | Path | None = None, *, report: bool = True) -> AnalysisOutput:
    with _no_cyclic_gc():
        return _analyze(paths, out_dir, report=report)


def _analyze(paths: list[str | Path], out_dir: str | Path | None, *, report: bool) -> AnalysisOutput:
    t0 = time.perf_counter()
    runs, index, cmp_dir = expand_inputs(paths)
    histories = [load_run(p) for p in runs]
    art = build_artifact(runs, index, histories=histories)
    art["generated"]["analysis_s"] = round(time.perf_counter() - t0, 3)  # loading the logs + deriving everything
    out = Path(out_dir) if out_dir else default_out_dir(runs, cmp_dir)
    artifact_path = out / "artifact.json"
    sha = write_artifact(art, artifact_path)
    report_path = write_report(art, histories, out / "report") if report else None
    return AnalysisOutput(out, artifact_path, sha, report_path, art, time.perf_counter() - t0)
