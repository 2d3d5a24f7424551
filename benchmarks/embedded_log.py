"""Embedded log append and read rates (events/s, MB/s), next to their anchors.

Anchors, measured in the same run on the same disk:
- append: the same bytes written to one plain file in the same batch size (no framing,
  no checksum, no lock) with the same fsync policy — the cost floor of the format;
- read: the same file read back in 1 MiB chunks (no parsing) — the I/O floor.

The runwatch figures include the codec (encode on append, decode on read) where said.

    python benchmarks/embedded_log.py [--count 1000000] [--batch 1000] [--fsync]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from events import TrainerStepCompleted, decode, encode
from events.envelope import new_envelope
from events.log.embedded import EmbeddedLog

TOPIC = "runwatch.telemetry"


def _events(n: int) -> list[TrainerStepCompleted]:
    return [
        TrainerStepCompleted(
            **new_envelope(
                tenant_id="t",
                run_id=f"run-{i % 100}",
                producer="bench",
                seq=i,
                step=i // 100,
                ts=1.7e9 + i,
            ),
            reward_mean=0.5,
            kl_to_ref=0.01,
            entropy=1.2,
            grad_norm=0.3,
            loss=0.1,
            lr=1e-3,
        )
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--fsync", action="store_true", help="fsync every batch (default: flush)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    try:
        events = _events(args.count)
        t = time.perf_counter()
        values = [(e.key(), encode(e)) for e in events]
        encode_s = time.perf_counter() - t
        nbytes = sum(len(v) for _, v in values)
        mb = nbytes / 1e6

        # anchor: plain file, same batches, same fsync policy
        plain = root / "plain.bin"
        t = time.perf_counter()
        with open(plain, "ab") as f:
            for i in range(0, len(values), args.batch):
                f.write(b"".join(v for _, v in values[i : i + args.batch]))
                f.flush()
                if args.fsync:
                    os.fsync(f.fileno())
        plain_append_s = time.perf_counter() - t

        log = EmbeddedLog(root / "log", sync=args.fsync)
        log.open_sync()
        t = time.perf_counter()
        for i in range(0, len(values), args.batch):
            log.append_many_sync(TOPIC, values[i : i + args.batch])
        append_s = time.perf_counter() - t

        t = time.perf_counter()
        with open(plain, "rb") as f:
            while f.read(1 << 20):
                pass
        plain_read_s = time.perf_counter() - t

        reader = EmbeddedLog(root / "log", readonly=True)
        reader.open_sync()
        t = time.perf_counter()
        n = sum(1 for _ in reader.read_sync(TOPIC))
        read_s = time.perf_counter() - t
        assert n == args.count
        t = time.perf_counter()
        decoded = sum(1 for r in reader.read_sync(TOPIC) if decode(r.value))
        read_decode_s = time.perf_counter() - t
        assert decoded == args.count

        t = time.perf_counter()
        EmbeddedLog(root / "log").open_sync()  # a writer's open verifies every record
        open_s = time.perf_counter() - t

        c = args.count
        rows = [
            ("append (framed, crc32, locked)", c / append_s, mb / append_s),
            ("  anchor: plain file append", c / plain_append_s, mb / plain_append_s),
            ("  codec encode alone", c / encode_s, mb / encode_s),
            ("read (verify crc32, no decode)", c / read_s, mb / read_s),
            ("read + codec decode", c / read_decode_s, mb / read_decode_s),
            ("  anchor: plain file read (1 MiB chunks)", c / plain_read_s, mb / plain_read_s),
            ("open for write (recovery scan)", c / open_s, mb / open_s),
        ]
        policy = "every batch" if args.fsync else "off (flush)"
        print(f"embedded log: {c:,} events, {nbytes / c:.0f} B each, {mb:.0f} MB, "
              f"batch {args.batch}, fsync={policy}")  # fmt: skip
        print(f"{'measurement':<42} {'events/s':>12} {'MB/s':>9}")
        for name, eps, mbps in rows:
            print(f"{name:<42} {eps:>12,.0f} {mbps:>9.1f}")
        print(f"append / plain-file append: {plain_append_s / append_s:.2f}; "
              f"read / plain-file read: {plain_read_s / read_s:.2f}")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
