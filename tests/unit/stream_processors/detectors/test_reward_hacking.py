"""reward_hacking (#17, round two): the newest eval point against the mean of earlier ones,
a threshold derived from a per-run false-alarm budget, and the training reward's
autocorrelation-corrected rise as the second, independent condition."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from events.envelope import EventBase
from stream_processors.detectors import RunHealthFold, load_catalog
from stream_processors.detectors.base import RunContext, Settings
from stream_processors.detectors.reward_hacking import (
    DETECTOR,
    Params,
    RewardSums,
    prior_noise,
    reward_rise,
)
from stream_processors.detectors.student_t import t_isf, t_sf
from tests.unit.stream_processors.detectors._builders import Run, fired, fold_all, resolved


def _settings(**params: float) -> Settings[Params]:
    return Settings(
        detector="reward_hacking",
        layer="algorithmic",
        routing="page",
        first_response="stop",
        params=dataclasses.replace(Params(), **params),
        config_version="test",
    )


def _fold(events: list[EventBase], cfg: Settings[Params] | None = None) -> list:
    """The detector alone over one run's events: every AlertFired / AlertResolved."""
    cfg = cfg or _settings()
    ctx = RunContext(run_id="run-1", tenant_id="tenant-a", algorithm="grpo")
    st, out = DETECTOR.initial(), []
    for ev in events:
        if ev.type in DETECTOR.handles:
            st, derived = DETECTOR.apply(st, ev, cfg, ctx)
            out.extend(derived)
    return out


def _run(
    steps: int,
    every: int,
    reward: np.ndarray,
    evals: np.ndarray,
    n_items: int = 0,
) -> list[EventBase]:
    run, events = Run(), []
    for s in range(steps):
        events.append(run.step(s, reward_mean=float(reward[s])))
        if s % every == every - 1:
            ev = run.eval(s, float(evals[s]))
            events.append(ev.model_copy(update={"n_items": n_items}) if n_items else ev)
    return events


def _ar1(n: int, phi: float, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros(n)
    shocks = rng.normal(0.0, sigma, n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + shocks[i]
    return x


def _sums(xs: np.ndarray, ys: np.ndarray) -> RewardSums:
    dd = float(np.sum(np.diff(ys) ** 2))
    return RewardSums(
        len(xs), float(xs.sum()), float(ys.sum()), float((xs * xs).sum()),
        float((xs * ys).sum()), float((ys * ys).sum()), float(ys[-1]), dd,
    )  # fmt: skip


# -- Student's t -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "nu", "table"),
    [(0.05, 1, 6.3138), (0.05, 2, 2.9200), (0.01, 4, 3.7469), (0.025, 10, 2.2281),
     (0.005, 7, 3.4995), (0.001, 30, 3.3852)],
)  # fmt: skip
def test_student_t_quantiles_match_the_table(alpha: float, nu: int, table: float) -> None:
    assert t_isf(alpha, nu) == pytest.approx(table, abs=2e-4)
    assert t_sf(t_isf(alpha, nu), nu) == pytest.approx(alpha, rel=1e-9)


def test_student_t_tail_is_symmetric_heavier_than_gaussian_and_rounds_dof_down() -> None:
    assert t_sf(0.0, 5) == 0.5
    assert t_sf(-1.3, 9) == pytest.approx(1.0 - t_sf(1.3, 9))
    gauss = 0.5 * math.erfc(3.0 / math.sqrt(2.0))
    assert t_sf(3.0, 4) > t_sf(3.0, 30) > gauss
    assert t_sf(2.0, 6.9) == t_sf(2.0, 6)  # a fractional dof is rounded to the heavier tail
    with pytest.raises(ValueError):
        t_isf(0.5, 10)


# -- the reward's rise, corrected for autocorrelation -------------------------------------


def test_reward_rise_estimates_autocorrelation_and_deflates_the_slope_t() -> None:
    xs = np.arange(400, dtype=float)
    trend = 0.002 * xs
    iid = trend + np.random.default_rng(1).normal(0.0, 0.02, 400)
    slope, _, phi = reward_rise(_sums(xs, iid), 400, 0.8)
    assert slope == pytest.approx(0.002, rel=0.05)
    assert phi < 0.1  # the trend's own share of the changes is taken out
    ar = trend + _ar1(400, 0.6, 0.02, 2)
    slope_ar, t_ar, phi_ar = reward_rise(_sums(xs, ar), 400, 0.8)
    assert 0.45 < phi_ar < 0.75
    # the slope's plain t, for comparison: what the deflation removes
    resid = ar - np.polyval(np.polyfit(xs, ar, 1), xs)
    plain = slope_ar / math.sqrt(resid @ resid / 398 / np.sum((xs - xs.mean()) ** 2))
    assert t_ar == pytest.approx(plain * math.sqrt((1 - phi_ar) / (1 + phi_ar)), rel=1e-6)
    assert t_ar < plain / 1.6
    # a noiseless line: an exact rise
    assert reward_rise(_sums(xs[:20], trend[:20]), 20, 0.8)[1] > 1e6


# -- the false-alarm budget --------------------------------------------------------------


def _hacked(every: int, steps: int = 400, at: int = 200, seed: int = 3) -> list[EventBase]:
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=float)
    ramp = np.maximum(0.0, t - at)
    reward = 0.3 + 0.0005 * t + 0.004 * ramp + rng.normal(0.0, 0.01, steps)
    evals = 0.5 + 0.0002 * t - 0.004 * ramp + rng.normal(0.0, 0.01, steps)
    return _run(steps, every, reward, evals)


