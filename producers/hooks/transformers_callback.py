"""``RunwatchCallback``: a ``transformers.TrainerCallback`` for TRL and plain Trainers.

Usage (any ``transformers.Trainer``, TRL's ``GRPOTrainer`` / ``PPOTrainer`` / ... included)::

    from producers.hooks import RunwatchCallback
    trainer = GRPOTrainer(..., callbacks=[RunwatchCallback(run_id="r1", tenant_id="acme")])

What each callback publishes (through a :class:`~producers.hooks.hook.RunwatchHook`):

- ``on_train_begin``: ``RunSubmitted`` (algorithm from the config class: ``GRPOConfig``
  -> ``grpo``; a few config values) + ``RunStarted``, or ``RunResumed`` when training
  starts past step 0 (``resume_from_checkpoint``);
- ``on_step_end``: ``StepPhaseTimed`` (the step's wall time; ``UsageRecorded`` too with
  ``gpus``); then the run's commands (:mod:`producers.hooks.obey`): a pause blocks the
  step's end until an unpause or a cancel, a cancel sets ``control.should_training_stop``
  (``RunCancelled``; ``on_train_end`` then publishes no ``RunCompleted``). In a run of
  several processes (``torchrun``, ``accelerate launch``) every rank takes process
  zero's verdict at the step's end (:mod:`producers.hooks.ranks`): they pause and stop
  together. A run whose runwatch has been unreachable over ``pause_when_unmonitored_s``
  (a hook argument, 300 s by default, ``None``: off) is held there the same way until
  runwatch is back (:mod:`producers.hooks.unmonitored`);
- ``on_log``: what ``runwatch import metrics`` writes for the row — ``reward``, ``kl``,
  ``entropy``, ``completions/*``, ``frac_reward_zero_std`` ... (set ``logging_steps=1``
  for a step event per optimizer step: detectors count steps by their number, a sparser
  log is still read right, only seen later);
- ``on_save``: ``CheckpointWritten`` for ``output_dir/checkpoint-<step>`` (digested on the
  hook's worker thread, not the training thread);
- ``on_train_end``: ``RunCompleted``, then the hook is flushed (``close_on_end``: closed);
- a later ``train()`` with the same callback (another stage, more steps): ``RunResumed``
  (a restart's), and the run is watched and gated as before (a hook it built and closed
  is built anew; a closed hook given to it is refused, see :meth:`RunwatchCallback._again`).

Only the world's process zero publishes and reads commands
(``state.is_world_process_zero``); the other ranks' callbacks only take its verdict. Time
semantics: each event's ``ts`` is the wall clock when the callback ran.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from producers.hooks.hook import RunwatchHook
from producers.hooks.obey import RunCancelledByRunwatch
from producers.hooks.ranks import JOIN_WAIT_S, WorldVerdict, world_verdict

log = logging.getLogger("runwatch.hooks")

#: TrainingArguments fields copied onto RunSubmitted.config when present.
CONFIG_FIELDS = (
    "learning_rate",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "beta",
    "epsilon",
    "loss_type",
    "temperature",
    "seed",
    "logging_steps",
    "save_steps",
)


class RunwatchCallback(TrainerCallback):
    """Publish a Trainer's run to runwatch live. ``hook`` or the hook's own arguments
    (``run_id``, ``tenant_id``, ``kafka`` / ``log``, ``spool``, ``algorithm``, ``gpus`` ...:
    see :class:`RunwatchHook`); ``algorithm`` defaults to the config class' name."""

    def __init__(
        self,
        run_id: str | None = None,
        tenant_id: str = "default",
        *,
        hook: RunwatchHook | None = None,
        close_on_end: bool = True,
        flush_timeout_s: float = 30.0,
        join_wait_s: float = JOIN_WAIT_S,
        **hook_kwargs: Any,
    ) -> None:
        """``join_wait_s``: in a multi-process run, how long process zero waits at the
        start of training for every rank to say it holds this callback (:mod:`.ranks`)."""
        if hook is None and run_id is None:
            raise ValueError("RunwatchCallback needs run_id= (or hook=)")
        self._hook = hook
        self._owns_hook = hook is None  # built here (and so buildable again)
        self._run_id = run_id if run_id is not None else hook.run_id  # type: ignore[union-attr]
        self._world: WorldVerdict | None = None
        self._trainings = 0  # train() calls so far: each agrees on its verdict anew
        self._said_alone = False
        self._tenant_id = tenant_id
        self._hook_kwargs = hook_kwargs
        self.close_on_end = close_on_end
        self.flush_timeout_s = flush_timeout_s
        self.join_wait_s = join_wait_s

    @property
    def hook(self) -> RunwatchHook | None:
        return self._hook

    def _ensure(self, args: Any) -> RunwatchHook:
        if self._hook is None:
            kwargs = dict(self._hook_kwargs)
            kwargs.setdefault("algorithm", _algorithm_of(args))
            self._hook = RunwatchHook(str(self._run_id), self._tenant_id, **kwargs)
        return self._hook

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._trainings += 1
        self._world = world_verdict(args, f"{self._run_id}/{self._trainings}", self.join_wait_s)
        if state.is_world_process_zero:
            if self._trainings > 1 and self._hook is not None:
                self._again(args, state, kwargs.get("model"))
            else:
                self._start(args, state, kwargs.get("model"))
        # a run paused when this process started stays paused (before its first step); a
        # cancel here raises: transformers looks at should_training_stop only after a step
        if self._verdict(args, state):
            raise RunCancelledByRunwatch(f"run {self._run_id} was cancelled (runwatch)")

    def _start(self, args: Any, state: Any, model: Any) -> None:
        hook = self._ensure(args)
        config = self._config(args, model)
        if state.global_step > 0:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            hook.start(config, resumed_from=path, resumed_step=state.global_step)
        else:
            hook.start(config)

    def _again(self, args: Any, state: Any, model: Any) -> None:
        """A later ``train()`` of the run with this callback (another stage, more steps):
        it trains again, watched and gated like the first. Found by review: the first
        ``train()``'s end finished (and by default closed) the hook, so the second trained
        ungated, unbilled, the controller's pause never read. A hook this callback built
        and closed is built anew (its first look waits for the run's commands); an open
        one goes on (:meth:`RunwatchHook.train_again`); a closed hook given to it cannot be
        reopened: the training is refused rather than run unwatched."""
        hook = self._hook
        assert hook is not None
        where = (
            os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if state.global_step > 0
            else str(args.output_dir)
        )
        if not hook.closed:
            hook.train_again(state.global_step, where)
            return
        if not self._owns_hook:
            raise RuntimeError(
                f"RunwatchCallback: run {self._run_id}'s hook was closed at the end of the "
                "previous train() (close_on_end=True) and was given to the callback, so "
                "it cannot be built again: pass close_on_end=False, or let the callback "
                "build its hook, to train the run again"
            )
        self._hook = None
        fresh = self._ensure(args)
        fresh.start(self._config(args, model), resumed_from=where,
                    resumed_step=state.global_step)  # fmt: skip

    @staticmethod
    def _config(args: Any, model: Any) -> dict[str, Any]:
        config = {name: getattr(args, name) for name in CONFIG_FIELDS if hasattr(args, name)}
        config["source"] = "transformers-callback"
        config["args_class"] = type(args).__name__
        name = getattr(getattr(model, "config", None), "_name_or_path", None)
        if name:
            config["model"] = str(name)
        return config

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None and state.is_world_process_zero:
            self._hook.step_done(state.global_step)
        # the run's commands: a pause blocks here, a cancel stops training (every rank)
        if self._verdict(args, state):
            control.should_training_stop = True

    def _verdict(self, args: Any, state: Any) -> bool:
        """Stop training? Process zero acts on the run's commands (a pause blocks it
        here); the other ranks of a multi-process run take its verdict (:mod:`.ranks`)."""
        hook, step = self._hook, state.global_step

        def decide(keepalive: Callable[[], None] | None = None) -> bool:
            return hook is not None and hook.obey(step, keepalive)

        if self._world is not None:
            return self._world.share(decide)
        if getattr(args, "world_size", 1) != 1:  # several processes, no shared verdict
            if not self._said_alone and state.is_world_process_zero:
                self._said_alone = True
                log.warning(
                    "runwatch: run %s has %s processes and no verdict shared by all (no "
                    "process group, or the callback not on every rank): its commands are "
                    "not followed (the run state still says them)",
                    self._run_id,
                    args.world_size,
                )
            return False
        return decide()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if self._hook is not None and logs and state.is_world_process_zero:
            self._hook.log(logs, step=state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None and state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self._hook.checkpoint(path, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is None or not state.is_world_process_zero:
            return
        self._hook.finish(ok=True, step=state.global_step)
        if self.close_on_end:
            self._hook.close(self.flush_timeout_s)
        else:
            self._hook.flush(self.flush_timeout_s)


def _algorithm_of(args: Any) -> str:
    """``GRPOConfig`` -> ``grpo``; plain ``TrainingArguments`` -> ``sft``."""
    name = type(args).__name__
    if name.endswith("Config"):
        return name[: -len("Config")].lower() or "grpo"
    return "sft"
