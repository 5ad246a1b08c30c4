"""Starting a run from a trained state: a durable checkpoint of an earlier run instead of the seeded
initial weights (`train.init_store_dir` + `train.init_manifest_sha256`).

The checkpoint is read straight from the earlier run's store directory (read only: nothing is written
there), every file verified against the hash it is named by: the manifest against
`init_manifest_sha256`, each blob against the manifest's blob hash, and the loaded parameters against
the manifest's `params_hash`. Its model, inner AdamW and outer state become the trainer's state before
anything else happens, so the site's `site_started` params hash, its initial snapshot (what a genesis
restart goes back to) and every intra-site worker all start from it. The retained samples of the
earlier run are NOT carried: the new run counts its own useful work from zero.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from checkpoint_store.blobstore import is_sha256_hex


class InitStateError(RuntimeError):
    """The configured start state cannot be used; the message says which file and why."""


def _verified(path: Path, want: str, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InitStateError(f"start state: cannot read {what} {path}: {e.strerror or e}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise InitStateError(f"start state: {what} {path} hashes to {got}, expected {want}")
    return data


def read_init_state(store_dir: str | Path, manifest_sha256: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(manifest, {blob name: {tensor name: tensor}}) of a durable checkpoint, every file hash-verified."""
    import safetensors.torch

    if not is_sha256_hex(manifest_sha256):
        raise InitStateError(f"train.init_manifest_sha256 {manifest_sha256!r} is not a SHA-256 (64 lowercase hex)")
    root = Path(store_dir)
    manifest = json.loads(_verified(root / "manifests" / f"{manifest_sha256}.json", manifest_sha256, "manifest"))
    blobs = {}
    for name, sha in sorted(manifest.get("blobs", {}).items()):
        if not is_sha256_hex(sha):
            raise InitStateError(f"start state: manifest {manifest_sha256} names blob {name!r} by {sha!r}")
        blobs[name] = safetensors.torch.load(_verified(root / "blobs" / sha, sha, f"blob {name!r}"))
    return manifest, blobs


def check_init_config(store_dir: str, manifest_sha256: str) -> None:
    """Both or neither, and the manifest exists with the right hash (the launcher's check before any process)."""
    if bool(store_dir) != bool(manifest_sha256):
        raise InitStateError("train.init_store_dir and train.init_manifest_sha256 go together (both or neither)")
    if manifest_sha256:
        if not is_sha256_hex(manifest_sha256):
            raise InitStateError(f"train.init_manifest_sha256 {manifest_sha256!r} is not a SHA-256 (64 lowercase hex)")
        _verified(Path(store_dir) / "manifests" / f"{manifest_sha256}.json", manifest_sha256, "manifest")


def start_trainer(cfg: Any, device: Any, group: Any = None) -> Any:
    """A SiteTrainer for `cfg` with its configured start state loaded (train.init_manifest_sha256),
    before anyone hashes or snapshots its weights: every process that trains builds its trainer here."""
    from site_agent.trainer import SiteTrainer  # torch: the launcher imports this module's checks without it

    trainer = SiteTrainer(cfg, device, group=group)
    trainer.init_state = load_init_state(trainer)
    return trainer


def load_init_state(trainer: Any) -> dict[str, Any] | None:
    """Load the configured start state into `trainer` (a SiteTrainer); None when none is configured.
    Returns what the site logs (`init_state`): the manifest hash, its params hash, round and run."""
    from site_agent.state import LINEAGE, load_blobs

    t = trainer.cfg.train
    if not t.init_manifest_sha256 and not t.init_store_dir:
        return None
    check_init_config(t.init_store_dir, t.init_manifest_sha256)
    manifest, blobs = read_init_state(t.init_store_dir, t.init_manifest_sha256)
    load_blobs(trainer, {k: v for k, v in blobs.items() if k != LINEAGE})
    got = trainer.params_hash()
    if got != manifest.get("params_hash"):
        raise InitStateError(f"start state {t.init_manifest_sha256}: loaded parameters hash to {got}, the manifest "
                             f"says {manifest.get('params_hash')}")
    return {"manifest_sha256": t.init_manifest_sha256, "store_dir": str(t.init_store_dir), "params_hash": got,
            "from_run_id": manifest.get("run_id"), "from_round": manifest.get("round"),
            "from_useful_tokens": manifest.get("useful_tokens")}
