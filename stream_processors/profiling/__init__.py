"""Rollout profiling (seed 003): long tail, stragglers, barrier wait, event shares, turns.

:class:`ProfilingFold` is the pure fold (see :mod:`.fold` for when a step is complete);
:func:`profile_step` the per-step figures (see :mod:`.analysis` for their definitions).
"""

from stream_processors.profiling.analysis import ProfilingConfig, StepResult, profile_step
from stream_processors.profiling.fold import ProfilingFold, ProfilingState

__all__ = ["ProfilingConfig", "ProfilingFold", "ProfilingState", "StepResult", "profile_step"]
