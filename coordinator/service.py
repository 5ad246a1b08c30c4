"""The coordinator process: membership epochs, heartbeats, and the commit record of every round.

`python -m coordinator.service --run-dir RUN` reads the run's config and topology, binds its
ROUTER (sites reach it only through their `<site>_to_coord` proxies) and loops:
  receive -> update state -> decide (pure, `membership.decide`) -> apply -> log the reason.
A round commits when every member of the epoch reported it with the same parameter hash;
the commit record goes to the durable journal before it is logged. When every member has
said it is done, the coordinator tells the sites to shut down and exits.
"""

from __future__ import annotations

import argparse
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

from coordinator import membership as mb
from coordinator.journal import Journal
from wan.frames import Message, TrafficClass
from wan.node import WanNode
from xdc.config import RunConfig, config_from_json
from xdc.eventlog import EventLog
from xdc.topology import COORD, Topology

CONTROL = TrafficClass.CONTROL.value


class Coordinator:
    def __init__(self, run_dir: Path, cfg: RunConfig, topo: Topology, log: EventLog) -> None:
        self.run_dir, self.cfg, self.topo, self.log = run_dir, cfg, topo, log
        self.node = WanNode(name=COORD, run_id=cfg.run_id, wan=cfg.wan, log=log, bind=topo.bind_for(COORD),
                            server_links=topo.server_links_for(COORD), members=topo.peers_of(COORD),
                            keys_dir=str(run_dir / "keys") if cfg.wan.curve else None)
        self.q = self.node.inbox("join", "heartbeat", "round_done", "site_done", "telemetry")
        self.mcfg = mb.MembershipConfig(expected_sites=tuple(cfg.cluster.sites),
                                        heartbeat_timeout_ms=cfg.wan.heartbeat_timeout_ms)
        self.m = mb.Membership()
        self.journal_path = run_dir / "coordinator" / "journal.jsonl"
        records, problem = Journal.load(self.journal_path)
        if problem:
            log.emit("journal_torn_tail", detail=problem)
        self.commits: list[dict[str, Any]] = [r for r in records if r.get("type") == "commit"]
        self.journal = Journal(self.journal_path)
        self.retained: set[int] = {s for c in self.commits for ids in c["samples"].values() for s in ids}
        self.reports: dict[int, dict[str, dict[str, Any]]] = {}
        self.hb_stats: dict[str, dict[str, float]] = {}
        self.last_reason = ""
        self.stop = False
        self.shutdown_sent = False

    # ------------------------------------------------------------------ handlers
    def on_message(self, msg: Message, now_ns: int) -> None:
        if msg.kind == "join":
            self.m = mb.on_join(self.m, msg.src, now_ns, msg.inc)
            self.log.emit("site_joined", site=msg.src, incarnation=msg.inc, pid=msg.body.get("pid"))
            if self.m.epoch > 0 and msg.src in self.m.members:
                self.send_membership([msg.src])
        elif msg.kind == "heartbeat":
            self.m = mb.on_heartbeat(self.m, msg.src, now_ns, msg.inc)
            st = self.hb_stats.setdefault(msg.src, {"n": 0, "max_delay_ms": 0.0, "max_gap_ms": 0.0, "last_ns": 0})
            delay_ms = (now_ns - int(msg.body.get("sent_mono_ns", now_ns))) / 1e6
            if st["last_ns"]:
                st["max_gap_ms"] = max(st["max_gap_ms"], (now_ns - st["last_ns"]) / 1e6)
            st["last_ns"] = now_ns
            st["n"] += 1
            st["max_delay_ms"] = max(st["max_delay_ms"], delay_ms)
        elif msg.kind == "round_done":
            self.on_round_done(msg)
        elif msg.kind == "site_done":
            self.m = mb.on_done(self.m, msg.src)
            self.log.emit("site_done", site=msg.src, round=msg.body.get("round"))
        elif msg.kind == "telemetry":
            self.log.emit("site_metrics", site=msg.src, **{k: v for k, v in msg.body.items() if k != "site"})

    def on_round_done(self, msg: Message) -> None:
        b = msg.body
        rnd = int(b["round"])
        if msg.epoch != self.m.epoch or msg.src not in self.m.members:
            self.log.emit("report_rejected", site=msg.src, round=rnd, reason=f"epoch {msg.epoch} is not current {self.m.epoch}")
            return
        self.reports.setdefault(rnd, {})[msg.src] = b
        got = self.reports[rnd]
        if set(got) != set(self.m.members):
            return
        hashes = {s: r["param_hash"] for s, r in got.items()}
        if len(set(hashes.values())) != 1:
            self.log.emit("commit_refused", round=rnd, reason="parameter hashes differ", hashes=hashes)
            del self.reports[rnd]
            return
        parent = self.commits[-1]["commit_id"] if self.commits else None
        samples = {s: [int(x) for x in r["samples"]] for s, r in sorted(got.items())}
        new = {x for ids in samples.values() for x in ids}
        self.retained |= new
        record = {
            "type": "commit",
            "commit_id": f"e{self.m.epoch}r{rnd}",
            "parent": parent,
            "round": rnd,
            "step": int(got[self.m.members[0]]["step"]),
            "epoch": self.m.epoch,
            "members": list(self.m.members),
            "param_hash": next(iter(hashes.values())),
            "samples": samples,
            "tokens": {s: int(r["tokens"]) for s, r in got.items()},
            "flops": {s: float(r["flops"]) for s, r in got.items()},
            "useful_tokens": len(self.retained) * self.cfg.model.seq_len,
        }
        self.journal.append(record)  # durable before anyone is told
        self.commits.append(record)
        del self.reports[rnd]
        self.log.set_context(step=record["step"])
        self.log.emit("commit", **{k: v for k, v in record.items() if k not in ("type", "samples")},
                      n_samples=len(new))

    def send_membership(self, to: list[str]) -> None:
        for s in to:
            self.node.send(s, "membership", CONTROL, {"epoch": self.m.epoch, "members": list(self.m.members)})

    # ------------------------------------------------------------------ loop
    def step_membership(self, now_ns: int) -> None:
        d, reason = mb.decide(now_ns, self.m, self.mcfg)
        if reason != self.last_reason:
            self.log.emit("membership_decision", action=d.action.value, reason=reason, site=d.site or None)
            self.last_reason = reason
        if d.action == mb.Action.NONE:
            return
        self.m = mb.apply(self.m, d)
        if d.action == mb.Action.FORM_EPOCH:
            self.node.set_fence(self.m.epoch)
            self.log.set_context(epoch=self.m.epoch)
            self.journal.append({"type": "epoch", "epoch": self.m.epoch, "members": list(self.m.members),
                                 "reason": reason})
            self.log.emit("membership_epoch", members=list(self.m.members), reason=reason)
            self.send_membership(list(self.m.members))
        elif d.action == mb.Action.SUSPECT:
            self.log.emit("site_suspected", site=d.site, reason=reason)
        elif d.action == mb.Action.CLEAR_SUSPICION:
            self.log.emit("suspicion_cleared", site=d.site, reason=reason)

    def run(self) -> int:
        self.node.start()
        self.log.emit("coordinator_started", expected_sites=list(self.mcfg.expected_sites),
                      journal_commits=len(self.commits))
        last_stats = time.monotonic()
        while not self.stop:
            self.node.check()
            try:
                msg = self.q.get(timeout=0.05)
                self.on_message(msg, time.monotonic_ns())
                while True:  # drain what else is queued before deciding
                    self.on_message(self.q.get_nowait(), time.monotonic_ns())
            except queue.Empty:
                pass
            self.step_membership(time.monotonic_ns())
            if time.monotonic() - last_stats >= 1.0:
                last_stats = time.monotonic()
                if self.hb_stats:
                    self.log.emit("heartbeat_stats", sites={k: {kk: vv for kk, vv in v.items() if kk != "last_ns"}
                                                            for k, v in self.hb_stats.items()})
            members = self.m.members
            if members and all(self.m.sites[s].state == mb.SiteState.DONE for s in members) and not self.shutdown_sent:
                self.log.emit("run_complete", commits=len(self.commits),
                              useful_tokens=self.commits[-1]["useful_tokens"] if self.commits else 0)
                for s in members:
                    self.node.send(s, "shutdown", CONTROL, {"reason": "all sites done"})
                self.shutdown_sent = True
                self.node.wait_acked(5.0)
                break
        self.log.emit("wan_counters", counters=self.node.counters.snapshot(), rejected=self.node.rejected,
                      duplicates=self.node.duplicates, retransmits=self.node.retransmits)
        self.log.emit("coordinator_stopped", reason="shutdown" if self.shutdown_sent else "signal")
        self.node.close()
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
    return coord.run()


if __name__ == "__main__":
    sys.exit(main())
