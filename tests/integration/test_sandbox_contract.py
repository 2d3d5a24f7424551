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
from sandbox.types import Cause, OutcomeStatus, SandboxConfig, ScoreRange
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
FAST_CONFIG = SandboxConfig(limits=FAST_LIMITS)
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
            "tenant_bad_artifact": 0,
            "platform_error": 0,
            "bad_input": 0,
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
    src = "raise ImportError('no numpy here')\ndef reward(batch):\n    return []\n"
    with make_client(tmp_path / "a", src, tier="function") as c:
        out = c.score(BATCH)
        assert out.cause is Cause.TENANT_CRASH and "no numpy here" in out.message
    src = "x = [0] * (10**10)\ndef reward(batch):\n    return []\n"
    with make_client(tmp_path / "b", src, tier="function") as c:
        out = c.score(BATCH)
        assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, out.message


# -- not a reward artifact: the tenant's, refused before scoring (#20 item 4) -------------

BAD_ARTIFACTS = {
    "syntax_error": "def reward(batch):\n    return [len(x['completion']) for x in batch\n",
    "lambda": "reward = lambda batch: [1.0 for _ in batch]\n",
    "no_reward": "def score(batch):\n    return [1.0 for _ in batch]\n",
    "compile_only_error": "return 1\ndef reward(batch):\n    return [1.0 for _ in batch]\n",
    "nested_too_deeply": "x = " + "-" * 100_000 + "1\ndef reward(b):\n    return []\n",
    "not_utf8": "def reward(batch):\n    return ['\udcff' for _ in batch]\n",
}


@pytest.mark.parametrize("case", sorted(BAD_ARTIFACTS))
@pytest.mark.parametrize("tier", [None, "function"], ids=["classified", "explicit_tier"])
def test_a_file_that_is_not_a_reward_artifact_is_the_tenants_fault(
    tmp_path: Path, case: str, tier: str | None
) -> None:
    """A syntax error or ``reward = lambda ...`` was booked platform_error (or, with an
    explicit tier, a crash of a worker started for nothing): it is the tenant's code,
    classified before scoring, refused, and booked ``tenant_bad_artifact`` with the
    reason; no sandbox is started and the event says why."""
    require_sandbox()
    path = tmp_path / "reward.py"
    path.write_bytes(BAD_ARTIFACTS[case].encode("utf-8", "surrogateescape"))
    with RewardClient(path, "tenant-art", tier=tier, config=FAST_CONFIG) as c:  # type: ignore[arg-type]
        out = c.score(BATCH, step=1)
        again = c.score(BATCH, step=2)
        assert c._pool is None  # refused before any worker was started
        events = c.outcome_events(out)
        ledger = c.ledger.as_dict()
    for o in (out, again):
        assert o.status is OutcomeStatus.REFUSED and o.scores is None
        assert o.cause is Cause.TENANT_BAD_ARTIFACT, (o.cause, o.message)
        assert o.message.startswith("invalid artifact: ")
    assert ledger["tenant_bad_artifact"] == 2 and ledger["platform_error"] == 0
    (ev,) = events
    assert ev.type == "RewardBatchFailed" and ev.cause == "tenant_bad_artifact"
    assert ev.examples  # the classifier's reasons: what the tenant has to fix
    assert decode(encode(ev)) == ev


def test_an_unreadable_artifact_is_the_platforms(tmp_path: Path) -> None:
    require_sandbox()
    with RewardClient(tmp_path / "gone.py", "tenant-art", config=FAST_CONFIG) as c:
        out = c.score(BATCH)
    assert out.status is OutcomeStatus.REFUSED and out.cause is Cause.PLATFORM_ERROR


# -- a batch the platform cannot send: the caller's bad input (#20 item 4) ----------------


