"""``runwatch schema export --out DIR``: the published event contract, as files.

Writes, from the pydantic models and the topic registry (:mod:`events.contract`):

- ``events/<Type>.v<N>.schema.json``: JSON Schema (2020-12) of every event type at its
  current version N (``schema_version`` is a ``const``), plus ``DeadLetter.v1``;
- ``event.schema.json``: any record, ``oneOf`` the per-type schemas (tag ``type``);
- ``upcasting.json``: the rules that read an older ``schema_version`` as the current one;
- ``asyncapi.json`` / ``asyncapi.yaml``: AsyncAPI 3.0 — one channel per topic with its
  key, partitions, retention and the event types published on it.

``DIR`` is emptied first if an earlier export made it (never another directory). How a
Java or Go consumer uses these: docs/event-contract.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from runwatch.cli.outdir import fresh_out_dir
from runwatch.cli.terminal import Terminal

HELP = "export the event contract: JSON Schema per event type and an AsyncAPI document"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="schema_command", metavar="SUBCOMMAND", required=True)
    exp = sub.add_parser("export", help="write JSON Schemas, upcasting rules and AsyncAPI")
    exp.add_argument("--out", required=True, help="directory to write (created)")
    exp.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    import yaml

    from events import contract

    out = fresh_out_dir(Path(args.out), "schema")
    (out / "events").mkdir()
    files: dict[str, str] = {}
    versions: dict[str, int] = {}
    for name, schema in contract.event_schemas().items():
        version = schema["x-runwatch-schema-version"]
        files[name] = contract.schema_file(name, version)
        versions[name] = version
        _write(out / "events" / files[name], schema)
    dead = contract.schema_file("DeadLetter", 1)
    _write(out / "events" / dead, contract.dead_letter_schema())
    _write(out / "event.schema.json", contract.union_schema(versions))
    rules = contract.upcasting_rules()
    _write(out / "upcasting.json", {"rules": rules})
    doc = contract.asyncapi()
    _write(out / "asyncapi.json", doc)
    (out / "asyncapi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    summary = {
        "out": str(out),
        "event_types": len(files),
        "versions": versions,
        "upcasting_rules": len(rules),
        "topics": len(doc["channels"]),
    }
    if args.json:
        term.json(summary)
    else:
        term.info(
            f"wrote {len(files)} event schemas (+ DeadLetter), {len(rules)} upcasting rules "
            f"and an AsyncAPI document of {len(doc['channels'])} topics to {out}"
        )
    return 0


def _write(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
