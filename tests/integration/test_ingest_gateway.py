"""A customer's hook behind the ingest gateway (``runwatch serve ingest``, a real server
process over a real embedded log): it publishes its run and follows its commands with a
tenant key and no broker access; what names another tenant, or is not a hook's to
publish, is dead-lettered and never reaches a run; and the gateway killed (-9) mid-run
and started again loses nothing (the hook spools meanwhile).

Found by review: hooks run inside the customer's process and wrote straight to the shared
topics, so a customer could write any tenant's events (bill another tenant, fire alerts,
command runs) and read every tenant's commands and lifecycle (docs/threat-model.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from events import AlertFired, RunStarted
from events.codec import encode
from events.dead_letter import DeadLetter
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from producers.commands import issue, write_command
from producers.hooks import RunwatchHook
from producers.sinks import KafkaSink
from tests.event_samples import sample
from tests.integration.hooks_support import embedded_events, kafka_events

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
A, B = "key-of-tenant-a", "key-of-tenant-b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """``runwatch serve ingest`` as a process of its own."""

    def __init__(self, tmp: Path, kafka: str | None = None, *extra: str) -> None:
        self.log_dir, self.keys, self.port = tmp / "log", tmp / "keys.yaml", _free_port()
        self.where = ["--kafka", kafka] if kafka else ["--log", str(self.log_dir)]
        self.where += list(extra)
        self.keys.write_text(
            yaml.safe_dump(
                {"keys": [{"key": A, "tenant": "tenant-a"}, {"key": B, "tenant": "tenant-b"}]}
            )
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "runwatch.cli.main", "serve", "ingest", *self.where,
                "--keys", str(self.keys), "--port", str(self.port),
            ],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"{self.url}/v1/ingest/whoami", headers={"X-API-Key": A})
                if r.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, self.proc.communicate()[1]
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def gateway(tmp_path: Path):  # type: ignore[no-untyped-def]
    gw = Gateway(tmp_path)
    gw.start()
    yield gw
    gw.stop()


def _hook(gw: Gateway, tmp: Path, run: str, tenant: str, key: str) -> RunwatchHook:
    return RunwatchHook(
        run, tenant, gateway=gw.url, api_key=key, spool=tmp / f"spool-{run}-{tenant}",
        install_exit_hooks=False, command_poll_s=0.05, retry_s=0.2, gpus=1,
    )  # fmt: skip


def _wait(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, f"{what} was not followed through the gateway"
        time.sleep(0.05)


def _letters(log_dir: Path) -> list[DeadLetter]:
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    if DEAD_LETTER_TOPIC not in log.topic_names():
        return []
    return [DeadLetter.model_validate_json(r.value) for r in log.read_sync(DEAD_LETTER_TOPIC, 0)]


def test_a_hook_publishes_and_obeys_through_the_gateway_and_forgeries_go_nowhere(
    gateway: Gateway, tmp_path: Path
) -> None:
    hook = _hook(gateway, tmp_path, "gw-run", "tenant-a", A)
    hook.start({"lr": 1e-3})
    steps: list[int] = []

    def train() -> None:  # a training loop: a step, then the run's commands at its end
        step = 0
        while step < 2000:
            step += 1
            hook.log({"reward": 0.001 * step, "kl": 0.01}, step=step)
            hook.step_done(step, wall_s=0.02)
            steps.append(step)
            if hook.obey(step):
                return
            time.sleep(0.02)

    def kinds() -> list[str]:
        return [e.type for e in embedded_events(gateway.log_dir, "tenant-a:gw-run")]

    loop = threading.Thread(target=train)
    loop.start()
    _wait(lambda: len(steps) >= 3 and "TrainerStepCompleted" in kinds(), "the first steps")
    # the controller pauses the run; the loop blocks at a step's end until a resume
    issue(gateway.log_dir, "tenant-a:gw-run", "pause", actor="controller",
          principal="run_controller", reason="kl_blowup (page)")  # fmt: skip
    _wait(lambda: "RunPaused" in kinds(), "the pause")
    held = len(steps)
    time.sleep(1.0)
    assert len(steps) == held and loop.is_alive()  # paused: no step
    issue(gateway.log_dir, "tenant-a:gw-run", "resume", actor="customer", principal="tenant-a")
    _wait(lambda: len(steps) >= held + 3, "the resume")
    issue(gateway.log_dir, "tenant-a:gw-run", "cancel", actor="customer", principal="tenant-a")
    loop.join(60)
    assert not loop.is_alive() and steps[-1] < 2000, "the cancel was not followed"
    hook.close(30)

    events = embedded_events(gateway.log_dir, "tenant-a:gw-run")
    seen = [e.type for e in events]
    assert {"RunSubmitted", "RunStarted", "TrainerStepCompleted", "UsageRecorded"} <= set(seen)
    assert [k for k in seen if k in ("RunPaused", "RunResumed", "RunCancelled")] == [
        "RunPaused", "RunResumed", "RunCancelled"
    ]  # fmt: skip
    assert {e.tenant_id for e in events} == {"tenant-a"}

    # tenant a's key naming tenant b: every event dead-lettered, nothing of b's on the log
    forger = _hook(gateway, tmp_path, "victim-run", "tenant-b", A)
    forger.start()
    forger.log({"reward": 0.0}, step=1)
    forger.close(30)
    assert [e for e in embedded_events(gateway.log_dir, "tenant-b:victim-run")] == []
    letters = _letters(gateway.log_dir)
    assert letters and {d.kind for d in letters} == {"foreign_tenant"}
    # an alert from a hook (to page and pause someone): refused, even under its own tenant
    alert = sample(AlertFired, run_id="tenant-a:gw-run").model_copy(update={"producer": "hook/x"})
    r = httpx.post(
        f"{gateway.url}/v1/ingest/runwatch.alerts",
        json={"records": [{"key": "tenant-a:gw-run", "value": encode(alert).decode()}]},
        headers={"Authorization": f"Bearer {A}"},
    )
    assert r.status_code == 200 and r.json()["refused"][0]["kind"] == "refused_at_ingest"
    assert "AlertFired" not in [e.type for e in embedded_events(gateway.log_dir, "tenant-a:gw-run")]
    # tenant b reads none of tenant a's commands or lifecycle facts
    for topic in ("runwatch.control", "runwatch.lifecycle"):
        page = httpx.get(
            f"{gateway.url}/v1/ingest/{topic}/partitions/0/records",
            headers={"Authorization": f"Bearer {B}"},
        ).json()
        assert page["records"] == [] and page["at_end"] is True


def test_the_gateway_killed_mid_run_loses_nothing(gateway: Gateway, tmp_path: Path) -> None:
    hook = _hook(gateway, tmp_path, "gw-chaos", "tenant-a", A)
    hook.start()
    sent = 0
    for step in range(1, 61):
        if step == 20:
            gateway.kill()
        if step == 40:
            gateway.start()
        hook.log({"reward": 0.01 * step}, step=step)
        sent += 1
        time.sleep(0.01)
    stats = hook.close(60)
    assert stats.outages >= 1 and stats.spooled > 0 and stats.left_in_spool == 0, stats
    events = embedded_events(gateway.log_dir, "tenant-a:gw-chaos")
    unique = {e.event_id: e for e in events}
    seqs = sorted(e.seq for e in unique.values())
    assert seqs == list(range(len(seqs))), "a gap: an event was lost"
    steps = sorted(e.step for e in unique.values() if e.type == "TrainerStepCompleted")
    assert steps == list(range(1, sent + 1))
    print(
        f"\ngateway killed at step 20, back at 40: {sent} rows logged, {len(unique)} events "
        f"stored, {len(events) - len(unique)} duplicates, 0 lost; {stats.spooled} spooled, "
        f"{stats.shipped_from_spool} shipped from the spool"
    )


def test_a_hook_behind_a_gateway_on_kafka_is_paused_and_cancelled(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The same gateway over the real broker: the hook's events land on Kafka under its
    tenant, and it follows a pause and a cancel written to the broker's control topic."""
    run = f"tenant-a:gw-kafka-{time.time_ns()}"
    gw = Gateway(tmp_path, kafka=kafka_bootstrap)
    gw.start()
    hook = _hook(gw, tmp_path, run, "tenant-a", A)
    steps: list[int] = []

    def train() -> None:
        for step in range(1, 2000):
            hook.log({"reward": 0.001 * step}, step=step)
            steps.append(step)
            if hook.obey(step):
                return
            time.sleep(0.02)

    commands = KafkaSink(kafka_bootstrap, timeout_s=30)
    try:
        hook.start()
        loop = threading.Thread(target=train)
        loop.start()
        deadline = time.monotonic() + 60
        while len(steps) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for action in ("pause", "cancel"):
            write_command(commands, run_id=run, tenant_id="tenant-a", action=action,
                          phase="running" if action == "pause" else "paused",
                          actor="customer", principal="tenant-a")  # fmt: skip
            if action == "pause":
                while "RunPaused" not in [e.type for e in kafka_events(kafka_bootstrap, run)]:
                    assert time.monotonic() < deadline + 60, "no RunPaused on Kafka"
                    time.sleep(0.2)
        loop.join(60)
        assert not loop.is_alive(), "the cancel was not followed"
        hook.close(30)
    finally:
        commands.close()
        gw.stop()
    events = kafka_events(kafka_bootstrap, run)
    lifecycle = [e.type for e in events if e.type.startswith("Run")]
    assert lifecycle[-2:] == ["RunPaused", "RunCancelled"], lifecycle
    assert {e.tenant_id for e in events} == {"tenant-a"}
    assert len([e for e in events if e.type == "TrainerStepCompleted"]) == len(steps)


