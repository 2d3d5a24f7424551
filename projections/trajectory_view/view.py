"""The trajectory read model: what ``/status``, ``/status-env``, ``/info``, ``/wandb_info``,
``/latest_example`` and ``/batch`` answer, folded from one run's events.

Inputs, in log order: everything on ``runwatch.trajectories`` for the run (registrations,
accepted groups, batch requests, deliveries, resets) interleaved with what the batching
processor derived from each of them (``runwatch.batches``: served, unavailable,
rejected, deduplicated, requeued). The host feeds an input event and then its derived
events, so the view always reflects the batching decisions up to that input.

The view never decides anything: queue membership, steps and batches come from the
processor's derived events; env ids are ordinals of registrations since the last reset,
which is how the processor numbers them too. Payloads of groups not yet delivered live in
a :class:`~projections.trajectory_view.store.PayloadStore` when this instance has them
(it ingested them, or they came inline in an older ``ScoredDataGroupAccepted``); for every
``ScoredDataGroupStored`` group the view also keeps where its payload sits on the log
(:attr:`TrajectoryView.locations`), so the host can fetch what the store lacks.

Time semantics: none; the view is a function of the events it saw.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from events.catalog.trajectory import (
    ScoredDataGroupAccepted,
    ScoredDataGroupStored,
    TrajectoryBatchDelivered,
    TrajectoryBatchRequested,
    TrajectoryBatchRequeued,
    TrajectoryBatchServed,
    TrajectoryDataReset,
    TrajectoryEnvDisconnected,
    TrajectoryEnvRegistered,
    TrajectoryGroupBuffered,
    TrajectoryGroupDeduplicated,
    TrajectoryGroupRejected,
    TrajectoryGroupsAdmitted,
    TrajectoryTrainerRegistered,
)
from events.envelope import EventBase
from projections.trajectory_view.store import MemoryPayloads, PayloadStore

#: Where a payload sits on the log: (partition, offset, length, crc32).
Location = tuple[int, int, int, int]

#: Floor of an env's sampling weight in ``/status-env`` (as the reference server).
MIN_ENV_WEIGHT = 0.01

EMPTY_EXAMPLE: dict[str, list[Any]] = {
    "tokens": [],
    "masks": [],
    "scores": [],
    "advantages": [],
    "ref_logprobs": [],
    "generation_params": [],
    "inference_logprobs": [],
    "messages": [],
    "images": [],
}


class TrajectoryView:
    """The materialized view of one run's trajectory buffer."""

    def __init__(self, payloads: PayloadStore | None = None) -> None:
        self.payloads = payloads if payloads is not None else MemoryPayloads()
        self.reset()

    def reset(self) -> None:
        self.registration: TrajectoryTrainerRegistered | None = None
        self.started = False
        self.step = 0
        self.envs: list[dict[str, Any]] = []
        self.env_of_request: dict[str, int] = {}
        self.queue: dict[str, tuple[int | None, int]] = {}  # group id -> (env, size)
        self.queued_sequences = 0
        self.sizes: Counter[int] = Counter()
        self.reserved: dict[str, tuple[str, ...]] = {}  # request id -> group ids
        self.held: dict[str, tuple[int | None, int]] = {}  # reserved group id -> (env, size)
        self.buffered: dict[str, tuple[int | None, int]] = {}  # size-mismatched, waiting
        self.latest: bytes | None = None
        self.latest_ref: tuple[str, Location] | None = None
        self.locations: dict[str, Location] = {}  # group id -> payload on the log
        self.payloads.clear()
        self.events_seen = 0

    # -- folding --------------------------------------------------------------------------
    def apply(self, ev: EventBase) -> None:
        self.events_seen += 1
        if isinstance(ev, ScoredDataGroupStored):
            where = (ev.payload_partition, ev.payload_offset, ev.payload_bytes, ev.payload_crc)
            self.latest, self.latest_ref = None, (ev.group_id, where)
            if ev.num_sequences >= 1:
                self.locations[ev.group_id] = where
                self._enqueue(ev.group_id, ev.env_id, ev.num_sequences)
        elif isinstance(ev, ScoredDataGroupAccepted):
            payload = ev.payload.encode()
            self.latest, self.latest_ref = payload, None
            if ev.num_sequences >= 1:
                self.payloads.put(ev.group_id, payload)
                self._enqueue(ev.group_id, ev.env_id, ev.num_sequences)
        elif isinstance(ev, TrajectoryBatchServed):
            self.step = ev.step if ev.step is not None else self.step + 1
            for gid in ev.group_ids:
                meta = self._dequeue(gid)
                if meta is not None:
                    self.held[gid] = meta
            self.reserved[ev.request_id or ev.batch_id] = ev.group_ids
        elif isinstance(ev, TrajectoryBatchDelivered):
            delivered = self.reserved.pop(ev.request_id, ())
            for gid in delivered:
                self.held.pop(gid, None)
                self.locations.pop(gid, None)
            self.payloads.drop(delivered)
        elif isinstance(ev, TrajectoryBatchRequeued):
            self.reserved.pop(ev.batch_id, None)
            for gid in ev.group_ids:
                meta = self.held.pop(gid, None)
                if meta is not None:
                    self._enqueue(gid, *meta)
        elif isinstance(ev, TrajectoryGroupBuffered):
            meta = self._dequeue(ev.group_id)
            if meta is not None:
                self.buffered[ev.group_id] = meta
        elif isinstance(ev, TrajectoryGroupsAdmitted):
            for gid in ev.group_ids:
                meta = self.buffered.pop(gid, None)
                if meta is not None:
                    self._enqueue(gid, *meta)
        elif isinstance(ev, (TrajectoryGroupRejected, TrajectoryGroupDeduplicated)):
            self._dequeue(ev.group_id)
            self.locations.pop(ev.group_id, None)
            self.payloads.drop((ev.group_id,))
        elif isinstance(ev, TrajectoryBatchRequested):
            if self.registration is not None:
                self.started = True
        elif isinstance(ev, TrajectoryTrainerRegistered):
            if self.registration is None:
                self.registration = ev
                self.step = ev.starting_step
        elif isinstance(ev, TrajectoryEnvRegistered):
            self._register_env(ev)
        elif isinstance(ev, TrajectoryEnvDisconnected):
            if 0 <= ev.env_id < len(self.envs):
                self.envs[ev.env_id]["connected"] = False
        elif isinstance(ev, TrajectoryDataReset):
            self.reset()

    def _enqueue(self, gid: str, env_id: int | None, size: int) -> None:
        self.queue[gid] = (env_id, size)
        self.queued_sequences += size
        self.sizes[size] += 1

    def _dequeue(self, gid: str) -> tuple[int | None, int] | None:
        meta = self.queue.pop(gid, None)
        if meta is not None:
            self.queued_sequences -= meta[1]
            self.sizes[meta[1]] -= 1
            if not self.sizes[meta[1]]:
                del self.sizes[meta[1]]
        return meta

    def _register_env(self, ev: TrajectoryEnvRegistered) -> None:
        same_name = sum(1 for e in self.envs if e["desired_name"] == ev.desired_name)
        env_id = len(self.envs)
        self.envs.append(
            {
                "max_context_len": ev.max_token_length,
                "weight": ev.weight,
                "desired_name": ev.desired_name,
                "real_name": f"{ev.desired_name}_{same_name}",
                "registered_id": env_id,
                "connected": True,
                "min_batch_allocation": ev.min_batch_allocation,
                "group_size": ev.group_size,
                "max_off_policy_steps": ev.max_off_policy_steps,
            }
        )
        self.env_of_request[ev.request_id] = env_id

    # -- snapshots ------------------------------------------------------------------------
    def dump(self) -> dict[str, Any]:
        """The view as JSON-able data, copied (safe to encode on another thread while
        the view moves on). Payload bytes stay in the store; the host saves its index."""
        reg = self.registration
        return {
            "registration": reg.model_dump(mode="json") if reg is not None else None,
            "started": self.started,
            "step": self.step,
            "envs": [dict(e) for e in self.envs],
            "env_of_request": dict(self.env_of_request),
            "queue": dict(self.queue),
            "reserved": dict(self.reserved),
            "held": dict(self.held),
            "buffered": dict(self.buffered),
            "latest": self.latest.decode() if self.latest is not None else None,
            "latest_ref": self.latest_ref,
            "locations": dict(self.locations),
            "events_seen": self.events_seen,
        }

    def load(self, d: dict[str, Any]) -> None:
        """Restore :meth:`dump` output (the payload store is restored separately)."""
        reg = d["registration"]
        self.registration = TrajectoryTrainerRegistered(**reg) if reg is not None else None
        self.started = d["started"]
        self.step = d["step"]
        self.envs = d["envs"]
        self.env_of_request = d["env_of_request"]
        self.queue = {}
        self.queued_sequences = 0
        self.sizes = Counter()
        for gid, (env_id, size) in d["queue"].items():
            self._enqueue(gid, env_id, size)
        self.reserved = {k: tuple(v) for k, v in d["reserved"].items()}
        self.held = {k: (v[0], v[1]) for k, v in d["held"].items()}
        self.buffered = {k: (v[0], v[1]) for k, v in d["buffered"].items()}
        self.latest = d["latest"].encode() if d["latest"] is not None else None
        ref = d.get("latest_ref")
        self.latest_ref = (ref[0], tuple(ref[1])) if ref is not None else None  # type: ignore[assignment]
        self.locations = {k: tuple(v) for k, v in d.get("locations", {}).items()}  # type: ignore[misc]
        self.events_seen = d["events_seen"]

    # -- answers --------------------------------------------------------------------------
    def batch_body(
        self, group_ids: tuple[str, ...], fetched: Mapping[str, bytes] | None = None
    ) -> bytes:
        """The ``/batch`` response body: the payloads spliced, no re-encoding; ``fetched``
        holds those the host read from the log, the rest come from the store."""
        got = fetched or {}
        parts = [got[g] if g in got else self.payloads.get(g) for g in group_ids]
        return b'{"batch":[' + b",".join(parts) + b"]}"

    def env_answer(self, request_id: str) -> dict[str, Any]:
        env_id = self.env_of_request[request_id]
        reg = self.registration
        return {
            "status": "success",
            "env_id": env_id,
            "wandb_name": self.envs[env_id]["real_name"],
            "checkpoint_dir": reg.checkpoint_dir if reg else "",
            "starting_step": self.step,
            "checkpoint_interval": reg.save_checkpoint_interval if reg else -1,
            "num_steps": reg.num_steps if reg else -1,
        }

    def status(self) -> dict[str, int]:
        return {"current_step": self.step, "queue_size": len(self.queue)}

    def info(self) -> dict[str, int]:
        reg = self.registration
        if reg is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {"batch_size": reg.batch_size, "max_token_len": reg.max_token_len}

    def wandb_info(self) -> dict[str, str | None]:
        reg = self.registration
        return {
            "group": reg.wandb_group if reg else None,
            "project": reg.wandb_project if reg else None,
        }

    def status_env(self, env_id: int) -> dict[str, Any]:
        """The reference server's ``/status-env`` figures (without its side effect of
        rewriting the env's group size on a GET). KeyError for an unknown env."""
        if not 0 <= env_id < len(self.envs):
            raise KeyError(env_id)
        me = self.envs[env_id]
        connected = [e for e in self.envs if e["connected"]]
        total = sum(e["max_context_len"] * max(0.0, e["weight"]) for e in connected)
        weight = me["max_context_len"] * me["weight"] / total if total > 0 else 1.0
        weight = max(MIN_ENV_WEIGHT, weight)
        total_min = sum(e["min_batch_allocation"] or 0.0 for e in connected)
        group_size = me["group_size"]
        max_group = max([1, *self.sizes])
        mine = 0
        others: Counter[int | None] = Counter()
        for gid_env, size in self.queue.values():
            if gid_env == env_id:
                group_size = max(group_size, size)
                mine += size
            else:
                others[gid_env] += size
        batch_size = self.registration.batch_size if self.registration else 0
        mins = {
            e["registered_id"]: int(batch_size * e["min_batch_allocation"])
            for e in connected
            if e["min_batch_allocation"] is not None
        }
        available = 0
        if max_group > 1:
            for other, seqs in others.items():
                packed = math.ceil(seqs / max_group) * max_group
                available += max(0, packed - mins.get(other, 0))  # type: ignore[arg-type]
        group_size = max(group_size, 1)
        return {
            "current_step": self.step,
            "queue_size": (mine + available) // group_size,
            "unallocated_fraction": 1.0 - min(total_min, 1.0),
            "self_queue_size": mine // group_size,
            "max_group_size": max_group,
            "env_weight": weight,
        }
