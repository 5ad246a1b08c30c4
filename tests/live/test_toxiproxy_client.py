"""wan.toxiproxy against the REAL toxiproxy-server binary and real loopback TCP sockets.

These tests fail (they never skip) when the binary is missing or does not start: without it the
emulator cannot shape a single link. Install it with `make setup`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wan.toxiproxy import (
    Proxy,
    ToxiproxyClient,
    ToxiproxyError,
    ToxiproxyServer,
    apply_link_spec,
    find_toxiproxy_binary,
    free_port,
)
from ground.config import LinkProfile, LinkSpec

pytestmark = pytest.mark.integration

BANNER = b"HELLO\n"  # the echo server greets first, so the two directions carry different counts


class EchoServer:
    """Threaded TCP server: sends BANNER on accept, then echoes everything back."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(BANNER)
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self._closing = True
        self.sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyServer]:
    log = tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log"
    srv = ToxiproxyServer(log_path=log)
    srv.start(timeout_s=10)  # raises ToxiproxyError (a test error, not a skip) if it cannot start
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    e = EchoServer()
    yield e
    e.close()


@pytest.fixture
def client(server: ToxiproxyServer) -> ToxiproxyClient:
    assert server.client is not None
    return server.client


@pytest.fixture
def proxy(client: ToxiproxyClient, echo: EchoServer, request: pytest.FixtureRequest) -> Iterator[Proxy]:
    name = f"t_{request.node.name}"
    p = client.create_proxy(name, "127.0.0.1:0", f"127.0.0.1:{echo.port}")
    yield p
    client.delete_proxy(name)


def connect(p: Proxy, timeout_s: float = 5.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", p.listen_port), timeout=timeout_s)
    assert recv_exact(s, len(BANNER)) == BANNER
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def round_trip_s(s: socket.socket, payload: bytes = b"x") -> float:
    t0 = time.monotonic()
    s.sendall(payload)
    assert recv_exact(s, len(payload)) == payload
    return time.monotonic() - t0


def test_server_starts_and_answers(server: ToxiproxyServer, client: ToxiproxyClient) -> None:
    assert client.version()
    client.wait_ready(1.0)
    assert server.proc is not None and server.proc.poll() is None


def test_bytes_pass_and_are_counted_exactly(client: ToxiproxyClient, proxy: Proxy) -> None:
    assert proxy.listen_port > 0 and proxy.enabled
    assert client.get_proxy(proxy.name) == proxy
    assert proxy.name in client.list_proxies()

    payload = bytes(range(256)) * 50  # 12_800 bytes
    s = connect(proxy)
    s.sendall(payload)
    assert recv_exact(s, len(payload)) == payload
    # Toxiproxy adds a connection's bytes to its counters only when the connection ends.
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b""
    s.close()
    want = {"upstream": len(payload), "downstream": len(payload) + len(BANNER)}
    deadline = time.monotonic() + 3
    while (got := client.proxy_bytes().get(proxy.name)) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == want
    assert "toxiproxy_proxy_received_bytes_total" in client.metrics_text()


def test_latency_applied_updated_and_removed(client: ToxiproxyClient, proxy: Proxy) -> None:
    s = connect(proxy)
    assert round_trip_s(s) < 0.1

    client.add_toxic(proxy.name, "fault_other", "latency", "downstream", {"latency": 0})
    spec = LinkSpec(up=LinkProfile(latency_ms=100))
    assert apply_link_spec(client, proxy.name, spec) == ["shape_latency_up"]
    assert apply_link_spec(client, proxy.name, spec) == ["shape_latency_up"]  # idempotent
    toxics = {t["name"]: t for t in client.list_toxics(proxy.name)}
    assert toxics["shape_latency_up"]["stream"] == "upstream"
    assert toxics["shape_latency_up"]["attributes"] == {"latency": 100, "jitter": 0}
    rtt = round_trip_s(s)
    assert 0.1 <= rtt < 1.0, rtt

    # Changed attributes are updated in place, on the open connection.
    apply_link_spec(client, proxy.name, LinkSpec(up=LinkProfile(latency_ms=200, jitter_ms=1)))
    rtt = round_trip_s(s)
    assert 0.19 <= rtt < 1.0, rtt

    client.remove_toxic(proxy.name, "fault_other")
    assert apply_link_spec(client, proxy.name, LinkSpec()) == []
    assert client.list_toxics(proxy.name) == []
    assert round_trip_s(s) < 0.1
    s.close()


def test_bandwidth_limits_throughput(client: ToxiproxyClient, proxy: Proxy) -> None:
    names = apply_link_spec(client, proxy.name, LinkSpec(up=LinkProfile(bandwidth_kbps=100)))
    assert names == ["shape_bandwidth_up"]
    s = connect(proxy, timeout_s=10)
    payload = b"b" * 200_000
    t0 = time.monotonic()
    sender = threading.Thread(target=s.sendall, args=(payload,), daemon=True)
    sender.start()
    assert recv_exact(s, len(payload)) == payload
    elapsed = time.monotonic() - t0
    sender.join(5)
    s.close()
    assert 1.5 <= elapsed <= 4.0, elapsed
    with pytest.raises(ValueError, match="rate"):
        client.update_toxic(proxy.name, "shape_bandwidth_up", {"rate": 0})


def test_disable_closes_connections_and_enable_accepts_again(client: ToxiproxyClient, proxy: Proxy) -> None:
    s = connect(proxy)
    assert round_trip_s(s) < 0.5
    assert client.set_enabled(proxy.name, False).enabled is False
    assert client.get_proxy(proxy.name).enabled is False
    s.settimeout(2)
    try:
        closed = s.recv(1) == b""
    except (ConnectionError, OSError) as e:
        closed = not isinstance(e, TimeoutError)
    assert closed
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=1).close()

    p2 = client.set_enabled(proxy.name, True)
    assert p2.enabled and p2.listen == proxy.listen
    s = connect(proxy)
    assert round_trip_s(s) < 0.5
    s.close()


