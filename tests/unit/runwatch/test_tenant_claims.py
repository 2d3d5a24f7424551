"""A run id is its first tenant's: every host refuses another tenant's events on it.

A customer's hook names its own run id and tenant; another tenant's producer that names
the same run id (by accident, or to page and pause someone else's run) must not reach
that run's detectors, controller, bill or webhook. Pure logic, no broker: the embedded
host's core and the faust agent's record handler on dict tables, which must agree.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgpack

from events import AlertFired, PauseRequested, TenantUsageUpdated, TrainerStepCompleted
from events.codec import encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.base import Record
from producers.commands import CommandFeed, write_command
from producers.sinks import MemorySink
from runwatch.folds import processor_folds
from runwatch.hosting.core import HostedFold, dump_slot, load_slot
from runwatch.hosting.faust_agent import SlotCache, agent_pins, fold_records
from runwatch.hosting.host import Host
from runwatch.hosting.stores import NoState
from stream_processors.detectors import RunHealthFold
from stream_processors.detectors.scenarios import synthetic_run
from tests.event_samples import forged_steps, sample

RUN = "shared-run"


def _victim() -> list[EventBase]:
    """A healthy run of tenant ``victim`` (no detector fires on it)."""
    return synthetic_run(7, steps=80, run_id=RUN, tenant_id="victim")


def _forged(events: list[EventBase], n: int = 3) -> list[EventBase]:
    """Tenant ``attacker``'s steps on the victim's run id (with a NaN loss too)."""
    return forged_steps(events, RUN, "attacker", n, loss=float("nan"))


def _control(tenant: str) -> list[EventBase]:
    """The same NaN losses under the victim's own name: what the attacker's would do."""
    events = _victim()
    return events + [e.model_copy(update={"tenant_id": tenant}) for e in _forged(events)]


def _host_run(events: list[EventBase]) -> tuple[Host, list[EventBase]]:
    """The processors' host over ``events``, what it derives fed back in (as the embedded
    host's passes over the log do: the controller reads the detectors' alerts)."""
    host = Host(processor_folds(), NoState())
    out: list[EventBase] = []
    batch = events
    while batch:
        derived = host.process_events((type(e).TOPIC, 0, e) for e in batch)
        out.extend(derived)
        batch = derived
    return host, out


def test_the_forged_events_would_page_and_pause_the_run_if_they_were_the_victims_own() -> None:
    """The control: the forged records are a real attack (folded, they pause the run)."""
    _, out = _host_run(_control("victim"))
    assert any(isinstance(e, AlertFired) and e.routing == "page" for e in out)
    assert any(isinstance(e, PauseRequested) for e in out)


def test_another_tenants_events_on_a_run_id_are_refused_and_dead_lettered() -> None:
    events = _victim()
    forged = _forged(events)
    host, out = _host_run([*events, *forged])
    assert not [e for e in out if isinstance(e, AlertFired | PauseRequested)]
    bills = [e for e in out if isinstance(e, TenantUsageUpdated)]
    assert bills and {b.tenant_id for b in bills} == {"victim"}  # the bill never changed hands
    assert host.refused == len(forged)  # once per record, whichever folds refused it
    letters = host.dead_letters
    assert [d.kind for d in letters] == ["foreign_tenant"] * len(forged)
    assert "belongs to tenant 'victim'" in letters[0].reason
    assert "names tenant 'attacker'" in letters[0].reason
    assert [d.raw for d in letters] == [encode(e) for e in forged]  # nothing lost
    # the victim's own events still fold after the refusals
    more = synthetic_run(7, steps=90, run_id=RUN, tenant_id="victim")[len(events) :]
    assert more
    host.process_events((type(e).TOPIC, 0, e) for e in more)
    assert host.refused == len(forged)


def test_a_refused_record_is_located_where_it_was_read() -> None:
    events = _victim()
    forged = _forged(events, n=1)
    host = Host(processor_folds(), NoState())
    records = [
        Record(type(e).TOPIC, 0, i, e.key(), encode(e), 0) for i, e in enumerate([*events, *forged])
    ]
    host.process(records)
    (letter,) = host.dead_letters
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "runwatch.telemetry",
        0,
        len(records) - 1,
    )


def test_the_faust_agent_refuses_the_same_records_and_sends_one_dead_letter_each() -> None:
    events = _victim()
    forged = _forged(events)
    folds = processor_folds()
    hosted = {f.name: (f, {}, SlotCache()) for f in folds}
    owners = agent_pins(list(hosted.values()))
    sent: list[tuple[str, bytes | None, bytes]] = []
    writes_before_forgery = None
    for i, ev in enumerate([*events, *forged]):
        if i == len(events):
            writes_before_forgery = {n: dict(h[1]) for n, h in hosted.items()}
        topic = type(ev).TOPIC
        mine = [hosted[f.name] for f in folds if topic in f.inputs]
        folded = fold_records(mine, topic, 0, i, encode(ev), owners)
        sent.extend(folded)
        folded.store()
    letters = [
        DeadLetter.model_validate_json(v) for t, _, v in sent if t == "runwatch.dead-letters"
    ]
    assert [d.kind for d in letters] == ["foreign_tenant"] * len(forged)
    assert [d.source_offset for d in letters] == list(range(len(events), len(events) + 3))
    assert not [v for t, _, v in sent if t in ("runwatch.alerts", "runwatch.control")]
    # nothing of the forged records reached a table
    assert {n: dict(h[1]) for n, h in hosted.items()} == writes_before_forgery
    # the embedded host derives the same records from the same input
    host = Host(processor_folds(), NoState())
    out = host.process_events((type(e).TOPIC, 0, e) for e in [*events, *forged])
    assert [encode(e) for e in out] == [v for t, _, v in sent if t != "runwatch.dead-letters"]


def test_a_slot_keeps_its_tenant_and_an_old_slot_is_pinned_by_the_next_event() -> None:
    fold = RunHealthFold()
    hosted = HostedFold(fold)
    events = _victim()
    for ev in events[:20]:
        hosted.feed(ev)
    raw = hosted.dump(RUN)
    assert load_slot(fold, raw).tenant == "victim"
    doc = msgpack.unpackb(raw, raw=False)
    del doc["tenant"]  # a slot stored before slots held their tenant
    old = load_slot(fold, msgpack.packb(doc, use_bin_type=True))
    assert old.tenant is None
    again = HostedFold(fold)
    again.slots[RUN] = old
    again.feed(events[20])
    assert again.slots[RUN].tenant == "victim"
    assert again.feed(_forged(events, n=1)[0]) is None and again.refused == 1
    assert load_slot(fold, dump_slot(fold, again.slots[RUN])).tenant == "victim"


def test_the_trainer_follows_only_commands_naming_its_own_tenant() -> None:
    sink = MemorySink()
    feed = CommandFeed(sink, RUN, tenant_id="victim")
    common = {"run_id": RUN, "action": "pause", "phase": "live", "actor": "customer"}
    write_command(sink, tenant_id="attacker", principal="attacker", **common)  # type: ignore[arg-type]
    assert feed.poll() == []
    write_command(sink, tenant_id="victim", principal="victim", **common)  # type: ignore[arg-type]
    (cmd,) = feed.poll()
    assert isinstance(cmd, PauseRequested) and cmd.tenant_id == "victim"
    # without a tenant (a feed of an older caller), every command for the run id is followed
    assert len(CommandFeed(sink, RUN).poll()) == 2


def _step_first_run() -> tuple[list[EventBase], EventBase, list[EventBase]]:
    """The victim's submission, then another tenant's step on the run id (telemetry: a
    topic the controller does not read, and accounting reads only), then the victim's
    steps."""
    events = _victim()
    cut = next(i for i, e in enumerate(events) if e.TOPIC == "runwatch.telemetry")
    head, tail = events[:cut], events[cut:]
    assert head and {e.TOPIC for e in head} == {"runwatch.lifecycle"}
    step = next(e for e in tail if isinstance(e, TrainerStepCompleted))
    forged = step.model_copy(update={"event_id": uuid.uuid4(), "tenant_id": "attacker"})
    return head, forged, tail


def test_the_first_event_of_a_run_pins_it_for_every_fold_of_the_host() -> None:
    """Round four, second pass: pins were per fold, so a fold that had not seen the run
    yet (accounting reads telemetry only) was pinned by another tenant's first step
    there, and the victim's whole bill went to the attacker."""
    head, forged, tail = _step_first_run()
    host, out = _host_run([*head, forged, *tail])
    assert host.refused == 1 and host.dead_letters[0].raw == encode(forged)
    bills = [e for e in out if isinstance(e, TenantUsageUpdated)]
    assert bills and {b.tenant_id for b in bills} == {"victim"}
    assert len(bills) == sum(1 for e in tail if isinstance(e, TrainerStepCompleted))
    # after a restart the pin comes back from the slots (any fold's)
    again = Host(processor_folds(), NoState())
    for hf, old in zip(again.folds, host.folds):
        hf.slots.update(
            {k: load_slot(hf.fold, dump_slot(old.fold, v)) for k, v in old.slots.items()}
        )
    again.process_events([(type(forged).TOPIC, 0, forged)])
    assert again.refused == 1


