"""The plane on a real Kafka broker: what ``runwatch demo --kafka`` runs.

- Trainers write to their local spool (an embedded log) as always; the shipper
  (:mod:`producers.shipper`) forwards every record to Kafka with acks=all.
- The stream processors run as a real faust-streaming worker process
  (``runwatch process --kafka``), reading and writing Kafka topics.
- The stream processors include tenant accounting: its bills (``TenantUsageUpdated``)
  are the faust worker's, on Kafka's ``runwatch.tenant-usage``.
- The projections follow Kafka (:func:`runwatch.hosting.follow.follow`) into an in-memory
  read model and publish their derived events (run states) back to Kafka.
- The run controller's commands (``PauseRequested`` on Kafka's ``runwatch.control``) come
  back to the spool, where the trainers follow their control topic (the way back of the
  shipper; the demo's customer commands are written to the spool directly and are not
  shipped, so Kafka's control topic holds the controller's requests only).

Everything runs on one asyncio loop on a background thread; :meth:`KafkaPlane.tick`
hands the events derived since the last call to the caller's thread.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from events.codec import decode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.log.kafka import KafkaLog
from events.topics import TOPICS
from producers.shipper import ship_once
from projections.views import RunView
from runwatch.hosting.follow import follow
from runwatch.hosting.read_model import read_model_host

#: The shipper looks at the spool this often when it found nothing new (what it finds
#: it ships at once and looks again): part of every alert's way there and of every
#: controller command's way back, so it is kept short; an idle look is a positions
#: file read and a stat per topic.
SHIP_EVERY_S = 0.02

#: How long the plane waits for its faust worker to join its group (a cold start on a
#: loaded 2-core box took 10-40 s: interpreter and faust imports, then the join).
WORKER_START_S = 180.0

#: The projections hold a run's terminal event until the processors have caught up; the
#: plane releases it itself at the end (see :meth:`KafkaPlane._settle`).
HOLD_UNTIL_SETTLED = 3600.0

SHIPPED_TOPICS = (
    "runwatch.lifecycle",
    "runwatch.telemetry",
    "runwatch.rewards",
    "runwatch.checkpoints",
    "runwatch.traces",
)


class KafkaPlane:
    def __init__(self, log_dir: Path, bootstrap: str, out: Path, control: bool = True) -> None:
        self.control = control
        self.spool = EmbeddedLog(log_dir)
        self.spool.open_sync()
        self.bootstrap = bootstrap
        self.out = out
        self.demo_id = uuid.uuid4().hex[:8]
        self.app_id = f"runwatch-demo-{self.demo_id}"
        self.engine = read_model_host()
        self.derived: list[EventBase] = []
        self.records = 0
        self._inbox: queue.Queue[EventBase] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._errors: list[BaseException] = []
        self._last_activity = time.monotonic()
        self._worker = self._start_worker()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kafka-plane")
        self._thread.start()
        if not self._ready.wait(60) or self._errors:
            self.close()
            why = repr(self._errors[0]) if self._errors else "timed out"
            raise RuntimeError(f"could not start the plane on Kafka at {bootstrap}: {why}")
        self._wait_for_worker(WORKER_START_S)

    def _wait_for_worker(self, timeout_s: float) -> None:
        """Return once the faust worker's consumer group is stable with a member (it holds
        its partitions): the plane is up before the runs start, as in a deployment, so a
        fault in a run's first steps is not judged while the worker is still starting
        (its start takes seconds: imports, faust's start-up, the group join)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._worker.poll() is not None:
                self.close()
                raise RuntimeError(
                    f"the faust worker exited ({self._worker.returncode}) before it was up; "
                    f"see {self.out / 'process-logs' / 'faust-worker.err'}"
                )
            ready = asyncio.run_coroutine_threadsafe(self._worker_joined(), self._loop)
            try:
                joined = ready.result(max(1.0, deadline - time.monotonic()))
            except Exception as exc:  # the broker did not answer: the plane is not up
                ready.cancel()
                self.close()
                raise RuntimeError(
                    f"could not ask the broker whether the faust worker joined: {exc!r}"
                ) from exc
            if joined:
                return
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the faust worker did not join its group within {timeout_s:.0f} s")

    # -- the faust worker process ---------------------------------------------------------

    def _start_worker(self) -> subprocess.Popen[bytes]:
        logs = self.out / "process-logs"
        logs.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "runwatch.cli.main", "process", "--kafka",
                self.bootstrap, "--app-id", self.app_id]  # fmt: skip
        if not self.control:
            argv.append("--no-control")
        with (
            open(logs / "faust-worker.out", "ab") as out,
            open(logs / "faust-worker.err", "ab") as err,
        ):
            return subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True)

    # -- the loop thread -------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to the caller's thread
            self._errors.append(exc)
            self._ready.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        kafka = KafkaLog(self.bootstrap, client_id=f"runwatch-demo-{self.demo_id}")
        await kafka.start()
        self._ready.set()
        try:
            await asyncio.gather(
                self._ship(kafka),
                self._watch_alerts(kafka),
                self._return_commands(kafka),
                follow(
                    kafka, self.engine, self._stop,
                    group_id=f"runwatch-demo-projections-{self.demo_id}",
                    publish_to=kafka, settle_s=HOLD_UNTIL_SETTLED, on_batch=self._on_projected,
                ),
            )  # fmt: skip
        finally:
            await kafka.close()

    async def _ship(self, kafka: KafkaLog) -> None:
        assert self._stop is not None
        while not self._stop.is_set():
            n = await ship_once(self.spool, kafka, SHIPPED_TOPICS)
            if n:
                self.records += n
                self._last_activity = time.monotonic()
            await asyncio.sleep(0 if n else SHIP_EVERY_S)

    async def _watch_alerts(self, kafka: KafkaLog) -> None:
        assert self._stop is not None
        consumer = await kafka.consumer(f"runwatch-demo-alerts-{self.demo_id}",
                                        ["runwatch.alerts"])  # fmt: skip
        try:
            while not self._stop.is_set():
                for rec in await consumer.poll(500, timeout_s=0.3):
                    ev = decode(rec.value)
                    if isinstance(ev, EventBase) and ev.run_id in self._runs:
                        self._inbox.put(ev)
                        self._last_activity = time.monotonic()
        finally:
            await consumer.close()

    async def _return_commands(self, kafka: KafkaLog) -> None:
        """Copy the controller's commands for this demo's runs into the spool."""
        from events.catalog.control import CONTROL_TOPIC, PauseRequested

        assert self._stop is not None
        consumer = await kafka.consumer(f"runwatch-demo-control-{self.demo_id}", [CONTROL_TOPIC])
        try:
            while not self._stop.is_set():
                for rec in await consumer.poll(500, timeout_s=0.2):
                    ev = decode(rec.value)
                    if isinstance(ev, PauseRequested) and ev.run_id in self._runs:
                        self.spool.append_sync(CONTROL_TOPIC, rec.key, rec.value)
                        self._last_activity = time.monotonic()
                await consumer.commit()
        finally:
            await consumer.close()

    def _on_projected(self, n_records: int, derived: list[EventBase]) -> None:
        for ev in derived:
            self._inbox.put(ev)
        if derived:
            self._last_activity = time.monotonic()

    # -- the caller's side -------------------------------------------------------------------

    _runs: frozenset[str] = frozenset()

    def watch_runs(self, run_ids: list[str]) -> None:
        """Show alerts of these runs only (a shared broker may hold other runs)."""
        self._runs = frozenset(run_ids)

    def tick(self, final: bool = False) -> list[EventBase]:
        if self._errors:
            raise RuntimeError(f"Kafka plane failed: {self._errors[0]!r}")
        if final:
            self._settle()
        out: list[EventBase] = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        self.derived.extend(out)
        return out

    def _settle(self, quiet_s: float = 5.0, timeout_s: float = 240.0) -> None:
        """The end of the demo: wait until the faust worker has committed past the end of
        every telemetry partition (it has folded everything the trainers wrote) and
        nothing new happened for ``quiet_s``; then stop the loop, release the runs'
        terminal events the projections held back, and publish what that derived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._errors:
            caught_up = asyncio.run_coroutine_threadsafe(
                self._worker_caught_up(), self._loop
            ).result(30)
            if caught_up and time.monotonic() - self._last_activity >= quiet_s:
                break
            time.sleep(1.0)
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self.close()
        released = self.engine.release_held(force=True)
        self.engine.checkpoint()
        if released:
            asyncio.run(self._publish(released))
        for ev in released:
            self._inbox.put(ev)

    async def _publish(self, events: list[EventBase]) -> None:
        from runwatch.hosting.follow import publish

        async with KafkaLog(self.bootstrap, create_registry_topics=False) as kafka:
            await publish(kafka, events)

    async def _worker_joined(self) -> bool:
        """Is the faust worker's consumer group (its app id) stable with a member?"""
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            await admin.start()
            for response in await admin.describe_consumer_groups([self.app_id]):
                for group in response.groups:  # (error, id, state, protocol type, ..., members)
                    if group[1] == self.app_id:
                        return bool(group[0] == 0 and group[2] == "Stable" and group[5])
            return False
        except Exception:  # the coordinator is still being elected: not yet
            return False
        finally:
            await admin.close()

    async def _worker_caught_up(self) -> bool:
        """Has the faust worker (consumer group = its app id) committed every telemetry
        record the shipper put on the broker?"""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.app_id,
            enable_auto_commit=False,
        )
        await consumer.start()  # never subscribes: it does not join the worker's group
        try:
            # the topic was created from the registry, with the registry's partition count
            n = TOPICS["runwatch.telemetry"].partitions
            tps = [TopicPartition("runwatch.telemetry", p) for p in range(n)]
            ends = await consumer.end_offsets(tps)
            lag = {tp.partition: ends[tp] - ((await consumer.committed(tp)) or 0) for tp in tps}
            if os.environ.get("RUNWATCH_DEBUG"):
                print(f"faust worker lag per telemetry partition: {lag}", file=sys.stderr)
            return bool(tps) and all(v <= 0 for v in lag.values())
        finally:
            await consumer.stop()

    def close(self) -> None:
        if self._worker.poll() is None:
            os.killpg(self._worker.pid, signal.SIGTERM)
            try:
                self._worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self._worker.pid, signal.SIGKILL)
                self._worker.wait()

    @property
    def views(self) -> dict[str, RunView]:
        return self.engine.view.views  # type: ignore[union-attr,no-any-return]

    def stats(self) -> dict[str, Any]:
        return {"shipped": self.records, "demo_id": self.demo_id}
