"""A run-health state stored by an earlier version of a detector (another layout of its
state record) loads, and folding goes on from it: the host restarted on it must not fail
on every record of the run (issue 17 changed four detectors' state layouts)."""

from __future__ import annotations

import msgpack

from stream_processors.detectors import RunHealthFold, state_codec
from stream_processors.detectors.dead_run import DeadRunState
from stream_processors.detectors.entropy_collapse import EntropyState
from stream_processors.detectors.scenarios import synthetic_run


def _folded(fold: RunHealthFold, events: list, state=None):
    state = fold.initial() if state is None else state
    out = []
    for ev in events:
        if type(ev).TOPIC in fold.inputs:
            state, derived = fold.apply(state, ev)
            out.extend(derived)
    return state, out


def _restamp(raw: bytes, layouts: dict[str, list]) -> bytes:
    """``raw`` with every record named in ``layouts`` stored as that field list instead."""

    def hook(obj: dict) -> dict:
        if obj.get("@") in layouts:
            return {"@": obj["@"], "v": layouts[obj["@"]]}
        return obj

    doc = msgpack.unpackb(raw, object_hook=hook, raw=False, strict_map_key=False)
    return msgpack.packb(doc, use_bin_type=True)


def test_records_of_another_layout_load_as_fresh_detector_state() -> None:
    fold = RunHealthFold()
    events = synthetic_run(3, steps=120, fault="constant_reward", fault_step=60)
    state, _ = _folded(fold, events[:200])
    # entropy_collapse's state before issue 17 had 12 fields, dead_run's 10
    old = _restamp(fold.dump_state(state), {
        "EntropyState": [0] * 12,
        "DeadRunState": [-1, 0, 0.0, 0.0, 0.0, (), None, 0, 0.0, 0.0],
    })  # fmt: skip
    loaded = fold.load_state(old)
    kinds = {type(s) for s in loaded.detectors}
    assert EntropyState in kinds and DeadRunState in kinds
    assert next(s for s in loaded.detectors if isinstance(s, EntropyState)) == EntropyState()
    assert next(s for s in loaded.detectors if isinstance(s, DeadRunState)) == DeadRunState()
    # and the run goes on: the constant reward still pages dead_run
    _, out = _folded(fold, events[200:], loaded)
    assert any(a.type == "AlertFired" and a.detector == "dead_run" for a in out)


def test_records_of_the_current_layout_round_trip() -> None:
    fold = RunHealthFold()
    state, _ = _folded(fold, synthetic_run(4, steps=80))
    raw = state_codec.dump(state)
    assert state_codec.dump(state_codec.load(raw)) == raw  # bytes: NaN != NaN
