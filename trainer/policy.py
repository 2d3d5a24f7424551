"""The policy: a small ``transformers`` ``LlamaForCausalLM`` over the task vocabulary.

Built from :class:`trainer.config.ModelConfig` (no hub download, no tokenizer: the task's
token ids are the model's ids), float32, no dropout: the only randomness in a run is
sampling, whose seeds are checkpointed. The same architecture is what vLLM serves
(:mod:`trainer.rollout_vllm` loads it from :func:`export_hf`'s directory).

Every sequence in a batch has the same prompt length (the task's prompts are fixed
length) and completions are right-padded, so causal attention needs no padding mask:
positions after a completion's EOS never influence the positions before it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from trainer.config import ModelConfig
from trainer.task import BOS, EOS, PAD

Policy = LlamaForCausalLM


def llama_config(vocab: int, cfg: ModelConfig) -> LlamaConfig:
    """The Hugging Face config of the policy (what vLLM reads from ``config.json``)."""
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.max_positions,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
        use_cache=False,
        torch_dtype="float32",
    )


def build_policy(vocab: int, cfg: ModelConfig, seed: int) -> Policy:
    """A freshly initialised policy; the same ``seed`` gives bitwise the same weights
    (in a forked RNG, so this does not disturb the global torch RNG)."""
    fork_devices: list[int] = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config(vocab, cfg))
    return model.float()


def logits_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, T, V]`` for the next token after each position of ``tokens``."""
    return model(input_ids=tokens, use_cache=False).logits


@torch.no_grad()
def greedy(model: nn.Module, prompts: torch.Tensor, max_new: int) -> torch.Tensor:
    """Greedy completions ``[B, max_new]`` (full recompute per token: sequences here are a
    dozen tokens long, where a KV cache saves nothing worth its bookkeeping)."""
    seq = prompts
    for _ in range(max_new):
        nxt = logits_of(model, seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, prompts.shape[1] :]


def warm_start(
    policy: Policy, cfg: ModelConfig, data: list[tuple[list[int], list[int]]], seed: int
) -> Policy:
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
        logp = torch.log_softmax(logits_of(policy, x[:, :-1]), -1)
        logp = logp.gather(2, x[:, 1:, None]).squeeze(2)
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return policy


def export_hf(model: Policy, directory: Path) -> Path:
    """Write the policy in Hugging Face layout (``config.json`` + safetensors): what vLLM
    loads at start. Returns ``directory``. No progress bar (a CLI's stderr is for lines)."""
    from transformers.utils import logging as hf_logging

    directory.mkdir(parents=True, exist_ok=True)
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(directory), safe_serialization=True)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
    return directory


def weights_hash(module: nn.Module) -> str:
    """sha256 over parameter names, dtypes, shapes and bytes: the KL-reference pin."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return "w-" + h.hexdigest()[:32]
