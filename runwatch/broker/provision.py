"""Find or start a real Kafka broker, in a fixed order, and say which one ran.

Order (``../shared/notes/kafka-broker.md``):

1. ``$KAFKA_BOOTSTRAP_SERVERS`` if set — a broker someone else runs; never stopped here.
2. a testcontainers ``KafkaContainer`` (KRaft) if a Docker daemon answers a ping within
   3 seconds;
3. the project's own single-node KRaft broker from Maven Central jars
   (:class:`runwatch.broker.jvm.JvmBroker`).

The returned :class:`ProvisionedBroker` carries the bootstrap address, which path ran
(``source``) and a human-readable ``detail``, and stops what it started.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runwatch.broker.jvm import KAFKA_VERSION, JvmBroker

Source = Literal["env", "testcontainers", "jvm"]
ENV_VAR = "KAFKA_BOOTSTRAP_SERVERS"
TESTCONTAINERS_IMAGE = "confluentinc/cp-kafka:7.9.0"  # Confluent Platform 7.9 = Apache Kafka 3.9


@dataclass
class ProvisionedBroker:
    """A running broker and how to give it back."""

    bootstrap: str
    source: Source
    detail: str
    jvm: JvmBroker | None = None
    container: Any = None
    _stopped: bool = field(default=False, repr=False)

    def describe(self) -> str:
        """One line for test headers and the CLI: path, address and detail."""
        return f"{self.source} at {self.bootstrap} ({self.detail})"

    def stop(self) -> None:
        """Stop what this process started; an external (``env``) broker is left alone."""
        if self._stopped:
            return
        self._stopped = True
        if self.jvm is not None:
            self.jvm.stop()
        if self.container is not None:
            with contextlib.suppress(Exception):
                self.container.stop()


def docker_available() -> bool:
    """Whether a Docker daemon answers (``docker.from_env(timeout=3).ping()``)."""
    try:
        import docker

        return bool(docker.from_env(timeout=3).ping())
    except Exception:
        return False


def start_testcontainer(image: str = TESTCONTAINERS_IMAGE) -> ProvisionedBroker:
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(image).with_kraft()
    container.start()
    bootstrap = container.get_bootstrap_server()
    return ProvisionedBroker(
        bootstrap=bootstrap,
        source="testcontainers",
        detail=f"container {image}",
        container=container,
    )


def start_jvm(
    data_dir: Path | None = None,
    *,
    port: int | None = None,
    controller_port: int | None = None,
    die_with_parent: bool = True,
    log: Callable[[str], None] | None = None,
) -> ProvisionedBroker:
    broker = JvmBroker(
        data_dir,
        port=port,
        controller_port=controller_port,
        die_with_parent=die_with_parent,
        log=log,
    ).start()
    return ProvisionedBroker(
        bootstrap=broker.bootstrap,
        source="jvm",
        detail=(
            f"Apache Kafka {KAFKA_VERSION} KRaft from Maven Central jars, "
            f"pid {broker.pid}, data {broker.data_dir}"
        ),
        jvm=broker,
    )


def provision(
    *,
    use_env: bool = True,
    use_docker: bool = True,
    data_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> ProvisionedBroker:
    """The first broker the order above yields. A Docker daemon that answers but cannot
    start the container falls through to the JVM broker (and says so via ``log``)."""
    if use_env and (bootstrap := os.environ.get(ENV_VAR, "").strip()):
        return ProvisionedBroker(bootstrap=bootstrap, source="env", detail=f"${ENV_VAR}")
    if use_docker and docker_available():
        try:
            return start_testcontainer()
        except Exception as exc:  # daemon answered but the container did not come up
            if log:
                log(f"testcontainers broker failed ({exc!r}); falling back to the JVM broker")
    return start_jvm(data_dir, log=log)
