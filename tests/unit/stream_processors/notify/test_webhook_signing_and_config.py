"""Webhook signatures (pure) and the tenants' webhook settings in the keys file."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
import yaml

from projections.keys import ApiKeys, Webhook, check_webhook_url, load_webhooks, parse_webhooks
from stream_processors.notify.signing import signature, verify

SECRET = b"s3cret-s3cret-s3cret"


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"id":"x"}'
    expected = hmac.new(SECRET, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(SECRET, 1700000000, body) == "sha256=" + expected


def test_verify_accepts_fresh_authentic_requests_only() -> None:
    body = b'{"id":"x","type":"alert.fired"}'
    sig = signature(SECRET, 1000, body)
    assert verify(SECRET, body, "1000", sig, now=1000.0)
    assert verify(SECRET, body, "1000", sig, now=1299.0)
    assert not verify(SECRET, body, "1000", sig, now=1301.0)  # replayed too late
    assert not verify(SECRET, body + b" ", "1000", sig, now=1000.0)  # body changed
    assert not verify(SECRET, body, "1001", sig, now=1001.0)  # timestamp changed
    assert not verify(b"another-secret-16b", body, "1000", sig, now=1000.0)
    assert not verify(SECRET, body, None, sig, now=1000.0)
    assert not verify(SECRET, body, "soon", sig, now=1000.0)
    assert not verify(SECRET, body, "1000", "", now=1000.0)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example/x",
        "hooks.example/x",
        "http://",
        "https:///path",
        "https://hooks.example:99999/x",
        "https://hooks.example/ x",
        "",
        None,
        42,
    ],
)
def test_malformed_webhook_urls_are_refused(url: object) -> None:
    with pytest.raises(ValueError):
        check_webhook_url(url)


def test_good_urls_and_endpoint_without_credentials() -> None:
    hook = Webhook("https://user:pw@hooks.example:8443/rw/hook?token=abc#frag", b"x" * 16)
    assert check_webhook_url(hook.url) == hook.url
    assert hook.endpoint == "https://hooks.example:8443/rw/hook"
    assert "x" * 16 not in repr(hook)  # the secret is never printed
    assert Webhook("http://[::1]:9/h").endpoint == "http://[::1]:9/h"


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_webhooks_load_with_secret_files_relative_to_the_keys_file(tmp_path: Path) -> None:
    (tmp_path / "acme.secret").write_text("acme-webhook-secret-123\n")
    path = _write(
        tmp_path,
        {
            "keys": [{"key": "k1", "tenant": "acme"}],
            "tenants": {
                "acme": {"webhook": {"url": "https://a.example/h", "secret_file": "acme.secret"}},
                "globex": {"webhook": {"url": "http://127.0.0.1:9/h", "secret": "g" * 20}},
                "initech": {"name": "no webhook"},
            },
        },
    )
    hooks = load_webhooks(path)
    assert hooks["acme"] == Webhook("https://a.example/h", b"acme-webhook-secret-123")
    assert hooks["globex"].secret == b"g" * 20
    assert "initech" not in hooks
    assert ApiKeys.load(path).resolve("k1") is not None  # the API reads the same file


@pytest.mark.parametrize(
    ("webhook", "message"),
    [
        ({"url": "gopher://a.example/h", "secret": "x" * 16}, "not an http:// or https:// URL"),
        ({"url": "https://", "secret": "x" * 16}, "has no host"),
        ({"url": "https://a.example/h"}, "exactly one of 'secret' or 'secret_file'"),
        ({"url": "https://a.example/h", "secret": "short"}, "at least 16 bytes"),
        ({"url": "https://a.example/h", "secret_file": "missing"}, "cannot read"),
        ({"url": "https://a.example/h", "secret": "x" * 16, "sceret": 1}, "unknown field"),
    ],
)
def test_a_malformed_webhook_is_refused_when_the_config_is_loaded(
    tmp_path: Path, webhook: dict, message: str
) -> None:
    path = _write(
        tmp_path,
        {"keys": [{"key": "k1", "tenant": "acme"}], "tenants": {"acme": {"webhook": webhook}}},
    )
    with pytest.raises(ValueError, match=message) as err:
        load_webhooks(path)
    assert "tenants.acme.webhook" in str(err.value) and str(path) in str(err.value)
    if message != "cannot read":  # the API signs nothing: it checks shape, not secret files
        with pytest.raises(ValueError, match=message):
            ApiKeys.load(path)


def test_tenants_section_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="'tenants' must be a mapping"):
        parse_webhooks({"tenants": ["acme"]})
    with pytest.raises(ValueError, match="unknown field"):
        parse_webhooks({"tenants": {"acme": {"hook": {}}}})
    assert parse_webhooks({"keys": []}) == {}
