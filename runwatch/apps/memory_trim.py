"""Give freed heap pages back to the OS after bursts of large, short-lived buffers.

Request bodies and payload copies are large, short-lived and interleaved with long-lived
objects, so glibc would otherwise keep the peak forever (RSS is a budget, seed 004).
Only once a burst is over (less than 1/8 of ``churn_bytes`` appended in ``every_s``):
while pushes go on, the freed pages are used again at once, and handing them back only
makes the next requests fault them in again (page faults are dear on a VM). Time: the
event loop's clock paces it; nothing else depends on it.
"""

from __future__ import annotations

import asyncio
import ctypes


class Churn:
    """Bytes appended since the last trim (the host adds, :func:`trim_memory` resets)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


async def trim_memory(churn: Churn, every_s: float = 0.5, churn_bytes: int = 8 << 20) -> None:
    """Run forever: ``malloc_trim`` once ``churn_bytes`` were appended and a burst ended."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return
    seen = churn.bytes
    while True:
        await asyncio.sleep(every_s)
        # quiet: less than 1/8 of the threshold appended since the last look (a trainer's
        # polls and small events do not hold the trim off)
        quiet, seen = churn.bytes - seen < churn_bytes // 8, churn.bytes
        if quiet and churn.bytes >= churn_bytes:
            churn.bytes = seen = 0
            trim(0)
