"""Artifact classification: pure, AST-only (tenant code is never executed on the host)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.classify import classify_bytes, classify_path
from sandbox.isolation import stage_artifact
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


# -- bounded: a tenant's file costs the caller's process nothing but its bytes -------------


def test_an_artifact_over_the_cap_is_the_tenants_and_is_not_read(tmp_path: Path) -> None:
    """Security review 2026-11-28: a 2 MB list literal cost the trainer's process 968 MiB
    inside ``ast.parse``. Over ``MAX_ARTIFACT_BYTES``: refused on its size."""
    from sandbox.classify import MAX_ARTIFACT_BYTES

    big = tmp_path / "r.py"
    big.write_text("def reward(b): return []\nx = [" + "1," * MAX_ARTIFACT_BYTES + "]\n")
    c = classify_path(big)
    assert c.kind is ArtifactKind.INVALID and c.tier is None and c.readable
    assert any(f"larger than {MAX_ARTIFACT_BYTES} bytes" in r for r in c.reasons), c.reasons
    assert classify_path(big, max_bytes=4 * MAX_ARTIFACT_BYTES).kind is not ArtifactKind.FUNCTION


@pytest.mark.timeout(30)
def test_only_a_regular_file_is_read_and_a_fifo_does_not_block(tmp_path: Path) -> None:
    """``/dev/zero`` has no end and a FIFO blocks its reader until a writer comes: neither
    is a reward file, and the caller (the trainer) never waits on one."""
    from sandbox.classify import read_artifact

    fifo = tmp_path / "r.py"
    os.mkfifo(fifo)
    for path in (Path("/dev/zero"), fifo):
        with pytest.raises(OSError, match="not a regular file"):
            read_artifact(path)
        c = classify_path(path)
        assert c.kind is ArtifactKind.INVALID and not c.readable


def test_stage_artifact_refuses_over_the_cap(tmp_path: Path) -> None:
    from sandbox.classify import MAX_ARTIFACT_BYTES, ArtifactTooLarge

    big = tmp_path / "r.py"
    big.write_bytes(b"#" * (MAX_ARTIFACT_BYTES + 1))
    with pytest.raises(ArtifactTooLarge):
        stage_artifact(big)


def test_a_file_costly_to_parse_is_refused_by_the_bounded_parser(tmp_path: Path) -> None:
    """Under the cap, 1 MiB of one-token statements took 933 MiB and 5.6 s to parse: the
    child parsing it dies at its RLIMIT_AS, and the artifact is refused as the tenant's."""
    from sandbox.classify import MAX_ARTIFACT_BYTES

    src = "def reward(b): return []\n" + "a\n" * (MAX_ARTIFACT_BYTES // 2 - 20)
    path = tmp_path / "r.py"
    path.write_text(src)
    c = classify_path(path)
    assert c.kind is ArtifactKind.INVALID and c.readable
    assert any("too complex to parse" in r for r in c.reasons), c.reasons


def test_the_bounded_parser_classifies_like_the_pure_one() -> None:
    from sandbox.classify import classify_isolated

    for src in (
        "def reward(b): return []",
        "import subprocess\ndef reward(b): return []",
        "def reward(:",
        "class E:\n    def reset(self): ...\n    def step(self, a): ...",
    ):
        iso, pure = classify_isolated("r.py", src.encode()), classify_bytes("r.py", src.encode())
        assert (iso.kind, iso.tier, iso.digest, iso.reasons) == (
            pure.kind,
            pure.tier,
            pure.digest,
            pure.reasons,
        )


def test_the_cap_is_one_mib() -> None:
    from sandbox.classify import MAX_ARTIFACT_BYTES

    assert MAX_ARTIFACT_BYTES == 1 << 20
