"""The site agent: the training loop of one datacenter.

`python -m site_agent.agent --run-dir RUN --site a`

Reads top to bottom: config, setup (data, model, WAN endpoint, join), then one loop over
membership epochs: adopt the coordinator's plan (who is in, train or wait, which round and
sample cursor to resume from, where state comes from: our own round-start snapshot, a donor
by peer state transfer, or the durable frontier in the store), then train round by round
(compute -> collective over the WAN -> apply -> report -> evaluate -> checkpoint) until the
target is reached or a newer epoch interrupts, and exit when the coordinator says so.

Every phase is a span in the site's JSON-lines log; the work of every inner step (canonical
sample ids, tokens, FLOPs) is logged as `work_attempted`, and the coordinator's `commit`
records say which of it was retained.

No body is trusted: control messages are parsed into typed plans (`site_agent.messages`), a bad
one is logged as `message_rejected` and dropped. Epochs are applied in order, each governing
the rounds from its start to the next one's (`site_agent.epochs`), so epochs announced back to
back while a round is in flight are all honoured. The site attests what it trained: every
member's sample ids of a round travel with its collective parts, and the site accumulates
the ids of every round it applies as the samples its state retained (`self.retained`; rolled
back with snapshots, carried by checkpoints and state transfers); a checkpoint's
`samples_sha256` (the matched-frontier hash) is their hash, logged beside `canonical_sha256`.

With `train.workers_per_site` W > 1 this process is rank 0 of the site's W worker processes
(see site_agent/worker.py): it spawns ranks 1..W-1, joins their gloo group, trains on its
1/W slice of every step's batch with grads averaged over the group, does the WAN collective
alone, broadcasts its result for every rank to apply and checks after every round that all
ranks hold the same parameters (`intra_site_check`). With W = 1 none of that runs.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from checkpoint_store.blobstore import StoreError
from control.scripted import check_schedule
from ground.setting import SettingError, effective_config, is_fixed, step_after_round
from site_agent.consistency import contribution_stats, enter_round, max_steps_per_round, plan_setting
from site_agent.collective import AllReduce, CollectiveAborted, CollectiveInterrupted, PeerUnreachable
from site_agent.data import batch_for, eval_fields, eval_set, load_corpus, sample_order
from site_agent.epochs import interrupts, next_plan
from site_agent.background import OneAtATime
from site_agent.evaluator import BackgroundEval
from site_agent.lr_schedule import step_frontier_tokens
from ground.fields import Rejected
from ground.plans import EpochPlan, Restore
from site_agent.messages import Shutdown, parse_plan, parse_shutdown
from site_agent.model import count_params, pick_device
from ground.schedule import ids_at, round_span, site_positions, steps_per_round, target_samples
from site_agent.state import (Snapshot, load_blobs, merge_retained, restore_snapshot, retained_of, samples_sha256,
                              take_snapshot, with_lineage)
from site_agent.state_transfer import StateTransferError, pack_state, receive_state, send_state, unpack_state
from site_agent.trainer import IntraSiteError, SiteTrainer
from site_agent.worker import WorkerPool, check_workers, rank_slice, threads_per_worker
from wan.frames import TrafficClass
from wan.node import WanNode
from ground.config import ConfigError, RunConfig, config_from_json, to_dict
from ground.eventlog import EventLog
from ground.topology import COORD, STORE, Topology

CONTROL = TrafficClass.CONTROL.value
TELEMETRY = TrafficClass.TELEMETRY.value


class Stop(Exception):
    """SIGTERM/SIGINT arrived: leave the loop and exit cleanly."""


class Interrupted(Exception):
    """A newer membership epoch (or a shutdown) arrived: abandon what is in flight."""


def main(argv: list[str] | None = None) -> int:
    # ------------------------------------------------------------------ config
    ap = argparse.ArgumentParser(prog="python -m site_agent.agent", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--site", required=True)
    args = ap.parse_args(argv)
    run_dir: Path = args.run_dir
    cfg = config_from_json(run_dir / "config.json")
    try:
        world = check_workers(cfg)  # W processes in this site; 1 = just this one
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        check_schedule(cfg)
        if not is_fixed(cfg) and world > 1:
            raise SettingError("a changing consistency setting (train.mode scripted / adaptive) needs "
                               "train.workers_per_site = 1")
    except SettingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    topo = Topology.load(run_dir / "topology.json")
    me = args.site
    if me not in cfg.cluster.sites:
        print(f"error: site {me!r} is not in the cluster {list(cfg.cluster.sites)}", file=sys.stderr)
        return 2
    log = EventLog(run_dir / "logs" / f"{me}.jsonl", cfg.run_id, me)
    stopping = {"flag": False}

    def _on_signal(signum: int, _frame: Any) -> None:
        stopping["flag"] = True
        log.emit("signal", signal=signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    # ------------------------------------------------------------------- setup
    # Sites share the machine's cores: give each a slice so they do not oversubscribe; a site's
    # slice is divided among its W workers (W = 1: the whole slice).
    threads = threads_per_worker(cfg)
    torch.set_num_threads(threads)
    pool: WorkerPool | None = None
    if world > 1:  # start the other ranks first: they load data and build the model meanwhile
        pool = WorkerPool(run_dir, cfg, me, log)
        pool.start()
    try:
        return _run(args, cfg, topo, me, log, stopping, threads, pool)
    except BaseException:
        if pool is not None:  # a crash: never leave the workers behind (PR_SET_PDEATHSIG is the backstop)
            pool.close("site crashed")
        raise


def _run(args: argparse.Namespace, cfg: RunConfig, topo: Topology, me: str, log: EventLog, stopping: dict[str, bool],
         threads: int, pool: WorkerPool | None) -> int:
    run_dir: Path = args.run_dir
    world = cfg.train.workers_per_site
    device = pick_device(cfg.train.device)
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    group = None
    if pool is not None:
        try:
            if not pool.connect(lambda: stopping["flag"]):
                return _exit_early(log, pool, 0, "signal before the intra-site group formed")
        except IntraSiteError as e:
            return _exit_early(log, pool, 4, f"intra-site group failed: {e}")
        group = torch.distributed.group.WORLD
    trainer = SiteTrainer(cfg, device, group=group)
    log.emit("site_started", device=str(device), threads=threads, dataset_id=corpus.dataset_id,
             n_params=count_params(trainer.model), flops_per_token=trainer.flops_per_token,
             params_hash=trainer.params_hash(), torch=torch.__version__, pid=os.getpid(), workers_per_site=world)
    if pool is not None:
        try:
            pool.check(-1, trainer.params_hash())  # every rank starts from the same weights
        except IntraSiteError as e:
            return _exit_early(log, pool, 4, f"intra-site check failed: {e}")

    node = WanNode(name=me, run_id=cfg.run_id, wan=cfg.wan, log=log, routes=topo.routes_for(me),
                   bind=topo.bind_for(me), server_links=topo.server_links_for(me), members=topo.peers_of(me),
                   keys_dir=str(run_dir / "keys") if cfg.wan.curve else None)
    site = Site(cfg, me, log, node, trainer, corpus, order, device, stopping, pool)
    return site.run()


class Site:
    """One site's state across membership epochs (rank 0 of the site)."""

    def __init__(self, cfg: RunConfig, me: str, log: EventLog, node: WanNode, trainer: SiteTrainer, corpus: Any,
                 order: np.ndarray, device: torch.device, stopping: dict[str, bool], pool: WorkerPool | None) -> None:
        self.cfg, self.me, self.log, self.node, self.trainer = cfg, me, log, node, trainer
        self.corpus, self.order, self.device, self.stopping, self.pool = corpus, order, device, stopping, pool
        self.evalset = eval_set(corpus, cfg.data, cfg.model.seq_len)  # fixed windows over the held-out split
        self.hx, self.hy = self.evalset.tensors()
        self.uploads = OneAtATime("checkpoint-upload")  # the leader's periodic checkpoints (see checkpoint())
        # The leader's periodic evaluations run on a copy of the weights in a thread (site_agent.evaluator).
        self.evaluator = BackgroundEval(trainer.model, log, torch.get_num_threads(),
                                        lambda m: eval_fields(m, self.evalset, self.hx, self.hy, self.device))
        self.coll_q = node.inbox("coll")
        self.ctl_q = node.inbox("membership", "shutdown")
        self.state_q = node.inbox("state_chunk")
        self.store = None
        if STORE in node.routes:
            from checkpoint_store.client import StoreClient
            self.store = StoreClient(node, node.inbox(*StoreClient.KINDS), log, cfg.wan.chunk_bytes)
        self.status: dict[str, Any] = {"round": -1, "epoch": 0}
        node.every(cfg.wan.heartbeat_interval_ms, lambda: node.send(
            COORD, "heartbeat", CONTROL, {"sent_mono_ns": time.monotonic_ns(), **self.status}, reliable=False))
        self.sites = frozenset(cfg.cluster.sites)
        self.target = target_samples(cfg)
        self.spr = steps_per_round(cfg)
        self.allreduce = _reducer(cfg, node, self.coll_q, me, trainer.global_params.numel(), order.size)
        self.allreduce.interrupted = self.newer_plan_waiting
        self.allreduce.stall_timeout_s = cfg.wan.collective_stall_ms / 1000
        self.pending: list[EpochPlan | Shutdown] = []  # control messages read early (while checking for interruptions)
        self.plan: EpochPlan | None = None
        self.epoch = 0
        self.next_round: int | None = 0  # the round whose start state the trainer holds; None = mid-round
        # The samples the lineage of the trainer's state retained: every member's ids of every
        # round applied (sorted int64, a multiset); they roll back, travel and restore with the state.
        self.retained = np.empty(0, dtype=np.int64)
        self.snapshots: dict[int, Snapshot] = {}
        self.initial = take_snapshot(trainer, 0)  # the deterministic initial weights
        self.done_epoch = -1  # the epoch in which we reached the target and said so
        self.leader = False
        self.inflight: int | None = None  # the round being computed / reduced now
        self.step_at_end: dict[int, int] = {}  # round -> inner steps taken once it is done (per its setting)

    # ------------------------------------------------------------------ control
    def _poll_ctl(self) -> None:
        """Move control messages off the inbox into `pending`, each parsed into its type; a body
        that does not fit is logged as message_rejected (with why) and dropped."""
        while True:
            try:
                msg = self.ctl_q.get_nowait()
            except queue.Empty:
                return
            try:
                typed = parse_shutdown(msg, COORD) if msg.kind == "shutdown" else parse_plan(msg, self.sites, COORD)
            except Rejected as e:
                self.log.emit("message_rejected", kind=msg.kind, src=msg.src, msg_epoch=msg.epoch, reason=e.reason,
                              detail=e.detail)
                continue
            if isinstance(typed, EpochPlan):  # the same epoch sent again replaces the copy that waits
                self.pending = [m for m in self.pending if not (isinstance(m, EpochPlan) and m.epoch == typed.epoch)]
            self.pending.append(typed)

    def newer_plan_waiting(self) -> bool:
        """True when a stop, a shutdown, or a newer epoch that takes effect by the round in flight waits.

        A newer epoch scheduled for a later round (a rejoin or a drain at the next boundary)
        lets the round in flight finish under the current epoch.
        """
        if self.stopping["flag"]:
            return True
        self._poll_ctl()
        return any(isinstance(m, Shutdown) for m in self.pending) or interrupts(self.pending, self.epoch,
                                                                                 self.inflight)

    def next_control(self) -> EpochPlan | Shutdown | None:
        """Block until the next control message to act on (a plan or a shutdown); None on a stop signal.

        A shutdown wins. Plans are taken in epoch order (`site_agent.epochs.next_plan`): a plan
        that governs a round this site can train is adopted; the later ones wait for their round.
        """
        while True:
            if self.stopping["flag"]:
                return None
            self.node.check()
            self._poll_ctl()
            if self.pending:
                shut = [m for m in self.pending if isinstance(m, Shutdown)]
                if shut:
                    self.pending.clear()
                    return shut[0]
                plans = [m for m in self.pending if isinstance(m, EpochPlan)]
                plan, waiting, skipped = next_plan(plans, self.epoch, self.me, self.plan)
                self.pending = list(waiting)
                for p, why in skipped:
                    self.log.emit("membership_skipped", skipped_epoch=p.epoch, start_round=p.start_round, reason=why)
                if plan is not None:
                    return plan
                continue
            time.sleep(0.05)

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        node, log = self.node, self.log
        node.start()
        node.send(COORD, "join", CONTROL, {"pid": os.getpid()})
        reason, rc = "completed", 0
        evaluated_initial = False
        try:
            while True:
                msg = self.next_control()
                if msg is None:
                    raise Stop()
                if isinstance(msg, Shutdown):
                    reason = "completed" if self.done_epoch >= 0 else f"shutdown: {msg.reason}"
                    break
                try:
                    if not self.adopt(msg):
                        continue
                except Interrupted as e:  # a newer epoch arrived while we restored: adopt that one
                    log.emit("restore_abandoned", epoch=self.epoch, reason=str(e))
                    self.next_round = None
                    continue
                except (RuntimeError, ValueError, StoreError) as e:
                    # The state this plan names could not be had or did not verify: never train on
                    # it; ask to be admitted again (as a joiner, state comes from elsewhere).
                    log.emit("restore_failed", epoch=self.epoch, error=f"{type(e).__name__}: {e}")
                    self.next_round = None
                    # We hold no plan we could train on: the coordinator's answer (this epoch's plan sent
                    # again, or a new one naming us a joiner) must be adopted, not ignored as current.
                    self.plan = None
                    node.send(COORD, "join", CONTROL, {"pid": os.getpid(), "rejoin": True})
                    continue
                if self.leader and not evaluated_initial and msg.start_round == 0:
                    evaluated_initial = True  # the starting point of the learning curve
                    with log.span("eval", round=-1) as sp:
                        sp.update(eval_fields(self.trainer.model, self.evalset, self.hx, self.hy, self.device))
                        sp["useful_tokens_trained"] = 0
                try:
                    self.train()
                except (Interrupted, CollectiveInterrupted) as e:
                    log.emit("round_abandoned", round=self.status["round"], reason=str(e))
                except PeerUnreachable as e:
                    log.emit("peer_unreachable", peer=e.peer, detail=str(e))
                    node.send(COORD, "peer_unreachable", CONTROL, {"peer": e.peer, "detail": str(e)})
                    self.wait_for_newer_epoch()
                except CollectiveAborted as e:
                    log.emit("collective_aborted", reason=str(e))
                    self.wait_for_newer_epoch()
        except Stop:
            if self.plan is not None and self.me in self.plan.members and self.done_epoch < 0:
                # Preemption with notice: tell the coordinator before we go (it need not wait for a timeout).
                node.send(COORD, "preempt_notice", CONTROL, {"grace_s": None, "round": self.status["round"]})
                log.emit("preemption_announced", round=self.status["round"])
                node.wait_acked(1.0, COORD)
            reason = "signal"
        except IntraSiteError as e:  # a worker died, the group timed out, or the ranks disagree
            reason, rc = f"intra-site failure: {e}", 4
            log.emit("intra_site_failure", reason=str(e))
        self.evaluator.wait()  # its `eval` span is logged before the site stops
        try:
            self.uploads.wait()  # a checkpoint in flight finishes (as it did when it was written inline)
        except Exception as e:  # leaving anyway: say so, then stop as planned
            log.emit("checkpoint_failed", reason=f"{type(e).__name__}: {e}")
        return _exit(log, node, rc, reason, self.pool)

    def wait_for_newer_epoch(self) -> None:
        """After a failed round: do nothing until the coordinator decides (a new epoch or a shutdown)."""
        while not self.newer_plan_waiting():
            self.node.check()
            time.sleep(0.05)

    # ------------------------------------------------------------------ epochs
    def adopt(self, plan: EpochPlan) -> bool:
        """Take a new epoch's plan; restore the state it names. True if we should train now."""
        log = self.log
        self.uploads.wait()  # the checkpoint in flight belongs to the epoch we leave; it ends first
        self.plan = plan
        self.epoch = plan.epoch
        self.status["epoch"] = self.epoch
        self.node.set_fence(self.epoch)
        self.allreduce.reset(self.epoch)
        setting, start_step, _prev = plan_setting(self.cfg, plan)
        self.allreduce.set_compression(setting.compression)
        self.step_at_end[plan.start_round - 1] = start_step
        log.set_context(epoch=self.epoch)
        members = list(plan.members)
        log.emit("membership", members=members, paused=plan.paused, start_round=plan.start_round,
                 start_cursor=plan.start_cursor, restore=plan.restore.value, donor=plan.donor, joiners=list(plan.joiners),
                 setting=setting.to_json(), start_step=start_step)
        if self.me not in members:
            # Removed (we failed, hung, or were partitioned away) but alive: ask to come back in.
            log.emit("not_a_member", epoch=self.epoch)
            self.node.send(COORD, "join", CONTROL, {"pid": os.getpid(), "rejoin": True})
            return False
        start = plan.start_round
        if plan.paused:
            log.emit("paused", reason="the coordinator is waiting for failed sites")
            if plan.checkpoint_first and members[0] == self.me and start > 0:
                # Preemption with notice under `restart`: make the committed state durable first.
                with log.span("restore", kind="rollback_for_checkpoint", start_round=start) as sp:
                    self.rollback_to(start, sp)
                self.next_round = start
                self.checkpoint(start - 1, plan.start_cursor)
            return False
        self.leader = members[0] == self.me
        with log.span("restore", kind=plan.restore.value, start_round=start) as sp:
            if plan.restore == Restore.STORE:
                self.restore_from_store(plan, sp)
            elif plan.restore == Restore.DONOR and self.me in plan.joiners:
                self.receive_from_donor(plan, sp)
            else:
                self.rollback_to(start, sp)
                if plan.restore == Restore.DONOR and plan.donor == self.me:
                    self.send_to_joiners(plan, sp)
            sp.update(retained_samples=int(self.retained.size), samples_sha256=samples_sha256(self.retained))
        self.next_round = start
        self.snapshots = {k: v for k, v in self.snapshots.items() if k <= start}
        if self.pool is not None:
            self.pool.load_state(pack_state(self.trainer.state_tensors()))
        if plan.checkpoint_first and self.leader and start > 0:
            # The oracle drains a site just before its fault: make the committed state durable first.
            self.checkpoint(start - 1, plan.start_cursor)
        return True

    def rollback_to(self, start: int, sp: dict[str, Any]) -> None:
        """Make the trainer hold the state at the start of round `start` (our own snapshot)."""
        if self.next_round == start:
            sp["rolled_back"] = False
            return
        snap = self.snapshots.get(start)
        if snap is None:
            if self.next_round is not None and start > self.next_round:
                raise RuntimeError(
                    f"epoch {self.epoch} resumes at round {start}, but this site holds the state at the start of "
                    f"round {self.next_round} and no epoch it received covers rounds {self.next_round}.."
                    f"{start - 1} (snapshots {sorted(self.snapshots)})")
            held = "mid-round" if self.next_round is None else f"round {self.next_round}"
            raise RuntimeError(f"no snapshot of round {start} (holding {held}, snapshots {sorted(self.snapshots)})")
        restore_snapshot(self.trainer, snap)
        self.retained = snap.retained.copy()
        sp.update(rolled_back=True, from_round=self.next_round, params_hash=snap.params_hash)

    def restore_from_store(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        want = plan.manifest_hash
        if want is None:  # nothing durable yet: everyone restarts from the initial weights
            restore_snapshot(self.trainer, self.initial)
            self.retained = self.initial.retained.copy()
            sp.update(source="initial weights", params_hash=self.initial.params_hash)
            return
        if self.store is None:
            raise RuntimeError("restore from the store, but this site has no route to it")
        # By hash, not "the frontier": a background upload may have made a newer checkpoint the
        # frontier since the coordinator planned this restore; the plan's checkpoint is still there.
        manifest = self.store.checkpoint(want, timeout_s=60.0)
        blobs = self.store.load(manifest, timeout_s=120.0)
        retained = retained_of(blobs, f"checkpoint {want}", manifest.get("samples_sha256"))
        load_blobs(self.trainer, blobs)
        if self.trainer.params_hash() != manifest["params_hash"]:
            raise RuntimeError(f"checkpoint {want}: loaded parameters do not match the manifest's hash")
        self.retained = retained
        sp.update(source="store", manifest_hash=want, params_hash=manifest["params_hash"], round=manifest["round"])

    def receive_from_donor(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        donor = plan.donor
        assert donor is not None  # parse_plan: a donor restore names one
        try:
            data, meta = receive_state(self.state_q, donor, self.epoch, timeout_s=120.0,
                                       interrupted=self.newer_plan_waiting, max_total=self.max_state_bytes(),
                                       reject=self._reject_state_chunk)
        except StateTransferError as e:
            sp["error_detail"] = str(e)
            raise Interrupted(f"state transfer from {donor} failed: {e}") from e
        blobs = unpack_state(data)
        retained = retained_of(blobs, f"state from {donor}", meta["samples_sha256"])
        load_blobs(self.trainer, blobs)
        got = self.trainer.params_hash()
        if got != meta["params_hash"]:
            raise RuntimeError(f"state from {donor}: parameters hash {got} != announced {meta['params_hash']}")
        self.retained = retained
        self.log.emit("state_received", donor=donor, bytes=len(data), params_hash=got, round=meta["round"],
                      samples_sha256=meta["samples_sha256"])
        sp.update(source="donor", donor=donor, bytes=len(data), params_hash=got)

    def max_state_bytes(self) -> int:
        """The most bytes a donor's packed state may announce: generously above our own state's size."""
        own = sum(t.numel() * t.element_size() for g in self.trainer.state_tensors().values() for t in g.values())
        return 4 * own + 8 * self.target + (1 << 20)

    def _reject_state_chunk(self, msg: Any, e: Rejected) -> None:
        self.log.emit("message_rejected", kind=msg.kind, src=msg.src, msg_epoch=msg.epoch, reason=e.reason,
                      detail=e.detail)

    def send_to_joiners(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        data = pack_state(with_lineage(self.trainer.state_tensors(), self.retained))
        meta = {"round": plan.start_round, "params_hash": self.trainer.params_hash(),
                "samples_sha256": samples_sha256(self.retained)}
        for j in plan.joiners:
            n = send_state(self.node, j, data, meta, self.cfg.wan.chunk_bytes, self.epoch)
            self.log.emit("state_sent", joiner=j, bytes=n, params_hash=meta["params_hash"], round=meta["round"],
                          samples_sha256=meta["samples_sha256"])
        sp.update(sent_to=list(plan.joiners), bytes=len(data))

    # ------------------------------------------------------------------ rounds
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
            self.inflight = rnd
            if self.newer_plan_waiting():
                raise Interrupted("a newer epoch takes effect at this round")
            self.status["round"] = rnd
            step = step_after_round(start_step, plan.start_round, rnd, setting)
            self.step_at_end[rnd] = step
            log.set_context(step=step)
            # The state at this round's start is the one whose hash the previous iteration logged.
            self.snapshots[rnd] = take_snapshot(self.trainer, rnd, self.retained, phash)
            self.snapshots = {k: v for k, v in self.snapshots.items() if k >= rnd - 3}
            self.next_round = None  # mid-round: the state is neither this round's start nor its end
            did = enter_round(self.cfg, self.trainer, setting, rnd == plan.start_round, prev_mode)
            if did:
                log.emit("setting_entered", round=rnd, setting=setting.to_json(), action=did)
            t_compute = time.monotonic()
            payload, ids_round, losses = self.compute(rnd, n, idx, cs, ce, cfg)
            t_comm = time.monotonic()
            t_compute = t_comm - t_compute
            with log.span("collective", round=rnd, payload_values=int(payload.size)) as sp:
                cpu0 = time.process_time()
                try:
                    avg, stats = self.allreduce.allreduce_mean(payload, rnd, members,
                                                               cfg.wan.collective_timeout_ms / 1000, ids_round)
                finally:
                    last = self.allreduce.last_stats
                    sp.update(payload_bytes_sent=last.payload_bytes_sent, messages_sent=last.messages_sent,
                              rejected=last.rejected, cpu_s=time.process_time() - cpu0)
            t_comm = time.monotonic() - t_comm
            round_ids = _round_samples(stats, members)
            cycle = {"compute_s": t_compute, "inner_steps": len(losses), "comm_s": t_comm,
                     "payload_bytes": int(last.payload_bytes_sent), "stalls": int(last.rejected),
                     "loss": float(np.mean(losses)) if losses else None, **contribution_stats(payload, avg)}
            if self.pool is not None:  # every rank applies the same vector
                self.pool.share(rnd, avg)
            if cfg.train.mode == "sync":  # the lr of the round's (one) step: at its start, cs
                self.trainer.apply_grads(avg, frontier_tokens=cs * cfg.model.seq_len)
            else:
                self.trainer.apply_outer(avg, frontier_tokens=cs * cfg.model.seq_len)
            self.retained = merge_retained(self.retained, round_ids)
            self.next_round = rnd + 1
            phash = self.trainer.params_hash()
            if self.pool is not None:
                self.pool.check(rnd, phash)
            tokens = len(ids_round) * cfg.model.seq_len
            self.node.send(COORD, "round_done", CONTROL, {
                "round": rnd, "step": step, "param_hash": phash, "cursor_start": cs,
                "cursor_end": ce, "samples": ids_round, "tokens": tokens,
                "flops": tokens * self.trainer.flops_per_token, "cycle": cycle})
            if losses:
                self.node.send(COORD, "telemetry", TELEMETRY, {"round": rnd, "loss": float(np.mean(losses))},
                               reliable=False)
            log.emit("round_done", round=rnd, param_hash=phash, cursor_start=cs, cursor_end=ce,
                     retained_samples=int(self.retained.size), samples_sha256=samples_sha256(self.retained))
            last = ce >= self.target
            if self.leader and ((rnd + 1) % cfg.train.eval_every_rounds == 0 or last):
                self.evaluator.submit(rnd, {"useful_tokens_trained": ce * cfg.model.seq_len})
            if self.leader and ((rnd + 1) % cfg.train.checkpoint_every_rounds == 0 or last):
                self.checkpoint(rnd, ce, background=True)
            # Every round: a process killed later loses at most one round of byte counts.
            log.emit("wan_counters", counters=self.node.counters.snapshot())
            if last:
                break
            rnd += 1
        self.evaluator.wait()  # the last round's evaluation is logged before the site says it is done
        self.uploads.wait()  # and the last checkpoint is durable
        self.done_epoch = self.epoch
        self.node.send(COORD, "site_done", CONTROL, {"round": self.status["round"]})
        log.emit("target_reached", epoch=self.epoch, round=self.status["round"])

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
        with log.span("compute", round=rnd) as sp:
            cpu0 = time.process_time()  # all of this process's threads (WAN I/O, an evaluation) included
            for h in range(steps):
                # Rank 0 alone may leave mid-round only without workers (they would wait in gloo).
                if h > 0 and self.pool is None and self.newer_plan_waiting():
                    if self.pool is not None:
                        self.pool.compute_done()
                    raise Interrupted(f"a newer epoch arrived after inner step {h} of round {rnd}")
                ids = ids_at(self.order, site_positions(cfg, n, cs, h, idx, ce))
                if not ids:
                    continue  # the cut last round: this site's batch for this step is empty
                mine = rank_slice(ids, 0, world)  # W = 1: all of ids
                x, y = batch_for(self.corpus, mine, cfg.model.seq_len)
                if cfg.train.mode == "sync":
                    loss, payload = trainer.compute_grads(x, y)
                else:
                    loss = trainer.inner_step(x, y, frontier_tokens=step_frontier_tokens(cfg, n, cs, h, ce))
                losses.append(loss)
                ids_round += ids
                tokens = len(ids) * cfg.model.seq_len
                log.emit("work_attempted", round=rnd, inner_step=h, samples=ids, tokens=tokens,
                         flops=tokens * trainer.flops_per_token)
            if cfg.train.mode == "local":
                payload = trainer.pseudo_gradient()
            elif payload is None:
                payload = np.zeros(trainer.global_params.numel(), dtype=np.float32)
            sp.update(loss=float(np.mean(losses)) if losses else None, samples=len(ids_round),
                      cpu_s=time.process_time() - cpu0)
        if self.pool is not None:
            self.pool.compute_done()
        share = n * len(ids_round) / max(1, ce - cs)
        if share != 1.0:
            payload = (payload * np.float32(share)).astype(np.float32)
        return payload, ids_round, losses

    def checkpoint(self, rnd: int, cursor: int, background: bool = False) -> None:
        """Leader: write the state after round `rnd` (samples [0, cursor)) to the store; tell the coordinator.

        background: the state is copied now and uploaded by a thread while the next round computes
        (the round loop's periodic checkpoints). One upload at a time, in order; every other use of
        the store, a new epoch and the site's end first wait for it (`self.uploads.wait()`)."""
        if self.store is None:
            return
        self.uploads.wait()
        parent = self.plan.frontier_manifest if self.plan is not None else None
        if getattr(self, "last_manifest", None) and getattr(self, "last_manifest_epoch", -1) == self.epoch:
            parent = self.last_manifest
        # A copy of the state (AdamW's tensors are live otherwise) and of what describes it, as of now.
        state = {g: {k: v.clone() for k, v in d.items()} for g, d in self.trainer.state_tensors().items()}
        what = (rnd, cursor, parent, with_lineage(state, self.retained), self.retained.copy(),
                self.trainer.params_hash(), self.epoch)
        if background:
            self.uploads.start(lambda: self._upload(*what))
        else:
            self._upload(*what)

    def _upload(self, rnd: int, cursor: int, parent: str | None, blobs: dict[str, dict[str, torch.Tensor]],
                ids: np.ndarray, phash: str, epoch: int) -> None:
        try:
            mhash = self._write_checkpoint(rnd, cursor, parent, blobs, ids, phash, epoch)
        except StoreError as e:
            # Refused (a newer epoch fenced the store while we wrote: we are being replaced) or the
            # store was out of reach: this checkpoint is not durable and nothing else is lost. Train
            # on; a newer epoch is adopted at the next boundary, and the next checkpoint tries again.
            self.log.emit("checkpoint_failed", round=rnd, reason=str(e))
            return
        self.last_manifest, self.last_manifest_epoch = mhash, epoch
        self.node.send(COORD, "checkpoint_durable", CONTROL, {"manifest_hash": mhash, "round": rnd, "cursor": cursor})

    def _write_checkpoint(self, rnd: int, cursor: int, parent: str | None, blobs: dict[str, dict[str, torch.Tensor]],
                          ids: np.ndarray, phash: str, epoch: int) -> str:
        """Write the state and the retained samples; the span logs both the retained samples' hash
        (`samples_sha256`, the matched-frontier hash) and the canonical prefix's (`canonical_sha256`,
        the first `cursor` positions of the canonical order), which agree in a correct run."""
        cfg = self.cfg
        samples_sha = samples_sha256(ids)
        canonical_sha = samples_sha256(np.asarray(ids_at(self.order, range(0, cursor)), dtype=np.int64))
        assert self.store is not None
        with self.log.span("checkpoint_write", round=rnd) as sp:
            sp.update(samples_sha256=samples_sha, canonical_sha256=canonical_sha, samples=int(ids.size), cursor=cursor)
            mhash, _manifest = self.store.save(blobs, {
                "run_id": cfg.run_id, "ckpt_id": f"e{epoch}r{rnd}", "round": rnd, "step": self.step_at_end.get(rnd, (rnd + 1) * self.spr),
                "epoch": epoch, "parent": parent, "samples": int(ids.size), "samples_sha256": samples_sha,
                "canonical_sha256": canonical_sha, "cursor": cursor, "useful_tokens": int(ids.size) * cfg.model.seq_len,
                "params_hash": phash, "dataset_id": self.corpus.dataset_id,
                "config": to_dict(cfg)}, timeout_s=120.0)
            sp.update(manifest_hash=mhash, useful_tokens=int(ids.size) * cfg.model.seq_len)
        return mhash


def _reducer(cfg: RunConfig, node: WanNode, inbox: Any, me: str, n_params: int, n_samples: int) -> AllReduce:
    """The site's collective: parts validated against the model's size and the schedule; ids attested;
    the buffer of early parts bounded at about four rounds' worth of one site's incoming values."""
    part_elems = max(1, cfg.wan.chunk_bytes // 4)
    n_sites = len(cfg.cluster.sites)
    return AllReduce(node, inbox, me, cfg.wan.chunk_bytes, cfg.train.compression, max_total=n_params, attest=True,
                     max_samples=cfg.train.per_site_batch * max_steps_per_round(cfg), sample_id_limit=n_samples,
                     early_max_bytes=16 * n_params + (1 << 20),
                     early_max_parts=4 * n_sites * (-(-n_params // part_elems) + 1) + 64,
                     sites=frozenset(cfg.cluster.sites))


def _round_samples(stats: Any, members: list[str]) -> np.ndarray:
    """Every member's sample ids of a finished round, as the members themselves sent them."""
    missing = [m for m in members if m not in stats.samples]
    if missing:  # parse_coll_part requires them, so a finished round always has them
        raise CollectiveAborted(f"round {stats.round}: no sample ids from {missing}")
    return np.concatenate([np.asarray(stats.samples[m], dtype=np.int64) for m in members])


def _exit_early(log: EventLog, pool: WorkerPool, rc: int, reason: str) -> int:
    """Exit before the WAN endpoint exists (W > 1 only: the intra-site group did not form)."""
    pool.close(reason)
    log.emit("site_stopped", reason=reason, rc=rc)
    log.close()
    return rc


def _exit(log: EventLog, node: WanNode, rc: int, reason: str, pool: WorkerPool | None = None) -> int:
    if pool is not None:
        pool.close(reason)
    node.wait_acked(3.0)
    node.close()  # the last counters are read when nothing more can be sent
    log.emit("wan_counters", **node.final_counters())
    log.emit("site_stopped", reason=reason, rc=rc)
    log.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
