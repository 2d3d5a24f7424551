"""``runwatch_runs_silent{tenant}``: live runs whose newest fact is old at the scrape.

Found by review (F2): a hooked run whose log went away trained on unmonitored, shown
RUNNING at its last shipped step, and nothing on the platform said so. The scrape's clock
is injected; event times are the producers' (``RunView.updated_ts``).
"""

from __future__ import annotations

from projections.exporter import OTHER, SILENT_AFTER_S, make_registry
from projections.fleet import Fleet
from projections.store import InMemoryReadModel
from projections.views import RunView
from runwatch.hosting.read_model import read_model_host
from tests.projection_runs import synth_run


class _Views:
    """The two reads the collector makes."""

    def __init__(self, views: list[RunView]) -> None:
        self.views = views

    def all_views(self) -> list[RunView]:
        return list(self.views)

    def fleet(self) -> Fleet:
        return Fleet()


def _view(run: str, tenant: str, state: str, last: float, created: float = 0.0) -> RunView:
    return RunView(tenant, run, created_ts=created, updated_ts=last, state=state)


def test_live_runs_silent_past_the_bound_are_counted_per_tenant() -> None:
    now = 10_000.0
    views = [
        _view("a1", "acme", "RUNNING", now - 601),  # silent
        _view("a2", "acme", "DEGRADED", now - 3600),  # silent, the oldest
        _view("a3", "acme", "RUNNING", now - 30),  # talking
        _view("a4", "acme", "PAUSED_BY_GATE", now - 9000),  # paused: silent by design
        _view("a5", "acme", "FAILED", now - 9000),  # over
        _view("a6", "acme", "SUBMITTED", now - 9000),  # not started
        _view("b1", "beta", "RUNNING", now - 5),
        _view("c1", "gamma", "SUCCEEDED", now - 9000),
    ]
    registry = make_registry(_Views(views), clock=lambda: now)  # type: ignore[arg-type]
    value = registry.get_sample_value
    assert value("runwatch_runs_silent", {"tenant": "acme"}) == 2
    assert value("runwatch_runs_silent", {"tenant": "beta"}) == 0  # series kept at 0
    assert value("runwatch_runs_silent", {"tenant": "gamma"}) == 0
    assert value("runwatch_runs_silent_max_age_seconds", {"tenant": "acme"}) == 3600
    assert value("runwatch_runs_silent_max_age_seconds", {"tenant": "beta"}) == 5
    assert value("runwatch_runs_silent_max_age_seconds", {"tenant": "gamma"}) == 0
    # the bound is a setting; a clock behind the producer's is no negative age
    strict = make_registry(_Views(views), silent_after_s=20, clock=lambda: now)  # type: ignore[arg-type]
    assert strict.get_sample_value("runwatch_runs_silent", {"tenant": "acme"}) == 3
    early = make_registry(_Views(views), clock=lambda: now - 7200)  # type: ignore[arg-type]
    assert early.get_sample_value("runwatch_runs_silent_max_age_seconds", {"tenant": "beta"}) == 0
    assert SILENT_AFTER_S == 600.0


def test_tenant_labels_stay_bounded() -> None:
    now = 10_000.0
    views = [_view(f"r{i}", f"t{i}", "RUNNING", now - 1000, created=i) for i in range(5)]
    registry = make_registry(_Views(views), top_tenants=2, clock=lambda: now)  # type: ignore[arg-type]
    samples = [s for m in registry.collect() if m.name == "runwatch_runs_silent" for s in m.samples]
    assert {s.labels["tenant"] for s in samples} == {"t0", "t1", OTHER}
    assert sum(s.value for s in samples) == 5
    assert registry.get_sample_value("runwatch_runs_silent", {"tenant": OTHER}) == 3


def test_a_run_folded_from_its_events_goes_silent_when_its_facts_stop() -> None:
    store = InMemoryReadModel()
    engine = read_model_host(store)
    events = synth_run("r1", "acme", steps=5)[:-1]  # no RunCompleted: still running
    engine.process_events((type(e).TOPIC, 0, e) for e in events)
    engine.release_held()
    engine.checkpoint()
    (view,) = store.all_views()
    assert view.state == "RUNNING"
    last = max(e.ts for e in events)
    assert view.updated_ts == last
    now = [last + 10]
    registry = make_registry(store, clock=lambda: now[0])
    assert registry.get_sample_value("runwatch_runs_silent", {"tenant": "acme"}) == 0
    now[0] = last + SILENT_AFTER_S + 1  # read at scrape time: nothing cached
    assert registry.get_sample_value("runwatch_runs_silent", {"tenant": "acme"}) == 1


def test_the_longest_gate_pause_is_exported_per_tenant() -> None:
    """``runwatch_runs_paused_max_age_seconds{tenant}``: a gate-paused run holds its
    allocation until someone answers, and nothing bounds a pause (review, 2026-11-28):
    the age of the longest wait, for ``RunwatchRunPausedLong``."""
    now = 100_000.0
    views = [
        _view("a1", "acme", "PAUSED_BY_GATE", now - 5 * 3600),
        _view("a2", "acme", "PAUSED_BY_GATE", now - 60),
        _view("a3", "acme", "RUNNING", now - 9 * 3600),  # silent, not paused
        _view("b1", "beta", "FAILED", now - 9 * 3600),
    ]
    registry = make_registry(_Views(views), clock=lambda: now)  # type: ignore[arg-type]
    value = registry.get_sample_value
    assert value("runwatch_runs_paused_max_age_seconds", {"tenant": "acme"}) == 5 * 3600
    assert value("runwatch_runs_paused_max_age_seconds", {"tenant": "beta"}) == 0
