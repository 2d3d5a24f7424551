"""The topic registry: every topic runwatch writes, declared once.

Key: every record is keyed by ``run_id`` so one run's events stay ordered on one
partition. Retention classes (principle 7, cardinality is designed):

- ``short``: per-step mechanics and high-volume traces (days);
- ``long``: algorithmic health, lifecycle, money, alerts, the audit trail (a year);
- ``compacted``: latest-value-per-key views (the newest record per run is kept forever).

Why one telemetry topic: detectors fold a run's trainer steps, rollout quality, eval
gates and usage together, and their output must not depend on how a host interleaves
topics. On one topic keyed by ``run_id`` those facts are totally ordered per run on one
partition, so the faust host and the embedded host see the same sequence.

The embedded log keeps every topic in one partition (total order); Kafka uses
``partitions`` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Retention = Literal["short", "long", "compacted"]

#: Retention in milliseconds per class (``None``: compacted, never deleted by age).
RETENTION_MS: dict[Retention, int | None] = {
    "short": 7 * 24 * 3600 * 1000,
    "long": 365 * 24 * 3600 * 1000,
    "compacted": None,
}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    retention: Retention
    description: str
    key: str = "run_id"


_SPECS = (
    TopicSpec("runwatch.lifecycle", 3, "long", "run lifecycle: submitted .. completed/failed"),
    TopicSpec(
        "runwatch.control",
        3,
        "long",
        "commands to runs (pause / resume / cancel requested, by whom and why) and their "
        "rejections; the trainer follows its run's commands here",
    ),
    TopicSpec(
        "runwatch.telemetry",
        3,
        "long",
        "one run's health telemetry, totally ordered: trainer steps, phase timings, weight "
        "syncs, rollout batch quality, eval gates, usage",
    ),
    TopicSpec("runwatch.traces", 6, "short", "per-request rollout trace events"),
    TopicSpec("runwatch.rewards", 3, "long", "reward batch outcomes: the per-cause ledger"),
    TopicSpec("runwatch.checkpoints", 3, "long", "checkpoints written, resumes certified"),
    TopicSpec("runwatch.trajectories", 6, "short", "scored groups accepted by the trajectory API"),
    TopicSpec(
        "runwatch.trajectory-payloads",
        6,
        "short",
        "payload bytes of accepted scored groups (their ordered metadata: runwatch.trajectories)",
    ),
    TopicSpec("runwatch.batches", 6, "short", "trajectory batches served to trainers"),
    TopicSpec("runwatch.alerts", 3, "long", "derived: alert fired / resolved"),
    TopicSpec("runwatch.run-states", 3, "long", "derived: append-only customer run states"),
    TopicSpec("runwatch.tenant-usage", 3, "compacted", "derived: running spend per run"),
    TopicSpec("runwatch.profiles", 3, "short", "derived: rollout profiles, stragglers"),
    TopicSpec(
        "runwatch.notifications",
        3,
        "long",
        "derived: customer webhook deliveries (every attempt, delivered, abandoned)",
    ),
    TopicSpec("runwatch.dead-letters", 1, "long", "records that failed to decode, with reason"),
)

TOPICS: dict[str, TopicSpec] = {spec.name: spec for spec in _SPECS}
DEAD_LETTER_TOPIC = "runwatch.dead-letters"


def spec(name: str) -> TopicSpec:
    """The spec of a registered topic; a clear error for an unknown name."""
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; registered: {', '.join(TOPICS)}") from None


def register(topic: TopicSpec) -> None:
    """Declare one more topic (the events package itself registers all of its own)."""
    if topic.name in TOPICS and TOPICS[topic.name] != topic:
        raise ValueError(f"topic {topic.name!r} already registered differently")
    TOPICS[topic.name] = topic
