"""Seed 000's executed cases, through the folds (same series, same rng, same asserts)."""

from __future__ import annotations

import numpy as np

from stream_processors.detectors import RunHealthFold
from tests.unit.stream_processors.detectors._builders import Run, fired, fold_all

STEPS = 300


def _seed_series() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)

    def noise(scale: float) -> np.ndarray:
        return rng.normal(0.0, scale, STEPS // 2)

    reward = np.concatenate(
        [
            np.linspace(0.2, 0.5, STEPS // 2) + noise(0.01),
            np.linspace(0.5, 0.9, STEPS // 2) + noise(0.01),
        ]
    )
    evals = np.concatenate(
        [
            np.linspace(0.30, 0.45, STEPS // 2) + noise(0.01),
            np.linspace(0.45, 0.10, STEPS // 2) + noise(0.01),
        ]
    )
    flat = 2.0 + rng.normal(0.0, 0.05, STEPS)
    collapse = np.concatenate(
        [
            2.0 + rng.normal(0.0, 0.05, STEPS // 2),
            2.0 * np.exp(-np.arange(STEPS // 2) / 40.0) + rng.normal(0.0, 0.01, STEPS // 2),
        ]
    )
    return reward, evals, flat, collapse


def _hacking_run(reward: np.ndarray, evals: np.ndarray, *, eval_first: bool = False) -> list:
    run = Run()
    events = []
    for s in range(len(reward)):
        pair = [run.step(s, reward_mean=float(reward[s])), run.eval(s, float(evals[s]))]
        events.extend(reversed(pair) if eval_first else pair)
    return events


def test_hacking_fires_inside_the_hacking_segment_once() -> None:
    """The seed fires on its three 50-step windows (first at step 199); judged at every
    eval point, the first disagreement beyond the noise comes within a few steps. (The
    seed's training reward rises at exactly ``tau`` before the change and 1.3x it after:
    its 20-step slope clears ``tau`` about 15 steps in.)"""
    reward, evals, _, _ = _seed_series()
    fold = RunHealthFold()
    _, derived = fold_all(_hacking_run(reward, evals), fold)
    alerts = fired(derived, "reward_hacking")
    assert len(alerts) == 1, alerts  # stays true: fires once, not at every eval point
    assert STEPS // 2 <= alerts[0].step <= STEPS // 2 + 20, alerts[0].step
    assert alerts[0].window_start >= STEPS // 2 - 5 and alerts[0].window_end == alerts[0].step
    assert alerts[0].routing == "page" and "eval" in alerts[0].reason
    assert alerts[0].first_response.startswith("stop the run")


def test_hacking_same_result_whichever_stream_reports_a_step_first() -> None:
    reward, evals, _, _ = _seed_series()
    a = fired(fold_all(_hacking_run(reward, evals))[1], "reward_hacking")
    b = fired(fold_all(_hacking_run(reward, evals, eval_first=True))[1], "reward_hacking")
    assert len(a) == len(b) == 1
    assert abs(a[0].step - b[0].step) <= 1  # the step's own reward may or may not count


def test_hacking_silent_on_healthy_half_and_on_reward_vs_itself() -> None:
    reward, evals, _, _ = _seed_series()
    half = STEPS // 2
    _, derived = fold_all(_hacking_run(reward[:half], evals[:half]))
    assert not fired(derived, "reward_hacking")
    _, derived = fold_all(_hacking_run(reward, reward.copy()))
    assert not fired(derived, "reward_hacking")


def _entropy_run(series: np.ndarray) -> list:
    run = Run()
    return [run.step(s, entropy=float(x)) for s, x in enumerate(series)]


def test_entropy_collapse_flagged_inside_collapse_region() -> None:
    _, _, _, collapse = _seed_series()
    _, derived = fold_all(_entropy_run(collapse))
    alerts = fired(derived, "entropy_collapse")
    assert len(alerts) == 1
    # the seed flags it at step 224 (three 25-step windows); the CUSUM within a few steps
    assert STEPS // 2 <= alerts[0].step <= STEPS // 2 + 20, alerts[0].step
    assert alerts[0].window_start >= STEPS // 2


def test_entropy_never_fires_on_noisy_flat_or_constant() -> None:
    _, _, flat, _ = _seed_series()
    assert not fired(fold_all(_entropy_run(flat))[1], "entropy_collapse")
    assert not fired(fold_all(_entropy_run(np.full(STEPS, 2.0)))[1], "entropy_collapse")
