"""The simulator's learning curve: held-out NLL as a function of useful tokens and H, fitted to
emulator runs where they exist (`modeled`, with the fit's uncertainty), a prior where they don't.

    nll(T, H) = floor + (start - floor) * (1 + T_eff / scale) ** -alpha,
    T_eff     = T * max(0, 1 - h_penalty * log2 H)

T: useful tokens the evaluated state was trained on; H: inner steps between synchronisations
(1 in sync mode). The prior's constants are guesses (`PRIOR_SOURCE`). `fit_learning` reads every
`eval` event of every site of the given emulator runs (`heldout_nll`, `heldout_nll_se`,
`useful_tokens_trained`) and fits the four curve constants by weighted least squares
(scipy.optimize.curve_fit, sigma = each point's standard error); the H penalty is fitted only when
the runs span at least two H values (otherwise it stays the prior's, and says so). Uncertainty is
one standard deviation from the fit's covariance; a curve fitted on runs of one configuration
says nothing about others (the simulator's page states the transfer boundary).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ground.config import config_from_json
from ground.eventlog import process_events

PRIOR_SOURCE = ("prior: power law in tokens (Kaplan et al. 2020, arXiv:2001.08361); an H penalty that grows "
                "slowly with H (DiLoCo, Douillard et al. 2023, arXiv:2311.08105, reports small losses to H=500); "
                "every constant guessed for the byte-level model, not fitted")
MIN_POINTS = 5  # fewer distinct evaluations than this: no fit, the prior stays
CONSTANTS = ("start_nll", "floor_nll", "scale_tokens", "alpha")


@dataclass(frozen=True)
class LearningCurve:
    start_nll: float = 5.5
    floor_nll: float = 2.0
    scale_tokens: float = 2e5
    alpha: float = 0.5
    h_penalty_per_doubling: float = 0.02
    evidence: str = "prior"
    source: str = PRIOR_SOURCE
    uncertainty: Mapping[str, float] = field(default_factory=dict)  # constant -> 1 sd of the fit
    n_points: int = 0
    source_runs: tuple[str, ...] = ()
    rmse_nats: float | None = None  # of the fit on its own points

    def nll(self, tokens: float, h: int = 1) -> float:
        eff = tokens * max(0.0, 1.0 - self.h_penalty_per_doubling * math.log2(max(1, h)))
        return self.floor_nll + (self.start_nll - self.floor_nll) * (1.0 + eff / self.scale_tokens) ** -self.alpha

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["uncertainty"] = dict(self.uncertainty)
        d["source_runs"] = list(self.source_runs)
        return d

    @staticmethod
    def from_json(doc: Mapping[str, Any] | None) -> "LearningCurve":
        if not doc:
            return LearningCurve()
        known = {f for f in LearningCurve.__dataclass_fields__}
        vals = {k: v for k, v in doc.items() if k in known}
        vals["source_runs"] = tuple(vals.get("source_runs", ()))
        return LearningCurve(**vals)


PRIOR = LearningCurve()


def eval_points(run: Path) -> list[tuple[float, int, float, float]]:
    """(useful tokens trained, H, held-out NLL, its standard error) of every evaluation in a run."""
    cfg = config_from_json(run / "config.json")
    h = 1 if cfg.train.mode == "sync" else cfg.train.inner_steps_h
    out = []
    for site in cfg.cluster.sites:
        for e in process_events(run, site):
            if e.get("event") == "eval" and e.get("heldout_nll") is not None and "useful_tokens_trained" in e:
                out.append((float(e["useful_tokens_trained"]), int(h), float(e["heldout_nll"]),
                            float(e.get("heldout_nll_se") or 0.0)))
    return out


def fit_learning(runs: Iterable[str | Path], prior: LearningCurve = PRIOR) -> LearningCurve:
    """The curve fitted to the runs' evaluations; the prior (unchanged, `prior`) when there are too few."""
    from scipy.optimize import curve_fit

    runs = [Path(r) for r in runs]
    pts = sorted({p for r in runs for p in eval_points(r)})
    if len({(t, h) for t, h, _n, _s in pts}) < MIN_POINTS:
        return prior
    t = np.array([p[0] for p in pts])
    hs = np.array([p[1] for p in pts], dtype=float)
    y = np.array([p[2] for p in pts])
    se = np.array([p[3] for p in pts])
    sigma = np.where(se > 0, se, max(float(np.median(se[se > 0])) if (se > 0).any() else 0.05, 1e-3))
    fit_h = len(set(hs.tolist())) >= 2

    def model(x: np.ndarray, start: float, floor: float, scale: float, alpha: float, *hp: float) -> np.ndarray:
        pen = hp[0] if hp else prior.h_penalty_per_doubling
        eff = x[0] * np.maximum(0.0, 1.0 - pen * np.log2(np.maximum(1.0, x[1])))
        return floor + (start - floor) * (1.0 + eff / scale) ** -alpha

    p0 = [max(y), min(y) - 0.2, prior.scale_tokens, prior.alpha] + ([prior.h_penalty_per_doubling] if fit_h else [])
    lo = [0.0, 0.0, 1e2, 0.05] + ([0.0] if fit_h else [])
    hi = [20.0, 20.0, 1e9, 3.0] + ([0.3] if fit_h else [])
    popt, pcov = curve_fit(model, np.vstack([t, hs]), y, p0=p0, sigma=sigma, absolute_sigma=True,
                           bounds=(lo, hi), maxfev=20_000)
    sd = np.sqrt(np.clip(np.diag(pcov), 0, None))
    names = list(CONSTANTS) + (["h_penalty_per_doubling"] if fit_h else [])
    resid = y - model(np.vstack([t, hs]), *popt)
    hp = float(popt[4]) if fit_h else prior.h_penalty_per_doubling
    src = (f"fitted (weighted least squares, scipy curve_fit) to {len(pts)} held-out evaluations of "
           f"{len(runs)} emulator run(s); H values {sorted({int(x) for x in hs})}"
           + ("" if fit_h else f"; the H penalty is the prior's ({prior.h_penalty_per_doubling}): one H value "
                               "cannot fit it"))
    return LearningCurve(start_nll=float(popt[0]), floor_nll=float(popt[1]), scale_tokens=float(popt[2]),
                         alpha=float(popt[3]), h_penalty_per_doubling=hp, evidence="modeled", source=src,
                         uncertainty={n: float(s) for n, s in zip(names, sd)}, n_points=len(pts),
                         source_runs=tuple(sorted(r.name for r in runs)),
                         rmse_nats=float(np.sqrt(np.mean(resid ** 2))))