# tenant code that would be booked tenant_crash if it ever ran
def _nested(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out


NEVER_RUNS = "def reward(batch):\n    raise RuntimeError('tenant code ran')\n"
BAD_BATCHES = {
    "nan_extra_field": [{"prompt": "p", "completion": "c", "meta": {"score": math.nan}}],
    "inf_extra_field": [{"prompt": "p", "completion": "c", "x": [1.0, -math.inf]}],
    "object_extra_field": [{"prompt": "p", "completion": "c", "when": object()}],
    "bytes_extra_field": [{"prompt": "p", "completion": "c", "raw": b"\x00"}],
    "int_key": [{"prompt": "p", "completion": "c", "m": {1: "one"}}],
    "lone_surrogate": [{"prompt": "p\ud800", "completion": "c"}],
    "nested_too_deeply": [{"prompt": "p", "completion": "c", "x": _nested(40)}],
    "too_large": [{"prompt": "p", "completion": "x" * (17 * 1024 * 1024)}],
    "missing_completion": [{"prompt": "p"}],
    "not_a_list": {"prompt": "p", "completion": "c"},
    "empty": [],
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_batch_that_cannot_cross_the_boundary_is_refused_as_bad_input(
    tmp_path: Path, case: str
) -> None:
    """NaN in an extra field was booked tenant_crash ("worker gone") although tenant code
    never ran. The whole batch is validated before sending: refused, booked ``bad_input``
    (the caller's), the event says why; the worker is untouched and scores the next good
    batch."""
    require_sandbox()
    good = "def reward(batch):\n    return [float(len(x['completion'])) for x in batch]\n"
    with make_client(tmp_path, good, tier="function", warm_workers=1) as c:
        out = c.score(BAD_BATCHES[case])  # type: ignore[arg-type]
        assert out.status is OutcomeStatus.REFUSED and out.scores is None
        assert out.cause is Cause.BAD_INPUT, (out.cause, out.message)
        assert out.message.startswith("invalid batch: ")
        assert c.score(BATCH).scores == EXPECTED  # the same warm worker carries on
        ledger = c.ledger.as_dict()
        (ev,) = c.outcome_events(out)
    assert ledger["bad_input"] == 1 and ledger["ok"] == 1
    assert ledger["tenant_crash"] == 0 and ledger["platform_error"] == 0
    assert ev.cause == "bad_input" and ev.action == "skip" and not ev.examples
    assert decode(encode(ev)) == ev


def test_tenant_code_never_runs_on_a_refused_batch(tmp_path: Path) -> None:
    require_sandbox()
    with make_client(tmp_path, NEVER_RUNS, tier="function") as c:
        out = c.score([{"prompt": "p", "completion": "c", "meta": math.nan}])
        assert out.cause is Cause.BAD_INPUT
        assert c.score(BATCH).cause is Cause.TENANT_CRASH  # control: it does run on a good one


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


# -- canary probes cannot be told apart by their shape (#20 item 5) -----------------------

#: Real items carry more than prompt/completion, in their own key order, with an int.
SHAPED_BATCH = [
    {"answer": "42", "prompt": f"q{i}", "completion": "x" * i, "id": i} for i in range(8)
]
SHAPED_PROBES = CanarySet(
    probes=(
        CanaryProbe("wrong", "What is 6*7?", "41", expected=0.0, fields=(("answer", "42"),)),
        CanaryProbe("bare", "Say hi.", "", expected=0.0),  # no answer, no id of its own
    ),
    every=1,
    tolerance=0.1,
)
#: Tenant code that scores what looks like a probe at the reference (0) and everything
#: else 1: it passed the canary check while probes were {prompt, completion} only.
GAMING = {
    "missing_key": "def probe(x, batch):\n    return 'answer' not in x or 'id' not in x\n",
    "key_order": (
        "def probe(x, batch):\n    return list(x) != ['answer', 'prompt', 'completion', 'id']\n"
    ),
    "value_type": "def probe(x, batch):\n    return type(x.get('id')) is not int\n",
    "majority_shape": (
        "from collections import Counter\n"
        "def shape(x):\n"
        "    return tuple((k, type(v).__name__) for k, v in x.items())\n"
        "def probe(x, batch):\n"
        "    common = Counter(shape(y) for y in batch).most_common(1)[0][0]\n"
        "    return shape(x) != common\n"
    ),
}
GAMING_TAIL = """
def reward(batch):
    return [0.0 if probe(x, batch) else 1.0 for x in batch]
"""


@pytest.mark.parametrize("how", sorted(GAMING))
def test_a_reward_that_spots_probes_by_shape_cannot_and_is_caught(tmp_path: Path, how: str) -> None:
    require_sandbox()
    path = write_reward(tmp_path, GAMING[how] + GAMING_TAIL)
    with RewardClient(path, "tenant-g", tier="function", config=FAST_CONFIG) as c:
        # control: the same tenant code does spot probes shaped the old way
        # ({prompt, completion} only) — the attack is real
        old = [p.as_item() for p in SHAPED_PROBES.probes]
        control = c.score(SHAPED_BATCH + old)
        assert control.scores == (1.0,) * len(SHAPED_BATCH) + (0.0, 0.0), control.message
    with RewardClient(
        path, "tenant-g", tier="function", config=FAST_CONFIG, canaries=SHAPED_PROBES
    ) as c:
        outs = [c.score(SHAPED_BATCH) for _ in range(5)]
        events = c.outcome_events(outs[-1])
    for out in outs:
        assert out.scores == (1.0,) * len(SHAPED_BATCH)  # probes never reach the caller
        assert out.canary is not None
        assert out.canary.scores == (1.0, 1.0)  # it could not tell them apart ...
        assert out.canary.inflated  # ... so the canary check catches the inflation
    canary = next(e for e in events if e.type == "CanaryProbeScored")
    assert canary.inflated and canary.score_mean == 1.0 and canary.expected_mean == 0.0


def test_an_honest_reward_passes_shaped_probes(tmp_path: Path) -> None:
    require_sandbox()
    src = "def reward(batch):\n    return [float(x['completion'] == x['answer']) for x in batch]\n"
    with RewardClient(
        write_reward(tmp_path, src), "tenant-h", tier="function", canaries=SHAPED_PROBES
    ) as c:
        out = c.score(SHAPED_BATCH)
    assert out.scores == (0.0,) * len(SHAPED_BATCH)
    assert out.canary is not None and not out.canary.inflated


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


SLOW_IMPORT = """
import time
time.sleep(0.5)
def reward(batch):
    return [float(len(x["completion"])) for x in batch]
"""


def test_a_start_up_called_off_by_a_pause_is_no_failure_after_the_resume(tmp_path: Path) -> None:
    """Found in CI (``test_flaky_reward_...[pause]`` failed 2 of 3 full runs, 1 in 3 alone):
    a resume right after the pause that called off a background start-up let that killed
    start-up's "worker did not start" count as the artifact's, and the next batch was
    handed it as its own failure, booked to the platform. A start-up called off is no
    failure, whatever the pool's state when it returns."""
    require_sandbox()
    with make_client(tmp_path, SLOW_IMPORT, tier="function") as c:
        pool = c._pool
        assert pool is not None
        deadline = time.monotonic() + 10
        while not pool._starting and time.monotonic() < deadline:  # its import in flight
            time.sleep(0.01)
        assert pool._starting, "no background start-up seen"
        pool.suspend()  # (what a policy pause does) calls it off...
        pool.resume()  # ...and the resume comes before the killed start-up has returned
        out = c.score(BATCH)
        assert out.ok and out.scores == EXPECTED, (out.cause, out.message)
        assert c.ledger.as_dict()["platform_error"] == 0
