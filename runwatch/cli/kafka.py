"""``runwatch kafka up|down|status``: a real local Kafka broker for users and scripts.

``up`` provisions in the order of :mod:`runwatch.broker.provision`
(``$KAFKA_BOOTSTRAP_SERVERS`` → testcontainers if a Docker daemon answers → the JVM
broker from Maven Central jars), leaves it running in the background and records it in
``~/.cache/runwatch/kafka-broker/state.json`` (``$RUNWATCH_KAFKA_HOME`` overrides the
directory) so that ``down`` and ``status`` find it.
The JVM broker keeps its data in ``~/.cache/runwatch/kafka-broker/data`` across
``down``/``up`` (``down --wipe`` deletes it) and comes back on the same port.

``status`` exits 0 when the recorded broker answers a metadata request, 3 when none runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from runwatch.broker import jvm
from runwatch.broker.provision import ENV_VAR, docker_available, start_jvm, start_testcontainer
from runwatch.cli.terminal import Abort, Terminal

HELP = "a real local Kafka broker: up, down, status"
DEFAULT_PORT = 9092
NOT_RUNNING = 3


def state_dir() -> Path:
    """``$RUNWATCH_KAFKA_HOME`` or ``~/.cache/runwatch/kafka-broker``: state and data."""
    home = os.environ.get("RUNWATCH_KAFKA_HOME")
    return Path(home) if home else jvm.cache_root() / "kafka-broker"


def state_path() -> Path:
    return state_dir() / "state.json"


def data_dir() -> Path:
    return state_dir() / "data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    up = sub.add_parser("up", help="start a broker in the background (or report the running one)")
    up.add_argument("--port", type=int, default=None, help="client port (default 9092 if free)")
    up.add_argument("--no-docker", action="store_true", help="skip the testcontainers path")
    up.add_argument("--fresh", action="store_true", help="delete the JVM broker's data first")
    up.add_argument("--json", action="store_true", help="print the state as JSON")
    down = sub.add_parser("down", help="stop the broker started by `up`")
    down.add_argument("--wipe", action="store_true", help="also delete the JVM broker's data")
    down.add_argument("--json", action="store_true", help="print what was stopped as JSON")
    status = sub.add_parser("status", help="is the broker up? (exit 3 when not)")
    status.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    return {"up": _up, "down": _down, "status": _status}[args.action](args, term)


# ------------------------------------------------------------------------- state file
def read_state() -> dict[str, Any] | None:
    try:
        return json.loads(state_path().read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise Abort(f"unreadable broker state file {state_path()}: {exc}") from None


def write_state(state: dict[str, Any]) -> None:
    state_dir().mkdir(parents=True, exist_ok=True)
    tmp = state_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_path())


def probe(bootstrap: str) -> int | None:
    """Brokers listed by a metadata request to the first bootstrap address, or None."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        return jvm.metadata_broker_count(host or "127.0.0.1", int(port), timeout_s=2.0)
    except (OSError, ValueError):
        return None


def _alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    if state.get("source") == "jvm" and (not pid or not jvm.pid_alive(int(pid))):
        return False
    return bool(probe(state["bootstrap"]))


