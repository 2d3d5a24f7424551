"""The run's device (``TrainerConfig.device``): refused before anything starts when this
host lacks it, and made deterministic for the bitwise resume tier.

A run's config names ``cpu``, ``cuda`` or ``cuda:N``; the config snapshot travels with the
run, so a resume on a host without the GPU the run trained on is the common case this
guards: without the check, torch failed deep inside the trainer's start and the CLI
reported a bug in runwatch.
"""

from __future__ import annotations

import os

import torch

#: cuBLAS's documented deterministic workspace (8 buffers of 4 MiB per stream).
CUBLAS_DETERMINISTIC = ":4096:8"


class DeviceUnavailable(ValueError):
    """The config's device is not one torch has on this host (the message says which)."""


def check_device(device: str) -> torch.device:
    """``device`` as a torch device, if this host has it; else :class:`DeviceUnavailable`.

    Counting CUDA devices does not start a CUDA context."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceUnavailable(f"device {device!r} is not a torch device ({exc})") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise DeviceUnavailable(f"device {device!r}: the trainer runs on 'cpu' or 'cuda'")
    n = torch.cuda.device_count()
    if n == 0:
        raise DeviceUnavailable(
            f"device {device!r} asked for, but torch {torch.__version__} sees no CUDA device "
            "on this host; run it on a GPU host, or set device: cpu (a new run: a resume on "
            "another device cannot be bitwise)"
        )
    if dev.index is not None and dev.index >= n:
        raise DeviceUnavailable(f"device {device!r}: this host has {n} CUDA device(s)")
    return dev


def deterministic_cuda() -> None:
    """Make cuBLAS deterministic for this process: ``CUBLAS_WORKSPACE_CONFIG`` (kept if
    the operator already set it, e.g. ``:16:8`` for less memory).

    PyTorch releases until late 2025 refuse every cuBLAS matrix product in deterministic
    mode without it (PyTorch then dropped the check: cuBLAS workspaces are allocated per
    handle and stream); torch 2.11 with CUDA 13.0, measured on an H200, runs bitwise
    without it. Costs nothing where it is not needed. Assumes no cuBLAS handle exists
    yet in the process (cuBLAS reads the variable when it creates one): the trainer calls
    this before its first CUDA tensor.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
