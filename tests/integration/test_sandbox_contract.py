"""The score contract on real sandboxes: gate, ledger columns, policies, canaries, events."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from events.codec import decode, encode
from sandbox.client import FailurePolicy, RewardClient
from sandbox.integrity import CanaryProbe, CanarySet
from sandbox.ledger import ledger_from_events
from sandbox.types import Cause, OutcomeStatus, ScoreRange
from tests.integration.sandbox_support import (
    FAST_LIMITS,
    PROBE,
    item,
    make_client,
    require_sandbox,
    write_reward,
)

pytestmark = pytest.mark.timeout(90)

BATCH = [{"prompt": "p", "completion": "x" * i} for i in range(1, 5)]
EXPECTED = (1.0, 2.0, 3.0, 4.0)
LENGTH = """
def reward(batch):
    return [float(len(x["completion"])) for x in batch]
"""


@pytest.fixture(scope="module")
def probe_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardClient]:
    require_sandbox()
    c = make_client(tmp_path_factory.mktemp("probe"), PROBE, tier="function")
    try:
        yield c
    finally:
        c.close()


def bad(client: RewardClient, code: str) -> tuple[Cause, str]:
    out = client.score([item(code), item("result = 0.5")])
    assert out.status is OutcomeStatus.SKIPPED and out.scores is None
    return out.cause, out.message


# -- the schema gate --------------------------------------------------------------------

GATE_CASES = {
    "nan": "result = float('nan')",
    "inf": "result = float('inf')",
    "-inf": "result = -float('inf')",
    "out_of_range": "result = 1e9",
}


@pytest.mark.parametrize("case", sorted(GATE_CASES))
def test_non_finite_and_out_of_range_scores_stopped_at_gate(
    probe_client: RewardClient, case: str
) -> None:
    cause, msg = bad(probe_client, GATE_CASES[case])
    assert cause is Cause.TENANT_BAD_OUTPUT, msg


SHAPES = {
    "too_few": "def reward(batch):\n    return [0.5]\n",
    "too_many": "def reward(batch):\n    return [0.5] * (len(batch) + 1)\n",
    "not_a_list": "def reward(batch):\n    return 0.5\n",
    "none": "def reward(batch):\n    return None\n",
    "dict": "def reward(batch):\n    return {'a': 1.0}\n",
    "strings": "def reward(batch):\n    return ['0.5' for _ in batch]\n",
    "bools": "def reward(batch):\n    return [True for _ in batch]\n",
    "nested": "def reward(batch):\n    return [[0.5] for _ in batch]\n",
    "unserializable": "def reward(batch):\n    return [object() for _ in batch]\n",
    "oversized": "def reward(batch):\n    return [0.123456789] * 2_000_000\n",
    "forged_frame": (
        "import os, struct, sys\n"
        "def reward(batch):\n"
        "    os.write(int(sys.argv[1]), struct.pack('>I', 2**31))\n"
        "    return [0.5 for _ in batch]\n"
    ),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_wrong_shape_type_and_oversized_outputs_stopped_at_gate(tmp_path: Path, case: str) -> None:
    require_sandbox()
    with make_client(tmp_path, SHAPES[case], tier="function") as c:
        out = c.score(BATCH)
        assert out.status is OutcomeStatus.SKIPPED and out.scores is None
        assert out.cause is Cause.TENANT_BAD_OUTPUT, (out.cause, out.message)
        assert c.ledger.as_dict()["tenant_bad_output"] == 1
        events = c.outcome_events(out)
        assert [e.type for e in events] == ["RewardBatchFailed"]
        assert events[0].cause == "tenant_bad_output"


def test_declared_range_is_enforced(tmp_path: Path) -> None:
    require_sandbox()
    with make_client(tmp_path, LENGTH, tier="function", score_range=ScoreRange(0.0, 3.0)) as c:
        out = c.score(BATCH)
    assert out.cause is Cause.TENANT_BAD_OUTPUT and "outside [0.0, 3.0]" in out.message
    assert out.attempts[-1].examples == ("[3]=4.0",)


# -- ledger columns ---------------------------------------------------------------------


def test_crash_and_timeout_land_in_different_columns(tmp_path: Path) -> None:
    require_sandbox()
    limits = replace(FAST_LIMITS, deadline_s=0.7)
    with make_client(tmp_path, PROBE, tier="verifier", limits=limits) as c:
        crash = c.score([item("raise RuntimeError('tenant bug')")])
        hang = c.score([item("import time\ntime.sleep(60)")])
        exit_ = c.score([item("import os\nos._exit(3)")])
        segv = c.score([item("import ctypes\nctypes.string_at(0)")])
        ok = c.score([item("result = 0.25")])
        assert crash.cause is Cause.TENANT_CRASH and "tenant bug" in crash.message
        assert hang.cause is Cause.TENANT_TIMEOUT
        assert exit_.cause is Cause.TENANT_CRASH
        assert segv.cause is Cause.TENANT_CRASH
        assert ok.scores == (0.25,)
        ledger = c.ledger.as_dict()
        assert ledger == {
            "ok": 1,
            "tenant_timeout": 1,
            "tenant_crash": 3,
            "tenant_bad_output": 0,
            "tenant_resource_exceeded": 0,
            "platform_error": 0,
        }
        events = [e for o in (crash, hang, exit_, segv, ok) for e in c.outcome_events(o)]
    # a crash or timeout has no bad output to show: the failing inputs are the examples
    failed = [e for e in events if e.type == "RewardBatchFailed"]
    assert failed and all(e.examples for e in failed)
    assert "raise RuntimeError('tenant bug')" in failed[0].examples[0]
    # the customer-visible counters come from the log: same columns after a codec trip
    decoded = [decode(encode(e)) for e in events]
    assert ledger_from_events(decoded) == ledger
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_artifact_load_failures_are_tenant_faults(tmp_path: Path) -> None:
    require_sandbox()
    with make_client(tmp_path / "a", "raise ImportError('no numpy here')\n", tier="function") as c:
        out = c.score(BATCH)
        assert out.cause is Cause.TENANT_CRASH and "no numpy here" in out.message
    with make_client(tmp_path / "b", "x = [0] * (10**10)\n", tier="function") as c:
        out = c.score(BATCH)
        assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, out.message


def test_invalid_batch_is_a_platform_error_not_a_tenant_one(tmp_path: Path) -> None:
    require_sandbox()
    with make_client(tmp_path, LENGTH, tier="function") as c:
        out = c.score([{"prompt": "p"}])  # type: ignore[list-item]
        assert out.status is OutcomeStatus.SKIPPED and out.cause is Cause.PLATFORM_ERROR
        assert c.ledger.as_dict()["platform_error"] == 1


# -- failure policies under a flaky reward ------------------------------------------------

FLAKY = """
import os, random, time
def reward(batch):
    r = random.Random(int.from_bytes(os.urandom(4), 'big')).random()
    if r < 0.2:
        time.sleep(60)      # hang
    if r < 0.45:
        os._exit(1)         # crash
    return [float(len(x["completion"])) for x in batch]
