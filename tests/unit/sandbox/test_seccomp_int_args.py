"""The seccomp filter judges ``int`` arguments by the 32 bits the kernel reads.

Found by review: the rules compared the whole 64-bit register, so a refused call with
garbage in the upper half of an ``int`` argument passed the filter and the kernel,
truncating it, did the refused thing: ``prctl((1 << 32) | PR_SET_PDEATHSIG, 0)`` cleared
the worker's death signal (the sandbox outlived a killed trainer), ``getsockopt(SOL_SOCKET,
(1 << 32) | SO_NETNS_COOKIE)`` read the host-wide cookie, ``fcntl(fd, (1 << 32) |
F_NOTIFY)`` set a dnotify watch. The real filter is loaded into a throwaway process (a
filter cannot be unloaded) and each call is made plainly and with the high bits set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyseccomp")

REPO = Path(__file__).resolve().parents[3]

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, signal, socket, tempfile
    from sandbox.seccomp_policy import compiled_filter

    libc = ctypes.CDLL(None, use_errno=True)
    SYS_prctl, SYS_seccomp, SYS_getsockopt, SYS_fcntl = 157, 317, 55, 72
    HIGH = 1 << 32

    def call(nr, *args):
        ctypes.set_errno(0)
        rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) if isinstance(a, int) else a
                                                for a in args))
        return rc, ctypes.get_errno()

    def pdeathsig():
        v = ctypes.c_int(0)
        libc.prctl(2, ctypes.byref(v), 0, 0, 0)
        return v.value

    assert libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0
    prog = compiled_filter()
    buf = ctypes.create_string_buffer(prog, len(prog))
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fp = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
    assert call(SYS_seccomp, 1, 0, ctypes.byref(fp))[0] == 0
    out = {}
    for name, option in (("plain", 1), ("high", HIGH | 1)):
        out[f"prctl_{name}"] = [*call(SYS_prctl, option, 0), pdeathsig()]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    val, ln = ctypes.c_uint64(0), ctypes.c_uint32(8)
    for name, level, opt in (("plain", 1, 71), ("high_opt", 1, HIGH | 71),
                             ("high_level", HIGH | 1, 71)):
        out[f"getsockopt_{name}"] = list(call(SYS_getsockopt, s.fileno(), level, opt,
                                              ctypes.byref(val), ctypes.byref(ln)))
    fd = os.open(tempfile.gettempdir(), os.O_RDONLY)
    for name, cmd in (("plain", 1026), ("high", HIGH | 1026)):
        out[f"fnotify_{name}"] = list(call(SYS_fcntl, fd, cmd, 1))
    print(json.dumps(out))
    """
)


def test_int_arguments_are_judged_on_their_low_32_bits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    eperm = 1
    for name in ("plain", "high"):  # refused, the death signal kept (SIGKILL = 9)
        assert out[f"prctl_{name}"] == [-1, eperm, 9], (name, out)
    for name in ("plain", "high_opt", "high_level"):
        assert out[f"getsockopt_{name}"] == [-1, eperm], (name, out)
    for name in ("plain", "high"):
        assert out[f"fnotify_{name}"] == [-1, eperm], (name, out)
