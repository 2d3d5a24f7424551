"""The published event contract: JSON Schema per event type, the upcasting rules, and an
AsyncAPI 3.0 document of the topics — generated from the pydantic models and the topic
registry, so the contract cannot drift from the code that writes the log.

What a record on the wire is (:mod:`events.codec`): one UTF-8 JSON object, the envelope
and the payload side by side, keyed by ``run_id``; ``type`` says which schema applies,
``schema_version`` which version of it. Schemas describe the *serialized* form (what is
on the log): attribute maps are JSON objects of scalars, ids are UUID strings. Every
field is always written; fields with a default may be absent in a record of the same
version written by an older producer, so only the fields without one are ``required``.

Non-finite numbers: a metric can be NaN or infinite, and the codec writes the JSON
tokens ``NaN``, ``Infinity``, ``-Infinity`` (not strict JSON). Consumers parse with a
lenient reader (see docs/event-contract.md); the schemas say ``number`` for them.

Versions: a schema file is named ``<Type>.v<N>.schema.json`` for the current version N.
Older versions are not re-described: a reader meeting ``schema_version`` < N applies the
upcasting rules (:func:`upcasting_rules`) in order, as :func:`events.codec.decode` does,
and then validates against version N. A record newer than the reader's N is refused.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from typing import Any

from events import catalog  # noqa: F401  (registers every event type)
from events.dead_letter import DeadLetter
from events.envelope import Attributes, EventBase, event_classes
from events.topics import DEAD_LETTER_TOPIC, RETENTION_MS, TOPICS
from events.upcasting import DOWNCASTERS, UPCASTERS

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: A scalar value of an attribute map, as written.
SCALAR_TYPES = ["string", "number", "integer", "boolean", "null"]
ENVELOPE_FIELDS = tuple(EventBase.model_fields)
_ATTRIBUTE_METADATA = typing.get_args(Attributes)[1:]


def schema_file(name: str, version: int) -> str:
    return f"{name}.v{version}.schema.json"


def event_schema(cls: type[EventBase]) -> dict[str, Any]:
    """The JSON Schema of the records of ``cls`` at its current version."""
    schema = cls.model_json_schema(mode="serialization")
    version = cls.SCHEMA_VERSION
    props = schema["properties"]
    props["schema_version"] = {
        "const": version,
        "description": f"payload version; readers upcast older ones (v{version} is current)",
        "title": "Schema Version",
        "type": "integer",
    }
    for name, field in cls.model_fields.items():
        if all(m in field.metadata for m in _ATTRIBUTE_METADATA):
            props[name] = {
                **{k: v for k, v in props[name].items() if k != "additionalProperties"},
                "additionalProperties": {"type": SCALAR_TYPES},
            }
    required = list(schema.get("required", []))
    for name in ("type", "schema_version"):
        if name not in required:
            required.insert(0, name)
    schema["required"] = required
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:runwatch:event:{cls.__name__}:v{version}",
        **schema,
        "x-runwatch-topic": cls.TOPIC,
        "x-runwatch-key": "run_id",
        "x-runwatch-schema-version": version,
    }


def dead_letter_schema() -> dict[str, Any]:
    schema = DeadLetter.model_json_schema(mode="serialization")
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": "urn:runwatch:dead-letter:v1",
        **schema,
        "x-runwatch-topic": DEAD_LETTER_TOPIC,
        "x-runwatch-key": None,
    }


def event_schemas() -> dict[str, dict[str, Any]]:
    """Every event type's schema by type name, sorted."""
    return {name: event_schema(cls) for name, cls in sorted(event_classes().items())}


def union_schema(versions: Mapping[str, int]) -> dict[str, Any]:
    """Any record: one of the per-type schemas (``versions``: type -> current version),
    referenced by their ``$id``; each has a ``const`` ``type`` tag, so one matches."""
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": "urn:runwatch:event",
        "title": "runwatch event",
        "description": (
            "Dispatch on the `type` field. Each $ref is the $id of a per-type schema "
            "(events/<Type>.v<N>.schema.json): load those into your validator's registry."
        ),
        "oneOf": [{"$ref": f"urn:runwatch:event:{t}:v{v}"} for t, v in sorted(versions.items())],
    }


