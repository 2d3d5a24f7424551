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


def test_probes_take_the_shape_of_the_batch_they_ride_in() -> None:
    """Same keys, same order, same value types as a real item: the probe's own values
    where it has one of that type, else the real item's (#20 item 5)."""
    batch = [{"answer": "42", "prompt": f"q{i}", "completion": "c", "id": i} for i in range(4)]
    probes = (
        CanaryProbe("a", "pa", "ca", 0.0, fields=(("answer", "7"), ("extra", 1))),
        CanaryProbe("b", "pb", "cb", 0.0, fields=(("id", "not-an-int"),)),
    )
    for seed in range(20):
        mixed, pos = mix_canaries(batch, probes, random.Random(seed))
        shapes = {tuple((k, type(v)) for k, v in m.items()) for m in mixed}
        assert len(shapes) == 1  # nothing about a probe's shape differs
        a, b = (mixed[p] for p in pos)
        assert (a["prompt"], a["completion"], a["answer"]) == ("pa", "ca", "7")
        assert "extra" not in a  # a key real items lack is not sent
        assert isinstance(b["id"], int) and b["answer"] == "42"  # borrowed, right type


def test_grouped_batches_get_probes_as_whole_groups_at_group_boundaries() -> None:
    group = 4
    batch = [{"prompt": f"p{i // group}", "completion": str(i)} for i in range(3 * group)]
    probes = tuple(CanaryProbe(f"c{k}", "probe", f"w{k}", 0.0) for k in range(group))
    seen = set()
    for seed in range(30):
        mixed, pos = mix_canaries(batch, probes, random.Random(seed), group=group)
        assert len(mixed) == 4 * group and len(pos) == group
        assert pos[0] % group == 0 and list(pos) == list(range(pos[0], pos[0] + group))
        runs = [mixed[i : i + group] for i in range(0, len(mixed), group)]
        assert all(len({x["prompt"] for x in run}) == 1 for run in runs)  # layout kept
        seen.add(pos[0])
    assert seen == {0, 4, 8, 12}  # every boundary is used
    # lengths that are not multiples of the group fall back to single positions
    mixed, pos = mix_canaries(batch[:5], probes, random.Random(1), group=group)
    assert len(mixed) == 9 and len(pos) == group


def test_judge_uses_the_probes_that_rode_along() -> None:
    cs = CanarySet(tolerance=0.1, draw=lambda batch, rng: ())
    drawn = (CanaryProbe("a", "p", "c", 1.0), CanaryProbe("b", "p", "c", 1.0))
    v = judge_canaries(cs, (1.0, 1.0), drawn)
    assert v.expected_mean == 1.0 and not v.inflated
    assert cs.probes_for([{"prompt": "p", "completion": "c"}], random.Random(0)) == ()
