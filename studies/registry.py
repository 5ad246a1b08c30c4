"""The registry: which protocol version was frozen, by canonical hash, at which code revision.

Canonical hash = SHA-256 of the parsed, normalised protocol (`Protocol.to_dict()`, scenario files
resolved into it) as JSON with sorted keys and no whitespace: comments, key order, quoting and
blank lines do not change it; any change of meaning does. `register` records it with the code
revision (git) in a registry file committed next to the protocols (studies/registry.json by
default). A protocol whose hash differs from its registered one is refused by `check`; a changed
protocol is registered as a new version, and the earlier versions stay in the registry (the
artifact lists them with their hashes and, where their artifact is found, their conclusions).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from studies.protocol_model import Protocol

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "studies" / "registry.json"
KIND = "xdc-study-registry/1"


class RegistrationError(ValueError):
    """The protocol is not registered, or differs from its registration."""


def canonical_json(p: Protocol) -> str:
    return json.dumps(p.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def protocol_hash(p: Protocol) -> str:
    return hashlib.sha256(canonical_json(p).encode()).hexdigest()


def read_registry(path: Path = REGISTRY) -> dict[str, Any]:
    if not path.is_file():
        return {"kind": KIND, "studies": {}}
    data = json.loads(path.read_text())
    if data.get("kind") != KIND:
        raise RegistrationError(f"{path}: not a study registry (kind {data.get('kind')!r})")
    return data


def write_registry(data: dict[str, Any], path: Path = REGISTRY) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def versions(name: str, path: Path = REGISTRY) -> list[dict[str, Any]]:
    return list(read_registry(path)["studies"].get(name, []))


def register(p: Protocol, protocol_file: str, revision: dict[str, Any], path: Path = REGISTRY,
             decidability: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the protocol's hash (a no-op when this exact hash is already registered); returns
    the entry. A protocol that changed gets the next version number, whatever its file says,
    and the earlier entries stay."""
    data = read_registry(path)
    entries = data["studies"].setdefault(p.name, [])
    h = protocol_hash(p)
    for e in entries:
        if e["sha256"] == h:
            return {**e, "already": True}
    entry = {"version": (max((e["version"] for e in entries), default=0) + 1), "sha256": h,
             "declared_version": p.version, "file": protocol_file, "code_revision": revision,
             "registered_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "canonical": p.to_dict(),
             # Whether each gate could pass and fail, checked before the first run (studies/decidability.py).
             **({"decidability": decidability} if decidability is not None else {})}
    entries.append(entry)
    write_registry(data, path)
    return entry


def check(p: Protocol, path: Path = REGISTRY) -> dict[str, Any]:
    """The registry entry this protocol's hash matches: its latest registered version. Raises
    RegistrationError naming both hashes and the fields that differ otherwise."""
    entries = versions(p.name, path)
    h = protocol_hash(p)
    if not entries:
        raise RegistrationError(f"study {p.name!r} is not registered in {path}: run `xdc study register "
                                f"{p.source}` first (its canonical SHA-256 is {h})")
    latest = entries[-1]
    if latest["sha256"] == h:
        return latest
    old = next((e for e in entries if e["sha256"] == h), None)
    if old is not None:
        raise RegistrationError(f"study {p.name!r}: this protocol is registered version {old['version']} "
                                f"(sha256 {h[:16]}…), superseded by version {latest['version']} "
                                f"(sha256 {latest['sha256'][:16]}…): run the latest version")
    changed = _diff(latest.get("canonical", {}), p.to_dict())
    raise RegistrationError(
        f"study {p.name!r}: protocol {p.source} has canonical SHA-256 {h}, but registered version "
        f"{latest['version']} is {latest['sha256']} (registered {latest.get('registered_utc')}); it was edited "
        f"after registration ({', '.join(changed[:6]) or 'fields differ'}). Register it as a new version "
        f"(`xdc study register {p.source}`) before running it")


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted paths where two canonical forms differ (for the refusal message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += _diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [path or "(root)"]
