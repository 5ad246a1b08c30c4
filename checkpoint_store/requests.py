"""Typed bodies of the requests the checkpoint store receives, checked before any field is trusted.

Each `from_body` checks types and ranges and raises `BadMessage` (from `ground.messages`,
whose field helpers it shares) with a precise reason; the store answers `ckpt_error` with
"bad_request: <reason>" and logs it. The manifest's own fields are validated by `BlobStore`.
This module must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ground.messages import NAME, SHA256, BadMessage, body_of, get_int, get_str

MAX_BLOB_BYTES = 1 << 40  # offsets and lengths past a terabyte are absurd here
MAX_MANIFEST_KEYS = 256


def request_id(kind: str, body: Any) -> str | None:
    """The id to echo in a reply: the body's `req` (a chunk's upload id if it has none), when it is
    a short string; None otherwise (never echo an arbitrary structure back)."""
    if not isinstance(body, dict):
        return None
    req = body.get("req", body.get("upload") if kind == "ckpt_chunk" else None)
    return req if isinstance(req, str) and len(req) <= 200 else None


@dataclass(frozen=True)
class Chunk:
    upload: str
    offset: int
    sha256: str | None

    @staticmethod
    def from_body(body: Any) -> Chunk:
        k = "ckpt_chunk"
        b = body_of(k, body)
        return Chunk(get_str(k, b, "upload", pattern=NAME, max_len=128, what="an upload id"),
                     get_int(k, b, "offset", hi=MAX_BLOB_BYTES),
                     get_str(k, b, "sha256", pattern=SHA256, max_len=64, what="a sha256", default=None))


@dataclass(frozen=True)
class Finish:
    upload: str
    sha256: str

    @staticmethod
    def from_body(body: Any) -> Finish:
        k = "ckpt_finish"
        b = body_of(k, body)
        return Finish(get_str(k, b, "upload", pattern=NAME, max_len=128, what="an upload id"),
                      get_str(k, b, "sha256", pattern=SHA256, max_len=64, what="a sha256"))


@dataclass(frozen=True)
class ManifestPut:
    manifest: dict[str, Any]

    @staticmethod
    def from_body(body: Any) -> ManifestPut:
        k = "ckpt_manifest"
        b = body_of(k, body)
        m = b.get("manifest")
        if not isinstance(m, dict):
            raise BadMessage(k, f"field 'manifest' must be a map, got {type(m).__name__}")
        if len(m) > MAX_MANIFEST_KEYS:
            raise BadMessage(k, f"manifest has {len(m)} fields, limit {MAX_MANIFEST_KEYS}")
        return ManifestPut(m)


@dataclass(frozen=True)
class FrontierGet:
    """The durable frontier, or (with `manifest_hash`) one named checkpoint: a restore reads the
    checkpoint its plan names even after a newer one became the frontier."""
    manifest_hash: str | None = None

    @staticmethod
    def from_body(body: Any) -> FrontierGet:
        k = "ckpt_frontier_get"
        b = body_of(k, body)
        return FrontierGet(get_str(k, b, "manifest_hash", pattern=SHA256, max_len=64, what="a sha256",
                                   default=None))


@dataclass(frozen=True)
class BlobGet:
    sha256: str
    offset: int
    length: int | None

    @staticmethod
    def from_body(body: Any) -> BlobGet:
        k = "ckpt_blob_get"
        b = body_of(k, body)
        return BlobGet(get_str(k, b, "sha256", pattern=SHA256, max_len=64, what="a sha256"),
                       get_int(k, b, "offset", hi=MAX_BLOB_BYTES, default=0),
                       get_int(k, b, "length", lo=1, hi=MAX_BLOB_BYTES, default=None))


PARSERS: dict[str, Any] = {"ckpt_chunk": Chunk.from_body, "ckpt_finish": Finish.from_body,
                           "ckpt_manifest": ManifestPut.from_body, "ckpt_frontier_get": FrontierGet.from_body,
                           "ckpt_blob_get": BlobGet.from_body}
