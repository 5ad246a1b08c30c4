"""The training data: Python's own standard library source, as bytes, identical on every site.

Role in xdc: every site process calls `load_corpus` and gets the same train / held-out byte
arrays and the same `dataset_id` (a sha256 that pins the exact documents), with no network.
The cluster trains on "canonical samples": sample id `s` is the byte window
`train[s*T : s*T + T + 1]` (T = seq_len); `sample_order` fixes the order in which the cluster
consumes them, so which site trains on which sample is pure bookkeeping over integers.
`heldout_batch` + `evaluate_nll` give the fixed held-out NLL (nats/token) reported by runs.

Corpus recipe: all `.py` files under `sysconfig.get_paths()["stdlib"]`, skipping any path with a
directory component `site-packages`, `test`, `tests`, `idlelib` or `lib2to3`; sorted by POSIX
relative path; documents are taken in that order and the scan STOPS at the first document whose
bytes (+1 separator byte) would push the total past `max_corpus_bytes`. Document k is held out
iff k % heldout_every_docs == 0. Each split is its documents' bytes, each followed by b"\\0".
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from xdc.config import DataConfig

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3"})
SEPARATOR = b"\0"  # appended after every document
RECIPE_VERSION = "xdc-corpus-v1"  # bump when the recipe (not the config) changes


@dataclass(frozen=True, eq=False)  # eq=False: comparing numpy fields with == is ambiguous
class Corpus:
    """Train / held-out byte arrays (read-only uint8, 1-D) and the identity of their content."""

    train: np.ndarray  # uint8 [train_bytes]
    heldout: np.ndarray  # uint8 [heldout_bytes]
    dataset_id: str  # sha256 hex of recipe + every document's relative path and bytes, in order
    n_docs_train: int
    n_docs_heldout: int
    stdlib_dir: str


_CACHE: dict[DataConfig, Corpus] = {}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_documents(root: Path) -> list[str]:
    """POSIX relative paths of the corpus-eligible `.py` files under `root`, sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]  # prune excluded subtrees
        rel_dir = Path(dirpath).relative_to(root)
        for fn in filenames:
            if fn.endswith(".py"):
                found.append((rel_dir / fn).as_posix())
    return sorted(found)


def _recipe(cfg: DataConfig) -> str:
    fields = ",".join(f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg))
    return f"{RECIPE_VERSION};DataConfig({fields})"


def _read_documents(root: Path, max_bytes: int) -> list[tuple[str, bytes]]:
    """(relative path, bytes) in sorted order, stopping before the budget would be exceeded."""
    docs: list[tuple[str, bytes]] = []
    total = 0  # bytes including separators
    for rel in list_documents(root):
        data = (root / rel).read_bytes()
        if total + len(data) + len(SEPARATOR) > max_bytes:
            break
        docs.append((rel, data))
        total += len(data) + len(SEPARATOR)
    return docs


def _frozen_array(parts: list[bytes]) -> np.ndarray:
    """uint8 [sum(len(p) + 1)]: each part followed by the separator; read-only (shared via cache)."""
    return np.frombuffer(b"".join(p + SEPARATOR for p in parts), dtype=np.uint8)


def load_corpus(cfg: DataConfig) -> Corpus:
    """Build (or return the cached) corpus for `cfg`. Deterministic for a given Python install."""
    cached = _CACHE.get(cfg)
    if cached is not None:
        return cached
    root = stdlib_dir()
    docs = _read_documents(root, cfg.max_corpus_bytes)
    h = hashlib.sha256(_recipe(cfg).encode("utf-8"))
    train_parts: list[bytes] = []
    heldout_parts: list[bytes] = []
    for k, (rel, data) in enumerate(docs):
        rel_b = rel.encode("utf-8")
        # length-prefixed so that path/content boundaries are unambiguous
        h.update(len(rel_b).to_bytes(8, "little") + rel_b + len(data).to_bytes(8, "little") + data)
        (heldout_parts if k % cfg.heldout_every_docs == 0 else train_parts).append(data)
    corpus = Corpus(
        train=_frozen_array(train_parts),
        heldout=_frozen_array(heldout_parts),
        dataset_id=h.hexdigest(),
        n_docs_train=len(train_parts),
        n_docs_heldout=len(heldout_parts),
        stdlib_dir=str(root),
    )
    _CACHE[cfg] = corpus
    return corpus


def n_samples(corpus: Corpus, seq_len: int) -> int:
    """Number of canonical train samples: windows of seq_len + 1 bytes at stride seq_len."""
    return max(0, (len(corpus.train) - 1) // seq_len)


def sample_order(corpus: Corpus, seq_len: int, seed: int) -> np.ndarray:
    """int64 [n_samples]: a fixed permutation of sample ids; position p trains order[p % n]."""
    return np.random.default_rng(seed).permutation(n_samples(corpus, seq_len)).astype(np.int64)


def _windows(arr: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[Tensor, Tensor]:
    """x, y int64 [B, seq_len] from windows arr[start : start + seq_len + 1]."""
    idx = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]  # [B, T+1]
    win = torch.from_numpy(arr[idx].astype(np.int64))  # fancy indexing copies: writable
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def batch_for(corpus: Corpus, sample_ids: Sequence[int], seq_len: int) -> tuple[Tensor, Tensor]:
    """CPU LongTensors x, y [B, seq_len] for canonical sample ids (y is x shifted by one)."""
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)  # [B]
    n = n_samples(corpus, seq_len)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise IndexError(f"sample ids must be in [0, {n}); got min {ids.min()} max {ids.max()}")
    return _windows(corpus.train, ids * seq_len, seq_len)


def heldout_batch(corpus: Corpus, cfg: DataConfig, seq_len: int) -> tuple[Tensor, Tensor]:
    """The first `heldout_samples` held-out windows (stride seq_len, like train samples):
    CPU LongTensors x, y [heldout_samples, seq_len]."""
    available = max(0, (len(corpus.heldout) - 1) // seq_len)
    if cfg.heldout_samples > available:
        raise ValueError(f"held-out split has {available} windows of {seq_len}, need {cfg.heldout_samples}")
    starts = np.arange(cfg.heldout_samples, dtype=np.int64) * seq_len
    return _windows(corpus.heldout, starts, seq_len)


def evaluate_nll(model: torch.nn.Module, x: Tensor, y: Tensor, device: torch.device, batch: int = 16) -> float:
    """Mean NLL in nats/token over all of x, y [N, T], in chunks of `batch` rows, without grad.
    The model is put in eval mode and restored to its previous mode afterwards."""
    was_training = model.training
    model.eval()
    total_nll = 0.0  # nats, summed over tokens
    total_tokens = 0
    try:
        with torch.no_grad():
            for i in range(0, x.shape[0], batch):
                xb = x[i : i + batch].to(device)
                yb = y[i : i + batch].to(device)
                _, loss = model(xb, yb)
                total_nll += float(loss) * yb.numel()
                total_tokens += yb.numel()
    finally:
        model.train(was_training)
    return total_nll / max(1, total_tokens)
