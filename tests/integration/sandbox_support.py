"""Helpers shared by the sandbox integration tests (real bwrap sandboxes, no mocks).

``PROBE`` is a reward artifact that executes each item's ``prompt`` as Python inside the
sandbox and scores ``result`` (default 1.0): an assertion that fails inside the sandbox
comes back as a ``tenant_crash`` whose message carries the traceback, so every isolation
check is written as plain Python that runs *in* the sandbox.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.client import FailurePolicy, RewardClient
from sandbox.features import probe, tier_gate
from sandbox.types import ResourceLimits, SandboxConfig

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
