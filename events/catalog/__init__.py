"""The event catalog, one module per domain. Importing this package registers every type."""

from events.catalog import (  # noqa: F401  (imported for registration)
    checkpoint,
    control,
    derived,
    eval,
    lifecycle,
    notify,
    profile,
    reward,
    rollout,
    trainer,
    trajectory,
    usage,
)
