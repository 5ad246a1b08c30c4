"""emulator_ceiling: the highest goodput one shaped link sustains with CURVE on.

Two WanNodes in this process: "a" (a DEALER with a Route to "b" through the Toxiproxy proxy
`a_to_b`) and "b" (a CURVE ROUTER). The proxy's upstream is shaped to bandwidth B (no latency, so
the transfer time is all bandwidth); acks come back unshaped. For each B of a ladder, and once
with no bandwidth toxic at all, a payload of S = clamp(B x 2 s, 8 MiB, 96 MiB) float32 bytes is
sent as reliable `coll`-style messages of wan.chunk_bytes, as the collective sends it, and timed
from before the first send to a receiver thread taking the last byte off b's inbox.

goodput(B) = S / measured. B is represented faithfully when goodput >= 0.90 x B. The ladder is
swept twice, interleaved, per-B median. `ceiling_bytes_per_s` = the largest faithful B;
`unshaped_goodput_bytes_per_s` = what the path carries with no toxic (the emulator's own limit).
`ratio` = ceiling / the demo's per-link bandwidth (xdc.cli.DEMO); goal >= 1.0: the emulator
represents the demo's WAN. Links faster than the ceiling are emulated slower than configured.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

import numpy as np

from bench.common import KB, MiB, BenchCluster, BenchError, env_info, median, write_result
from wan.frames import TrafficClass
from wan.toxiproxy import apply_link_spec
from ground.config import LinkProfile, LinkSpec, WanConfig

NAME = "emulator_ceiling"
LADDER_KBPS = [5_000, 20_000, 50_000, 100_000, 200_000, 400_000]  # KB/s (KB = 1000 B)
SWEEPS = 2
FAITHFUL = 0.90  # goodput >= 90 % of the configured bandwidth
SECONDS_PER_POINT = 2.0
MIN_BYTES, MAX_BYTES = 8 * MiB, 96 * MiB
GOAL = 1.0


def _demo_link_kbps() -> int:
    from xdc.cli import DEMO

    return int(DEMO["wan"]["site_link"]["up"]["bandwidth_kbps"])


def _size_for(kbps: int) -> int:
    if kbps <= 0:
        return MAX_BYTES
    s = int(kbps * KB * SECONDS_PER_POINT)
    s = min(MAX_BYTES, max(MIN_BYTES, s))
    return s - s % 4


def run() -> dict:
    wan = WanConfig(curve=True)
    spec0 = LinkSpec(up=LinkProfile(0, 0, 0), down=LinkProfile(0, 0, 0))
    points: dict[int, list[dict]] = {b: [] for b in [*LADDER_KBPS, 0]}
    t_start = time.monotonic()
    with BenchCluster(["a", "b"], {"a_to_b": spec0}, wan) as cl:
        a, b = cl.nodes["a"], cl.nodes["b"]
        inbox = b.inbox("blob")
        cl.start()
        tag = 0

        def one(kbps: int) -> dict:
            nonlocal tag
            tag += 1
            apply_link_spec(cl.client, "a_to_b", LinkSpec(up=LinkProfile(0, 0, kbps), down=LinkProfile(0, 0, 0)))
            size = _size_for(kbps)
            measured = transfer(cl, "a", "b", inbox, size, tag, what=f"B={kbps} KB/s")
            goodput = size / measured
            return {"kbps": kbps, "size_bytes": size, "measured_s": measured, "goodput_bytes_per_s": goodput,
                    "fraction_of_configured": goodput / (kbps * KB) if kbps else None}

        for sweep in range(SWEEPS):
            order = [*LADDER_KBPS, 0] if sweep % 2 == 0 else [0, *reversed(LADDER_KBPS)]
            for kbps in order:
                p = one(kbps)
                points[kbps].append(p)
                frac = p["fraction_of_configured"]
                print(f"  B={kbps or 'unshaped'} KB/s: {p['goodput_bytes_per_s'] / 1e6:.1f} MB/s"
                      + (f" ({frac:.3f} of B)" if frac is not None else ""), flush=True)
        stats = cl.stats()
        version = cl.toxiproxy_version
    per_b = {}
    for kbps, ps in points.items():
        g = median([p["goodput_bytes_per_s"] for p in ps])
        per_b[str(kbps)] = {"kbps": kbps, "median_goodput_bytes_per_s": g,
                            "median_fraction": g / (kbps * KB) if kbps else None, "samples": ps}
    faithful = [k for k in LADDER_KBPS if per_b[str(k)]["median_fraction"] >= FAITHFUL]
    # The ceiling is the largest faithful B below the first unfaithful one (a ladder is monotone in principle).
    ceiling_kbps = 0
    for k in LADDER_KBPS:
        if per_b[str(k)]["median_fraction"] < FAITHFUL:
            break
        ceiling_kbps = k
    ceiling = ceiling_kbps * KB
    unshaped = per_b["0"]["median_goodput_bytes_per_s"]
    demo = _demo_link_kbps() * KB
    ratio = ceiling / demo
    raw = {"ladder_kbps": LADDER_KBPS, "faithful_threshold": FAITHFUL, "per_bandwidth": per_b,
           "faithful_kbps": faithful, "ceiling_bytes_per_s": ceiling,
           "unshaped_goodput_bytes_per_s": unshaped, "demo_link_bytes_per_s": demo,
           "chunk_bytes": wan.chunk_bytes, "node_stats": stats, "wall_s": time.monotonic() - t_start}
    import os

    load = os.getloadavg()[0]
    notes = (f"Two WanNodes (CURVE on) in one process; a -> Toxiproxy a_to_b -> b's ROUTER; upstream shaped to B "
             f"(no latency), acks unshaped. Payload clamp(B x {SECONDS_PER_POINT:g} s, 8 MiB, 96 MiB) of float32 "
             f"in reliable messages of {wan.chunk_bytes} B; goodput = payload bytes / (first send -> last byte off "
             f"the receiver's inbox). A bandwidth is represented faithfully when goodput >= {FAITHFUL:.2f} x B. "
             f"Ladder {LADDER_KBPS} KB/s swept {SWEEPS}x (up, then down), per-B median. Ceiling = largest faithful "
             f"B = {ceiling / 1e6:.0f} MB/s; with no bandwidth toxic the path carried {unshaped / 1e6:.0f} MB/s. "
             f"ratio = ceiling / the demo's per-link bandwidth ({demo / 1e6:.0f} MB/s). Measured on a shared 2-core "
             f"machine with other jobs running (load average {load:.1f} at the end): the ceiling on a quiet "
             f"machine is higher; every process of a cluster also shares these cores with training.")
    return write_result(NAME, ratio=ratio, goal=f">= {GOAL:.1f}", passed=ratio >= GOAL, raw=raw,
                        reference="fixed_goal", measures=["wan/", "bench/emulator_ceiling.py", "bench/common.py"],
                        env=env_info(version), notes=notes)


def transfer(cl: BenchCluster, src: str, dst: str, inbox: "queue.Queue", size: int, tag: int, what: str = "") -> float:
    """Send `size` bytes of float32 from src to dst as reliable messages of wan.chunk_bytes (kind
    "blob", traffic class collective); seconds from before the first send to a receiver thread taking
    the last byte off dst's `inbox` (registered for "blob"). Waits for the acks before returning."""
    part_elems = cl.wan.chunk_bytes // 4
    data = np.random.default_rng(tag).standard_normal(size // 4).astype(np.float32)
    result: dict = {}
    done = threading.Event()

    def receiver() -> None:
        got = 0
        while got < size:
            try:
                msg = inbox.get(timeout=300)
            except queue.Empty:
                result["error"] = f"receiver got {got} of {size} bytes in 300 s"
                break
            if msg.body.get("tag") != tag:
                continue
            got += msg.array(0).nbytes
        result["t_done"] = time.monotonic()
        done.set()

    rx = threading.Thread(target=receiver, daemon=True)
    rx.start()
    t0 = time.monotonic()
    for off in range(0, data.size, part_elems):
        cl.nodes[src].send(dst, "blob", TrafficClass.COLLECTIVE.value, {"tag": tag, "offset": off},
                           [data[off:off + part_elems]])
    done.wait(600)
    rx.join(1)
    if "error" in result or "t_done" not in result:
        raise BenchError(f"{what}: {result.get('error', 'receiver did not finish')}")
    if not cl.nodes[src].wait_acked(60, dst):
        raise BenchError(f"{what}: unacked messages after delivery")
    return result["t_done"] - t0


def mesh_transfer(cl: BenchCluster, inboxes: dict[str, "queue.Queue"], size: int, tag: int) -> tuple[float, int]:
    """Every process sends `size` bytes to every other one at once (each ordered pair a link of the mesh),
    as `transfer` does for one link: (seconds from the first send to the last byte taken off the last
    receiver's inbox, total payload bytes). `inboxes` holds each process's "blob" inbox.

    On one machine the links of a mesh share its cores (CURVE, Toxiproxy, Python), so this is the
    emulator's ceiling for traffic on every link at once, which a single link's ceiling overstates
    n(n-1) times over when every link is busy."""
    procs = list(cl.nodes)
    part_elems = cl.wan.chunk_bytes // 4
    data = np.random.default_rng(tag).standard_normal(size // 4).astype(np.float32)
    ends: dict[str, float] = {}
    errors: list[str] = []
    start = threading.Barrier(2 * len(procs) + 1)

    def receiver(dst: str) -> None:
        start.wait()
        got = {src: 0 for src in procs if src != dst}
        while any(v < size for v in got.values()):
            try:
                msg = inboxes[dst].get(timeout=300)
            except queue.Empty:
                errors.append(f"{dst} got {got} of {size} bytes per peer in 300 s")
                return
            if msg.body.get("tag") == tag and msg.src in got:
                got[msg.src] += msg.array(0).nbytes
        ends[dst] = time.monotonic()

    def sender(src: str) -> None:
        start.wait()
        for off in range(0, data.size, part_elems):  # interleaved: every link carries from the start
            for dst in procs:
                if dst != src:
                    cl.nodes[src].send(dst, "blob", TrafficClass.COLLECTIVE.value, {"tag": tag, "offset": off},
                                       [data[off:off + part_elems]])

    threads = [threading.Thread(target=receiver, args=(p,), daemon=True) for p in procs]
    threads += [threading.Thread(target=sender, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join(600)
    if errors or len(ends) != len(procs):
        raise BenchError(f"mesh transfer: {errors or 'a receiver did not finish'}")
    for p in procs:
        if not cl.nodes[p].wait_acked(60):
            raise BenchError(f"mesh transfer: {p} has unacked messages after delivery")
    n = len(procs)
    return max(ends.values()) - t0, size * n * (n - 1)


if __name__ == "__main__":
    r = run()
    sys.exit(0 if r["passed"] else 1)
