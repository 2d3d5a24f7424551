"""Ledger columns and failure-policy arithmetic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

from events.catalog.reward import FailureCause
from projections import attribution
from sandbox.client import FailurePolicy, default_policy
from sandbox.ledger import COLUMNS, Ledger, ledger_from_events
from sandbox.types import Cause


def test_columns_are_the_eight_causes() -> None:
    assert COLUMNS == (
        "ok",
        "tenant_timeout",
        "tenant_crash",
        "tenant_bad_output",
        "tenant_resource_exceeded",
        "tenant_bad_artifact",
        "platform_error",
        "bad_input",
    )


def test_every_place_that_enumerates_causes_agrees() -> None:
    """The sandbox's Cause enum, the event catalog's literals and the attribution
    projection's columns name the same causes (a cause missing from one of them would be
    an event that cannot be built, or a fold that raises on it)."""
    assert ("ok", *get_args(FailureCause)) == COLUMNS  # the ledger columns, in order
    assert set(get_args(FailureCause)) == set(COLUMNS) - {"ok"}
    assert set(attribution.CAUSES) == set(COLUMNS) - {"ok"}
    tenant = {c for c in COLUMNS if c.startswith("tenant_")}
    assert set(attribution.TENANT_CAUSES) == tenant
    assert "bad_input" not in tenant and "platform_error" not in tenant


def test_a_ledger_stored_before_the_new_causes_still_folds() -> None:
    """Projection ledgers are stored (status docs); one written with the five old columns
    loads padded, keeps its counts, and books the new causes."""
    from events.catalog.reward import RewardBatchFailed
    from events.envelope import new_envelope

    old = attribution.Ledger(ok_samples=3, failed_samples=(1, 2, 0, 0, 4))
    assert old.count("tenant_crash") == 2 and old.count("platform_error") == 4
    assert old.count("tenant_bad_artifact") == 0 and old.tenant_failed == 3
    ev = RewardBatchFailed(
        **new_envelope(tenant_id="t", run_id="r", producer="p", seq=1, ts=1.0),
        batch_id="b",
        n=5,
        cause="tenant_bad_artifact",
        message="invalid artifact",
    )
    new = old.add(ev, max_examples=3)
    assert new.count("tenant_bad_artifact") == 5 and new.tenant_failed == 8
    att = attribution.tenant_fault(new)
    assert att.failure_class == "tenant_code_fault"
    assert att.message.startswith("your reward file was refused before scoring")
    assert attribution.attribute_failure(None, "", new, 0.5, (), ()).failure_class == (
        "tenant_code_fault"
    )
    bad = old.add(ev.model_copy(update={"cause": "bad_input"}), max_examples=3)
    assert bad.count("bad_input") == 5 and bad.tenant_failed == 3  # the caller's, not theirs


def test_book_and_fold_agree() -> None:
    led = Ledger()
    for c in (Cause.OK, Cause.TENANT_CRASH, Cause.TENANT_CRASH, Cause.PLATFORM_ERROR):
        led.book(c)
    events = [
        SimpleNamespace(type="RewardBatchScored"),
        SimpleNamespace(type="RewardBatchFailed", cause="tenant_crash"),
        SimpleNamespace(type="RewardBatchFailed", cause="tenant_crash"),
        SimpleNamespace(type="RewardBatchFailed", cause="platform_error"),
        SimpleNamespace(type="TrainerStepCompleted"),
    ]
    assert ledger_from_events(events) == led.as_dict()
    assert led.tenant_failures() == 2


def test_policies() -> None:
    assert FailurePolicy("retry", retries=2).attempts() == 3
    assert FailurePolicy("retry", retries=1, then="pause").final_action() == "pause"
    assert FailurePolicy("skip", retries=5).attempts() == 1
    assert FailurePolicy("pause").final_action() == "pause"
    assert default_policy("function").name == "retry"
    assert default_policy("verifier").name == "skip"


def test_background_start_ups_back_off_then_give_up() -> None:
    """A pool whose pre-spawns keep failing (an artifact that never finishes its import)
    waits longer after each, and stops after a few: it runs tenant code on its own
    at most MAX_BACKGROUND_FAILURES times (security review, 2026-11-27)."""
    from sandbox.pool import BACKOFF_MAX_S, MAX_BACKGROUND_FAILURES, backoff_s

    waits = [backoff_s(n) for n in range(1, 8)]
    assert waits[:3] == [5.0, 10.0, 20.0]
    assert waits == sorted(waits) and max(waits) == BACKOFF_MAX_S
    assert 1 <= MAX_BACKGROUND_FAILURES <= 5
