"""The GRPO trainer: rollouts, scoring, group-normalised advantages, a clipped objective
with a KL penalty to a frozen reference, weight sync, eval gate, checkpoints, events.

One trainer step ``s`` (1-based) is::

    rollout   the fleet (policy version v) samples G completions for P train prompts
    score     reward per completion; advantages (r - group mean) / (group std + eps)
    optim     ppo_epochs passes of the clipped surrogate + kl_coef * KL(k3) to the
              reference, token-mean; grad-norm clip; Adam; the LR scheduler steps once
    sync      the fleet loads the trainer's weights as policy version s (unless the
              frozen-sync canary is on)

Determinism: all sampling draws from the rollout engine's own generator and the
sampler's numpy generator, both checkpointed; with ``resume.tier == 'bitwise'`` torch runs
deterministic algorithms on ``threads`` threads, so a replay from a checkpoint
reproduces the recorded metrics exactly, on the CPU and on CUDA (measured on an H200:
kill -9 and resume certified bitwise, ``tests/integration/test_trainer_cuda.py``). Older
PyTorch releases also need cuBLAS's fixed workspace
(:func:`trainer.device.deterministic_cuda`).

Time semantics of :class:`StepPhaseTimed`: ``wall_s`` runs from the previous step's cut
to this step's cut (so the previous step's checkpoint and event flush are in this
step's ``other_s``); the named phases are timed individually and their sum is compared
to ``wall_s`` in the benchmark, not forced equal. ``rollout_s`` is the engine's own
compute for the batch (its :class:`~trainer.rollout.EngineStats` ``busy_s``); ``idle_s``
is the rest of the time the trainer was blocked waiting for the batch (measured: the
trainer's wall-clock wait minus the engine's compute), i.e. hand-off, queueing and
result assembly. The engine runs on the trainer's own device here (colocated,
synchronous), so its compute is a phase of the step, not trainer idle time.

Rollout-vs-train mismatch: on the first optimisation epoch the trainer recomputes the
log-probs of the sampled tokens under the weights the engine was synced to; their
difference to the engine's behaviour log-probs (mean and max ``|Δlogp|``) and the
importance weights ``exp(Δlogp)`` (mean, min, max) are published on
``RolloutBatchCompleted``. A frozen weight sync shows up there as a growing mismatch.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from events.catalog.checkpoint import CheckpointWritten
from events.catalog.control import (
    CancelRequested,
    CommandRejected,
    PauseRequested,
    UnpauseRequested,
)
from events.catalog.eval import EvalGateScored
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunProvisioning,
    RunQueued,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.catalog.rollout import RolloutBatchCompleted
from events.catalog.trainer import (
    STEP_METRICS,
    StepPhaseTimed,
    TrainerStepCompleted,
    WeightSyncCompleted,
)
from events.catalog.usage import UsageRecorded
from producers.commands import (
    CommandFeed,
    first_cancel,
    held_over,
    stale_resume,
)
from producers.emitter import Emitter
from trainer import checkpoint as ckpt
from trainer.config import TrainerConfig
from trainer.device import check_device, deterministic_cuda
from trainer.engines import check_servable, engine_pin, make_engine, resolve_backend
from trainer.policy import build_policy, greedy, logits_of, warm_start, weights_hash
from trainer.rewards import RewardFn, RewardUnavailable, parse
from trainer.settings import resume_settings
from trainer.state import RngStreams, RolloutBuffer, RunningMoments
from trainer.task import EOS, Dataset, dataset_revision, max_answer_len, vocab_size

#: TrainerStepCompleted fields the resume gate compares (plus every ``extra`` entry).
METRIC_FIELDS = (*STEP_METRICS, "tokens_trained")


@dataclass
class StepRecord:
    """What one step measured: the metrics (TrainerStepCompleted payload) and the rest."""

    step: int
    metrics: dict[str, Any]
    rollout: dict[str, Any]
    phases: dict[str, float]
    policy_version: int
    eval_score: float | None = None
    extra_events: list[Any] = field(default_factory=list)
    #: False when the weights were not pushed this step (the frozen-sync canary)
    synced: bool = True


def _mismatch(lp: torch.Tensor, old_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Rollout-vs-train mismatch over the generated tokens: ``|Δlogp|`` between the
    trainer's recomputed log-probs ``lp`` and the engine's behaviour log-probs ``old_lp``,
    and the importance weights ``exp(lp - old_lp)``."""
    with torch.no_grad():
        on = mask > 0
        d = (lp - old_lp)[on].double()
        if d.numel() == 0:
            return {}
        iw = d.exp()
        return {
            "logprob_abs_diff_mean": float(d.abs().mean()),
            "logprob_abs_diff_max": float(d.abs().max()),
            "importance_weight_mean": float(iw.mean()),
            "importance_weight_min": float(iw.min()),
            "importance_weight_max": float(iw.max()),
        }


