"""One site's training state and its update rules, without any networking.

`SiteTrainer` holds the model, the inner AdamW optimizer and (in local mode) the DiLoCo
outer state. The site agent calls it around the WAN collective; the sync-equivalence test
calls the same methods in one process, so both follow exactly the same arithmetic.

sync mode, per step:   grads = backward(batch); g = mean over sites (collective); AdamW(g)
local mode, per round: H x [backward(batch); AdamW] on local params;
                       delta = global - local (pseudo-gradient); d = mean over sites;
                       outer (Nesterov) SGD on global with grad d; local <- global

Every optimizer step names the cluster's frontier (`frontier_tokens`: useful tokens trained
before that step, site_agent/lr_schedule.py) and takes its lr from the schedule at that point,
so the lr depends on the data position alone; callers cannot forget it (keyword-only, required).

Intra-site data parallelism (optional): with `group` (a torch.distributed gloo group of the
site's W worker processes), every backward is followed by an all-reduce of the flat grads
(and the loss) over the group, divided by W in float32, so every rank steps with the same
site-mean gradient and all ranks keep bitwise-identical parameters and optimizer state. With
group=None (the default, W = 1) nothing of this runs and the arithmetic is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from site_agent.lr_schedule import inner_lr_at, outer_lr_at
from site_agent.model import (build_model, flat_grads, flat_params, load_flat_grads_, load_flat_params_,
                              measure_flops_per_token, params_hash)
from ground.config import RunConfig


class IntraSiteError(RuntimeError):
    """The site's intra-site process group failed (a worker died, a collective timed out) or its
    ranks disagree."""


class SiteTrainer:
    def __init__(self, cfg: RunConfig, device: torch.device, group: "dist.ProcessGroup | None" = None) -> None:
        self.cfg = cfg
        self.device = device
        self.group = group  # intra-site gloo group of the site's workers; None = single process
        self.world = 1 if group is None else dist.get_world_size(group)
        self.model = build_model(cfg.model, cfg.train.seed).to(device)
        self.model.train()
        self.inner_opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.inner_lr,
                                           weight_decay=cfg.train.inner_weight_decay)
        self.flops_per_token = measure_flops_per_token(self.model, cfg.model, cfg.train.per_site_batch)
        # DiLoCo outer state: the global parameters [P] (float32, CPU) and Nesterov momentum.
        self.global_params = torch.nn.Parameter(flat_params(self.model).clone(), requires_grad=False)
        # torch refuses nesterov=True without momentum; with momentum 0 it is plain SGD anyway.
        self.outer_opt = torch.optim.SGD([self.global_params], lr=cfg.train.outer_lr,
                                         momentum=cfg.train.outer_momentum, nesterov=cfg.train.outer_momentum > 0)
        self.inner_steps = 0
        self.outer_steps = 0
        # What start state replaced the seeded weights (site_agent/init_state.py `start_trainer` loads
        # it); None when the run starts from the seed.
        self.init_state: dict[str, Any] | None = None

    # ----------------------------------------------------------------- sync mode
    def compute_grads(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, np.ndarray]:
        """Loss (nats/token) and flat grads [P] float32 of one batch x, y [B, T]."""
        self.inner_opt.zero_grad(set_to_none=True)
        _, loss = self.model(x.to(self.device), y.to(self.device))
        loss.backward()
        if self.group is None:
            return float(loss.detach()), flat_grads(self.model).numpy()
        site_loss, grads = self._site_mean(flat_grads(self.model), loss.detach())
        return site_loss, grads.numpy()

    def apply_grads(self, avg_grads: np.ndarray, *, frontier_tokens: int) -> None:
        """One AdamW step with the cluster-averaged grads [P], at the lr of `frontier_tokens`."""
        load_flat_grads_(self.model, torch.from_numpy(avg_grads))
        self._set_inner_lr(frontier_tokens)
        self.inner_opt.step()
        self.inner_steps += 1

    # ---------------------------------------------------------------- local mode
    def inner_step(self, x: torch.Tensor, y: torch.Tensor, *, frontier_tokens: int) -> float:
        """One local AdamW step on x, y [B, T] at the lr of `frontier_tokens`; returns the loss."""
        self._set_inner_lr(frontier_tokens)
        self.inner_opt.zero_grad(set_to_none=True)
        _, loss = self.model(x.to(self.device), y.to(self.device))
        loss.backward()
        if self.group is not None:
            site_loss, grads = self._site_mean(flat_grads(self.model), loss.detach())
            load_flat_grads_(self.model, grads)
            self.inner_opt.step()
            self.inner_steps += 1
            return site_loss
        self.inner_opt.step()
        self.inner_steps += 1
        return float(loss.detach())

    def pseudo_gradient(self) -> np.ndarray:
        """global - local [P] float32: the direction the outer optimizer descends along."""
        return (self.global_params.detach() - flat_params(self.model)).numpy()

    def apply_outer(self, avg_pseudo: np.ndarray, *, frontier_tokens: int) -> None:
        """Outer SGD step with the cluster-mean pseudo-gradient [P]; `frontier_tokens` is the
        round's start (its lr is scheduled only with train.outer_lr_scheduled)."""
        self.global_params.grad = torch.from_numpy(avg_pseudo.copy())
        lr = outer_lr_at(self.cfg, frontier_tokens)
        for g in self.outer_opt.param_groups:
            g["lr"] = lr
        self.outer_opt.step()
        self.outer_opt.zero_grad(set_to_none=True)
        load_flat_params_(self.model, self.global_params.detach())
        self.outer_steps += 1

    def _set_inner_lr(self, frontier_tokens: int) -> None:
        lr = inner_lr_at(self.cfg, frontier_tokens)
        for g in self.inner_opt.param_groups:
            g["lr"] = lr

    # ------------------------------------------------------- intra-site averaging
    def _site_mean(self, flat: torch.Tensor, loss: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Mean over the intra-site group of this rank's flat grads [P] and loss: one gloo
        all-reduce (SUM) of [grads, loss] [P + 1] float32, then / W. gloo leaves the same bits on
        every rank (each element is reduced once and then distributed); the agent's per-round
        intra_site_check verifies that the ranks' parameters stay identical."""
        buf = torch.empty(flat.numel() + 1, dtype=torch.float32)  # [P + 1]
        buf[:-1] = flat
        buf[-1] = loss.to("cpu", torch.float32)
        try:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        except Exception as e:  # a worker died or timed out: gloo raises DistBackendError/RuntimeError
            raise IntraSiteError(f"intra-site all-reduce failed: {type(e).__name__}: {e}") from e
        buf /= self.world  # float32 / int: stays float32
        return float(buf[-1]), buf[:-1]

    # ------------------------------------------------------------------ identity
    def params_hash(self) -> str:
        return params_hash(self.model)

    def state_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """Checkpoint blobs: model parameters, inner AdamW state, outer state (CPU tensors)."""
        # named_parameters, not state_dict: the tied head would be a shared tensor, which safetensors refuses.
        model = {k: v.detach().to("cpu").clone() for k, v in self.model.named_parameters()}
        inner: dict[str, torch.Tensor] = {}
        names = [n for n, _ in self.model.named_parameters()]
        for (name, p) in zip(names, self.model.parameters()):
            st = self.inner_opt.state.get(p, {})
            for key, val in st.items():
                t = val if torch.is_tensor(val) else torch.tensor(val)
                inner[f"{name}.{key}"] = t.detach().to("cpu").contiguous()
        outer = {"global_params": self.global_params.detach().clone()}
        mom = self.outer_opt.state.get(self.global_params, {}).get("momentum_buffer")
        if mom is not None:
            outer["momentum"] = mom.detach().clone()
        return {"model": model, "inner_optim": inner, "outer": outer}
