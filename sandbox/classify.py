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

A declared ``ARTIFACT_KIND`` can only move an artifact *up* the ladder, never down. The
classification picks recycling cadence and failure policy; it is not the security boundary
(a determined author hides an import: ``getattr(builtins, "__imp" + "ort__")("ctypes")``
is classified ``function``), which is why every tier requires the same isolation layers
(:data:`sandbox.features.REQUIRED_LAYERS`): a host that cannot give the verifier tier
its layers refuses the function tier too.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from sandbox.types import ArtifactKind, Tier

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


def classify_path(path: Path) -> Classification:
    """Classify a file or directory on disk (reads it; never executes it)."""
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
        data = path.read_bytes()
    except OSError as exc:
        return Classification(
            ArtifactKind.INVALID, None, "", (f"cannot read {path}: {exc}",), readable=False
        )
    return classify_bytes(path.name, data)


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
    except (RecursionError, MemoryError):
        return Classification(
            ArtifactKind.INVALID, None, digest, ("does not parse: nested too deeply",)
        )
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
