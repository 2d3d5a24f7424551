"""The ``--kafka [BOOTSTRAP]`` flag the commands share, resolved once."""

from __future__ import annotations

from runwatch import settings
from runwatch.cli.terminal import Abort


def kafka_flag(value: str | None) -> str | None:
    """The broker a ``--kafka [BOOTSTRAP]`` flag names: None when the flag was not given;
    the address given, else the configured one (:func:`runwatch.settings.kafka_bootstrap`);
    the flag given with no broker configured is an :class:`Abort`."""
    if value is None:
        return None
    bootstrap = settings.kafka_bootstrap(value or None)
    if not bootstrap:
        raise Abort("--kafka given but no broker configured (pass BOOTSTRAP)")
    return bootstrap
