"""The trainer's configuration: one frozen pydantic model, loaded from YAML or JSON.

Everything that changes what a run *is* lives here, including the canary faults
(:class:`Faults`): a canary is a config switch, never a code edit. The resolved config is
stored with the run (``<run_dir>/config.json`` and the ``RunSubmitted`` event) so that
``runwatch resume --run-id R`` rebuilds the identical trainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from events.identity import Identifier

#: an Adam beta: a decay rate in [0, 1)
Beta = Annotated[float, Field(ge=0, lt=1)]


class _Frozen(BaseModel):
    """Every config part: immutable, unknown keys refused, no NaN or infinity anywhere.

    A config is a customer's input: each number is bounded here so that a value the trainer
    cannot run (``eval_every: 0``, ``temperature: 0``, ``ppo_epochs: 0``...) is refused at
    load, naming the field, instead of failing the run mid-way as a platform fault."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class TaskConfig(_Frozen):
    """A verifiable toy task over digit strings: the answer is exactly checkable.

    ``reverse``: ``1 2 3 -> 3 2 1``; ``copy``: ``1 2 3 -> 1 2 3``; ``add``: the first
    half plus the second half as numbers (``1 2 + 3 4 -> 4 6``, digits in ``base``).
    Every string of ``digits`` digits is an item; a fixed hash split puts
    ``heldout_percent`` of them in the held-out eval set the optimizer never sees.
    """

    kind: Literal["reverse", "copy", "add"] = "reverse"
    digits: int = Field(3, ge=1, le=8)
    base: int = Field(10, ge=2, le=10)
    heldout_percent: int = Field(20, ge=1, le=90)


class ModelConfig(_Frozen):
    """A small ``transformers`` ``LlamaForCausalLM`` built from this config (no downloaded
    weights, no tokenizer: the task's token ids are the model's vocabulary).

    ``hidden`` / ``heads`` is the attention head size; vLLM's CPU attention serves head
    sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 and 512 only (a config it cannot serve
    is refused when the run starts, naming the nearest setting it can; the torch sampler
    serves any). ``max_positions`` bounds prompt + completion length.

    ``warm_start_steps`` > 0 first trains the fresh policy supervised (teacher forcing on
    the train split, seeded, deterministic) for that many Adam steps at ``warm_start_lr``:
    the run's *base model*, which is also the frozen KL reference. A peaked reference is
    what makes KL-to-reference meaningful (against a near-uniform random init, KL is
    capped near log(vocab) whatever the policy does).
    """

    hidden: int = Field(64, ge=8)
    heads: int = Field(2, ge=1)
    layers: int = Field(2, ge=1, le=8)
    intermediate: int = Field(128, ge=8)
    max_positions: int = Field(32, ge=8, le=512)
    warm_start_steps: int = Field(25, ge=0)
    warm_start_lr: float = Field(3e-3, gt=0)
    warm_start_batch: int = Field(64, ge=1)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelConfig:
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden {self.hidden} is not a multiple of heads {self.heads}")
        return self


