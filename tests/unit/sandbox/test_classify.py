"""Artifact classification: pure, AST-only (tenant code is never executed on the host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.classify import classify_bytes, classify_path
from sandbox.types import ArtifactKind


def kind(src: str, name: str = "reward.py") -> ArtifactKind:
    return classify_bytes(name, src.encode()).kind


def test_pure_function() -> None:
    c = classify_bytes("r.py", b"def reward(batch):\n    return [0.0 for _ in batch]\n")
    assert c.kind is ArtifactKind.FUNCTION and c.tier == "function"
    assert c.digest.startswith("sha256:")


@pytest.mark.parametrize(
    "src",
    [
        "import subprocess\ndef reward(b): return []",
        "from subprocess import run\ndef reward(b): return []",
        "import os\ndef reward(b):\n    os.system('x')\n    return []",
        "from os import execv\ndef reward(b): return []",
        "def reward(b):\n    exec('1')\n    return []",
        "def reward(b):\n    return [eval(x['completion']) for x in b]",
        "import ctypes\ndef reward(b): return []",
        "import multiprocessing.pool\ndef reward(b): return []",
        "ARTIFACT_KIND = 'verifier'\ndef reward(b): return []",
    ],
)
def test_verifier_when_it_runs_further_code(src: str) -> None:
    assert kind(src) is ArtifactKind.VERIFIER


def test_declaration_cannot_downgrade() -> None:
    src = "ARTIFACT_KIND = 'function'\nimport subprocess\ndef reward(b): return []"
    assert kind(src) is ArtifactKind.VERIFIER


def test_environment_and_reward_model() -> None:
    env = "class Env:\n    def reset(self): ...\n    def step(self, a): ..."
    c = classify_bytes("env.py", env.encode())
    assert c.kind is ArtifactKind.ENVIRONMENT and c.tier == "environment"
    assert kind("", "model.safetensors") is ArtifactKind.REWARD_MODEL


def test_reward_model_directory(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 8)
    assert classify_path(tmp_path).kind is ArtifactKind.REWARD_MODEL


@pytest.mark.parametrize(
    ("src", "name"),
    [
        ("def score(b): return []", "r.py"),
        ("def reward(:", "r.py"),
        ("async def reward(b): return []", "r.py"),
        ("def reward(b): return []", "r.txt"),
    ],
)
def test_invalid(src: str, name: str) -> None:
    c = classify_bytes(name, src.encode())
    assert c.kind is ArtifactKind.INVALID and c.tier is None and c.reasons


def test_classification_never_executes(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    src = f"open({str(marker)!r}, 'w').write('x')\ndef reward(b): return []\n"
    (tmp_path / "r.py").write_text(src)
    assert classify_path(tmp_path / "r.py").kind is ArtifactKind.FUNCTION
    assert not marker.exists()


@pytest.mark.parametrize(
    ("src", "why"),
    [
        ("reward = lambda batch: [0.0 for _ in batch]\n", "bound by an assignment"),
        ("def reward(b): return []\nreward = None\n", "bound by an assignment"),
        ("from mylib import reward\n", "bound by an assignment or import"),
        ("import reward\n", "bound by an assignment or import"),
        ("reward: object = print\n", "bound by an assignment"),
        ("def reward(): return []\n", "one positional argument"),
        ("def reward(a, b): return []\n", "one positional argument"),
        ("def reward(b, *, k): return []\n", "one positional argument"),
        ("def reward(b):\n    return [\n", "does not parse"),
        ("return 1\ndef reward(b): return []\n", "does not parse"),  # only compile sees it
        ("def reward(b):\n    nonlocal x\n    return []\n", "does not parse"),
        ("x = " + "(" * 300 + ")" * 300 + "\ndef reward(b): return []\n", "does not parse"),
        ("x = " + "-" * 100_000 + "1\ndef reward(b): return []\n", "nested too deeply"),
    ],
)
def test_not_a_reward_artifact_says_why(src: str, why: str) -> None:
    """Each of these is refused before scoring (``tenant_bad_artifact``) with a reason; a
    source nested too deeply for the parser is refused too, never an exception."""
    c = classify_bytes("r.py", src.encode())
    assert c.kind is ArtifactKind.INVALID and c.tier is None and c.readable
    assert any(why in r for r in c.reasons), c.reasons


@pytest.mark.parametrize(
    "src",
    [
        "def reward(batch, scale=1.0): return []",
        "def reward(*batches): return []",
        "def reward(batch, /): return []",
        "def reward(batch, *, k=2): return []",
    ],
)
def test_signatures_that_take_one_batch_are_fine(src: str) -> None:
    assert kind(src) is ArtifactKind.FUNCTION


def test_unreadable_file_is_not_the_tenants_fault(tmp_path: Path) -> None:
    c = classify_path(tmp_path / "missing.py")
    assert c.kind is ArtifactKind.INVALID and not c.readable
