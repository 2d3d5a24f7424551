"""Tenant accounting, a stream processor: the fold, its bills' ids, and what the read model
shows of it (its views' running totals, its spend series = the bills)."""

from __future__ import annotations

import pytest

from events import TenantUsageUpdated, TrainerStepCompleted, UsageRecorded
from projections.store import InMemoryReadModel
from runwatch.folds import processor_folds
from runwatch.hosting.read_model import read_model_host
from stream_processors.accounting import PRODUCER, AccountingFold, Prices
from tests.projection_runs import RunFactory, synth_fleet

PRICES = Prices(usd_per_gpu_second={"trainer": 0.002, "rollout_fleet": 0.001})


def test_accounting_splits_pools_and_phases_and_prices_committed_steps():
    fold = AccountingFold(PRICES)
    f = RunFactory()
    state, out = fold.initial(), []
    for step in (1, 2, 3, 2, 3, 4):  # 2 and 3 recomputed after a resume: cost, not progress
        for ev in (
            f.ev(
                UsageRecorded,
                step,
                pool="rollout_fleet",
                phase="rollout",
                device_kind="gpu",
                device_seconds=10.0,
                tokens_generated=100,
            ),
            f.ev(
                UsageRecorded,
                step,
                pool="trainer",
                phase="optim",
                device_kind="gpu",
                device_seconds=5.0,
                tokens_trained=100,
            ),
            f.ev(TrainerStepCompleted, step),
        ):
            state, derived = fold.apply(state, ev)
            out.extend(derived)
    assert state.gpu_seconds_rollout_fleet == 60.0 and state.gpu_seconds_trainer == 30.0
    assert dict(state.gpu_seconds_by_phase) == {"rollout": 60.0, "optim": 30.0}
    assert state.committed_steps == 4 and [e.step for e in out] == [1, 2, 3, 4]
    last = out[-1]
    assert last.spend_usd == pytest.approx(60 * 0.001 + 30 * 0.002)
    assert last.cost_per_step_usd == pytest.approx(0.12 / 4)
    assert dict(last.gpu_seconds_by_pool) == {"rollout_fleet": 60.0, "trainer": 30.0}
    assert last.tokens_generated == 600 and last.tokens_trained == 600
    assert fold.load_state(fold.dump_state(state)) == state


def test_device_seconds_are_priced_by_device_kind_and_pool():
    """A CPU host's usage (v3: ``device_kind`` "cpu") is priced at CPU prices and is no
    GPU time; GPU facts keep GPU prices."""
    import json

    prices = Prices(
        usd_per_gpu_second={"trainer": 0.002, "rollout_fleet": 0.001},
        usd_per_cpu_second={"trainer": 0.0001, "rollout_fleet": 0.00005},
    )
    fold = AccountingFold(prices)
    f = RunFactory()
    state, out = fold.initial(), []
    for ev in (
        f.ev(UsageRecorded, 1, pool="rollout_fleet", phase="rollout", device_kind="cpu",
             device_seconds=10.0),
        f.ev(UsageRecorded, 1, pool="trainer", phase="optim", device_kind="cpu",
             device_seconds=4.0),
        f.ev(UsageRecorded, 1, pool="trainer", phase="optim", device_kind="gpu",
             device_seconds=2.0),
        f.ev(TrainerStepCompleted, 1),
    ):  # fmt: skip
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    assert state.gpu_seconds_trainer == 2.0 and state.gpu_seconds_rollout_fleet == 0.0
    assert dict(state.gpu_seconds_by_phase) == {"optim": 2.0}
    last = out[-1]
    assert last.schema_version == 2
    assert dict(last.device_seconds_by_kind) == {"cpu": 14.0, "gpu": 2.0}
    assert last.spend_usd == pytest.approx(10 * 0.00005 + 4 * 0.0001 + 2 * 0.002)
    assert fold.load_state(fold.dump_state(state)) == state
    # a state stored before device kinds (no ``device_seconds``): all of it was GPU time
    old = {k: v for k, v in state._asdict().items() if k != "device_seconds"}
    restored = fold.load_state(json.dumps(old).encode())
    assert dict(restored.device_seconds) == {"gpu/trainer": 2.0}
    # the packaged price list prices both kinds, GPU above CPU
    packaged = Prices.load()
    for pool in ("trainer", "rollout_fleet"):
        assert 0 < packaged.device_price("cpu", pool) < packaged.device_price("gpu", pool)
    assert PRICES.device_price("cpu", "trainer") == 0 and PRICES.device_price("tpu", "x") == 0
    assert packaged.by_kind_and_pool()["trainer"] == packaged.device_price("gpu", "trainer")


