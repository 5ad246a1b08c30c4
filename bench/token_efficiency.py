"""Learning per token of each consistency setting, relative to a reference: the priors of controller v2.

`python -m bench.token_efficiency [--tokens 524288] [--out bench/results/token_efficiency.json]`

Controller v2 (control/progress_rate.py) predicts learning per second as rho(setting) x tokens per
second; rho is learning per token relative to sync, a property of the recipe, not of the link. This
measures it on the controller-heldout recipe (2 layers, 2 samples per site per inner step, 3 sites,
the useful-token lr schedule) with the one-process DiLoCo simulation (bench/diloco_sim.py, the
sites' own trainer and sample order; compression as the collective applies it): H = 4, 8, 16, 32
uncompressed and H = 8 with fp16 and int8, one seed each.

Token efficiency of run X against reference R: at each evaluation of X past the warm-up (t tokens,
NLL x), the tokens R needed to reach x (linear interpolation on R's curve), divided by t. The
median over the evaluations is X's efficiency. H: the exponent b of rho = H ** -b is the least-
squares slope of log efficiency against log(H / 4) (reference H = 4); compression: the efficiency
of H = 8 fp16 / int8 against H = 8 uncompressed. One seed: the numbers are priors (a measured
recipe property with no noise floor of their own), recorded with the curves they come from.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import env_info, tree_state

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ["model.n_layers=2"]
RUNS = [("h4", 4, "none"), ("h8", 8, "none"), ("h16", 16, "none"), ("h32", 32, "none"),
        ("h8-fp16", 8, "fp16"), ("h8-int8", 8, "int8")]


def tokens_to_reach(curve: list[tuple[int, float]], nll: float) -> float | None:
    """Tokens at which `curve` (tokens, NLL; NLL falling) first reaches `nll`, interpolated; None outside it."""
    for (t0, n0), (t1, n1) in zip(curve, curve[1:]):
        if n0 >= nll >= n1 and n0 != n1:
            return t0 + (n0 - nll) / (n0 - n1) * (t1 - t0)
    return None


def efficiency(run: list[tuple[int, float]], ref: list[tuple[int, float]], past_tokens: int) -> float | None:
    """Median over run's evaluations past `past_tokens` of (tokens ref needs for that NLL) / tokens."""
    ratios = sorted(r / t for t, n in run if t > past_tokens and (r := tokens_to_reach(ref, n)) is not None)
    if not ratios:
        return None
    k = len(ratios)
    return ratios[k // 2] if k % 2 else 0.5 * (ratios[k // 2 - 1] + ratios[k // 2])


def fit_exponent(eff_by_h: dict[int, float], h_ref: int) -> float:
    """b of eff(H) = (H / h_ref) ** -b, least squares through the origin in log-log."""
    xs = [math.log(h / h_ref) for h in eff_by_h]
    ys = [math.log(e) for e in eff_by_h.values()]
    return -sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)


def measure(tokens: int, batch: int, eval_every: int) -> dict[str, Any]:
    curves: dict[str, list[tuple[int, float]]] = {}
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="xdc-token-eff-") as tmp:
        for label, h, comp in RUNS:
            out = Path(tmp) / f"{label}.json"
            cmd = [sys.executable, "-m", "bench.diloco_sim", "--H", str(h), "--batch", str(batch), "--tokens",
                   str(tokens), "--eval-every-tokens", str(eval_every), "--label", label, "--out", str(out),
                   *[a for o in RECIPE + [f"train.compression={comp}"] for a in ("--set", o)]]
            print("running", " ".join(cmd[2:]), flush=True)
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            row = json.loads(out.read_text())[-1]
            rows[label] = row
            curves[label] = [(int(t), float(n)) for t, n in row["curve"]]
    past = 2 * eval_every  # past the warm-up and the first fast drop
    eff_h = {h: efficiency(curves[lab], curves["h4"], past) for lab, h, c in RUNS if c == "none" and h != 4}
    eff_h = {h: e for h, e in eff_h.items() if e is not None}
    fp16 = efficiency(curves["h8-fp16"], curves["h8"], past)
    int8 = efficiency(curves["h8-int8"], curves["h8"], past)
    return {"efficiency_vs_h4": {str(h): round(e, 4) for h, e in eff_h.items()},
            "token_efficiency_exponent": round(fit_exponent(eff_h, 4), 4) if eff_h else None,
            "fp16_token_efficiency": round(fp16, 4) if fp16 is not None else None,
            "int8_token_efficiency": round(int8, 4) if int8 is not None else None,
            "final_nll": {lab: rows[lab]["final_nll"] for lab in rows},
            "runs": {lab: {k: rows[lab][k] for k in ("H", "per_site_batch", "overrides", "curve", "final_nll", "cpu_s",
                                                     "dataset_id", "eval_set")} for lab in rows}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.token_efficiency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=524_288)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--eval-every-tokens", type=int, default=49_152)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "token_efficiency.json")
    args = ap.parse_args(argv)
    got = measure(args.tokens, args.batch, args.eval_every_tokens)
    record = {"name": "token_efficiency", "what": __doc__.split("\n\n")[0],
              "command": "python -m bench.token_efficiency " + " ".join(argv or sys.argv[1:]),
              "recipe": {"overrides": RECIPE, "per_site_batch": args.batch, "target_useful_tokens": args.tokens,
                         "workers": 3, "seed": 0},
              "env": {k: v for k, v in env_info("").items() if k not in ("toxiproxy", "curve", "pyzmq", "libzmq")},
              **tree_state(["bench/diloco_sim.py", "bench/token_efficiency.py", "site_agent/", "site_core/", "ground/"]), **got}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("token_efficiency_exponent", "fp16_token_efficiency",
                                             "int8_token_efficiency", "efficiency_vs_h4", "final_nll")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
