"""The paired-difference floor: how much one stratum's treatment - control difference varies, measured
on a pilot (an earlier published version of the same study, same arms and strata), and what a gate of
the next version would have said on the pilot's differences.

Why a second floor: the noise floor (`xdc noise-floor`) is the spread between two *seeds* of one
config; a study pairs its arms on one seed and one data order, so most of that spread cancels in each
difference. Learning margins set over the seed floor (0.057-0.068 nats) were larger than every paired
difference the v2/v3 studies measured (at most 0.012 and 0.089 nats): the gates could not fail. The
measurable paired difference here is a robust standard deviation of the pilot's differences
(1.4826 x the median absolute deviation; the plain one where that is 0), in the gate's units
(metric units, or treatment / control - 1 for a relative gate).

A record is written by `xdc study paired-floor results/<study>-v<N>/artifact.json` to
bench/results/paired_floor_<study>-v<N>.json. Standard library only (the registration check and
the page use it without numpy).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
MAD_TO_SD = 1.4826  # the normal distribution's sd per median absolute deviation
MAX_EXACT_PAIRS = 16  # 2^16 sign patterns: enumerated exactly in well under a second


def sign_flip_p(x: Sequence[float]) -> float:
    """One-sided exact sign-flip p of mean(x) > 0: the share of the 2^n sign patterns whose sum is at
    least the observed one (ties count, as in scipy.stats.permutation_test)."""
    n = len(x)
    if n == 0:
        return 1.0
    if n > MAX_EXACT_PAIRS:
        raise ValueError(f"{n} pairs: exact enumeration is limited to {MAX_EXACT_PAIRS}")
    mags = [abs(float(v)) for v in x]
    observed = sum(float(v) for v in x)
    tol = 1e-9 * sum(mags)  # relative: progress-per-FLOP differences are ~1e-14
    hits = sum(1 for signs in itertools.product((1.0, -1.0), repeat=n)
               if sum(s * m for s, m in zip(signs, mags)) >= observed - tol)
    return hits / 2 ** n


def robust_sd(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation from the median; the sample sd where that is 0."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return MAD_TO_SD * mad if mad > 0 else statistics.stdev(values)


def record_from_artifact(artifact: dict[str, Any], source: str, sha256: str) -> dict[str, Any]:
    """The paired floor of a published study artifact: per metric, the evaluation split's differences
    (treatment - control) and relative differences (treatment / control - 1), with their robust sd."""
    proto = artifact["protocol"]
    split = artifact["study"].get("evaluation_split") or proto.get("evaluation", {}).get("split", "heldout")
    pairs = [q for q in artifact["pairs"] if q["split"] == split]
    metrics: dict[str, Any] = {}
    for m in sorted({k for q in pairs for k in q["values"]}):
        vals = [q["values"][m] for q in pairs]
        if any(v.get("difference") is None for v in vals):
            metrics[m] = {"evidence": "unavailable", "reason": "a pair has no value"}
            continue
        d = [float(v["difference"]) for v in vals]
        rel = [None if v.get("ratio") is None else float(v["ratio"]) - 1.0 for v in vals]
        metrics[m] = {"evidence": vals[0].get("evidence", "measured"), "n": len(d), "differences": d,
                      "robust_sd": robust_sd(d),
                      "relative_differences": rel if None not in rel else None,
                      "relative_robust_sd": robust_sd(rel) if None not in rel else None}  # type: ignore[arg-type]
    revs = sorted({r["code_revision"].get("commit") or "" for r in artifact.get("runs", [])})
    treatment = pairs[0]["treatment_key"].split("/")[-1] if pairs else proto["contrast"]["treatment"]
    control = pairs[0]["control_key"].split("/")[-1] if pairs else proto["contrast"]["control"]
    return {"kind": "paired_floor", "evidence": "measured",
            "what": "per-stratum treatment - control differences of a published pilot study (evaluation split)",
            "source": {"artifact": source, "artifact_sha256": sha256, "study": artifact["study"]["name"],
                       "version": artifact["study"]["version"], "treatment": treatment, "control": control,
                       "split": split, "strata": [q["stratum"] for q in pairs], "code_revisions": revs},
            "metrics": metrics}


def write_record(artifact_path: Path, out_dir: Path = RESULTS_DIR) -> Path:
    raw = artifact_path.read_bytes()
    art = json.loads(raw)
    try:
        src = str(artifact_path.resolve().relative_to(ROOT))
    except ValueError:
        src = str(artifact_path)
    rec = record_from_artifact(art, src, hashlib.sha256(raw).hexdigest())
    out = out_dir / f"paired_floor_{rec['source']['study']}-v{rec['source']['version']}.json"
    out.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return out


def find_record(study: str, version: int, treatment: str, controls: Sequence[str],
                results_dir: Path = RESULTS_DIR, strata: Sequence[str] | None = None,
                split: str | None = None) -> dict[str, Any] | None:
    """The newest pilot of this study (an earlier version) with the same treatment, a control among
    `controls` and (when given) the same evaluation split and strata, with its file name; None when
    there is none."""
    best: dict[str, Any] | None = None
    for path in sorted(results_dir.glob(f"paired_floor_{study}-v*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        src = rec.get("source") or {}
        if (rec.get("kind") != "paired_floor" or src.get("study") != study or int(src.get("version", 0)) >= version
                or src.get("treatment") != treatment or src.get("control") not in controls
                or (split is not None and src.get("split") != split)
                or (strata is not None and list(src.get("strata") or []) != list(strata))):
            continue
        if best is None or src["version"] > best["source"]["version"]:
            best = {**rec, "record_file": path.name}
    return best


def gate_pilot(gate: dict[str, Any], rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pilot's differences for one gate, oriented (positive = the treatment did better) and in the
    gate's units, with their robust sd; None when the pilot has nothing measured for the metric."""
    if rec is None:
        return None
    m = (rec.get("metrics") or {}).get(gate["metric"])
    if not m or m.get("evidence") == "unavailable":
        return None
    vals = m["relative_differences"] if gate.get("relative") else m["differences"]
    if vals is None:
        return None
    sign = 1.0 if gate.get("direction") == "higher" else -1.0
    e = [sign * float(v) for v in vals]
    sd = m["relative_robust_sd"] if gate.get("relative") else m["robust_sd"]
    return {"oriented": e, "robust_sd": float(sd), "n": len(e),
            "source": f"{rec['record_file']}: {len(e)} paired differences of {rec['source']['study']} "
                      f"v{rec['source']['version']}"}
