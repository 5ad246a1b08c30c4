"""A small typed client for the real Toxiproxy server, and a helper that runs the server.

Every WAN link of the emulator is one Toxiproxy proxy; its latency, jitter and bandwidth are
toxics, and faults (blackholes, resets, partitions) are toxics or a disabled proxy. This module
is the only place that talks to Toxiproxy's JSON control API.

Why not the `toxiproxy-python` package: its last release is from 2019, its HTTP calls have no
timeouts (the control API has been seen to hang while toxics are removed under load, which would
hang the whole run), and it cannot update a toxic's attributes in place. This client uses only
the standard library (urllib), puts a timeout on every call, never goes through an HTTP proxy
from the environment, and raises `ToxiproxyError` with the method, path, HTTP status and the
server's error text.

Toxiproxy facts this module relies on (v2.12.0):
  * a proxy created with listen "127.0.0.1:0" picks a free port; the reply's "listen" is real,
    and disabling then re-enabling the proxy listens on that same port again;
  * toxic names are unique per proxy (not per stream), hence the `_up`/`_down` suffixes;
  * the `stream` "upstream" is client->server, "downstream" is server->client;
  * bandwidth `rate` is in KB/s with KB = 1000 bytes; rate 0 hangs the connection, so it is
    refused here;
  * POST on an existing toxic/proxy still works but is deprecated in favour of PATCH, which
    merges the given attributes into the existing ones;
  * unknown toxic attributes are silently ignored by the server;
  * `POST /reset` removes all toxics and re-enables all proxies, it does not delete proxies;
  * removing a `timeout` toxic closes the connections it was holding (its cleanup closes them);
  * the byte counters of /metrics only move when a connection (direction) ends, see
    `ToxiproxyClient.proxy_bytes`;
  * a `go install` build reports version "git".

The pieces: the API client (`wan.toxiproxy_client`), link shaping (`wan.link_shaping`) and the
server process (`wan.toxiproxy_server`). Every name is importable from here as before the split.
"""

from __future__ import annotations

from wan.link_shaping import SHAPING_TOXICS, apply_link_spec
from wan.toxiproxy_client import Proxy, Stream, ToxiproxyClient, ToxiproxyError
from wan.toxiproxy_server import INSTALL_HINT, ToxiproxyServer, find_toxiproxy_binary, free_port

__all__ = ["INSTALL_HINT", "SHAPING_TOXICS", "Proxy", "Stream", "ToxiproxyClient", "ToxiproxyError", "ToxiproxyServer",
           "apply_link_spec", "find_toxiproxy_binary", "free_port"]