class GrpoConfig(_Frozen):
    prompts_per_step: int = Field(32, ge=1)
    #: completions per prompt; the advantage is relative to the group, so at least 2
    group_size: int = Field(8, ge=2)
    lr: float = Field(1e-3, gt=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = Field(5, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    kl_coef: float = Field(0.6, ge=0)
    clip_eps: float = Field(0.2, gt=0)
    ppo_epochs: int = Field(2, ge=1)
    grad_clip: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(0, ge=0)  # 0: answer length + 2
    adam_betas: tuple[Beta, Beta] = (0.9, 0.99)


class RewardConfig(_Frozen):
    """The reward the optimizer trains on.

    ``exact_match`` is 1 for an exactly right answer else 0; ``partial`` adds partial
    credit (0.5 x fraction of correct positions) below an exact match, which makes the
    sparse exact-match signal learnable from scratch in seconds; ``sandbox`` runs the
    tenant's reward function file through :mod:`sandbox.client`. The eval gate always
    scores held-out exact match, whatever this says.
    """

    kind: Literal["exact_match", "partial", "sandbox"] = "partial"
    sandbox_path: str | None = None
    #: Wall-clock deadline per batch in the sandbox (the tenant's contract).
    sandbox_deadline_s: float = Field(10.0, gt=0, le=600)
    #: Batches the sandbox's failure policy may skip within one step before the run
    #: fails (each skip draws fresh prompts; nothing is trained on an unscored batch).
    max_skips_per_step: int = Field(3, ge=0)
    #: Canary probes (seed 002): every sandbox batch carries one more GRPO group of
    #: known-wrong answers, scored by the tenant's code and never trained on; every this
    #: many batches the probes since the last verdict are judged, and the verdict's
    #: ``CanaryProbeScored`` feeds the reward-integrity detector. 0: no probes.
    canary_every: int = Field(5, ge=0)
    #: How far above the probes' reference (0) their mean may score before the batch's
    #: probes are called inflated.
    canary_tolerance: float = Field(0.25, ge=0)

    @model_validator(mode="after")
    def _sandbox_needs_path(self) -> RewardConfig:
        if self.kind == "sandbox" and not self.sandbox_path:
            raise ValueError("reward.kind 'sandbox' needs reward.sandbox_path")
        return self


class Faults(_Frozen):
    """Canary faults (seed 000): each one must make a run-health alert fire.

    - ``constant_reward``: every completion scores this value (dead run: flat reward/KL).
    - ``lr_multiplier``: the optimizer LR times this (KL blowup, entropy collapse).
    - ``gameable_reward``: the reward pays for emitting ``gameable_token`` (any position),
      plus ``gameable_bonus`` per occurrence; diverges from held-out exact match (the
      hacking signature).
    - ``freeze_weight_sync_after``: from this step on the rollout policy is no longer
      updated; ``policy_version`` stops while trainer steps go on (staleness).
    """

    constant_reward: float | None = None
    lr_multiplier: float = Field(1.0, gt=0)
    gameable_reward: bool = False
    gameable_token: int = Field(7, ge=0)
    gameable_bonus: float = 1.0
    freeze_weight_sync_after: int | None = Field(None, ge=0)


class EngineConfig(_Frozen):
    """The vLLM rollout engine's settings (the torch sampler has none of these).

    - ``kv_cache_mb``: KV-cache memory the engine reserves (vLLM's ``kv_cache_memory_bytes``);
      a batch that does not fit waits in the engine's queue or is preempted, which the
      per-batch telemetry reports.
    - ``max_num_seqs``: sequences the engine runs at once; the rest of a batch waits in its
      queue (the queue depth the telemetry reports).
    - ``process``: ``inline`` runs the engine core in the trainer's process (start ~3 s);
      ``separate`` runs it in a process of its own (start ~16 s): a crash of that process
      is an engine crash the trainer outlives and reports as a platform fault.
    - ``compile_sampler``: let vLLM ``torch.compile`` its log-prob gather. Off by default:
      compiling costs ~3 s of CPU per process for a tiny policy and gives the same values.
    """

    kv_cache_mb: int = Field(64, ge=1)
    max_num_seqs: int = Field(512, ge=1)
    process: Literal["inline", "separate"] = "inline"
    compile_sampler: bool = False


class CheckpointConfig(_Frozen):
    every: int = Field(10, ge=1)
    keep: int = Field(5, ge=1)
    #: Also checkpoint the starting state (step 0): a run can then be rolled back to its
    #: very start on resume (``rollback_to_step: 0``) without retraining its warm start.
    at_start: bool = False
    #: Sentinel digest per part: crc32 (default: detects corruption at <2 % of the save)
    #: or sha256 (see trainer/checkpoint.py for why not sha256 by default).
    digest: Literal["crc32", "sha256"] = "crc32"


class ResumeConfig(_Frozen):
    """The resume gate's reproducibility tier (seed 001 step 5).

    ``bitwise``: tolerance 0, deterministic algorithms, one thread. ``statistical``:
    deviation measured in units of each metric's own step-to-step noise; certify while it
    stays within ``band_k`` of it.
    """

    tier: Literal["bitwise", "statistical"] = "bitwise"
    band_k: float = Field(4.0, gt=0)
    #: On-policy runs keep no rollouts older than the restored policy (0); an async run
    #: would allow a bounded lag.
    max_staleness: int = Field(0, ge=0)


class TrainerConfig(_Frozen):
    #: the run's identity on every event (``events.identity.check_id``: refused here, at
    #: load, rather than at the first event)
    run_id: Identifier = "run-1"
    tenant_id: Identifier = "tenant-a"
    seed: int = 0
    steps: int = Field(100, ge=1)
    eval_every: int = Field(10, ge=1)
    eval_items: int = Field(200, ge=1)
    threads: int = Field(1, ge=1)
    device: str = "cpu"
    #: ``auto``: vLLM wherever it imports, else the torch sampler (the run's resolved engine
    #: is pinned: a resume on another engine is refused).
    rollout_backend: Literal["torch", "vllm", "auto"] = "auto"
    engine: EngineConfig = EngineConfig()
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    grpo: GrpoConfig = GrpoConfig()
    reward: RewardConfig = RewardConfig()
    faults: Faults = Faults()
    checkpoint: CheckpointConfig = CheckpointConfig()
    resume: ResumeConfig = ResumeConfig()
    #: Where checkpoints and the config snapshot live; ``None``: ``<runs_dir>/<run_id>``.
    run_dir: str | None = None

    def with_overrides(self, **kw: Any) -> TrainerConfig:
        return self.model_validate({**self.model_dump(), **kw})


def load_config(path: str | Path, **overrides: Any) -> TrainerConfig:
    """Read a YAML or JSON config file; ``overrides`` replace top-level keys.

    A clear ``ValueError`` names the file on a missing file or invalid content.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read config {p}: {exc.strerror or exc}") from None
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"config {p} is not valid YAML: {exc}") from None
    else:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"config {p} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"config {p} must be a mapping at the top level")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"config {p} is invalid: {describe_errors(exc)}") from None
    except Exception as exc:
        raise ValueError(f"config {p} is invalid: {exc}") from None


def describe_errors(exc: ValidationError) -> str:
    """One ``field.path: message (got value)`` per problem, joined by ``; ``."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(x) for x in err["loc"]) or "config"
        got = f" (got {err['input']!r})" if err["type"] != "missing" else ""
        parts.append(f"{where}: {err['msg']}{got}"[:300])
    return "; ".join(parts)
