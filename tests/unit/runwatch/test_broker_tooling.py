"""Broker tooling without a broker: config, cluster ids, provisioning order, probes."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from runwatch.broker import jvm
from runwatch.broker.provision import ENV_VAR, docker_available, provision


def test_cluster_id_is_16_bytes_base64url_not_starting_with_dash() -> None:
    for _ in range(200):
        cid = jvm.new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-") and "=" not in cid
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_pom_names_the_broker_and_its_logging_backend() -> None:
    pom = jvm._pom()
    for group, artifact, version in jvm.ARTIFACTS:
        assert f"<artifactId>{artifact}</artifactId><version>{version}</version>" in pom
        assert f"<groupId>{group}</groupId>" in pom
    assert "kafka_2.13" in pom and "3.9.1" in pom and "reload4j" in pom


def test_single_node_kraft_properties(tmp_path: Path) -> None:
    broker = jvm.JvmBroker(tmp_path / "b", port=41001, controller_port=41002)
    props = broker.properties()
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:41002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:41001,CONTROLLER://127.0.0.1:41002"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "min.insync.replicas",
    ):
        assert props[key] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"].startswith(str(tmp_path / "b"))
    assert broker.bootstrap == "127.0.0.1:41001"


def test_recorded_ports_come_back_from_the_data_dir(tmp_path: Path) -> None:
    assert jvm.recorded_ports(tmp_path) is None
    jvm.JvmBroker(tmp_path, port=41011, controller_port=41012)._write_config()
    assert jvm.recorded_ports(tmp_path) == (41011, 41012)


def test_free_ports_differ_and_the_metadata_probe_fails_on_a_closed_port() -> None:
    broker = jvm.JvmBroker()
    try:
        assert broker.port != broker.controller_port
        with pytest.raises(OSError):
            jvm.metadata_broker_count("127.0.0.1", jvm.free_port(), timeout_s=1.0)
    finally:
        broker.stop()  # never started: only removes its temporary data dir
    assert not broker.data_dir.exists()


def test_env_var_wins_and_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "broker.example:9092")
    handle = provision()
    assert handle.source == "env" and handle.bootstrap == "broker.example:9092"
    assert handle.jvm is None and handle.container is None
    handle.stop()  # an external broker is left alone


def test_docker_probe_answers_quickly() -> None:
    started = time.monotonic()
    assert isinstance(docker_available(), bool)
    assert time.monotonic() - started < 10


def test_stop_pid_of_a_process_that_is_gone() -> None:
    assert jvm.stop_pid(2**22 + 12345) is False
    assert jvm.pid_alive(2**22 + 12345) is False
