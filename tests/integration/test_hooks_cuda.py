"""A multi-process run's verdict on NCCL: the broadcast tensor lives on the current CUDA
device (NCCL takes no CPU tensor), and the verdict and the keepalive go through.

Skipped where torch sees no CUDA device (CI has none); run on a lent GPU machine with the
trainer's CUDA tests. One GPU is a world of one: the two-rank protocol itself is tested
on gloo (``tests/integration/test_hooks_ddp.py``).
"""

from __future__ import annotations

import socket

import pytest
import torch

from producers.hooks import ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_the_verdict_is_broadcast_from_a_cuda_tensor_on_nccl() -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        verdict = ranks.WorldVerdict(timeout_s=8.0)
        assert verdict._word.device.type == "cuda" and verdict.heartbeat_s == 2.0

        def decide(keepalive) -> bool:  # type: ignore[no-untyped-def]
            verdict._last -= 5.0  # as if paused 5 s: the keepalive broadcasts a HOLD
            keepalive()
            return True

        assert verdict.share(decide) is True
        assert verdict.said == 2  # the HOLD, then the STOP
        assert int(verdict._word.item()) == ranks.STOP
    finally:
        dist.destroy_process_group()
