"""Checkpoints that cannot lie: versioned, digested, published atomically.

Layout of one checkpoint (a directory ``step-00000040`` under ``<run_dir>/checkpoints``)::

    data.bin     every part serialized (torch.save, weights-only loadable), back to back
    .metadata    JSON: schema, step, run, tenant, submission, pins, and per part
                 {offset, size, digest}

Write protocol (torch.distributed.checkpoint's ``_FileSystemWriter.finish`` shape):

1. the parts are serialized and ``data.bin`` is written and fsync'd;
2. the metadata goes to ``.metadata.tmp``, is fsync'd, then renamed to ``.metadata``,
   and the directory is fsync'd;
3. only then does the caller publish ``CheckpointWritten``.

A checkpoint without ``.metadata`` does not exist (:func:`list_checkpoints` skips it), so a
crash anywhere before the rename leaves the previous checkpoint the newest loadable one.
Assumptions: ``rename`` within a directory is atomic and ``fsync`` is honoured by the
filesystem; with both, a reader sees either the whole checkpoint or none of it.

Verification on load (:func:`read_checkpoint`), before anything is trusted:

- the metadata must parse and carry this module's :data:`SCHEMA_VERSION`, else
  :class:`SchemaMismatch` (never loaded);
- the metadata's own digest (sha256), ``data.bin``'s size and every part's sentinel
  digest must match, else :class:`CorruptCheckpoint` (a flipped byte or a truncated file).

Sentinel algorithm: ``crc32`` by default, ``sha256`` on request; the value is prefixed with
its algorithm (``crc32:1a2b3c4d``). The digests sit unsigned next to the data, so they
detect corruption, not tampering (whoever can rewrite ``data.bin`` can rewrite
``.metadata``); for that job CRC-32 is the usual tool (Kafka and the embedded log use it)
and it is ~4x cheaper than SHA-256 here: 0.12 vs 0.41 ms for an 830 KB checkpoint, which
is what keeps the digests under 2 % of the save (benchmarks/trainer_bench.py).

Whose checkpoint it is: the metadata names the run (``run_id``), its tenant (``tenant_id``)
and the run's ``RunSubmitted`` event id (``submitted_id``, when the trainer published one).
:func:`identity_mismatch` says why a checkpoint is not the run's own; the resume gate never
loads such a one. These two fields came after schema 1 was released, as optional keys
(older readers ignore them, the metadata digest covers them): a checkpoint without them
(:attr:`CheckpointInfo.legacy`) was written by an earlier release and is taken on its run
id alone, unless it was created before the run was submitted.

Parts are deserialized with ``weights_only=True``: a checkpoint can carry tensors and
plain containers, never code. Tensors load onto the CPU whatever device wrote them, so a
GPU run's checkpoint reads (inspect, the resume gate's checks) on a host without one;
``load_state_dict`` of each part moves them onto the trainer's device.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

#: Bump on any change of the part layout; a mismatch is refused, never loaded.
SCHEMA_VERSION = 1
META = ".metadata"
DATA = "data.bin"


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint's protocol: every resumable part implements it."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class CheckpointError(Exception):
    reason = "corrupt"


class SchemaMismatch(CheckpointError):
    reason = "schema_mismatch"


class CorruptCheckpoint(CheckpointError):
    reason = "corrupt"


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``.metadata`` says (verified against the data when read)."""

    path: Path
    schema: int
    step: int
    run_id: str
    pins: dict[str, str]
    parts: dict[str, dict[str, Any]]
    digest: str
    size_bytes: int
    created_ts: float
    extra: dict[str, Any]
    #: the run's tenant; None: written by a release before tenants were recorded
    tenant_id: str | None = None
    #: the event id of the run's ``RunSubmitted``; None: unknown (an earlier release, or a
    #: trainer that published nothing)
    submitted_id: str | None = None

    @property
    def legacy(self) -> bool:
        """Written by an earlier release: no tenant recorded (see the module docstring)."""
        return self.tenant_id is None

    @property
    def sentinels(self) -> dict[str, str]:
        return {name: p["digest"] for name, p in self.parts.items()}


