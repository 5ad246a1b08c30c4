"""Durable, content-addressed local storage of checkpoint blobs and manifests (no sockets).

Layout under `root`:
    blobs/<sha256>               safetensors bytes, named by their own hash
    manifests/<sha256>.json      canonical JSON (sort_keys, compact separators), named by its hash
    FRONTIER                     the hash of the last acknowledged manifest: the durable frontier
    FENCE_EPOCH                  the highest membership epoch of any accepted write (fencing)
    tmp/                         in-progress uploads and atomic-write temporaries

Every write is atomic: write a temporary file under tmp/, fsync it, rename it into place, fsync
the directory. A crash at any point leaves either the old or the new file, plus maybe a leftover
under tmp/ that `recover()` removes at the next start. Reads verify hashes; a mismatch raises
`CorruptCheckpoint` naming the file and both hashes. Blobs are opaque bytes here (the store never
deserialises them, and nothing is ever unpickled); the client encodes them with safetensors.

A `BlobStore` is meant to be used from one thread (the store service's main loop).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

REQUIRED_FIELDS = ("run_id", "ckpt_id", "round", "step", "epoch", "parent", "samples", "blobs", "created_wall_ns")

_HEX64 = re.compile(r"[0-9a-f]{64}")
_UPLOAD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_MANIFEST_BLOBS = 64  # named blobs one manifest may list (a checkpoint has four)
MAX_OPEN_UPLOADS = 64  # uploads in progress at once, over every writer: one open file each
_READ_BLOCK = 1 << 20


class StoreError(Exception):
    """A store operation was refused or failed; the message says exactly why."""


class CorruptCheckpoint(StoreError):
    """Stored bytes do not match the hash they are stored under."""

    def __init__(self, path: str | Path, expected: str, actual: str, what: str = "file") -> None:
        super().__init__(f"corrupt {what} {path}: expected sha256 {expected}, actual {actual}")
        self.path = str(path)
        self.expected = expected
        self.actual = actual


def canonical_json(manifest: dict[str, Any]) -> bytes:
    """The exact bytes a manifest is stored (and hashed) as."""
    try:
        return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as e:
        raise StoreError(f"manifest is not canonical JSON: {e}") from None


def manifest_hash(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(manifest)).hexdigest()


def is_sha256_hex(s: Any) -> bool:
    return isinstance(s, str) and bool(_HEX64.fullmatch(s))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            h.update(block)
    return h.hexdigest()


@dataclass
class _Upload:
    path: Path
    file: BinaryIO
    size: int
    hasher: Any


class BlobStore:
    """Content-addressed blobs, manifests and the frontier on disk. `quota_bytes` bounds what the
    blobs and the uploads in progress may hold together (None: no bound); an append past it is a
    StoreError naming the quota, and nothing stored is touched."""

    def __init__(self, root: str | Path, quota_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.quota_bytes = quota_bytes
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir = self.root / "manifests"
        self.tmp_dir = self.root / "tmp"
        self.frontier_path = self.root / "FRONTIER"
        self.fence_path = self.root / "FENCE_EPOCH"
        for d in (self.root, self.blobs_dir, self.manifests_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._uploads: dict[str, _Upload] = {}
        # sha -> ((inode, size, mtime_ns) of the file whose full hash was verified, monotonic s of that check)
        self._verified: dict[str, tuple[tuple[int, int, int], float]] = {}
        self._stored_bytes = sum(p.stat().st_size for p in self.blobs_dir.iterdir() if p.is_file())

    # ------------------------------------------------------------------ recovery
    def recover(self) -> list[str]:
        """Delete every leftover under tmp/ (torn uploads, half-written temporaries).

        Call once at start, before any upload begins. Returns the removed paths relative to root.
        """
        for up in self._uploads.values():
            up.file.close()
        self._uploads.clear()
        removed: list[str] = []
        for p in sorted(self.tmp_dir.iterdir()):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(str(p.relative_to(self.root)))
        if removed:
            fsync_dir(self.tmp_dir)
        return removed

    # ------------------------------------------------------------------ atomic writes
    def _atomic_write(self, dest: Path, data: bytes) -> None:
        tmp = self.tmp_dir / f"write-{uuid.uuid4().hex}.part"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(dest.parent)

    # ------------------------------------------------------------------ uploads
    def _upload_path(self, upload_id: str) -> Path:
        if not isinstance(upload_id, str) or not _UPLOAD_ID.fullmatch(upload_id):
            raise StoreError(f"bad upload id {upload_id!r}: expected 1-128 of [A-Za-z0-9_.-], not starting with '.'")
        return self.tmp_dir / f"upload-{upload_id}.part"

    def begin_upload(self, upload_id: str) -> None:
        """Start (or restart from byte 0) an upload."""
        path = self._upload_path(upload_id)
        self.abort_upload(upload_id)
        if len(self._uploads) >= MAX_OPEN_UPLOADS:
            raise StoreError(f"upload {upload_id!r}: {len(self._uploads)} uploads are in progress, at most "
                             f"{MAX_OPEN_UPLOADS}: finish or abort one first")
        f = open(path, "wb")
        self._uploads[upload_id] = _Upload(path, f, 0, hashlib.sha256())

    def append(self, upload_id: str, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append `data` at `offset`, which must equal the bytes received so far. Returns the new size."""
        up = self._uploads.get(upload_id)
        if up is None:
            raise StoreError(f"unknown upload {upload_id!r}: no upload in progress (it must begin at offset 0; "
                             f"got a chunk at offset {offset})")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset != up.size:
            raise StoreError(f"upload {upload_id!r}: chunk at offset {offset!r}, but {up.size} bytes have been "
                             f"received (chunks must arrive in order without gaps)")
        mv = memoryview(data).cast("B")
        if self.quota_bytes is not None:
            held = self._stored_bytes + sum(u.size for u in self._uploads.values())
            if held + len(mv) > self.quota_bytes:
                raise StoreError(f"upload {upload_id!r}: the store's quota of {self.quota_bytes:,} bytes would be "
                                 f"exceeded ({held:,} held, {len(mv):,} more): chunk refused")
        up.file.write(mv)
        up.hasher.update(mv)
        up.size += len(mv)
        return up.size

    def abort_upload(self, upload_id: str) -> bool:
        """Drop an upload and its temporary file; True if there was one."""
        up = self._uploads.pop(upload_id, None)
        if up is None:
            return False
        up.file.close()
        up.path.unlink(missing_ok=True)
        return True

    def finish_upload(self, upload_id: str, expected_sha256: str) -> str:
        """Verify the upload's hash, fsync it and rename it to blobs/<sha>. Idempotent for existing blobs."""
        if not is_sha256_hex(expected_sha256):
            raise StoreError(f"upload {upload_id!r}: expected sha256 {expected_sha256!r} is not 64 lowercase hex digits")
        up = self._uploads.pop(upload_id, None)
        if up is None:
            raise StoreError(f"unknown upload {upload_id!r}: nothing to finish")
        actual = up.hasher.hexdigest()
        if actual != expected_sha256:
            up.file.close()
            up.path.unlink(missing_ok=True)
            raise StoreError(f"upload {upload_id!r}: {up.size} bytes hash to {actual}, expected {expected_sha256}; "
                             f"upload discarded")
        try:
            up.file.flush()
            os.fsync(up.file.fileno())
        finally:
            up.file.close()
        dest = self.blobs_dir / expected_sha256
        if dest.exists() and self._file_ok(dest, expected_sha256):
            up.path.unlink(missing_ok=True)  # already stored and intact
            return expected_sha256
        old = dest.stat().st_size if dest.exists() else 0
        os.replace(up.path, dest)  # replaces a corrupt copy, if there was one
        fsync_dir(self.blobs_dir)
        self._stored_bytes += up.size - old
        self._verified.pop(expected_sha256, None)
        return expected_sha256

    def put_blob(self, data: bytes) -> str:
        """Store bytes in one go (tests, small blobs); returns their sha256."""
        sha = hashlib.sha256(data).hexdigest()
        upload_id = f"local-{uuid.uuid4().hex}"
        self.begin_upload(upload_id)
        self.append(upload_id, 0, data)
        return self.finish_upload(upload_id, sha)

    # ------------------------------------------------------------------ blobs
    def _blob_path(self, sha: str) -> Path:
        if not is_sha256_hex(sha):
            raise StoreError(f"bad blob hash {sha!r}: expected 64 lowercase hex digits")
        return self.blobs_dir / sha

    @staticmethod
    def _stat_key(path: Path) -> tuple[int, int, int]:
        st = path.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _file_ok(self, path: Path, sha: str) -> bool:
        return _sha256_file(path) == sha

    def verify_blob(self, sha: str, max_age_s: float = 0.0) -> int:
        """Hash the whole blob; raise CorruptCheckpoint/StoreError if it is bad. Returns its size.

        With `max_age_s` > 0, a blob whose full hash was checked less than that long ago, and whose
        file is unchanged since (inode, size, mtime), is not hashed again: repeated probes of the
        same checkpoint cost a stat, not a rehash. 0 (the default) always hashes."""
        path = self._blob_path(sha)
        if not path.exists():
            raise StoreError(f"no blob {sha} at {path}")
        key = self._stat_key(path)
        seen = self._verified.get(sha)
        if max_age_s > 0 and seen is not None and seen[0] == key and time.monotonic() - seen[1] < max_age_s:
            return key[1]
        actual = _sha256_file(path)
        if actual != sha:
            self._verified.pop(sha, None)
            raise CorruptCheckpoint(path, sha, actual, what="blob")
        self._verified[sha] = (key, time.monotonic())
        return key[1]

    def has_blob(self, sha: str) -> bool:
        return self._blob_path(sha).exists()

    def blob_size(self, sha: str) -> int:
        path = self._blob_path(sha)
        if not path.exists():
            raise StoreError(f"no blob {sha} at {path}")
        return path.stat().st_size

    def get_blob(self, sha: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read a blob or a range of it.

        A whole read (offset 0, length None) verifies the bytes it returns. A ranged read verifies the
        whole file the first time (and again whenever the file changed: inode, size or mtime).
        """
        path = self._blob_path(sha)
        if not path.exists():
            raise StoreError(f"no blob {sha} at {path}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise StoreError(f"blob {sha}: bad offset {offset!r}")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 0):
            raise StoreError(f"blob {sha}: bad length {length!r}")
        if offset == 0 and length is None:
            data = path.read_bytes()
            actual = hashlib.sha256(data).hexdigest()
            if actual != sha:
                self._verified.pop(sha, None)
                raise CorruptCheckpoint(path, sha, actual, what="blob")
            return data
        seen = self._verified.get(sha)
        if seen is None or seen[0] != self._stat_key(path):
            self.verify_blob(sha)
        size = path.stat().st_size
        if offset > size:
            raise StoreError(f"blob {sha}: offset {offset} is past its end ({size} bytes)")
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size - offset if length is None else length)

    # ------------------------------------------------------------------ fencing
    def fence_epoch(self) -> int:
        """The highest membership epoch of any accepted write (0 if none)."""
        try:
            return int(self.fence_path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError as e:
            raise StoreError(f"{self.fence_path} does not hold an integer: {e}") from None

    def raise_fence_epoch(self, epoch: int) -> bool:
        """Durably raise the fence to `epoch` if it is higher; True if it changed."""
        if epoch <= self.fence_epoch():
            return False
        self._atomic_write(self.fence_path, f"{int(epoch)}\n".encode())
        return True

    # ------------------------------------------------------------------ manifests
    def _manifest_path(self, h: str) -> Path:
        if not is_sha256_hex(h):
            raise StoreError(f"bad manifest hash {h!r}: expected 64 lowercase hex digits")
        return self.manifests_dir / f"{h}.json"

    def _validate(self, manifest: Any) -> None:
        if not isinstance(manifest, dict):
            raise StoreError(f"manifest must be a mapping, got {type(manifest).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in manifest]
        if missing:
            raise StoreError(f"manifest lacks required field(s) {missing}")
        if not isinstance(manifest["run_id"], str) or not manifest["run_id"]:
            raise StoreError(f"manifest field 'run_id' must be a non-empty string, got {manifest['run_id']!r}")
        ck = manifest["ckpt_id"]
        if isinstance(ck, bool) or not isinstance(ck, (str, int)):
            raise StoreError(f"manifest field 'ckpt_id' must be a string or integer, got {ck!r}")
        for k in ("round", "step", "epoch", "created_wall_ns"):
            v = manifest[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise StoreError(f"manifest field {k!r} must be a non-negative integer, got {v!r}")
        sm = manifest["samples"]
        if not isinstance(sm, dict) and (isinstance(sm, bool) or not isinstance(sm, int) or sm < 0):
            raise StoreError(f"manifest field 'samples' must be a non-negative count or a mapping "
                             f"(e.g. count, tokens, sha256 of the sample ids), got {sm!r}")
        blobs = manifest["blobs"]
        if not isinstance(blobs, dict):
            raise StoreError(f"manifest field 'blobs' must map names to sha256, got {type(blobs).__name__}")
        if len(blobs) > MAX_MANIFEST_BLOBS:
            raise StoreError(f"manifest lists {len(blobs)} blobs, at most {MAX_MANIFEST_BLOBS}")
        verified: set[str] = set()  # a blob listed under several names is hashed once
        for name, sha in blobs.items():
            if not isinstance(name, str) or not name:
                raise StoreError(f"manifest blob name {name!r} must be a non-empty string")
            if not is_sha256_hex(sha):
                raise StoreError(f"manifest blob {name!r}: {sha!r} is not a sha256 (64 lowercase hex digits)")
            if not self.has_blob(sha):
                raise StoreError(f"manifest blob {name!r}: blob {sha} is not in the store (upload it first)")
            if sha not in verified:
                self.verify_blob(sha)
                verified.add(sha)
        parent = manifest["parent"]
        if parent is not None:
            if not is_sha256_hex(parent):
                raise StoreError(f"manifest field 'parent' must be null or a manifest hash, got {parent!r}")
            ppath = self._manifest_path(parent)
            if not ppath.exists():
                raise StoreError(f"manifest parent {parent} does not exist in the store")
            actual = _sha256_file(ppath)
            if actual != parent:
                raise CorruptCheckpoint(ppath, parent, actual, what="parent manifest")

    def put_manifest(self, manifest: dict[str, Any]) -> str:
        """Validate, store the manifest atomically, then atomically make it the frontier. Returns its hash."""
        self._validate(manifest)
        data = canonical_json(manifest)
        h = hashlib.sha256(data).hexdigest()
        path = self._manifest_path(h)
        if not (path.exists() and _sha256_file(path) == h):
            self._atomic_write(path, data)
        self._atomic_write(self.frontier_path, f"{h}\n".encode())
        return h

    def frontier_hash(self) -> str | None:
        """The FRONTIER file's hash, unverified (None if no manifest was ever acknowledged)."""
        try:
            text = self.frontier_path.read_text().strip()
        except FileNotFoundError:
            return None
        if not is_sha256_hex(text):
            raise StoreError(f"{self.frontier_path} holds {text[:80]!r}, not a manifest hash")
        return text

    def read_manifest(self, h: str) -> dict[str, Any]:
        """Read one manifest, verifying its own hash (not its blobs)."""
        path = self._manifest_path(h)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptCheckpoint(path, h, "missing", what="manifest") from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != h:
            raise CorruptCheckpoint(path, h, actual, what="manifest")
        return json.loads(data)

    def frontier(self, max_age_s: float = 0.0) -> tuple[str, dict[str, Any]] | None:
        """(hash, manifest) of the durable frontier, with the manifest and every blob verified
        (`max_age_s` as in `verify_blob`)."""
        h = self.frontier_hash()
        if h is None:
            return None
        return h, self.checkpoint(h, max_age_s)

    def checkpoint(self, h: str, max_age_s: float = 0.0) -> dict[str, Any]:
        """The manifest of checkpoint `h` (frontier or not), with it and every blob verified (each
        distinct blob once; `max_age_s` as in `verify_blob`); CorruptCheckpoint if it or a blob is
        missing or damaged."""
        manifest = self.read_manifest(h)
        for sha in sorted(set(manifest.get("blobs", {}).values())):
            path = self._blob_path(sha)
            if not path.exists():
                raise CorruptCheckpoint(path, sha, "missing", what="blob")
            self.verify_blob(sha, max_age_s)
        return manifest

    def manifests(self) -> dict[str, dict[str, Any]]:
        """Every stored manifest (the lineage tree, abandoned branches included), each hash-verified."""
        out: dict[str, dict[str, Any]] = {}
        for p in sorted(self.manifests_dir.glob("*.json")):
            h = p.name[: -len(".json")]
            if is_sha256_hex(h):
                out[h] = self.read_manifest(h)
        return out

    def close(self) -> None:
        """Close open upload files (their temporaries stay for recover())."""
        for up in self._uploads.values():
            up.file.close()
        self._uploads.clear()
