"""The plane on the embedded log, hosted in one process for the demo and the canary.

One :meth:`EmbeddedPlane.tick` runs the stream processors (:func:`runwatch.folds.
processor_folds`: profiling, the run-health detectors, the run controller, tenant
accounting) over what is new on the log, appending what they derive (alerts, pause
requests, bills) to it, then folds the new records into the read model (run states and
attribution; usage) and appends *its* derived events (RunStateChanged) too — so the log
ends up holding the whole story, and ``runwatch replay`` over it reproduces the same
derived events. Both are the one host (:mod:`runwatch.hosting`) with their options.

Time: ticks are driven by the caller (wall clock); everything folded is event time.
"""

from __future__ import annotations

from pathlib import Path

from events.codec import decode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from projections.views import RunView
from runwatch.folds import processor_folds
from runwatch.hosting.embedded import EmbeddedHost
from runwatch.hosting.read_model import INPUTS, read_model_host

ALERTS = "runwatch.alerts"


class EmbeddedPlane:
    def __init__(self, log_dir: Path, catalog: str | None = None, control: bool = True) -> None:
        self.log = EmbeddedLog(log_dir)
        self.log.open_sync()
        self.host = EmbeddedHost(self.log, processor_folds(catalog, control=control))
        self.engine = read_model_host()
        self.derived: list[EventBase] = []
        self.records = 0
        self._alerts_seen = 0

    def process(self) -> None:
        """Run the stream processors only (cheap: what is new): the detectors and the run
        controller answer a fault within a fraction of a second; the projections can
        follow at the slower :meth:`tick`."""
        self.host.run_once()

    def tick(self, final: bool = False) -> list[EventBase]:
        """Process what is new; return the events derived this time (alerts, state
        changes). ``final``: the log is complete, release every held terminal."""
        self.host.run_once()
        alerts = self._new_alerts()
        starts = {topic: v for (topic, _), v in self.engine.positions.items()}
        records = list(self.log.iter_records(list(INPUTS), from_offsets=starts))
        self.records += len(records)
        projected = self.engine.process(records)
        if final:
            projected += self.engine.release_held(force=True)
        self.engine.checkpoint()  # fold decisions -> views, with the positions
        if projected:
            self.log.append_events_sync(projected)
        out = alerts + projected
        self.derived.extend(out)
        return out

    def _new_alerts(self) -> list[EventBase]:
        out: list[EventBase] = []
        for rec in self.log.read_sync(ALERTS, self._alerts_seen):
            self._alerts_seen = rec.offset + 1
            ev = decode(rec.value)
            if isinstance(ev, EventBase):
                out.append(ev)
        return out

    @property
    def views(self) -> dict[str, RunView]:
        return self.engine.view.views  # type: ignore[union-attr,no-any-return]
