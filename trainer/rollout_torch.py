"""The torch rollout engine: the fallback for hosts where vLLM does not import.

Ancestral sampling with the fleet's own copy of the policy (a deep copy, changed only by
:meth:`TorchSampler.sync_weights`) and its own checkpointed ``torch.Generator``; the
transformers KV cache carries the prefix between tokens. Everything runs in the
caller's thread on the trainer's device, so its ``busy_s`` is the whole sampling loop.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from trainer.rollout import EngineStats, RolloutBatch
from trainer.task import EOS, PAD


class TorchSampler:
    """Implements :class:`trainer.rollout.RolloutEngine` with plain torch."""

    name = "torch"

    def __init__(self, policy: nn.Module, seed: int, device: str = "cpu") -> None:
        self.policy = copy.deepcopy(policy).eval()
        for p in self.policy.parameters():
            p.requires_grad_(False)
        self._version = 0
        self.device = device
        self.device_kind = "gpu" if str(device).startswith("cuda") else "cpu"
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @property
    def policy_version(self) -> int:
        return self._version

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        with torch.no_grad():
            for dst, src in zip(self.policy.parameters(), policy.parameters()):
                dst.copy_(src)
        self._version = version

    @torch.no_grad()
    def generate(
        self, prompts: torch.Tensor, n: int, max_new_tokens: int, temperature: float
    ) -> RolloutBatch:
        t0 = time.perf_counter()
        x = prompts.repeat_interleave(n, dim=0).to(self.device)
        b = x.shape[0]
        out = self.policy(input_ids=x, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        toks = torch.full((b, max_new_tokens), PAD, dtype=torch.long, device=self.device)
        lps = torch.zeros((b, max_new_tokens), device=self.device)
        mask = torch.zeros((b, max_new_tokens), device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        steps = 1
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
            live = ~done
            toks[:, t] = torch.where(live, nxt, torch.full_like(nxt, PAD))
            lps[:, t] = torch.where(live, logp.gather(1, nxt[:, None]).squeeze(1), 0.0)
            mask[:, t] = live.float()
            done = done | (nxt == EOS)
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            out = self.policy(input_ids=toks[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
            steps += 1
        wall = time.perf_counter() - t0
        stats = EngineStats(
            wall_s=wall, busy_s=wall, engine_steps=steps, tokens_generated=int(mask.sum())
        )
        return RolloutBatch(
            prompts=x.cpu(),
            completions=toks.cpu(),
            mask=mask.cpu(),
            logprobs=lps.cpu(),
            truncated=(~done).cpu(),
            policy_version=self._version,
            stats=stats,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": {k: v.clone() for k, v in self.policy.state_dict().items()},
            "policy_version": self._version,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["weights"])
        self._version = int(state["policy_version"])
        self.generator.set_state(state["generator"])

    def close(self) -> None:
        """Nothing to release: the sampler is plain tensors in this process."""