def test_a_redelivered_usage_fact_is_not_billed_twice():
    """Duplicates (a retry, a re-shipped spool tail, a re-import) carry the same producer
    and seq: the second copy costs nothing."""
    fold = AccountingFold(PRICES)
    f = RunFactory()
    usage = f.ev(
        UsageRecorded, 1, pool="trainer", phase="optim", device_kind="gpu", device_seconds=10.0
    )
    other = f.ev(UsageRecorded, 1, pool="trainer", phase="optim", device_kind="gpu",
                 device_seconds=1.0, producer="rollout-worker-3")  # fmt: skip
    state = fold.initial()
    for ev in (usage, other, usage, other, usage):
        state, _ = fold.apply(state, ev)
    assert state.gpu_seconds_trainer == 11.0
    later = f.ev(
        UsageRecorded, 2, pool="trainer", phase="optim", device_kind="gpu", device_seconds=5.0
    )
    state, _ = fold.apply(state, later)
    assert state.gpu_seconds_trainer == 16.0
    assert fold.load_state(fold.dump_state(state)) == state


def test_usage_with_a_negative_seq_is_never_billed():
    """Sequences start above -1: a fact at seq -1 or below is not a new fact (as before
    the billed-producers table became pairs)."""
    fold = AccountingFold(PRICES)
    f = RunFactory()
    state = fold.initial()
    for seq in (-1, -1, 0, 0):
        ev = f.ev(
            UsageRecorded, 1, pool="trainer", phase="optim", device_kind="gpu", device_seconds=4.0
        )
        state, _ = fold.apply(state, ev.model_copy(update={"seq": seq}))
    assert state.gpu_seconds_trainer == 4.0


def test_accounting_is_a_processor_whose_bills_keep_their_ids() -> None:
    """Moved from projections/: the producer name is part of every bill's id, kept so a
    replay of any log derives the same bills."""
    assert "accounting" in [f.name for f in processor_folds()]
    assert PRODUCER == "projections/accounting"
    fold, f = AccountingFold(PRICES), RunFactory()
    step = f.ev(TrainerStepCompleted, 1)
    _, (bill,) = fold.apply(fold.initial(), step)
    assert bill.producer == PRODUCER and isinstance(bill, TenantUsageUpdated)


def test_the_read_model_shows_the_bills_and_the_usage_after_the_last_one() -> None:
    """The read model hosts the fold for its views only: it derives no bill of its own
    (the processor's are the ones published), its spend series is exactly the bills, and
    the view counts usage metered after the last committed step (a trainer meters a step
    after it reports it)."""
    events = synth_fleet(4, 30)
    f = RunFactory("run-late", "tenant-0")
    events += [f.ev(TrainerStepCompleted, 1)]
    events += [
        f.ev(UsageRecorded, 1, pool="trainer", phase="optim", device_kind="gpu", device_seconds=7.0)
    ]
    host = read_model_host(InMemoryReadModel(), prices=PRICES)
    derived = host.process_events((type(e).TOPIC, 0, e) for e in events)
    derived += host.release_held()
    host.checkpoint()
    assert {e.type for e in derived} == {"RunStateChanged"}
    fold, states, bills = AccountingFold(PRICES), {}, []
    for ev in events:
        if type(ev).TOPIC == "runwatch.telemetry":
            states[ev.run_id], out = fold.apply(states.get(ev.run_id, fold.initial()), ev)
            bills += out
    store = host.store.read_model
    for run_id, usage in states.items():
        series = dict(store.all_series(run_id)["spend_usd"])
        assert series == {b.step: b.spend_usd for b in bills if b.run_id == run_id}
        view = store.get_run(run_id)
        assert view.usage["spend_usd"] == pytest.approx(usage.spend_usd(PRICES))
    late = store.get_run("run-late")
    assert late.usage["gpu_seconds_by_pool"]["trainer"] == 7.0  # after its only bill
    assert dict(store.all_series("run-late")["spend_usd"]) == {1: 0.0}


