"""The model every site trains: a tiny byte-level GPT, plus the helpers around it.

Role in xdc: each site process builds the same `TinyGPT` from `ModelConfig` and a seed
(`build_model`, bit-identical across processes), trains it, and exchanges gradients or
pseudo-gradients as one contiguous float32 buffer (`flat_params` / `flat_grads` and their
`load_*_` inverses). `params_hash` / `state_hash` fingerprint weights and optimizer state so
that sites and checkpoints can prove they hold the same numbers. `measure_flops_per_token`
measures (with torch's FlopCounterMode, not a formula) the training compute per token.

The model has no dropout and no other randomness in forward/backward, so runs are
deterministic given the data order. The lm head is TIED to the token embedding (the output
projection reuses `tok_emb.weight`), so it adds no parameters and appears once in
`named_parameters()`.
"""

from __future__ import annotations

import copy
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from ground.config import ModelConfig

INIT_STD = 0.02  # std of the normal init of weight matrices and embeddings (GPT-2 convention)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention via scaled_dot_product_attention(is_causal=True)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)  # [D] -> [3D] (q, k, v)
        self.proj = nn.Linear(d_model, d_model)  # residual projection

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape  # x: [B, T, D]
        q, k, v = self.qkv(x).split(d, dim=2)  # each [B, T, D]
        # -> [B, H, T, D/H]
        q = q.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
        k = k.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D/H]
        y = y.transpose(1, 2).contiguous().view(b, t, d)  # [B, T, D]
        return self.proj(y)


class MLP(nn.Module):
    """Position-wise GELU MLP with a 4x hidden width."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)  # residual projection

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))  # [B, T, D] -> [B, T, 4D] -> [B, T, D]


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Byte-level decoder-only transformer with learned positions and a tied lm head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # [V, D]; also the lm head
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)  # [T_max, D]
        self.blocks = nn.ModuleList([Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """idx, targets: int64 [B, T] with T <= seq_len. Returns logits [B, T, V] and the
        mean cross-entropy in nats/token (None without targets)."""
        b, t = idx.shape
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)  # [T]
        x = self.tok_emb(idx) + self.pos_emb(pos)  # [B, T, D]
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.tok_emb.weight)  # tied head: [B, T, D] @ [D, V] -> [B, T, V]
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(b * t, -1), targets.reshape(b * t))
        return logits, loss


def _init_weights_(model: TinyGPT, gen: torch.Generator) -> None:
    """GPT-2 style init from `gen`: N(0, 0.02) for matrices and embeddings, residual
    projections scaled by 1/sqrt(2 * n_layers), zero biases, LayerNorm weight 1 / bias 0."""
    resid_std = INIT_STD / math.sqrt(2 * model.cfg.n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)  # LayerNorm weight
            elif name.endswith("proj.weight"):
                p.normal_(0.0, resid_std, generator=gen)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)


def build_model(cfg: ModelConfig, seed: int) -> TinyGPT:
    """A TinyGPT on CPU whose weights depend only on (cfg, seed); the global RNG is untouched."""
    with torch.random.fork_rng(devices=[]):  # module constructors draw default inits; discard them
        model = TinyGPT(cfg)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    _init_weights_(model, gen)
    return model


def count_params(model: nn.Module) -> int:
    """Number of distinct parameters (the tied head is counted once)."""
    return sum(p.numel() for p in model.parameters())


def measure_flops_per_token(model: TinyGPT, cfg: ModelConfig, batch: int) -> float:
    """FLOPs of one forward + backward over a [batch, seq_len] batch, per token, as counted by
    FlopCounterMode (matmuls and attention; elementwise ops are not counted). Runs on a deep
    copy, so `model`'s parameters and grads are left untouched."""
    probe = copy.deepcopy(model)
    probe.zero_grad(set_to_none=True)
    device = next(probe.parameters()).device
    gen = torch.Generator(device="cpu")
    gen.manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen).to(device)  # [B, T]
    tgt = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen).to(device)  # [B, T]
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = probe(idx, tgt)
        assert loss is not None
        loss.backward()
    return counter.get_total_flops() / (batch * cfg.seq_len)


def _hash_tensor_into(h: "hashlib._Hash", name: str, t: Tensor) -> None:
    """Feed name bytes, dtype, shape and raw contiguous CPU bytes of `t` into `h`."""
    t = t.detach().cpu().contiguous()
    h.update(name.encode("utf-8") + b"\0")
    h.update(str(t.dtype).encode("ascii") + b"\0")
    h.update(repr(tuple(t.shape)).encode("ascii") + b"\0")
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()  # 1-D byte view works for 0-dim too
    h.update(len(raw).to_bytes(8, "little"))
    h.update(raw)


def params_hash(model: nn.Module) -> str:
    """sha256 hex over all parameters in named_parameters() order."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        _hash_tensor_into(h, name, p)
    return h.hexdigest()


def state_hash(tensors: dict[str, Tensor]) -> str:
    """sha256 hex over a dict of tensors in sorted-key order, same per-tensor rule as
    params_hash (e.g. for flattened optimizer state). Python numbers are hashed as tensors."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name]
        t = value if isinstance(value, Tensor) else torch.as_tensor(value)
        _hash_tensor_into(h, name, t)
    return h.hexdigest()


def _check_flat(model: nn.Module, flat: Tensor) -> None:
    n = count_params(model)
    if flat.dim() != 1 or flat.numel() != n:
        raise ValueError(f"flat buffer has shape {tuple(flat.shape)}, model needs ({n},)")


def flat_params(model: nn.Module) -> Tensor:
    """A new 1-D float32 CPU tensor [n_params] of all parameters in named_parameters() order."""
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for _, p in model.named_parameters()])


def load_flat_params_(model: nn.Module, flat: Tensor) -> None:
    """Copy a flat_params-layout buffer back into the parameters (in place)."""
    _check_flat(model, flat)
    offset = 0
    with torch.no_grad():
        for _, p in model.named_parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))  # copy_ casts dtype/device
            offset += n


def flat_grads(model: nn.Module) -> Tensor:
    """A new 1-D float32 CPU tensor [n_params] of all grads (zeros where a grad is None)."""
    parts = []
    for _, p in model.named_parameters():
        if p.grad is None:
            parts.append(torch.zeros(p.numel(), dtype=torch.float32))
        else:
            parts.append(p.grad.detach().reshape(-1).to("cpu", torch.float32))
    return torch.cat(parts)


def load_flat_grads_(model: nn.Module, flat: Tensor) -> None:
    """Set every parameter's .grad from a flat_grads-layout buffer (allocating where None)."""
    _check_flat(model, flat)
    offset = 0
    for _, p in model.named_parameters():
        n = p.numel()
        chunk = flat[offset : offset + n].view_as(p)
        if p.grad is None:
            p.grad = chunk.to(device=p.device, dtype=p.dtype).clone()
        else:
            p.grad.copy_(chunk)
        offset += n


def pick_device(pref: str) -> torch.device:
    """"auto" -> cuda when available else cpu; "cpu"/"cuda" are taken literally."""
    if pref == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if pref == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    if pref not in ("cpu", "cuda"):
        raise ValueError(f"unknown device preference {pref!r}; expected auto, cpu or cuda")
    return torch.device(pref)