@dataclass(frozen=True)
class SaveResult:
    info: CheckpointInfo
    serialize_s: float
    digest_s: float
    write_s: float
    total_s: float


DigestAlgo = Literal["crc32", "sha256", "none"]


def part_digest(blob: bytes, algo: str) -> str:
    """``algo:hex`` of ``blob``; ``none`` gives ``""`` (benchmark only, never loads)."""
    if algo == "crc32":
        return f"crc32:{zlib.crc32(blob):08x}"
    if algo == "sha256":
        return "sha256:" + hashlib.sha256(blob).hexdigest()
    if algo == "none":
        return ""
    raise ValueError(f"unknown digest algorithm {algo!r}")


def _meta_digest(meta: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def serialize_parts(state: Mapping[str, Any]) -> dict[str, bytes]:
    """Each top-level part to bytes (``Stateful`` values are asked for their state)."""
    out: dict[str, bytes] = {}
    for name, part in state.items():
        value = part.state_dict() if isinstance(part, Stateful) else part
        buf = io.BytesIO()
        torch.save(value, buf)
        out[name] = buf.getvalue()
    return out


def write_checkpoint(
    directory: Path,
    *,
    step: int,
    run_id: str,
    state: Mapping[str, Any],
    pins: Mapping[str, str],
    digest: DigestAlgo = "crc32",
    extra: Mapping[str, Any] | None = None,
    schema: int = SCHEMA_VERSION,
    before_publish: Callable[[], None] | None = None,
    tenant_id: str | None = None,
    submitted_id: str | None = None,
) -> SaveResult:
    """Write ``state`` (part name -> Stateful or plain value) as one checkpoint.

    ``tenant_id`` and ``submitted_id`` (the run's ``RunSubmitted`` event id) are recorded
    when given (the trainer always gives its tenant); None leaves the key out, as an
    earlier release wrote it.

    ``before_publish`` runs after the data and the temp metadata are durable and before
    the rename (tests use it to crash there). ``digest="none"`` writes empty sentinels;
    it exists only to measure what the digests cost and such a checkpoint never loads.
    Raises ``FileExistsError`` if a published checkpoint is already at ``directory``.
    """
    t0 = time.perf_counter()
    if (directory / META).exists():
        raise FileExistsError(f"checkpoint {directory} already exists")
    directory.mkdir(parents=True, exist_ok=True)
    blobs = serialize_parts(state)
    t1 = time.perf_counter()
    # Sentinels are computed on a helper thread while this one writes and fsyncs the data
    # (zlib and hashlib release the GIL on large buffers): with a free core the digests
    # add CPU, not latency. ``digest_s`` counts only the wait for them after the fsync.
    digests: list[str] = []
    hasher = threading.Thread(
        target=lambda: digests.extend(part_digest(b, digest) for b in blobs.values()),
        daemon=True,
    )
    if digest == "none":  # the benchmark's baseline: no thread, no digest
        digests.extend("" for _ in blobs)
    else:
        hasher.start()
    with open(directory / DATA, "wb") as f:
        for blob in blobs.values():
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    t2 = time.perf_counter()
    if digest != "none":
        hasher.join()
    t2b = time.perf_counter()
    parts: dict[str, dict[str, Any]] = {}
    offset = 0
    for d, (name, blob) in zip(digests, blobs.items()):
        parts[name] = {"offset": offset, "size": len(blob), "digest": d}
        offset += len(blob)
    meta: dict[str, Any] = {
        "schema": schema,
        "step": step,
        "run_id": run_id,
        "pins": dict(pins),
        "parts": parts,
        "size_bytes": offset,
        "created_ts": time.time(),
        "extra": dict(extra or {}),
    }
    if tenant_id is not None:
        meta["tenant_id"] = tenant_id
    if submitted_id is not None:
        meta["submitted_id"] = submitted_id
    t3 = time.perf_counter()
    meta["digest"] = _meta_digest(meta) if digest != "none" else ""
    t4 = time.perf_counter()
    tmp = directory / (META + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    if before_publish is not None:
        before_publish()
    os.replace(tmp, directory / META)
    _fsync_dir(directory)
    _fsync_dir(directory.parent)  # the new step directory's own entry, before we announce it
    t5 = time.perf_counter()
    info = _info(directory, meta)
    return SaveResult(info, t1 - t0, (t2b - t2) + (t4 - t3), (t2 - t1) + (t5 - t4), t5 - t0)


def _info(directory: Path, meta: Mapping[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        path=directory,
        schema=int(meta["schema"]),
        step=int(meta["step"]),
        run_id=str(meta["run_id"]),
        pins={str(k): str(v) for k, v in meta["pins"].items()},
        parts={str(k): dict(v) for k, v in meta["parts"].items()},
        digest=str(meta["digest"]),
        size_bytes=int(meta["size_bytes"]),
        created_ts=float(meta["created_ts"]),
        extra=dict(meta.get("extra", {})),
        tenant_id=None if meta.get("tenant_id") is None else str(meta["tenant_id"]),
        submitted_id=None if meta.get("submitted_id") is None else str(meta["submitted_id"]),
    )


def read_metadata(directory: Path) -> CheckpointInfo:
    """Parse ``.metadata`` and check schema and its own digest (not the data yet)."""
    try:
        meta = json.loads((directory / META).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{directory}: no {META} (never published)") from None
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"{directory}: unreadable metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(f"{directory}: metadata is not an object")
    schema = meta.get("schema")
    if schema != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"{directory}: checkpoint schema {schema!r}, this trainer reads {SCHEMA_VERSION}"
        )
    try:
        if meta.get("digest") != _meta_digest(meta):
            raise CorruptCheckpoint(f"{directory}: metadata digest mismatch")
        return _info(directory, meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(f"{directory}: malformed metadata: {exc}") from None


def _verified_blobs(directory: Path) -> tuple[CheckpointInfo, dict[str, bytes]]:
    info = read_metadata(directory)
    try:
        data = (directory / DATA).read_bytes()
    except OSError as exc:
        raise CorruptCheckpoint(f"{directory}: cannot read {DATA}: {exc}") from None
    if len(data) != info.size_bytes:
        raise CorruptCheckpoint(
            f"{directory}: {DATA} is {len(data)} bytes, metadata says {info.size_bytes} "
            "(truncated or overwritten)"
        )
    out: dict[str, bytes] = {}
    try:
        for name, p in info.parts.items():
            blob = data[p["offset"] : p["offset"] + p["size"]]
            algo = str(p.get("digest", "")).partition(":")[0]
            if algo not in ("crc32", "sha256") or part_digest(blob, algo) != p["digest"]:
                raise CorruptCheckpoint(f"{directory}: sentinel digest mismatch in part {name!r}")
            out[name] = blob
    except (KeyError, TypeError) as exc:
        raise CorruptCheckpoint(f"{directory}: malformed part entry: {exc}") from None
    return info, out


def verify_checkpoint(directory: Path) -> CheckpointInfo:
    """Every check of :func:`read_checkpoint` (schema, metadata digest, size, every
    sentinel) without deserializing a part. Raises :class:`CheckpointError`."""
    return _verified_blobs(directory)[0]


def read_checkpoint(directory: Path) -> tuple[CheckpointInfo, dict[str, Any]]:
    """Verify everything, then deserialize every part. Raises :class:`CheckpointError`."""
    info, blobs = _verified_blobs(directory)
    out = {
        name: torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        for name, blob in blobs.items()
    }
    return info, out


#: how far before its run's submission a legacy checkpoint may claim to have been created
#: (clock granularity between the RunSubmitted stamp and the checkpoint's own)
SUBMISSION_SLACK_S = 1.0


def identity_mismatch(
    info: CheckpointInfo,
    run_id: str,
    tenant_id: str,
    submitted_id: str | None = None,
    submitted_ts: float | None = None,
) -> str:
    """Why the checkpoint ``info`` is not run ``run_id``'s of tenant ``tenant_id`` (whose
    ``RunSubmitted`` has id ``submitted_id`` and stamp ``submitted_ts``); "" when it is.

    Compared: the run id always; the tenant when the checkpoint records one; the
    submission when both sides know it (two logs can each hold a run of the same id and
    tenant: only the submission tells them apart). A legacy checkpoint (no tenant
    recorded: an earlier release) is taken on its run id, and refused only when it was
    created more than :data:`SUBMISSION_SLACK_S` before the run was submitted: a run's own
    checkpoints are written after its ``RunSubmitted`` by the same process and clock, so
    an older one is another run's left in a shared directory. (A clock stepped back
    between the two would refuse a good legacy checkpoint; the gate then falls back, it
    does not load the wrong state.)
    """
    if info.run_id != run_id:
        return f"written by run {info.run_id!r}, not by run {run_id!r}"
    if info.tenant_id is not None and info.tenant_id != tenant_id:
        return (
            f"written by tenant {info.tenant_id!r}'s run {info.run_id!r}, "
            f"not by tenant {tenant_id!r}'s"
        )
    if info.submitted_id is not None and submitted_id and info.submitted_id != submitted_id:
        return (
            f"written by another submission of run {run_id!r} (RunSubmitted "
            f"{info.submitted_id}, this run's is {submitted_id})"
        )
    too_old = submitted_ts is not None and info.created_ts < submitted_ts - SUBMISSION_SLACK_S
    if info.legacy and too_old:
        return (
            f"created at {info.created_ts:.3f}, before run {run_id!r} was submitted "
            f"({submitted_ts:.3f}): another run's checkpoint (an earlier release's, "
            "which records no tenant)"
        )
    return ""


def set_aside(checkpoints: Iterable[Path], into: Path) -> list[Path]:
    """Move ``checkpoints`` (whole step directories) into ``into`` (created when there is
    one to move): kept for the audit, out of the list :func:`list_checkpoints` reads. A
    rename within one filesystem, so a reader sees each checkpoint here or there, never
    half. The new paths."""
    moved = []
    for cand in checkpoints:
        if not cand.is_dir():
            continue
        into.mkdir(parents=True, exist_ok=True)
        dst = into / cand.name
        shutil.move(str(cand), str(dst))
        moved.append(dst)
    return moved


def list_checkpoints(root: Path) -> list[Path]:
    """Published checkpoint directories under ``root``, newest step first.

    Directories without ``.metadata`` (an interrupted write) are not checkpoints.
    """
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if d.is_dir() and (d / META).exists()]
    return sorted(found, key=lambda d: d.name, reverse=True)


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (metadata first, so a crash
    mid-delete leaves an unpublished directory, never a half checkpoint)."""
    removed = []
    for d in list_checkpoints(root)[keep:]:
        (d / META).unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def rewrite_checkpoint(
    src: Path,
    dst: Path,
    transform: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    schema: int = SCHEMA_VERSION,
    pins: Mapping[str, str] | None = None,
) -> CheckpointInfo:
    """Re-serialize ``src`` through ``transform`` into ``dst`` with *valid* digests.

    Simulates a buggy writer (a part dropped or reset) whose output looks intact: only
    the resume gate's replay can catch it. Used by tests and fault drills.
    """
    info, parts = read_checkpoint(src)
    if dst.exists():
        shutil.rmtree(dst)
    return write_checkpoint(
        dst,
        step=info.step,
        run_id=info.run_id,
        state=transform(parts),
        pins=info.pins if pins is None else pins,
        extra=info.extra,
        schema=schema,
        tenant_id=info.tenant_id,
        submitted_id=info.submitted_id,
    ).info
