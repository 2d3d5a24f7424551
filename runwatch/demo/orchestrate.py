"""Run the demo's trainers as real processes publishing to one log.

Each scenario is a ``runwatch train`` process; at most ``parallel`` run at once (the box
has 2 cores). Kill scenarios watch the log for the run's recorded steps, SIGKILL the
trainer past ``kill_after_step`` (a preemption: no clean shutdown, no final checkpoint),
optionally damage the newest checkpoint the way a buggy writer would (optimizer moments
dropped, digests still valid), and then ``runwatch resume`` it through the resume gate.

Assumption: trainers write to the embedded log (the default) or to Kafka via
``--kafka``; either way this module only starts, watches and kills processes. With
``warm`` (the default) the processes are forked from a warm launcher that imported the
trainer stack once (:mod:`runwatch.demo.launcher`); otherwise each is a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runwatch.demo.scenarios import CONFIGS, Scenario

Say = Callable[[str], None]


@dataclass
class RunOutcome:
    scenario: Scenario
    exit_code: int | None = None
    killed_at_step: int | None = None
    resume: dict[str, Any] | None = None
    wall_s: float = 0.0
    stderr_tail: str = ""
    notes: list[str] = field(default_factory=list)
    #: (step, reason) of each pause the trainer confirmed, and what the tenant did
    pauses: list[tuple[int, str]] = field(default_factory=list)
    tenant_actions: list[str] = field(default_factory=list)


def _config_file(s: Scenario, out: Path) -> Path:
    """The scenario's config: the packaged base config with its overrides, as JSON."""
    from trainer.config import load_config

    cfg = load_config(CONFIGS / s.base_config, run_id=s.run_id, **s.overrides)
    cfg = cfg.with_overrides(tenant_id=s.tenant_id)
    path = out / "configs" / f"{s.run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cfg.model_dump_json(indent=2))
    return path


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "runwatch.cli.main", *args]


class Orchestrator:
    def __init__(
        self, out: Path, log: Path, say: Say, parallel: int = 2, warm: bool = True
    ) -> None:
        self.out = out
        self.log = log
        self.runs = out / "runs"
        self.say = say
        self.parallel = parallel
        self._lifecycle_at = 0  # next lifecycle offset to read for pauses
        self._reader: Any = None  # read-only view of the log (opened once)
        self._telemetry: Any = None  # the same, for the runs' recorded steps
        self._telemetry_at = 0  # next telemetry offset to read
        self._steps: dict[str, int] = {}  # run -> newest recorded step
        #: seconds between two looks at the runs (and calls of ``on_tick``)
        self.poll_s = 0.05
        self._launcher: Any = None
        if warm:
            from runwatch.demo.launcher import WarmLauncher

            self._launcher = WarmLauncher()

    def run_all(
        self, scenarios: list[Scenario], on_tick: Callable[[], None] | None = None
    ) -> list[RunOutcome]:
        """Run every scenario to its end; ``on_tick`` is called every ``poll_s`` (the
        demo runs the processors there while the trainers run)."""
        pending = list(scenarios)
        active: list[_Active] = []
        done: list[RunOutcome] = []
        try:
            while pending or active:
                while pending and len(active) < self.parallel:
                    active.append(self._start(pending.pop(0)))
                time.sleep(self.poll_s)
                if on_tick is not None:
                    on_tick()
                self._answer_pauses({a.scenario.run_id: a for a in active})
                for a in list(active):
                    if a.poll(self):
                        active.remove(a)
                        done.append(a.outcome)
        finally:
            # on Ctrl-C or an error: trainers run in their own sessions, stop them here
            for a in active:
                _kill_group(a.proc)
        order = {s.run_id: i for i, s in enumerate(scenarios)}
        return sorted(done, key=lambda o: order[o.scenario.run_id])

    def _answer_pauses(self, active: dict[str, _Active]) -> None:
        """The tenant's side: a run the plane paused is cancelled or resumed with its fix
        (``Scenario.on_pause``), through the same command path as the API and the CLI."""
        from events.catalog.lifecycle import RunPaused
        from events.codec import decode
        from producers.commands import issue

        if not (self.log / "runwatch.lifecycle").is_dir():
            return
        if self._reader is None:
            from events.log.embedded import EmbeddedLog

            self._reader = EmbeddedLog(self.log, readonly=True)
            self._reader.open_sync()
        for rec in self._reader.read_sync("runwatch.lifecycle", self._lifecycle_at):
            self._lifecycle_at = rec.offset + 1
            ev = decode(rec.value)
            a = active.get(getattr(ev, "run_id", ""))
            if not isinstance(ev, RunPaused) or a is None:
                continue
            s = a.scenario
            a.outcome.pauses.append((ev.step or 0, ev.reason))
            self.say(
                f"  paused {s.tenant_id:<7} {s.run_id:<28} at step {ev.step}: {ev.reason[:70]}"
            )
            if not s.on_pause:
                continue
            action = s.on_pause[min(len(a.outcome.pauses), len(s.on_pause)) - 1]
            fix = dict(s.fix) if action == "resume" else {}
            why = {"cancel": "not worth continuing", "resume": "looked at it: carry on"}[action]
            issued = issue(
                self.log, s.run_id, action, actor="customer", principal=s.tenant_id,
                reason="fixed the config" if fix else why, overrides=fix, tenant_id=s.tenant_id,
            )  # fmt: skip
            what = action + (f" with {fix}" if fix else "")
            if issued.refused:
                what += f" refused: {issued.refused}"
            a.outcome.tenant_actions.append(what)
            self.say(f"  {action:<6} {s.tenant_id:<7} {s.run_id:<28} by the tenant: {what}")

    def _start(self, s: Scenario) -> _Active:
        cfg = _config_file(s, self.out)
        self.say(f"  start  {s.tenant_id:<7} {s.run_id:<28} {s.title}")
        proc = self._spawn(
            _cli("train", "--config", str(cfg), "--log", str(self.log), "--runs",
                 str(self.runs), "--quiet", "--json"),
            s.run_id,
        )  # fmt: skip
        return _Active(s, proc, time.monotonic())

    def _spawn(self, argv: list[str], name: str) -> Any:
        logs = self.out / "process-logs"
        logs.mkdir(parents=True, exist_ok=True)
        if self._launcher is not None:  # argv[:3] is "python -m runwatch.cli.main"
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            return self._launcher.spawn(argv[3:], logs / f"{name}.out", logs / f"{name}.err", env)
        with open(logs / f"{name}.out", "ab") as out, open(logs / f"{name}.err", "ab") as err:
            return subprocess.Popen(  # the child keeps its own copies of the descriptors
                argv,
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )

    def recorded_step(self, run_id: str) -> int:
        """The newest step the run recorded on the log (0 when none).

        Incremental: the telemetry topic is read (read-only) from where the last look
        stopped. Reading every run event of the log at each look took long enough on a
        loaded box for a run to finish its last steps before the kill came."""
        from events.codec import decode

        if self._telemetry is None:
            if not (self.log / "runwatch.telemetry").is_dir():
                return 0
            from events.log.embedded import EmbeddedLog

            self._telemetry = EmbeddedLog(self.log, readonly=True)
            self._telemetry.open_sync()
        for rec in self._telemetry.read_sync("runwatch.telemetry", self._telemetry_at):
            self._telemetry_at = rec.offset + 1
            if b'"TrainerStepCompleted"' not in rec.value:
                continue
            ev = decode(rec.value)
            if ev.type == "TrainerStepCompleted" and ev.step is not None:
                self._steps[ev.run_id] = max(self._steps.get(ev.run_id, 0), ev.step)
        return self._steps.get(run_id, 0)

    def damage_newest_checkpoint(self, run_id: str) -> str | None:
        """Drop the optimizer moments from the newest checkpoint, keeping digests valid:
        only the resume gate's replay can tell."""
        from trainer import checkpoint as ckpt

        checkpoints = ckpt.list_checkpoints(self.runs / run_id / "checkpoints")
        if not checkpoints:
            return None
        newest = checkpoints[0]  # newest step first

        def drop_moments(parts: dict[str, Any]) -> dict[str, Any]:
            parts["optimizer"]["state"] = {}
            return parts

        tmp = newest.with_name(newest.name + ".rewrite")
        ckpt.rewrite_checkpoint(newest, tmp, drop_moments)
        shutil.rmtree(newest)
        tmp.rename(newest)
        return newest.name

    def resume(self, s: Scenario) -> Any:
        self.say(f"  resume {s.tenant_id:<7} {s.run_id:<28} through the resume gate")
        return self._spawn(
            _cli("resume", "--run-id", s.run_id, "--log", str(self.log), "--quiet", "--json"),
            s.run_id + ".resume",
        )


