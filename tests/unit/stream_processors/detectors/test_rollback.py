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


def test_a_restart_from_an_earlier_checkpoint_is_judged_again() -> None:
    """Found by review: after a crash, a requeued job (or ``runwatch resume``) restarted
    from a checkpoint below the last step reported, and every step it trained again up to
    there was taken for a late fact and ignored: a KL blowup in them never paged. A
    restart's ``RunResumed`` (it answers no request) below the steps judged takes the
    detectors back to its step."""
    fold, run = RunHealthFold(), Run()
    healthy = _blowup(run, range(1, 61), kl=0.05)
    restart = RunResumed(**run._env(30), reason="training restarted from checkpoint-30")
    state, _ = fold_all(fold, [run.submitted(), *healthy])
    state, out = fold_all(fold, [restart, *_blowup(run, range(31, 41), kl=4.0)], state)
    [alert] = fired(out, "kl_blowup")
    assert alert.step is not None and alert.step < 41, alert.step
    assert state.late == 0


def test_a_pauses_resume_never_takes_the_run_back() -> None:
    """A resume answering a pause (its ``request_id``) at a step below the steps judged
    (read after the steps trained since, another topic on Kafka) is no restart."""
    fold, run = RunHealthFold(), Run()
    state, _ = fold_all(fold, [run.submitted(), *_blowup(run, range(1, 21), kl=0.05)])
    resumed = RunResumed(**run._env(15), reason="resumed by customer", request_id="u1")
    state, out = fold_all(fold, [resumed], state)
    assert out == [] and state.epoch == 0 and state.marks[0] == 20
