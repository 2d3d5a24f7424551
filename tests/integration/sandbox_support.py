"""Helpers shared by the sandbox integration tests (real bwrap sandboxes, no mocks).

``PROBE`` is a reward artifact that executes each item's ``prompt`` as Python inside the
sandbox and scores ``result`` (default 1.0): an assertion that fails inside the sandbox
comes back as a ``tenant_crash`` whose message carries the traceback, so every isolation
check is written as plain Python that runs *in* the sandbox.

``ungated_worker`` starts one real worker *below* the tier gate, with the layers asked
for: the controls that prove one layer is what holds (the same attack succeeding
without it) need a sandbox no tier may run (every tier requires every layer without a
fallback, ``sandbox.features.REQUIRED_LAYERS``).
"""

from __future__ import annotations

import contextlib
import os
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.client import FailurePolicy, RewardClient
from sandbox.features import probe, tier_gate
from sandbox.isolation import stage_artifact, unstage_artifact
from sandbox.types import ALL_LAYERS, ResourceLimits, SandboxConfig
from sandbox.worker import SandboxWorker

PROBE = """
def reward(batch):
    out = []
    for item in batch:
        ns = {}
        exec(item["prompt"], ns)
        out.append(float(ns.get("result", 1.0)))
    return out
"""

FAST_LIMITS = ResourceLimits(
    deadline_s=5.0, memory_bytes=256 * 1024 * 1024, pids=24, startup_s=10.0, cpu_seconds=30
)


def require_sandbox() -> None:
    """Skip when this host cannot run the hostile tier; on CI a missing layer is a failure."""
    gate = tier_gate(probe(), "verifier")
    if not gate.allowed:
        if os.environ.get("CI"):
            pytest.fail(f"sandbox unavailable on CI (run scripts/setup-sandbox.sh): {gate.message}")
        pytest.skip(f"sandbox unavailable here: {gate.message}")


def write_reward(tmp_path: Path, source: str, name: str = "reward.py") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def make_client(
    tmp_path: Path,
    source: str,
    *,
    tenant: str = "tenant-a",
    tier: str = "verifier",
    policy: FailurePolicy | None = None,
    limits: ResourceLimits = FAST_LIMITS,
    **config_kw: object,
) -> RewardClient:
    cfg = replace(SandboxConfig(limits=limits), **config_kw)  # type: ignore[arg-type]
    return RewardClient(
        write_reward(tmp_path, source),
        tenant,
        run_id="run-test",
        tier=tier,  # type: ignore[arg-type]
        policy=policy or FailurePolicy("skip"),
        config=cfg,
    )


def item(code: str) -> dict[str, str]:
    return {"prompt": textwrap.dedent(code), "completion": ""}


@contextlib.contextmanager
def ungated_worker(
    tmp_path: Path,
    source: str,
    *,
    without: frozenset[str],
    tier: str = "function",
    limits: ResourceLimits = FAST_LIMITS,
) -> Iterator[SandboxWorker]:
    """One real sandbox worker running ``source`` with every layer but ``without``,
    started directly (no tier gate, no pool): for controls only. Closed on exit."""
    require_sandbox()
    config = SandboxConfig(
        tier=tier,  # type: ignore[arg-type]
        limits=limits,
        layers=frozenset(ALL_LAYERS) - without,
    )
    bundle = stage_artifact(write_reward(tmp_path, source))
    try:
        worker, failure = SandboxWorker.spawn(config, "tenant-control", bundle, probe())
        assert worker is not None, failure
        try:
            yield worker
        finally:
            worker.close()
    finally:
        unstage_artifact(bundle)
