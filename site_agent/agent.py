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
the rounds from its start to the next one's (`site_core.epochs`), so epochs announced back to
back while a round is in flight are all honoured. The site attests what it trained: every
member's sample ids of a round travel with its collective parts, and the site accumulates
the ids of every round it applies as the samples its state retained (`self.retained`; rolled
back with snapshots, carried by checkpoints and state transfers); a checkpoint's
`samples_sha256` (the matched-frontier hash) is their hash, logged beside `canonical_sha256`.

With `train.workers_per_site` W > 1 this process is rank 0 of the site's W worker processes
(see site_agent/worker.py): it spawns ranks 1..W-1, joins their gloo group, trains on its
1/W slice of every step's batch with grads averaged over the group, does the WAN collective
alone, broadcasts its result for every rank to apply and checks after every round that all
The pieces of `Site`: adopting an epoch and restoring its state (site_agent/adoption.py) and the
round loop (site_agent/rounds.py), methods over the site's state; the leader's checkpoints are an
object the site owns (site_agent/checkpointing.py `Checkpointer`, with its upload thread).
"""

from __future__ import annotations

import argparse
import gc
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
from ground.setting import SettingError, is_fixed
from site_agent.adoption import EpochAdoption
from site_agent.checkpointing import Checkpointer
from site_agent.consistency import max_steps_per_round
from site_agent.collective import AllReduce, CollectiveAborted, CollectiveInterrupted, PeerUnreachable
from site_agent.data import eval_fields, eval_set
from site_core.epochs import interrupts, next_plan, not_for_this_process
from site_agent.carry import Resume, RoundProgress
from site_agent.evaluator import BackgroundEval
from ground.fields import Rejected
from ground.plans import EpochPlan
from site_agent.messages import Shutdown, parse_plan, parse_shutdown
from site_agent.model import count_params
from ground.schedule import steps_per_round, target_samples
from site_agent.rounds import RoundLoop, _round_samples
from site_agent.standby import Prepared, load_inputs, prepare, wait_for_site
from site_agent.state import Snapshot, take_snapshot
from site_agent.init_state import start_trainer
from site_agent.trainer import IntraSiteError, SiteTrainer
from site_agent.unwind import Interrupted, Stop
from site_agent.worker import WorkerPool, check_workers, threads_per_worker
from wan.frames import TrafficClass
from wan.node import WanNode
from ground.config import ConfigError, RunConfig, config_from_json
from ground.eventlog import EventLog
from ground.topology import COORD, STORE, Topology
from ground.resources import peak_rss_mib
from ground.stop_request import watch_stop_request

CONTROL = TrafficClass.CONTROL.value
TELEMETRY = TrafficClass.TELEMETRY.value

# Re-exported: importable from site_agent.agent as before the split.
__all__ = ["CONTROL", "TELEMETRY", "Interrupted", "Site", "Stop", "main", "_reducer", "_round_samples"]


def main(argv: list[str] | None = None) -> int:
    # ------------------------------------------------------------------ config
    ap = argparse.ArgumentParser(prog="python -m site_agent.agent", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--site")
    who.add_argument("--standby", action="store_true",
                     help="a warm standby (site_agent/standby.py): prepare, then wait on stdin for the site to become")
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
    warm: Prepared | None = None
    if args.standby:
        if world > 1:
            print("error: a warm standby needs train.workers_per_site = 1", file=sys.stderr)
            return 2
        torch.set_num_threads(threads_per_worker(cfg))  # as the site below sets it, before the model is built
        warm = prepare(cfg)
        args.site = wait_for_site(cfg, warm)
        if args.site is None:  # the launcher closed our stdin: nobody needed us
            return 0
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
    watch_stop_request(run_dir, me)  # the end of a compose run asks through the run directory

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
        return _run(args, cfg, topo, me, log, stopping, threads, pool, warm)
    except BaseException:
        if pool is not None:  # a crash: never leave the workers behind (PR_SET_PDEATHSIG is the backstop)
            pool.close("site crashed")
        raise


def _run(args: argparse.Namespace, cfg: RunConfig, topo: Topology, me: str, log: EventLog, stopping: dict[str, bool],
         threads: int, pool: WorkerPool | None, warm: Prepared | None = None) -> int:
    run_dir: Path = args.run_dir
    world = cfg.train.workers_per_site
    # A warm standby loaded these before it knew which site it would be.
    device, corpus, order = load_inputs(cfg) if warm is None else (warm.device, warm.corpus, warm.order)
    group = None
    if pool is not None:
        try:
            if not pool.connect(lambda: stopping["flag"]):
                return _exit_early(log, pool, 0, "signal before the intra-site group formed")
        except IntraSiteError as e:
            return _exit_early(log, pool, 4, f"intra-site group failed: {e}")
        group = torch.distributed.group.WORLD
    trainer = warm.trainer if warm is not None else start_trainer(cfg, device, group=group)
    log.emit("site_started", device=str(device), threads=threads, dataset_id=corpus.dataset_id,
             n_params=count_params(trainer.model), flops_per_token=trainer.flops_per_token,
             params_hash=trainer.params_hash(), torch=torch.__version__, pid=os.getpid(), workers_per_site=world,
             init_state=trainer.init_state, warm_standby=warm.timing() if warm is not None else None)
    if pool is not None:
        try:
            pool.check(-1, trainer.params_hash())  # every rank starts from the same weights
        except IntraSiteError as e:
            return _exit_early(log, pool, 4, f"intra-site check failed: {e}")

    node = WanNode(name=me, run_id=cfg.run_id, wan=cfg.wan, log=log, routes=topo.routes_for(me),
                   bind=topo.bind_for(me), server_links=topo.server_links_for(me), members=topo.peers_of(me),
                   keys_dir=str(run_dir / "keys") if cfg.wan.curve else None)
    site = Site(cfg, me, log, node, trainer, corpus, order, device, stopping, pool, run_dir=run_dir)
    # Everything built so far (torch, the model, the corpus: ~340,000 objects) lives as long as the
    # process: frozen, the collector's full passes skip it. One full pass over it took 186 ms idle and
    # 300-540 ms on a loaded 2-core machine, all of it holding the GIL (in the leader's checkpoint thread,
    # found with py-spy), so the WAN thread sent no heartbeat for that long: a false suspicion at a
    # 300 ms heartbeat timeout (issue 55).
    gc.collect()
    gc.freeze()
    return site.run()


class Site(EpochAdoption, RoundLoop):
    """One site's state across membership epochs (rank 0 of the site)."""

    def __init__(self, cfg: RunConfig, me: str, log: EventLog, node: WanNode, trainer: SiteTrainer, corpus: Any,
                 order: np.ndarray, device: torch.device, stopping: dict[str, bool], pool: WorkerPool | None,
                 run_dir: Path | None = None) -> None:
        self.cfg, self.me, self.log, self.node, self.trainer = cfg, me, log, node, trainer
        self.run_dir = run_dir  # where the chaos driver releases fault gates (ground/gates.py); None: no gates
        self.corpus, self.order, self.device, self.stopping, self.pool = corpus, order, device, stopping, pool
        self.evalset = eval_set(corpus, cfg.data, cfg.model.seq_len)  # fixed windows over the held-out split
        self.hx, self.hy = self.evalset.tensors()
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
        self.ckpt = Checkpointer(cfg, log, node, self.store, corpus, order)  # the leader's checkpoints
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
        self.progress: RoundProgress | None = None  # the inner steps of the round in flight (site_agent.carry)
        self.resume: Resume | None = None  # a carried epoch's first round resumes after its kept steps

    def checkpoint(self, rnd: int, cursor: int, background: bool = False) -> None:
        """Leader: the state after round `rnd` (samples [0, cursor)) to the store (site_agent/checkpointing.py)."""
        self.ckpt.checkpoint(rnd, cursor, trainer=self.trainer, retained=self.retained, epoch=self.epoch,
                             frontier_manifest=self.plan.frontier_manifest if self.plan is not None else None,
                             step=self.step_at_end.get(rnd, (rnd + 1) * self.spr), background=background)

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
            other = not_for_this_process(typed, self.me, self.node.inc) if isinstance(typed, EpochPlan) else None
            if other is not None:
                assert isinstance(typed, EpochPlan)
                self.log.emit("membership_skipped", skipped_epoch=typed.epoch, start_round=typed.start_round,
                              reason=other)
                continue
            if isinstance(typed, EpochPlan):  # the same epoch sent again replaces the copy that waits
                self.pending = [m for m in self.pending if not (isinstance(m, EpochPlan) and m.epoch == typed.epoch)]
            self.pending.append(typed)

    def newer_plan_waiting(self, by_round: int | None = None) -> bool:
        """True when a stop, a shutdown, or a newer epoch that takes effect by the round in flight
        (or by `by_round`) waits.

        A newer epoch scheduled for a later round (a rejoin or a drain at the next boundary)
        lets the round in flight finish under the current epoch.
        """
        if self.stopping["flag"]:
            return True
        self._poll_ctl()
        return any(isinstance(m, Shutdown) for m in self.pending) or interrupts(
            self.pending, self.epoch, self.inflight if by_round is None else by_round)

    def next_control(self) -> EpochPlan | Shutdown | None:
        """Block until the next control message to act on (a plan or a shutdown); None on a stop signal.

        A shutdown wins. Plans are taken in epoch order (`site_core.epochs.next_plan`): a plan
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
            self.ckpt.wait()  # a checkpoint in flight finishes (as it did when it was written inline)
        except Exception as e:  # leaving anyway: say so, then stop as planned
            log.emit("checkpoint_failed", reason=f"{type(e).__name__}: {e}")
        return _exit(log, node, rc, reason, self.pool)

    def wait_for_newer_epoch(self) -> None:
        """After a failed round: do nothing until the coordinator decides (a new epoch or a shutdown)."""
        while not self.newer_plan_waiting():
            self.node.check()
            time.sleep(0.05)


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


def _exit_early(log: EventLog, pool: WorkerPool, rc: int, reason: str) -> int:
    """Exit before the WAN endpoint exists (W > 1 only: the intra-site group did not form)."""
    pool.close(reason)
    log.emit("site_stopped", reason=reason, rc=rc, peak_rss_mib=peak_rss_mib())
    log.close()
    return rc


def _exit(log: EventLog, node: WanNode, rc: int, reason: str, pool: WorkerPool | None = None) -> int:
    if pool is not None:
        pool.close(reason)
    node.wait_acked(3.0)
    node.close()  # the last counters are read when nothing more can be sent
    log.emit("wan_counters", **node.final_counters())
    log.emit("site_stopped", reason=reason, rc=rc, peak_rss_mib=peak_rss_mib())
    log.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
