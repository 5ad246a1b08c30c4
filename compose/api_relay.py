"""The one way to Toxiproxy's API from the host: a TCP relay in the `toxiproxy-api-relay` service.

Toxiproxy's API listens only on its address on the internal control network (`toxiproxy-api`,
reached by `init` and `finish`); the sites' networks carry its proxies and nothing of its API. The
host's chaos and analysis reach the API through the loopback port compose publishes here, on the
one network with a gateway, which this relay alone joins with Toxiproxy's. Every connection is
piped both ways, byte for byte, until either side closes.

    python compose/api_relay.py --listen 0.0.0.0:8474 --to toxiproxy-api:8474
"""

from __future__ import annotations

import argparse
import asyncio


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(listen: tuple[str, int], to: tuple[str, int]) -> None:
    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*to)
        except OSError:
            client_w.close()  # Toxiproxy not up (yet): the caller sees a closed connection and retries
            return
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    server = await asyncio.start_server(relay, *listen)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, type=_addr, help="host:port to accept on")
    ap.add_argument("--to", required=True, type=_addr, help="host:port of Toxiproxy's API")
    args = ap.parse_args(argv)
    asyncio.run(_serve(args.listen, args.to))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