@dataclass
class _Active:
    scenario: Scenario
    proc: Any  # subprocess.Popen, or a forked run (runwatch.demo.launcher.Launched)
    started: float
    phase: str = "train"
    outcome: RunOutcome = field(init=False)

    def __post_init__(self) -> None:
        self.outcome = RunOutcome(self.scenario)

    def poll(self, orch: Orchestrator) -> bool:
        """Advance this run; True once it is finished for good."""
        s = self.scenario
        if self.phase == "train" and s.kind != "train" and self.proc.poll() is None:
            step = orch.recorded_step(s.run_id)
            if s.kill_after_step is not None and step >= s.kill_after_step:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                self.outcome.killed_at_step = step
                orch.say(f"  kill   {s.tenant_id:<7} {s.run_id:<28} SIGKILL after step {step}")
                if s.kind == "kill_drop_optimizer_resume":
                    name = orch.damage_newest_checkpoint(s.run_id)
                    self.outcome.notes.append(f"optimizer moments dropped from {name}")
                    orch.say(f"  damage {s.tenant_id:<7} {s.run_id:<28} optimizer state of {name}")
                self.proc = orch.resume(s)
                self.phase = "resume"
            return False
        code = self.proc.poll()
        if code is None:
            return False
        self.outcome.exit_code = code
        self.outcome.wall_s = time.monotonic() - self.started
        name = s.run_id + (".resume" if self.phase == "resume" else "")
        err = orch.out / "process-logs" / f"{name}.err"
        self.outcome.stderr_tail = _tail(err)
        if self.phase == "resume":
            self.outcome.resume = _last_json(orch.out / "process-logs" / f"{name}.out")
        orch.say(
            f"  done   {s.tenant_id:<7} {s.run_id:<28} exit {code} in {self.outcome.wall_s:.0f}s"
        )
        return True


def _kill_group(proc: Any) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _last_json(path: Path) -> dict[str, Any] | None:
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
