"""The exporter (fresh registry per test), keys and config errors; the accounting fold's own
tests: tests/unit/stream_processors/test_accounting_fold.py."""

from __future__ import annotations

import pytest

from projections.exporter import OTHER, make_registry
from projections.keys import ApiKeys, digest
from projections.policy import RunStatePolicy
from projections.store import InMemoryReadModel
from runwatch.hosting.read_model import read_model_host
from stream_processors.accounting import AccountingFold, Prices
from tests.projection_runs import synth_fleet, synth_run

PRICES = Prices(usd_per_gpu_second={"trainer": 0.002, "rollout_fleet": 0.001})


def _store(events):
    store = InMemoryReadModel()
    engine = read_model_host(store, prices=PRICES)
    engine.process_events((type(e).TOPIC, 0, e) for e in events)
    engine.release_held()
    engine.checkpoint()
    return store


def test_exporter_reads_the_read_model_at_scrape_time():
    store = InMemoryReadModel()
    registry = make_registry(store)
    assert registry.get_sample_value("runwatch_runs", {"state": "RUNNING"}) == 0
    engine = read_model_host(store, prices=PRICES)
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
    # what is billed, by device kind: the trainer's 40 s and the fleet's, all GPU here
    device = value("runwatch_tenant_device_seconds_total", {"tenant": "acme", "kind": "gpu"})
    pools = sum(store.tenants()[0]["gpu_seconds_by_pool"].values())
    assert device == pools and device >= 40.0
    assert store.tenants()[0]["device_seconds_by_kind"] == {"gpu": device}
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


def _two_tenants() -> list:
    return list(synth_run("r1", "acme", "success", steps=10)) + list(
        synth_run("r2", "beta", "success", steps=10)
    )


def _spend(registry) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """tenant label -> spend, as one scrape reads it."""
    return {
        s.labels["tenant"]: s.value
        for m in registry.collect()
        if m.name == "runwatch_tenant_spend_usd"
        for s in m.samples
    }


def _fold_more(store, events) -> None:  # type: ignore[no-untyped-def]
    """Fold ``events`` into ``store`` as the read model host does."""
    engine = read_model_host(store, prices=PRICES)
    engine.process_events((type(e).TOPIC, 0, e) for e in events)
    engine.release_held()
    engine.checkpoint()


def test_tenant_counters_never_move_between_labels_as_spend_changes():
    """A late big spender must not push an earlier tenant's total into ``other`` (a
    counter that goes down reads as a reset to ``rate()``)."""
    late = list(synth_run("r3", "zeta", "success", steps=200))
    late = [e.model_copy(update={"ts": e.ts + 1e6}) for e in late]
    store = _store(_two_tenants())
    registry = make_registry(store, top_tenants=2)
    before = _spend(registry)
    _fold_more(store, late)
    after = _spend(registry)
    assert set(before) == {"acme", "beta"} and set(after) == {"acme", "beta", OTHER}
    assert all(after[t] >= v for t, v in before.items())  # no series went down


def test_a_backdated_newcomer_takes_no_name_from_a_named_tenant():
    """Ranked afresh at each scrape, a new tenant whose events claim an early ``ts`` (the
    producer's clock) would take ``beta``'s name, and ``beta``'s counters would fall into
    ``other``; names once given are kept."""
    backdated = [
        e.model_copy(update={"ts": e.ts - 1e6})
        for e in synth_run("r3", "mallory", "success", steps=10)
    ]
    store = _store(_two_tenants())
    registry = make_registry(store, top_tenants=2)
    before = _spend(registry)
    _fold_more(store, backdated)
    after = _spend(registry)
    assert set(before) == {"acme", "beta"} and set(after) == {"acme", "beta", OTHER}
    assert after["beta"] == before["beta"] and after["acme"] == before["acme"]
    fresh = make_registry(store, top_tenants=2)  # a restarted exporter ranks afresh
    assert "mallory" in _spend(fresh)


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
    # a price list written before CPU-seconds were billed is refused, not read as $0
    old_list = tmp_path / "prices.yaml"
    old_list.write_text("version: v1\nusd_per_gpu_second: {trainer: 0.002}\n")
    with pytest.raises(ValueError, match="no usd_per_cpu_second"):
        Prices.load(old_list)
    old_list.write_text("version: v2\nusd_per_gpu_second: {}\nusd_per_cpu_second: {}\n")
    assert Prices.load(old_list).device_price("cpu", "trainer") == 0.0  # free on purpose
    old_list.write_text("usd_per_gpu_second: {}\nusd_per_cpu_second: {}\nusd_per_tpu: 1\n")
    with pytest.raises(ValueError, match=r"prices\.yaml"):
        Prices.load(old_list)
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
