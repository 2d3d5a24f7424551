"""reward_explosion_collapse counts steps, not logged rows (#17 review).

TRL logs the mean of every ``logging_steps`` steps (10 by default). Counted in rows, a
history logged every 10 steps armed its band after 500 steps (a reward collapse at step
250 never paged) and one logged every 5 kept its band 50 steps stale (a healthy 60-step
rise paged); every step logged, nothing changes."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from stream_processors.detectors import state_codec
from stream_processors.detectors.reward_explosion_collapse import (
    RewardBandState,
    _spacing,
    _step_noise,
)
from tests.unit.stream_processors.detectors._builders import Run, fired, fold_all

DETECTOR = "reward_explosion_collapse"


def _per_step(seed: int, steps: int, r0: float, gain: float, mid: float, width: float):
    """A GRPO batch-mean reward per step: a logistic trend plus binomial batch noise (64
    completions) and prompt difficulty, clipped to [0, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1, dtype=float)
    trend = r0 + gain / (1 + np.exp(-(t - mid) / width))
    sd = np.sqrt(trend * (1 - trend) / 64) + 0.03
    return t, np.clip(trend + rng.normal(0, 1, steps) * sd, 0, 1)


def _logged(t: np.ndarray, reward: np.ndarray, every: int) -> list:
    """The rows a trainer logging every ``every`` steps writes: the mean of each interval."""
    run, events = Run(), []
    for end in range(every, len(t) + 1, every):
        value = float(reward[end - every : end].mean())
        events.append(run.step(int(t[end - 1]), reward_mean=value))
    return events


@pytest.mark.parametrize(("every", "lag"), [(1, 2), (5, 10), (10, 20)])
def test_a_reward_collapse_pages_at_every_logging_cadence(every: int, lag: int) -> None:
    """From step 251 (the first step of a logging interval): the row that shows it and one
    more row, every step logged 3 steps as before."""
    t, reward = _per_step(3, 600, 0.15, 0.5, 120, 48)
    reward[250:] = np.abs(np.random.default_rng(4).normal(0.01, 0.005, 350))  # step 251 on
    alerts = fired(fold_all(_logged(t, reward, every))[1], DETECTOR)
    assert alerts, f"silent at logging every {every}"
    assert 251 <= alerts[0].step <= 251 + lag, alerts[0].reason
    if every > 1:  # what the reason counts: steps, and the rows that stand for them
        assert f"one every {every} steps" in alerts[0].reason
        assert "logged rows" in alerts[0].reason


@pytest.mark.parametrize("every", [5, 10])
def test_a_reward_explosion_pages_at_a_coarse_cadence(every: int) -> None:
    """Three rows above the band (a healthy fast rise's averaged rows leave it for two)."""
    t, reward = _per_step(5, 600, 0.15, 0.5, 120, 48)
    reward[250:] *= 10.0
    alerts = fired(fold_all(_logged(t, reward, every))[1], DETECTOR)
    assert alerts and alerts[0].step == 250 + 3 * every
    assert "exploded above" in alerts[0].reason and "(3 logged rows" in alerts[0].reason


@pytest.mark.parametrize("seed", range(6))
def test_a_healthy_60_step_rise_logged_every_5_steps_does_not_page(seed: int) -> None:
    """The answer format learned: 0.08 -> 0.68 over ~60 steps (10-90 %). Counted in rows,
    the band was refreshed every 50 steps and paged 15 of 20 such runs."""
    t, reward = _per_step(2000 + seed, 500, 0.08, 0.6, 200, 60 / 4.4)
    assert not fired(fold_all(_logged(t, reward, 5))[1], DETECTOR)


def test_a_row_logged_every_10_steps_is_one_value_and_stands_for_10_steps_of_noise() -> None:
    assert _spacing((10, 20, 30, 40)) == 10 and _spacing((3,)) == 1
    assert _spacing((1, 2, 3, 4, 104)) == 1  # a gap in the log is not the cadence
    rows = (0.50, 0.52, 0.50, 0.52, 0.50)
    assert _step_noise(rows, 10) == pytest.approx(_step_noise(rows) * 10**0.5)


def test_a_state_stored_by_the_rule_that_counted_rows_keeps_its_open_episode() -> None:
    old = [[0.5] * 50, [], 0.5, 0.4, 0.6, True, -1, 3, 120, "run-1:x:120", 0, True]
    stored = {"@": "RewardBandState", "v": old}  # 12 fields, its episode at place 9
    state = state_codec.load(msgpack.packb(stored, use_bin_type=True))
    assert isinstance(state, RewardBandState) and state.episode == "run-1:x:120"
    assert state.history == () and not state.ready
    assert state_codec.load(state_codec.dump(state)) == state