def test_the_faust_agent_pins_a_run_for_all_its_folds_too() -> None:
    head, forged, tail = _step_first_run()
    folds = processor_folds()
    hosted = {f.name: (f, {}, SlotCache()) for f in folds}
    owners = agent_pins(list(hosted.values()))
    sent: list[tuple[str, bytes | None, bytes]] = []
    for i, ev in enumerate([*head, forged, *tail]):
        topic = type(ev).TOPIC
        mine = [hosted[f.name] for f in folds if topic in f.inputs]
        folded = fold_records(mine, topic, 0, i, encode(ev), owners)
        sent.extend(folded)
        folded.store()
    dead = [DeadLetter.model_validate_json(v) for t, _, v in sent if t == "runwatch.dead-letters"]
    assert [d.raw for d in dead] == [encode(forged)]
    bills = [
        TenantUsageUpdated.model_validate_json(v)
        for t, _, v in sent
        if t == "runwatch.tenant-usage"
    ]
    assert bills and {b.tenant_id for b in bills} == {"victim"}
    # a fresh agent (a restart, a rebalance) finds the pin in the tables
    fresh = agent_pins([(f, table, SlotCache()) for f, table, _ in hosted.values()])
    assert fresh.owner_of(forged, "runwatch.telemetry") == "victim"


