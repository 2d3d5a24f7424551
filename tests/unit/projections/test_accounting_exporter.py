"""Tenant accounting fold, the exporter (fresh registry per test), keys and config errors."""

from __future__ import annotations

import pytest

from events import TrainerStepCompleted, UsageRecorded
from projections.accounting import AccountingFold
from projections.engine import ProjectionEngine
from projections.exporter import OTHER, make_registry
from projections.keys import ApiKeys, digest
from projections.policy import Prices, RunStatePolicy
from projections.store import InMemoryReadModel
from tests.projection_runs import RunFactory, synth_fleet, synth_run

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
                gpu_seconds=10.0,
                tokens_generated=100,
            ),
            f.ev(
                UsageRecorded,
                step,
                pool="trainer",
                phase="optim",
                gpu_seconds=5.0,
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
    GPU time; GPU facts (v2's ``gpu_seconds`` read as GPU) keep GPU prices."""
    prices = Prices(
        usd_per_device_second={
            "gpu": {"trainer": 0.002, "rollout_fleet": 0.001},
            "cpu": {"trainer": 0.0001, "rollout_fleet": 0.00005},
        }
    )
    fold = AccountingFold(prices)
    f = RunFactory()
    state, out = fold.initial(), []
    for ev in (
        f.ev(UsageRecorded, 1, pool="rollout_fleet", phase="rollout", device_kind="cpu",
             device_seconds=10.0),
        f.ev(UsageRecorded, 1, pool="trainer", phase="optim", device_kind="cpu",
             device_seconds=4.0),
        f.ev(UsageRecorded, 1, pool="trainer", phase="optim", gpu_seconds=2.0),
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
    import json

    restored = fold.load_state(json.dumps(old).encode())
    assert dict(restored.device_seconds) == {"gpu/trainer": 2.0}
    # the packaged price list prices both kinds, GPU above CPU
    packaged = Prices.load()
    for pool in ("trainer", "rollout_fleet"):
        assert 0 < packaged.device_price("cpu", pool) < packaged.device_price("gpu", pool)
    # the older per-pool GPU prices still price GPU time
    assert PRICES.device_price("gpu", "trainer") == 0.002 and PRICES.device_price("cpu", "x") == 0


def test_a_redelivered_usage_fact_is_not_billed_twice():
    """Duplicates (a retry, a re-shipped spool tail, a re-import) carry the same producer
    and seq: the second copy costs nothing."""
    fold = AccountingFold(PRICES)
    f = RunFactory()
    usage = f.ev(UsageRecorded, 1, pool="trainer", phase="optim", gpu_seconds=10.0)
    other = f.ev(UsageRecorded, 1, pool="trainer", phase="optim", gpu_seconds=1.0,
                 producer="rollout-worker-3")  # fmt: skip
    state = fold.initial()
    for ev in (usage, other, usage, other, usage):
        state, _ = fold.apply(state, ev)
    assert state.gpu_seconds_trainer == 11.0
    later = f.ev(UsageRecorded, 2, pool="trainer", phase="optim", gpu_seconds=5.0)
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
        ev = f.ev(UsageRecorded, 1, pool="trainer", phase="optim", gpu_seconds=4.0)
        state, _ = fold.apply(state, ev.model_copy(update={"seq": seq}))
    assert state.gpu_seconds_trainer == 4.0


def _store(events):
    store = InMemoryReadModel()
    engine = ProjectionEngine(store, prices=PRICES)
    engine.process_events((type(e).TOPIC, 0, e) for e in events)
    engine.release_held()
    engine.checkpoint()
    return store


def test_exporter_reads_the_read_model_at_scrape_time():
    store = InMemoryReadModel()
    registry = make_registry(store)
    assert registry.get_sample_value("runwatch_runs", {"state": "RUNNING"}) == 0
    engine = ProjectionEngine(store, prices=PRICES)
    engine.process_events(
        (type(e).TOPIC, 0, e) for e in synth_run("r1", "acme", "platform", steps=20)
    )
    engine.release_held()
    engine.checkpoint()
    assert registry.get_sample_value("runwatch_runs", {"state": "FAILED"}) == 1
    value = registry.get_sample_value
    assert (
        value(
            "runwatch_runs_terminal_total", {"state": "FAILED", "failure_class": "platform_fault"}
        )
        == 1
    )
    assert value("runwatch_step_phase_seconds_count", {"phase": "sync"}) == 10
    assert value("runwatch_step_phase_seconds_bucket", {"phase": "sync", "le": "0.5"}) == 10
    assert value("runwatch_tenant_gpu_seconds_total", {"tenant": "acme", "pool": "trainer"}) == 40.0
    assert value("runwatch_run_state_transitions_total", {"to_state": "FAILED"}) == 1


def test_tenant_labels_are_bounded_and_sums_are_kept():
    store = _store(synth_fleet(12, 10, tenants=6))
    registry = make_registry(store, top_tenants=2)
    samples = [
        s for m in registry.collect() if m.name == "runwatch_tenant_spend_usd" for s in m.samples
    ]
    labels = {s.labels["tenant"] for s in samples}
    assert len(labels) == 3 and OTHER in labels
    total = sum(t["spend_usd"] for t in store.tenants())
    assert sum(s.value for s in samples) == pytest.approx(total)
    for m in registry.collect():
        for s in m.samples:
            assert "run_id" not in s.labels


def test_tenant_counters_never_move_between_labels_as_spend_changes():
    """A late big spender must not push an earlier tenant's total into ``other`` (a
    counter that goes down reads as a reset to ``rate()``)."""
    early = list(synth_run("r1", "acme", "success", steps=10)) + list(
        synth_run("r2", "beta", "success", steps=10)
    )
    late = list(synth_run("r3", "zeta", "success", steps=200))
    late = [e.model_copy(update={"ts": e.ts + 1e6}) for e in late]
    store = _store(early)
    registry = make_registry(store, top_tenants=2)

    def spend() -> dict[str, float]:
        return {
            s.labels["tenant"]: s.value
            for m in registry.collect()
            if m.name == "runwatch_tenant_spend_usd"
            for s in m.samples
        }

    before = spend()
    engine = ProjectionEngine(store, prices=PRICES)
    engine.process_events((type(e).TOPIC, 0, e) for e in late)
    engine.release_held()
    engine.checkpoint()
    after = spend()
    assert set(before) == {"acme", "beta"} and set(after) == {"acme", "beta", OTHER}
    assert all(after[t] >= v for t, v in before.items())  # no series went down


def test_exporter_never_raises_on_a_broken_read_model():
    class Broken(InMemoryReadModel):
        def all_views(self):
            raise OSError("disk gone")

    registry = make_registry(Broken())
    assert registry.get_sample_value("runwatch_exporter_scrape_errors_total") == 1


def test_keys_file_rules():
    keys = ApiKeys.from_mapping(
        {"keys": [{"key": "a", "tenant": "t"}, {"sha256": digest("b"), "operator": True}]}
    )
    assert keys.resolve("a").tenant_id == "t" and keys.resolve("b").operator
    assert keys.resolve("c") is None and keys.resolve(None) is None
    for bad in (
        {"keys": [{"key": "a"}]},
        {"keys": [{"key": "a", "tenant": "t", "operator": True}]},
        {"keys": [{"key": "a", "sha256": "x", "tenant": "t"}]},
        {"keys": ["a"]},
    ):
        with pytest.raises(ValueError):
            ApiKeys.from_mapping(bad)


def test_config_errors_are_clear(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("detectors: [")
    with pytest.raises(ValueError, match="not valid YAML"):
        RunStatePolicy.load(p)
    with pytest.raises(ValueError, match="not found"):
        Prices.load(tmp_path / "missing.yaml")
    p.write_text("detectors:\n  kl_blowup:\n    action: explode\n")
    with pytest.raises(ValueError):
        RunStatePolicy.load(p)


def test_packaged_policy_names_every_detector_of_the_catalog():
    from pathlib import Path

    import yaml

    policy = RunStatePolicy.load()
    catalog = (
        Path(__file__).resolve().parents[3] / "stream_processors" / "detectors" / "catalog.yaml"
    )
    if not catalog.exists():
        pytest.skip("detector catalog not in this tree")
    doc = yaml.safe_load(catalog.read_text())
    names = set((doc.get("detectors") or {}).keys()) if isinstance(doc, dict) else set()
    assert names, "catalog lists no detectors"
    assert names <= set(policy.detectors), names - set(policy.detectors)


def test_trusted_usage_events_equal_validated_ones_byte_for_byte():
    from events import TenantUsageUpdated, encode
    from events.codec import decode

    fold = AccountingFold(PRICES)
    state, out = fold.initial(), []
    for ev in synth_run("r", "t", "healthy", steps=4):
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    for ev in out:
        validated = TenantUsageUpdated(**ev.model_dump())
        assert ev == validated and encode(ev) == encode(validated)
        assert decode(encode(ev)) == ev and hash(ev) == hash(validated)
