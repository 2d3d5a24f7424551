"""Live hooks: training frameworks publish to runwatch while they train.

- :class:`RunwatchHook` (:mod:`producers.hooks.hook`): framework-neutral, for any Python
  loop; what the others wrap.
- ``RunwatchCallback`` (:mod:`producers.hooks.transformers_callback`): a
  ``transformers.TrainerCallback`` for TRL trainers and the plain ``Trainer``.
- ``RunwatchTracking`` (:mod:`producers.hooks.verl_tracking`): verl's tracking backend
  ``runwatch`` (registered by importing :mod:`producers.hooks.verl_plugin`).

Publishing is asynchronous and bounded, and falls back to a local spool when the log is
unreachable (:mod:`producers.hooks.publisher`). The framework adapters are imported
lazily, so ``from producers.hooks import RunwatchHook`` needs neither transformers nor
verl.
"""

from __future__ import annotations

from typing import Any

from producers.hooks.hook import RunwatchHook

__all__ = ["RunwatchCallback", "RunwatchHook", "RunwatchTracking"]


def __getattr__(name: str) -> Any:
    if name == "RunwatchCallback":
        from producers.hooks.transformers_callback import RunwatchCallback

        return RunwatchCallback
    if name == "RunwatchTracking":
        from producers.hooks.verl_tracking import RunwatchTracking

        return RunwatchTracking
    raise AttributeError(name)
