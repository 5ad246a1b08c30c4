"""The typed client of one Toxiproxy server's JSON control API (proxies, toxics, metrics).

Standard library only (urllib), a timeout on every call, never an HTTP proxy from the environment;
every failure is a `ToxiproxyError` with the method, path, HTTP status and the server's error text.
The Toxiproxy behaviour it relies on is listed in wan/toxiproxy.py's docstring.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal

Stream = Literal["upstream", "downstream"]


class ToxiproxyError(RuntimeError):
    """A Toxiproxy call failed, or the server could not be started.

    For HTTP failures `method`, `path`, `status` (None when no HTTP answer came back, e.g.
    connection refused or timed out) and `server_error` (the server's "error" text) are set.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int | None = None,
        server_error: str | None = None,
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.status = status
        self.server_error = server_error


@dataclass(frozen=True)
class Proxy:
    name: str
    listen: str  # the real "host:port" the proxy listens on
    upstream: str  # "host:port" it forwards to
    enabled: bool

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Proxy:
        return cls(name=d["name"], listen=d["listen"], upstream=d["upstream"], enabled=bool(d["enabled"]))


# No HTTP proxy from the environment (http_proxy etc.) may sit between us and a loopback server.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ToxiproxyClient:
    """Typed client for one Toxiproxy server's control API. Every call times out after `timeout_s`
    (per connect / per socket read) and raises `ToxiproxyError` on any failure."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474, timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = int(port)
        self.timeout_s = float(timeout_s)

    def __repr__(self) -> str:
        return f"ToxiproxyClient({self.base_url!r}, timeout_s={self.timeout_s})"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # ---- transport -------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> bytes:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        where = f"{method} {self.base_url}{path}"
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            try:
                raw = e.read().decode(errors="replace")
            except Exception:  # the error body itself could not be read
                raw = ""
            finally:
                e.close()
            try:
                server_error = str(json.loads(raw).get("error", raw))
            except (ValueError, AttributeError):
                server_error = raw.strip()
            raise ToxiproxyError(
                f"toxiproxy: {where} -> HTTP {e.code}: {server_error or e.reason}",
                method=method,
                path=path,
                status=e.code,
                server_error=server_error,
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, (TimeoutError, socket.timeout)):
                msg = f"timed out after {timeout:g} s"
            else:
                msg = f"{type(reason).__name__}: {reason}"
            raise ToxiproxyError(
                f"toxiproxy: {where} -> no answer ({msg}); is toxiproxy-server running there?",
                method=method,
                path=path,
            ) from e

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        raw = self._call(method, path, body)
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ToxiproxyError(
                f"toxiproxy: {method} {self.base_url}{path} -> reply is not JSON: {raw[:200]!r}",
                method=method,
                path=path,
            ) from e

    @staticmethod
    def _p(name: str) -> str:
        return urllib.parse.quote(name, safe="")

    # ---- server ----------------------------------------------------------------------------

    def version(self) -> str:
        """The server's version string (a `go install` build reports "git")."""
        raw = self._call("GET", "/version").decode(errors="replace").strip()
        try:
            v = json.loads(raw)
        except ValueError:
            return raw
        return str(v.get("version", raw)) if isinstance(v, dict) else str(v)

    def wait_ready(self, deadline_s: float) -> None:
        """Poll /version for up to `deadline_s` seconds (a duration) until the server answers."""
        end = time.monotonic() + deadline_s
        last: ToxiproxyError | None = None
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                self._call("GET", "/version", timeout_s=max(0.05, min(self.timeout_s, left)))
                return
            except ToxiproxyError as e:
                last = e
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        raise ToxiproxyError(
            f"toxiproxy at {self.base_url} not ready after {deadline_s:g} s (last error: {last})",
            method="GET",
            path="/version",
        )

    def reset(self) -> None:
        """Remove every toxic and re-enable every proxy (proxies are kept)."""
        self._call("POST", "/reset")

    def metrics_text(self) -> str:
        """The Prometheus text of GET /metrics (needs the server started with -proxy-metrics)."""
        return self._call("GET", "/metrics").decode(errors="replace")

    def proxy_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes that entered each proxy: {proxy: {"upstream": n, "downstream": n}}.

        "upstream" counts client->server bytes, "downstream" server->client bytes; series of the
        same proxy with different listeners (a re-created proxy) are summed. Proxies that have
        not finished a connection yet are absent.

        CAVEAT: Toxiproxy adds a connection's bytes to the counter only when that direction of
        the connection ENDS (its io.Copy returns: EOF, reset, proxy disabled). Bytes of
        connections still open are not counted at all, so this is a per-closed-connection
        total, not a live gauge of a long-lived connection.
        """
        # We count `received` rather than `sent`: received is what entered the proxy from the
        # sender, i.e. what the application put on the wire. Toxics can make the two differ
        # (limit_data drops the rest, a timeout/blackhole toxic holds bytes back, a disabled
        # proxy discards what is in flight), and the emulator's accounting is about offered load.
        out: dict[str, dict[str, int]] = {}
        for name, labels, value in _parse_metrics(self.metrics_text()):
            if name != "toxiproxy_proxy_received_bytes_total":
                continue
            proxy, direction = labels.get("proxy"), labels.get("direction")
            if proxy is None or direction not in ("upstream", "downstream"):
                continue
            d = out.setdefault(proxy, {"upstream": 0, "downstream": 0})
            d[direction] += value
        return out

    # ---- proxies ---------------------------------------------------------------------------

    def create_proxy(self, name: str, listen: str, upstream: str, enabled: bool = True) -> Proxy:
        """Create a proxy; listen "127.0.0.1:0" picks a free port (see the returned `listen`)."""
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        return Proxy.from_json(self._json("POST", "/proxies", body))

    def get_proxy(self, name: str) -> Proxy:
        return Proxy.from_json(self._json("GET", f"/proxies/{self._p(name)}"))

    def list_proxies(self) -> dict[str, Proxy]:
        data = self._json("GET", "/proxies") or {}
        return {k: Proxy.from_json(v) for k, v in data.items()}

    def set_enabled(self, name: str, enabled: bool) -> Proxy:
        """Disabling closes the proxy's listener and every open connection through it;
        enabling listens again on the same address."""
        return Proxy.from_json(self._json("PATCH", f"/proxies/{self._p(name)}", {"enabled": bool(enabled)}))

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{self._p(name)}")

    # ---- toxics ----------------------------------------------------------------------------

    def add_toxic(
        self,
        proxy: str,
        name: str,
        type: str,
        stream: Stream,
        attributes: dict[str, Any],
        toxicity: float = 1.0,
    ) -> dict[str, Any]:
        """Add a toxic; returns the server's view of it. Fails with HTTP 409 if the name exists."""
        if stream not in ("upstream", "downstream"):
            raise ValueError(f"toxic {name!r}: stream must be 'upstream' or 'downstream', got {stream!r}")
        _check_attributes(name, attributes)
        body = {"name": name, "type": type, "stream": stream, "toxicity": float(toxicity), "attributes": attributes}
        return self._json("POST", f"/proxies/{self._p(proxy)}/toxics", body)

    def update_toxic(self, proxy: str, name: str, attributes: dict[str, Any]) -> dict[str, Any]:
        """Change attributes of an existing toxic in place (given keys replace, others are kept)."""
        _check_attributes(name, attributes)
        return self._json("PATCH", f"/proxies/{self._p(proxy)}/toxics/{self._p(name)}", {"attributes": attributes})

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{self._p(proxy)}/toxics/{self._p(name)}")

    def list_toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._json("GET", f"/proxies/{self._p(proxy)}/toxics") or [])


def _check_attributes(toxic: str, attributes: dict[str, Any]) -> None:
    # Only the bandwidth toxic has "rate"; rate 0 stalls a connection forever instead of unshaping it.
    if "rate" in attributes and not attributes["rate"] > 0:
        raise ValueError(f"toxic {toxic!r}: bandwidth rate must be > 0 KB/s (remove the toxic to unshape)")


_METRIC_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _parse_metrics(text: str) -> list[tuple[str, dict[str, str], int]]:
    """(name, labels, integer value) of each sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL_RE.findall(m.group(2) or "")
        }
        try:
            # Go prints large counters in exponent form ("1e+06"); exact below 2**53.
            value = int(float(m.group(3)))
        except (ValueError, OverflowError):
            continue
        out.append((m.group(1), labels, value))
    return out
