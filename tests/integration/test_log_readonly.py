"""Reading a log never writes it (issue #19 item 2), as real CLI processes.

A real log (a fleet of runs on the projection topics plus imported rollout traces) is
built small (one segment per topic) and large (8 KiB segments: dozens per topic), its
last telemetry and trace segments are torn (7 or 37 bytes cut, a cut inside a record
header, a flipped byte), and every read command runs on it: ``log cat``, ``replay``
(in memory, key-sharded, into a store), ``audit verify``, ``profile``, ``log export
--from`` and ``serve api --log``. Each must exit 0, report the torn tails (topic, offset,
bytes) on stderr and in its JSON, and leave every file and directory of the log
byte-identical. What it reports is checked against what a writer's open of another copy
then moves into ``quarantine/``. Last, the same commands on a read-only bind mount.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from events.log.embedded import EmbeddedLog
from producers.sinks import EmbeddedSink
from producers.trace_import import import_traces
from producers.trace_synth import write_synthetic_traces
from runwatch.hosting.read_model import INPUTS
from tests.projection_runs import synth_fleet, write_log
from tests.unit.events.test_embedded_log_readonly import snapshot, tear

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "runwatch.cli.main"]
TORN = ("runwatch.telemetry", "runwatch.traces")
SIZES = {"small": (2, 8, 64 * 1024 * 1024, 4096), "large": (12, 40, 8192, 40)}


def _build(root: Path, size: str) -> Path:
    runs, steps, segment_bytes, trace_batch = SIZES[size]
    log = EmbeddedLog(root, sync=False, segment_bytes=segment_bytes)
    log.open_sync()
    write_log(log, synth_fleet(runs, steps, tenants=3))
    traces = root.parent / f"{size}-traces"
    write_synthetic_traces(traces, steps=3, workers=4, requests_per_worker=8, straggler=(2, 1, 5.0))
    sink = EmbeddedSink(log)
    import_traces(
        traces, run_id="run-0000", tenant_id="tenant-0", write=sink.write, batch_size=trace_batch
    )
    for topic in TORN:
        n = len(list((root / topic).glob("*.seg")))
        assert n == 1 if size == "small" else n > 3, (topic, n)
    return root


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("readonly-logs")
    return {size: _build(base / size, size) for size in SIZES}


def _torn_copy(logs: dict[str, Path], size: str, how: str, dest: Path) -> Path:
    shutil.copytree(logs[size], dest)
    for topic in TORN:
        tear(sorted((dest / topic).glob("*.seg"))[-1], how)
    return dest


def _expected(torn: Path, scratch: Path) -> tuple[dict[str, dict[str, object]], dict[str, int]]:
    """What a writer's open of a copy moves into quarantine (topic -> offset, bytes, ...)
    and where reads of the torn log end: the ground truth for what a reader must skip and
    report. (A torn tail is cut; a whole last record that fails its checksum, ``flip``, is
    replaced by a placeholder at its offset: reads of the torn copy end there either way.)"""
    shutil.copytree(torn, scratch)
    writer = EmbeddedLog(scratch)
    cuts = {}
    recoveries = writer.open_sync()
    for rec in recoveries:
        cuts[rec.topic] = {
            "topic": rec.topic,
            "offset": rec.offset,
            "bytes": rec.quarantined_bytes,
            "problem": rec.problem,
            "segment": rec.segment,
            "position": rec.position,
            "later_segments": 0,
        }
    ends = {t: writer.end_offset_sync(t) for t in writer.topic_names()}
    ends.update({rec.topic: rec.offset for rec in recoveries})
    return cuts, ends


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _warned(stderr: str, cuts: dict[str, dict[str, object]], topics=TORN) -> None:
    for topic in topics:
        cut = cuts[topic]
        assert f"{topic}: torn tail skipped at offset {cut['offset']} ({cut['bytes']} bytes" in (
            stderr
        ), stderr


def _torn_lines(stdout: str) -> tuple[list[dict], list[dict]]:
    """(the records/events, the ``torn_tail`` objects) of a ``--json`` line stream."""
    docs = [json.loads(line) for line in stdout.splitlines()]
    return [d for d in docs if "torn_tail" not in d], [
        d["torn_tail"] for d in docs if "torn_tail" in d
    ]


CASES = [
    ("small", "cut7"),
    ("small", "cut37"),
    ("small", "header"),
    ("large", "cut7"),
    ("large", "cut37"),
    ("large", "header"),
    ("large", "flip"),
]


@pytest.mark.parametrize(("size", "how"), CASES)
def test_every_read_command_leaves_a_torn_log_byte_identical(
    logs: dict[str, Path], tmp_path: Path, size: str, how: str
) -> None:
    log = _torn_copy(logs, size, how, tmp_path / "evidence")
    cuts, ends = _expected(log, tmp_path / "scratch")
    assert set(cuts) == set(TORN)
    want_tails = [cuts[t] for t in sorted(cuts)]
    before = snapshot(log)
    assert any("quarantine" in p for p in snapshot(tmp_path / "scratch"))  # a writer cuts

    def unchanged(what: str) -> None:
        after = snapshot(log)
        assert after == before, (what, set(after.items()) ^ set(before.items()))

    cat = _ok(_run("log", "cat", log, "--json", cwd=tmp_path))
    unchanged("log cat")
    records, tails = _torn_lines(cat.stdout)
    assert tails == want_tails
    assert len(records) == sum(ends.values())
    _warned(cat.stderr, cuts)

    replay = _ok(_run("replay", log, "--json", cwd=tmp_path))
    unchanged("replay")
    derived, tails = _torn_lines(replay.stdout)
    assert tails == want_tails and derived
    _warned(replay.stderr, cuts)

    sharded = _ok(_run("replay", log, "--json", "--workers", "2", cwd=tmp_path))
    unchanged("replay --workers 2")
    derived2, tails = _torn_lines(sharded.stdout)
    assert tails == want_tails
    assert sorted(map(json.dumps, derived2)) == sorted(map(json.dumps, derived))

    store = tmp_path / "store.sqlite"
    _warned(_ok(_run("replay", log, "--store", store, cwd=tmp_path)).stderr, cuts)
    unchanged("replay --store")

    audit = _ok(_run("audit", "verify", "--store", store, "--log", log, "--json", cwd=tmp_path))
    unchanged("audit verify")
    report = json.loads(audit.stdout)
    assert report["identical"] and report["torn_tails"] == want_tails
    assert report["positions"] == {f"{t}:0": ends[t] for t in INPUTS if ends.get(t)}
    _warned(audit.stderr, cuts)

    profile = _ok(_run("profile", log, "--no-plots", "--json", cwd=tmp_path))
    unchanged("profile")
    doc = json.loads(profile.stdout)
    assert doc["kind"] == "log" and doc["torn_tails"] == [cuts["runwatch.traces"]]
    assert doc["runs"][0]["run_id"] == "run-0000"
    _warned(profile.stderr, cuts, topics=["runwatch.traces"])

    copy = tmp_path / "clean-copy"
    export = _ok(_run("log", "export", "--from", log, "--to", copy, "--json", cwd=tmp_path))
    unchanged("log export --from")
    summary = json.loads(export.stdout)
    assert summary["records"] == ends and summary["torn_tails"] == want_tails
    _warned(export.stderr, cuts)
    # the copy holds every good record, is whole, and replays exactly as the source
    again = _ok(_run("log", "cat", copy, "--json", cwd=tmp_path))
    assert _torn_lines(again.stdout) == (records, []) and "torn tail" not in again.stderr
    replayed = _ok(_run("replay", copy, "--json", cwd=tmp_path))
    assert _torn_lines(replayed.stdout) == (derived, [])

    unchanged("all of it")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store_positions(store: Path) -> dict[str, int]:
    try:
        con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
        try:
            return dict(con.execute("SELECT * FROM positions").fetchall())
        finally:
            con.close()
    except sqlite3.Error:
        return {}


def test_serve_api_follows_a_torn_log_without_writing_it(
    logs: dict[str, Path], tmp_path: Path
) -> None:
    log = _torn_copy(logs, "large", "cut37", tmp_path / "evidence")
    for lock in log.glob("*/LOCK"):  # a copy without the writers' lock files
        lock.unlink()
    cuts, ends = _expected(log, tmp_path / "scratch")
    want = {f"{t}:0": ends[t] for t in INPUTS if ends.get(t)}
    before = snapshot(log)
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {key: ops, operator: true}\n")
    store = tmp_path / "live.sqlite"
    proc = subprocess.Popen(
        [*CLI, "serve", "api", "--log", str(log), "--store", str(store), "--keys", str(keys),
         "--port", str(_port()), "--settle-s", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while _store_positions(store) != want:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, _store_positions(store)
            time.sleep(0.2)
        time.sleep(1.0)  # a few more polls and commits of the follower
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
    assert snapshot(log) == before
    _warned(stderr, cuts, topics=["runwatch.telemetry"])
    assert "follower stopped" not in stderr, stderr


def _can_bind_read_only() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


READ_ONLY_SCRIPT = r"""
set -u
mount --bind -o ro "$LOG" "$MNT" || exit 90
if touch "$MNT/probe" 2>/dev/null; then echo "the bind mount is writable" >&2; exit 91; fi
if touch "$MNT/runwatch.telemetry/LOCK" 2>/dev/null; then exit 92; fi
run() { name=$1; shift; "$PY" -m runwatch.cli.main "$@" >"$OUT/$name.out" 2>"$OUT/$name.err";
        echo $? >"$OUT/$name.rc"; }
