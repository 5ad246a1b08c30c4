"""A gate must be able to decide before the first run (issue 51): `xdc study register` checks, against the
noise floor measured for the control arm's recipe (bench/results/noise_floor_<study>-v<version>.json) and the
paired differences of the previous published version (bench/results/paired_floor_<study>-v<N>.json), that
every gate can both pass and fail with the protocol's pairs, alpha and margin, and refuses one that cannot,
naming the gate and the numbers. The real CLI on variants of the learning-efficiency protocol written to a
scratch folder and registered in a scratch registry; the decisions alone: tests/unit/test_study_decidability.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "studies" / "protocols" / "learning-efficiency.yaml"


def variant(tmp: Path, *, learning_margin: float, ppf_margin: float, strata: int = 6) -> Path:
    """The learning-efficiency protocol with other margins, or its first `strata` strata only."""
    text = PROTO.read_text().replace("faults: scenarios/none.yaml", f"faults: {ROOT / 'scenarios' / 'none.yaml'}")
    text, n_learning = re.subn(r"(name: learning-noninferior, [^}]*?margin: )[0-9.]+", rf"\g<1>{learning_margin}", text)
    text, n_ppf = re.subn(r"(name: progress-per-flop-noninferior, [^}]*?margin: )[0-9.]+", rf"\g<1>{ppf_margin}", text)
    assert (n_learning, n_ppf) == (1, 1), "the protocol's gates are not where this test expects them"
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
    # checked against the pilot (the previous version's paired differences, bench/results/paired_floor_*)
    assert re.search(r"gate 'learning-noninferior' cannot fail: the pilot's 6 differences, every one turned against "
                     r"the treatment, still give p 0\.01562 <= alpha 0\.05 within margin 10 ", r.stderr), r.stderr
    assert not (tmp_path / "registry.json").exists()


def test_registration_refuses_three_pairs_at_alpha_5_percent(tmp_path):
    r = register(variant(tmp_path, learning_margin=0.1, ppf_margin=0.05, strata=3), tmp_path / "registry.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "with 3 pairs the smallest attainable p is 2^-3 = 0.125 > alpha 0.05" in r.stderr, r.stderr


def test_a_protocol_whose_gates_can_decide_is_registered_with_its_checks(tmp_path):
    reg = tmp_path / "registry.json"
    r = register(variant(tmp_path, learning_margin=0.03, ppf_margin=0.01), reg)
    assert r.returncode == 0, r.stdout + r.stderr
    entry = json.loads(reg.read_text())["studies"]["learning-efficiency"][-1]
    checks = entry["decidability"]
    assert checks["n_pairs"] == 6 and checks["noise_floor"]["record_file"] == "noise_floor_learning-efficiency-v2.json"
    assert [c["status"] for c in checks["gates"]] == ["decides", "decides"]
    assert checks["paired_floor"]["record_file"].startswith("paired_floor_learning-efficiency-v")
    assert all(c["pilot"]["worst_case_p"] > 0.05 for c in checks["gates"])  # the pilot's magnitudes could fail it


def test_registration_refuses_a_margin_over_every_difference_the_pilot_saw(tmp_path):
    """0.1 nats is over every paired difference of the pilot (the largest is 0.089): such a gate would
    come out vacuous, the way the v3 gates did."""
    r = register(variant(tmp_path, learning_margin=0.1, ppf_margin=0.01), tmp_path / "registry.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "gate 'learning-noninferior' cannot fail" in r.stderr and "would come out vacuous" in r.stderr, r.stderr
