"""The policy: a small GRU language model over the task vocabulary, from scratch.

``forward`` scores whole sequences (training); ``prefill``/``decode_step`` carry the
hidden state for autoregressive sampling (rollouts, eval). No dropout: the only
randomness in a run is sampling, whose generator is checkpointed.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from trainer.config import ModelConfig


class GruPolicy(nn.Module):
    def __init__(self, vocab: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.embed)
        self.gru = nn.GRU(cfg.embed, cfg.hidden, num_layers=cfg.layers, batch_first=True)
        self.head = nn.Linear(cfg.hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` for the next token after each position of ``tokens``."""
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)

    def prefill(self, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt; returns the next-token logits ``[B, V]`` and the hidden state."""
        out, h = self.gru(self.embed(prompts))
        return self.head(out[:, -1]), h

    def decode_step(
        self, token: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = self.gru(self.embed(token[:, None]), h)
        return self.head(out[:, -1]), h


def build_policy(vocab: int, cfg: ModelConfig, seed: int) -> GruPolicy:
    """A freshly initialised policy; the same ``seed`` gives bitwise the same weights
    (its own generator, so this does not disturb the global torch RNG)."""
    fork_devices: list[int] = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        return GruPolicy(vocab, cfg)


def warm_start(
    policy: GruPolicy, cfg: ModelConfig, data: list[tuple[list[int], list[int]]], seed: int
) -> GruPolicy:
    """Supervised warm start (the base model): teacher forcing on (prompt, answer+EOS)
    pairs, ``cfg.warm_start_steps`` Adam steps of ``cfg.warm_start_batch`` pairs drawn
    with a generator seeded by ``seed``. Deterministic for a given seed and data."""
    if cfg.warm_start_steps <= 0:
        return policy
    gen = torch.Generator().manual_seed(seed)
    width = max(len(p) + len(a) for p, a in data)
    seqs = torch.zeros((len(data), width), dtype=torch.long)
    lmask = torch.zeros((len(data), width - 1))
    for i, (p, a) in enumerate(data):
        seqs[i, : len(p) + len(a)] = torch.tensor(p + a)
        lmask[i, len(p) - 1 : len(p) + len(a) - 1] = 1.0
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.warm_start_lr)
    for _ in range(cfg.warm_start_steps):
        idx = torch.randint(0, len(data), (cfg.warm_start_batch,), generator=gen)
        x, m = seqs[idx], lmask[idx]
        logp = torch.log_softmax(policy(x[:, :-1]), -1).gather(2, x[:, 1:, None]).squeeze(2)
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return policy


def weights_hash(module: nn.Module) -> str:
    """sha256 over parameter names, dtypes, shapes and bytes: the KL-reference pin."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return "w-" + h.hexdigest()[:32]
