"""Issue #20 item 12 (and SIGHUP of item 11), on real ``runwatch serve api`` processes:

- by default the Prometheus exporter listens on 127.0.0.1 only, like the API: from a
  non-loopback address of this machine the port refuses the connection (and the kernel's
  socket table shows the listener on 127.0.0.1);
- binding wider is explicit (``--metrics-host``), and ``--metrics-token-file`` makes the
  scrape need ``Authorization: Bearer <token>`` (401 otherwise);
- SIGHUP reads the keys file at once (the server says so and keeps running).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from projections.sqlite_store import SqliteReadModel
from projections.store import Batch
from projections.views import RunView

CLI = [sys.executable, "-m", "runwatch.cli.main"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (the one its default route
    leaves by, else any its host name resolves to)."""
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        found.append(s.getsockname()[0])
    with contextlib.suppress(OSError):
        found += [i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    for addr in found:
        ip = ipaddress.ip_address(addr)
        if ip.is_loopback or ip.is_unspecified:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((addr, 0))
            except OSError:
                continue
        return addr
    pytest.skip(f"this machine has no non-loopback IPv4 address (found {found})")


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the IPv4 sockets listening on ``port`` (/proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hex_addr, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            out.add(socket.inet_ntoa(bytes.fromhex(hex_addr)[::-1]))
    return out


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("metrics") / "p.sqlite"
    views = {
        f"run-{i}": RunView(
            tenant_id=f"secret-tenant-{i % 2}",
            run_id=f"run-{i}",
            created_ts=1.7e9 + i,
            updated_ts=1.7e9 + i,
            state="RUNNING",
            usage={"spend_usd": 12.5, "committed_steps": 3},
        )
        for i in range(4)
    }
    store = SqliteReadModel(path)
    store.commit(Batch(views=views))
    store.close()
    return path


class Server:
    def __init__(self, proc: subprocess.Popen, err: Path, api: int, metrics: int) -> None:
        self.proc, self.err, self.api, self.metrics = proc, err, api, metrics

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for(self, fn, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited:\n{self.stderr()}"
            with contextlib.suppress(httpx.HTTPError, OSError):
                got = fn()
                if got:
                    return got
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.stderr()}")


@contextlib.contextmanager
def serve_api(tmp_path: Path, store_path: Path, *extra: str) -> Iterator[Server]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": "k0", "tenant": "secret-tenant-0"}]}))
    api, metrics = _port(), _port()
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "api",
                "--no-follow",
                "--store",
                str(store_path),
                "--keys",
                str(keys),
                "--port",
                str(api),
                "--metrics-port",
                str(metrics),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    server = Server(proc, err, api, metrics)
    try:
        server.wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{api}/healthz").status_code == 200, "the API"
        )
        yield server
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def test_metrics_are_loopback_only_by_default_and_sighup_reloads_keys(tmp_path, store_path):
    outside = non_loopback_address()
    with serve_api(tmp_path, store_path) as server:
        scrape = server.wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{server.metrics}/metrics"), "the exporter"
        )
        assert scrape.status_code == 200 and 'tenant="secret-tenant-0"' in scrape.text
        # the attack: scrape from this machine's network address
        assert refused(outside, server.metrics), f"/metrics reachable on {outside}"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{outside}:{server.metrics}/metrics", timeout=5)
        assert refused(outside, server.api)  # the API: the same default
        if Path("/proc/net/tcp").exists():
            assert listening_addresses(server.metrics) == {"127.0.0.1"}
        assert f"127.0.0.1:{server.metrics}/metrics (no auth)" in server.stderr()

        # SIGHUP: the keys file is read at once (no request needed), the server lives on
        keys = tmp_path / "keys.yaml"
        keys.write_text(
            yaml.safe_dump(
                {
                    "keys": [
                        {"key": "k0", "tenant": "secret-tenant-0", "revoked": True},
                        {"key": "k1", "tenant": "secret-tenant-1"},
                    ]
                }
            )
        )
        os.kill(server.proc.pid, signal.SIGHUP)
        server.wait_for(lambda: "SIGHUP: API keys reloaded" in server.stderr(), "the reload")
        base = f"http://127.0.0.1:{server.api}"
        assert httpx.get(f"{base}/v1/runs", headers={"X-API-Key": "k1"}).json()["total"] == 2
        assert httpx.get(f"{base}/v1/runs", headers={"X-API-Key": "k0"}).status_code == 401
        os.kill(server.proc.pid, signal.SIGHUP)
        server.wait_for(lambda: "SIGHUP: API keys unchanged" in server.stderr(), "a no-op")
        keys.write_text("keys: [")
        os.kill(server.proc.pid, signal.SIGHUP)
        server.wait_for(lambda: "API keys not reloaded" in server.stderr(), "the refusal")
        assert httpx.get(f"{base}/v1/runs", headers={"X-API-Key": "k1"}).status_code == 200
        assert server.proc.poll() is None


def test_wider_bind_is_explicit_and_a_token_protects_it(tmp_path, store_path):
    outside = non_loopback_address()
    token_file = tmp_path / "metrics.token"
    token_file.write_text("s3cret-scrape-token\n")
    extra = ("--metrics-host", "0.0.0.0", "--metrics-token-file", str(token_file))
    with serve_api(tmp_path, store_path, *extra) as server:
        url = f"http://{outside}:{server.metrics}/metrics"
        r = server.wait_for(lambda: httpx.get(url, timeout=5), "the exporter")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "secret-tenant" not in r.text
        for bad in ("Bearer wrong", "Bearer s3cret-scrape-token2", "Basic czNjcmV0", ""):
            r = httpx.get(url, headers={"Authorization": bad} if bad else {}, timeout=5)
            assert r.status_code == 401, bad
        ok = httpx.get(url, headers={"Authorization": "Bearer s3cret-scrape-token"}, timeout=5)
        assert ok.status_code == 200
        families = {f.name for f in text_string_to_metric_families(ok.text)}
        assert "runwatch_tenant_spend_usd" in families
        assert "bearer token required" in server.stderr()
        assert "without --metrics-token-file" not in server.stderr()


def test_a_wide_bind_without_a_token_is_warned_about(tmp_path, store_path):
    """Also the control of the default test: bound wide, the outside address does reach it."""
    outside = non_loopback_address()
    with serve_api(tmp_path, store_path, "--metrics-host", "0.0.0.0") as server:
        r = server.wait_for(
            lambda: httpx.get(f"http://{outside}:{server.metrics}/metrics", timeout=5),
            "the exporter",
        )
        assert r.status_code == 200 and 'tenant="secret-tenant-1"' in r.text
        assert "warning: metrics bound to 0.0.0.0 without --metrics-token-file" in server.stderr()


def test_a_missing_token_file_stops_the_server_before_it_serves(tmp_path, store_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": "k0", "tenant": "t"}]}))
    out = subprocess.run(
        [
            *CLI,
            "serve",
            "api",
            "--no-follow",
            "--store",
            str(store_path),
            "--keys",
            str(keys),
            "--metrics-port",
            str(_port()),
            "--metrics-token-file",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "metrics token file not readable" in out.stderr
