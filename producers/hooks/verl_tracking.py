"""verl's tracking backend for runwatch: ``trainer.logger=['console','runwatch']``.

verl builds its loggers in ``verl.utils.tracking.Tracking.__init__`` from a fixed list
(``supported_backend``: wandb, mlflow, swanlab, console, file, ...), calls
``logger.log(data=metrics, step=global_steps)`` on each, and ``finish(exit_code)`` at
the end. verl has no registry for third-party backends, so :func:`register` (run when
:mod:`producers.hooks.verl_plugin` is imported) adds ``"runwatch"`` to that list and
wraps ``Tracking.__init__`` / ``finish`` to create and finish a
:class:`RunwatchTracking` when the configured backends name it. verl imports the plugin
module itself through either of its own plugin paths:

- the ``verl.plugins`` entry point this project declares (loaded by ``import verl``
  unless ``VERL_USE_EXTERNAL_PLUGINS=none``), or
- ``VERL_USE_EXTERNAL_MODULES=producers.hooks.verl_plugin``.

Keys are mapped as ``runwatch import metrics`` maps them (``actor/*``, ``critic/*``,
``response_length/*``, ``timing_s/*``, ``perf/*``, ``val-core/*``; verl's
``actor/ppo_kl`` is *not* KL-to-reference and stays in ``extra``). The validation row
verl logs before training (``val-core/*`` only) becomes an ``EvalGateScored`` alone.

Settings: the ``trainer.runwatch`` section of verl's config when present (``run_id``,
``tenant_id``, ``kafka``, ``log``, ``spool``, ``gpus``, ``algorithm``, any other
:class:`RunwatchHook` argument such as ``pause_when_unmonitored_s``; add it with
``+trainer.runwatch.tenant_id=acme``), else ``$RUNWATCH_RUN_ID``, ``$RUNWATCH_TENANT``,
``$RUNWATCH_KAFKA`` / ``$RUNWATCH_LOG_DIR``; the run id defaults to the experiment name,
the GPUs to ``trainer.nnodes x trainer.n_gpus_per_node``, the algorithm to
``algorithm.adv_estimator`` (``gae`` -> ``ppo``).

Commands: a pause (a gate's, a person's) blocks verl's driver in ``log`` until an unpause
or a cancel (and so does runwatch out of touch over ``pause_when_unmonitored_s``, until it
is back: :mod:`producers.hooks.unmonitored`); a cancel raises
:class:`~producers.hooks.obey.RunCancelledByRunwatch` out of ``log``, which stops verl's
driver (``RunCancelled`` is published first).

Checkpoints: verl writes ``<default_local_dir>/global_step_<N>/`` and then
``latest_checkpointed_iteration.txt``; each ``log`` call stats that file (one ``stat``)
and publishes ``CheckpointWritten`` for a step it has not seen.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from producers.hooks.hook import RunwatchHook
from producers.hooks.ids import id_from_name
from producers.hooks.obey import RunCancelledByRunwatch

BACKEND = "runwatch"
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: Config paths copied onto RunSubmitted.config (those present).
CONFIG_PATHS = (
    "algorithm.adv_estimator",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_ctrl.kl_coef",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.save_freq",
)


class RunwatchTracking:
    """One verl run's runwatch logger: ``log(data, step)`` and ``finish(exit_code)``,
    the interface ``Tracking`` calls on every backend."""

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        config: Mapping[str, Any] | None = None,
        **hook_kwargs: Any,
    ) -> None:
        config = dict(config or {})
        trainer = _get(config, "trainer") or {}
        settings = dict(_get(trainer, "runwatch") or {})
        settings.update(hook_kwargs)
        run_id = settings.pop("run_id", None) or os.environ.get("RUNWATCH_RUN_ID")
        tenant = settings.pop("tenant_id", None) or os.environ.get("RUNWATCH_TENANT", "default")
        settings.setdefault("algorithm", _algorithm(config))
        gpus = _gpus(trainer)
        if gpus is not None:
            settings.setdefault("gpus", gpus)
        # an explicit run id must be valid as it is; verl's experiment name is free text
        # (``qwen2.5/grpo-gsm8k``): made a valid id rather than failing the training start
        run = str(run_id) if run_id else id_from_name(str(experiment_name))
        self.hook = RunwatchHook(run, str(tenant), **settings)
        self.checkpoint_root = _get(trainer, "default_local_dir")
        self._tracker_mtime: float | None = None
        self._tracker_step: int | None = self._read_tracker()[1]  # resumed: not new
        start_config = {p: v for p in CONFIG_PATHS if (v := _path(config, p)) is not None}
        start_config.update(source="verl-tracking", project=project_name)
        self.hook.start(start_config)
        if self.hook.obey(None):  # a run paused when this process started stays paused
            raise RunCancelledByRunwatch(f"run {self.hook.run_id} was cancelled (runwatch)")

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """One step's metrics; then the run's commands (:mod:`producers.hooks.obey`): a
        pause blocks verl's driver here, a cancel raises :class:`RunCancelledByRunwatch`
        out of the driver's loop (verl has no stop flag a logger can set)."""
        self.hook.log(data, step=step)
        if self.checkpoint_root:
            self._check_checkpoint()
        if self.hook.obey(step):  # RunCancelled is flushed; the exit hooks close the hook
            raise RunCancelledByRunwatch(f"run {self.hook.run_id} was cancelled (runwatch)")

    def finish(self, exit_code: int = 0) -> None:
        if exit_code == 0:
            self.hook.finish(ok=True)
        else:
            self.hook.finish(ok=False, reason=f"verl tracking finished with exit code {exit_code}")
        self.hook.close()

    def _check_checkpoint(self) -> None:
        _, step = self._read_tracker()
        if step is None or step == self._tracker_step:
            return
        self._tracker_step = step
        path = os.path.join(str(self.checkpoint_root), f"global_step_{step}")
        self.hook.checkpoint(path, step)

    def _read_tracker(self) -> tuple[float | None, int | None]:
        if not self.checkpoint_root:
            return None, None
        tracker = os.path.join(str(self.checkpoint_root), TRACKER_FILE)
        try:
            mtime = os.stat(tracker).st_mtime
            if mtime == self._tracker_mtime:
                return mtime, self._tracker_step
            self._tracker_mtime = mtime
            with open(tracker) as f:
                return mtime, int(f.read().strip())
        except (OSError, ValueError):
            return None, None


