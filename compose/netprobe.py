"""Run inside a container of the compose cluster: what can this process reach directly?

`make compose-smoke` runs it in `site-a` (docker compose exec) while the cluster trains and keeps
its JSON in RUN/netprobe.json. It tries, with short timeouts:
  - every other process by its service name (DNS of the container's own networks),
  - every other process by the IP address its container has on its own network (given by the
    host, which reads them with docker inspect), port 7000 where it listens,
  - addresses beyond the project (`--outside`, e.g. the host's DNS server), which an `internal`
    network must not let any packet reach,
  - Toxiproxy by name, on the proxy port of one of this site's links (the one way out that must work),
  - Toxiproxy's API (`--api`, by its name on this network and by its alias on the control network),
    which must not answer here: it listens on the control network only,
and records the container's routing table for the record (Docker 20.10 gives a container on an
internal network a default route all the same; its packets beyond the subnet are dropped).

Usage: python compose/netprobe.py --via toxiproxy:20000 --name site-b --ip site-b=172.20.0.3 \
           --outside 10.0.0.53:53 ...
Prints {"names": {...}, "ips": {...}, "outside": {...}, "api": {...}, "via": {...}, "default_route": bool};
each attempt is {"ok": bool, "error": str | null}. Exit 0 whatever it found: the caller judges.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from functools import partial
from typing import Any, Callable


def _connect(host: str, port: int, timeout_s: float) -> dict:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return {"ok": True, "error": None}
    except OSError as e:  # gaierror, timeout, ENETUNREACH, ECONNREFUSED ...
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _resolve(name: str, timeout_s: float) -> dict:
    """Name -> address, bounded in time: getaddrinfo has no timeout of its own, and on an internal
    network an unknown name can wait on an upstream resolver the container cannot reach (the smoke's
    probe hung past 120 s that way), so the lookup runs in a daemon thread that is abandoned."""
    box: dict = {}

    def look() -> None:
        try:
            box["r"] = {"ok": True, "error": None, "address": socket.gethostbyname(name)}
        except OSError as e:
            box["r"] = {"ok": False, "error": f"{type(e).__name__}: {e}", "address": None}

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(timeout_s)
    return box.get("r") or {"ok": False, "error": f"timeout: no answer in {timeout_s} s", "address": None}


def _resolve_connect(name: str, port: int, timeout_s: float) -> dict:
    """Resolve (bounded), then connect to the address; an unresolved name is unreachable."""
    r = _resolve(name, timeout_s)
    if not r["ok"]:
        return {**r, "error": f"not resolved: {r['error']}"}
    return {**r, **_connect(r["address"], port, timeout_s)}


def run_all(tasks: dict[Any, Callable[[], dict]], deadline_s: float) -> dict[Any, dict]:
    """Run every task in its own daemon thread and wait for all of them until `deadline_s` from
    now; a task still running then is recorded as a timeout (and abandoned, like a lookup)."""
    box: dict[Any, dict] = {}

    def one(key: Any, fn: Callable[[], dict]) -> None:
        try:
            box[key] = fn()
        except Exception as e:  # a bug in an attempt is a finding, not a crashed probe
            box[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"}

    threads = [threading.Thread(target=one, args=(k, fn), daemon=True) for k, fn in tasks.items()]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return {k: box.get(k) or {"ok": False, "error": f"timeout: no answer in {deadline_s} s"} for k in tasks}


def has_default_route(route_table: str) -> bool:
    """True if /proc/net/route (its text) has a route to 0.0.0.0/0."""
    for line in route_table.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and cols[1] == "00000000" and cols[7] == "00000000":
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--via", required=True, help="host:port of a proxy this process must reach")
    ap.add_argument("--name", action="append", default=[], help="a service name that must not resolve")
    ap.add_argument("--ip", action="append", default=[], help="service=IP that must not be reachable")
    ap.add_argument("--outside", action="append", default=[], help="host:port beyond the project, must fail")
    ap.add_argument("--api", action="append", default=[], help="host:port of Toxiproxy's API, must fail")
    ap.add_argument("--port", type=int, default=7000)
    ap.add_argument("--timeout-s", type=float, default=3.0)
    args = ap.parse_args(argv)
    via_host, via_port = args.via.rsplit(":", 1)
    # Every attempt at once, each in its own daemon thread: one after the other they took up to
    # ~35 s (3 s per unanswered lookup or connect), and on a fast host the whole compose run ended
    # inside that, taking site-a (and the `docker exec` running this) down mid-probe.
    tasks: dict[tuple[str, str], Callable[[], dict]] = {}
    for n in args.name:
        tasks[("names", n)] = partial(_resolve_connect, n, args.port, args.timeout_s)
    tasks[("via", "")] = partial(_resolve_connect, via_host, int(via_port), args.timeout_s)
    ips: dict[str, str] = {}
    for item in args.ip:
        svc, ip = item.split("=", 1)
        ips[svc] = ip
        tasks[("ips", svc)] = partial(_connect, ip, args.port, args.timeout_s)
    for target in args.outside:
        host, port = target.rsplit(":", 1)
        tasks[("outside", target)] = partial(_connect, host, int(port), args.timeout_s)
    for target in args.api:
        host, port = target.rsplit(":", 1)
        tasks[("api", target)] = partial(_resolve_connect, host, int(port), args.timeout_s)
    # A resolve-then-connect takes at most two timeouts; a second on top for thread start-up.
    results = run_all(tasks, deadline_s=2 * args.timeout_s + 1.0)
    out: dict = {"hostname": socket.gethostname(), "names": {}, "ips": {}, "outside": {}, "api": {}}
    for (group, key), r in results.items():
        if group == "via":
            out["via"] = {"target": args.via, **r}
        elif group == "ips":
            out["ips"][key] = {"address": ips[key], **r}
        else:
            out[group][key] = r
    with open("/proc/net/route") as f:
        out["default_route"] = has_default_route(f.read())
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    sys.stdout.flush()
    os._exit(0)  # abandoned lookups may still block in getaddrinfo; do not wait for them at exit


if __name__ == "__main__":
    sys.exit(main())
