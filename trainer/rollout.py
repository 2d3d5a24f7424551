"""Rollouts behind one interface, two implementations.

:class:`RolloutEngine` is what the trainer talks to: it holds the *rollout fleet's* copy
of the policy (which lags the trainer's by design: it only changes on
:meth:`RolloutEngine.sync_weights`), generates ``n`` completions per prompt and reports
the behaviour log-probabilities and the ``policy_version`` that produced them.

- :class:`TorchSampler` (default, CPU or CUDA): plain torch sampling with its own
  checkpointed ``torch.Generator``.
- :class:`trainer.rollout_vllm.VllmEngine`: used when ``vllm`` imports and a GPU is
  present (optional extra ``runwatch[vllm]``); see that module.

:func:`make_engine` picks one from ``rollout_backend`` (``torch`` | ``vllm`` | ``auto``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from trainer.policy import GruPolicy
from trainer.task import EOS, PAD


@dataclass
class RolloutBatch:
    """One batch of generations. ``completions`` is right-padded with ``PAD`` after EOS;
    ``mask`` is 1 on generated tokens (EOS included); ``logprobs`` are the behaviour
    policy's log-probabilities of those tokens."""

    prompts: torch.Tensor  # [B, Lp] long
    completions: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T] float
    logprobs: torch.Tensor  # [B, T] float
    truncated: torch.Tensor  # [B] bool: hit max_new_tokens without EOS
    policy_version: int
    item_indices: list[int] = field(default_factory=list)
    generated_at_step: int = 0
    compute_s: float = 0.0

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(dim=1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "completions": self.completions,
            "mask": self.mask,
            "logprobs": self.logprobs,
            "truncated": self.truncated,
            "policy_version": self.policy_version,
            "item_indices": list(self.item_indices),
            "generated_at_step": self.generated_at_step,
        }

    @classmethod
    def from_state_dict(cls, s: dict[str, Any]) -> RolloutBatch:
        return cls(
            prompts=s["prompts"],
            completions=s["completions"],
            mask=s["mask"],
            logprobs=s["logprobs"],
            truncated=s["truncated"],
            policy_version=int(s["policy_version"]),
            item_indices=[int(i) for i in s["item_indices"]],
            generated_at_step=int(s["generated_at_step"]),
        )


@runtime_checkable
class RolloutEngine(Protocol):
    name: str
    policy_version: int

    def sync_weights(self, policy: GruPolicy, version: int) -> None:
        """Make the fleet serve ``policy``'s current weights as ``version``."""

    def generate(
        self, prompts: torch.Tensor, n: int, max_new_tokens: int, temperature: float
    ) -> RolloutBatch:
        """``n`` completions for every prompt row (rows repeated in place, group-major)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TorchSampler:
    """Ancestral sampling with the fleet's own copy of the policy and generator."""

    name = "torch"

    def __init__(self, policy: GruPolicy, seed: int, device: str = "cpu") -> None:
        self.policy = copy.deepcopy(policy).eval()
        for p in self.policy.parameters():
            p.requires_grad_(False)
        self.policy_version = 0
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def sync_weights(self, policy: GruPolicy, version: int) -> None:
        with torch.no_grad():
            for dst, src in zip(self.policy.parameters(), policy.parameters()):
                dst.copy_(src)
        self.policy_version = version

    @torch.no_grad()
    def generate(
        self, prompts: torch.Tensor, n: int, max_new_tokens: int, temperature: float
    ) -> RolloutBatch:
        x = prompts.repeat_interleave(n, dim=0).to(self.device)
        b = x.shape[0]
        logits, h = self.policy.prefill(x)
        toks = torch.full((b, max_new_tokens), PAD, dtype=torch.long, device=self.device)
        lps = torch.zeros((b, max_new_tokens), device=self.device)
        mask = torch.zeros((b, max_new_tokens), device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
            live = ~done
            toks[:, t] = torch.where(live, nxt, torch.full_like(nxt, PAD))
            lps[:, t] = torch.where(live, logp.gather(1, nxt[:, None]).squeeze(1), 0.0)
            mask[:, t] = live.float()
            done = done | (nxt == EOS)
            if bool(done.all()):
                break
            logits, h = self.policy.decode_step(toks[:, t], h)
        return RolloutBatch(
            prompts=x.cpu(),
            completions=toks.cpu(),
            mask=mask.cpu(),
            logprobs=lps.cpu(),
            truncated=(~done).cpu(),
            policy_version=self.policy_version,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": {k: v.clone() for k, v in self.policy.state_dict().items()},
            "policy_version": self.policy_version,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["weights"])
        self.policy_version = int(state["policy_version"])
        self.generator.set_state(state["generator"])


class RolloutUnavailable(RuntimeError):
    """The requested rollout backend cannot run here (missing package or GPU)."""


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


def make_engine(backend: str, policy: GruPolicy, seed: int, device: str) -> RolloutEngine:
    """The engine for ``backend``: ``torch``; ``vllm`` (raises :class:`RolloutUnavailable`
    when it cannot run here); ``auto`` (vllm when it can run, else torch)."""
    if backend == "vllm" or (backend == "auto" and vllm_available()):
        from trainer.rollout_vllm import VllmEngine

        try:
            return VllmEngine.create(policy, seed)
        except RolloutUnavailable:
            if backend == "vllm":
                raise
    return TorchSampler(policy, seed, device)
