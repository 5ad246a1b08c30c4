"""A gate must be able to decide before the first run (issue 51): `xdc study register` checks, against the
noise floor measured for the control arm's recipe (bench/results/noise_floor_<study>-v<version>.json), that
every gate can both pass and fail with the protocol's pairs, alpha and margin, and refuses one that cannot,
naming the gate and the numbers. Unit tests of studies/decidability.py, and the real CLI on variants of the
learning-efficiency protocol written to a scratch folder and registered in a scratch registry."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from studies.decidability import check_gate, refusal

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "studies" / "protocols" / "learning-efficiency.yaml"
FLOOR = {"evidence": "measured", "threshold_nats": 0.0555, "mean_nll": 2.05}
NLL_GATE = {"name": "learning", "metric": "final_heldout_nll", "kind": "noninferiority", "margin": 0.1, "alpha": 0.05}


def test_three_pairs_at_alpha_5_percent_cannot_pass():
    c = check_gate(NLL_GATE, 3, FLOOR)
    assert (c["can_pass"], c["decides"], c["status"]) == (False, False, "cannot decide")
    assert "2^-3 = 0.125 > alpha 0.05" in c["reason"]


def test_a_margin_of_ten_nats_cannot_fail_and_one_under_the_floor_cannot_pass():
    c = check_gate({**NLL_GATE, "margin": 10.0}, 6, FLOOR)
    assert (c["can_pass"], c["can_fail"]) == (True, False) and "no plausible difference exceeds it" in c["reason"]
    c = check_gate({**NLL_GATE, "margin": 0.05}, 6, FLOOR)
    assert (c["can_pass"], c["can_fail"]) == (False, True) and "under the measurable difference 0.0555" in c["reason"]
    assert "cannot pass" in refusal([c])


def test_a_gate_the_noise_floor_says_nothing_about_is_unknown_not_refused():
    c = check_gate({"name": "bytes", "metric": "inter_site_bytes", "kind": "noninferiority", "margin": 0.1,
                    "alpha": 0.05, "relative": True}, 6, FLOOR)
    assert c["status"] == "unknown" and c["decides"] and refusal([c]) is None
    c = check_gate({"name": "ticks", "metric": "opportunity_ticks", "kind": "superiority", "margin": 0, "alpha": 0.05},
                   6, FLOOR)
    assert c["status"] == "decides"
    c = check_gate(NLL_GATE, 6, FLOOR)
    assert c["status"] == "decides" and c["measurable_difference"] == 0.0555


def variant(tmp: Path, *, learning_margin: float, ppf_margin: float, strata: int = 6) -> Path:
    """The learning-efficiency protocol with other margins, or its first `strata` strata only."""
    text = PROTO.read_text().replace("faults: scenarios/none.yaml", f"faults: {ROOT / 'scenarios' / 'none.yaml'}")
    text = text.replace("margin: 0.08,\n     alpha: 0.05", f"margin: {learning_margin},\n     alpha: 0.05")
    text = text.replace("margin: 0.03, relative: true", f"margin: {ppf_margin}, relative: true")
    lines = text.splitlines()
    if strata < 6:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("  - {name: m1,"))
        end = next(i for i, ln in enumerate(lines) if ln.startswith("metrics:"))
        keep, n = [], 0
        for ln in lines[start:end]:
            n += ln.startswith("  - {name: m")
            if n <= strata:
                keep.append(ln)
        lines = lines[:start] + keep + lines[end:]
    path = tmp / "learning-efficiency.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def register(path: Path, registry: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdc.cli", "study", "register", str(path), "--registry",
                           str(registry)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_registration_refuses_a_margin_of_ten_nats_naming_the_gate_and_the_numbers(tmp_path):
    r = register(variant(tmp_path, learning_margin=10, ppf_margin=0.05), tmp_path / "registry.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(r"gate 'learning-noninferior' cannot fail: margin 10 is more than 10 x the measurable "
                     r"difference 0\.06\d+", r.stderr), r.stderr
    assert not (tmp_path / "registry.json").exists()


def test_registration_refuses_three_pairs_at_alpha_5_percent(tmp_path):
    r = register(variant(tmp_path, learning_margin=0.1, ppf_margin=0.05, strata=3), tmp_path / "registry.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "with 3 pairs the smallest attainable p is 2^-3 = 0.125 > alpha 0.05" in r.stderr, r.stderr


def test_a_protocol_whose_gates_can_decide_is_registered_with_its_checks(tmp_path):
    reg = tmp_path / "registry.json"
    r = register(variant(tmp_path, learning_margin=0.1, ppf_margin=0.05), reg)
    assert r.returncode == 0, r.stdout + r.stderr
    entry = json.loads(reg.read_text())["studies"]["learning-efficiency"][-1]
    checks = entry["decidability"]
    assert checks["n_pairs"] == 6 and checks["noise_floor"]["record_file"] == "noise_floor_learning-efficiency-v2.json"
    assert [c["status"] for c in checks["gates"]] == ["decides", "decides"]