run cat log cat "$MNT" --json
run replay replay "$MNT" --json --workers 2
run store replay "$MNT" --store "$OUT/store.sqlite"
run audit audit verify --store "$OUT/store.sqlite" --log "$MNT" --json
run profile profile "$MNT" --no-plots --json
run export log export --from "$MNT" --to "$OUT/copy" --json
"$PY" -m runwatch.cli.main serve api --log "$MNT" --store "$OUT/live.sqlite" --keys "$KEYS" \
    --port "$PORT" --settle-s 0.2 >"$OUT/serve.out" 2>"$OUT/serve.err" &
pid=$!
for _ in $(seq 300); do
    "$PY" -c "$CAUGHT_UP" 2>/dev/null && break
    sleep 0.2
done
sleep 1
kill -INT $pid; wait $pid; echo $? >"$OUT/serve.rc"
"""


#: exit 0 once the follower's store holds the positions in $WANT
CAUGHT_UP = """
import json, os, sqlite3, sys
con = sqlite3.connect(f"file:{os.environ['OUT']}/live.sqlite?mode=ro", uri=True)
sys.exit(dict(con.execute("SELECT * FROM positions").fetchall()) != json.loads(os.environ["WANT"]))
"""


@pytest.mark.skipif(not _can_bind_read_only(), reason="needs root and unshare -m (mount ns)")
def test_every_read_command_works_on_a_read_only_mount(
    logs: dict[str, Path], tmp_path: Path
) -> None:
    """A read-only location stops root too (EROFS): any write, lock file or repair would
    fail here. Every read command runs inside a private mount namespace on a read-only
    bind mount of a torn multi-segment log."""
    log = _torn_copy(logs, "large", "header", tmp_path / "evidence")
    cuts, ends = _expected(log, tmp_path / "scratch")
    want = {f"{t}:0": ends[t] for t in INPUTS if ends.get(t)}
    before = snapshot(log)
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {key: ops, operator: true}\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "LOG": str(log),
        "MNT": str(mnt),
        "OUT": str(out),
        "PY": sys.executable,
        "KEYS": str(keys),
        "PORT": str(_port()),
        "WANT": json.dumps(want),
        "CAUGHT_UP": CAUGHT_UP,
    }
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", READ_ONLY_SCRIPT],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("cat", "replay", "store", "audit", "profile", "export", "serve"):
        err = (out / f"{name}.err").read_text()
        assert (out / f"{name}.rc").read_text().strip() == "0", (name, err[-3000:])
        assert "torn tail skipped" in err and "follower stopped" not in err, (name, err)
    records, tails = _torn_lines((out / "cat.out").read_text())
    assert len(records) == sum(ends.values()) and tails == [cuts[t] for t in sorted(cuts)]
    assert json.loads((out / "audit.out").read_text())["identical"]
    assert json.loads((out / "export.out").read_text())["records"] == ends
    assert _store_positions(out / "live.sqlite") == want
    assert snapshot(log) == before
