"""The training data: Python's own standard library source, as bytes, identical on every site.

Role in xdc: every site process calls `load_corpus` and gets the same train / held-out byte
arrays and the same `dataset_id` (a sha256 that pins the exact documents), with no network.
The cluster trains on "canonical samples": sample id `s` is the byte window
`train[s*T : s*T + T + 1]` (T = seq_len); `sample_order` fixes the order in which the cluster
consumes them, so which site trains on which sample is pure bookkeeping over integers.
`eval_set` + `evaluate_windows` give the held-out NLL (nats/token) reported by runs: the mean over
a fixed set of windows spread evenly over the WHOLE held-out split (every held-out document), with
its standard error over windows, identified by the SHA-256 of the window bytes (`EvalSet.eval_set_id`).

Corpus recipe: all `.py` files under `sysconfig.get_paths()["stdlib"]`, skipping any path with a
directory component `site-packages`, `test`, `tests`, `idlelib` or `lib2to3`; sorted by POSIX
relative path; documents are taken in that order and the scan STOPS at the first document whose
bytes (+1 separator byte) would push the total past `max_corpus_bytes`. Document k is held out
iff k % heldout_every_docs == 0. Each split is its documents' bytes, each followed by b"\\0".
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ground.config import DataConfig

if TYPE_CHECKING:  # torch is imported where it is used: the launcher builds the eval set without it
    import torch
    from torch import Tensor

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3"})
SEPARATOR = b"\0"  # appended after every document
# Bump when the recipe (not the config) changes. v2: only CORPUS_FIELDS enter the id (v1 hashed every
# DataConfig field, so the sample order and the held-out window count changed the dataset id).
RECIPE_VERSION = "xdc-corpus-v2"


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


# The DataConfig fields that decide which bytes land in which split. The others (sample order,
# evaluation windows) are identified elsewhere (shuffle_seed in the config, the eval set by its own
# hash), so changing them does not change the dataset id.
CORPUS_FIELDS = ("max_corpus_bytes", "heldout_every_docs")


def _recipe(cfg: DataConfig) -> str:
    fields = ",".join(f"{name}={getattr(cfg, name)!r}" for name in CORPUS_FIELDS)
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
    import torch

    win = torch.from_numpy(_window_bytes(arr, starts, seq_len).astype(np.int64))  # [B, T+1], a copy
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def _window_bytes(arr: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """uint8 [B, seq_len + 1]: arr[start : start + seq_len + 1] for each start (fancy indexing copies)."""
    idx = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]  # [B, T+1]
    return arr[idx]


def batch_for(corpus: Corpus, sample_ids: Sequence[int], seq_len: int) -> tuple[Tensor, Tensor]:
    """CPU LongTensors x, y [B, seq_len] for canonical sample ids (y is x shifted by one)."""
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)  # [B]
    n = n_samples(corpus, seq_len)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise IndexError(f"sample ids must be in [0, {n}); got min {ids.min()} max {ids.max()}")
    return _windows(corpus.train, ids * seq_len, seq_len)


EVAL_SET_VERSION = b"xdc-evalset-v1"


@dataclass(frozen=True, eq=False)
class EvalSet:
    """The fixed held-out windows every NLL of a run is measured on, and their identity."""

    windows: np.ndarray  # uint8 [N, seq_len + 1]: x is windows[:, :-1], y is windows[:, 1:]
    starts: np.ndarray  # int64 [N]: byte offsets into corpus.heldout
    seq_len: int
    eval_set_id: str  # sha256 hex of version, seq_len, N and the window bytes
    n_docs_covered: int  # held-out documents in which at least one window starts
    n_docs_heldout: int

    @property
    def n_windows(self) -> int:
        return int(self.windows.shape[0])

    @property
    def tokens(self) -> int:
        """Predicted positions scored per evaluation (N x seq_len)."""
        return self.n_windows * self.seq_len

    def tensors(self) -> tuple[Tensor, Tensor]:
        """CPU LongTensors x, y [N, seq_len]."""
        import torch

        win = torch.from_numpy(self.windows.astype(np.int64))
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def eval_starts(n_bytes: int, n_windows: int, seq_len: int) -> np.ndarray:
    """int64 [n_windows]: window starts spread evenly from 0 to the last full window (n_bytes - seq_len - 1),
    both ends included, so the windows sample the whole split in proportion to its bytes. Needs
    n_windows non-overlapping windows to fit (an honest sample, not repeated bytes)."""
    last = n_bytes - seq_len - 1  # the last start whose window (seq_len + 1 bytes) fits
    available = max(0, n_bytes - 1) // seq_len
    if n_windows < 1 or n_windows > available:
        raise ValueError(f"held-out split of {n_bytes} bytes has room for {available} windows of {seq_len}; "
                         f"eval_windows = {n_windows}")
    if n_windows == 1:
        return np.zeros(1, dtype=np.int64)
    return (np.arange(n_windows, dtype=np.int64) * last) // (n_windows - 1)


def eval_set(corpus: Corpus, cfg: DataConfig, seq_len: int) -> EvalSet:
    """The evaluation set of `cfg.eval_windows` windows over the held-out split (deterministic)."""
    starts = eval_starts(len(corpus.heldout), cfg.eval_windows, seq_len)
    win = _window_bytes(corpus.heldout, starts, seq_len)  # [N, T+1]
    h = hashlib.sha256(EVAL_SET_VERSION)
    h.update(seq_len.to_bytes(8, "little") + len(starts).to_bytes(8, "little") + win.tobytes())
    doc_of = np.searchsorted(np.flatnonzero(corpus.heldout == SEPARATOR[0]), starts)  # doc index per start
    return EvalSet(windows=win, starts=starts, seq_len=seq_len, eval_set_id=h.hexdigest(),
                   n_docs_covered=int(np.unique(doc_of).size), n_docs_heldout=corpus.n_docs_heldout)


def evaluate_windows(model: torch.nn.Module, x: Tensor, y: Tensor, device: torch.device, batch: int = 32) -> np.ndarray:
    """float64 [N]: each row's mean NLL in nats/token over x, y [N, T], in chunks of `batch` rows,
    without grad. The model is put in eval mode and restored to its previous mode afterwards."""
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for i in range(0, x.shape[0], batch):
                xb = x[i : i + batch].to(device)
                yb = y[i : i + batch].to(device)
                logits, _ = model(xb)  # [b, T, V]
                nll = F.cross_entropy(logits.transpose(1, 2), yb, reduction="none")  # [b, T]
                out.append(nll.double().mean(dim=1).cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def nll_stats(per_window: np.ndarray) -> tuple[float, float]:
    """(mean, standard error of the mean) over windows, nats/token. Every window has the same number
    of tokens, so the mean over windows is the mean over tokens."""
    n = len(per_window)
    mean = float(per_window.mean()) if n else float("nan")
    se = float(per_window.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return mean, se


def eval_fields(model: torch.nn.Module, es: EvalSet, x: Tensor, y: Tensor, device: torch.device) -> dict[str, object]:
    """What an `eval` span records: heldout_nll (mean, nats/token), its standard error over windows,
    the eval set's id, its size in tokens and the CPU seconds the evaluation took."""
    cpu0 = time.thread_time()  # this thread only: the leader evaluates in a background thread
    mean, se = nll_stats(evaluate_windows(model, x, y, device))
    return {"heldout_nll": mean, "heldout_nll_se": se, "eval_set": es.eval_set_id, "eval_tokens": es.tokens,
            "eval_cpu_s": time.thread_time() - cpu0}  # the evaluating thread's CPU time (not torch's pool threads)


def evaluate_nll(model: torch.nn.Module, x: Tensor, y: Tensor, device: torch.device, batch: int = 32) -> float:
    """Mean NLL in nats/token over all of x, y [N, T] (rows all have T tokens), without grad."""
    return nll_stats(evaluate_windows(model, x, y, device, batch))[0]
