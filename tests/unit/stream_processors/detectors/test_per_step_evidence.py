"""The per-step rules (#17): evidence that makes a fault certain early, judged every step
or eval point, and cadence judged against the run's own configuration."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from events import CanaryProbeScored, RewardBatchFailed, RewardBatchScored
from stream_processors.detectors import Catalog, RunHealthFold, load_catalog
from stream_processors.detectors import sequential as seq
from stream_processors.detectors.config import CatalogError, parse_catalog
from stream_processors.detectors.entropy_collapse import Params as EntropyParams
from stream_processors.detectors.registry import BY_NAME
from tests.unit.stream_processors.detectors._builders import (
    Run,
    detector_state,
    fired,
    fold_all,
    resolved,
)


def _noisy(n: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, n)


# -- the CUSUM threshold ----------------------------------------------------------------


def test_threshold_meets_its_false_alarm_budget_and_grows_with_it() -> None:
    h = seq.threshold(0.5, 0.001, 1000)
    a = 2 * 0.5 * (h + 1.166)
    arl0 = (math.exp(a) - a - 1) / (2 * 0.25)
    assert arl0 == pytest.approx(1000 / 0.001, rel=1e-6)
    assert seq.threshold(0.5, 0.01, 1000) < h < seq.threshold(0.5, 0.0001, 1000)
    with pytest.raises(ValueError):
        seq.threshold(0.0, 0.001, 1000)


def test_forecast_predicts_a_steady_trend_and_flags_a_bend() -> None:
    p = EntropyParams(sigma_floor=1e-4)
    h = seq.threshold(0.5, 0.001, 1000)
    noise = _noisy(400, 1, 0.01)
    f = seq.FRESH
    for t in range(400):  # a steady fall of 0.3% a step: predicted, never flagged
        f = seq.update(f, t, -0.003 * t + noise[t], -1.0, p)
        assert f.s <= h
    f, hit = seq.FRESH, None
    for t in range(400):  # then it bends down 3% a step from t = 200
        y = -0.003 * t - (0.03 * (t - 200) if t >= 200 else 0.0) + noise[t]
        f = seq.update(f, t, y, -1.0, p)
        if hit is None and f.s > h:
            hit = (t, f.start)
    assert hit is not None and 200 <= hit[0] <= 210 and 195 <= hit[1] <= 205, hit


# -- dead run: no reward spread ---------------------------------------------------------


def _dead_run_steps(run: Run, **metrics_from_100: float) -> list:
    noise = _noisy(160, 2)
    events = []
    for s in range(160):
        metrics = {"reward_mean": 0.3 + 0.001 * s + noise[s], "reward_std": 0.3}
        if s >= 100:
            metrics.update(metrics_from_100)
        events.append(run.step(s, **metrics))
        events.append(run.usage(s, 100.0))
    return events


def test_zero_reward_spread_is_a_dead_run_within_five_steps_and_states_the_money() -> None:
    run = Run()
    events = _dead_run_steps(run, reward_std=0.0, reward_mean=1.0)
    priced = load_catalog().with_prices({"trainer": 0.001, "rollout_fleet": 0.0005}, "p-1")
    _, derived = fold_all(events, RunHealthFold(priced))
    (alert,) = fired(derived, "dead_run")
    assert alert.step == 104 and alert.window_start == 100  # 5 steps without spread
    observed = dict(alert.observed)
    # 400 GPU-s burned since step 100 (usage of steps 100-103) at $0.001/GPU-s
    assert observed["spend_usd_since"] == pytest.approx(0.4)
    assert observed["spend_usd"] == pytest.approx(10.4)  # the whole run
    assert "$0.40 burned since step 100" in alert.reason
    assert dict(alert.thresholds)["prices_version"] == "p-1"


def test_trl_frac_reward_zero_std_counts_and_a_partly_dead_batch_does_not() -> None:
    run = Run()
    events = _dead_run_steps(run, reward_std=0.2)  # spread overall ...
    for i, ev in enumerate(events):  # ... but TRL says which groups carry none
        if ev.type == "TrainerStepCompleted" and ev.step >= 100:
            events[i] = ev.model_copy(update={"extra": (("frac_reward_zero_std", 1.0),)})
    _, derived = fold_all(events)
    assert [a.step for a in fired(derived, "dead_run")] == [104]
    run = Run()
    events = _dead_run_steps(run)
    for i, ev in enumerate(events):  # 90% of the groups dead: still learning from 10%
        if ev.type == "TrainerStepCompleted":
            events[i] = ev.model_copy(update={"extra": (("frac_reward_zero_std", 0.9),)})
    _, derived = fold_all(events)
    assert not fired(derived, "dead_run")


def test_an_exactly_repeated_reward_mean_is_a_constant_reward() -> None:
    run = Run()  # a producer that reports the mean only
    events = [run.step(s, reward_mean=0.4 + 0.01 * math.sin(s) if s < 50 else 0.25)
              for s in range(80)]  # fmt: skip
    _, derived = fold_all(events)
    (alert,) = fired(derived, "dead_run")
    assert alert.window_start == 50 and alert.step == 57  # 8 identical means
    assert "exactly 0.25" in alert.reason and "spend unknown" in alert.reason


def test_a_dead_run_resolves_when_the_reward_spreads_again() -> None:
    run = Run()
    noise = _noisy(140, 3)
    events = [
        run.step(s, reward_mean=0.3 + noise[s], reward_std=0.0 if 40 <= s < 80 else 0.3)
        for s in range(140)
    ]
    _, derived = fold_all(events)
    assert [a.step for a in fired(derived, "dead_run")] == [44]
    assert [r.step for r in resolved(derived, "dead_run")] == [84]  # resolve_steps = 5


# -- reward hacking from sparse eval points ---------------------------------------------


@pytest.mark.parametrize("every", [50, 100])
def test_sparse_eval_hacking_is_judged_within_two_eval_intervals(every: int) -> None:
    run = Run()
    noise = _noisy(1000, 4, 0.01)
    events = []
    for s in range(1000):
        hacked = max(0, s - 500)
        events.append(run.step(s, reward_mean=0.3 + 0.0002 * s + 0.002 * hacked + noise[s]))
        if s % every == every - 1:
            events.append(run.eval(s, 0.4 + 0.0001 * s - 0.002 * hacked + noise[s] / 2))
    _, derived = fold_all(events)
    (alert,) = fired(derived, "reward_hacking")
    assert 500 <= alert.step <= 500 + 2 * every, alert.step
    assert alert.window_start < 500 and alert.window_end == alert.step


def test_one_high_eval_outlier_is_not_a_reference_for_a_fall() -> None:
    run = Run()
    noise = _noisy(400, 5, 0.01)
    events = []
    for s in range(400):
        events.append(run.step(s, reward_mean=0.2 + 0.003 * s + noise[s]))
        if s % 10 == 9:
            outlier = 0.08 if s == 199 else 0.0  # eight noise units above its neighbours
            events.append(run.eval(s, 0.3 + 0.0005 * s + noise[s] + outlier))
    _, derived = fold_all(events)
    assert not fired(derived, "reward_hacking")


def test_few_eval_points_need_a_larger_fall_than_a_known_noise() -> None:
    run = Run()  # two eval points, 200 items: the binomial guess, judged at z_eval_prior
    events = [run.submitted()]
    for s in range(21):
        events.append(run.step(s, reward_mean=0.8 + 0.06 * s))
        if s in (0, 10, 20):
            score = {0: 0.72, 10: 0.62, 20: 0.095}[s]  # 0.1 is ~3 binomial units: not yet
            events.append(run.eval(s, score).model_copy(update={"n_items": 200}))
    _, derived = fold_all(events)
    (alert,) = fired(derived, "reward_hacking")  # the real canary's shape: 0.72 -> 0.095
    assert alert.step == 20


# -- cadence from the run's configuration -----------------------------------------------


def _trainer_config(**cfg: object) -> dict:
    return {"config_json": json.dumps(cfg)}


def test_checkpoint_cadence_is_read_from_the_trainers_submitted_config() -> None:
    run = Run()
    events = [run.submitted(**_trainer_config(checkpoint={"every": 10}, eval_every=10))]
    for s in range(1, 60):
        events.append(run.step(s, reward_mean=0.3 + 0.01 * math.sin(s)))
        if s % 10 == 0:
            events.append(run.eval(s, 0.5))
        if s % 10 == 0 and s <= 20:  # the writer stops after step 20
            events.append(run.checkpoint(s))
    fold = RunHealthFold()
    state, derived = fold_all(events, fold)
    (alert,) = fired(derived, "checkpoint_cadence")
    # due at 30; late past 20 + 10 * 1.25 + 8 = 40.5
    assert alert.step == 41 and dict(alert.thresholds)["every_steps"] == 10
    assert detector_state(fold, state, "checkpoint_cadence").configured == 10
    assert not fired(derived, "eval_gate_missing")


def test_late_factor_is_capped_at_twice_the_cadence() -> None:
    catalog = Catalog("t", detectors={"checkpoint_cadence": {"params": {"late_factor": 5.0}}})
    run = Run()
    events = [run.submitted(checkpoint_every_steps=10)]
    events += [run.step(s, reward_mean=0.3 + 0.01 * math.sin(s)) for s in range(100)]
    _, derived = fold_all(events, RunHealthFold(catalog))
    assert [a.step for a in fired(derived, "checkpoint_cadence")] == [29]  # 0 + 2 * 10 + 8


def test_missing_eval_is_judged_against_the_configured_eval_cadence() -> None:
    run = Run()
    events = [run.submitted(test_freq=20)]  # verl's key
    for s in range(100):
        events.append(run.step(s, reward_mean=0.3 + 0.01 * math.sin(s)))
        if s % 20 == 0 and s < 40:
            events.append(run.eval(s, 0.5))
    _, derived = fold_all(events)
    assert [a.step for a in fired(derived, "eval_gate_missing")] == [50]  # 20 + 1.5 x 20


# -- trainer idle, rollout drift --------------------------------------------------------


def test_trainer_idle_is_judged_per_step() -> None:
    run = Run()
    events = [run.phases(s, wall=30.0, idle=6.0 if s < 100 else 27.0) for s in range(130)]
    _, derived = fold_all(events)
    (alert,) = fired(derived, "trainer_idle")
    assert 100 <= alert.step <= 104 and alert.window_start == alert.step


def test_rollout_drift_fires_while_its_window_fills() -> None:
    run = Run()
    events = []
    for s in range(120):
        events.append(run.rollout(s, truncation_rate=0.02 if s < 80 else 0.5))
        events.append(run.step(s, reward_mean=0.3 + 0.01 * math.sin(s)))
    _, derived = fold_all(events)
    (alert,) = fired(derived, "rollout_drift")
    assert 80 <= alert.step <= 85  # the window [75, 100) had 5 batches when it shifted


# -- reward integrity -------------------------------------------------------------------


class _Rewards:
    """Reward facts of one run, as the sandbox client publishes them."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def scored(self, step: int, lo: float = 0.0, hi: float = 1.0) -> RewardBatchScored:
        env = self.run._env(step)
        return RewardBatchScored(**env, batch_id=f"b{step}", n=64, score_mean=(lo + hi) / 2,
                                 score_std=(hi - lo) / 3, score_min=lo, score_max=hi,
                                 duration_s=0.1)  # fmt: skip

    def canary(self, step: int, mean: float, inflated: bool = False) -> CanaryProbeScored:
        env = self.run._env(step)
        return CanaryProbeScored(**env, n=8, score_mean=mean, expected_mean=0.0,
                                 inflated=inflated)  # fmt: skip

    def refused(
        self, step: int, message: str, cause: str = "tenant_bad_output"
    ) -> RewardBatchFailed:
        env = self.run._env(step)
        return RewardBatchFailed(**env, batch_id=f"f{step}", n=64, cause=cause,  # type: ignore[arg-type]
                                 message=message)  # fmt: skip


