"""docker-compose.yml and the Dockerfile, checked without a Docker daemon (none runs here).

What can be checked statically: the compose file parses; every runwatch service runs a
real ``runwatch`` subcommand whose arguments the real CLI parser accepts; services reach
Kafka on its in-network listener; references (depends_on, named volumes, bind mounts,
configs) resolve; the API keys config is a valid keys file; Prometheus scrapes the API's
metrics port; the image copies every package the project installs.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from projections.keys import ApiKeys
from runwatch.cli.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
RUNWATCH_SERVICES = ("processors", "api", "trajectories", "notify")


def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR-default}`` / ``${VAR:?err}`` with an empty
    environment: the default, or a failure for a required variable."""

    def sub(m: re.Match[str]) -> str:
        op, arg = m.group(2), m.group(3) or ""
        if op in (":?", "?"):
            raise AssertionError(f"compose requires ${{{m.group(1)}}}: {arg}")
        return arg

    return re.sub(r"\$\{(\w+)(?:(:?-|:?\?)([^}]*))?\}", sub, value)


def expand(node: Any) -> Any:
    if isinstance(node, str):
        return interpolate(node)
    if isinstance(node, list):
        return [expand(x) for x in node]
    if isinstance(node, dict):
        return {k: expand(v) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return expand(yaml.safe_load(COMPOSE.read_text()))


def command(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(x) for x in cmd]


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_every_service_of_the_stack_is_there(compose):
    assert set(compose["services"]) == {
        "kafka",
        *RUNWATCH_SERVICES,
        "prometheus",
        "alertmanager",
        "grafana",
    }


@pytest.mark.parametrize("name", RUNWATCH_SERVICES)
def test_runwatch_services_run_real_subcommands(compose, name):
    svc = compose["services"][name]
    assert svc.get("build") == ".", "built from this repository's Dockerfile"
    cmd = command(svc)
    assert cmd[0] == "runwatch" and cmd[1] in COMMANDS, cmd
    try:
        args = build_parser(cmd[1]).parse_args(cmd[1:])
    except SystemExit as exc:  # argparse rejected it: the container would exit at start
        raise AssertionError(f"{name}: `{shlex.join(cmd)}` does not parse") from exc
    assert args.command == cmd[1]
    # every runwatch service talks to the broker on its in-network listener
    kafka_env = compose["services"]["kafka"]["environment"]
    listener = re.search(r"PLAINTEXT://([^,]+)", kafka_env["KAFKA_ADVERTISED_LISTENERS"])
    assert listener is not None
    assert option(cmd, "--kafka") == listener.group(1) == "kafka:19092"
    assert svc["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == listener.group(1)
    assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_runwatch_services_share_one_image(compose):
    images = {compose["services"][n].get("image") for n in RUNWATCH_SERVICES}
    assert len(images) == 1 and None not in images


def test_api_serves_keys_store_and_metrics_where_the_rest_expects(compose, tmp_path):
    api = compose["services"]["api"]
    cmd = command(api)
    args = build_parser("serve").parse_args(cmd[1:])
    assert args.serve_command == "api" and args.host == "0.0.0.0"
    assert f"{args.port}:{args.port}" in api["ports"]
    # the keys file is the compose config, and it is a valid keys file
    (mount,) = [c for c in api["configs"] if c["target"] == args.keys]
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(compose["configs"][mount["source"]]["content"])
    keys = ApiKeys.load(keys_file)
    assert keys.resolve("rk_ops_change_me").operator
    assert keys.resolve("rk_demo_change_me").tenant_id == "demo"
    # the store lives on the service's volume; Prometheus scrapes the metrics port
    volume_targets = [v.split(":")[1] for v in api["volumes"]]
    assert any(args.store.startswith(t + "/") for t in volume_targets)
    prom = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    ]
    assert f"api:{args.metrics_port}" in targets
    assert str(args.metrics_port) in [str(p) for p in api.get("expose", [])]


def test_references_resolve(compose):
    services, volumes = compose["services"], set(compose.get("volumes") or {})
    for name, svc in services.items():
        deps = svc.get("depends_on") or []
        for dep in deps:
            assert dep in services, f"{name} depends on unknown service {dep}"
        for vol in svc.get("volumes") or []:
            source = vol.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: bind mount {source} is missing"
            else:
                assert source in volumes, f"{name}: named volume {source} is not declared"
        for cfg in svc.get("configs") or []:
            assert cfg["source"] in compose["configs"]


def test_prometheus_and_grafana_mount_the_repository_config(compose):
    prom = compose["services"]["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    graf = compose["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in graf["volumes"] if v.startswith("."))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dash_dir = mounts["./deploy/grafana/dashboards"]
    provider = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/dashboards/runwatch.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == dash_dir
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dash_dir + "/")
    assert (REPO / "deploy/grafana/dashboards" / Path(home).name).exists()


def test_dockerfile_copies_every_package_and_runs_runwatch():
    text = (REPO / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    copied = set()
    for ln in lines:
        if ln.startswith("COPY "):
            *sources, _dest = ln.split()[1:]
            for s in sources:
                assert (REPO / s).exists(), f"COPY source {s} is missing"
                copied.add(s)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    includes = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in includes:
        assert pattern.rstrip("*") in copied, f"package {pattern} is not copied into the image"
    assert {"pyproject.toml", "README.md"} <= copied
    assert project["project"]["scripts"]["runwatch"]
    assert re.search(r'^CMD \["runwatch"', text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M), "the services do not run as root"
