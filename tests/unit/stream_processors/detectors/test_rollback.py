"""A run rolled back to an earlier checkpoint: its abandoned steps stop describing it."""

from __future__ import annotations

from events import RunResumed
from stream_processors.detectors import RunHealthFold
from tests.unit.stream_processors.detectors._builders import Run, fired, resolved


def fold_all(fold: RunHealthFold, events: list, state=None):  # type: ignore[no-untyped-def]
    state = fold.initial() if state is None else state
    out: list = []
    for ev in events:
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    return state, out


def _resumed(run: Run, step: int, back: int | None) -> RunResumed:
    return RunResumed(**run._env(step), reason="fixed", rolled_back_to=back)


def _blowup(run: Run, steps: range, kl: float) -> list:
    return [run.step(s, kl_to_ref=kl, reward_mean=0.5, entropy=1.0) for s in steps]


def test_rollback_resolves_open_episodes_and_a_refire_is_a_new_episode() -> None:
    fold, run = RunHealthFold(), Run()
    state, out = fold_all(fold, [run.submitted(), *_blowup(run, range(1, 5), kl=4.0)])
    [alert] = fired(out, "kl_blowup")
    state, out = fold_all(fold, [_resumed(run, 0, back=0)], state)
    [gone] = resolved(out, "kl_blowup")
    assert gone.alert_id == alert.alert_id and "rolled back to step 0" in gone.reason
    assert state.epoch == 1 and state.active == ()
    # the same fault again on the new branch: a new episode, with an id of its own
    state, out = fold_all(fold, _blowup(run, range(1, 5), kl=4.0), state)
    [again] = fired(out, "kl_blowup")
    assert again.alert_id == alert.alert_id + "@1" and again.event_id != alert.event_id


def test_rollback_replays_the_steps_again_instead_of_calling_them_late() -> None:
    fold, run = RunHealthFold(), Run()
    state, _ = fold_all(fold, [run.submitted(), *_blowup(run, range(1, 8), kl=0.01)])
    state, _ = fold_all(fold, [_resumed(run, 2, back=2)], state)
    late = state.late
    state, _ = fold_all(fold, _blowup(run, range(3, 8), kl=0.01), state)
    assert state.late == late  # steps 3..7 of the new branch are folded, not dropped


def test_a_plain_resume_changes_nothing() -> None:
    fold, run = RunHealthFold(), Run()
    state, _ = fold_all(fold, [run.submitted(), *_blowup(run, range(1, 5), kl=4.0)])
    after, out = fold_all(fold, [_resumed(run, 4, back=None)], state)
    assert out == [] and after == state
