"""The coordinator process: the shell around its pure core (coordinator/core.py).

`python -m coordinator.service --run-dir RUN` reads the run's config and topology, binds its
ROUTER (sites reach it only through their `<site>_to_coord` proxies) and loops:
  receive a message -> core.step(Received) ; then core.step(Tick) -> apply the outputs in order
  (journal append, log line, send, fence, log context).
It waits for a message at most 50 ms, and no later than the next membership deadline
(coordinator/deadline.py), so a failure is decided when its timeout or grace runs out.

Every rule (membership epochs, failure detection, recovery plans, the commit record, completion)
is in the core; this module owns the sockets, the journal file, the event log and the real clock.
It logs every input that reached the core as a `coord_input` event (a message: its header and
body; a tick: the closed connections) right after the decisions it produced, so a run's
coordinator log replays through the core to the same decisions (tests/{unit,live}/test_coordinator_core.py).
On restart the core rebuilds its state from the journal (`core.recover`), so the commit record
survives a coordinator crash.
"""

from __future__ import annotations

import argparse
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

from coordinator import core
from coordinator.deadline import next_deadline_ns
from coordinator.recovery import ClusterView
from ground.config import RunConfig, config_from_json
from ground.resources import peak_rss_mib
from ground.eventlog import EventLog, read_events
from ground.journal import Journal
from ground.messages import Heartbeat
from ground.schedule import target_tokens
from ground.topology import COORD, Topology
from ground.stop_request import watch_stop_request
from wan.frames import Message, TrafficClass
from wan.node import WanNode

CONTROL = TrafficClass.CONTROL.value
INPUT_EVENT = "coord_input"  # one input to the core (coordinator/core.py), logged for replay
POLL_S = 0.05  # the longest wait for a message between ticks (s)
DRAIN_MAX_MESSAGES = 256  # the most messages handled between two ticks (then the membership step runs)