def test_threshold_follows_the_budget_and_the_eval_cadence() -> None:
    def first(every: int, **params: float) -> dict:
        (alert,) = [a for a in _fold(_hacked(every), _settings(**params)) if a.type == "AlertFired"]
        return dict(alert.thresholds)

    dense, sparse = first(5), first(20)
    alpha_r = t_sf(2.5, 18)
    # alpha_eval = fa_per_run * cadence / horizon_steps / alpha_reward (Bonferroni)
    assert dense["alpha_eval"] == pytest.approx(0.02 * 5 / 1000 / alpha_r, rel=1e-4)
    assert sparse["alpha_eval"] == pytest.approx(0.02 * 20 / 1000 / alpha_r, rel=1e-4)
    assert sparse["eval_fall_t"] < dense["eval_fall_t"]  # fewer chances to be wrong
    strict = first(5, fa_per_run=0.002)
    assert strict["alpha_eval"] == pytest.approx(dense["alpha_eval"] / 10, rel=1e-4)
    assert strict["eval_fall_t"] > dense["eval_fall_t"]
    assert dense["fa_per_run"] == 0.02 and dense["horizon_steps"] == 1000


def test_catalog_states_the_budget() -> None:
    catalog = load_catalog()
    params = catalog.settings(DETECTOR, "tenant-a", "grpo").params
    assert (params.fa_per_run, params.horizon_steps, params.refs) == (0.02, 1000, 8)
    assert catalog.version >= "2026-12-08.1"


@pytest.mark.parametrize("every", [5, 10, 20])
def test_eval_fall_with_a_rising_reward_is_caught_within_two_eval_intervals(every: int) -> None:
    alerts = [a for a in _fold(_hacked(every)) if a.type == "AlertFired"]
    assert len(alerts) == 1
    alert = alerts[0]
    assert 200 <= alert.step <= 200 + 2 * every, alert.step
    assert alert.window_start < 200 <= alert.window_end == alert.step
    # the change point: the newest reference still at the level (the eval at step 199)
    assert alert.alert_id == "run-1:reward_hacking:199"
    observed = dict(alert.observed)
    assert observed["eval_fall_t"] > dict(alert.thresholds)["eval_fall_t"]
    assert observed["reward_slope_t"] > 2.5 and observed["eval_dof"] > 3
    assert "noise units" in alert.reason and "rose" in alert.reason


def test_no_page_without_both_conditions() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(400, dtype=float)
    ramp = np.maximum(0.0, t - 200)
    flat_reward = 0.3 + rng.normal(0.0, 0.01, 400)
    falling_eval = 0.5 - 0.004 * ramp + rng.normal(0.0, 0.01, 400)
    # the eval falls but the reward does not rise: a regression, not reward hacking
    assert not _fold(_run(400, 10, flat_reward, falling_eval))
    rising_reward = 0.3 + 0.004 * t + rng.normal(0.0, 0.01, 400)
    flat_eval = 0.5 + rng.normal(0.0, 0.01, 400)
    # the reward climbs and the eval holds: gains that do not transfer, not a fall
    assert not _fold(_run(400, 10, rising_reward, flat_eval))


def test_an_autocorrelated_reward_bump_is_not_a_rise() -> None:
    """AR(1) batch-mean noise makes 20-step slopes look significant: deflated, they are not.
    Counted over many steady runs whose eval dips by chance."""
    fires_plain = fires = 0
    for seed in range(60):
        reward = 0.3 + _ar1(300, 0.7, 0.02, seed)
        evals = 0.5 + np.random.default_rng(1000 + seed).normal(0.0, 0.01, 300)
        events = _run(300, 5, reward, evals)
        fires += bool(_fold(events, _settings(fa_per_run=0.2)))
        fires_plain += bool(_fold(events, _settings(fa_per_run=0.2, phi_max=0.0)))
    assert 3 * fires < 2 * fires_plain


