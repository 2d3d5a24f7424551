"""The threshold catalog: layered overrides, routing without code, load-time errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stream_processors.detectors import CatalogError, RunHealthFold, load_catalog
from stream_processors.detectors.config import DEFAULT_CATALOG_PATH
from stream_processors.detectors.registry import BY_NAME
from tests.unit.stream_processors.detectors._builders import Run, fired, fold_all

CATALOG = """
version: "t-1"
detectors:
  kl_blowup: {routing: ticket, params: {ceiling: 0.5}}
algorithms:
  ppo:
    kl_blowup: {params: {ceiling: 0.2}}
tenants:
  acme:
    kl_blowup: {routing: advisory, first_response: "call the acme on-call"}
"""


def _kl_run(tenant: str, algorithm: str, kl: float = 0.3) -> list:
    run = Run(tenant=tenant, algorithm=algorithm)
    return [run.submitted(), *(run.step(s, kl_to_ref=kl) for s in range(10))]


@pytest.fixture
def fold(tmp_path: Path) -> RunHealthFold:
    path = tmp_path / "catalog.yaml"
    path.write_text(CATALOG)
    return RunHealthFold(load_catalog(path))


def test_per_algorithm_ceiling_selected_by_run_submitted(fold: RunHealthFold) -> None:
    assert not fired(fold_all(_kl_run("t", "grpo"), fold)[1])
    alerts = fired(fold_all(_kl_run("t", "ppo"), fold)[1], "kl_blowup")
    assert len(alerts) == 1 and alerts[0].routing == "ticket"
    assert dict(alerts[0].thresholds)["ceiling"] == 0.2
    assert alerts[0].config_version.startswith("t-1#")


def test_per_tenant_routing_and_first_response(fold: RunHealthFold) -> None:
    alert = fired(fold_all(_kl_run("acme", "ppo"), fold)[1], "kl_blowup")[0]
    assert alert.routing == "advisory" and alert.first_response == "call the acme on-call"


def test_algorithm_from_step_events_when_lifecycle_comes_late(fold: RunHealthFold) -> None:
    events = _kl_run("t", "ppo")
    late_submit = events[1:] + events[:1]  # a host consumed telemetry before lifecycle
    assert [a.event_id for a in fired(fold_all(late_submit, fold)[1])] == [
        a.event_id for a in fired(fold_all(events, fold)[1])
    ]


def test_packaged_catalog_loads_and_is_versioned() -> None:
    catalog = load_catalog()
    declared = yaml.safe_load(DEFAULT_CATALOG_PATH.read_text())["version"]
    assert catalog.version.split("#")[0] == declared
    ppo = catalog.settings(BY_NAME["kl_blowup"], "any", "ppo")
    assert ppo.params.ceiling == 0.2 and ppo.routing == "page"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("detectors: {}", "missing 'version'"),
        ("version: 1\ndetectors: {nope: {}}", "unknown detector 'nope'"),
        ("version: 1\ndetectors: {kl_blowup: {routing: pager}}", "is not one of"),
        ("version: 1\ndetectors: {kl_blowup: {params: {ceilling: 1}}}", "unknown parameter"),
        ("version: 1\ndetectors: {kl_blowup: {params: {window: 2.5}}}", "expected an integer"),
        ("version: 1\nalgorithms: {ppo: {kl_blowup: {colour: red}}}", "unknown keys"),
        ("version: [1", "not valid YAML"),
    ],
)
def test_bad_catalog_fails_at_load_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)
