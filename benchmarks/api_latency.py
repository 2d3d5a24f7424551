"""Query API read latency, p50/p99, with ~200 concurrent clients from a second process.

Builds a SQLite read model from a synthetic fleet, starts ``runwatch serve api
--no-follow`` as its own process (uvicorn, one worker), and drives it from this process
with ``--clients`` concurrent HTTP/1.1 keep-alive clients (asyncio streams), each
issuing a mix of customer reads for its own tenant: run detail, charts, run listing.

Anchor measured in the same run: ``GET /healthz`` (no auth, no store read) under the same
concurrency -- the server + client floor on this box; the read figures minus this floor
is what the read model and tenant checks cost.

Usage: python benchmarks/api_latency.py [--clients 200] [--seconds 10] [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import yaml

from events.log.embedded import EmbeddedLog
from projections.sqlite_store import SqliteReadModel
from runwatch.hosting.replay import rebuild_from_log
from tests.projection_runs import synth_fleet, write_log

TENANTS = 20


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _get(reader, writer, request: bytes) -> int:
    """One keep-alive HTTP/1.1 GET on an open connection; returns the status code."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def drive(
    port: int, clients: int, seconds: float, paths_for, auth_for
) -> tuple[list[float], int]:
    """``clients`` concurrent keep-alive connections, each sending one request at a time.
    A minimal asyncio HTTP/1.1 client (raw streams), so the client process costs little
    and the figures are the server's, not a client library's."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal errors
        rng = random.Random(i)
        auth = "".join(f"{k}: {v}\r\n" for k, v in auth_for(i).items())
        requests = [f"GET {p} HTTP/1.1\r\nHost: bench\r\n{auth}\r\n".encode() for p in paths_for(i)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                request = rng.choice(requests)
                t = time.perf_counter()
                status = await _get(reader, writer, request)
                latencies.append(time.perf_counter() - t)
                if status != 200:
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = EmbeddedLog(root / "log", sync=False)
        log.open_sync()
        write_log(log, synth_fleet(args.runs, args.steps, tenants=TENANTS))
        store_path = root / "p.sqlite"
        rebuild_from_log(root / "log", SqliteReadModel(store_path), collect=False)
        runs_of: dict[str, list[str]] = {}
        for v in SqliteReadModel(store_path).all_views():
            runs_of.setdefault(v.tenant_id, []).append(v.run_id)
        tenants = sorted(runs_of)
        keys = {"keys": [{"key": f"key-{t}", "tenant": t} for t in tenants]}
        (root / "keys.yaml").write_text(yaml.safe_dump(keys))
        port = _port()
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runwatch.cli.main",
                "serve",
                "api",
                "--no-follow",
                "--store",
                str(store_path),
                "--keys",
                str(root / "keys.yaml"),
                "--port",
                str(port),
                "--read-rate",
                "0",  # the latency of serving, not of refusing: no per-tenant read limit
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    if httpx.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)

            def tenant(i: int) -> str:
                return tenants[i % len(tenants)]

            def reads(i: int) -> list[str]:
                mine = runs_of[tenant(i)]
                return (
                    [f"/v1/runs/{r}" for r in mine]
                    + [f"/v1/runs/{r}/charts" for r in mine]
                    + ["/v1/runs?limit=20"]
                )

            def auth(i: int) -> dict[str, str]:
                return {"Authorization": f"Bearer key-{tenant(i)}"}

            floor, floor_err = asyncio.run(
                drive(port, args.clients, args.seconds / 2, lambda i: ["/healthz"], lambda i: {})
            )
            lat, err = asyncio.run(drive(port, args.clients, args.seconds, reads, auth))
        finally:
            server.terminate()
            server.wait(20)

    print(
        f"server: runwatch serve api (uvicorn, 1 process) on SQLite, {args.runs} runs, "
        f"{TENANTS} tenants; clients: {args.clients} concurrent from a second process; "
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}"
    )
    cols = ("requests", "req/s", "p50 ms", "p99 ms", "errors")
    print(f"{'measurement':34s} " + " ".join(f"{c:>8s}" for c in cols))
    for name, xs, e, secs in (
        ("anchor: GET /healthz", floor, floor_err, args.seconds / 2),
        ("customer reads (run/charts/list)", lat, err, args.seconds),
    ):
        print(
            f"{name:34s} {len(xs):9d} {len(xs) / secs:8.0f} {1000 * statistics.median(xs):8.1f} "
            f"{1000 * pct(xs, 0.99):8.1f} {e:6d}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
