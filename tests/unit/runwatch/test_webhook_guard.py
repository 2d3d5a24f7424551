"""Which addresses a tenant's webhook may reach (``runwatch/webhook_guard.py``): public
ones only. Pure: literals, and names that resolve without a network (``localhost``)."""

from __future__ import annotations

import asyncio

import pytest

from runwatch.webhook_guard import destination_refusal, refused_address

INSIDE = [
    "127.0.0.1", "10.0.0.5", "172.16.3.4", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "0.0.0.0", "192.0.2.10", "224.0.0.1", "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1",
    "::ffff:127.0.0.1", "fe80::1%eth0",
]  # fmt: skip
OUTSIDE = ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", INSIDE)
def test_addresses_inside_a_network_are_refused(address: str) -> None:
    assert refused_address(address)


@pytest.mark.parametrize("address", OUTSIDE)
def test_public_addresses_are_not(address: str) -> None:
    assert not refused_address(address)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://localhost:8080/hook", "non-public address (127.0.0.1"),
        ("http://169.254.169.254/latest/meta-data/", "non-public address (169.254.169.254)"),
        ("https://[::1]/hook", "non-public address (::1)"),
        ("http://no-such-host.invalid/hook", "cannot resolve webhook host"),
        ("http://" + "a" * 300 + ".example/hook", "cannot resolve webhook host"),  # IDNA
    ],
)
def test_a_url_is_judged_by_every_address_its_host_resolves_to(url: str, said: str) -> None:
    assert said in asyncio.run(destination_refusal(url))


def test_a_public_literal_passes() -> None:
    assert asyncio.run(destination_refusal("https://8.8.8.8/hook")) == ""
