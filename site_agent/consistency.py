"""What a site does differently when the consistency setting can change between epochs.

- `plan_setting`: the epoch's setting, start step and previous mode from its plan (a plan without
  them: the run's fixed setting, and the step count of a run that never changes).
- `enter_round`: before a round's compute. Local mode: the outer (global) parameters are set to
  the model's, so a round after sync rounds starts its pseudo-gradient from the right anchor (in
  a run that stays local the two are already bitwise equal: the outer step loads global into the
  model). Sync after local: the members' inner AdamW states differ (each took its own inner
  steps), and sync needs every member to step identically, so the first sync round after a local
  one starts a fresh inner optimizer (same on every member, and in the reference).
- `contribution_stats`: norm of this member's contribution, its dot product with the cluster
  mean, and the mean's norm: the disagreement evidence, from vectors the site holds anyway.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ground.setting import ConsistencySetting, base_setting, is_fixed
from site_agent.model import flat_params
from ground.config import RunConfig


def plan_setting(cfg: RunConfig, plan: Any) -> tuple[ConsistencySetting, int, str]:
    if getattr(plan, "setting", None) is None:
        s = base_setting(cfg)
        return s, plan.start_round * s.steps_per_round, s.mode
    return plan.setting, int(plan.start_step), str(plan.prev_mode)


def max_steps_per_round(cfg: RunConfig) -> int:
    """The most inner steps a round can have in this run (bounds the sample ids a part may carry)."""
    hs = [base_setting(cfg).steps_per_round]
    if cfg.train.mode == "scripted":
        hs += [e.inner_steps_h for e in cfg.train.settings_schedule]
    if cfg.train.mode == "adaptive":
        hs += list(cfg.train.adaptive.h_choices)
    return max(hs)


def enter_round(cfg: RunConfig, trainer: Any, setting: ConsistencySetting, first_of_epoch: bool,
                prev_mode: str) -> str | None:
    """Prepare the trainer for a round in `setting`; returns what was done (for the log), or None."""
    if is_fixed(cfg):
        return None  # the setting never changes: nothing to reconcile, arithmetic exactly as before
    if setting.mode == "local":
        with torch.no_grad():
            trainer.global_params.copy_(flat_params(trainer.model))
        return None
    if first_of_epoch and prev_mode == "local":
        trainer.inner_opt.state.clear()
        return "inner optimizer reset: sync after local"
    return None


def contribution_stats(mine: np.ndarray, mean: np.ndarray) -> dict[str, float]:
    a = mine.astype(np.float64, copy=False)
    m = mean.astype(np.float64, copy=False)
    return {"update_norm": float(np.linalg.norm(a)), "update_dot_mean": float(a @ m),
            "mean_norm": float(np.linalg.norm(m))}
