"""API keys (projections/keys.py): expiry, revocation, strict entries, and a watched file
that is reloaded on change (stat identity, same-tick edits, SIGHUP-style requests), keeping
the last valid keys when an edit is broken."""

from __future__ import annotations

import datetime as dt
import os

import pytest
import yaml

from projections.keys import ApiKeys, digest, parse_expiry


class Clock:
    def __init__(self, now: float = 1_750_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write(path, entries) -> None:  # type: ignore[no-untyped-def]
    path.write_text(yaml.safe_dump({"keys": entries}))


def test_expiry_formats():
    assert parse_expiry(None) is None
    assert parse_expiry(1_800_000_000) == 1_800_000_000.0
    assert parse_expiry("2026-01-01T00:00:00Z") == 1_767_225_600.0
    assert parse_expiry("2026-01-01T01:00:00+01:00") == 1_767_225_600.0
    assert parse_expiry("2026-01-01T00:00:00") == 1_767_225_600.0  # naive: UTC
    assert parse_expiry(dt.date(2026, 1, 1)) == 1_767_225_600.0  # YAML's unquoted date
    unquoted = yaml.safe_load("expires: 2026-01-01 00:00:00Z")["expires"]
    assert parse_expiry(unquoted) == 1_767_225_600.0
    for bad in (True, "next tuesday", [1]):
        with pytest.raises(ValueError, match="expires"):
            parse_expiry(bad)


def test_expired_key_resolves_to_nothing():
    clock = Clock()
    keys = ApiKeys.from_mapping(
        {
            "keys": [
                {"key": "a", "tenant": "acme", "expires": clock.now + 10},
                {"key": "b", "tenant": "acme"},
            ]
        },
        clock=clock,
    )
    assert keys.resolve("a").tenant_id == "acme"
    clock.now += 10
    assert keys.resolve("a") is None  # at the instant itself
    assert keys.resolve("b").tenant_id == "acme"


def test_revoked_wins_over_any_other_entry_of_the_same_key():
    keys = ApiKeys.from_mapping(
        {
            "keys": [
                {"key": "a", "tenant": "acme", "revoked": True},
                {"sha256": digest("a"), "tenant": "acme"},
                {"key": "b", "operator": True, "revoked": False},
            ]
        }
    )
    assert keys.resolve("a") is None
    assert keys.resolve("b").operator


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"key": "a", "tenant": "t", "expire": "2020-01-01"}, "unknown field"),
        ({"key": "a", "tenant": "t", "revoked": "yes"}, "revoked"),
        ({"sha256": "abc", "tenant": "t"}, "64 hex"),
        ({"key": "a", "tenant": "t", "expires": "soon"}, "expires"),
        ({"key": "a"}, "tenant"),
    ],
)
def test_entries_are_strict(entry, message):
    with pytest.raises(ValueError, match=message):
        ApiKeys.from_mapping({"keys": [entry]})
    ApiKeys.from_mapping({"keys": [{"key": "a", "tenant": "t", "name": "x", "comment": "y"}]})


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="not readable"):
        ApiKeys.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("keys: [")
    with pytest.raises(ValueError, match="not valid YAML"):
        ApiKeys.load(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        ApiKeys.load(bad)


def test_watched_file_adds_removes_and_revokes_without_a_restart(tmp_path):
    path = tmp_path / "keys.yaml"
    write(path, [{"key": "a", "tenant": "acme"}])
    keys = ApiKeys.load(path)
    assert keys.resolve("a").tenant_id == "acme" and keys.resolve("b") is None
    write(path, [{"key": "a", "tenant": "acme"}, {"key": "b", "tenant": "globex"}])
    assert keys.resolve("b").tenant_id == "globex"
    write(path, [{"key": "b", "tenant": "globex", "revoked": True}])
    assert keys.resolve("a") is None and keys.resolve("b") is None
    assert keys.loads == 3 and keys.error is None


def test_an_edit_with_the_same_timestamps_is_still_seen(tmp_path, monkeypatch):
    """A coarse file-system clock: the second edit keeps size, inode and times. The file
    was read within RACY_S of its modification, so it is read again."""
    import projections.keys as mod

    monkeypatch.setattr(mod, "RACY_RECHECK_S", 0.0)
    path = tmp_path / "keys.yaml"
    write(path, [{"key": "aaaa", "tenant": "acme"}])
    st = os.stat(path)
    keys = ApiKeys.load(path)
    write(path, [{"key": "bbbb", "tenant": "acme"}])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # ctime moved on every write on a real file system; pretend it did not
    monkeypatch.setattr(mod, "_stamp", lambda s: (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns))
    keys._stamp = mod._stamp(os.stat(path))
    assert keys.resolve("bbbb") is not None and keys.resolve("aaaa") is None


def test_an_old_unchanged_file_is_not_read_again(tmp_path, monkeypatch):
    path = tmp_path / "keys.yaml"
    write(path, [{"key": "a", "tenant": "acme"}])
    old = 1_600_000_000
    os.utime(path, (old, old))
    keys = ApiKeys.load(path)
    reads = []
    real = type(path).read_bytes
    monkeypatch.setattr(type(path), "read_bytes", lambda p: reads.append(p) or real(p))
    for _ in range(100):
        assert keys.resolve("a") is not None
    assert reads == []  # one stat per lookup, no read
    keys.request_reload()  # what SIGHUP does
    assert keys.resolve("a") is not None
    assert len(reads) == 1


def test_a_broken_edit_keeps_the_last_valid_keys_and_expiry_still_applies(tmp_path):
    clock = Clock()
    path = tmp_path / "keys.yaml"
    write(path, [{"key": "a", "tenant": "acme", "expires": clock.now + 5}])
    keys = ApiKeys.load(path, clock=clock)
    path.write_text("keys: [ {key: b, tenant: ")
    assert keys.resolve("a") is not None and keys.resolve("b") is None
    assert keys.error and "not valid YAML" in keys.error
    clock.now += 5
    assert keys.resolve("a") is None
    path.unlink()
    assert keys.resolve("a") is None and "not readable" in (keys.error or "")
    write(path, [{"key": "b", "tenant": "acme"}])
    assert keys.resolve("b") is not None and keys.error is None


def test_reload_reports_whether_anything_changed(tmp_path):
    path = tmp_path / "keys.yaml"
    write(path, [{"key": "a", "tenant": "acme"}])
    keys = ApiKeys.load(path)
    assert keys.reload() is False
    write(path, [{"key": "c", "tenant": "acme"}])
    assert keys.reload() is True and keys.resolve("c") is not None
    assert ApiKeys.from_mapping({"keys": []}).reload() is False  # not file-backed


def test_one_principal_for_the_query_api_and_the_dashboard(tmp_path) -> None:
    """Both apps resolve a request's key with ``projections.auth.principal_of``: a Bearer
    token wins over X-API-Key; no key or an unknown one is the same 401."""
    import asyncio

    import pytest
    from fastapi import HTTPException

    from projections import api, auth
    from projections.dashboard import router
    from projections.keys import ApiKeys

    path = tmp_path / "keys.yaml"
    write(path, [{"key": "k-a", "tenant": "a"}, {"key": "k-b", "tenant": "b"}])
    principal = auth.principal_of(ApiKeys.load(path))
    assert asyncio.run(principal("Bearer k-a", "k-b")).tenant_id == "a"
    assert asyncio.run(principal(None, "k-b")).tenant_id == "b"
    for bad in ((None, None), ("Bearer nope", None), (None, "nope")):
        with pytest.raises(HTTPException) as caught:
            asyncio.run(principal(*bad))
        assert caught.value.status_code == 401
    assert "principal_of" in api.create_app.__code__.co_names
    assert "principal_of" in router.create_router.__code__.co_names
