"""A warm standby site process: everything a site does before it knows its name, done ahead.

`python -m site_agent.agent --run-dir RUN --standby` imports torch, loads the corpus and its
sample order, builds the trainer (the deterministic initial weights: the same for every site),
and runs one forward/backward/optimizer step on a *copy* of the model (under a forked RNG, so
nothing the run depends on changes) to warm the kernels and the allocator. Then it waits on
stdin for one line naming the site it is to become, and goes on as `--site NAME` would.

Why: a restarted site's cold start (python, torch import, model build, the first step's warm-up)
dominated restart -> first commit (issue 9's rejoin goal). The launcher (cluster/launcher.py) keeps
one standby when `recovery.warm_standby` is on and hands a chaos restart to it. The standby
joins exactly as a cold process would: it has no state a fresh process would not have.

An empty stdin (the launcher closed it: the run ended) exits 0 without a word; a line that
names no site of the cluster is an error (exit 2), never a guess.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import torch

from ground.config import RunConfig
from site_agent.data import load_corpus, sample_order
from site_agent.model import pick_device
from site_agent.init_state import start_trainer
from site_agent.trainer import SiteTrainer


@dataclass
class Prepared:
    """What a site needs before its name: device, corpus, sample order, trainer; and when."""

    device: torch.device
    corpus: Any
    order: np.ndarray
    trainer: SiteTrainer
    started_mono_ns: int  # this process began preparing
    ready_mono_ns: int  # prepared and warmed: waiting for a name
    assigned_mono_ns: int = 0  # the name arrived

    def timing(self) -> dict[str, Any]:
        """The `warm_standby` field of `site_started`: how long it prepared, and how long it waited."""
        return {"started_mono_ns": self.started_mono_ns, "ready_mono_ns": self.ready_mono_ns,
                "assigned_mono_ns": self.assigned_mono_ns,
                "prepare_s": round((self.ready_mono_ns - self.started_mono_ns) / 1e9, 3),
                "waited_s": round((self.assigned_mono_ns - self.ready_mono_ns) / 1e9, 3)}


def warm_up(trainer: SiteTrainer, cfg: RunConfig) -> None:
    """One training step of a copy of the model on a batch of zeros, shape (per_site_batch, seq_len):
    the kernels, their caches and the allocator are warm; the trainer and every RNG are untouched."""
    model = copy.deepcopy(trainer.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.inner_lr)
    x = torch.zeros((cfg.train.per_site_batch, cfg.model.seq_len), dtype=torch.long, device=trainer.device)
    devices = [trainer.device] if trainer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        _, loss = model(x, x)
        loss.backward()
        opt.step()


def load_inputs(cfg: RunConfig) -> tuple[torch.device, Any, np.ndarray]:
    """(device, corpus, sample order): what every site loads first, cold or as a standby."""
    corpus = load_corpus(cfg.data)
    return pick_device(cfg.train.device), corpus, sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)


def prepare(cfg: RunConfig) -> Prepared:
    t0 = time.monotonic_ns()
    device, corpus, order = load_inputs(cfg)
    trainer = start_trainer(cfg, device)
    warm_up(trainer, cfg)
    return Prepared(device, corpus, order, trainer, t0, time.monotonic_ns())


def wait_for_site(cfg: RunConfig, warm: Prepared, stdin: TextIO | None = None) -> str | None:
    """Block until the launcher names the site this process is to become; None at end of input."""
    line = (stdin or sys.stdin).readline()
    warm.assigned_mono_ns = time.monotonic_ns()
    name = line.strip()
    if not name:
        return None
    if name not in cfg.cluster.sites:
        print(f"error: standby told to become {name!r}, not a site of {list(cfg.cluster.sites)}", file=sys.stderr)
        raise SystemExit(2)
    return name
