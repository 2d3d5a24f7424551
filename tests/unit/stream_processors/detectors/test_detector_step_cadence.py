"""dead_run, kl_blowup and entropy_collapse count steps, not logged rows (review, finding 5).

TRL logs the mean of every ``logging_steps`` steps (10 by default). Counted in rows, a
constant reward paged 40 steps late at a row every 10 steps (4 every step), a KL blowup 30
(19) and an entropy collapse 40 (13-17); every step logged, nothing changes."""

from __future__ import annotations

import math

import msgpack
import numpy as np

from stream_processors.detectors import state_codec
from stream_processors.detectors.entropy_collapse import Params as EntropyParams
from stream_processors.detectors.kl_blowup import KlState
from stream_processors.detectors.sequential import FRESH
from tests.unit.stream_processors.detectors._builders import Run, fired, fold_all


def _first(events: list, detector: str) -> int | None:
    hits = [a.step for a in fired(fold_all(events)[1], detector)]
    return hits[0] if hits else None


def _reward_run(every: int, dead_from: int, *, with_std: bool, steps: int = 400) -> list:
    """Rows every ``every`` steps: a moving reward with spread, then (from ``dead_from``) a
    constant 0.0 (with ``reward_std`` 0 where ``with_std``)."""
    rng = np.random.default_rng(7)
    run, events = Run(), []
    for s in range(every, steps + 1, every):
        if s >= dead_from:
            kw = {"reward_mean": 0.0, "reward_std": 0.0} if with_std else {"reward_mean": 0.0}
        else:
            kw = {"reward_mean": float(0.3 + 0.001 * s + rng.normal(0, 0.03))}
            if with_std:
                kw["reward_std"] = 0.35
        events.append(run.step(s, **kw))
    return events


def test_dead_run_zero_spread_pages_by_steps_at_a_row_every_10() -> None:
    # rows 250 and 260 without spread cover 11 steps >= zero_std_steps 5 (rows counted: 290)
    assert _first(_reward_run(10, 250, with_std=True), "dead_run") == 260
    assert _first(_reward_run(5, 250, with_std=True), "dead_run") == 255


def test_dead_run_every_step_unchanged() -> None:
    assert _first(_reward_run(1, 250, with_std=True), "dead_run") == 254  # 5 steps
    assert _first(_reward_run(1, 250, with_std=False), "dead_run") == 257  # 8 equal means


def test_dead_run_constant_mean_needs_steps_and_rows() -> None:
    # 4 equal rows covering 31 steps >= constant_steps 8 (rows counted: 8 rows, step 320)
    assert _first(_reward_run(10, 250, with_std=False), "dead_run") == 280


def test_dead_run_two_equal_averaged_rows_do_not_page() -> None:
    run = Run()
    rows = [0.31, 0.29, 0.3, 0.3, 0.33, 0.28, 0.3, 0.3, 0.3, 0.32, 0.27]
    events = [run.step(10 * (i + 1), reward_mean=v, reward_std=0.3) for i, v in enumerate(rows)]
    assert _first(events, "dead_run") is None


def _kl_run(every: int, kl_at, steps: int = 200) -> list:
    run = Run()
    return [run.step(s, kl_to_ref=kl_at(s)) for s in range(every, steps + 1, every)]


def test_kl_ceiling_one_row_of_ten_steps_above_pages() -> None:
    # one row averaging 10 steps above the ceiling covers 10 steps >= consecutive 2
    assert _first(_kl_run(10, lambda s: 0.9 if s >= 120 else 0.1), "kl_blowup") == 120


def test_kl_ceiling_every_step_still_two_steps() -> None:
    assert _first(_kl_run(1, lambda s: 0.9 if s == 120 else 0.1), "kl_blowup") is None
    assert _first(_kl_run(1, lambda s: 0.9 if s >= 120 else 0.1), "kl_blowup") == 121


def test_kl_rise_judged_on_rows_spanning_the_window() -> None:
    # 5 rows of a 50-step window rising 0.3 (cap 0.2): judged, though fewer than 10 rows
    alerts = fired(fold_all(_kl_run(10, lambda s: 0.05 + 0.006 * (s % 50)))[1], "kl_blowup")
    assert alerts and alerts[0].step == 50
    assert "rose" in alerts[0].reason


def test_kl_state_of_the_row_rule_keeps_its_episode() -> None:
    raw = msgpack.packb({"@": "KlState", "v": [0, 0, 2, None, 0.1, "ep-1"]}, use_bin_type=True)
    assert state_codec.load(raw) == KlState(episode="ep-1")


def test_entropy_budget_horizon_in_rows() -> None:
    from stream_processors.detectors.entropy_collapse import _horizon_rows

    p = EntropyParams()
    every_step = FRESH._replace(n=30, x0=1, last=30)
    every_ten = FRESH._replace(n=30, x0=10, last=300)
    assert _horizon_rows(p, every_step) == p.horizon_steps
    assert _horizon_rows(p, every_ten) == p.horizon_steps // 10
    gappy = FRESH._replace(n=30, x0=1, last=33)  # a few steps missing: still every step
    assert _horizon_rows(p, gappy) == p.horizon_steps


def _entropy_run(every: int, collapse_from: int, steps: int = 400, seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    ent = 0.6 * (1 - 0.4 * (1 - np.exp(-t / 160))) * np.exp(rng.normal(0, 0.04, steps))
    ent = ent * np.exp(-np.maximum(t - collapse_from, 0) / 40.0)
    run = Run()
    return [
        run.step(int(s), entropy=float(ent[s - every : s].mean()))
        for s in range(every, steps + 1, every)
    ]


def test_entropy_collapse_at_a_row_every_10_pages_a_row_sooner() -> None:
    # 3 rows of the collapse at one row per 10 steps (counted in rows' budget: 4, step 290)
    assert _first(_entropy_run(10, 250), "entropy_collapse") == 280


def test_entropy_healthy_rows_every_10_do_not_fire() -> None:
    for seed in range(20):
        assert _first(_entropy_run(10, 10**6, seed=seed), "entropy_collapse") is None
    assert math.isfinite(EntropyParams().drop_rel)