def test_another_tenants_lifecycle_facts_decide_neither_commands_nor_resumes(
    tmp_path: Path,
) -> None:
    """Round four, second pass: a forged ``RunFailed`` under another tenant on a live
    run's id made an operator's cancel refused ("the run has already ended"), and would
    have made ``runwatch resume`` refuse the run."""
    from events import RunFailed, RunStarted
    from events.log.embedded import EmbeddedLog
    from producers.commands import issue
    from trainer.publish import run_events

    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    events = _victim()
    submitted = next(e for e in events if e.type == "RunSubmitted")
    started = [
        submitted,
        sample(RunStarted, 1, run_id=RUN).model_copy(update={"tenant_id": "victim"}),
    ]
    forged = sample(RunFailed, 99, run_id=RUN).model_copy(update={"tenant_id": "attacker"})
    log.append_events_sync([*started, forged])
    done = issue(tmp_path / "log", RUN, "cancel", actor="operator", principal="ops")
    assert done.refused == "" and done.tenant_id == "victim"
    mine = list(run_events(tmp_path / "log", RUN))
    assert [e.type for e in mine if e.TOPIC == "runwatch.lifecycle"] == [
        "RunSubmitted",
        "RunStarted",
    ]
    assert list(run_events(tmp_path / "log", RUN, "attacker")) == [forged]


def test_a_command_before_the_run_exists_claims_nothing(tmp_path: Path) -> None:
    """Review of round four: a command for a run id with no facts yet (a typo, or just
    before the trainer's submission) is refused under tenant ``''`` — and, as the run's
    first event on the processors' host, pinned the run to ``''``: every event of the
    real run was then refused. A customer's refused command on another run id, written
    under the customer's tenant, would have claimed it the same way. Commands never pin."""
    from events.log.embedded import EmbeddedLog
    from producers.commands import issue
    from runwatch.hosting.embedded import EmbeddedHost

    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    early = issue(tmp_path / "log", RUN, "pause", actor="operator", principal="ops")
    probe = issue(tmp_path / "log", RUN, "cancel", actor="customer", principal="m", tenant_id="m")
    assert early.refused and probe.refused  # no such run (yet): refused, and written
    events = _victim()
    log.append_events_sync([*events, *forged_steps(events, RUN, "victim")])
    host = EmbeddedHost(log, processor_folds())
    stats = host.run_once()
    assert host.host.refused == 0 and stats.dead_letters == 0
    assert stats.derived.get("PauseRequested") == 1  # the run's own steps paged and paused it
    # a fresh host (a restart) finds the run pinned to its tenant, not to a command's
    again = Host(processor_folds(), NoState())
    for hf, old in zip(again.folds, host.host.folds):
        hf.slots.update(
            {k: load_slot(hf.fold, dump_slot(old.fold, v)) for k, v in old.slots.items()}
        )
    assert (
        again.pins is not None and again.pins.owner_of(events[0], "runwatch.telemetry") == "victim"
    )


