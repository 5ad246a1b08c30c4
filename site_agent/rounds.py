"""A site's round loop: train round by round from an epoch's start until the target or an interruption.

One round is compute (sync: one backward; local: up to H inner AdamW steps, each logged as
`work_attempted`) -> the collective over the WAN -> apply the cluster mean -> report to the
coordinator -> evaluate and checkpoint (leader) on their schedule -> wait at a fault gate, if the
round reached one (ground/gates.py: the chaos driver's progress-triggered fault lands before the next
round on every site).

`RoundLoop` holds methods only: `site_agent.agent.Site` owns the state they use.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ground import gates
from ground.config import RunConfig
from ground.setting import ConsistencySetting, effective_config, step_after_round
from ground.schedule import carried_steps, ids_at, kept_steps, round_span, site_round_layout
from ground.topology import COORD
from site_agent.collective import CollectiveAborted
from site_agent.carry import MidState, RoundProgress
from site_agent.consistency import contribution_stats, enter_round, plan_setting
from site_agent.data import batch_for
from site_agent.state import merge_retained, samples_sha256, take_snapshot
from site_agent.unwind import Interrupted
from site_agent.worker import rank_slice
from wan.frames import TrafficClass

CONTROL = TrafficClass.CONTROL.value
TELEMETRY = TrafficClass.TELEMETRY.value


class RoundLoop:
    """Training rounds for Site (state: plan, trainer, allreduce, snapshots, retained, pool, run_dir, ...)."""

    def train(self) -> None:
        """Train round by round from the plan's start until the target, or until interrupted."""
        try:
            self._train()
        finally:
            self.inflight = None

    def _train(self) -> None:
        log, plan = self.log, self.plan
        assert plan is not None
        setting, start_step, prev_mode = plan_setting(self.cfg, plan)
        cfg = effective_config(self.cfg, setting)  # this epoch's mode, H and compression
        members = list(plan.members)
        n, idx = len(members), members.index(self.me)
        rnd = plan.start_round
        phash: str | None = None  # params hash of the trainer's state after the last round applied here
        while True:
            cs, ce = round_span(cfg, n, plan.start_round, plan.start_cursor, rnd, self.target)
            if cs >= self.target:
                break
            step = self._begin_round(rnd, setting, start_step, prev_mode, phash)
            t_compute = time.monotonic()
            payload, ids_round, losses = self.compute(rnd, n, idx, cs, ce, cfg)
            t_comm = time.monotonic()
            t_compute = t_comm - t_compute
            avg, stats, last = self._reduce(rnd, payload, members, cfg, ids_round)
            t_comm = time.monotonic() - t_comm
            round_ids = _round_samples(stats, members)
            cycle = {"compute_s": t_compute, "inner_steps": len(losses), "comm_s": t_comm,
                     "payload_bytes": int(last.payload_bytes_sent), "stalls": int(last.rejected),
                     "loss": float(np.mean(losses)) if losses else None, **contribution_stats(payload, avg)}
            phash = self._apply_round(rnd, cfg, cs, avg, round_ids)
            self._report_round(rnd, step, phash, cs, ce, ids_round, losses, cycle, cfg)
            if self._after_round(rnd, ce, cfg):
                break
            self._fault_gates(rnd, cs, ce, cfg)
            rnd += 1
        self.evaluator.wait()  # the last round's evaluation is logged before the site says it is done
        self.ckpt.wait()  # and the last checkpoint is durable
        self.done_epoch = self.epoch
        self.node.send(COORD, "site_done", CONTROL, {"round": self.status["round"]})
        log.emit("target_reached", epoch=self.epoch, round=self.status["round"])

    def _begin_round(self, rnd: int, setting: ConsistencySetting, start_step: int, prev_mode: str,
                     phash: str | None) -> int:
        """Enter round `rnd`: check for a newer epoch, snapshot its start state, enter its setting.
        Returns the inner steps taken once it is done."""
        log, plan = self.log, self.plan
        assert plan is not None
        self.inflight = rnd
        if self.newer_plan_waiting():
            raise Interrupted("a newer epoch takes effect at this round")
        self.status["round"] = rnd
        step = step_after_round(start_step, plan.start_round, rnd, setting)
        self.step_at_end[rnd] = step
        log.set_context(step=step)
        if self.resume is not None and self.resume.round == rnd:
            # Carried in mid-round (site_agent.carry): the round-start snapshot and setting are the
            # ones taken when the round began; the trainer holds the state after the kept steps.
            return step
        # The state at this round's start is the one whose hash the previous iteration logged.
        self.snapshots[rnd] = take_snapshot(self.trainer, rnd, self.retained, phash)
        self.snapshots = {k: v for k, v in self.snapshots.items() if k >= rnd - 3}
        self.next_round = None  # mid-round: the state is neither this round's start nor its end
        did = enter_round(self.cfg, self.trainer, setting, rnd == plan.start_round, prev_mode)
        if did:
            log.emit("setting_entered", round=rnd, setting=setting.to_json(), action=did)
        return step

    def _reduce(self, rnd: int, payload: np.ndarray, members: list[str], cfg: RunConfig,
                ids_round: list[int]) -> tuple[np.ndarray, Any, Any]:
        """The round's collective over the WAN, one `collective` span: (mean, its stats, the allreduce's last stats)."""
        with self.log.span("collective", round=rnd, payload_values=int(payload.size)) as sp:
            cpu0 = time.process_time()
            try:
                avg, stats = self.allreduce.allreduce_mean(payload, rnd, members,
                                                           cfg.wan.collective_timeout_ms / 1000, ids_round)
            finally:
                last = self.allreduce.last_stats
                sp.update(payload_bytes_sent=last.payload_bytes_sent, messages_sent=last.messages_sent,
                          rejected=last.rejected, cpu_s=time.process_time() - cpu0)
        return avg, stats, last

    def _apply_round(self, rnd: int, cfg: RunConfig, cs: int, avg: np.ndarray, round_ids: np.ndarray) -> str:
        """Apply the cluster mean (on every rank) and take the round's samples; returns the new params hash."""
        if self.pool is not None:  # every rank applies the same vector
            self.pool.share(rnd, avg)
        if cfg.train.mode == "sync":  # the lr of the round's (one) step: at its start, cs
            self.trainer.apply_grads(avg, frontier_tokens=cs * cfg.model.seq_len)
        else:
            self.trainer.apply_outer(avg, frontier_tokens=cs * cfg.model.seq_len)
        self.retained = merge_retained(self.retained, round_ids)
        self.next_round = rnd + 1
        self.progress = None  # the round is applied: nothing of it is in flight any more
        phash = self.trainer.params_hash()
        if self.pool is not None:
            self.pool.check(rnd, phash)
        return phash

    def _report_round(self, rnd: int, step: int, phash: str, cs: int, ce: int, ids_round: list[int],
                      losses: list[float], cycle: dict[str, Any], cfg: RunConfig) -> None:
        """Tell the coordinator the round is done (and its loss), and log `round_done`."""
        tokens = len(ids_round) * cfg.model.seq_len
        self.node.send(COORD, "round_done", CONTROL, {
            "round": rnd, "step": step, "param_hash": phash, "cursor_start": cs,
            "cursor_end": ce, "samples": ids_round, "tokens": tokens,
            "flops": tokens * self.trainer.flops_per_token, "cycle": cycle})
        if losses:
            self.node.send(COORD, "telemetry", TELEMETRY, {"round": rnd, "loss": float(np.mean(losses))},
                           reliable=False)
        self.log.emit("round_done", round=rnd, param_hash=phash, cursor_start=cs, cursor_end=ce,
                      retained_samples=int(self.retained.size), samples_sha256=samples_sha256(self.retained))

    def _after_round(self, rnd: int, ce: int, cfg: RunConfig) -> bool:
        """The leader's evaluation and checkpoint on their schedule; the byte counters. True after the last round."""
        last = ce >= self.target
        if self.leader and ((rnd + 1) % cfg.train.eval_every_rounds == 0 or last):
            self.evaluator.submit(rnd, {"useful_tokens_trained": ce * cfg.model.seq_len})
        if self.leader and ((rnd + 1) % cfg.train.checkpoint_every_rounds == 0 or last):
            self.checkpoint(rnd, ce, background=True)
        # Every round: a process killed later loses at most one round of byte counts.
        self.log.emit("wan_counters", counters=self.node.counters.snapshot())
        return last

    def _fault_gates(self, rnd: int, cs: int, ce: int, cfg: RunConfig) -> None:
        """Round `rnd` (samples [cs, ce)) reached a fault gate: wait, before the next round's first
        step, until the chaos driver has injected the fault its commit fires (ground/gates.py).
        A stop signal or a newer epoch ends the wait; the next round's start acts on it."""
        if self.run_dir is None or not self.cfg.recovery.fault_gates:
            return
        for g in gates.crossed(self.cfg.recovery.fault_gates, cs * cfg.model.seq_len, ce * cfg.model.seq_len):
            t0 = time.monotonic()
            how = gates.wait(self.run_dir, g, self.cfg.recovery.fault_gate_timeout_ms / 1000,
                             lambda: self.newer_plan_waiting(by_round=rnd + 1))
            self.log.emit("fault_gate", round=rnd, gate_tokens=g, outcome=how,
                          waited_s=round(time.monotonic() - t0, 6))

    def compute(self, rnd: int, n: int, idx: int, cs: int, ce: int,
                cfg: RunConfig | None = None) -> tuple[np.ndarray, list[int], list[float]]:
        """This site's part of a round: sync = one backward; local = up to H inner AdamW steps.

        Every inner step's work is logged as `work_attempted` as soon as it is done, so work
        that a failure later discards is still counted (as lost). The payload is scaled by
        this site's share of the round's samples, so the cluster mean weighs every sample
        equally when the last round is cut short (the scale is exactly 1.0 otherwise).
        """
        cfg = cfg or self.cfg  # the epoch's effective config (its mode and H)
        log, trainer = self.log, self.trainer
        world = cfg.train.workers_per_site
        if self.pool is not None:  # the other ranks compute this round with us
            self.pool.begin_round(rnd, n, idx, self.epoch, cs, ce)
        ids_round: list[int] = []
        losses: list[float] = []
        payload: np.ndarray | None = None
        steps = 1 if cfg.train.mode == "sync" else cfg.train.inner_steps_h
        layout = self.step_layout(cfg, rnd, n, idx, cs, ce)
        first = 0
        if self.resume is not None and self.resume.round == rnd:  # carried in: the kept steps are done
            first, ids_round, losses = self.resume.steps, list(self.resume.ids), list(self.resume.losses)
        else:
            self.progress = RoundProgress(rnd, cs, cfg.train.mode, steps)
        self.resume = None
        prog = self.progress
        # The mid-round copy: before the first step this site would not keep if one other member
        # failed now (plain layout only: a carried round is not carried again).
        keep = kept_steps(cfg, n, idx, cs, ce) if self.pool is None and cfg.train.mode == "local" \
            and not self.carried_round(rnd) else 0
        floor_s = cfg.train.step_floor_ms / 1000.0  # emulated device time per step (0: none)
        waited_s = 0.0
        with log.span("compute", round=rnd) as span:
            cpu0 = time.process_time()  # all of this process's threads (WAN I/O, an evaluation) included
            if first:
                span.update(carried_steps=first)
            for h in range(first, steps):
                # Rank 0 alone may leave mid-round only without workers (they would wait in gloo).
                if h > 0 and self.pool is None and self.newer_plan_waiting():
                    raise Interrupted(f"a newer epoch arrived after inner step {h} of round {rnd}")
                positions, frontier = layout[h]
                ids = ids_at(self.order, positions)
                if prog is not None:
                    if h == keep and 0 < keep < steps and prog.mid is None:
                        prog.mid = MidState.take(trainer, h)
                    prog.done.append((tuple(ids), frontier))
                    prog.losses.append(None)
                    prog.epochs.append(self.epoch)
                if not ids:
                    continue  # the cut last round: this site's batch for this step is empty
                mine = rank_slice(ids, 0, world)  # W = 1: all of ids
                t_step = time.monotonic()
                x, y = batch_for(self.corpus, mine, cfg.model.seq_len)
                if cfg.train.mode == "sync":
                    loss, payload = trainer.compute_grads(x, y)
                else:
                    try:
                        loss = trainer.inner_step(x, y, frontier_tokens=frontier)
                    except BaseException:
                        if prog is not None:  # not taken: the trainer's state is not past it
                            del prog.done[-1], prog.losses[-1], prog.epochs[-1]
                        raise
                    if prog is not None:
                        prog.losses[-1] = loss
                losses.append(loss)
                ids_round += ids
                if floor_s > 0:  # the emulated device is slower than this host's share of it
                    wait = floor_s - (time.monotonic() - t_step)
                    if wait > 0:
                        time.sleep(wait)
                        waited_s += wait
                tokens = len(ids) * cfg.model.seq_len
                log.emit("work_attempted", round=rnd, inner_step=h, samples=ids, tokens=tokens,
                         flops=tokens * trainer.flops_per_token)
            if cfg.train.mode == "local":
                payload = trainer.pseudo_gradient()
            elif payload is None:
                payload = np.zeros(trainer.global_params.numel(), dtype=np.float32)
            span.update(loss=float(np.mean(losses)) if losses else None, samples=len(ids_round),
                        cpu_s=time.process_time() - cpu0)
            if floor_s > 0:
                span.update(floor_wait_s=waited_s)
        if self.pool is not None:
            self.pool.compute_done()
        share = n * len(ids_round) / max(1, ce - cs)
        if share != 1.0:
            payload = (payload * np.float32(share)).astype(np.float32)
        return payload, ids_round, losses


    def carried_round(self, rnd: int) -> bool:
        """Whether round `rnd` follows the carried layout (the first round of a carried epoch, local mode)."""
        plan = self.plan
        return bool(plan is not None and plan.carry and rnd == plan.start_round)

    def step_layout(self, cfg: RunConfig, rnd: int, n: int, idx: int, cs: int, ce: int) -> list[tuple[range, int]]:
        """This site's inner steps of round `rnd`: (sample positions, lr frontier in tokens) per step."""
        steps = 1 if cfg.train.mode == "sync" else cfg.train.inner_steps_h
        plan = self.plan
        if cfg.train.mode == "local" and self.carried_round(rnd):
            assert plan is not None
            mine = carried_steps(cfg, plan.carry, plan.members, cs, ce, self.target)[self.me]
            return [(r, f * cfg.model.seq_len) for r, f in mine]
        seq = cfg.model.seq_len  # the frontier in tokens (site_agent.lr_schedule.step_frontier_tokens)
        return [(r, f * seq) for r, f in site_round_layout(cfg, n, cs, ce, idx, steps)]


def _round_samples(stats: Any, members: list[str]) -> np.ndarray:
    """Every member's sample ids of a finished round, as the members themselves sent them."""
    missing = [m for m in members if m not in stats.samples]
    if missing:  # parse_coll_part requires them, so a finished round always has them
        raise CollectiveAborted(f"round {stats.round}: no sample ids from {missing}")
    return np.concatenate([np.asarray(stats.samples[m], dtype=np.int64) for m in members])