def test_inflated_canaries_fire_booked_to_the_tenant_and_clean_batches_resolve() -> None:
    r = _Rewards(Run())
    events = []
    for s in range(1, 41):
        events.append(r.scored(s))
        if s % 5 == 0:
            events.append(r.canary(s, 0.6 if 10 <= s < 20 else 0.0))
    _, derived = fold_all(events)
    (alert,) = fired(derived, "reward_integrity")
    assert alert.step == 15 and alert.window_start == 10  # the second inflated probe group
    assert dict(alert.observed)["booked_to"] == "tenant_reward"
    assert alert.routing == "page" and "canary" in alert.reason
    # 8 clean outcomes in a row: batches 16-22 and the clean probe group at 20
    assert [x.step for x in resolved(derived, "reward_integrity")] == [22]


def test_slow_canary_drift_fires_though_no_group_is_inflated() -> None:
    r = _Rewards(Run())
    events = [r.canary(s, 0.2) for s in range(5, 45, 5)]  # each under the 0.25 tolerance
    _, derived = fold_all(events)
    (alert,) = fired(derived, "reward_integrity")
    assert alert.step == 20 and "drift" in alert.reason


def test_constant_scores_and_refused_nan_batches_fire_other_failures_do_not() -> None:
    r = _Rewards(Run())
    _, derived = fold_all([r.scored(s, 0.5, 0.5) for s in range(1, 20)])
    assert [a.step for a in fired(derived, "reward_integrity")] == [8]
    r = _Rewards(Run())
    events = [r.refused(s, "crash", cause="tenant_crash") for s in range(1, 20)]
    events += [r.scored(s) for s in range(20, 24)]
    _, derived = fold_all(events)
    assert not fired(derived, "reward_integrity")  # the ledger's business, not integrity
    r = _Rewards(Run())
    events = []
    for s in range(1, 20):
        bad = s % 2 == 0
        events.append(r.refused(s, "3 score(s) are NaN or infinite") if bad else r.scored(s))
    _, derived = fold_all(events)
    (alert,) = fired(derived, "reward_integrity")
    assert alert.step == 4 and "NaN or infinite" in alert.reason