class Coordinator:
    def __init__(self, run_dir: Path, cfg: RunConfig, topo: Topology, log: EventLog) -> None:
        self.run_dir, self.cfg, self.topo, self.log = run_dir, cfg, topo, log
        self.node = WanNode(name=COORD, run_id=cfg.run_id, wan=cfg.wan, log=log, bind=topo.bind_for(COORD),
                            server_links=topo.server_links_for(COORD), members=topo.peers_of(COORD),
                            keys_dir=str(run_dir / "keys") if cfg.wan.curve else None)
        self.inbox = self.node.inbox(*core.KINDS)
        self.mcfg = core.membership_config(cfg)
        self.hb_stats: dict[str, dict[str, float]] = {}
        self.stop = False
        self.journal_path = run_dir / "coordinator" / "journal.jsonl"
        self.journal: Journal | None = None  # opened after the old records are read
        records, problem = Journal.load(self.journal_path)
        # The epochs the previous incarnation logged: a SIGKILL between journaling an epoch and
        # logging it leaves one the history does not name (the core then logs it).
        logged = frozenset(int(e["epoch"]) for e in read_events(log.path) if e.get("event") == "membership_epoch") \
            if records and log.path.is_file() else None
        self.state, outputs = core.recover(records, problem, time.monotonic_ns(), cfg, logged)
        self._apply(outputs)
        self.journal = Journal(self.journal_path)

    # ------------------------------------------------------------------ the core's state, read-only
    membership = property(lambda self: self.state.membership)
    plan = property(lambda self: self.state.plan)
    frontier = property(lambda self: self.state.frontier)
    commits = property(lambda self: self.state.commits)
    committed_round = property(lambda self: self.state.committed_round)
    committed_cursor = property(lambda self: self.state.committed_cursor)
    reports = property(lambda self: self.state.reports)
    oracle = property(lambda self: self.state.oracle)
    oracle_dropped = property(lambda self: self.state.oracle_dropped)
    pending_frontiers = property(lambda self: self.state.pending_frontiers)
    resync = property(lambda self: self.state.resync)
    shutdown_sent = property(lambda self: self.state.shutdown_sent)
    epoch_members = property(lambda self: self.state.recent.epoch_members)
    checkpoint_first_epoch = property(lambda self: self.state.recent.checkpoint_first_epoch)

    def view(self) -> ClusterView:
        return core.view(self.state, self.cfg)

    # ------------------------------------------------------------------ feeding the core
    def _apply(self, outputs: list[core.Output]) -> None:
        """Carry out the core's outputs in order (the journal record is durable before it is logged or sent)."""
        for o in outputs:
            if isinstance(o, core.Journal):
                assert self.journal is not None, "the core journals nothing while recovering"
                self.journal.append(o.record)
            elif isinstance(o, core.Emit):
                self.log.emit(o.event, **o.fields)
            elif isinstance(o, core.Send):
                self.node.send(o.to, o.kind, CONTROL, o.body, epoch=o.epoch)
            elif isinstance(o, core.Fence):
                self.node.set_fence(o.epoch)
            elif isinstance(o, core.Context):
                self.log.set_context(**o.fields)

    def handle(self, msg: Message, now_ns: int) -> None:
        """One received message through the core, its decisions applied, then logged as an input.
        Nothing in a message can stop the loop: a failure to carry out its decisions (a journal that
        cannot be written) is logged, and the state stays as it was before the message."""
        before = self.state
        self.state, outputs = core.step(before, core.Received(msg.src, msg.inc, msg.epoch, msg.kind, msg.body),
                                        now_ns, self.cfg)
        rejected = any(isinstance(o, core.Emit) and o.event == "report_rejected" for o in outputs)
        try:
            self._apply(outputs)
        except Exception as e:
            self.state, rejected = before, True
            self.log.emit("report_rejected", kind=str(msg.kind)[:64], src=msg.src, site=msg.src, msg_epoch=msg.epoch,
                          reason=f"internal_error: {type(e).__name__}: {str(e)[:500]}")
        # A rejected message changed nothing, and its body may be anything (huge, binary): only its
        # header is kept. An accepted one is logged whole: the core's input, for replay.
        self.log.emit(INPUT_EVENT, input="message", now_ns=now_ns, src=msg.src, inc=msg.inc, msg_epoch=msg.epoch,
                      kind=str(msg.kind)[:64], **({"rejected": True} if rejected else {"body": msg.body}))
        if msg.kind == "heartbeat" and not rejected:
            self._heartbeat_stats(msg.src, Heartbeat.from_body(msg.body), now_ns)

    def step_membership(self, now_ns: int, lost: dict[str, int] | None = None) -> None:
        """One tick through the core (membership, recovery, completion); logged when it decided anything."""
        event = core.Tick(tuple(sorted((lost or {}).items())))
        before = self.state
        self.state, outputs = core.step(before, event, now_ns, self.cfg)
        self._apply(outputs)
        if outputs or self.state != before:  # a tick that changed nothing is not needed to replay the run
            self.log.emit(INPUT_EVENT, input="tick", now_ns=now_ns, lost=dict(event.lost))

    def _heartbeat_stats(self, site: str, hb: Heartbeat, now_ns: int) -> None:
        st = self.hb_stats.setdefault(site, {"n": 0, "max_delay_ms": 0.0, "max_gap_ms": 0.0, "last_ns": 0})
        delay_ms = (now_ns - hb.sent_mono_ns) / 1e6 if hb.sent_mono_ns is not None else 0.0
        if st["last_ns"]:
            st["max_gap_ms"] = max(st["max_gap_ms"], (now_ns - st["last_ns"]) / 1e6)
        st["last_ns"] = now_ns
        st["n"] += 1
        st["max_delay_ms"] = max(st["max_delay_ms"], delay_ms)

    def _wait_s(self, now_ns: int) -> float:
        """How long to wait for a message before the next tick: POLL_S, or less when a membership
        deadline (coordinator/deadline.py) comes sooner, so that a failure is decided at its deadline
        (the simulator ticks there too). A connection the WAN endpoint saw close is read at the next
        tick, at most POLL_S later: well inside the disconnect grace its deadline counts from."""
        deadline, _calm = next_deadline_ns(self.state, self.mcfg, now_ns)
        if deadline is None:
            return POLL_S
        return min(POLL_S, max(0.0, (deadline - now_ns) / 1e9))

    def run(self) -> int:
        self.node.start()
        self.log.emit("coordinator_started", expected_sites=list(self.mcfg.expected_sites),
                      policy=self.cfg.recovery.policy, journal_commits=len(self.state.commits),
                      target_samples=core.target_samples(self.cfg),
                      target_tokens=target_tokens(self.cfg))
        if self.membership.epoch > 0:  # after a restart: re-announce the current epoch
            self._apply(core.announce_current(self.state, self.cfg))
        last_stats = time.monotonic()
        while not self.stop:
            self.node.check()
            try:
                msg = self.inbox.get(timeout=self._wait_s(time.monotonic_ns()))
                self.handle(msg, time.monotonic_ns())
                # Drain what else is queued before deciding, but a bounded number, and never past
                # POLL_S or the next deadline: a flood of accepted messages (telemetry, heartbeats)
                # must not keep failure detection, epochs and completion from ticking. The inbox
                # serves its sources in turn (wan/delivery.py), so the flood does not starve others.
                until_ns = time.monotonic_ns() + int(self._wait_s(time.monotonic_ns()) * 1e9)
                for _ in range(DRAIN_MAX_MESSAGES):
                    if time.monotonic_ns() >= until_ns:
                        break
                    self.handle(self.inbox.get_nowait(), time.monotonic_ns())
            except queue.Empty:
                pass
            self.step_membership(time.monotonic_ns(), self.node.lost_connections())
            if time.monotonic() - last_stats >= 1.0:
                last_stats = time.monotonic()
                if self.hb_stats:
                    self.log.emit("heartbeat_stats", sites={k: {kk: vv for kk, vv in v.items() if kk != "last_ns"}
                                                            for k, v in self.hb_stats.items()})
                self.log.emit("wan_counters", counters=self.node.counters.snapshot())
            if self.state.shutdown_sent:
                self.node.wait_acked(5.0)
                break
        self.node.close()  # the last counters are read when nothing more can be sent
        self.log.emit("wan_counters", **self.node.final_counters())
        self.log.emit("coordinator_stopped", reason="shutdown" if self.state.shutdown_sent else "signal",
                      peak_rss_mib=peak_rss_mib())
        if self.journal is not None:
            self.journal.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coordinator.service", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = config_from_json(args.run_dir / "config.json")
    topo = Topology.load(args.run_dir / "topology.json")
    log = EventLog(args.run_dir / "logs" / f"{COORD}.jsonl", cfg.run_id, COORD)
    coord = Coordinator(args.run_dir, cfg, topo, log)

    def _stop(signum: int, _frame: Any) -> None:
        log.emit("signal", signal=signal.Signals(signum).name)
        coord.stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    watch_stop_request(args.run_dir, COORD)  # the end of a compose run asks through the run directory
    return coord.run()


if __name__ == "__main__":
    sys.exit(main())