def test_timeout_zero_blackholes_but_keeps_connection_open(client: ToxiproxyClient, proxy: Proxy) -> None:
    s = connect(proxy)
    client.add_toxic(proxy.name, "blackhole_down", "timeout", "downstream", {"timeout": 0})
    s.sendall(b"ping")
    s.settimeout(1.0)
    with pytest.raises(TimeoutError):  # not b"" (closed) and not a reset: silently nothing
        s.recv(16)
    s.close()


def test_unknown_proxy_error_names_it_and_status(client: ToxiproxyClient) -> None:
    with pytest.raises(ToxiproxyError) as ei:
        client.get_proxy("no_such_proxy_xyz")
    msg = str(ei.value)
    assert "no_such_proxy_xyz" in msg and "404" in msg and "GET" in msg
    assert ei.value.status == 404 and ei.value.server_error == "proxy not found"


def test_duplicate_proxy_conflict(client: ToxiproxyClient, proxy: Proxy) -> None:
    with pytest.raises(ToxiproxyError) as ei:
        client.create_proxy(proxy.name, "127.0.0.1:0", proxy.upstream)
    assert ei.value.status == 409 and "already exists" in str(ei.value)


def test_closed_port_fails_fast() -> None:
    c = ToxiproxyClient(port=free_port(), timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ToxiproxyError) as ei:
        c.version()
    assert time.monotonic() - t0 < 2.0
    assert ei.value.status is None and "/version" in str(ei.value)
    t0 = time.monotonic()
    with pytest.raises(ToxiproxyError, match="not ready"):
        c.wait_ready(0.5)
    assert time.monotonic() - t0 < 2.0


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-toxiproxy-here")
    with pytest.raises(ToxiproxyError, match="no-toxiproxy-here"):
        ToxiproxyServer(binary=missing).start(timeout_s=2)


def test_find_binary_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "tp"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("XDC_TOXIPROXY", str(fake))
    assert find_toxiproxy_binary() == str(fake)
    monkeypatch.setenv("XDC_TOXIPROXY", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="make setup"):
        find_toxiproxy_binary()
    monkeypatch.delenv("XDC_TOXIPROXY")
    assert Path(find_toxiproxy_binary()).name == "toxiproxy-server"


def test_free_ports_are_chosen_below_the_kernels_ephemeral_range():
    """An outgoing connection can never take a port chosen there between the choice and the bind."""
    from wan.toxiproxy_server import _ephemeral_low

    low = _ephemeral_low()
    ports = [free_port() for _ in range(20)]
    if low > 11_000:
        assert all(max(10_000, low - 20_000) <= p < low for p in ports), (low, ports)
    assert len(set(ports)) > 1, "the choice is not random"