def upcasting_rules() -> list[dict[str, Any]]:
    """Each registered upcaster: type, from -> to version, and its rule in words; and,
    where writers still write the older version, when (``written_as_from_version``: a
    record of ``to_version`` that carries nothing new is written as ``from_version``, so
    consumers of earlier releases keep reading it; '' when never)."""
    rules = []
    for (event_type, from_version), fn in sorted(UPCASTERS.items()):
        down = DOWNCASTERS.get((event_type, from_version + 1))
        rules.append(
            {
                "type": event_type,
                "from_version": from_version,
                "to_version": from_version + 1,
                "rule": " ".join((fn.__doc__ or "").split()),
                "current_version": event_classes()[event_type].SCHEMA_VERSION,
                "written_as_from_version": " ".join((down.__doc__ or "").split()) if down else "",
            }
        )
    return rules


def asyncapi(version: str = "1.0.0") -> dict[str, Any]:
    """An AsyncAPI 3.0 document: one channel per topic (address, partitions, retention,
    key) listing the event types published on it, payloads embedded as schemas."""
    classes = event_classes()
    by_topic: dict[str, list[str]] = {}
    for name, cls in sorted(classes.items()):
        by_topic.setdefault(cls.TOPIC, []).append(name)
    by_topic.setdefault(DEAD_LETTER_TOPIC, []).append("DeadLetter")
    schemas: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for name, cls in sorted(classes.items()):
        schemas[name] = _embedded(event_schema(cls))
        messages[name] = {
            "name": name,
            "title": name,
            "summary": (cls.__doc__ or name).strip().splitlines()[0],
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{name}"},
            "bindings": {"kafka": {"key": _KEY_SCHEMA, "bindingVersion": "0.5.0"}},
            "x-runwatch-schema-version": cls.SCHEMA_VERSION,
        }
    schemas["DeadLetter"] = _embedded(dead_letter_schema())
    messages["DeadLetter"] = {
        "name": "DeadLetter",
        "title": "DeadLetter",
        "summary": "A record that failed to decode or validate, with the reason and raw bytes.",
        "contentType": "application/json",
        "payload": {"$ref": "#/components/schemas/DeadLetter"},
    }
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for topic, spec in TOPICS.items():
        names = by_topic.get(topic, [])
        channel_id = topic.replace("runwatch.", "").replace("-", "_")
        retention = RETENTION_MS[spec.retention]
        config: dict[str, Any] = {
            "cleanup.policy": ["compact"] if spec.retention == "compacted" else ["delete"]
        }
        if retention is not None:
            config["retention.ms"] = retention
        channels[channel_id] = {
            "address": topic,
            "title": topic,
            "description": spec.description,
            "messages": {n: {"$ref": f"#/components/messages/{n}"} for n in names},
            "bindings": {
                "kafka": {
                    "topic": topic,
                    "partitions": spec.partitions,
                    "topicConfiguration": config,
                    "bindingVersion": "0.5.0",
                }
            },
            "x-runwatch-retention-class": spec.retention,
            "x-runwatch-key": spec.key,
        }
        if names:
            operations[f"consume_{channel_id}"] = {
                "action": "receive",
                "channel": {"$ref": f"#/channels/{channel_id}"},
                "summary": f"Read {topic}, dispatching on each record's `type`.",
                "messages": [{"$ref": f"#/channels/{channel_id}/messages/{n}"} for n in names],
            }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "runwatch event log",
            "version": version,
            "description": (
                "Every fact of a managed RL post-training run: lifecycle, telemetry, "
                "rewards, checkpoints, derived alerts and run states. Records are UTF-8 "
                "JSON keyed by run_id (one run's records are ordered on one partition); "
                "`type` selects the payload schema, `schema_version` its version (older "
                "versions are upcast, see upcasting.json). Non-finite numbers are "
                "written as the tokens NaN / Infinity / -Infinity."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "kafka": {
                "host": "localhost:9092",
                "protocol": "kafka",
                "description": "the broker of `runwatch kafka up` (any Kafka cluster)",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }


_KEY_SCHEMA = {
    "type": "string",
    "description": "run_id, UTF-8 bytes (Kafka's default murmur2 partitioner)",
}


def _embedded(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema as embedded in the AsyncAPI document (no ``$schema`` / ``$id``)."""
    out = copy.deepcopy(schema)
    out.pop("$schema", None)
    out.pop("$id", None)
    return out