def test_steady_runs_page_within_the_budget() -> None:
    """The joint null (eval and reward noise about a level): the share of runs with a false
    page stays under ``fa_per_run`` (Bonferroni over the run's eval points, so below it),
    and a larger budget buys a lower threshold (more pages)."""
    runs, steps = 100, 1000
    tight = loose = 0
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        reward = 0.3 + rng.normal(0.0, 0.02, steps)
        evals = 0.5 + rng.normal(0.0, 0.01, steps)
        events = _run(steps, 10, reward, evals)
        tight += any(a.type == "AlertFired" for a in _fold(events, _settings(fa_per_run=0.02)))
        loose += any(a.type == "AlertFired" for a in _fold(events, _settings(fa_per_run=1.0)))
    assert tight / runs <= 0.02
    assert tight < loose <= runs


def test_one_high_outlier_among_the_references_makes_no_fall() -> None:
    rng = np.random.default_rng(6)
    t = np.arange(300, dtype=float)
    reward = 0.2 + 0.004 * t + rng.normal(0.0, 0.01, 300)
    evals = 0.5 + rng.normal(0.0, 0.005, 300)
    evals[199] += 0.1  # twenty noise units above its neighbours, then back
    assert not _fold(_run(300, 10, reward, evals))


def test_fires_once_and_resolves_when_the_eval_is_back() -> None:
    rng = np.random.default_rng(7)
    t = np.arange(500, dtype=float)
    dip = np.where((t >= 200) & (t < 260), 0.004 * np.minimum(t - 200, 30), 0.0)
    reward = 0.3 + 0.0005 * t + 0.004 * np.maximum(0.0, np.minimum(t, 260) - 200)
    reward = reward + rng.normal(0.0, 0.01, 500)
    evals = 0.5 - dip + rng.normal(0.0, 0.01, 500)
    events = _run(500, 10, reward, evals)
    out = _fold(events)
    alerts = [a for a in out if a.type == "AlertFired"]
    resolves = [a for a in out if a.type == "AlertResolved"]
    assert len(alerts) == 1 and 200 <= alerts[0].step <= 220
    assert len(resolves) == 1 and resolves[0].alert_id == alerts[0].alert_id
    assert resolves[0].step >= 269 and "back to" in resolves[0].reason


def test_state_survives_a_dump_and_load_mid_run() -> None:
    events = _hacked(10)
    fold = RunHealthFold()
    whole_state, whole = fold_all(events, fold)
    state, first = fold_all(events[:300], fold)
    state = fold.load_state(fold.dump_state(state))
    rest = []
    for ev in events[300:]:
        state, out = fold.apply(state, ev)
        rest.extend(out)
    assert [a.alert_id for a in fired([*first, *rest], "reward_hacking")] == [
        a.alert_id for a in fired(whole, "reward_hacking")
    ]
    assert fold.dump_state(state) == fold.dump_state(whole_state)
    assert not resolved(whole, "reward_hacking")


def test_a_state_persisted_by_round_ones_rule_loads_afresh_keeping_its_episode() -> None:
    import msgpack

    from stream_processors.detectors import state_codec
    from stream_processors.detectors.reward_hacking import HackingState

    sums = {"@": "Sums", "v": [3, 3.0, 1.5, 5.0, 1.5, 0.75, 0.5]}
    stored = {"@": "HackingState", "v": [sums, 0, [[0, 0.4, sums]], [], [0.01], 200,
                                         "run-1:reward_hacking:5", 1, 0.5]}  # fmt: skip
    state = state_codec.load(msgpack.packb(stored, use_bin_type=True))
    assert isinstance(state, HackingState) and state.cum.n == 0 and state.evals.points == ()
    assert (state.evals.episode, state.evals.calm, state.evals.fell_from) == (
        "run-1:reward_hacking:5", 1, 0.5)  # fmt: skip
    assert state_codec.load(state_codec.dump(state)) == state
    # the carried episode is the detector's: it resolves once the eval is back at 0.5
    cfg, ctx = _settings(), RunContext(run_id="run-1", tenant_id="tenant-a", algorithm="grpo")
    out = []
    for ev in _hacked(10):
        if ev.type in DETECTOR.handles:
            state, derived = DETECTOR.apply(state, ev, cfg, ctx)
            out.extend(derived)
    assert out[0].type == "AlertResolved" and out[0].alert_id == "run-1:reward_hacking:5"
    assert [a.type for a in out[1:]] == ["AlertFired"]  # the later fall: a new episode