def register() -> None:
    """Make ``"runwatch"`` a backend of verl's ``Tracking`` (idempotent)."""
    from verl.utils import tracking

    cls = tracking.Tracking
    if getattr(cls, "_runwatch_registered", False):
        return
    if BACKEND not in cls.supported_backend:
        cls.supported_backend.append(BACKEND)
    original_init = cls.__init__
    original_finish = cls.finish

    def __init__(self, project_name, experiment_name, default_backend="console", config=None):
        original_init(self, project_name, experiment_name, default_backend, config)
        backends = [default_backend] if isinstance(default_backend, str) else default_backend
        if BACKEND in backends:
            self.logger[BACKEND] = RunwatchTracking(project_name, experiment_name, config)

    def finish(self, exit_code: int = 0):
        first = not getattr(self, "_finished", False)
        original_finish(self, exit_code=exit_code)
        ours = getattr(self, "logger", {}).get(BACKEND)
        if first and ours is not None:
            ours.finish(exit_code=exit_code)

    cls.__init__ = __init__
    cls.finish = finish
    cls._runwatch_registered = True


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = _get(obj, part)
        if obj is None:
            return None
    return obj if isinstance(obj, str | int | float | bool) else None


def _algorithm(config: Mapping[str, Any]) -> str:
    est = _path(config, "algorithm.adv_estimator")
    if not est:
        return "grpo"
    return "ppo" if str(est) == "gae" else str(est)


def _gpus(trainer: Any) -> float | None:
    """``nnodes x n_gpus_per_node``; ``None`` when that is no positive number (a CPU-only
    run bills no GPU time, and the hook refuses a GPU count that is not above 0)."""
    nodes, per_node = _get(trainer, "nnodes"), _get(trainer, "n_gpus_per_node")
    if isinstance(nodes, int | float) and isinstance(per_node, int | float):
        total = float(nodes * per_node)
        return total if math.isfinite(total) and total > 0 else None
    return None
