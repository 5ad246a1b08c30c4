"""The checkpoint store as a service with REAL processes, REAL ZeroMQ (CURVE) and the REAL
toxiproxy-server between the site and the store. BlobStore's own tests: tests/unit/test_checkpoint_store.py.

The integration tests fail (never skip) when toxiproxy-server is missing or does not start.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from checkpoint_store.blobstore import StoreError
from checkpoint_store.client import StoreClient
from ground.journal import Journal
from wan.keys import generate_cluster_keys
from wan.node import WanNode
from wan.toxiproxy import ToxiproxyClient, ToxiproxyServer, apply_link_spec, free_port
from ground.config import LinkProfile, LinkSpec, load_config, save_config
from ground.eventlog import EventLog, read_events
from ground.topology import Link, Topology

ROOT = Path(__file__).resolve().parents[2]


def test_service_does_not_import_torch() -> None:
    code = "import sys, checkpoint_store.service, checkpoint_store.blobstore; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


# ---------------------------------------------------------------------------- real processes

NORMAL = LinkSpec(LinkProfile(5, 0, 0), LinkProfile(5, 0, 0))


class _SiteLog(EventLog):
    """EventLog that tolerates a field named `event`.

    Guards against a bug seen in wan/node.py (_on_monitor, as committed in 4a229a5): it called
    `log.emit("handshake_failed", ..., event=name, ...)`, which collides with emit's own `event`
    parameter, raises TypeError and kills the node's I/O thread. A dealer hits that path whenever
    the server behind its proxy is down (here: while the store restarts). Harmless once fixed.
    """

    def emit(self, name: str, /, **fields: object) -> None:  # type: ignore[override]
        if "event" in fields:
            fields["zmq_event"] = fields.pop("event")
        super().emit(name, **fields)


@dataclass
class Cluster:
    run: Path
    topo: Topology
    tox: ToxiproxyClient
    node: WanNode
    inbox: object
    log: EventLog
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def store_log(self) -> Path:
        return self.run / "logs" / "store.jsonl"

    def events(self, name: str, pid: int | None = None) -> list[dict]:
        if not self.store_log.exists():
            return []
        return [e for e in read_events(self.store_log) if e["event"] == name and (pid is None or e["pid"] == pid)]

    def wait_event(self, name: str, pid: int, timeout_s: float) -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            evs = self.events(name, pid)
            if evs:
                return evs[-1]
            proc = self.procs[-1]
            if proc.poll() is not None:
                raise AssertionError(f"store exited with {proc.returncode} before logging {name}")
            time.sleep(0.02)
        raise AssertionError(f"store pid {pid} did not log {name} within {timeout_s} s")

    def start_store(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "checkpoint_store.service", "--run-dir", str(self.run)],
                                cwd=ROOT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        self.wait_event("store_started", proc.pid, 30)
        return proc

    def client(self, chunk_bytes: int = 32 * 1024) -> StoreClient:
        return StoreClient(self.node, self.inbox, self.log, chunk_bytes)

    def announce(self, epoch: int) -> None:
        """What the coordinator does before any site hears of an epoch: journal it."""
        j = Journal(self.run / "coordinator" / "journal.jsonl")
        j.append({"type": "epoch", "epoch": epoch, "plan": {}, "reason": "test"})
        j.close()

    def request(self, kind: str, body: dict, req: str, timeout_s: float = 20) -> dict:
        """Send one raw request to the store and wait for the reply that echoes `req`."""
        self.node.send("store", kind, "checkpoint", body)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                msg = self.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg.body.get("req") == req:
                return {"kind": msg.kind, "epoch": msg.epoch, **msg.body}
        raise AssertionError(f"no reply to {kind} {req}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    cfg = load_config({"run_id": "t1", "cluster": {"sites": ["a"]}, "wan": {"retransmit_timeout_ms": 3000}})
    save_config(cfg, run / "config.json")
    generate_cluster_keys(run / "keys", ["a", "store"])
    srv = ToxiproxyServer(log_path=run / "logs" / "toxiproxy.log")
    srv.start()  # raises (test fails) when the binary is missing or does not start
    node: WanNode | None = None
    c: Cluster | None = None
    try:
        store_port = free_port()
        proxy = srv.client.create_proxy("a_to_store", "127.0.0.1:0", f"127.0.0.1:{store_port}")
        apply_link_spec(srv.client, "a_to_store", NORMAL)
        topo = Topology(sites=("a",), host="127.0.0.1", binds={"store": f"127.0.0.1:{store_port}"},
                        links={"a_to_store": Link("a_to_store", "a", "store", listen=proxy.listen,
                                                  upstream=f"127.0.0.1:{store_port}")},
                        toxiproxy_api=srv.api_address)
        topo.save(run / "topology.json")
        log = _SiteLog(run / "logs" / "a.jsonl", run_id="t1", process="a")
        node = WanNode(name="a", run_id="t1", wan=cfg.wan, log=log, routes=topo.routes_for("a"), members=["store"],
                       keys_dir=str(run / "keys"))
        inbox = node.inbox(*StoreClient.KINDS)
        node.start()
        c = Cluster(run, topo, srv.client, node, inbox, log)
        yield c
    finally:
        if c is not None:
            for p in c.procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
        if node is not None:
            node.close()
        srv.stop()


def _tensors_equal_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)), k


@pytest.mark.integration
def test_store_killed_mid_write_serves_previous_frontier(cluster: Cluster) -> None:
    store1 = cluster.start_store()
    client = cluster.client()
    g = torch.Generator().manual_seed(1)
    ckpt1 = {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.arange(32, dtype=torch.int64),
                  "h": torch.randn(16, generator=g).to(torch.bfloat16)},
        "opt": {"m": torch.randn(64, 32, generator=g)},
    }
    fields1 = {"run_id": "t1", "ckpt_id": "c1", "round": 1, "step": 8, "epoch": 0, "parent": None, "samples": 64}
    h1, m1 = client.save(ckpt1, fields1, timeout_s=20)
    durable = cluster.events("checkpoint_durable", store1.pid)
    assert [e["manifest_hash"] for e in durable] == [h1]

    # Throttle the site->store direction so checkpoint 2 (~4 MB) takes ~20 s to upload.
    apply_link_spec(cluster.tox, "a_to_store", LinkSpec(LinkProfile(5, 0, 200), LinkProfile(5, 0, 0)))
    ckpt2 = {"model": {"w": torch.randn(1024 * 1024, generator=g)}}
    outcome: list[object] = []

    def save2() -> None:
        try:
            outcome.append(client.save(ckpt2, dict(fields1, ckpt_id="c2", round=2, step=16, parent=h1), timeout_s=40))
        except BaseException as e:  # recorded for the main thread
            outcome.append(e)

    t = threading.Thread(target=save2, daemon=True)
    t.start()
    progress = cluster.wait_event("ckpt_chunk_received", store1.pid, 20)
    assert 0 < progress["offset"] < 4 * 1024 * 1024
    in_tmp = sorted(p.name for p in (cluster.run / "store" / "tmp").iterdir())
    assert any(n.startswith("upload-") for n in in_tmp), in_tmp
    store1.send_signal(signal.SIGKILL)
    assert store1.wait(timeout=10) == -signal.SIGKILL
    assert not outcome  # still uploading when the store died

    # The throttle stays on: Toxiproxy can hang removing a toxic from links whose upstream just died
    # (see wan/toxiproxy.py). Only site->store is throttled, and only a few chunks are in flight.
    store2 = cluster.start_store()
    started = cluster.events("store_started", store2.pid)[-1]
    assert set(started["removed"]) >= {f"tmp/{n}" for n in in_tmp if n.startswith("upload-")}
    assert started["frontier"] == h1

    # The interrupted save fails (the restarted store does not know its upload) rather than hanging.
    t.join(timeout=30)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome

    fresh = cluster.client()
    fr = fresh.frontier(timeout_s=20)
    assert fr is not None
    assert fr[0] == h1 and fr[1] == m1
    _tensors_equal_bits(fresh.load(fr[1], timeout_s=20)["model"], ckpt1["model"])
    _tensors_equal_bits(fresh.load(fr[1], timeout_s=20)["opt"], ckpt1["opt"])
    assert (cluster.run / "store" / "FRONTIER").read_text().strip() == h1
    assert not any(e["ckpt_id"] == "c2" for e in cluster.events("checkpoint_durable"))

    store2.send_signal(signal.SIGTERM)
    assert store2.wait(timeout=10) == 0
    assert cluster.events("store_stopped", store2.pid)


@pytest.mark.integration
def test_save_and_load_in_ranges_over_the_wan(cluster: Cluster) -> None:
    store = cluster.start_store()
    client = cluster.client(chunk_bytes=16 * 1024)
    assert client.frontier(timeout_s=20) is None
    g = torch.Generator().manual_seed(2)
    w = torch.randn(50_000, generator=g)
    ckpt = {"model": {"w": w, "h": w[:1000].to(torch.float16)}, "same": {"w": w, "h": w[:1000].to(torch.float16)}}
    fields = {"run_id": "t1", "ckpt_id": 7, "round": 3, "step": 24, "epoch": 0, "parent": None, "samples": 99,
              "config": {"train": {"inner_lr": 0.003}}}
    h, m = client.save(ckpt, fields, timeout_s=20)
    assert m["blobs"]["model"] == m["blobs"]["same"]  # identical content, stored (and sent) once
    assert client.frontier(timeout_s=20) == (h, m)
    back = client.load(m, timeout_s=20)
    _tensors_equal_bits(back["model"], ckpt["model"])
    _tensors_equal_bits(back["same"], ckpt["same"])
    size = (cluster.run / "store" / "blobs" / m["blobs"]["model"]).stat().st_size
    assert size > 10 * 16 * 1024  # the blob really crossed in many chunks and many ranges
    ev = cluster.events("checkpoint_durable", store.pid)[-1]
    assert ev["manifest_hash"] == h and ev["bytes"] == size and ev["round"] == 3 and ev["parent"] is None
    # A request the store cannot serve gets a ckpt_error, and the service keeps running.
    with pytest.raises(StoreError, match="no blob"):
        client.fetch_blob("0" * 64, time.monotonic() + 20)
    assert client.frontier(timeout_s=20) == (h, m)


@pytest.mark.integration
def test_stale_epoch_manifest_is_refused_and_frontier_unchanged(cluster: Cluster) -> None:
    store = cluster.start_store()
    node = cluster.node
    cluster.announce(5)
    node.set_fence(5)
    client = cluster.client()
    fields = {"run_id": "t1", "ckpt_id": "c1", "round": 1, "step": 8, "epoch": 5, "parent": None, "samples": 64}
    ckpt = {"model": {"w": torch.randn(256)}}
    h1, m1 = client.save(ckpt, fields, timeout_s=20)

    def stale_manifest(req: str) -> dict:
        # A site still in epoch 3 writes a manifest reusing the stored blob.
        node.set_fence(3)
        m = dict(m1, ckpt_id="c2", round=2, step=16, epoch=3, parent=h1, created_wall_ns=time.time_ns())
        node.send("store", "ckpt_manifest", "checkpoint", {"req": req, "manifest": m})
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                msg = cluster.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg.body.get("req") == req:
                return {"kind": msg.kind, "epoch": msg.epoch, **msg.body}
        raise AssertionError("no reply to the stale manifest")

    reply = stale_manifest("stale-1")
    assert reply["kind"] == "ckpt_error" and reply["reason"].startswith("stale_epoch:"), reply
    assert reply["epoch"] == 3  # the reply echoes the request's epoch
    rejected = cluster.events("write_rejected", store.pid)
    assert rejected and rejected[-1]["msg_epoch"] == 3 and rejected[-1]["fence_epoch"] == 5
    # A stale writer's chunks are refused too, so save() fails.
    with pytest.raises(StoreError, match="stale_epoch"):
        client.save({"model": {"w": torch.randn(64)}}, dict(fields, ckpt_id="c3", epoch=3, parent=h1), timeout_s=20)

    node.set_fence(5)
    assert client.frontier(timeout_s=20) == (h1, m1)

    # The fence survives a restart of the store.
    store.send_signal(signal.SIGTERM)
    assert store.wait(timeout=10) == 0
    store2 = cluster.start_store()
    assert cluster.events("store_started", store2.pid)[-1]["fence_epoch"] == 5
    reply = stale_manifest("stale-2")
    assert reply["kind"] == "ckpt_error" and reply["reason"].startswith("stale_epoch:"), reply
    node.set_fence(5)
    assert client.frontier(timeout_s=20) == (h1, m1)
    assert json.loads((cluster.run / "store" / "manifests" / f"{h1}.json").read_text()) == m1


@pytest.mark.integration
def test_future_epoch_write_is_refused_and_never_raises_the_fence(cluster: Cluster) -> None:
    """An insider sends writes in epoch 10**9: refused with a logged reason; later writes still work."""
    store = cluster.start_store()
    node, client = cluster.node, cluster.client()
    cluster.announce(1)
    node.set_fence(10**9)
    fields = {"run_id": "t1", "ckpt_id": "f1", "round": 1, "step": 8, "epoch": 10**9, "parent": None, "samples": 64}
    with pytest.raises(StoreError, match="future_epoch"):
        client.save({"model": {"w": torch.randn(256)}}, fields, timeout_s=20)
    reply = cluster.request("ckpt_manifest", {"req": "future-m", "manifest": {"run_id": "t1"}}, "future-m")
    assert reply["kind"] == "ckpt_error" and reply["reason"].startswith("future_epoch: request epoch 1000000000 "
                                                                        "was never announced"), reply
    rejected = [e for e in cluster.events("write_rejected", store.pid) if e["reason"].startswith("future_epoch")]
    assert rejected and all(e["fence_epoch"] == 0 for e in rejected)
    assert not cluster.events("store_fence_raised", store.pid)
    assert not (cluster.run / "store" / "FENCE_EPOCH").exists()
    # The real writer of the announced epoch is not locked out.
    node.set_fence(1)
    h, _m = client.save({"model": {"w": torch.randn(256)}}, dict(fields, epoch=1), timeout_s=20)
    assert client.frontier(timeout_s=20)[0] == h
    # An epoch announced later is admitted as soon as the coordinator journaled it.
    cluster.announce(2)
    node.set_fence(2)
    h2, _ = client.save({"model": {"w": torch.randn(256)}}, dict(fields, ckpt_id="f2", epoch=2, parent=h), timeout_s=20)
    assert (cluster.run / "store" / "FENCE_EPOCH").read_text().strip() == "2"
    assert client.frontier(timeout_s=20)[0] == h2


BAD_REQUESTS = [
    ("ckpt_chunk", {"req": "b1", "upload": "u1", "offset": "x", "sha256": "0" * 64}, "field 'offset' must be an integer"),
    ("ckpt_chunk", {"req": "b2", "upload": "u2", "sha256": "0" * 64}, "missing field 'offset'"),
    ("ckpt_chunk", {"req": "b3", "upload": "../etc", "offset": 0}, "field 'upload'"),
    ("ckpt_finish", {"req": "b4", "upload": "u4", "sha256": "XYZ"}, "field 'sha256'"),
    ("ckpt_manifest", {"req": "b5", "manifest": [1, 2]}, "field 'manifest' must be a map"),
    ("ckpt_manifest", {"req": "b6", "manifest": {"run_id": "t1", "ckpt_id": "x", "round": float("nan"), "step": 0,
                                                 "epoch": 0, "parent": None, "samples": 1, "blobs": {},
                                                 "created_wall_ns": 1}}, "field 'round' must be a non-negative"),
    ("ckpt_blob_get", {"req": "b7", "sha256": "0" * 64, "offset": -1}, "field 'offset' = -1 is outside"),
    ("ckpt_blob_get", {"req": "b8", "sha256": "0" * 64, "length": 2 ** 63}, "field 'length'"),
    ("ckpt_blob_get", {"req": "b9", "sha256": ["0"], "event": "x"}, "field 'sha256' must be a string"),
]


@pytest.mark.integration
def test_malformed_requests_are_answered_with_a_precise_reason_and_the_store_serves_on(cluster: Cluster) -> None:
    store = cluster.start_store()
    for kind, body, want in BAD_REQUESTS:
        reply = cluster.request(kind, body, body["req"])
        assert reply["kind"] == "ckpt_error" and want in reply["reason"], (kind, body, reply)
        assert reply["reason"].startswith(("bad_request:", "store_error:")), reply
    failed = cluster.events("ckpt_request_failed", store.pid)
    assert {e["req"] for e in failed} >= {b["req"] for _k, b, _w in BAD_REQUESTS}
    assert store.poll() is None
    client = cluster.client()
    fields = {"run_id": "t1", "ckpt_id": "ok", "round": 1, "step": 8, "epoch": 0, "parent": None, "samples": 64}
    h, _m = client.save({"model": {"w": torch.randn(256)}}, fields, timeout_s=20)
    assert client.frontier(timeout_s=20)[0] == h


@pytest.mark.integration
def test_restore_reads_the_planned_checkpoint_after_a_newer_one_became_the_frontier(cluster: Cluster) -> None:
    """A restore names its checkpoint by hash: a background upload that makes a newer checkpoint the
    frontier between the plan and the restore must not make the planned one unreadable."""
    store = cluster.start_store()
    client = cluster.client()
    base = {"run_id": "t1", "step": 8, "epoch": 0, "samples": 64}
    old_w, new_w = torch.arange(512, dtype=torch.float32), -torch.arange(512, dtype=torch.float32)
    h1, m1 = client.save({"model": {"w": old_w}}, {**base, "ckpt_id": "r1", "round": 1, "parent": None}, timeout_s=20)
    h2, m2 = client.save({"model": {"w": new_w}}, {**base, "ckpt_id": "r2", "round": 2, "parent": h1}, timeout_s=20)
    assert client.frontier(timeout_s=20) == (h2, m2)
    assert client.checkpoint(h1, timeout_s=20) == m1  # the older one, by hash
    _tensors_equal_bits(client.load(m1, timeout_s=20)["model"], {"w": old_w})
    # A checkpoint the store never held: a precise refusal, and the store serves on.
    with pytest.raises(StoreError, match="corrupt_checkpoint: .*missing"):
        client.checkpoint("ab" * 32, timeout_s=20)
    reply = cluster.request("ckpt_frontier_get", {"req": "bad-hash", "manifest_hash": "not-a-hash"}, "bad-hash")
    assert reply["kind"] == "ckpt_error" and "manifest_hash" in reply["reason"], reply
    assert store.poll() is None and client.frontier(timeout_s=20) == (h2, m2)


@pytest.mark.integration
def test_a_read_cut_by_a_store_restart_fails_at_once_instead_of_waiting_out_its_deadline(cluster: Cluster) -> None:
    """Soak seed 1015 (stall): the store was killed after it had acknowledged a request and before its
    reply got through; the restarted store never heard of the request, and the site waited out the
    whole 120 s deadline (and the epoch change waiting for it). Acks carry the acker's incarnation:
    once the client hears from a new store process, a request the old one had taken fails at once;
    one it had not taken is resent to the new one."""
    store1 = cluster.start_store()
    client = cluster.client()
    g = torch.Generator().manual_seed(3)
    blob = {"w": torch.randn(256 * 1024, generator=g)}  # 1 MiB
    fields = {"run_id": "t1", "ckpt_id": "r1", "round": 1, "step": 8, "epoch": 0, "parent": None, "samples": 64}
    _h, manifest = client.save({"model": blob}, fields, timeout_s=20)
    # Replies (store -> site) at 50 KB/s: the read takes ~20 s, so it is in flight when the store dies.
    apply_link_spec(cluster.tox, "a_to_store", LinkSpec(LinkProfile(5, 0, 0), LinkProfile(5, 0, 50)))
    outcome: list[object] = []

    def load() -> None:
        t0 = time.monotonic()
        try:
            outcome.append(client.load(manifest, timeout_s=60))
        except BaseException as e:  # recorded for the main thread
            outcome.append(e)
        outcome.append(time.monotonic() - t0)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    time.sleep(1.5)
    assert not outcome  # still reading
    store1.send_signal(signal.SIGKILL)
    assert store1.wait(timeout=10) == -signal.SIGKILL
    # The replies the dead store had written are still queued in the throttled proxy: drop them with
    # its connections, so requests it had acknowledged are never answered (what a kill at any other
    # moment between the ack and the reply does).
    cluster.tox.set_enabled("a_to_store", False)
    cluster.tox.set_enabled("a_to_store", True)
    store2 = cluster.start_store()
    t.join(timeout=70)
    assert not t.is_alive()
    err, took_s = outcome
    assert isinstance(err, StoreError), err
    assert "the store restarted" in str(err) and "lost with it" in str(err), err  # not "timed out"
    assert took_s < 60, took_s
    # The new store serves: a fresh request from the same client is answered.
    assert client.frontier(timeout_s=30)[0] == _h
    assert store2.poll() is None


def _vm_hwm_mib(pid: int) -> float:
    """A live process's peak resident set size (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_a_member_that_reads_and_never_acks_is_held_to_its_read_window_and_others_still_read(cluster: Cluster) -> None:
    """Issue 54's read flood with acks withheld: member b holds a real cluster key, connects through its
    own Toxiproxy link, asks for the largest part of a 16 MiB blob 150 times (1.2 GiB asked), takes
    every reply off its socket and acks none. The store serves b up to its read window (32 MiB unacked),
    drops the rest unanswered with the reason, stays under 250 MiB at its peak, and a still reads the
    whole checkpoint. Real store process, real CURVE, real toxiproxy-server."""
    import zmq

    from checkpoint_store.service import READ_WINDOW_BYTES
    from wan.frames import decode, encode
    from wan.keys import load_keypair, load_public

    run, srv = cluster.run, cluster.tox
    generate_cluster_keys(run / "keys", ["b"])
    store_bind = cluster.topo.binds["store"]
    proxy = srv.create_proxy("b_to_store", "127.0.0.1:0", store_bind)
    apply_link_spec(srv, "b_to_store", NORMAL)
    links = {**cluster.topo.links, "b_to_store": Link("b_to_store", "b", "store", listen=proxy.listen,
                                                      upstream=store_bind)}
    Topology(sites=("a", "b"), host="127.0.0.1", binds=cluster.topo.binds, links=links,
             toxiproxy_api=cluster.topo.toxiproxy_api).save(run / "topology.json")
    store = cluster.start_store()
    client = cluster.client(chunk_bytes=1024 * 1024)
    w = torch.randn(4 * 1024 * 1024, generator=torch.Generator().manual_seed(5))  # 16 MiB of float32
    fields = {"run_id": "t1", "ckpt_id": 1, "round": 0, "step": 0, "epoch": 0, "parent": None, "samples": 0,
              "config": {}}
    h, m = client.save({"model": {"w": w}}, fields, timeout_s=60)
    sha = m["blobs"]["model"]
    size = (run / "store" / "blobs" / sha).stat().st_size
    assert size > 16 * 1024 * 1024

    ctx = zmq.Context()
    replies: list[int] = []
    stop = threading.Event()
    t: threading.Thread | None = None
    try:
        b = ctx.socket(zmq.DEALER)
        b.setsockopt(zmq.LINGER, 0)
        b.setsockopt(zmq.SNDTIMEO, 10_000)
        b.setsockopt(zmq.ROUTING_ID, b"b#00000000000000b1")
        kp = load_keypair(run / "keys", "b")
        b.curve_publickey, b.curve_secretkey = kp.public, kp.secret
        b.curve_serverkey = load_public(run / "keys", "store")
        b.connect(f"tcp://{proxy.listen}")
        asks = 150
        for i in range(asks):
            b.send_multipart(encode(kind="ckpt_blob_get", cls="checkpoint", run="t1", epoch=0, step=0, src="b",
                                    inc=77, seq=i + 1, body={"req": f"flood-{i}", "sha256": sha, "offset": 0,
                                                             "length": 8 * 1024 * 1024}))

        def drain() -> None:  # every reply taken off the socket, none acked
            while not stop.is_set():
                if b.poll(100):
                    msg = decode(b.recv_multipart(), max_frame_bytes=16 * 1024 * 1024, max_header_bytes=65536)
                    if msg.kind == "ckpt_blob_part":
                        replies.append(msg.wire_bytes)
        t = threading.Thread(target=drain, daemon=True)
        t.start()
        end = time.monotonic() + 60
        while time.monotonic() < end and not cluster.events("ckpt_request_failed", store.pid):
            time.sleep(0.1)
        time.sleep(2.0)  # what the store would still send b arrives by now
        # The honest member reads the whole checkpoint meanwhile: b's window is b's alone.
        back = client.load(m, timeout_s=60)
        assert torch.equal(back["model"]["w"], w)
        peak = _vm_hwm_mib(store.pid)
    finally:
        stop.set()
        if t is not None:
            t.join(timeout=5)  # the drain thread polls b: done before the context closes it
        ctx.destroy(linger=0)
    dropped = [e for e in cluster.events("ckpt_request_failed", store.pid) if e["src"] == "b"]
    assert dropped and dropped[0]["reason"].startswith("read_window: "), dropped
    assert "not acked yet (window 33,554,432 B); request 1 over it dropped unanswered" in dropped[0]["reason"]
    served = len(replies)
    assert 1 <= served <= READ_WINDOW_BYTES // (8 * 1024 * 1024) + 1, served  # the window, not 150 replies
    assert sum(replies) <= READ_WINDOW_BYTES + 8 * 1024 * 1024 + 65536
    assert peak < 250, f"the store peaked at {peak:.0f} MiB under the flood"
    assert store.poll() is None, "the store exited under the flood"
