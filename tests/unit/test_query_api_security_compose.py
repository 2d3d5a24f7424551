"""Issue #20 item 12, statically: the exporter binds loopback unless told otherwise; the
compose stack tells it so explicitly (Prometheus scrapes it from another container) and
never publishes the metrics port; the bearer-token guard of ``/metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client.registry import CollectorRegistry

from projections.exporter import metrics_app
from runwatch.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1].parent


def test_cli_defaults_bind_loopback():
    args = build_parser("serve").parse_args(
        ["serve", "api", "--keys", "k.yaml", "--metrics-port", "9100"]
    )
    assert args.host == "127.0.0.1" and args.metrics_host == "127.0.0.1"
    assert args.metrics_token_file is None


def test_compose_binds_the_metrics_port_wide_on_purpose_and_does_not_publish_it():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    cmd = [str(x) for x in api["command"]]
    args = build_parser("serve").parse_args(cmd[1:])
    assert "--metrics-host" in cmd and args.metrics_host == "0.0.0.0"
    published = [str(p).rsplit(":", 1)[-1] for p in api.get("ports", [])]
    assert str(args.metrics_port) not in published  # reachable inside the network only
    assert str(args.metrics_port) in [str(p) for p in api.get("expose", [])]
    prom = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [
        t for job in prom["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    ]
    assert f"api:{args.metrics_port}" in targets


def _call(app, auth: str | None) -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": "",
        "SERVER_NAME": "x",
        "SERVER_PORT": "1",
        "wsgi.url_scheme": "http",
    }
    if auth is not None:
        environ["HTTP_AUTHORIZATION"] = auth
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h, *_: status.append(s)))
    return status[0], body


def test_the_token_guard():
    registry = CollectorRegistry()
    assert _call(metrics_app(registry), None)[0].startswith("200")
    guarded = metrics_app(registry, "tok")
    assert _call(guarded, None)[0].startswith("401")
    assert _call(guarded, "Bearer to")[0].startswith("401")
    assert _call(guarded, "Basic tok")[0].startswith("401")
    assert _call(guarded, "tok")[0].startswith("401")
    assert _call(guarded, "Bearer tok")[0].startswith("200")
    assert _call(guarded, "bearer tok")[0].startswith("200")  # the scheme is case-insensitive
    for bad in ("", " tok", "tok\n"):
        with pytest.raises(ValueError):
            metrics_app(registry, bad)
