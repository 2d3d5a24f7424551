"""trainer.settings: the latest branch and the settings each recorded step was trained
under, folded from a run's facts (pure)."""

from __future__ import annotations

import uuid
from typing import Any

from events.catalog.lifecycle import RunResumed
from events.catalog.trainer import TrainerStepCompleted
from trainer.settings import resume_settings, run_history

_N = iter(range(1, 10**6))


def _env(step: int) -> dict[str, Any]:
    n = next(_N)
    return {"event_id": uuid.UUID(int=n), "tenant_id": "t", "run_id": "r", "step": step,
            "ts": 1.8e9 + n, "producer": "trainer/r", "seq": n}  # fmt: skip


def step(s: int, loss: float = 0.1) -> TrainerStepCompleted:
    return TrainerStepCompleted(**_env(s), loss=loss)


def resumed(s: int, request_id: str = "", rolled_back_to: int | None = None) -> RunResumed:
    return RunResumed(**_env(s), request_id=request_id, rolled_back_to=rolled_back_to)


def test_resume_settings_keeps_valid_lr_and_kl_coef_only() -> None:
    assert resume_settings({"lr": 1e-4, "kl_coef": 0, "rollback_to_step": 3}) == {
        "lr": 1e-4,
        "kl_coef": 0.0,
    }
    assert resume_settings({"lr": 0, "kl_coef": 100, "x": 1}) == {}
    assert resume_settings({"lr": True, "kl_coef": "0.1"}) == {}


def test_settings_hold_from_the_resume_that_set_them() -> None:
    events = [step(1), step(2), resumed(2, "c1"), step(3), resumed(3, "c2"), step(4)]
    h = run_history(events, {"c1": {"lr": 0.5}, "c2": {"kl_coef": 0.1}})
    assert h.settings_at == {1: {}, 2: {}, 3: {"lr": 0.5}, 4: {"lr": 0.5, "kl_coef": 0.1}}
    assert h.settings == {"lr": 0.5, "kl_coef": 0.1}


def test_a_rollback_abandons_the_records_after_its_step_but_not_the_settings() -> None:
    old = [step(s, loss=1.0) for s in range(1, 7)]
    new = [step(s, loss=2.0) for s in (5, 6)]
    events = [*old[:4], resumed(4, "c1"), *old[4:], resumed(4, "c2", rolled_back_to=4), *new]
    h = run_history(events, {"c1": {"lr": 0.5}})
    assert sorted(h.recorded) == [1, 2, 3, 4, 5, 6]
    assert [h.recorded[s].loss for s in (4, 5, 6)] == [1.0, 2.0, 2.0]
    assert h.settings_at[5] == h.settings_at[6] == {"lr": 0.5}
    # a branch that went less far than the abandoned one: its later steps are not taken
    short = [*old, resumed(2, "c3", rolled_back_to=2), step(3, loss=3.0)]
    assert sorted(run_history(short).recorded) == [1, 2, 3]


def test_a_repeated_record_and_an_unknown_command_change_nothing() -> None:
    events = [step(1, loss=1.0), step(1, loss=9.0), resumed(1, "gone"), step(2)]
    h = run_history(events, {})
    assert h.recorded[1].loss == 1.0 and h.settings == {} and h.settings_at[2] == {}


def test_the_gate_reads_the_trainers_facts_in_the_order_it_emitted_them() -> None:
    """The log merges topics by append time: a clock stepped back across a restart put a
    new branch's steps before its rollback's ``RunResumed`` (review, reasoned), and the
    gate then dropped them as abandoned. The trainer's ``seq`` (continued by every process
    of the run) orders them; another producer's facts are not the run's record."""
    from trainer.resume import _emission_order

    old = [step(s, loss=1.0) for s in (1, 2, 3)]
    back = resumed(1, "c1", rolled_back_to=1)
    new = [step(s, loss=2.0) for s in (2, 3)]
    seqs = {id(e): i for i, e in enumerate([*old, back, *new])}
    mine = [e.model_copy(update={"seq": seqs[id(e)]}) for e in [*old, back, *new]]
    logged = [*mine[:3], mine[4], mine[5], mine[3]]  # the new steps appended "before" it
    foreign = step(3, loss=9.0).model_copy(update={"producer": "hook/x", "seq": 99})
    ordered = _emission_order([*logged, foreign], "r")
    assert [e.seq for e in ordered] == [0, 1, 2, 3, 4, 5]
    assert [run_history(ordered).recorded[s].loss for s in (1, 2, 3)] == [1.0, 2.0, 2.0]
    twice = [mine[0], mine[1].model_copy(update={"seq": 0})]  # seqs not unique: log order
    assert _emission_order(twice, "r") == twice