"""


@pytest.mark.parametrize(
    "policy",
    [FailurePolicy("retry", retries=2), FailurePolicy("skip"), FailurePolicy("pause")],
    ids=["retry", "skip", "pause"],
)
def test_flaky_reward_never_lets_nan_or_substitute_through(
    tmp_path: Path, policy: FailurePolicy
) -> None:
    require_sandbox()
    limits = replace(FAST_LIMITS, deadline_s=0.4)
    outcomes = []
    with make_client(tmp_path, FLAKY, tier="function", policy=policy, limits=limits) as c:
        for step in range(10):
            out = c.score(BATCH, step=step)
            outcomes.append(out)
            if out.status is OutcomeStatus.PAUSED and c.paused:
                # paused: nothing runs until resume; the next call proves it
                again = c.score(BATCH)
                assert again.status is OutcomeStatus.PAUSED and again.attempt == 0
                c.resume()
        events = [e for o in outcomes for e in c.outcome_events(o)]
        ledger = c.ledger.as_dict()
    for out in outcomes:
        if out.status is OutcomeStatus.OK:
            assert out.scores == EXPECTED  # exactly the tenant's scores, never a stand-in
        else:
            assert out.scores is None
            assert out.cause in (Cause.TENANT_TIMEOUT, Cause.TENANT_CRASH), out.message
            expected_status = {
                "retry": OutcomeStatus.SKIPPED,
                "skip": OutcomeStatus.SKIPPED,
                "pause": OutcomeStatus.PAUSED,
            }[policy.name]
            assert out.status is expected_status
            assert out.attempt == policy.attempts()
    for e in events:
        if e.type == "RewardBatchScored":
            assert math.isfinite(e.score_mean) and e.score_min == 1.0 and e.score_max == 4.0
        else:
            assert e.type == "RewardBatchFailed"
            assert e.action in ({"retry", "skip"} if policy.name == "retry" else {policy.name})
    assert ledger_from_events(events) == ledger
    assert ledger["platform_error"] == 0


# -- integrity: canaries and degenerate outputs -------------------------------------------

PROBES = CanarySet(
    probes=(
        CanaryProbe("empty", "What is 2+2?", "", expected=0.0),
        CanaryProbe("repeat", "Prove it.", "the the the", expected=11.0),
    ),
    every=1,
    tolerance=0.5,
)


def test_canaries_ride_along_and_are_split_out(tmp_path: Path) -> None:
    require_sandbox()
    path = write_reward(tmp_path, LENGTH)
    with RewardClient(path, "tenant-c", tier="function", canaries=PROBES) as c:
        out = c.score(BATCH)
        assert out.scores == EXPECTED  # probe scores never reach the trainer
        assert out.canary is not None and not out.canary.inflated
        assert sorted(out.canary.scores) == [0.0, 11.0]
        events = c.outcome_events(out)
    assert [e.type for e in events] == ["RewardBatchScored", "CanaryProbeScored"]
    assert events[1].n == 2 and events[1].inflated is False


def test_inflating_reward_trips_the_canary_and_degenerate_flag(tmp_path: Path) -> None:
    require_sandbox()
    path = write_reward(tmp_path, "def reward(batch):\n    return [100.0 for _ in batch]\n")
    with RewardClient(path, "tenant-d", tier="function", canaries=PROBES) as c:
        outs = [c.score(BATCH) for _ in range(8)]
        events = c.outcome_events(outs[-1])
    assert all(o.canary is not None and o.canary.inflated for o in outs)
    assert [o.degenerate for o in outs] == [False] * 7 + [True]
    scored = next(e for e in events if e.type == "RewardBatchScored")
    canary = next(e for e in events if e.type == "CanaryProbeScored")
    assert scored.degenerate is True and canary.inflated is True


# -- tiers ------------------------------------------------------------------------------

VERIFIER = """
import subprocess, sys
def reward(batch):
    out = []
    for x in batch:
        p = subprocess.run([sys.executable, "-c", x["completion"]], capture_output=True,
                           timeout=5)
        out.append(1.0 if p.returncode == 0 else 0.0)
    return out
"""


def test_verifier_runs_further_code_with_a_fresh_sandbox_per_batch(tmp_path: Path) -> None:
    require_sandbox()
    path = write_reward(tmp_path, VERIFIER)
    batch = [
        {"prompt": "add", "completion": "assert 1 + 1 == 2"},
        {"prompt": "add", "completion": "assert 1 + 1 == 3"},
    ]
    with RewardClient(path, "tenant-v") as c:
        assert c.tier == "verifier"  # classified, not declared
        for _ in range(3):
            out = c.score(batch)
            assert out.scores == (1.0, 0.0), out.message
        assert c._pool is not None
        time.sleep(0.1)
        assert c._pool.spawned >= 3  # one sandbox per batch


def test_function_tier_recycles_every_n_batches(tmp_path: Path) -> None:
    require_sandbox()
    with make_client(tmp_path, LENGTH, tier="function", recycle_every=3, warm_workers=1) as c:
        for _ in range(6):
            assert c.score(BATCH).scores == EXPECTED
        assert c._pool is not None
        assert 2 <= c._pool.spawned <= 4