def test_cpu_time_shows_in_the_views_by_device_kind() -> None:
    """A run on a host without a GPU is billed CPU-seconds: the view, the tenant totals
    and the API's usage name them (GPU-seconds alone would show 0 beside the spend)."""
    from events.envelope import new_envelope
    from projections.materializer import sync_usage
    from projections.store import tenant_totals
    from projections.views import RunView

    fold = AccountingFold(
        Prices(usd_per_gpu_second={"trainer": 0.002}, usd_per_cpu_second={"trainer": 0.0001})
    )
    state = fold.initial()
    for seq, step in enumerate(range(3), start=1):
        envelope = new_envelope(tenant_id="t", run_id="r", producer="trainer", seq=seq, step=step)
        usage = UsageRecorded(
            **envelope, pool="trainer", phase="optim", device_kind="cpu", device_seconds=2.0
        )
        state, _ = fold.apply(state, usage)
    view = RunView(run_id="r", tenant_id="t")
    sync_usage(view, state, fold.prices)
    assert view.usage["device_seconds_by_kind"] == {"cpu": 6.0}
    assert view.usage["gpu_seconds_by_pool"] == {"rollout_fleet": 0.0, "trainer": 0.0}
    assert view.usage["spend_usd"] > 0
    assert tenant_totals([view])[0]["device_seconds_by_kind"] == {"cpu": 6.0}


def test_a_paused_or_ended_runs_latest_bill_is_all_its_usage() -> None:
    """Found by review: a bill came only with a new committed step and the trainer meters
    a step after reporting it, so the final bill on the compacted topic left out the last
    step's usage (and steps recomputed after a rollback): 90 of 140 GPU-seconds."""
    from events import RunCancelled, RunPaused, RunResumed

    fold = AccountingFold(PRICES)
    f = RunFactory()
    state, bills = fold.initial(), []

    def feed(*events: object) -> None:
        nonlocal state
        for ev in events:
            state, out = fold.apply(state, ev)  # type: ignore[arg-type]
            bills.extend(out)

    def step(s: int) -> None:
        usage = f.ev(UsageRecorded, s, pool="trainer", phase="optim", device_kind="gpu",
                     device_seconds=10.0)  # fmt: skip
        feed(f.ev(TrainerStepCompleted, s), usage)

    for s in range(1, 4):
        step(s)
    assert dict(bills[-1].gpu_seconds_by_pool)["trainer"] == 20.0  # step 3's usage comes later
    feed(f.ev(RunPaused, 3, reason="gate"))
    assert dict(bills[-1].gpu_seconds_by_pool)["trainer"] == 30.0  # the pause's bill: all of it
    late = f.ev(UsageRecorded, 3, pool="trainer", phase="optim", device_kind="gpu",
                device_seconds=1.0)  # metered after the pause (or read after it)  # fmt: skip
    feed(late)
    assert dict(bills[-1].gpu_seconds_by_pool)["trainer"] == 31.0
    feed(f.ev(RunResumed, 3))
    n = len(bills)
    for s in range(4, 11):
        step(s)
    assert len(bills) == n + 7  # running again: one bill per committed step, as before
    for s in range(6, 10):  # rolled back to 5, steps 6-9 recomputed, then cancelled
        step(s)
    feed(f.ev(RunCancelled, 9))
    assert dict(bills[-1].gpu_seconds_by_pool)["trainer"] == 141.0
    assert bills[-1].spend_usd == pytest.approx(141.0 * 0.002)
    assert len({b.event_id for b in bills}) == len(bills)
    assert fold.load_state(fold.dump_state(state)) == state and state.settling


def test_a_run_that_metered_nothing_gets_no_bill_at_its_end() -> None:
    from events import RunCompleted

    fold = AccountingFold(PRICES)
    _, out = fold.apply(fold.initial(), RunFactory().ev(RunCompleted, None))
    assert out == ()


# -- bounded per run (review finding 2: a tenant's usage under a new producer per record) --


def _usage(f: RunFactory, producer: str, seq: int, seconds: float = 1.0) -> UsageRecorded:
    ev = f.ev(
        UsageRecorded, 1, pool="trainer", phase="step", device_kind="gpu", device_seconds=seconds
    )
    return ev.model_copy(update={"producer": producer, "seq": seq})  # type: ignore[return-value]


def _fold_time(fold: AccountingFold, events: list[UsageRecorded]) -> float:
    import time

    state = fold.initial()
    t = time.perf_counter()
    for ev in events:
        state, _ = fold.apply(state, ev)
    return time.perf_counter() - t


