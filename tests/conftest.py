"""Shared fixtures: a real Kafka broker for tests marked ``kafka``.

``kafka_bootstrap`` (session) provisions once, in the order of
:mod:`runwatch.broker.provision` (``$KAFKA_BOOTSTRAP_SERVERS`` → testcontainers if a
Docker daemon answers → the JVM broker from Maven Central jars), prints which broker it
used into the pytest output, and stops it at the end of the session.

``jvm_broker`` (per test) always starts a JVM broker of its own, for tests that kill and
restart the broker (never do that to the shared one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from runwatch.broker.jvm import JvmBroker
from runwatch.broker.provision import ProvisionedBroker, provision

_used: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kafka: needs a real Kafka broker (tests/conftest.py)")


def _say(config: pytest.Config, line: str) -> None:
    """Write ``line`` to the terminal now, past pytest's output capture."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    ctx = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with ctx:
        if reporter is not None:
            reporter.write_line(line)
        else:  # pragma: no cover - runs without the terminal plugin
            print(line, flush=True)


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[ProvisionedBroker]:
    """The session's real broker (see the module docstring)."""
    broker = provision(log=lambda line: _say(request.config, f"runwatch tests: {line}"))
    line = f"runwatch tests: using Kafka broker {broker.describe()}"
    _used.append(line)
    _say(request.config, "\n" + line)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: ProvisionedBroker) -> str:
    """``host:port`` of the session's real broker."""
    return kafka_broker.bootstrap


@pytest.fixture
def jvm_broker(request: pytest.FixtureRequest) -> Iterator[JvmBroker]:
    """A JVM broker of this test's own (free ports, temporary data dir), stopped after."""
    broker = JvmBroker().start()
    _say(
        request.config,
        f"\nrunwatch tests: own JVM broker at {broker.bootstrap} (pid {broker.pid})",
    )
    try:
        yield broker
    finally:
        broker.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _used:
        terminalreporter.write_line(line)
