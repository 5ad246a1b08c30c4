"""The study's shared start state: every run starts from one trained state (studies/protocol.py
`start_state`), so the arms differ only in what they are meant to.

Two forms: an existing durable checkpoint (`store_dir` + `manifest_sha256`, frozen in the protocol), or
a run that trains it (`target_useful_tokens` + `config` over the base config, no faults) which the
study makes once, first, under the ledger key `start/state`; its durable frontier (RUN/store/FRONTIER,
the final checkpoint) is then the start state. Either way every run's config carries
`train.init_store_dir` / `train.init_manifest_sha256` (site_agent/init_state.py), every run records
the hash it started from, and the `start_state_mismatch` invalidator checks they all agree and that
every site loaded it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.protocol_model import Protocol, _plain

START_KEY = "start/state"


def start_config_dict(p: Protocol) -> dict[str, Any]:
    """The config dict of the run that trains the start state (base config < its own config < its target)."""
    from ground.config import merge

    st = p.start_state or {}
    return merge(merge(dict(_plain(p.base_config)), dict(_plain(st.get("config") or {}))),
                 {"train": {"target_useful_tokens": int(st["target_useful_tokens"])}})


def frontier_of(run_dir: Path) -> dict[str, Any]:
    """The durable frontier of a finished run's store: {store_dir, manifest_sha256, params_hash, round}."""
    from checkpoint_store.blobstore import BlobStore

    store = Path(run_dir) / "store"
    fr = BlobStore(store).frontier()  # hash-verified, with every blob
    if fr is None:
        raise ValueError(f"{store}: the start-state run left no durable checkpoint")
    h, manifest = fr
    return {"store_dir": str(store.resolve()), "manifest_sha256": h, "params_hash": manifest.get("params_hash"),
            "round": manifest.get("round"), "useful_tokens": manifest.get("useful_tokens"),
            "from_run_id": manifest.get("run_id")}


def resolved(p: Protocol, finished: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The start state every run uses: the protocol's checkpoint, or the finished start run's frontier;
    None while the start run has not finished (or the protocol has none)."""
    st = p.start_state
    if not st:
        return None
    if st.get("manifest_sha256"):
        return {"store_dir": str(st["store_dir"]), "manifest_sha256": str(st["manifest_sha256"])}
    run = finished.get(START_KEY)
    return None if run is None else run.get("start_state")


def start_overrides(st: dict[str, Any] | None) -> dict[str, Any]:
    if not st:
        return {}
    return {"train": {"init_store_dir": st["store_dir"], "init_manifest_sha256": st["manifest_sha256"]}}
