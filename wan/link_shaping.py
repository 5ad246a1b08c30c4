"""Link shaping: make a proxy's latency/jitter/bandwidth toxics match a `LinkSpec`, idempotently.

Each direction of a WAN link has at most two shaping toxics, `shape_latency_<d>` and
`shape_bandwidth_<d>` (d = "up" for stream "upstream", "down" for "downstream"); fault toxics
are never touched here.
"""

from __future__ import annotations

from wan.toxiproxy_client import Stream, ToxiproxyClient
from ground.config import LinkProfile, LinkSpec


_DIRECTIONS: tuple[tuple[str, Stream], ...] = (("up", "upstream"), ("down", "downstream"))
SHAPING_TOXICS = tuple(f"shape_{kind}_{d}" for d, _ in _DIRECTIONS for kind in ("latency", "bandwidth"))


def _wanted(profile: LinkProfile) -> list[tuple[str, str, dict[str, int]]]:
    for f in ("latency_ms", "jitter_ms", "bandwidth_kbps"):
        v = getattr(profile, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"LinkProfile.{f} must be a non-negative integer, got {v!r}")
    out = []
    if profile.latency_ms > 0 or profile.jitter_ms > 0:
        out.append(("latency", "latency", {"latency": profile.latency_ms, "jitter": profile.jitter_ms}))
    if profile.bandwidth_kbps > 0:
        out.append(("bandwidth", "bandwidth", {"rate": profile.bandwidth_kbps}))
    return out


def apply_link_spec(client: ToxiproxyClient, proxy_name: str, spec: LinkSpec) -> list[str]:
    """Idempotently make the proxy's shaping toxics match `spec`.

    Per direction ("up" -> stream "upstream", "down" -> "downstream") it keeps
    `shape_latency_<d>` (latency + jitter, only if either is > 0) and `shape_bandwidth_<d>`
    (only if bandwidth_kbps > 0): adds missing ones, updates changed attributes in place, and
    removes shaping toxics the spec no longer asks for. Other toxics (faults) are left alone.
    Returns the names of the shaping toxics now present, in a fixed order.
    """
    existing = {t["name"]: t for t in client.list_toxics(proxy_name)}
    present: list[str] = []
    for d, stream in _DIRECTIONS:
        wanted = {f"shape_{kind}_{d}": (typ, attrs) for kind, typ, attrs in _wanted(getattr(spec, d))}
        for kind in ("latency", "bandwidth"):
            name = f"shape_{kind}_{d}"
            cur = existing.get(name)
            if name not in wanted:
                if cur is not None:
                    client.remove_toxic(proxy_name, name)
                continue
            typ, attrs = wanted[name]
            if cur is not None and (cur.get("type") != typ or cur.get("stream") != stream or cur.get("toxicity") != 1):
                client.remove_toxic(proxy_name, name)
                cur = None
            if cur is None:
                client.add_toxic(proxy_name, name, typ, stream, attrs)
            elif any(cur.get("attributes", {}).get(k) != v for k, v in attrs.items()):
                client.update_toxic(proxy_name, name, attrs)
            present.append(name)
    return present
