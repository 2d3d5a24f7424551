"""The smallest trainer config the trainer's unit tests run (a few seconds a run)."""

from __future__ import annotations

TINY = {
    "steps": 6,
    "task": {"kind": "reverse", "digits": 2},
    "model": {"hidden": 32, "heads": 1, "layers": 1, "intermediate": 32, "warm_start_steps": 2},
    "grpo": {"prompts_per_step": 4, "group_size": 4},
    "checkpoint": {"every": 2},
}
