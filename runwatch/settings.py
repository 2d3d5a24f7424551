"""Where things are, resolved once: the log directory and the Kafka bootstrap address.

Resolution order for Kafka: an explicit ``--kafka`` value, then ``$KAFKA_BOOTSTRAP_SERVERS``,
then the broker started by ``runwatch kafka up`` (its state file). The embedded log lives
in ``$RUNWATCH_LOG_DIR`` or ``./runwatch-data/log``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_LOG_DIR = Path("runwatch-data") / "log"


class NotALogDir(ValueError):
    """The log directory named is an existing file (the CLI reports it, exit 1)."""


def log_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The embedded log's directory: ``explicit``, else ``$RUNWATCH_LOG_DIR``, else the
    default. It may not exist yet (a writer creates it); an existing file is refused
    (:class:`NotALogDir`) rather than failing later inside the log."""
    path = Path(explicit) if explicit else Path(os.environ.get("RUNWATCH_LOG_DIR", DEFAULT_LOG_DIR))
    if path.exists() and not path.is_dir():
        raise NotALogDir(f"{path} is a file, not an embedded log directory")
    return path


def kafka_bootstrap(explicit: str | None = None) -> str | None:
    """The bootstrap address to use, or ``None`` when no broker is configured."""
    if explicit:
        return explicit
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        return env
    state = Path.home() / ".cache" / "runwatch" / "kafka-broker" / "state.json"
    try:
        return str(json.loads(state.read_text())["bootstrap"])
    except (OSError, ValueError, KeyError):
        return None
