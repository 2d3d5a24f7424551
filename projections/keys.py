"""API keys: a YAML file mapping keys to a tenant, or to the operator role.

::

    keys:
      - key: "rk_acme_3f9..."        # plain key, or
      - sha256: "9c56cc51b374..."    #   its hex sha256 (keeps secrets out of the file)
        tenant: acme
        expires: 2026-07-01T00:00:00Z  # optional: stops working at that instant
      - key: "rk_ops_..."
        operator: true
      - sha256: "0b1c..."
        tenant: globex
        revoked: true                # optional: stops working (as if removed)

Keys are looked up by their sha256, so the comparison does not depend on how many
leading characters of a guessed key match. A key is exactly one of tenant or operator.
A tenant id holds no ``:`` (behind the ingest gateway a run's id is ``<tenant>:<name>``,
so one tenant's prefix must never begin another's).

``expires`` is an ISO 8601 date-time (no offset: UTC), a date (its first instant, UTC)
or a Unix time in seconds. A key marked ``revoked: true`` anywhere in the file is revoked,
whatever another entry of the same key says. Unknown fields are an error (a misspelt
``expires`` must not leave a key valid forever); ``name`` and ``comment`` are free text.

Tenants may have a webhook (the notifier, ``runwatch notify``, POSTs their alerts and
state changes to it, signed with the secret; docs/notifications.md)::

    tenants:
      acme:
        webhook:
          url: https://hooks.acme.example/runwatch
          secret_file: acme-webhook.secret   # relative to this file; or secret: "..."

A webhook URL that is not http(s) with a host, or a webhook without exactly one of
``secret`` / ``secret_file``, makes the whole file invalid (:func:`parse_webhooks`).

A file loaded with :meth:`ApiKeys.load` is watched: every :meth:`ApiKeys.resolve` first
checks the file's identity (device, inode, size, modification and change times; one
``stat``) and loads it again when it changed, so an added key works and a removed or
revoked key stops working without a restart. :meth:`ApiKeys.request_reload` (what the
server's SIGHUP handler calls; safe inside a signal handler) forces the next check to
read the file. A file changed within the file system's timestamp granularity of the last
load is read again (contents compared) until it is older than that, so two edits in the
same clock tick are not missed. A file that cannot be read or is not a valid keys file
is not applied: the last valid keys stay in force (and expiry is still enforced), the
error is logged and kept in :attr:`ApiKeys.error`, and the next change is tried again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

log = logging.getLogger("runwatch.keys")

FIELDS = frozenset({"key", "sha256", "tenant", "operator", "expires", "revoked", "name", "comment"})
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: A file modified less than this long before it was read may be modified again without
#: its timestamps changing (coarse file-system clocks): it is re-read until it is older.
RACY_S = 2.0
#: How often a racy file is re-read (seconds).
RACY_RECHECK_S = 0.05


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str | None
    operator: bool = False

    def can_read(self, tenant_id: str) -> bool:
        return self.operator or self.tenant_id == tenant_id


#: Characters of a key entry's ``name`` kept (it names an operator in events).
MAX_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class Grant:
    """What one key grants, until when (Unix seconds; ``None``: no expiry), and the
    ``name`` of its entry (cleaned: printable, one line, at most :data:`MAX_NAME_CHARS`;
    ``""`` for none)."""

    principal: Principal
    expires: float | None = None
    name: str = ""


def clean_name(name: Any) -> str:
    """A key entry's ``name`` fit for an event field (``""`` for none)."""
    if name is None:
        return ""
    text = "".join(c if c.isprintable() else " " for c in str(name)).strip()
    return text[:MAX_NAME_CHARS]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_expiry(value: Any, where: str = "expires") -> float | None:
    """``expires`` as Unix seconds: a date-time (naive = UTC), a date or a number."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a date-time, a date or Unix seconds, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{where}: not an ISO 8601 date-time: {value!r}") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp()
    raise ValueError(f"{where}: expected a date-time, a date or Unix seconds, got {value!r}")


def parse_entries(data: Any) -> dict[str, Grant]:
    """The keys file's mapping -> digest -> grant (revoked keys left out)."""
    if not isinstance(data, dict):
        raise ValueError("expected a mapping with a 'keys' list")
    parse_webhooks(data, read_secrets=False)  # a malformed webhook refuses the file too
    items = data.get("keys") or []
    if not isinstance(items, list):
        raise ValueError("'keys' must be a list")
    entries: dict[str, Grant] = {}
    revoked: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"keys[{i}]: expected a mapping")
        unknown = sorted(set(map(str, item)) - FIELDS)
        if unknown:
            raise ValueError(f"keys[{i}]: unknown field(s) {unknown} (allowed: {sorted(FIELDS)})")
        if ("key" in item) == ("sha256" in item):
            raise ValueError(f"keys[{i}]: give exactly one of 'key' or 'sha256'")
        operator = bool(item.get("operator", False))
        tenant = item.get("tenant")
        if operator == (tenant is not None):
            raise ValueError(f"keys[{i}]: give exactly one of 'tenant' or 'operator: true'")
        if tenant is not None and ":" in str(tenant):  # a hooked run's id is <tenant>:<name>
            raise ValueError(f"keys[{i}]: a tenant id holds no ':' (it ends a tenant's prefix)")
        is_revoked = item.get("revoked", False)
        if not isinstance(is_revoked, bool):
            raise ValueError(f"keys[{i}]: 'revoked' must be true or false")
        expires = parse_expiry(item.get("expires"), f"keys[{i}].expires")
        d = digest(str(item["key"])) if "key" in item else str(item["sha256"]).lower()
        if not _HEX64.fullmatch(d):
            raise ValueError(f"keys[{i}]: 'sha256' must be 64 hex digits")
        if is_revoked:
            revoked.add(d)
        principal = Principal(None if operator else str(tenant), operator)
        entries[d] = Grant(principal, expires, clean_name(item.get("name")))
    for d in revoked:
        del entries[d]
    return entries


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ApiKeys:
    """Key -> principal, with expiry; reloaded from its file when the file changes."""

    def __init__(
        self,
        entries: dict[str, Principal | Grant],
        *,
        path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._grants = {
            d: g if isinstance(g, Grant) else Grant(g) for d, g in dict(entries).items()
        }
        self._clock = clock
        self.path = Path(path) if path is not None else None
        self.error: str | None = None  # why the newest version of the file was not applied
        self.loads = 0  # versions of the file applied (the first load included)
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] | None = None
        self._raw: bytes | None = None
        self._racy = False  # read within RACY_S of its modification: re-read it
        self._next_racy_check = 0.0  # monotonic
        self._reload_requested = False

    @classmethod
    def from_mapping(cls, data: dict, *, clock: Callable[[], float] = time.time) -> ApiKeys:
        return cls(dict(parse_entries(data)), clock=clock)

    @classmethod
    def load(cls, path: str | Path, *, clock: Callable[[], float] = time.time) -> ApiKeys:
        """Load ``path`` (a ``ValueError`` if it is missing or invalid) and keep watching it."""
        p = Path(path)
        keys = cls({}, path=p, clock=clock)
        with keys._lock:
            keys._reload(force=True)
        if keys.error is not None:
            raise ValueError(keys.error)
        return keys

    # -- reloading ---------------------------------------------------------------------
    def request_reload(self) -> None:
        """Read the file again at the next check (async-signal-safe: sets a flag only)."""
        self._reload_requested = True

    def reload(self) -> bool:
        """Read the file now; ``True`` if a new version was applied."""
        if self.path is None:
            return False
        with self._lock:
            return self._reload(force=True)

    def _check(self) -> None:
        """The hot path: one ``stat``; the lock and a read only when something changed."""
        if self.path is None:
            return
        try:
            stamp: tuple[int, ...] | None = _stamp(os.stat(self.path))
        except OSError:
            stamp = None
        if (
            stamp == self._stamp
            and not self._reload_requested
            and not (self._racy and time.monotonic() >= self._next_racy_check)
        ):
            return
        with self._lock:
            self._reload(force=False)

    def _reload(self, force: bool) -> bool:
        """Under the lock: read the file if it changed (or ``force``); apply it if valid."""
        assert self.path is not None
        force = force or self._reload_requested
        self._reload_requested = False
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._stamp, self._racy = None, False
            return self._failed(f"API keys file not readable: {self.path} ({exc.strerror})")
        stamp = _stamp(st)
        racy = self._racy and time.monotonic() >= self._next_racy_check
        if stamp == self._stamp and not force and not racy:
            return False  # another thread got here first
        self._stamp = stamp
        # modified within RACY_S of this read: a later edit may keep these timestamps
        self._racy = time.time() - st.st_mtime < RACY_S
        self._next_racy_check = time.monotonic() + RACY_RECHECK_S
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            return self._failed(f"API keys file not readable: {self.path} ({exc.strerror})")
        if raw == self._raw and self.error is None:
            return False
        try:
            grants = parse_entries(yaml.safe_load(raw) or {})
        except yaml.YAMLError as exc:
            return self._failed(f"{self.path}: not valid YAML: {exc}", raw)
        except ValueError as exc:
            return self._failed(f"{self.path}: {exc}", raw)
        self._grants = grants  # one assignment: a reader sees the old or the new table
        self._raw = raw
        self.error = None
        self.loads += 1
        if self.loads > 1:
            log.info("API keys reloaded from %s (%d valid keys)", self.path, len(grants))
        return True

    def _failed(self, message: str, raw: bytes | None = None) -> bool:
        if raw is not None:
            self._raw = raw
        if message != self.error:
            self.error = message
            if self.loads:
                log.error("%s; keeping the previous keys", message)
        return False

    # -- lookups -----------------------------------------------------------------------
    def resolve(self, key: str | None) -> Principal | None:
        """The principal of a valid key: known, not revoked, not expired; else ``None``."""
        if not key:
            return None
        self._check()
        grant = self._grants.get(digest(key))
        if grant is None:
            return None
        if grant.expires is not None and self._clock() >= grant.expires:
            return None
        return grant.principal

    def name_of(self, key_sha256: str) -> str:
        """The ``name`` of the entry of the key with this sha256 (``""``: none, or no
        such key now)."""
        self._check()
        grant = self._grants.get(key_sha256)
        return grant.name if grant is not None else ""