def test_a_state_persisted_before_issue_17_loads_afresh_keeping_its_episode() -> None:
    import msgpack

    from stream_processors.detectors import state_codec
    from stream_processors.detectors.reward_hacking import HackingState

    # main's 8 fields before issue 17: win, reward sums, eval sums, reward_step, eval_step,
    # true_windows, episode, calm
    sums = {"@": "Sums", "v": [3, 3.0, 1.5, 5.0, 1.5, 0.75]}
    stored = {"@": "HackingState", "v": [4, sums, sums, 199, 195, [3],
                                         "run-1:reward_hacking:150", 0]}  # fmt: skip
    state = state_codec.load(msgpack.packb(stored, use_bin_type=True))
    assert isinstance(state, HackingState) and state.cum.n == 0 and state.evals.points == ()
    assert (state.evals.episode, state.evals.calm) == ("run-1:reward_hacking:150", 0)


# -- few eval points, the eval set's size not reported (#17 review) ------------------------


def _imported_healthy(
    scores: list[float], n_items: int = 0, every: int = 10, slope: float = 0.004
) -> list[EventBase]:
    """A healthy TRL run as imported: the reward climbs ``slope`` a step, an eval every 10
    steps moving by its own noise (a few hundred prompts: 0.03 a point); ``n_items`` 0 is
    what the importer, the hooks and ``--eval-file`` send when the count is not logged."""
    rng = np.random.default_rng(11)
    run, events = Run(), []
    for s in range(1, every * len(scores) + 1):
        reward = 0.15 + slope * s + float(rng.normal(0, 0.03))
        events.append(run.step(s, reward_mean=reward))
        if s % every == 0:
            ev = run.eval(s, scores[s // every - 1])
            events.append(ev.model_copy(update={"n_items": n_items}) if n_items else ev)
    return events


#: the reviewer's healthy run (t10 (A)): its first eval points, eval noise 0.03
HEALTHY_FIRST_EVALS = [0.266, 0.247, 0.219, 0.227, 0.31, 0.248]


def test_an_unreported_eval_size_guesses_a_small_eval_sets_noise() -> None:
    """It guessed noise_floor_abs + 1 % of the score (0.004): the healthy run above paged at
    its third eval point (0.266 -> 0.219: "7.8 noise units")."""
    assert not _fold(_imported_healthy(HEALTHY_FIRST_EVALS))
    # the guess: binomial over prior_items (50) items; a reported count is used as it is
    p = Params()
    assert prior_noise(0.3, 0, p) == pytest.approx(math.sqrt(0.21 / 50))
    assert prior_noise(0.3, 500, p) == pytest.approx(math.sqrt(0.21 / 500))
    assert prior_noise(0.3, 0, dataclasses.replace(p, prior_items=200)) == pytest.approx(
        math.sqrt(0.21 / 200)
    )
    assert load_catalog().settings(DETECTOR, "tenant-a", "grpo").params.prior_items == 50


def test_a_score_of_uncounted_items_outside_zero_one_is_not_judged_on_a_guess() -> None:
    """No binomial noise, no known scale: a guess of 0.002 + 1 % called a 5 % dip of an
    eval reported on a 0-10 scale a fall of many units. A score of counted items that
    fell below 0 keeps the floor (it fell a long way: the synthetic hacking at an eval
    every 50 / 100 steps is judged there)."""
    p = Params()
    assert prior_noise(6.0, 0, p) is None and prior_noise(-0.1, 0, p) is None
    assert prior_noise(-0.1, 500, p) == pytest.approx(0.002 + 0.01 * 0.1)
    assert not _fold(_imported_healthy([6.4, 6.2, 5.9, 6.1, 6.0, 5.8]))


def test_few_points_with_an_unreported_size_still_catch_a_collapse_of_the_eval() -> None:
    """The real trainer's canary shape (0.72 -> 0.095) with no n_items: the conservative
    guess still calls a fall of most of the score."""
    events = _imported_healthy([0.72, 0.70, 0.095], slope=0.01)
    (alert,) = [a for a in _fold(events) if a.type == "AlertFired"]
    assert alert.step == 30 and "noise guessed" in alert.reason
    # and a fall the guess of a small set cannot tell from noise is left to the estimate
    assert not _fold(_imported_healthy([0.72, 0.70, 0.55], slope=0.01))
