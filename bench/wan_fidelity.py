"""wan_fidelity: does a payload cross an emulated link in the time the link profile promises?

Two WanNodes in this process: "a" (a DEALER with a Route to "b" through the Toxiproxy proxy
`a_to_b`) and "b" (a CURVE ROUTER). The proxy's upstream direction is shaped with latency L and
bandwidth B. A payload of S bytes (float32) is cut into `coll`-style messages of at most
wan.chunk_bytes and sent reliably, as the collective does. The clock (time.monotonic, one process)
starts right before the first send and stops when a receiver thread has taken the last byte off
b's inbox. Ideal = L + S / B. Reported per size: median over repetitions of measured / ideal.
`ratio` = the worst of those medians over S >= 1 MiB; goal <= 1.10.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

import numpy as np

from bench.common import KB, MiB, BenchCluster, BenchError, env_info, median, write_result
from wan.frames import TrafficClass
from ground.config import LinkProfile, LinkSpec, WanConfig

NAME = "wan_fidelity"
LATENCY_MS = 20
BANDWIDTH_KBPS = 4000  # KB/s, KB = 1000 bytes
SIZES = [64 * 1024, 256 * 1024, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
REPS = {64 * MiB: 2}  # the 64 MiB case takes ~17 s per repetition; every other size is repeated 3 times
DEFAULT_REPS = 3
GOAL = 1.10
# Two-sided: a ratio under GOAL_LOW means the payload crossed faster than the configured bandwidth
# allows, i.e. shaping was silently off (Toxiproxy's bandwidth toxic never lets a transfer beat L + S/B
# by more than timer granularity; 5 % covers that).
GOAL_LOW = 0.95


def run() -> dict:
    wan = WanConfig(curve=True)  # chunk_bytes 1 MiB; messages are <= 1 MiB + header < max_frame_bytes (8 MiB)
    spec = LinkSpec(up=LinkProfile(LATENCY_MS, 0, BANDWIDTH_KBPS), down=LinkProfile(LATENCY_MS, 0, 0))
    part_elems = wan.chunk_bytes // 4
    samples: dict[int, list[dict]] = {s: [] for s in SIZES}
    t_start = time.monotonic()
    with BenchCluster(["a", "b"], {"a_to_b": spec}, wan) as cl:
        a, b = cl.nodes["a"], cl.nodes["b"]
        inbox = b.inbox("blob")
        cl.start()
        toxics = cl.client.list_toxics("a_to_b")

        def one(size: int, tag: int) -> dict:
            data = np.random.default_rng(tag).standard_normal(size // 4).astype(np.float32)
            done = threading.Event()
            result: dict = {}

            def receiver() -> None:
                got = 0
                n = 0
                while got < size:
                    try:
                        msg = inbox.get(timeout=120)
                    except queue.Empty:
                        result["error"] = f"receiver got {got} of {size} bytes in 120 s"
                        break
                    if msg.body.get("tag") != tag:
                        continue  # a stray from an earlier run (should not happen: runs are acked)
                    got += msg.array(0).nbytes
                    n += 1
                result["t_done"] = time.monotonic()
                result["messages"] = n
                done.set()

            rx = threading.Thread(target=receiver, daemon=True)
            rx.start()
            wire0 = _tx_wire(a)
            t0 = time.monotonic()
            for off in range(0, data.size, part_elems):
                a.send("b", "blob", TrafficClass.COLLECTIVE.value, {"tag": tag, "offset": off}, [data[off:off + part_elems]])
            t_queued = time.monotonic()
            done.wait(180)
            rx.join(1)
            if "error" in result or "t_done" not in result:
                raise BenchError(f"size {size}: {result.get('error', 'receiver did not finish')}")
            if not a.wait_acked(30, "b"):
                raise BenchError(f"size {size}: sender still has {a.unacked('b')} unacked messages after delivery")
            measured = result["t_done"] - t0
            ideal = LATENCY_MS / 1000 + size / (BANDWIDTH_KBPS * KB)
            wire = _tx_wire(a) - wire0
            return {"size": size, "measured_s": measured, "ideal_s": ideal, "ratio": measured / ideal,
                    "enqueue_s": t_queued - t0, "messages": result["messages"], "wire_bytes": wire,
                    "ideal_wire_s": LATENCY_MS / 1000 + wire / (BANDWIDTH_KBPS * KB)}

        tag = 0
        max_reps = max([DEFAULT_REPS, *REPS.values()])
        for rep in range(max_reps):  # sizes interleaved across repetitions, so drift hits all sizes alike
            for size in SIZES:
                if rep >= REPS.get(size, DEFAULT_REPS):
                    continue
                tag += 1
                s = one(size, tag)
                samples[size].append(s)
                print(f"  {size / MiB:8.3f} MiB rep {rep}: {s['measured_s']:.3f} s, ideal {s['ideal_s']:.3f} s, "
                      f"ratio {s['ratio']:.4f}", flush=True)
        stats = cl.stats()
        version = cl.toxiproxy_version
    per_size = {}
    for size, ss in samples.items():
        per_size[str(size)] = {
            "size_bytes": size,
            "median_measured_s": median([s["measured_s"] for s in ss]),
            "ideal_s": ss[0]["ideal_s"],
            "median_ratio": median([s["ratio"] for s in ss]),
            "median_ratio_vs_wire_bytes": median([s["measured_s"] / s["ideal_wire_s"] for s in ss]),
            "samples": ss,
        }
    gated = [per_size[str(s)]["median_ratio"] for s in SIZES if s >= MiB]
    # The worst side: the size farthest from 1.0 (too slow, or impossibly fast = no shaping).
    ratio = max(gated, key=lambda r: abs(r - 1.0))
    raw = {"latency_ms": LATENCY_MS, "bandwidth_kbps": BANDWIDTH_KBPS, "per_size": per_size,
           "toxics_a_to_b": toxics, "node_stats": stats, "wall_s": time.monotonic() - t_start}
    notes = (
        f"Two WanNodes (CURVE on) in one process; a -> Toxiproxy proxy a_to_b -> b's ROUTER. Upstream shaped with "
        f"latency {LATENCY_MS} ms (no jitter) and bandwidth B = {BANDWIDTH_KBPS} KB/s (KB = 1000 B, per connection); "
        f"downstream (acks) latency {LATENCY_MS} ms, unlimited. Payload S of float32 cut into reliable messages of "
        f"<= wan.chunk_bytes = {wan.chunk_bytes} B (traffic class collective). Timed with time.monotonic from "
        f"just before the first send() to a receiver thread taking the last byte off b's inbox. Reference: "
        f"ideal = L + S/B with S = payload bytes (wire bytes incl. msgpack header and CURVE/ZMTP framing are "
        f"~0.02% more; see median_ratio_vs_wire_bytes). Each size repeated {DEFAULT_REPS}x (64 MiB: "
        f"{REPS[64 * MiB]}x), sizes interleaved; per-size median. ratio = the per-size median over S >= 1 MiB farthest from 1.0 (goal two-sided: under 0.95 = shaping off). "
        f"Small sizes (64/256 KiB) are reported but not gated: there fixed costs (CURVE, Python wake-ups, "
        f"Toxiproxy's per-chunk latency timer) are a visible share of a ~36-85 ms ideal.")
    return write_result(NAME, ratio=ratio, goal=f"{GOAL_LOW:.2f} <= r <= {GOAL:.2f}",
                        passed=GOAL_LOW <= ratio <= GOAL, raw=raw, reference="analytic_bound",
                        measures=["wan/", "bench/wan_fidelity.py", "bench/common.py"],
                        env=env_info(version), notes=notes)


def _tx_wire(node) -> int:
    return sum(r["bytes"] for r in node.counters.snapshot() if r["side"] == "tx" and r["link"] == "a_to_b")


if __name__ == "__main__":
    r = run()
    sys.exit(0 if r["passed"] else 1)
