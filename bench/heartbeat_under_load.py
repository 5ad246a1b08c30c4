"""heartbeat_under_load: does control traffic starve behind a big collective in the same process?

Processes (all WanNodes in this process, CURVE on): site "a" (DEALERs to b and coord), site "b" and
"coord" (ROUTERs). Proxy a_to_b and proxy a_to_coord are both shaped to 10 Mbit/s (1250 KB/s) in
both directions, with the product's default latencies (site link 20 +- 2 ms, service link 5 ms).

a saturates a_to_b with a continuous stream of 1 MiB collective-class reliable messages for ~20 s
(a producer thread keeps WINDOW messages unacked, so the link never idles), while a's I/O thread
sends an unreliable heartbeat to coord every wan.heartbeat_interval_ms (200 ms), exactly like the
site agent (`node.every(...)`, body carries sent_mono_ns). A coord thread records each heartbeat's
arrival. Per heartbeat: delay = arrival mono_ns - sent mono_ns (one clock: same process).
`ratio` = max gap between consecutive heartbeat arrivals while the link is loaded / heartbeat
timeout (WanConfig().heartbeat_timeout_ms = 3000 ms); goal < 1.0 (no false suspicion).

The coordinator's whole failure detector is also replayed on what coord saw: every 10 ms, the
last heartbeat's arrival and whether a's connection was lost with nothing heard since
(`WanNode.lost_connections`) go through `coordinator.membership.decide` with the default
heartbeat timeout and disconnect grace (`RecoveryConfig().disconnect_grace_ms`). Any decision
other than "none" is a false suspicion (a is alive throughout) and fails the benchmark.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

import numpy as np

from bench.common import KB, MiB, BenchCluster, BenchError, env_info, median, percentile, write_result
from coordinator import membership
from wan.frames import TrafficClass
from ground.config import LinkProfile, LinkSpec, RecoveryConfig, WanConfig

NAME = "heartbeat_under_load"
RATE_KBPS = 1250  # 10 Mbit/s
LOAD_S = 20.0
BASELINE_S = 3.0
WINDOW = 8  # 1 MiB messages kept unacked: ~6.7 s of backlog at 1250 KB/s, so the link never idles
GOAL = 1.0
POLL_S = 0.01  # how often the detector's inputs are sampled


def detector_suspicions(samples: list[tuple[int, int, int]], cfg: membership.MembershipConfig) -> list[str]:
    """The coordinator's decisions about a live site over sampled (now, last heartbeat arrival,
    connection lost at or 0); every one that is not "none" is a false suspicion."""
    out = []
    for now, last_hb, lost in samples:
        m = membership.Membership(epoch=1, members=("a",), sites={"a": membership.SiteRecord("a", membership.SiteState.ACTIVE, last_hb, 1, lost)})
        d, why = membership.decide(now, m, cfg)
        if d.action != membership.Action.NONE:
            out.append(why)
    return out


def run() -> dict:
    wan = WanConfig(curve=True)
    site, svc = wan.site_link.up, wan.service_link.up
    site_spec = LinkSpec(up=LinkProfile(site.latency_ms, site.jitter_ms, RATE_KBPS),
                         down=LinkProfile(site.latency_ms, site.jitter_ms, RATE_KBPS))
    svc_spec = LinkSpec(up=LinkProfile(svc.latency_ms, svc.jitter_ms, RATE_KBPS),
                        down=LinkProfile(svc.latency_ms, svc.jitter_ms, RATE_KBPS))
    timeout_ms = wan.heartbeat_timeout_ms
    t_start = time.monotonic()
    with BenchCluster(["a", "b", "coord"], {"a_to_b": site_spec, "a_to_coord": svc_spec}, wan) as cl:
        a, b, coord = cl.nodes["a"], cl.nodes["b"], cl.nodes["coord"]
        hb_q = coord.inbox("heartbeat")
        blob_q = b.inbox("blob")
        sent = [0]

        def heartbeat() -> None:  # runs on a's I/O thread, as in site_agent.agent
            sent[0] += 1
            a.send("coord", "heartbeat", TrafficClass.CONTROL.value,
                   {"sent_mono_ns": time.monotonic_ns(), "i": sent[0]}, reliable=False)

        a.every(wan.heartbeat_interval_ms, heartbeat)
        cl.start()
        started = time.monotonic_ns()  # heartbeats sent before this raced the connection set-up
        stop = threading.Event()
        arrivals: list[tuple[int, int, int]] = []  # (arrival_ns, sent_ns, i)
        blobs: list[tuple[int, int]] = []  # (arrival_ns, payload bytes)
        detector: list[tuple[int, int, int]] = []  # (now, last heartbeat arrival, a's connection lost at or 0)
        disconnects: set[int] = set()

        def hb_rx() -> None:
            last = time.monotonic_ns()
            while not stop.is_set():
                try:
                    m = hb_q.get(timeout=POLL_S)
                    last = time.monotonic_ns()
                    arrivals.append((last, int(m.body["sent_mono_ns"]), int(m.body["i"])))
                except queue.Empty:
                    pass
                lost = coord.lost_connections().get("a", 0)
                if lost:
                    disconnects.add(lost)
                detector.append((time.monotonic_ns(), last, lost))

        def blob_rx() -> None:
            while not stop.is_set():
                try:
                    m = blob_q.get(timeout=0.1)
                except queue.Empty:
                    continue
                blobs.append((time.monotonic_ns(), m.array(0).nbytes))

        rx_threads = [threading.Thread(target=f, daemon=True) for f in (hb_rx, blob_rx)]
        for t in rx_threads:
            t.start()
        time.sleep(BASELINE_S)  # unloaded heartbeats, for comparison

        chunk = np.random.default_rng(0).standard_normal(MiB // 4).astype(np.float32)
        load_start = time.monotonic_ns()
        n_sent = 0
        while time.monotonic_ns() - load_start < LOAD_S * 1e9:
            a.check()
            if a.unacked("b") < WINDOW:
                a.send("b", "blob", TrafficClass.COLLECTIVE.value, {"n": n_sent}, [chunk])
                n_sent += 1
            else:
                time.sleep(0.005)
        load_sent_end = time.monotonic_ns()
        if not a.wait_acked(WINDOW * MiB / (RATE_KBPS * KB) + 30, "b"):
            raise BenchError(f"collective stream not drained: {a.unacked('b')} messages unacked")
        time.sleep(1.0)  # a few unloaded heartbeats after the stream
        stop.set()
        for t in rx_threads:
            t.join(2)
        stats = cl.stats()
        version = cl.toxiproxy_version
        counters = a.counters.snapshot()

    if len(blobs) != n_sent:
        raise BenchError(f"b received {len(blobs)} of {n_sent} collective messages")
    load_end = blobs[-1][0]  # the last collective byte reached b: the link was loaded until here
    # Throughput over the stream, at the receiver: bytes after the first message / time since it arrived.
    stream_s = (blobs[-1][0] - blobs[0][0]) / 1e9
    achieved_kbps = sum(n for _t, n in blobs[1:]) / stream_s / KB
    arr_ns = [t for t, _s, _i in arrivals]
    delays_ms = [(t - s) / 1e6 for t, s, _i in arrivals]
    loaded = [(t, s, i) for t, s, i in arrivals if load_start <= s <= load_end]
    base = [(t, s, i) for t, s, i in arrivals if started <= s < load_start]
    if len(loaded) < 10:
        raise BenchError(f"only {len(loaded)} heartbeats arrived while the link was loaded")
    # Gaps between consecutive arrivals that fall in the loaded window, plus the edges of the window.
    in_win = [t for t in arr_ns if load_start <= t <= load_end]
    edges = [load_start, *in_win, load_end]
    gaps_loaded_ms = [(y - x) / 1e6 for x, y in zip(edges, edges[1:])]
    gaps_all_ms = [(y - x) / 1e6 for x, y in zip(arr_ns, arr_ns[1:])]
    max_gap = max(gaps_loaded_ms)
    ratio = max_gap / timeout_ms
    dcfg = membership.MembershipConfig(expected_sites=("a",), heartbeat_timeout_ms=timeout_ms,
                               disconnect_grace_ms=RecoveryConfig().disconnect_grace_ms)
    in_run = [x for x in detector if x[0] >= started]
    suspicions = detector_suspicions(in_run, dcfg)
    d_loaded = [(t - s) / 1e6 for t, s, _i in loaded]
    d_base = [(t - s) / 1e6 for t, s, _i in base]
    seq_recv = sorted(i for _t, _s, i in arrivals)
    raw = {
        "rate_kbps": RATE_KBPS, "site_link": site_spec, "service_link": svc_spec, "load_s": LOAD_S,
        "window_messages": WINDOW, "collective_messages": n_sent, "collective_payload_bytes": n_sent * MiB,
        "stream_s": stream_s, "achieved_payload_kbps": achieved_kbps,
        "achieved_fraction_of_rate": achieved_kbps / RATE_KBPS,
        "load_sent_for_s": (load_sent_end - load_start) / 1e9, "loaded_window_s": (load_end - load_start) / 1e9,
        "heartbeat_interval_ms": wan.heartbeat_interval_ms, "heartbeat_timeout_ms": timeout_ms,
        "heartbeats_sent": sent[0], "heartbeats_received": len(arrivals),
        "heartbeats_missing": sent[0] - len(set(seq_recv)),
        "heartbeats_sent_before_links_up": sum(1 for _t, s, _i in arrivals if s < started),
        "loaded": {"n": len(loaded), "delay_p50_ms": median(d_loaded), "delay_p99_ms": percentile(d_loaded, 99),
                   "delay_max_ms": max(d_loaded), "max_gap_ms": max_gap, "median_gap_ms": median(gaps_loaded_ms)},
        "baseline_unloaded": {"n": len(base), "delay_p50_ms": median(d_base) if d_base else None,
                              "delay_p99_ms": percentile(d_base, 99) if d_base else None,
                              "delay_max_ms": max(d_base) if d_base else None},
        "all": {"delay_p50_ms": median(delays_ms), "delay_p99_ms": percentile(delays_ms, 99),
                "delay_max_ms": max(delays_ms), "max_gap_ms": max(gaps_all_ms)},
        "heartbeat_delays_ms_loaded": d_loaded,
        "tx_counters_a": counters, "node_stats": stats, "wall_s": time.monotonic() - t_start,
        "detector": {"heartbeat_timeout_ms": timeout_ms, "disconnect_grace_ms": dcfg.disconnect_grace_ms,
                     "samples": len(in_run), "connections_lost": len(disconnects),
                     "false_suspicions": len(suspicions), "reasons": suspicions[:10]},
    }
    notes = (
        f"a -> b over proxy a_to_b and a -> coord over proxy a_to_coord, both {RATE_KBPS} KB/s (10 Mbit/s) each way, "
        f"latencies from WanConfig defaults (site {site.latency_ms}+-{site.jitter_ms} ms, service {svc.latency_ms} ms); "
        f"CURVE on; all three WanNodes in one process (each its own ZeroMQ context and I/O thread). A producer "
        f"thread streams 1 MiB float32 collective-class reliable messages a->b for {LOAD_S:g} s, keeping "
        f"{WINDOW} unacked so the link never idles (achieved payload rate at b reported; the link stays loaded "
        f"until the last message arrives, ~{WINDOW * MiB / (RATE_KBPS * KB):.1f} s after sending stops). a's I/O "
        f"thread sends an unreliable heartbeat every {wan.heartbeat_interval_ms} ms (node.every, as site_agent). "
        f"Delay = coord arrival mono_ns - sent_mono_ns. ratio = max gap between heartbeat arrivals inside the "
        f"loaded window (window edges included) / heartbeat_timeout_ms {timeout_ms}. {BASELINE_S:g} s of unloaded "
        f"heartbeats before the load for comparison (heartbeats sent before the links were up are excluded from "
        f"the baseline but counted in `all`). CAVEAT (emulator fidelity): Toxiproxy shapes each proxy "
        f"connection separately, so the heartbeat link a_to_coord has its OWN 10 Mbit/s and is not a shared site "
        f"uplink: this measures starvation inside the process (outbox, I/O thread, GIL, ZeroMQ I/O thread, CURVE), "
        f"not queueing behind the collective on a shared wire; a real shared uplink would add the collective's "
        f"queue to the heartbeat delay.")
    notes += (f" Detector replay: {len(in_run)} samples every {POLL_S * 1000:g} ms through membership.decide "
              f"(heartbeat timeout {timeout_ms} ms, disconnect grace {dcfg.disconnect_grace_ms} ms): "
              f"{len(disconnects)} lost connections, {len(suspicions)} false suspicions; passing needs 0.")
    return write_result(NAME, ratio=ratio, goal=f"< {GOAL:.1f}", passed=ratio < GOAL and not suspicions, raw=raw,
                        reference="fixed_goal", measures=["wan/", "coordinator/membership.py",
                                                          "bench/heartbeat_under_load.py", "bench/common.py"],
                        env=env_info(version), notes=notes)


if __name__ == "__main__":
    r = run()
    sys.exit(0 if r["passed"] else 1)
