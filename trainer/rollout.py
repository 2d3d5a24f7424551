"""Rollouts: what the trainer asks of a rollout engine, and what it gets back.

:class:`RolloutEngine` is what the trainer talks to: it holds the *rollout fleet's* copy
of the policy (which lags the trainer's by design: it only changes on
:meth:`RolloutEngine.sync_weights`), generates ``n`` completions per prompt and reports
the behaviour log-probabilities, the ``policy_version`` that produced them and what it
measured doing so (:class:`EngineStats`). Two implementations, picked by
:func:`trainer.engines.make_engine`:

- :class:`trainer.rollout_vllm.VllmEngine`: vLLM (the default wherever ``vllm`` imports);
- :class:`trainer.rollout_torch.TorchSampler`: plain torch sampling (the fallback).

This module defines the shared types only and imports neither implementation (they
import it), so there is no import cycle between the engines and their interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@dataclass(frozen=True)
class EngineStats:
    """What an engine measured while generating one batch.

    Time semantics: ``busy_s`` is the engine's own compute for the batch (vLLM: the
    wall time inside its engine steps; torch: the sampling loop); ``wall_s`` is the
    engine call from the request to the finished batch, so ``wall_s - busy_s`` is the time
    the caller waited on the engine while it was not computing the batch (request
    hand-off, queueing, assembling the results). Counts are per batch; ``None`` means the
    engine does not report that quantity (the torch sampler has no queue, no paged KV
    cache and never preempts).
    """

    wall_s: float
    busy_s: float
    engine_steps: int
    tokens_generated: int
    queue_depth_max: int | None = None
    queue_depth_mean: float | None = None
    running_max: int | None = None
    kv_cache_usage_max: float | None = None
    preemptions: int | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_generated / self.busy_s if self.busy_s > 0 else 0.0


@dataclass
class RolloutBatch:
    """One batch of generations. ``completions`` is right-padded with ``PAD`` after EOS;
    ``mask`` is 1 on generated tokens (EOS included); ``logprobs`` are the behaviour
    policy's log-probabilities of those tokens, as the engine computed them."""

    prompts: torch.Tensor  # [B, Lp] long
    completions: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T] float
    logprobs: torch.Tensor  # [B, T] float
    truncated: torch.Tensor  # [B] bool: hit max_new_tokens without EOS
    policy_version: int
    item_indices: list[int] = field(default_factory=list)
    generated_at_step: int = 0
    #: measured by the engine while generating (not checkpointed: a restored batch was
    #: measured when it was made)
    stats: EngineStats | None = None

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
    """A rollout fleet of one engine. ``device_kind`` is what its compute is billed as
    (``cpu`` or ``gpu``)."""

    name: str
    device_kind: str

    @property
    def policy_version(self) -> int:
        """The weight version the engine serves, read back from the engine."""

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        """Make the fleet serve ``policy``'s current weights as ``version``, in place."""

    def generate(
        self, prompts: torch.Tensor, n: int, max_new_tokens: int, temperature: float
    ) -> RolloutBatch:
        """``n`` completions for every prompt row (rows repeated in place, group-major)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Release the engine (idempotent)."""


class RolloutUnavailable(RuntimeError):
    """The requested rollout backend cannot run here (missing package, unservable policy)."""


class RolloutEngineFailed(RuntimeError):
    """The rollout engine died or failed mid-run: a platform fault, never the tenant's."""

    failure_class = "platform_fault"
