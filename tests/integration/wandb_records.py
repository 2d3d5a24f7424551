"""Read an offline W&B run's ``run-<id>.wandb`` file back with wandb's own protobufs.

The file is W&B's record log (the LevelDB log layout): a 7-byte header (``:W&B``, magic
0xBEE1 little-endian, version 0), then 32 KiB blocks of chunks, each a 7-byte header
(CRC-32, length u16 LE, type: 1 full, 2 first, 3 middle, 4 last) and its data; a block's
tail shorter than a header is zero padding. Each reassembled record is a serialized
``wandb.proto.wandb_internal_pb2.Record``. (The Python reader wandb once shipped,
``wandb.sdk.internal.datastore``, left with the Go core; the format did not change.)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)


def records(path: Path) -> Iterator[object]:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:7] == FILE_HEADER, data[:7]
    pos, pending = 7, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - (pos % BLOCK)
        if left_in_block < HEADER:
            pos += left_in_block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + HEADER : pos + HEADER + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"bad crc at {pos}"
        pos += HEADER + length
        pending += chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            pending = b""
            yield rec