# -- tenant webhooks (read by the notifier; validated by every loader) ----------------------
TENANT_FIELDS = frozenset({"webhook", "name", "comment"})
WEBHOOK_FIELDS = frozenset({"url", "secret", "secret_file", "comment"})
#: The shortest accepted webhook secret (bytes).
MIN_SECRET_BYTES = 16


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a tenant's notifications go and the HMAC secret that signs them."""

    url: str
    secret: bytes = field(repr=False, default=b"")

    @property
    def endpoint(self) -> str:
        """The URL without credentials, query or fragment (what events may record)."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"


def check_webhook_url(url: Any, where: str = "url") -> str:
    """``url`` if it is an absolute http(s) URL with a host; else a ``ValueError`` saying why."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"{where}: expected an http(s) URL, got {url!r}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError(f"{where}: {url!r} contains whitespace or control characters")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{where}: {url!r} is not an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError(f"{where}: {url!r} has no host")
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number in range)
    except ValueError as exc:
        raise ValueError(f"{where}: {url!r} has a bad port ({exc})") from None
    return url


def parse_webhooks(
    data: Any, *, base_dir: str | Path | None = None, read_secrets: bool = True
) -> dict[str, Webhook]:
    """The keys file's ``tenants`` section -> tenant -> :class:`Webhook` (tenants without
    one are left out). ``secret_file`` is read relative to ``base_dir``; with
    ``read_secrets=False`` (the API, which signs nothing) only the shape is checked and
    secrets come back empty."""
    if not isinstance(data, dict):
        raise ValueError("expected a mapping at the top level")
    tenants = data.get("tenants") or {}
    if not isinstance(tenants, dict):
        raise ValueError("'tenants' must be a mapping of tenant id -> settings")
    hooks: dict[str, Webhook] = {}
    for tenant, item in tenants.items():
        where = f"tenants.{tenant}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a mapping")
        unknown = sorted(set(map(str, item)) - TENANT_FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {unknown} (allowed: {sorted(TENANT_FIELDS)})"
            )
        hook = item.get("webhook")
        if hook is None:
            continue
        where += ".webhook"
        if not isinstance(hook, dict):
            raise ValueError(
                f"{where}: expected a mapping with 'url' and 'secret_file' or 'secret'"
            )
        unknown = sorted(set(map(str, hook)) - WEBHOOK_FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {unknown} (allowed: {sorted(WEBHOOK_FIELDS)})"
            )
        url = check_webhook_url(hook.get("url"), f"{where}.url")
        if ("secret" in hook) == ("secret_file" in hook):
            raise ValueError(f"{where}: give exactly one of 'secret' or 'secret_file'")
        secret = b""
        if "secret" in hook:
            if not isinstance(hook["secret"], str):
                raise ValueError(f"{where}.secret: expected a string")
            secret = hook["secret"].encode()
        elif not isinstance(hook["secret_file"], str) or not hook["secret_file"]:
            raise ValueError(f"{where}.secret_file: expected a file name")
        elif read_secrets:
            path = Path(base_dir or ".") / hook["secret_file"]
            try:
                secret = path.read_bytes().strip()
            except OSError as exc:
                raise ValueError(
                    f"{where}.secret_file: cannot read {path} ({exc.strerror})"
                ) from None
        if (read_secrets or "secret" in hook) and len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"{where}: the secret must be at least {MIN_SECRET_BYTES} bytes")
        hooks[str(tenant)] = Webhook(url, secret)
    return hooks


def load_webhooks(path: str | Path) -> dict[str, Webhook]:
    """Every tenant's webhook from a keys file, secrets read (``ValueError`` naming the
    file and the entry when the file is missing, not YAML, or a webhook is malformed)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"keys file not readable: {p} ({exc.strerror})") from None
    try:
        data = yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not valid YAML: {exc}") from None
    try:
        return parse_webhooks(data, base_dir=p.parent)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
