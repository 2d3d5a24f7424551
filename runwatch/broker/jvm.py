"""A single-node KRaft Apache Kafka broker run from Maven Central jars.

This is how tests, CI and ``runwatch kafka up`` get a *real* broker on a machine with
no Docker daemon (see ``../shared/notes/kafka-broker.md``):

1. :func:`ensure_classpath` resolves ``org.apache.kafka:kafka_2.13`` plus a logging
   backend into ``~/.cache/runwatch/kafka-<version>/libs`` with ``mvn`` once; later runs
   reuse it. A file lock keeps two concurrent runs from resolving at the same time, and
   a marker file written last means a half-finished download is never used.
2. :class:`JvmBroker` formats a data directory of its own (once), picks free ports,
   starts ``kafka.Kafka`` as a child process in its own session and waits until a
   Metadata request lists the broker (or the log says ``Kafka Server started``).
3. :meth:`JvmBroker.stop` is a clean stop (SIGTERM, then SIGKILL after a grace
   period); :meth:`JvmBroker.kill` is a crash (SIGKILL) and :meth:`JvmBroker.restart`
   starts again on the same data directory and the same ports, which is what the crash
   test needs.

Settings assume a small box (2 cores): one replica everywhere, min ISR 1, a handful of
partitions for the internal topics, no initial rebalance delay. Topic auto-creation
stays on (Kafka's default) for faust's internal topics; runwatch's own topics are
created explicitly from the registry in :mod:`events.topics`.

Time semantics: the timeouts here are wall-clock seconds of this process.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

KAFKA_VERSION = "3.9.1"
SCALA_VERSION = "2.13"
ARTIFACTS: tuple[tuple[str, str, str], ...] = (
    ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
    ("org.slf4j", "slf4j-reload4j", "1.7.36"),
    ("ch.qos.reload4j", "reload4j", "1.2.25"),
)
JVM_FLAGS: tuple[str, ...] = (
    "-Xms512m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
READY_LINE = "Kafka Server started"
_COMPLETE_MARKER = ".complete"


class BrokerError(RuntimeError):
    """The broker could not be resolved, formatted, started or stopped."""


def cache_root() -> Path:
    """``$RUNWATCH_CACHE_DIR`` or ``~/.cache/runwatch`` (created on demand)."""
    root = Path(os.environ.get("RUNWATCH_CACHE_DIR") or Path.home() / ".cache" / "runwatch")
    root.mkdir(parents=True, exist_ok=True)
    return root


def libs_dir() -> Path:
    """Where the broker's classpath (one directory of jars) lives once resolved."""
    return cache_root() / f"kafka-{KAFKA_VERSION}" / "libs"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (blocks until the other holder is done)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _pom() -> str:
    deps = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in ARTIFACTS
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.runwatch</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""