def test_a_fresh_producer_per_usage_fact_costs_the_same_however_many_came_before() -> None:
    """Each fact under a new ``hook/...`` name: the remembered producers stay at
    ``MAX_PRODUCERS`` and the state small, and a fact costs the same after 8,000 such facts
    as after 1,000, within a bounded factor of a one-producer fact (a copy of at most
    ``MAX_PRODUCERS`` entries). Before: a sorted tuple rebuilt per new producer, quadratic
    (72,500 such facts stalled ``runwatch process`` for > 300 s)."""
    from stream_processors.accounting.fold import MAX_PRODUCERS

    fold = AccountingFold(PRICES)
    f = RunFactory()
    fresh = [_usage(f, f"hook/a-{i}", 0, 0.001) for i in range(8_000)]
    one = [_usage(f, "hook/a", i, 0.001) for i in range(8_000)]
    state = fold.initial()
    for ev in fresh:
        state, _ = fold.apply(state, ev)
    assert len(state.billed_seq) == MAX_PRODUCERS
    assert list(state.billed_seq)[-1] == "hook/a-7999"  # the most recently billed kept
    assert state.gpu_seconds_trainer == pytest.approx(8_000 * 0.001)  # every fact billed
    assert len(fold.dump_state(state)) < 64 * MAX_PRODUCERS

    def per_fact(events: list[UsageRecorded]) -> float:
        return min(_fold_time(fold, events) for _ in range(3)) / len(events)

    late, early = per_fact(fresh), per_fact(fresh[:1_000])
    assert late < 3 * early, (late, early)  # flat in the number of producers seen
    assert late < 15 * per_fact(one), (late, per_fact(one))


def test_only_a_producer_forgotten_behind_max_producers_others_is_billed_again() -> None:
    """The bound's documented consequence: a redelivery of a producer still remembered is
    not billed; one of a producer that more than MAX_PRODUCERS others billed after is."""
    from stream_processors.accounting.fold import MAX_PRODUCERS

    fold = AccountingFold(PRICES)
    f = RunFactory()
    first, trainer = _usage(f, "hook/first", 0), _usage(f, "trainer/run-1", 0)
    state = fold.initial()
    for ev in (first, trainer):
        state, _ = fold.apply(state, ev)
    for i in range(MAX_PRODUCERS - 2):
        state, _ = fold.apply(state, _usage(f, f"hook/p-{i}", 0))
        if i % 10 == 0:  # the trainer keeps billing: it stays remembered
            state, _ = fold.apply(state, _usage(f, "trainer/run-1", i + 1))
    billed = state.gpu_seconds_trainer
    state, _ = fold.apply(state, first)  # MAX_PRODUCERS remembered, "first" among them
    assert state.gpu_seconds_trainer == billed
    state, _ = fold.apply(state, _usage(f, "hook/one-more", 0))
    state, _ = fold.apply(state, trainer)  # the trainer billed lately: still a redelivery
    assert state.gpu_seconds_trainer == billed + 1
    state, _ = fold.apply(state, first)  # forgotten (least recently billed): billed again
    assert state.gpu_seconds_trainer == billed + 2


def test_a_state_stored_with_producer_pairs_loads_and_is_stored_as_pairs() -> None:
    """States stored before 2026-11-28 (``billed_seq`` pairs sorted by producer) load and
    keep deduplicating; the new state is stored as the same pairs (least recently billed
    first), which the earlier code reads too."""
    import json

    fold = AccountingFold(PRICES)
    f = RunFactory()
    state = fold.initial()
    for ev in (_usage(f, "b", 3), _usage(f, "a", 7)):
        state, _ = fold.apply(state, ev)
    doc = json.loads(fold.dump_state(state))
    assert doc["billed_seq"] == [["b", 3], ["a", 7]]
    doc["billed_seq"] = [["a", 7], ["b", 3]]  # the old form: sorted pairs
    old = fold.load_state(json.dumps(doc).encode())
    assert dict(old.billed_seq) == {"a": 7, "b": 3} and old == state
    again, _ = fold.apply(old, _usage(f, "a", 7))
    assert again.gpu_seconds_trainer == state.gpu_seconds_trainer  # still a redelivery
    many = {**doc, "billed_seq": [[f"p{i:04d}", 1] for i in range(1000)]}  # unbounded before
    from stream_processors.accounting.fold import MAX_PRODUCERS

    assert len(fold.load_state(json.dumps(many).encode()).billed_seq) == MAX_PRODUCERS


def test_phase_names_kept_apart_are_bounded_per_run() -> None:
    """A producer naming a new phase per fact: the first MAX_PHASES are kept apart, the
    rest booked under OVERFLOW_PHASE; totals unchanged."""
    from stream_processors.accounting.fold import MAX_PHASES, OVERFLOW_PHASE

    fold = AccountingFold(PRICES)
    f = RunFactory()
    state = fold.initial()
    for i in range(MAX_PHASES + 500):
        ev = _usage(f, "hook/a", i).model_copy(update={"phase": f"phase-{i:05d}"})
        state, _ = fold.apply(state, ev)
    phases = dict(state.gpu_seconds_by_phase)
    assert len(phases) == MAX_PHASES + 1 and phases[OVERFLOW_PHASE] == 500.0
    assert state.gpu_seconds_trainer == MAX_PHASES + 500
