"""The series of the notifier's and the processors' own metrics (``--metrics-port``), as
sample name -> label names, from real collectors over a real embedded log: what the
deploy tests add to the projections exporter's series when they check that every rule
reads series something exposes."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry


def liveness_series(tmp: Path) -> dict[str, set[str]]:
    from events.log.embedded import EmbeddedLog
    from runwatch.folds import processor_folds
    from runwatch.hosting.embedded import EmbeddedHost
    from runwatch.hosting.progress import make_registry
    from runwatch.notifier import Notifier, NotifierCollector, WebhookBook

    log = EmbeddedLog(tmp / "liveness-log")
    log.open_sync()
    host = EmbeddedHost(log, processor_folds())
    host.run_once()  # an idle pass: its progress stamp
    notifier = Notifier(log, WebhookBook(hooks={}))
    notifier.stats.last_poll_ts = 1.0
    notes = CollectorRegistry(auto_describe=False)
    notes.register(NotifierCollector(notifier))  # type: ignore[arg-type]
    out: dict[str, set[str]] = {}
    for registry in (make_registry(host, "runwatch-processors", log.root), notes):
        text = generate_latest(registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_liveness_series_are_exposed(tmp_path: Path) -> None:
    got = liveness_series(tmp_path)
    assert got["runwatch_processor_last_progress_timestamp_seconds"] == {"app"}
    assert got["runwatch_processor_lag_records"] == {"app", "topic"}
    assert got["runwatch_notifications_abandoned_total"] == {"kind", "urgent"}
    assert got["runwatch_notifications_unroutable_total"] == {"kind", "urgent"}
    assert "runwatch_notifier_last_poll_timestamp_seconds" in got