def test_an_event_the_gateway_can_never_take_does_not_block_the_rest(
    gateway: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: one event over the gateway's body cap was answered 413, taken for
    an outage, spooled and re-sent forever, and every event after it (and the next
    process's, shipping the same spool) stayed stuck behind it."""
    hook = _hook(gateway, tmp_path, "gw-poison", "tenant-a", A)
    hook.start({"data_files": [f"/data/shard-{i:06d}.parquet" for i in range(200_000)]})
    for step in range(1, 51):
        row = {"reward": 0.01 * step}
        if step == 10:
            row["note"] = "x" * (600 << 10)  # one row over the 512 KiB a hook may publish
        hook.log(row, step=step)
    stats = hook.close(60)
    assert stats.left_in_spool == 0 and stats.spooled == 0, stats
    events = embedded_events(gateway.log_dir, "tenant-a:gw-poison")
    steps = sorted(e.step for e in events if e.type == "TrainerStepCompleted")
    assert steps == [s for s in range(1, 51) if s != 10]  # all but the one it cannot take
    (submitted,) = [e for e in events if e.type == "RunSubmitted"]
    files = dict(submitted.config)["data_files"]
    assert len(files) < 2_100 and files.endswith("characters, cut)")  # the config is cut
    assert any("not sent to the gateway" in r.getMessage() for r in caplog.records)


def test_a_hook_follows_its_commands_across_a_gateway_restart_and_sees_no_offsets(
    gateway: Gateway, tmp_path: Path
) -> None:
    """The gateway shows no offsets (they told a tenant how many lifecycle and control
    records the other tenants wrote): a hook's reader numbers what it is shown, 0, 1, 2...
    whatever the others write between, and goes on with the gateway's sealed cursor. The
    gateway killed (-9) and started again seals with a new secret: the old cursor is
    refused, the reader scans from the start, and the hook still follows its run's next
    commands, each once."""
    import asyncio

    from producers.hooks.gateway import GatewayLog

    for i in range(30):  # another tenant's runs, paused: records the reader must not count
        issue(gateway.log_dir, f"b-{i}", "pause", actor="customer", principal="tenant-b",
              tenant_id="tenant-b")  # fmt: skip
    hook = _hook(gateway, tmp_path, "gw-restart", "tenant-a", A)
    hook.start()
    steps: list[int] = []

    def train() -> None:
        for step in range(1, 3000):
            hook.log({"reward": 0.001 * step}, step=step)
            steps.append(step)
            if hook.obey(step):
                return
            time.sleep(0.02)

    def kinds() -> list[str]:
        return [e.type for e in embedded_events(gateway.log_dir, "tenant-a:gw-restart")]

    loop = threading.Thread(target=train)
    loop.start()
    _wait(lambda: len(steps) >= 3 and "TrainerStepCompleted" in kinds(), "the first steps")
    issue(gateway.log_dir, "tenant-a:gw-restart", "pause", actor="customer", principal="tenant-a")
    _wait(lambda: "RunPaused" in kinds(), "the pause")
    gateway.kill()
    for i in range(30, 60):  # written while the gateway is away
        issue(gateway.log_dir, f"b-{i}", "pause", actor="customer", principal="tenant-b",
              tenant_id="tenant-b")  # fmt: skip
    gateway.start()  # a new secret: the hook's cursor no longer opens
    issue(gateway.log_dir, "tenant-a:gw-restart", "resume", actor="customer", principal="tenant-a")
    held = len(steps)
    _wait(lambda: len(steps) >= held + 3, "the resume after the restart")
    issue(gateway.log_dir, "tenant-a:gw-restart", "cancel", actor="customer", principal="tenant-a")
    loop.join(60)
    assert not loop.is_alive(), "the cancel after the restart was not followed"
    hook.close(30)
    lifecycle = [k for k in kinds() if k in ("RunPaused", "RunResumed", "RunCancelled")]
    assert lifecycle == ["RunPaused", "RunResumed", "RunCancelled"], lifecycle

    async def numbers() -> list[int]:  # what a reader of tenant a's control records sees
        reader = GatewayLog(gateway.url, A)
        await reader.start()
        try:
            return [r.offset async for r in reader.read("runwatch.control", 0, 0)]
        finally:
            await reader.close()

    assert asyncio.run(numbers()) == [0, 1, 2]  # pause, resume, cancel: no gaps for b's 60


def test_two_customers_runs_named_alike_are_two_runs_each_monitored_and_billed(
    gateway: Gateway, tmp_path: Path
) -> None:
    """Found by review: a run id is its first tenant's in every host, and behind the
    gateway a hook could name any run id, so two customers' ``exp-1`` were one run: the
    second customer's every event was refused by the processors (its run unmonitored,
    unbilled, never paused), and a tenant who guessed another's next run name could take
    it first. Behind the gateway a run is ``<tenant>:<name>``: both runs are folded, each
    billed to its own tenant, none of them dead-lettered; a hook naming another tenant's
    prefix is refused at the gateway."""
    for tenant, key in (("tenant-a", A), ("tenant-b", B)):
        hook = _hook(gateway, tmp_path, "exp-1", tenant, key)
        assert hook.run_id == f"{tenant}:exp-1"
        hook.start()
        for step in range(1, 21):
            hook.log({"reward": 0.01 * step, "kl": 0.01}, step=step)
            hook.step_done(step, wall_s=0.5)
        hook.finish()
        assert hook.close(30).left_in_spool == 0
    squatter = _hook(gateway, tmp_path, "tenant-b:exp-2", "tenant-a", A)  # b's next name
    assert squatter.run_id == "tenant-a:tenant-b:exp-2"  # its own prefix: not b's run
    started = sample(RunStarted, run_id="tenant-b:exp-2").model_copy(
        update={"tenant_id": "tenant-a", "producer": "hook/x"}
    )
    r = httpx.post(
        f"{gateway.url}/v1/ingest/runwatch.lifecycle",
        json={"records": [{"key": "tenant-b:exp-2", "value": encode(started).decode()}]},
        headers={"Authorization": f"Bearer {A}"},
    )
    assert r.status_code == 200 and r.json()["appended"] == []
    assert "tenant-a:<name>" in r.json()["refused"][0]["reason"]

    done = subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(gateway.log_dir),
         "--once", "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [d for d in _letters(gateway.log_dir) if d.kind == "foreign_tenant"] == []
    log = EmbeddedLog(gateway.log_dir, readonly=True)
    log.open_sync()
    bills = {(b.tenant_id, b.run_id) for b in log.iter_events(["runwatch.tenant-usage"])}
    assert {("tenant-a", "tenant-a:exp-1"), ("tenant-b", "tenant-b:exp-1")} <= bills, bills


class _RoundRobin(httpx.AsyncBaseTransport):
    """A load balancer in front of gateway replicas: each request to the next one."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.sent, self.inner = ports, 0, httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(port=self.ports[self.sent % len(self.ports)])
        self.sent += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_gateway_replicas_without_one_cursor_secret_fail_the_read_clearly(tmp_path: Path) -> None:
    """Found by review: each replica seals cursors with a fresh secret unless given one, and
    behind a round-robin balancer every second page was refused (410); the hook's client
    went back to the start each time, for ever, and never read its commands. Now a second
    refusal in one read is an error saying what to fix; with one secret file it reads."""
    import asyncio
    import uuid

    from events.catalog.lifecycle import RunStarted
    from producers.hooks.gateway import GatewayLog

    writer = EmbeddedLog(tmp_path / "log")
    writer.open_sync()
    others = [  # more than one page of another tenant's records (a page scans 5,000)
        RunStarted(
            event_id=uuid.uuid4(),
            tenant_id="tenant-b",
            run_id=f"tenant-b:r{i}",
            step=None,
            ts=1.0,
            producer="trainer/x",
            seq=i,
        )
        for i in range(7_000)
    ]
    mine = RunStarted(event_id=uuid.uuid4(), tenant_id="tenant-a", run_id="tenant-a:r",
                      step=None, ts=2.0, producer="trainer/x", seq=0)  # fmt: skip
    writer.append_events_sync([*others, mine])
    (tmp_path / "secret").write_bytes(b"0123456789abcdef0123456789abcdef\n")

    async def read(ports: list[int]) -> list[int]:
        reader = GatewayLog(f"http://127.0.0.1:{ports[0]}", A, transport=_RoundRobin(ports))
        await reader.start()
        try:
            return [r.offset async for r in reader.read("runwatch.lifecycle", 0, 0)]
        finally:
            await reader.close()

    for shared in (False, True):
        extra = ("--cursor-secret-file", str(tmp_path / "secret")) if shared else ()
        replicas = [Gateway(tmp_path, None, *extra) for _ in range(2)]
        try:
            for gw in replicas:
                gw.start()
            ports = [gw.port for gw in replicas]
            if shared:
                assert asyncio.run(read(ports)) == [0]  # tenant a's one record, numbered 0
            else:
                with pytest.raises(ConnectionError, match="share one --cursor-secret-file"):
                    asyncio.run(read(ports))
        finally:
            for gw in replicas:
                gw.stop()


def test_a_restart_with_the_gateway_away_does_not_wait_for_it(tmp_path: Path) -> None:
    """Found by review: a restarted hook waits up to 30 s for its first read of the run's
    commands, and with the gateway unreachable it waited all of it (the reader's next try
    is 30 s later): 30 s lost on every requeue while runwatch is down. Now the first
    failed try ends the wait, and the first look says it once."""
    hook = RunwatchHook(
        "exp-1", "tenant-a", gateway=f"http://127.0.0.1:{_free_port()}", api_key=A,
        spool=tmp_path / "spool", install_exit_hooks=False, command_poll_s=0.05, retry_s=0.2,
    )  # fmt: skip
    t0 = time.monotonic()
    hook.start(resumed_from="out/checkpoint-10", resumed_step=10)
    waited = time.monotonic() - t0
    assert waited < 10.0, f"the restart waited {waited:.1f} s for an unreachable gateway"
    assert hook.obey(10) is False  # trains on, and says why
    hook.close(1)


def test_a_tenants_oversized_integers_are_dead_lettered_and_stop_no_ones_processors(
    gateway: Gateway, tmp_path: Path
) -> None:
    """Found by review: one record of a tenant's own run with ``step = 2**70`` (or an
    integer payload field that large) stopped the shared processors on every start (their
    state codec cannot persist it) and, at 2**63, the query API's projection (SQLite):
    no gate of any tenant fired. Every integer of an event is bounded (``MAX_INT``,
    2**53 - 1): such a record is dead-lettered with the reason, and the processors go on
    with everyone's runs."""
    good = _hook(gateway, tmp_path, "exp", "tenant-b", B)
    good.start({"lr": 1e-5})
    for step in range(1, 6):
        good.log({"reward": 0.1 * step, "kl": 0.01}, step=step)
        good.step_done(step, wall_s=1.0)
    assert good.close(30).left_in_spool == 0

    def record(typ: str, step: int, **payload: object) -> dict[str, str]:
        ev = {
            "event_id": str(uuid.uuid4()), "type": typ, "schema_version": 1,
            "tenant_id": "tenant-a", "run_id": "tenant-a:exp", "step": step,
            "ts": time.time(), "producer": "hook/tenant-a:exp/x", "seq": 9, **payload,
        }  # fmt: skip
        return {"key": "tenant-a:exp", "value": json.dumps(ev)}

    big = [
        ("runwatch.telemetry", record("TrainerStepCompleted", 2**70, reward_mean=0.5)),
        ("runwatch.telemetry", record("TrainerStepCompleted", 2**63, reward_mean=0.5)),
        ("runwatch.telemetry", record("TrainerStepCompleted", 7, tokens_trained=-(2**64))),
    ]
    for topic, rec in big:
        r = httpx.post(
            f"{gateway.url}/v1/ingest/{topic}",
            json={"records": [rec]},
            headers={"X-API-Key": A},
            timeout=30,
        )
        assert r.status_code < 500, r.text
    _wait(lambda: len(_letters(gateway.log_dir)) >= len(big), "the dead letters")
    letters = _letters(gateway.log_dir)
    assert all("less than or equal" in d.reason or "greater than" in d.reason for d in letters)
    events = embedded_events(gateway.log_dir, "tenant-a:exp")
    assert not [e for e in events if e.type == "TrainerStepCompleted"]

    done = subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(gateway.log_dir),
         "--once", "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    b_runs = embedded_events(gateway.log_dir, "tenant-b:exp")
    assert [e.step for e in b_runs if e.type == "TrainerStepCompleted"] == [1, 2, 3, 4, 5]


def test_many_hooked_runs_of_one_tenant_read_their_commands_without_starving() -> None:
    """Found by review (``/tmp/review-gates/f5_gateway_read_starvation.py``): each hook's
    command poll made 1 + 2 x partitions requests against its tenant's read rate, so 40
    hooked runs on a 3-partition control topic had 67 % of their polls refused and
    commands unread up to 56 s (the unmonitored guard then held the runs). A hook now asks
    only its run's partition and reads it with one scan: every poll served. The real
    ingest app and client (``benchmarks/gateway_command_reads.py`` measures both)."""
    import asyncio

    from benchmarks.gateway_command_reads import BeforeGatewayLog, follow
    from producers.hooks.gateway import GatewayLog

    now = asyncio.run(follow(GatewayLog, hooks=40, parts=3, seconds=6.0))
    assert now["refused_pct"] == 0.0 and now["longest_unread_s"] < 2.0, now
    assert now["requests_per_poll"] < 1.3, now  # (the first poll also asks the partition)
    before = asyncio.run(follow(BeforeGatewayLog, hooks=40, parts=3, seconds=6.0))
    assert before["refused_pct"] > 10.0, before  # the anchor still starves
