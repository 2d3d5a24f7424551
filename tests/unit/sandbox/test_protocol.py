"""Length-prefixed JSON framing (host side) against hostile peers over a real socketpair."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

from sandbox.protocol import WATCH_EVERY_S, RecvError, encode_frame, recv_frame, send_frame


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def test_round_trip() -> None:
    a, b = pair()
    with a, b:
        assert send_frame(a, {"op": "score", "id": 1, "batch": []}, time.monotonic() + 1) is None
        f = recv_frame(b, time.monotonic() + 1, 1024)
        assert f.message == {"op": "score", "id": 1, "batch": []} and f.error is None


def test_nan_parses_so_the_gate_can_refuse_it() -> None:
    a, b = pair()
    with a, b:
        body = b'{"op":"result","id":1,"scores":[NaN,Infinity]}'
        a.sendall(struct.pack(">I", len(body)) + body)
        f = recv_frame(b, time.monotonic() + 1, 1024)
        assert f.message is not None and f.message["scores"][0] != f.message["scores"][0]


def test_oversize_refused_before_reading_the_body() -> None:
    a, b = pair()
    with a, b:
        a.sendall(struct.pack(">I", 1 << 30))
        f = recv_frame(b, time.monotonic() + 1, 1 << 20)
        assert f.error is RecvError.OVERSIZE and f.message is None


def test_timeout_eof_malformed() -> None:
    a, b = pair()
    with a, b:
        t = time.monotonic()
        assert recv_frame(b, t + 0.1, 100).error is RecvError.TIMEOUT
        assert time.monotonic() - t < 0.5
        body = b"\xff\xfe not json"
        a.sendall(struct.pack(">I", len(body)) + body)
        assert recv_frame(b, time.monotonic() + 1, 100).error is RecvError.MALFORMED
        body = json.dumps([1, 2]).encode()
        a.sendall(struct.pack(">I", len(body)) + body)
        assert recv_frame(b, time.monotonic() + 1, 100).error is RecvError.MALFORMED
        a.sendall(struct.pack(">I", 50) + b"{")  # truncated, then the peer dies
        a.close()
        assert recv_frame(b, time.monotonic() + 1, 100).error is RecvError.EOF


def test_host_never_sends_nan() -> None:
    try:
        encode_frame({"x": float("nan")})
    except ValueError:
        return
    raise AssertionError("NaN encoded")


def test_a_watch_ends_the_wait_even_while_bytes_trickle_in() -> None:
    """The host's CPU budget is asked every WATCH_EVERY_S of a receive; a peer that writes
    a byte at a time (the worker's socket is the tenant's to write) cannot hold it off."""
    a, b = pair()
    with a, b:
        stop = threading.Event()

        def trickle() -> None:
            a.sendall(struct.pack(">I", 1000))
            while not stop.is_set():
                a.sendall(b" ")
                time.sleep(WATCH_EVERY_S / 4)

        looks: list[float] = []
        t = threading.Thread(target=trickle)
        t.start()
        try:
            start = time.monotonic()

            def watch() -> bool:
                looks.append(time.monotonic() - start)
                return len(looks) >= 3

            f = recv_frame(b, start + 5.0, 4096, watch)
        finally:
            stop.set()
            t.join()
        assert f.error is RecvError.CUT and f.message is None
        assert len(looks) == 3 and looks[-1] < 10 * WATCH_EVERY_S, looks


def test_a_watch_that_never_fires_changes_nothing() -> None:
    a, b = pair()
    with a, b:
        calls: list[int] = []

        def watch() -> bool:
            calls.append(1)
            return False

        def later() -> None:
            time.sleep(0.35)
            send_frame(a, {"op": "result", "id": 1}, time.monotonic() + 1)

        t = threading.Thread(target=later)
        t.start()
        f = recv_frame(b, time.monotonic() + 2, 1024, watch)
        t.join()
        assert f.message == {"op": "result", "id": 1} and calls  # asked while it waited
        t0 = time.monotonic()
        assert recv_frame(b, t0 + 0.25, 100, watch).error is RecvError.TIMEOUT
        assert time.monotonic() - t0 < 0.6
