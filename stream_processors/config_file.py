"""Reading a processor's YAML configuration file (the price list, the control policy).

One rule for every such file: a missing file, bad YAML or a document that is not a
mapping is a ``ValueError`` naming the file; the raw bytes come back too, for a caller
that stamps a digest of the file on what it derives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_mapping(path: Path, what: str = "config file") -> tuple[dict[str, Any], bytes]:
    """The top-level mapping of the YAML file at ``path`` and the file's bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{what} not found: {path}") from None
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data, raw
