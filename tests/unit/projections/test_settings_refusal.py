"""Which runs a resume's ``overrides`` may reach (``projections.api.settings_refusal``).

Only runwatch's own trainer applies settings on a resume; a hooked run dropped them while
the API answered 202 (review F4), so those are refused. Found by review of that fix: a
read model built before it kept no submitter, and refusing on "unknown" turned away every
such trainer run's resume; and a prefix check let a hook named ``trainer/...`` through.
"""

from __future__ import annotations

from projections.api import settings_refusal, trainer_producer
from projections.views import RunView


def view(producer: str | None, run_id: str = "r1") -> RunView:
    v = RunView("acme", run_id, created_ts=0.0, updated_ts=0.0, state="PAUSED_BY_GATE")
    if producer is not None:
        v.mechanics["producer"] = producer
    return v


def test_the_runs_own_trainer_takes_settings() -> None:
    assert trainer_producer("r1") == "trainer/r1"
    assert settings_refusal(view("trainer/r1"), {"lr": 1e-5}) == ""


def test_a_hooked_run_is_refused_with_what_to_do_instead() -> None:
    why = settings_refusal(view("hook/r1/host-1"), {"lr": 1e-5, "kl_coef": 0.1})
    assert "cannot change kl_coef, lr on resume" in why and "your own job" in why


def test_a_name_that_only_looks_like_a_trainer_is_refused() -> None:
    assert settings_refusal(view("trainer/other-run"), {"lr": 1e-5}) != ""
    assert settings_refusal(view("trainer"), {"lr": 1e-5}) != ""


def test_an_unknown_submitter_is_let_through_as_before() -> None:
    assert settings_refusal(view(None), {"lr": 1e-5}) == ""