# -- state and catalog ------------------------------------------------------------------


def test_a_state_stored_before_new_detectors_loads_with_fresh_ones() -> None:
    run = Run()
    fold = RunHealthFold()
    state, _ = fold_all([run.step(s, reward_mean=0.1 * s) for s in range(5)], fold)
    old = state._replace(detectors=state.detectors[:-1], marks=state.marks[:5],
                         at_mark=state.at_mark[:5])  # fmt: skip
    loaded = fold.load_state(fold.dump_state(old))
    assert len(loaded.detectors) == len(fold.detectors) and len(loaded.marks) == len(state.marks)
    assert loaded.detectors[-1] == BY_NAME["reward_integrity"].initial()


def test_prices_are_attached_below_the_file_and_a_mapping_param_is_coerced() -> None:
    doc = {"version": "t", "detectors": {"dead_run": {"params": {
        "usd_per_gpu_second": {"trainer": 2}}}}}  # fmt: skip
    catalog = parse_catalog(doc, BY_NAME).with_prices({"trainer": 1.0}, "p")
    p = catalog.settings(BY_NAME["dead_run"], "t", "grpo").params
    assert p.usd_per_gpu_second == (("trainer", 2.0),) and p.prices_version == "p"
    with pytest.raises(CatalogError, match="usd_per_gpu_second"):
        parse_catalog({"version": "t", "detectors": {"dead_run": {"params": {
            "usd_per_gpu_second": 3}}}}, BY_NAME)  # fmt: skip
