"""Sealed read positions for the ingest gateway: where a hook's read stopped, unreadable.

The control and lifecycle topics hold every tenant's records. A hook reads its own
tenant's only (:func:`runwatch.apps.ingest_policy.readable`), but the offsets of those
records, and the partition's end, would tell it how many records the other tenants wrote
between them and when (a pause, a cancel, a run started). So the gateway never shows an
offset: where a scan stopped travels as a cursor it sealed, which the hook hands back to
go on.

A cursor is ``nonce (8 bytes) | offset XOR pad (8) | tag (16)``, URL-safe base64 without
padding: the pad is the first 8 bytes of HMAC-SHA256(secret, "pad" | nonce), the tag
HMAC-SHA256(secret, "tag" | nonce | sealed offset | what it is bound to) cut to 16 bytes.
The nonce is random, so two cursors at the same offset differ and a hook cannot tell
whether anything was written between two of its reads; the tag binds a cursor to the
tenant, topic and partition it was made for, so it opens nowhere else.

Assumptions: the secret (32 random bytes by default, made when the gateway starts) is
shared by every gateway replica that serves the same hooks; a cursor from a gateway with
another secret (restarted without ``--cursor-secret-file``) does not open, and the hook
reads from the start again (:class:`producers.hooks.gateway.GatewayLog` numbers its
records so that it sees each once). No clock: a cursor does not expire.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

#: Bytes of random nonce, sealed offset and tag in a cursor.
NONCE_BYTES, OFFSET_BYTES, TAG_BYTES = 8, 8, 16
SECRET_BYTES = 32


class CursorRefused(ValueError):
    """A cursor this gateway did not make for this tenant, topic and partition."""


class CursorSeal:
    """Seals offsets into cursors and opens them again, under one secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        """``secret``: at least 16 bytes (``None``: 32 fresh random ones)."""
        if secret is None:
            secret = os.urandom(SECRET_BYTES)
        if len(secret) < 16:
            raise ValueError("a cursor secret has at least 16 bytes")
        self._secret = secret

    def seal(self, offset: int, tenant_id: str, topic: str, partition: int) -> str:
        """The cursor for ``offset`` (>= 0), for this tenant's reads of this partition."""
        if not 0 <= offset < 1 << (8 * OFFSET_BYTES):
            raise ValueError(f"an offset is >= 0 and < 2**64, not {offset}")
        nonce = os.urandom(NONCE_BYTES)
        sealed = (offset ^ self._pad(nonce)).to_bytes(OFFSET_BYTES, "big")
        raw = nonce + sealed + self._tag(nonce, sealed, tenant_id, topic, partition)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def open(self, cursor: str, tenant_id: str, topic: str, partition: int) -> int:
        """The offset ``cursor`` seals; :class:`CursorRefused` when it is not one of this
        gateway's for this tenant, topic and partition (or not a cursor at all)."""
        if len(cursor) > 64:
            raise CursorRefused("not a cursor of this gateway")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError):
            raise CursorRefused("not a cursor of this gateway") from None
        if len(raw) != NONCE_BYTES + OFFSET_BYTES + TAG_BYTES:
            raise CursorRefused("not a cursor of this gateway")
        nonce, sealed = raw[:NONCE_BYTES], raw[NONCE_BYTES : NONCE_BYTES + OFFSET_BYTES]
        tag = raw[NONCE_BYTES + OFFSET_BYTES :]
        if not hmac.compare_digest(tag, self._tag(nonce, sealed, tenant_id, topic, partition)):
            raise CursorRefused(
                "not a cursor of this gateway for this tenant and partition (a gateway "
                "restarted with a new secret makes new ones: read from the start)"
            )
        return int.from_bytes(sealed, "big") ^ self._pad(nonce)

    def _pad(self, nonce: bytes) -> int:
        digest = hmac.new(self._secret, b"pad" + nonce, hashlib.sha256).digest()
        return int.from_bytes(digest[:OFFSET_BYTES], "big")

    def _tag(
        self, nonce: bytes, sealed: bytes, tenant_id: str, topic: str, partition: int
    ) -> bytes:
        bound = f"{tenant_id}\x00{topic}\x00{partition}".encode("utf-8", "surrogatepass")
        message = b"tag" + nonce + sealed + bound
        return hmac.new(self._secret, message, hashlib.sha256).digest()[:TAG_BYTES]
