"""Webhook signatures: HMAC-SHA256 over the timestamp and the exact body (pure).

Every request carries::

    X-Runwatch-Timestamp: 1761312000                 (unix seconds when it was sent)
    X-Runwatch-Signature: sha256=<hex>               (HMAC-SHA256(secret, "<ts>." + body))
    X-Runwatch-Delivery: <source event id>           (idempotency key, same every attempt)

The timestamp is inside the signed bytes, so it cannot be changed without the secret;
a receiver checks the signature over the raw body it received (before parsing it) and
refuses a timestamp older than its tolerance (:data:`DEFAULT_TOLERANCE_S`), which makes
a captured request useless after that. Within the tolerance it deduplicates by
``X-Runwatch-Delivery`` (retries and a restarted notifier send the same id again).
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Runwatch-Signature"
TIMESTAMP_HEADER = "X-Runwatch-Timestamp"
DELIVERY_HEADER = "X-Runwatch-Delivery"
ATTEMPT_HEADER = "X-Runwatch-Attempt"
EVENT_HEADER = "X-Runwatch-Event"
#: How old a signed timestamp a receiver should accept (seconds), either way.
DEFAULT_TOLERANCE_S = 300.0


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Runwatch-Signature`` value: ``sha256=`` + hex HMAC of ``"<ts>." + body``."""
    mac = hmac.new(secret, str(int(timestamp)).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(
    secret: bytes,
    body: bytes,
    timestamp: str | None,
    signature_header: str | None,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """Whether a received request is authentic and fresh: the header matches the HMAC of
    the raw ``body`` (constant-time compare) and ``timestamp`` is within ``tolerance_s``
    of ``now``."""
    if not timestamp or not signature_header:
        return False
    try:
        ts = int(timestamp)
        if abs(now - ts) > tolerance_s:  # a 4000-digit ts: OverflowError, not a bool
            return False
    except (ValueError, OverflowError):
        return False
    given = signature_header.strip().encode("utf-8", "replace")  # headers may be any bytes
    return hmac.compare_digest(signature(secret, ts, body).encode(), given)