def _engine_fields(batch: Any) -> dict[str, Any]:
    """The engine's measurements of a batch, as ``RolloutBatchCompleted`` fields (none for
    a batch restored from a checkpoint: it was measured when it was made)."""
    st = batch.stats
    if st is None:
        return {}
    return {
        "engine_steps": st.engine_steps,
        "engine_busy_s": st.busy_s,
        "tokens_per_s": st.tokens_per_s,
        "queue_depth_max": st.queue_depth_max,
        "queue_depth_mean": st.queue_depth_mean,
        "running_max": st.running_max,
        "kv_cache_usage_max": st.kv_cache_usage_max,
        "preemptions": st.preemptions,
    }


def _lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    g = cfg.grpo

    def f(i: int) -> float:
        if i < g.warmup_steps:
            return (i + 1) / g.warmup_steps
        if g.lr_schedule == "constant":
            return 1.0
        span = max(1, cfg.steps - g.warmup_steps)
        prog = min(1.0, (i - g.warmup_steps) / span)
        return g.min_lr_ratio + (1 - g.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    return f


class _Progress:
    """Stateful step counter."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class Trainer:
    """One run's whole trainer state, composed of Stateful parts (:meth:`parts`)."""

    def __init__(
        self,
        cfg: TrainerConfig,
        run_dir: Path,
        emitter: Emitter | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.emitter = emitter
        self.say = progress or (lambda _m: None)
        torch.set_num_threads(cfg.threads)
        self.device = check_device(cfg.device)  # DeviceUnavailable before anything is built
        if cfg.resume.tier == "bitwise":
            if self.device.type == "cuda":
                deterministic_cuda()
            torch.use_deterministic_algorithms(True)
        check_servable(cfg)  # refuse an unservable policy before building anything
        self.backend = resolve_backend(cfg)
        self.dataset = Dataset.build(cfg.task)
        vocab = vocab_size(cfg.task)
        self.rng = RngStreams()
        self.rng.seed(cfg.seed)
        self.policy = self._base_model(vocab).to(self.device)
        self.reference = copy.deepcopy(self.policy).eval()
        for p in self.reference.parameters():
            p.requires_grad_(False)
        g = cfg.grpo
        self.optimizer = torch.optim.Adam(
            self.policy.parameters(), lr=g.lr * cfg.faults.lr_multiplier, betas=g.adam_betas
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg))
        from trainer.task import PromptSampler

        self.sampler = PromptSampler(len(self.dataset.train), cfg.seed + 1)
        self.engine = make_engine(cfg, self.policy, vocab, cfg.seed + 2)
        self.buffer = RolloutBuffer()
        self.normalizer = RunningMoments()
        self.progress = _Progress()
        self.reward = RewardFn(cfg, self.dataset)
        self.max_new = g.max_new_tokens or max_answer_len(cfg.task) + 2
        #: the last optimisation's rollout-vs-train mismatch (see the module docstring)
        self._mismatch: dict[str, float] = {}
        self.pins = {
            "reward_fn": self.reward.digest(),
            "kl_reference": weights_hash(self.reference),
            "dataset": dataset_revision(self.dataset),
            "rollout_engine": engine_pin(self.backend),
        }
        self._last_cut = time.perf_counter()
        self._carry_other = 0.0
        #: This run's commands (``runwatch.control``); None: the trainer follows none.
        self.commands: CommandFeed | None = None
        #: commands polled and not acted on yet, oldest first (see :meth:`follow_commands`)
        self.commands_due: deque[Any] = deque()
        #: the id of the pause in effect when a restarted trainer began (it holds it
        #: again: :func:`producers.commands.pause_in_effect`); None: not paused
        self.pause_in_effect: str | None = None
        self.poll_interval_s = 0.05
        self.cancelled = False
        self.paused_s = 0.0  # wall time spent paused (not billed, not a step's time)
        #: the event id of this run's ``RunSubmitted`` (set by :meth:`start`, or by the
        #: resume gate from the log), recorded in every checkpoint; None: unknown
        self.submitted_id: str | None = None
        #: the settings resumes put in effect (``lr``, ``kl_coef``; :mod:`trainer.settings`)
        self.resume_settings: dict[str, float] = {}

    @property
    def trainer_device_kind(self) -> str:
        """What the trainer's own compute is billed as."""
        return "gpu" if self.device.type == "cuda" else "cpu"

    def _base_model(self, vocab: int) -> torch.nn.Module:
        """The seeded base model (random init, then the optional supervised warm start).
        Built in a forked RNG so it never disturbs the run's global streams."""
        ds = self.dataset
        data = [(ds.prompt_tokens(it), [*ds.answer_tokens(it), EOS]) for it in ds.train]
        with torch.random.fork_rng(devices=[]):
            policy = build_policy(vocab, self.cfg.model, self.cfg.seed)
            return warm_start(policy, self.cfg.model, data, self.cfg.seed + 17)

    # -- state ---------------------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.progress.step

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def parts(self) -> dict[str, Any]:
        """Seed 001's whole state inventory, one Stateful per part."""
        return {
            "model": self.policy,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "rng": self.rng,
            "sampler": self.sampler,
            "rollout_engine": self.engine,
            "rollout_buffer": self.buffer,
            "kl_reference": self.reference,
            "normalizers": self.normalizer,
            "progress": self.progress,
        }

    def load_parts(self, parts: dict[str, Any]) -> None:
        """Load every part in place. Raises ``KeyError`` naming a part that is absent."""
        mine = self.parts()
        missing = sorted(set(mine) - set(parts))
        if missing:
            raise KeyError(f"checkpoint lacks part(s): {', '.join(missing)}")
        for name, target in mine.items():
            target.load_state_dict(parts[name])

    # -- one step ------------------------------------------------------------------------

    def train_step(self) -> StepRecord:
        """Run step ``self.step + 1``; changes state, publishes nothing."""
        cfg, g, ds = self.cfg, self.cfg.grpo, self.dataset
        s = self.step + 1
        rollout_s = idle_s = score_s = 0.0
        for attempt in range(cfg.reward.max_skips_per_step + 1):
            ta = time.perf_counter()
            batch = self.buffer.pop()
            if batch is None:
                idx = self.sampler.next_indices(g.prompts_per_step)
                prompts = torch.tensor([ds.prompt_tokens(ds.train[i]) for i in idx])
                batch = self.engine.generate(prompts, g.group_size, self.max_new, g.temperature)
                batch.item_indices = [i for i in idx for _ in range(g.group_size)]
                batch.generated_at_step = s
            tb = time.perf_counter()
            busy = batch.stats.busy_s if batch.stats is not None else 0.0
            rollout_s += busy
            idle_s += max(0.0, (tb - ta) - busy)
            items = [ds.train[i] for i in batch.item_indices]
            comps = batch.completions.tolist()
            try:
                scores = self.reward.score(items, comps, step=s)
            except RewardUnavailable as exc:
                score_s += time.perf_counter() - tb
                if exc.action != "skip" or attempt == cfg.reward.max_skips_per_step:
                    raise
                self.say(f"step {s}: reward batch skipped ({exc}); drawing fresh prompts")
                continue
            rewards = torch.tensor(scores, dtype=torch.float32)
            break
        t1 = time.perf_counter()
        r = rewards.view(-1, g.group_size)
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True, unbiased=False) + 1e-6)
        adv = adv.flatten()
        self.normalizer.update(rewards)
        parsed = [parse(c) for c in comps]
        t2 = time.perf_counter()
        score_s += t2 - t1

        m = self._optimize(batch, adv)
        t3 = time.perf_counter()

        frozen = cfg.faults.freeze_weight_sync_after
        synced = frozen is None or s <= frozen
        if synced:  # the frozen-sync canary really does not push the weights
            self.engine.sync_weights(self.policy, s)
        served = self.engine.policy_version  # read back from the engine
        t4 = time.perf_counter()
        self.progress.step = s

        lengths = batch.lengths
        tokens_generated = int(lengths.sum().item())
        metrics = {
            "reward_mean": float(rewards.mean().item()),
            "reward_std": float(rewards.std(unbiased=False).item()),
            "advantage_mean": float(adv.mean().item()),
            "advantage_std": float(adv.std(unbiased=False).item()),
            **m,
            "extra": {
                "reward_running_mean": self.normalizer.mean,
                "reward_running_std": self.normalizer.std,
                "rollout_policy_version": batch.policy_version,
                "sampler_epoch": self.sampler.epoch,
            },
        }
        rollout = {
            "policy_version": batch.policy_version,
            "num_sequences": int(batch.completions.shape[0]),
            "mean_length": float(lengths.float().mean().item()),
            "max_length": int(lengths.max().item()),
            "truncation_rate": float(batch.truncated.float().mean().item()),
            "unparseable_rate": sum(p.digits is None for p in parsed) / len(parsed),
            "tokens_generated": tokens_generated,
            "worker": self.engine.name,
            **self._mismatch,
            **_engine_fields(batch),
        }
        phases = {
            "rollout_s": rollout_s,
            "score_s": score_s,
            "optim_s": t3 - t2,
            "sync_s": t4 - t3,
            "idle_s": idle_s,
        }
        return StepRecord(s, metrics, rollout, phases, served, synced=synced)

    def _optimize(self, batch: Any, adv: torch.Tensor) -> dict[str, Any]:
        g = self.cfg.grpo
        dev = self.device
        prompts, comps = batch.prompts.to(dev), batch.completions.to(dev)
        mask, old_lp = batch.mask.to(dev), batch.logprobs.to(dev)
        adv = adv.to(dev)[:, None]
        seq = torch.cat([prompts, comps], dim=1)
        inputs = seq[:, :-1]
        lp0 = prompts.shape[1] - 1  # logits at lp0.. predict the completion tokens
        n_tok = mask.sum().clamp_min(1.0)
        with torch.no_grad():
            ref_lp = torch.log_softmax(
                logits_of(self.reference, inputs)[:, lp0:] / g.temperature, -1
            )
            ref_lp = ref_lp.gather(2, comps[:, :, None]).squeeze(2)
        lr = float(self.optimizer.param_groups[0]["lr"])
        losses, clips, norms = [], [], []
        kl_first = ent_first = 0.0
        for epoch in range(g.ppo_epochs):
            logp_all = torch.log_softmax(
                logits_of(self.policy, inputs)[:, lp0:] / g.temperature, -1
            )
            lp = logp_all.gather(2, comps[:, :, None]).squeeze(2)
            ratio = torch.exp(lp - old_lp)
            surr = torch.minimum(
                ratio * adv, torch.clamp(ratio, 1 - g.clip_eps, 1 + g.clip_eps) * adv
            )
            log_r = ref_lp - lp
            kl = torch.exp(log_r) - log_r - 1.0
            loss = (((-surr + g.kl_coef * kl) * mask).sum()) / n_tok
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), g.grad_clip)
            self.optimizer.step()
            with torch.no_grad():
                clipped = ((ratio - 1).abs() > g.clip_eps).float()
                clips.append(float(((clipped * mask).sum() / n_tok).item()))
                losses.append(float(loss.item()))
                norms.append(float(norm.item()))
                if epoch == 0:
                    self._mismatch = _mismatch(lp, old_lp, mask)
                    kl_first = float(((kl * mask).sum() / n_tok).item())
                    ent = -(logp_all.exp() * logp_all).sum(-1)
                    ent_first = float(((ent * mask).sum() / n_tok).item())
        self.scheduler.step()
        return {
            "kl_to_ref": kl_first,
            "entropy": ent_first,
            "grad_norm": sum(norms) / len(norms),
            "clip_fraction": sum(clips) / len(clips),
            "loss": sum(losses) / len(losses),
            "lr": lr,
            "tokens_trained": int(n_tok.item()) * g.ppo_epochs,
            "grad_clip_threshold": g.grad_clip,
        }

    @torch.no_grad()
    def evaluate(self) -> tuple[float, int]:
        """Held-out exact match with greedy decoding of the trainer's current policy."""
        ds = self.dataset
        items = ds.heldout[: self.cfg.eval_items]
        prompts = torch.tensor([ds.prompt_tokens(it) for it in items], device=self.device)
        out = greedy(self.policy, prompts, self.max_new).cpu()
        hits = 0
        for item, row in zip(items, out.tolist()):
            got = parse(row)
            hits += got.digits == ds.answer_tokens(item)
        return hits / max(1, len(items)), len(items)

    # -- publishing ----------------------------------------------------------------------

    def _emit(self, cls: type, **kw: Any) -> Any:
        if self.emitter is None:
            return None
        return self.emitter.emit(cls, **kw)

    def _flush(self) -> None:
        if self.emitter is not None:
            self.emitter.flush()

    def publish_step(self, rec: StepRecord) -> None:
        """Eval if due, then every per-step event, flushed (durable) before returning."""
        s = rec.step
        t_eval = time.perf_counter()
        if s % self.cfg.eval_every == 0 or s == self.cfg.steps:
            score, n = self.evaluate()
            rec.eval_score = score
            self._emit(EvalGateScored, step=s, score=score, n_items=n)
        eval_s = time.perf_counter() - t_eval
        if self.emitter is not None:
            for ev in self.reward.drain_events():
                self.emitter.emit_event(ev)  # type: ignore[arg-type]
        m = dict(rec.metrics)
        extra = m.pop("extra")
        self._emit(RolloutBatchCompleted, step=s, **rec.rollout)
        self._emit(TrainerStepCompleted, step=s, algorithm="grpo", extra=extra, **m)
        if rec.synced:
            self._emit(
                WeightSyncCompleted,
                step=s,
                policy_version=rec.policy_version,
                duration_s=rec.phases["sync_s"],
            )
        p = rec.phases
        fleet, own = self.engine.device_kind, self.trainer_device_kind
        for pool, phase, kind, secs, kw in (
            (
                "rollout_fleet",
                "rollout",
                fleet,
                p["rollout_s"],
                {"tokens_generated": rec.rollout["tokens_generated"]},
            ),
            ("trainer", "idle", own, p["idle_s"], {}),
            ("trainer", "score", own, p["score_s"], {}),
            ("trainer", "optim", own, p["optim_s"], {"tokens_trained": m["tokens_trained"]}),
            ("trainer", "sync", own, p["sync_s"], {}),
            ("trainer", "eval", own, eval_s, {}),
        ):
            self._emit(
                UsageRecorded,
                step=s,
                pool=pool,
                phase=phase,
                device_kind=kind,
                device_seconds=secs,
                **kw,
            )
        cut = time.perf_counter()
        other = self._carry_other + eval_s
        self._emit(
            StepPhaseTimed,
            step=s,
            wall_s=cut - self._last_cut,
            other_s=other,
            **p,
        )
        self._last_cut = cut
        t_flush = time.perf_counter()
        self._flush()
        self._carry_other = time.perf_counter() - t_flush

    def save_checkpoint(self, before_publish: Callable[[], None] | None = None) -> ckpt.SaveResult:
        t0 = time.perf_counter()
        res = ckpt.write_checkpoint(
            ckpt.checkpoint_dir(self.checkpoint_root, self.step),
            step=self.step,
            run_id=self.cfg.run_id,
            state=self.parts(),
            pins=self.pins,
            digest=self.cfg.checkpoint.digest,
            extra={"policy_version": self.engine.policy_version},
            before_publish=before_publish,
            tenant_id=self.cfg.tenant_id,
            submitted_id=self.submitted_id,
        )
        info = res.info
        self._emit(
            CheckpointWritten,
            step=self.step,
            path=str(info.path),
            checkpoint_schema=info.schema,
            digest=info.digest,
            sentinels=info.sentinels,
            pins=info.pins,
            size_bytes=info.size_bytes,
            duration_s=res.total_s,
        )
        self._flush()
        ckpt.prune(self.checkpoint_root, self.cfg.checkpoint.keep)
        self._carry_other += time.perf_counter() - t0
        return res

    # -- whole runs ----------------------------------------------------------------------

    def write_run_manifest(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "config.json.tmp"
        tmp.write_text(json.dumps({"config": self.cfg.model_dump(mode="json"), "pins": self.pins}))
        tmp.replace(self.run_dir / "config.json")

    def start(self) -> None:
        """A fresh run: manifest, the lifecycle up to RunStarted, and the step-0 eval gate.

        ``runwatch train`` is its own launcher on one machine: admission is immediate
        (RunQueued) and provisioning is building the policy and the data (RunProvisioning),
        so the customer-facing state machine sees the same lifecycle as on a cluster."""
        self.write_run_manifest()
        submitted = self._emit(
            RunSubmitted,
            algorithm="grpo",
            config={
                "config_json": self.cfg.model_dump_json(),
                "run_dir": str(self.run_dir.resolve()),
                **{f"pin.{k}": v for k, v in self.pins.items()},
            },
        )
        self.submitted_id = str(submitted.event_id) if submitted is not None else None
        self._emit(RunQueued)
        self._emit(RunProvisioning)
        self._emit(RunStarted)
        score, n = self.evaluate()
        self._emit(EvalGateScored, step=0, score=score, n_items=n)
        self._flush()
        if self.cfg.checkpoint.at_start:
            self.save_checkpoint()
        self._last_cut = time.perf_counter()

    def run_until(self, last_step: int) -> None:
        """Train and publish steps until ``last_step``; checkpoint every N and at the end."""
        while self.step < last_step:
            rec = self.train_step()
            self.publish_step(rec)
            self.say(
                f"step {rec.step} reward {rec.metrics['reward_mean']:.3f} "
                f"kl {rec.metrics['kl_to_ref']:.4f}"
                + (f" eval {rec.eval_score:.3f}" if rec.eval_score is not None else "")
            )
            saved = None
            if self.step % self.cfg.checkpoint.every == 0 or self.step == self.cfg.steps:
                saved = self.save_checkpoint()
            if self.follow_commands(saved):
                return

    # -- commands (runwatch.control) -----------------------------------------------------

    def follow_commands(self, saved: ckpt.SaveResult | None = None) -> bool:
        """Apply this run's new commands at a step boundary; True once it is cancelled.

        Pause: the current step is already finished and published; the trainer writes a
        checkpoint (unless one was just written at this step), publishes ``RunPaused``
        naming it and the request, and waits — generating nothing, training nothing and
        publishing no usage, so the run's spend stays flat — polling every
        ``poll_interval_s`` until an unpause (``RunResumed``; training continues from the
        in-memory state, which is bit-for-bit the pause checkpoint) or a cancel
        (``RunCancelled``). A command that does not apply (unpause of a running run, the
        controller's pause of a paused one) is ignored here; the API refuses it before it is
        written. A person's pause of the paused run pauses it again after the resume
        (:meth:`hold_paused`).

        Every command polled is acted on, in order: a cancel wins over whatever came with
        it or before it was acted on (a pause and a cancel in one poll cancel; a resume and
        a cancel in one poll of a paused run cancel), and commands after a resume are
        applied after it (a pause after the resume pauses again). Before, the trainer
        acted on the first of a poll and the rest were lost: an accepted cancel with them.
        """
        if self.commands is None:
            return False
        queue = self.commands_due
        queue.extend(self.commands.poll())
        while queue:
            if self._cancel_due(queue):
                return True
            cmd = queue.popleft()
            if isinstance(cmd, PauseRequested):
                who = f"{cmd.actor}{' ' + cmd.principal if cmd.principal else ''}"
                here = str(saved.info.path) if saved else self.checkpoint_here()
                if self.hold_paused(
                    f"paused by {who}: {cmd.reason}", here, str(cmd.event_id), cmd.actor,
                    cmd.alert_id,
                ):  # fmt: skip
                    return True
                saved = None  # a resume may have rolled back: see checkpoint_here
        return False

    def owns(self, info: ckpt.CheckpointInfo) -> str:
        """Why checkpoint ``info`` is not this run's ("" when it is):
        :func:`trainer.checkpoint.identity_mismatch` against this run's id, tenant and
        submission."""
        return ckpt.identity_mismatch(info, self.cfg.run_id, self.cfg.tenant_id, self.submitted_id)

    def checkpoint_here(self) -> str:
        """The path of this step's checkpoint, written now unless a valid one of this run
        is there: the state is the one checkpointed at this step when one is (a pause's, a
        rollback's target, the one a resumed run was certified from and re-paused at).

        "Valid" is verified (schema, digests, sizes: :func:`trainer.checkpoint.
        verify_checkpoint`, no deserialization) and this run's (:meth:`owns`), not just
        present: a run that stops or pauses here names a checkpoint that loads. This run's
        invalid one (a flipped byte) moves to ``<run_dir>/rejected/`` and the state is
        written anew; another run's is left alone (``save_checkpoint`` then refuses to
        overwrite it: a run directory shared by two runs is an error to see, not to hide).
        """
        here = ckpt.checkpoint_dir(self.checkpoint_root, self.step)
        if (here / ckpt.META).exists():
            try:
                info = ckpt.verify_checkpoint(here)
                if not self.owns(info):
                    return str(here)
            except ckpt.CheckpointError as exc:
                self.say(f"checkpoint {here} does not verify ({exc}); writing it anew")
                ckpt.set_aside([here], self.rejected_dir("invalid"))
        return str(self.save_checkpoint().info.path)

    def rejected_dir(self, why: str) -> Path:
        """A fresh ``<run_dir>/rejected/<why>-<ns>/`` for checkpoints set aside as
        invalid (kept for the audit)."""
        return self.run_dir / "rejected" / f"{why}-{time.time_ns()}"

    def _cancel_due(self, queue: deque[Any]) -> bool:
        """Cancel (True) if a cancel is among the commands due."""
        cancel = first_cancel(queue)
        if cancel is None:
            return False
        queue.clear()
        return self._cancel(cancel)

    def hold_paused(
        self,
        reason: str,
        checkpoint: str,
        request_id: str = "",
        requested_by: str = "",
        alert_id: str = "",
    ) -> bool:
        """Publish ``RunPaused`` (at ``checkpoint``, the state it is paused in; naming the
        request it answers, who made it and for which alert) and wait for an unpause
        (False, ``RunResumed`` published) or a cancel (True); see :meth:`follow_commands`.
        A person's pause of the paused run is kept and follows the resume (the run pauses
        again for it); the controller's is passed over (it keeps its alerts owed)."""
        t0 = time.perf_counter()
        paused = self._emit(
            RunPaused,
            step=self.step,
            reason=reason,
            checkpoint=checkpoint,
            request_id=request_id,
            requested_by=requested_by,
            alert_id=alert_id,
            refuses_stale_resume=True,  # a resume naming another pause is refused below
        )
        self._flush()
        # the pause a resume must name (when it names one): this request's, the one in
        # effect when a restarted trainer began, or this RunPaused's own (no request)
        pause_id = request_id or self.pause_in_effect or (str(paused.event_id) if paused else "")
        self.say(f"at step {self.step} {reason}")
        assert self.commands is not None
        queue = self.commands_due
        deferred: list[PauseRequested] = []  # people's pauses while paused (below)
        while True:
            if not queue:
                time.sleep(self.poll_interval_s)
                queue.extend(self.commands.poll())
                continue
            if self._cancel_due(queue):
                return True
            c = queue.popleft()
            if not isinstance(c, UnpauseRequested):
                if held_over(c):  # a person's pause of the paused run: after the resume
                    deferred.append(c)
                continue
            if stale := stale_resume(c, pause_id):  # judged on a view from before this pause
                self._emit(
                    CommandRejected,
                    command_id=str(c.event_id),
                    command=type(c).__name__,
                    reason=stale,
                )
                self._flush()
                self.say(f"at step {self.step} resume by {c.actor} refused: {stale}")
                continue
            try:
                changed = self.apply_overrides(dict(c.overrides))
            except OverrideRefused as exc:  # nothing applied: the run stays paused
                self._emit(
                    CommandRejected,
                    command_id=str(c.event_id),
                    command=type(c).__name__,
                    reason=str(exc),
                )
                self._flush()
                self.say(f"at step {self.step} resume by {c.actor} refused: {exc}")
                continue
            self.pause_in_effect = None
            why = f"resumed by {c.actor}: {c.reason}".rstrip(": ")
            if changed:
                why += " (" + ", ".join(f"{k}={v}" for k, v in changed.items()) + ")"
            back = changed.get("rollback_to_step")
            if back is not None:
                checkpoint = str(ckpt.checkpoint_dir(self.checkpoint_root, back))
            self._emit(
                RunResumed,
                step=self.step,
                reason=why,
                checkpoint=checkpoint,
                request_id=str(c.event_id),
                rolled_back_to=back,
            )
            self._flush()
            self.say(f"resumed at step {self.step} by {c.actor}")
            # the pause is not the next step's time (nor its bill)
            self._last_cut = time.perf_counter()
            self._carry_other = 0.0
            self.paused_s += self._last_cut - t0
            queue.extendleft(reversed(deferred))  # paused again for them (follow_commands)
            return False

    def apply_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Change what :data:`producers.commands.RESUME_OVERRIDES` allows (within its
        bounds) before continuing; what changed.

        ``rollback_to_step``: continue from the newest checkpoint at or before that step
        (applied first; the steps after it are trained again, under the new settings).
        Only a checkpoint that verifies and is this run's (:meth:`owns`) is a target; an
        unreadable or corrupt one is skipped, never fatal. When none is at or before that
        step, :class:`OverrideRefused` is raised before anything is changed (the caller
        publishes ``CommandRejected`` and the run stays paused): a rollback is never
        accepted and silently not applied. The current step is a no-op; a later one is refused
        the same way. The settings in effect before it stay in effect (a rollback restores
        the weights and the optimizer of then, not the settings of then).
        ``lr``, ``kl_coef``: :meth:`use_settings`. Unknown keys are ignored here (the API
        and the CLI refuse them before a command is written).
        """
        changed: dict[str, Any] = {}
        back = overrides.get("rollback_to_step")
        if isinstance(back, int) and not isinstance(back, bool) and back > self.step:
            raise OverrideRefused(
                f"rollback_to_step={back} is after the run's current step {self.step}: there "
                "is nothing to roll back to; nothing was applied, the run stays paused"
            )
        if isinstance(back, int) and not isinstance(back, bool) and 0 <= back < self.step:
            # the newest verified checkpoint at or before that step: the run's whole state
            # (weights, optimizer, RNG, sampler...) as it was then; steps after it are
            # trained again, under the settings below
            skipped: list[str] = []
            for cand in ckpt.list_checkpoints(self.checkpoint_root):
                try:
                    if ckpt.read_metadata(cand).step > back:
                        continue
                    info, parts = ckpt.read_checkpoint(cand)
                except ckpt.CheckpointError as exc:
                    skipped.append(f"{cand.name}: {exc.reason}")
                    continue
                if foreign := self.owns(info):
                    skipped.append(f"{cand.name}: {foreign}")
                    continue
                if lacks := sorted(set(self.parts()) - set(parts)):
                    skipped.append(f"{cand.name}: lacks part(s) {', '.join(lacks)}")
                    continue
                self.load_parts(parts)
                changed["rollback_to_step"] = self.step
                self._set_aside_checkpoints_after(self.step)
                # the optimizer of then came back with its learning rate: the settings in
                # effect stay in effect (what a restart's replay applies: trainer.settings)
                self.use_settings(self.resume_settings, again=True)
                break
            else:
                why = "; ".join(skipped) if skipped else "none kept"
                raise OverrideRefused(
                    f"rollback_to_step={back}: no valid checkpoint of this run at or before "
                    f"step {back} ({why}); nothing was applied, the run stays paused at "
                    f"step {self.step}"
                )
        changed.update(self.use_settings(resume_settings(overrides)))
        return changed

    def use_settings(self, settings: Mapping[str, float], again: bool = False) -> dict[str, float]:
        """Put resume ``settings`` in effect (:func:`trainer.settings.resume_settings`:
        valid ``lr`` and ``kl_coef`` only); what changed. ``again``: also those already
        in effect (after restoring an optimizer that holds another learning rate).

        ``lr``: the base learning rate from here on (replacing the configured LR and any
        LR fault multiplier); the warm-up schedule keeps its shape. ``kl_coef``: the KL
        penalty's weight from here on (pulls a drifted policy back)."""
        todo = {k: v for k, v in settings.items() if again or self.resume_settings.get(k) != v}
        lr = todo.get("lr")
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["initial_lr"] = lr
            self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
            factor = _lr_lambda(self.cfg)(self.scheduler.last_epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * factor
            g = self.cfg.grpo.model_dump()
            self.cfg = self.cfg.with_overrides(
                grpo={**g, "lr": lr},
                faults={**self.cfg.faults.model_dump(), "lr_multiplier": 1.0},
            )
        kl_coef = todo.get("kl_coef")
        if kl_coef is not None:
            g = self.cfg.grpo.model_dump()
            self.cfg = self.cfg.with_overrides(grpo={**g, "kl_coef": kl_coef})
        self.resume_settings = {**self.resume_settings, **todo}
        return todo

    def _set_aside_checkpoints_after(self, step: int) -> None:
        """Checkpoints of the abandoned branch move to ``<run_dir>/abandoned/`` (kept for
        the audit, out of the way of the steps that will be trained again)."""
        later = []
        for cand in ckpt.list_checkpoints(self.checkpoint_root):
            try:
                step_of = ckpt.read_metadata(cand).step
            except ckpt.CheckpointError:  # unreadable metadata: judge by the name
                step_of = _step_of_name(cand)
            if step_of > step:
                later.append(cand)
        ckpt.set_aside(later, self.run_dir / "abandoned" / f"after-step-{step}-{time.time_ns()}")

    def _cancel(self, cmd: CancelRequested) -> bool:
        self._emit(
            RunCancelled,
            step=self.step,
            reason=f"cancelled by {cmd.actor}: {cmd.reason}".rstrip(": "),
            request_id=str(cmd.event_id),
        )
        self._flush()
        self.say(f"cancelled at step {self.step} by {cmd.actor}")
        self.cancelled = True
        return True

    def finish(self) -> None:
        if self.cancelled:
            return  # RunCancelled is the run's last lifecycle fact
        self._emit(RunCompleted, step=self.step)
        self._flush()

    def fail(self, exc: BaseException) -> None:
        """Publish why the run stopped: RunPaused when the sandbox's failure policy paused
        it for tenant action (resumable), else RunFailed with its attribution."""
        if self.emitter is not None:
            for ev in self.reward.drain_events():
                self.emitter.emit_event(ev)  # type: ignore[arg-type]
        if isinstance(exc, RewardUnavailable) and exc.action == "pause":
            # the restarted trainer that answers its resume refuses a stale one
            self._emit(RunPaused, step=self.step, reason=str(exc), refuses_stale_resume=True)
            self._flush()
            return
        # the tenant's reward code is attributed by the sandbox; anything else that stops
        # a run (a rollout engine that died: RolloutEngineFailed) is the platform's
        cls = exc.failure_class if isinstance(exc, RewardUnavailable) else "platform_fault"
        self._emit(
            RunFailed, step=self.step, failure_class=cls, reason=f"{type(exc).__name__}: {exc}"
        )
        self._flush()


def _step_of_name(path: Path) -> int:
    """The step a checkpoint directory's name says (``step-00000040`` -> 40); -1 if none."""
    try:
        return int(path.name.rsplit("-", 1)[-1])
    except ValueError:
        return -1


class OverrideRefused(ValueError):
    """A resume's overrides cannot be applied (a rollback with no checkpoint to go back
    to); nothing was changed."""


class RunBusy(RuntimeError):
    """Another live process holds the run (a trainer still running, or a resume)."""


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/LOCK`` for as long as a process trains the run.

    The kernel drops it when the holder dies (kill -9 included), so a crashed run is
    resumable at once while a live one cannot be resumed twice.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "LOCK"
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        import fcntl
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunBusy(
                f"run directory {self.path.parent} is held by live pid {holder}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def release(self) -> None:
        import os

        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def train(
    cfg: TrainerConfig,
    run_dir: Path,
    emitter: Emitter | None,
    progress: Callable[[str], None] | None = None,
) -> Trainer:
    """A whole fresh run. Publishes RunFailed (and re-raises) on an error."""
    lock = RunLock(run_dir).acquire()
    try:  # a trainer that cannot be built (an engine that cannot start) published nothing
        trainer = Trainer(cfg, run_dir, emitter, progress)
    except BaseException:
        lock.release()
        raise
    if emitter is not None:
        trainer.commands = CommandFeed(emitter.sink, cfg.run_id, tenant_id=cfg.tenant_id)
    try:
        trainer.start()
        trainer.run_until(cfg.steps)
        trainer.finish()
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):
            trainer.fail(exc)
        raise
    finally:
        trainer.reward.close()
        lock.release()
    return trainer


__all__ = ["EOS", "METRIC_FIELDS", "OverrideRefused", "StepRecord", "Trainer", "train"]