def ensure_classpath(log: Callable[[str], None] | None = None) -> Path:
    """Resolve the broker's jars once (``mvn dependency:copy-dependencies``) and return
    the directory holding them. Safe to call from concurrent processes."""
    target = libs_dir()
    marker = target / _COMPLETE_MARKER
    if marker.exists():
        return target
    with file_lock(target.parent / ".resolve.lock"):
        if marker.exists():  # another process finished while we waited
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError("Maven (mvn) is not on PATH; it is needed once to fetch Kafka jars")
        if log:
            log(f"resolving Apache Kafka {KAFKA_VERSION} jars from Maven Central into {target}")
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".resolve-") as tmp:
            pom = Path(tmp) / "pom.xml"
            pom.write_text(_pom())
            staging = Path(tmp) / "libs"
            cmd = [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            jars = sorted(staging.glob("*.jar")) if staging.exists() else []
            if proc.returncode != 0 or not jars:
                tail = (proc.stdout + proc.stderr)[-3000:]
                raise BrokerError(f"mvn could not resolve the Kafka classpath:\n{tail}")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        marker.write_text(f"{len(jars)} jars\n")
    return target


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def new_cluster_id() -> str:
    """16 random bytes, base64url without padding, never starting with ``-``."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def metadata_broker_count(host: str, port: int, timeout_s: float = 2.0) -> int:
    """Send one Kafka Metadata request (v1, no topics) and return how many brokers the
    response lists; raises ``OSError`` when nothing answers. A KRaft broker appears in
    that list only once it is registered and unfenced, i.e. ready for clients."""
    client_id = b"runwatch-probe"
    # header: api_key=3 (Metadata), api_version=1, correlation_id, client_id; body: topics=[]
    body = struct.pack(">hhih", 3, 1, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        payload = _recv_exact(s, size)
    correlation_id, n_brokers = struct.unpack(">ii", payload[:8])
    if correlation_id != 7:
        raise OSError("unexpected metadata response")
    return int(n_brokers)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)


_LOG4J = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=${kafka.logs.dir}/broker.log
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=3
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.authorizer.logger=WARN
"""


class JvmBroker:
    """One single-node KRaft broker (``process.roles=broker,controller``).

    ``data_dir`` defaults to a fresh temporary directory that :meth:`stop` removes; pass
    one to keep data across stops (``runwatch kafka up`` does). Ports default to free
    ones picked at construction and stay fixed for the object's life, so
    :meth:`restart` comes back at the same address. With ``die_with_parent`` (the
    default, for tests) the broker gets SIGTERM when the process that started it dies,
    so a killed test run leaves no broker behind; ``runwatch kafka up`` turns it off.
    (Linux counts the exit of the *thread* that started the broker as the parent's
    death: start and restart it from a long-lived thread, e.g. the main thread.)
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        host: str = "127.0.0.1",
        extra_properties: Mapping[str, str] | None = None,
        jvm_flags: tuple[str, ...] = JVM_FLAGS,
        die_with_parent: bool = True,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.owns_data_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="runwatch-kafka-"))
        self.host = host
        self.port = port or free_port(host)
        self.controller_port = controller_port or free_port(host)
        while self.controller_port == self.port:
            self.controller_port = free_port(host)
        self.extra_properties = dict(extra_properties or {})
        self.jvm_flags = jvm_flags
        self.die_with_parent = die_with_parent
        self._log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # ---------------------------------------------------------------- addresses
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        """The broker's log4j log (rolled at 20 MB, 3 kept)."""
        return self.data_dir / "broker.log"

    @property
    def console_path(self) -> Path:
        """The JVM's own stdout/stderr (start-up failures land here)."""
        return self.data_dir / "console.log"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ---------------------------------------------------------------- configuration
    def properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir / "kraft-logs"),
            # one node: every replication factor and min ISR is 1
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # a 2-core box: few internal partitions and threads, no rebalance delay
            "num.partitions": "3",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.num.partitions": "4",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "4",
            "group.initial.rebalance.delay.ms": "0",
            # after a crash the restarted broker re-registers only once the dead
            # incarnation's session expired: keep that short so a restart takes seconds
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "1000",
            # runwatch creates its registry topics itself (partitions, retention), but
            # faust-streaming's consumer races the declaration of its changelog topics
            # and needs the broker to auto-create them (Kafka's default, as on
            # testcontainers brokers)
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            "log.segment.bytes": str(256 * 1024 * 1024),
            "log.retention.hours": "168",
            "log.retention.check.interval.ms": "60000",
            "message.max.bytes": str(8 * 1024 * 1024),
        }
        props.update(self.extra_properties)
        return props

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{k}={v}" for k, v in self.properties().items()]
        self.properties_path.write_text("\n".join(lines) + "\n")
        (self.data_dir / "log4j.properties").write_text(_LOG4J)

    def _java(self, libs: Path) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise BrokerError("java is not on PATH (Java 17 runs the Kafka broker)")
        return [
            java,
            *self.jvm_flags,
            f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            f"{libs}/*",
        ]

    def _format(self, libs: Path) -> None:
        """Format the storage once; a data dir that has ``meta.properties`` is kept."""
        if (self.data_dir / "kraft-logs" / "meta.properties").exists():
            return
        cmd = [
            *self._java(libs),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            new_cluster_id(),
            "-c",
            str(self.properties_path),
            "--ignore-formatted",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(
                f"kafka storage format failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )

    # ---------------------------------------------------------------- lifecycle
    def start(self, timeout_s: float = 120.0) -> JvmBroker:
        """Resolve jars (cached), format storage (once), start and wait until ready."""
        if self.is_running():
            return self
        libs = ensure_classpath(self._log)
        self._write_config()
        self._format(libs)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.console_path, "ab") as out:
            self._proc = subprocess.Popen(
                [*self._java(libs), "kafka.Kafka", str(self.properties_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.data_dir,
                preexec_fn=_term_when_parent_dies if self.die_with_parent else None,
            )
        (self.data_dir / "broker.pid").write_text(f"{self._proc.pid}\n")
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise
        if self._log:
            self._log(f"Kafka {KAFKA_VERSION} broker ready at {self.bootstrap} (pid {self.pid})")
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise BrokerError(
                    f"broker exited with code {self._proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if metadata_broker_count(self.host, self.port, timeout_s=2.0) >= 1:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise BrokerError(f"broker not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def saw_ready_line(self) -> bool:
        """Whether the log of the current start says ``Kafka Server started``."""
        try:
            with open(self.log_path, "rb") as fh:
                rolled = self.log_path.stat().st_size < self._log_offset
                fh.seek(0 if rolled else self._log_offset)
                return READY_LINE.encode() in fh.read()
        except OSError:
            return False

    def log_tail(self, n_bytes: int = 4000) -> str:
        """The end of the broker log and of the JVM console (for error messages)."""
        parts = []
        for path in (self.log_path, self.console_path):
            try:
                data = path.read_bytes()[-n_bytes:].decode(errors="replace")
            except OSError:
                continue
            parts.append(f"--- {path.name}\n{data}")
        return "\n".join(parts) or "(no broker log)"

    def stop(self, timeout_s: float = 30.0, *, remove_data: bool | None = None) -> None:
        """Clean stop: SIGTERM to the process group, SIGKILL after ``timeout_s``.
        Removes the data dir when this object created it (unless told otherwise)."""
        self._signal_and_wait(signal.SIGTERM, timeout_s)
        if remove_data if remove_data is not None else self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """Crash the broker: SIGKILL, no shutdown hooks, data dir kept."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def restart(self, timeout_s: float = 120.0) -> JvmBroker:
        """Start again on the same data dir and ports (after :meth:`kill` or :meth:`stop`
        with ``remove_data=False``)."""
        if self.is_running():
            self._signal_and_wait(signal.SIGTERM, 30.0)
        return self.start(timeout_s)

    def _signal_and_wait(self, sig: signal.Signals, timeout_s: float) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self._proc = None

    def __enter__(self) -> JvmBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def recorded_ports(data_dir: Path | str) -> tuple[int, int] | None:
    """The (client, controller) ports a broker last used in ``data_dir``, from its
    ``server.properties``; None when the directory holds no broker config."""
    try:
        text = (Path(data_dir) / "server.properties").read_text()
    except OSError:
        return None
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    try:
        port = int(props["advertised.listeners"].rsplit(":", 1)[1])
        controller_port = int(props["controller.quorum.voters"].rsplit(":", 1)[1])
    except (KeyError, ValueError, IndexError):
        return None
    return port, controller_port


def _term_when_parent_dies() -> None:
    """In the child before exec: ask Linux for SIGTERM when the parent exits."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def stop_pid(pid: int, timeout_s: float = 30.0) -> bool:
    """Stop a broker started by another process (``runwatch kafka down``): SIGTERM to its
    process group, SIGKILL after ``timeout_s``. False when it was not running."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