# ------------------------------------------------------------------------- actions
def _up(args: argparse.Namespace, term: Terminal) -> int:
    env_bootstrap = os.environ.get(ENV_VAR, "").strip()
    if env_bootstrap:
        state = {"source": "env", "bootstrap": env_bootstrap, "started_by_runwatch": False}
        if not args.json:
            term.info(f"${ENV_VAR} is set: using the broker at {env_bootstrap}; nothing started")
        return _print_up(args, term, state, started=False)
    previous = read_state()
    if previous and _alive(previous):
        return _print_up(args, term, previous, started=False)
    with jvm.file_lock(state_dir() / ".up.lock"):
        if not args.no_docker and docker_available():
            os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # outlive this process
            term.progress("a Docker daemon answers: starting a testcontainers Kafka broker")
            handle = start_testcontainer()
            state = {
                "source": "testcontainers",
                "bootstrap": handle.bootstrap,
                "container_id": handle.container.get_wrapped_container().id,
                "detail": handle.detail,
            }
        else:
            if args.fresh:
                shutil.rmtree(data_dir(), ignore_errors=True)
            recorded = jvm.recorded_ports(data_dir())  # same address as last time
            port = args.port or (recorded[0] if recorded else _default_port())
            term.progress(f"starting Apache Kafka {jvm.KAFKA_VERSION} (KRaft, JVM) on port {port}")
            handle = start_jvm(
                data_dir(),
                port=port,
                controller_port=recorded[1] if recorded else None,
                die_with_parent=False,  # outlives this command
                log=term.progress,
            )
            assert handle.jvm is not None
            state = {
                "source": "jvm",
                "bootstrap": handle.bootstrap,
                "pid": handle.jvm.pid,
                "port": handle.jvm.port,
                "controller_port": handle.jvm.controller_port,
                "data_dir": str(handle.jvm.data_dir),
                "log": str(handle.jvm.log_path),
                "detail": handle.detail,
            }
        state.update(
            started_by_runwatch=True, version=jvm.KAFKA_VERSION, started_at=round(time.time(), 3)
        )
        write_state(state)
    return _print_up(args, term, state, started=True)


def _default_port() -> int:
    """9092 when nothing holds it, else a free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DEFAULT_PORT))
            return DEFAULT_PORT
        except OSError:
            return jvm.free_port()


def _print_up(
    args: argparse.Namespace, term: Terminal, state: dict[str, Any], started: bool
) -> int:
    if args.json:
        term.json({**state, "started": started, "running": True})
        return 0
    verb = "started" if started else "already running"
    if state["source"] != "env":
        term.info(f"Kafka broker ({state['source']}) {verb} at {state['bootstrap']}")
    term.info("use it from this shell with:")
    term.info(f"  export {ENV_VAR}={state['bootstrap']}")
    term.info("stop it with: runwatch kafka down")
    return 0


def _down(args: argparse.Namespace, term: Terminal) -> int:
    state = read_state()
    stopped = False
    say = term.progress if args.json else term.info  # --json: stdout holds only JSON
    if state is None:
        say("no broker started by `runwatch kafka up` is recorded")
    elif state.get("source") == "jvm":
        pid = int(state["pid"])
        stopped = jvm.pid_alive(pid) and jvm.stop_pid(pid)
        say(f"stopped JVM broker pid {pid}" if stopped else f"JVM broker pid {pid} was not running")
    elif state.get("source") == "testcontainers":
        try:
            import docker

            docker.from_env(timeout=10).containers.get(state["container_id"]).remove(force=True)
            stopped = True
            say(f"removed container {state['container_id'][:12]}")
        except Exception as exc:
            term.warn(f"could not remove container {state.get('container_id')}: {exc}")
    if state is not None:
        state_path().unlink(missing_ok=True)
    if args.wipe:
        shutil.rmtree(data_dir(), ignore_errors=True)
        say(f"deleted {data_dir()}")
    if args.json:
        term.json({"stopped": stopped, "state": state, "wiped": bool(args.wipe)})
    return 0


def _status(args: argparse.Namespace, term: Terminal) -> int:
    env_bootstrap = os.environ.get(ENV_VAR, "").strip()
    state = read_state()
    if state is None and env_bootstrap:
        state = {"source": "env", "bootstrap": env_bootstrap}
    if state is None:
        if args.json:
            term.json({"running": False})
        else:
            term.info("no broker: start one with `runwatch kafka up`")
        return NOT_RUNNING
    brokers = probe(state["bootstrap"])
    running = bool(brokers) and (
        state.get("source") != "jvm" or jvm.pid_alive(int(state.get("pid") or 0))
    )
    if args.json:
        term.json({**state, "running": running, "brokers": brokers or 0})
    else:
        rows = [
            ("running", "yes" if running else "no"),
            ("source", state["source"]),
            ("bootstrap", state["bootstrap"]),
            *[(k, state[k]) for k in ("pid", "data_dir", "log", "version") if k in state],
        ]
        term.table(rows, columns=("field", "value"))
    return 0 if running else NOT_RUNNING
