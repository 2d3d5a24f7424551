"""The published contract holds for a real log, checked without pydantic.

``runwatch schema export`` (a real process) writes the JSON Schemas and the AsyncAPI
document; ``runwatch demo --short`` over three runs (real trainers, processors and
projections; ``consumer_demo_log`` in conftest.py) writes a log. Every record of that
log — events of every topic, dead letters included — is parsed with ``json`` and
validated with the ``jsonschema`` package against the schema its ``type`` names (and the
``oneOf`` union, and the copy embedded in the AsyncAPI document). Old versions: the
demo's v2 records of every upcast type, written back as a v1 producer wrote them, are
refused by the current schema and validate once the exported upcasting rules are applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource

from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC, TOPICS
from events.upcasting import ROLLOUT_V2_FIELDS, upcast

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
#: Fields RunPaused gained in v3 (what a v2 producer did not write) and in v4.
RUN_PAUSED_V3 = ("requested_by", "alert_id")
RUN_PAUSED_V4 = ("refuses_stale_resume",)
#: Fields each upcast type gained since v1 (what a v1 producer did not write).
ADDED_IN_V2 = {
    "RunPaused": ("checkpoint", "request_id", *RUN_PAUSED_V3, *RUN_PAUSED_V4),
    "RunResumed": ("checkpoint", "request_id", "rolled_back_to"),
    "RunCancelled": ("request_id",),
    "RolloutBatchCompleted": ROLLOUT_V2_FIELDS,
    "TenantUsageUpdated": ("device_seconds_by_kind",),
}


def _usage_as(version: int) -> Callable[[dict], dict]:
    """A current UsageRecorded as a v1 (no pool) or v2 producer wrote it (gpu_seconds)."""

    def old(body: dict) -> dict:
        out = {k: v for k, v in body.items() if k not in ("device_kind", "device_seconds")}
        out["gpu_seconds"] = body["device_seconds"]
        if version == 1:
            del out["pool"]
        return out

    return old


def _without(fields: tuple[str, ...]) -> Callable[[dict], dict]:
    return lambda body: {k: v for k, v in body.items() if k not in fields}


#: (type, old version) -> how a producer of that version wrote a current record.
OLD_VERSIONS: dict[tuple[str, int], Callable[[dict], dict]] = {
    ("UsageRecorded", 1): _usage_as(1),
    ("UsageRecorded", 2): _usage_as(2),
    ("RunPaused", 2): _without(RUN_PAUSED_V3 + RUN_PAUSED_V4),
    ("RunPaused", 3): _without(RUN_PAUSED_V4),
    **{(t, 1): _without(fields) for t, fields in ADDED_IN_V2.items()},
}


def _runwatch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=1000,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contract") / "schema"
    summary = json.loads(
        _runwatch("schema", "export", "--out", str(out), "--json", cwd=ROOT).stdout
    )
    assert summary["event_types"] >= 50 and summary["upcasting_rules"] >= 4
    return out


@pytest.fixture(scope="module")
def demo_log(consumer_demo_log: Path) -> Path:
    return consumer_demo_log


def _schemas(contract: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((contract / "events").glob("*.schema.json")):
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        out[path.name.split(".v")[0]] = schema
    return out


def test_every_demo_record_validates_with_jsonschema(contract: Path, demo_log: Path) -> None:
    schemas = _schemas(contract)
    validators = {t: jsonschema.Draft202012Validator(s) for t, s in schemas.items()}
    registry = Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in schemas.values()
    )
    union = jsonschema.Draft202012Validator(
        json.loads((contract / "event.schema.json").read_text()), registry=registry
    )
    asyncapi = json.loads((contract / "asyncapi.json").read_text())
    embedded = {
        t: jsonschema.Draft202012Validator(s) for t, s in asyncapi["components"]["schemas"].items()
    }
    log = EmbeddedLog(demo_log, readonly=True)
    log.open_sync()
    seen: Counter[str] = Counter()
    written_old: Counter[str] = Counter()
    for topic in log.topic_names():
        for rec in log.read_sync(topic):
            body = json.loads(rec.value)  # NaN / Infinity tokens: Python's json reads them
            kind = "DeadLetter" if topic == DEAD_LETTER_TOPIC else body["type"]
            current = schemas[kind].get("x-runwatch-schema-version", 1)
            if body.get("schema_version", 1) < current:  # written at an older version
                written_old[kind] += 1  # (it carries nothing newer): read it upcast
                body = upcast(body, current)
            validators[kind].validate(body)
            embedded[kind].validate(body)
            if kind != "DeadLetter":
                assert schemas[kind]["x-runwatch-topic"] == topic
                assert rec.key == body["run_id"].encode()
                if seen[kind] < 3:  # the union dispatches by tag (slower: a sample)
                    union.validate(body)
            seen[kind] += 1
    assert sum(seen.values()) > 500, seen  # ~800 records: 3 short runs, 2 cancelled early
    assert {
        "TrainerStepCompleted",
        "AlertFired",
        "RunStateChanged",
        "CheckpointWritten",
        "RunPaused",
        "RunResumed",
        "RunCancelled",
        "UsageRecorded",
    } <= set(seen), seen
    assert set(written_old) <= {"RunPaused", "UnpauseRequested"}, written_old  # downcast
    print(f"\nvalidated {sum(seen.values())} records of {len(seen)} types with jsonschema")


def test_old_versions_validate_after_upcasting(contract: Path, demo_log: Path) -> None:
    schemas = _schemas(contract)
    rules = json.loads((contract / "upcasting.json").read_text())["rules"]
    assert {(r["type"], r["from_version"]) for r in rules} >= set(OLD_VERSIONS)
    assert all(r["rule"] for r in rules), "every upcasting rule is documented"
    log = EmbeddedLog(demo_log, readonly=True)
    log.open_sync()
    checked: Counter[tuple[str, int]] = Counter()
    for topic in log.topic_names():
        for rec in log.read_sync(topic):
            body = json.loads(rec.value)
            for (kind, version), as_old in OLD_VERSIONS.items():
                if body.get("type") != kind or checked[kind, version] >= 20:
                    continue
                old = as_old(body)
                old["schema_version"] = version
                validator = jsonschema.Draft202012Validator(schemas[kind])
                assert not validator.is_valid(old), "an old record must not pass as current"
                current = upcast(old, schemas[kind]["x-runwatch-schema-version"])
                validator.validate(current)
                if kind == "UsageRecorded":  # what v1/v2 metered reads as GPU time
                    assert current["device_kind"] == "gpu"
                    assert current["device_seconds"] == body["device_seconds"]
                checked[kind, version] += 1
    assert set(checked) == set(OLD_VERSIONS), checked


def test_asyncapi_names_every_topic_and_event_once(contract: Path) -> None:
    doc = json.loads((contract / "asyncapi.json").read_text())
    assert doc["asyncapi"] == "3.0.0"
    channels = {c["address"]: c for c in doc["channels"].values()}
    assert set(channels) == set(TOPICS)
    placed: Counter[str] = Counter()
    for topic, channel in channels.items():
        kafka = channel["bindings"]["kafka"]
        assert kafka["partitions"] == TOPICS[topic].partitions
        assert channel["x-runwatch-key"] == "run_id"
        for name, ref in channel["messages"].items():
            assert ref["$ref"] == f"#/components/messages/{name}"
            assert name in doc["components"]["messages"]
            placed[name] += 1
    schemas = _schemas(contract)
    assert set(placed) == set(schemas) and set(placed.values()) == {1}
    for op in doc["operations"].values():
        channel_id = op["channel"]["$ref"].rsplit("/", 1)[1]
        assert channel_id in doc["channels"]
