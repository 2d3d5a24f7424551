"""Classify a tenant reward artifact and pick its tier — a pure function of its bytes.

Tenant code is never imported on the host: a Python artifact is *parsed* (``ast``), never
executed. The four kinds (seed 002, step 1), each widening the surface:

- ``function``: a module defining ``reward(batch)`` that only computes over text.
- ``invalid``: not a reward artifact — it does not parse or compile, has no module-level
  ``def reward(batch)`` (a ``reward = lambda ...``, an imported or re-bound ``reward``, an
  ``async def`` or a signature that cannot take one batch do not count), or is not a
  ``.py``/weights file. The client refuses it before any of it runs: ``tenant_bad_artifact``.
- ``verifier``: a module defining ``reward(batch)`` that runs further code — it imports or
  calls process/exec/loader machinery (``subprocess``, ``os.system``/``exec*``/``spawn*``/
  ``fork``, ``multiprocessing``, ``ctypes``, ``importlib``, ``exec``/``eval``/``compile``/
  ``__import__``), or declares ``ARTIFACT_KIND = "verifier"``.
- ``reward_model``: weights (``.safetensors``, ``.pt``, ``.bin``, ``.onnx``, ``.gguf``, or a
  directory holding them) — tier declared, not built here.
- ``environment``: a module with a class defining both ``reset`` and ``step`` (stateful,
  multi-step) and no module-level ``reward`` — tier declared, not built here.

Parsing is host work on tenant bytes, so it is bounded twice (security review, 2026-11-28:
a 2 MB list literal cost the trainer's process 968 MiB and 8 s inside ``ast.parse``):
:func:`classify_path` refuses a file over :data:`MAX_ARTIFACT_BYTES` before reading it
whole (``os.stat``, then a read of at most the cap + 1 bytes), and parses what is left in
a short-lived child process under ``RLIMIT_AS`` (:data:`PARSE_MEMORY_BYTES`) and
``RLIMIT_CPU`` (:data:`PARSE_CPU_SECONDS`); a child killed by either, or failing, is an
``invalid`` artifact ("too complex to parse"), the tenant's. :func:`classify_bytes` stays
the pure, in-process classifier of bytes already bounded by its caller.

A declared ``ARTIFACT_KIND`` can only move an artifact *up* the ladder, never down. The
classification picks recycling cadence and failure policy; it is not the security boundary
(a determined author hides an import: ``getattr(builtins, "__imp" + "ort__")("ctypes")``
is classified ``function``), which is why every tier requires the same isolation layers
(:data:`sandbox.features.REQUIRED_LAYERS`): a host that cannot give the verifier tier
its layers refuses the function tier too.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sandbox.types import ArtifactKind, Tier

#: Largest code artifact read, classified or staged (bytes). Larger: ``tenant_bad_artifact``.
MAX_ARTIFACT_BYTES = 1 << 20
#: Largest weights file whose digest is computed (bytes): the tier is not built, and
#: hashing a file of any size cost the caller time without bound.
MAX_WEIGHTS_HASH_BYTES = 256 << 20
#: Address space of the child that parses an artifact: ordinary code of 1 MiB parses in
#: ~75 MiB; a 1 MiB file of one-token statements or a long list literal takes 370-930 MiB.
PARSE_MEMORY_BYTES = 256 << 20
#: CPU seconds the parsing child may use (ordinary code of 1 MiB: ~0.5 s).
PARSE_CPU_SECONDS = 5
#: Wall-clock bound of the parsing child; past it (a loaded host, not CPU spent) the
#: platform could not classify the file: not booked to the tenant.
PARSE_WALL_SECONDS = 60.0
#: What the parsing child prints once its limits are set and the classifier is imported,
#: before it reads a byte of the artifact: without it, the child never started (the
#: platform's); with it, whatever follows is the artifact's doing.
_CHILD_READY = "rw-classify-ready\n"
_TOO_COMPLEX = "too complex to parse"

WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".onnx", ".gguf", ".ckpt")
CODE_RUNNING_MODULES = frozenset(
    {"subprocess", "multiprocessing", "ctypes", "cffi", "importlib", "runpy", "pty", "concurrent"}
)
CODE_RUNNING_OS_ATTRS = frozenset(
    {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)
CODE_RUNNING_BUILTINS = frozenset({"exec", "eval", "compile", "__import__"})
_ORDER = {
    ArtifactKind.FUNCTION: 0,
    ArtifactKind.VERIFIER: 1,
    ArtifactKind.ENVIRONMENT: 2,
    ArtifactKind.REWARD_MODEL: 3,
}
TIER_OF: dict[ArtifactKind, Tier] = {
    ArtifactKind.FUNCTION: "function",
    ArtifactKind.VERIFIER: "verifier",
    ArtifactKind.REWARD_MODEL: "reward_model",
    ArtifactKind.ENVIRONMENT: "environment",
}


@dataclass(frozen=True)
class Classification:
    """The kind of an artifact, its tier (None when invalid) and why.

    ``readable`` is False only when the platform could not read the file at all (its
    storage, not the tenant's code); every other ``invalid`` is the tenant's artifact
    (does not parse or compile, no ``def reward``, not a reward file) and is refused
    before scoring as ``tenant_bad_artifact``.
    """

    kind: ArtifactKind
    tier: Tier | None
    digest: str
    reasons: tuple[str, ...]
    readable: bool = True


class ArtifactTooLarge(ValueError):
    """The artifact is larger than the cap: refused before it is read whole."""


@contextlib.contextmanager
def open_regular(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """``path`` opened for reading without blocking (a FIFO would wait for a writer), and
    its size, checked on the open file: a regular file only, else ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        yield fh, st.st_size


def read_artifact(path: Path, cap: int = MAX_ARTIFACT_BYTES) -> bytes:
    """The bytes of the file at ``path``, never more than ``cap``.

    Opens without blocking (a FIFO would wait for a writer) and checks the open file with
    ``os.fstat`` first: a regular file only (else ``OSError``: the platform handed over no
    file), at most ``cap`` bytes; then reads at most ``cap + 1`` (a file that grew since
    is caught by the read). Raises :class:`ArtifactTooLarge` past the cap, ``OSError``
    when unreadable.
    """
    with open_regular(path) as (fh, size):
        if size > cap:
            raise ArtifactTooLarge(f"artifact larger than {cap} bytes ({size} bytes): refused")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise ArtifactTooLarge(f"artifact larger than {cap} bytes: refused")
    return data


def classify_path(path: Path, *, max_bytes: int = MAX_ARTIFACT_BYTES) -> Classification:
    """Classify a file or directory on disk (reads it, bounded; never executes it).

    A code file over ``max_bytes`` is ``invalid`` (the tenant's) without being read
    whole; one under it is parsed in a bounded child (:func:`classify_isolated`). A
    weights file is classified by its name, its digest read in chunks. Never raises.
    """
    path = Path(path)
    if path.is_dir():
        weights = sorted(p.name for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
        digest = hashlib.sha256("|".join(weights).encode()).hexdigest()
        if weights:
            return Classification(
                ArtifactKind.REWARD_MODEL,
                "reward_model",
                "sha256:" + digest,
                (f"directory with weights: {', '.join(weights[:3])}",),
            )
        return Classification(
            ArtifactKind.INVALID,
            None,
            "sha256:" + digest,
            ("directory without weights or reward.py",),
        )
    try:
        if path.name.endswith(WEIGHT_SUFFIXES):
            return _classify_weights(path)
        data = read_artifact(path, max_bytes)
    except ArtifactTooLarge as exc:
        return Classification(ArtifactKind.INVALID, None, "", (str(exc),))
    except OSError as exc:
        return Classification(
            ArtifactKind.INVALID, None, "", (f"cannot read {path}: {exc}",), readable=False
        )
    if not path.name.endswith(".py"):
        return classify_bytes(path.name, data)  # refused by its name: nothing is parsed
    return classify_isolated(path.name, data)


def _classify_weights(path: Path, cap: int = MAX_WEIGHTS_HASH_BYTES) -> Classification:
    """A weights file, by its name; its digest read in 1 MiB chunks (weights are large,
    and this tier is not built: nothing of them is loaded here). A regular file only
    (opened without blocking: a FIFO named ``*.bin`` would wait for a writer), hashed
    only up to ``cap`` bytes: a larger one gets no digest, so its size cannot set how long
    the caller hashes (security review, 2026-11-28, second round). Raises ``OSError``."""
    with open_regular(path) as (fh, size):
        if size > cap:
            return Classification(
                ArtifactKind.REWARD_MODEL,
                "reward_model",
                "",
                (f"weights file ({path.suffix}), {size} bytes: over {cap}, not hashed",),
            )
        sha = hashlib.sha256()
        left = cap
        while left > 0 and (chunk := fh.read(min(1 << 20, left))):
            sha.update(chunk)
            left -= len(chunk)
    return Classification(
        ArtifactKind.REWARD_MODEL,
        "reward_model",
        "sha256:" + sha.hexdigest(),
        (f"weights file ({path.suffix})",),
    )


def classify_isolated(
    name: str,
    data: bytes,
    *,
    memory_bytes: int = PARSE_MEMORY_BYTES,
    cpu_seconds: int = PARSE_CPU_SECONDS,
    wall_seconds: float = PARSE_WALL_SECONDS,
) -> Classification:
    """:func:`classify_bytes` run in a short-lived child process under ``RLIMIT_AS`` and
    ``RLIMIT_CPU``, so parsing costs the caller's process nothing but the bytes.

    Assumes ``data`` is already bounded (:func:`read_artifact`). A child killed by its
    limits, or ending without a verdict, is ``invalid`` ("too complex to parse"): the
    tenant's. A child that did not get as far as reading the bytes (:data:`_CHILD_READY`),
    or ran past ``wall_seconds`` without spending its CPU limit (a loaded host), is the
    platform's (``readable=False``).
    Never raises.
    """
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    argv = [
        sys.executable or "/usr/bin/python3",
        "-I",
        "-S",
        "-c",
        _CHILD_BOOT,
        str(memory_bytes),
        str(cpu_seconds),
        str(Path(__file__).resolve().parent.parent),
        name,
    ]
    try:
        proc = subprocess.run(argv, input=data, capture_output=True, timeout=wall_seconds, env={})
    except subprocess.TimeoutExpired:
        why = f"classifier ran past {wall_seconds:.0f} s of wall-clock time"
        return Classification(ArtifactKind.INVALID, None, digest, (why,), readable=False)
    except OSError as exc:
        why = f"classifier could not start: {exc}"
        return Classification(ArtifactKind.INVALID, None, digest, (why,), readable=False)
    return _child_verdict(proc, digest)


def _child_verdict(proc: subprocess.CompletedProcess[bytes], digest: str) -> Classification:
    """The classification the parsing child printed, or why there is none."""
    ready = _CHILD_READY.encode()
    if not proc.stdout.startswith(ready):
        why = "classifier could not start: " + proc.stderr.decode(errors="replace")[-300:]
        return Classification(ArtifactKind.INVALID, None, digest, (why,), readable=False)
    try:
        doc = json.loads(proc.stdout[len(ready) :])
        kind = ArtifactKind(doc["kind"])
        reasons = tuple(str(r) for r in doc["reasons"])
    except (ValueError, KeyError, TypeError):
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else "failed"
        why = f"does not parse: {_TOO_COMPLEX} (the bounded parser {how})"
        return Classification(ArtifactKind.INVALID, None, digest, (why,))
    return Classification(kind, TIER_OF.get(kind), digest, reasons)


#: The parsing child: limits first, then the project's classifier, then the tenant's bytes
#: (stdin, bounded) -> one JSON verdict (stdout), after :data:`_CHILD_READY`.
_CHILD_BOOT = """
import resource, sys
mem, cpu, root, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.path.insert(0, root)
from sandbox.classify import child_main
child_main(name)
"""


def child_main(name: str) -> None:
    """Inside the parsing child: classify stdin's bytes, print the verdict as JSON."""
    sys.stdout.write(_CHILD_READY)
    sys.stdout.flush()
    data = sys.stdin.buffer.read()  # the caller's bytes, bounded by it
    c = classify_bytes(name, data)
    sys.stdout.write(json.dumps({"kind": c.kind.value, "reasons": list(c.reasons)}))
    sys.stdout.flush()
    os._exit(0)


def classify_bytes(name: str, data: bytes) -> Classification:
    """Classify an artifact from its file name and content. Pure."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if name.endswith(WEIGHT_SUFFIXES):
        return Classification(
            ArtifactKind.REWARD_MODEL,
            "reward_model",
            digest,
            (f"weights file ({Path(name).suffix})",),
        )
    if not name.endswith(".py"):
        return Classification(
            ArtifactKind.INVALID, None, digest, ("not a .py reward module or a weights file",)
        )
    try:
        tree = ast.parse(data, filename=name)
        # compiling (never running) also finds what the parser lets through: 'return'
        # outside a function, a misplaced nonlocal, ...
        compile(tree, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return Classification(ArtifactKind.INVALID, None, digest, (f"does not parse: {exc}",))
    except RecursionError:
        return Classification(
            ArtifactKind.INVALID, None, digest, ("does not parse: nested too deeply",)
        )
    except MemoryError:  # the 3.11 parser's stack limit, or the bounded child's RLIMIT_AS
        why = f"does not parse: nested too deeply or {_TOO_COMPLEX}"
        return Classification(ArtifactKind.INVALID, None, digest, (why,))
    return _classify_module(tree, digest)


def _classify_module(tree: ast.Module, digest: str) -> Classification:
    reasons: list[str] = []
    has_reward = False
    declared: ArtifactKind | None = None
    env_classes: list[str] = []
    rebound = False
    for node in tree.body:
        if _binds_reward_otherwise(node):
            rebound = True
            reasons.append(
                "reward is bound by an assignment or import, not defined: "
                "write a module-level def reward(batch)"
            )
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "reward":
            has_reward = True
            if isinstance(node, ast.AsyncFunctionDef):
                reasons.append("reward is async: must be a plain function")
                has_reward = False
            elif not _takes_one_argument(node.args):
                reasons.append("def reward must take the batch as its one positional argument")
                has_reward = False
        if isinstance(node, ast.ClassDef):
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            if {"reset", "step"} <= methods:
                env_classes.append(node.name)
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "ARTIFACT_KIND" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            try:
                declared = ArtifactKind(node.value.value)
            except ValueError:
                reasons.append(f"unknown ARTIFACT_KIND {node.value.value!r} ignored")
    runs_code = sorted(_code_running_uses(tree))
    if rebound:
        return Classification(ArtifactKind.INVALID, None, digest, tuple(reasons))
    if env_classes and not has_reward:
        kind = ArtifactKind.ENVIRONMENT
        reasons.append(f"stateful environment class(es): {', '.join(env_classes)}")
    elif not has_reward:
        return Classification(
            ArtifactKind.INVALID,
            None,
            digest,
            (*tuple(reasons), "no module-level def reward(batch)"),
        )
    elif runs_code:
        kind = ArtifactKind.VERIFIER
        reasons.append(f"runs further code: {', '.join(runs_code[:5])}")
    else:
        kind = ArtifactKind.FUNCTION
        reasons.append("pure function over text")
    if declared is not None and declared in _ORDER and _ORDER[declared] > _ORDER[kind]:
        reasons.append(f"declared ARTIFACT_KIND={declared.value}")
        kind = declared
    return Classification(kind, TIER_OF[kind], digest, tuple(reasons))


def _takes_one_argument(args: ast.arguments) -> bool:
    """Whether ``reward(batch)`` (one positional argument) is a valid call of it."""
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    kw_required = any(d is None for d in args.kw_defaults)
    return (positional >= 1 or args.vararg is not None) and required <= 1 and not kw_required


def _binds_reward_otherwise(node: ast.stmt) -> bool:
    """``reward = lambda ...``, ``reward: T = ...``, ``import x as reward``, ``from m import
    reward``: a name the classifier cannot see is a plain function over text."""
    if isinstance(node, ast.Assign):
        targets = [n for t in node.targets for n in ast.walk(t)]
        return any(isinstance(t, ast.Name) and t.id == "reward" for t in targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return isinstance(node.target, ast.Name) and node.target.id == "reward"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == "reward" for a in node.names)
    return False


def _code_running_uses(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in CODE_RUNNING_MODULES:
                    found.add(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            if mod in CODE_RUNNING_MODULES:
                found.add(f"from {node.module} import")
            if mod == "os" and any(a.name in CODE_RUNNING_OS_ATTRS for a in node.names):
                found.add("from os import exec/spawn/system")
        elif isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in CODE_RUNNING_OS_ATTRS
            ):
                found.add(f"os.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in CODE_RUNNING_BUILTINS:
            found.add(f"{node.id}()")
    return found
