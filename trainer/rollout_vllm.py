"""The vLLM rollout engine: the second implementation of :class:`RolloutEngine`.

Status: an integration point, not a working engine yet. vLLM serves transformer
checkpoints in Hugging Face layout; the trainer's policy is a GRU (:mod:`trainer.policy`),
which vLLM has no model class for. Serving it needs a transformer policy architecture
exported as a HF checkpoint (e.g. a tiny ``LlamaForCausalLM`` built from scratch), then:

- ``create``: export the policy to a temp dir, ``vllm.LLM(model=dir, dtype="float32",
  seed=seed, enforce_eager=True)``;
- ``generate``: ``TokensPrompt(prompt_token_ids=...)`` per row, ``SamplingParams(n=n,
  max_tokens=max_new_tokens, temperature=temperature, logprobs=0,
  stop_token_ids=[EOS])``; behaviour log-probs from each output's ``logprobs``;
- ``sync_weights``: push the trainer's state dict into the engine's model
  (``load_weights``) and bump ``policy_version``; ``WeightSyncCompleted`` is published
  by the trainer as for the torch sampler.

:func:`trainer.rollout.make_engine` only reaches this module for ``rollout_backend:
vllm`` or for ``auto`` when vllm imports and a GPU is present; until the transformer
policy exists it refuses with :class:`RolloutUnavailable` naming why, so ``auto`` is
safe (it falls back to torch, see :func:`trainer.rollout.make_engine`).
"""

from __future__ import annotations

from trainer.policy import GruPolicy
from trainer.rollout import RolloutEngine, RolloutUnavailable, vllm_available


class VllmEngine:
    name = "vllm"

    @classmethod
    def create(cls, policy: GruPolicy, seed: int) -> RolloutEngine:
        if not vllm_available():
            raise RolloutUnavailable(
                "rollout_backend 'vllm' needs the optional extra (pip install runwatch[vllm]) "
                "and a CUDA GPU; use rollout_backend 'torch' or 'auto'"
            )
        raise RolloutUnavailable(
            "vLLM cannot serve the GRU policy (no vLLM model class); a transformer policy "
            "exported in Hugging Face layout is required (see trainer/rollout_vllm.py)"
        )