def test_a_faust_agent_lets_no_command_claim_a_run() -> None:
    from events import CommandRejected

    events = _victim()
    early = sample(CommandRejected, 0, run_id=RUN).model_copy(update={"tenant_id": ""})
    folds = processor_folds()
    hosted = {f.name: (f, {}, SlotCache()) for f in folds}
    pins = agent_pins(list(hosted.values()))
    sent: list[tuple[str, bytes | None, bytes]] = []
    for i, ev in enumerate([early, *events, *forged_steps(events, RUN, "victim")]):
        topic = type(ev).TOPIC
        mine = [hosted[f.name] for f in folds if topic in f.inputs]
        folded = fold_records(mine, topic, 0, i, encode(ev), pins)
        sent.extend(folded)
        folded.store()
    assert not [v for t, _, v in sent if t == "runwatch.dead-letters"]
    alerts = [AlertFired.model_validate_json(v) for t, _, v in sent if t == "runwatch.alerts"]
    assert any(a.routing == "page" for a in alerts)  # the run's own steps were folded
    assert pins.by_run[RUN] == "victim"


def test_another_tenants_traces_first_claim_a_run_for_profiling_only(tmp_path: Path) -> None:
    """Found by review: the embedded processors pinned a run on any topic, rollout traces
    included, which the read model does not read: tenant B's traces imported first under
    A's run id took A's bills (every usage fact refused, no bill published) while the API
    showed A's spend. Pins are per co-partitioned group now, as on faust."""
    from events import RolloutTraceRecorded, RunSubmitted, UsageRecorded
    from events.log.embedded import EmbeddedLog
    from runwatch.hosting.embedded import EmbeddedHost
    from runwatch.hosting.replay import rebuild_from_log

    def env(tenant: str, producer: str, seq: int, step: int | None = None) -> dict[str, object]:
        return {"event_id": uuid.uuid4(), "tenant_id": tenant, "run_id": "exp-1", "step": step,
                "ts": 1000.0 + seq, "producer": producer, "seq": seq}  # fmt: skip

    def trace(tenant: str, seq: int) -> EventBase:
        return RolloutTraceRecorded(
            **env(tenant, f"traces/{tenant}", seq, 1), worker="w0", event_name="generate",
            duration_s=1.0,
        )  # fmt: skip

    log = EmbeddedLog(tmp_path / "log")
    log.open_sync()
    log.append_events_sync([trace("tenant-b", 0)])
    events: list[EventBase] = [RunSubmitted(**env("tenant-a", "trainer/a", 0), algorithm="grpo")]
    for s in range(1, 6):
        events += [
            TrainerStepCompleted(**env("tenant-a", "trainer/a", 2 * s - 1, s), algorithm="grpo"),
            UsageRecorded(**env("tenant-a", "trainer/a", 2 * s, s), pool="trainer",
                          phase="optim", device_kind="gpu", device_seconds=100.0),
        ]  # fmt: skip
    log.append_events_sync([*events, trace("tenant-a", 1)])
    host = EmbeddedHost(log, processor_folds())
    host.run_once()
    assert host.host.pins is not None and host.host.pins.by_run["exp-1"] == "tenant-a"
    # the traces' group is the first tracer's: A's own trace is refused there, only there
    reader = EmbeddedLog(tmp_path / "log", readonly=True)
    reader.open_sync()
    dead = [
        DeadLetter.model_validate_json(r.value) for r in reader.read_sync("runwatch.dead-letters")
    ]
    assert host.host.refused == 1 and [d.event_type for d in dead] == ["RolloutTraceRecorded"]
    bills = [e for e in reader.iter_events(["runwatch.tenant-usage"]) if isinstance(e, EventBase)]
    assert len(bills) == 5 and {b.tenant_id for b in bills} == {"tenant-a"}
    view = rebuild_from_log(tmp_path / "log").host.view.views["exp-1"]  # type: ignore[union-attr]
    assert view.tenant_id == "tenant-a"
