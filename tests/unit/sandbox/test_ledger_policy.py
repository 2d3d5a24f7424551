"""Ledger columns and failure-policy arithmetic."""

from __future__ import annotations

from types import SimpleNamespace

from sandbox.client import FailurePolicy, default_policy
from sandbox.ledger import COLUMNS, Ledger, ledger_from_events
from sandbox.types import Cause


def test_columns_are_the_six_causes() -> None:
    assert COLUMNS == (
        "ok",
        "tenant_timeout",
        "tenant_crash",
        "tenant_bad_output",
        "tenant_resource_exceeded",
        "platform_error",
    )


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
