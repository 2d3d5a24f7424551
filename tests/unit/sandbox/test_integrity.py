"""Degenerate-output fold and canary mixing: pure functions."""

from __future__ import annotations

import random

from sandbox.integrity import (
    CanaryProbe,
    CanarySet,
    DegenerateState,
    apply_degenerate,
    judge_canaries,
    mix_canaries,
    split_canaries,
)


def test_degenerate_flags_only_after_a_full_window_of_constant_batches() -> None:
    state = DegenerateState(window=3)
    flags = []
    for scores in [(1.0, 1.0), (0.5, 0.5), (0.2, 0.2), (0.2, 0.3), (0.1, 0.1)]:
        state, report = apply_degenerate(state, scores)
        flags.append(report.flagged)
    assert flags == [False, False, True, False, False]
    assert report.constant_rate == 2 / 3
    assert state.recent == (True, False, True)


def test_fold_is_pure() -> None:
    s0 = DegenerateState(window=2)
    a = apply_degenerate(s0, (1.0, 1.0))
    b = apply_degenerate(s0, (1.0, 1.0))
    assert a == b and s0.recent == ()


def test_mix_and_split_round_trip() -> None:
    probes = (CanaryProbe("a", "pa", "ca", 0.0), CanaryProbe("b", "pb", "cb", 1.0))
    batch = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(5)]
    for seed in range(20):
        mixed, pos = mix_canaries(batch, probes, random.Random(seed))
        assert len(mixed) == 7 and len(pos) == 2
        assert [mixed[p]["prompt"] for p in pos] == ["pa", "pb"]
        scores = tuple(float(i) for i in range(7))
        got, probe_scores = split_canaries(scores, pos)
        assert len(got) == 5 and probe_scores == tuple(float(p) for p in pos)
        assert [m for i, m in enumerate(mixed) if i not in pos] == batch


def test_judge() -> None:
    cs = CanarySet(
        (CanaryProbe("a", "p", "c", 0.0), CanaryProbe("b", "p", "c", 1.0)), tolerance=0.1
    )
    assert not judge_canaries(cs, (0.0, 1.1)).inflated
    v = judge_canaries(cs, (0.5, 1.0))
    assert v.inflated and v.expected_mean == 0.5 and v.score_mean == 0.75
