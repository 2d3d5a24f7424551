"""A framework's free-form experiment name becomes a valid run id; an explicit run id
must be valid as it is (round four, second pass: verl's ``qwen2.5/grpo-gsm8k`` as the run
id failed the training start once ids were checked)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from events.identity import MAX_ID_CHARS, check_id
from producers.hooks.ids import id_from_name
from producers.hooks.verl_tracking import RunwatchTracking


@pytest.mark.parametrize(
    ("name", "expected"),
    [("qwen2.5/grpo-gsm8k", "qwen2.5_grpo-gsm8k"), ("ok run.v2", "ok run.v2"), ("..", "__"),
     ("", "run"), ("a\\b\nc", "a_b_c")],
)  # fmt: skip
def test_names_become_valid_ids(name: str, expected: str) -> None:
    assert id_from_name(name) == expected == check_id(expected)


def test_long_names_keep_their_start_and_stay_distinct() -> None:
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert len(id_from_name(a)) == MAX_ID_CHARS and id_from_name(a) != id_from_name(b)
    assert id_from_name(a).startswith("x" * 200)


def test_verl_tracking_starts_with_an_experiment_name_holding_a_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RUNWATCH_RUN_ID", raising=False)
    monkeypatch.setenv("RUNWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    tracking = RunwatchTracking(
        "proj", "qwen2.5/grpo-gsm8k", {}, log=str(tmp_path / "log"), install_exit_hooks=False
    )
    try:
        assert tracking.hook.run_id == "qwen2.5_grpo-gsm8k"
    finally:
        tracking.finish(0)
    with pytest.raises(ValueError, match="bad run_id"):
        RunwatchTracking("proj", "e", {}, run_id="a/b", log=str(tmp_path / "log"))
    assert os.path.isdir(tmp_path / "log")


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 0), (0, 8)])
def test_verl_tracking_of_a_run_without_gpus_starts_and_bills_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: int, per_node: int
) -> None:
    """verl's ``nnodes x n_gpus_per_node`` is 0 on a CPU-only run: no GPU time to bill, and
    the hook (which refuses a GPU count not above 0) must still start, not fail the
    training at its tracker's construction."""
    monkeypatch.delenv("RUNWATCH_RUN_ID", raising=False)
    monkeypatch.setenv("RUNWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    config = {"trainer": {"nnodes": nodes, "n_gpus_per_node": per_node}}
    tracking = RunwatchTracking(
        "proj", "cpu-run", config, log=str(tmp_path / "log"), install_exit_hooks=False
    )
    try:
        assert tracking.hook.gpus is None
    finally:
        tracking.finish(0)
