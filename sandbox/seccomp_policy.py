"""The seccomp filter every sandbox worker runs under, compiled with libseccomp (pyseccomp).

Default action: allow. Denied with EPERM (so tenant code sees a clean error, not a kill):

- network: ``socket``/``socketpair`` for every family except AF_UNIX (no TCP, UDP, raw,
  netlink or packet sockets; DNS resolution therefore fails too). AF_UNIX stays for
  ``multiprocessing`` inside a verifier; the mount and network namespaces leave it
  nothing outside the sandbox to connect to.
- process inspection: ``ptrace``, ``process_vm_readv/writev``, ``kcmp``, ``pidfd_getfd``.
- mounts and namespaces: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``unshare``,
  ``setns``, ``fsopen``/``fsmount``/``move_mount``/``open_tree``; ``clone`` with any
  namespace flag; ``clone3`` answers ENOSYS so libc falls back to the filtered ``clone``.
- kernel surface: ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``,
  ``keyctl``/``add_key``/``request_key``, module load/unload, ``kexec_*``, ``reboot``,
  ``swapon/off``, ``syslog``, ``acct``, ``quotactl``, clock setters, ``personality``,
  ``open_by_handle_at``/``name_to_handle_at``, ``lookup_dcookie``, ``vhangup``.
- host information: ``sysinfo`` (the host's load averages, free and total RAM, uptime and
  host-wide process count, everything the /proc masks hide; its ``procs`` let one tenant
  watch another fork: a cross-tenant channel). glibc's ``sysconf(_SC_PHYS_PAGES)`` and
  ``_SC_AVPHYS_PAGES`` read it, so they no longer describe the host either.
  ``CLOCK_BOOTTIME`` (host uptime) is read through the vDSO, with no system call to
  filter; without a time namespace it stays visible (``docs/threat-model.md``).
- change notification: ``fcntl(fd, F_NOTIFY, ...)`` (dnotify), the older interface to
  the same fsnotify events as the denied inotify/fanotify: a watch on a read-only
  directory fd of the shared ``/usr`` saw another tenant's sandbox import ``json`` and
  ``email`` (security review, 2026-11-28, second round, F3).
- host-wide mount counters: ``statx`` asking for ``STATX_MNT_ID_UNIQUE`` (its mask is
  passed by value); ``statmount`` and ``listmount`` answer ENOSYS (by number where this
  libseccomp does not know them). The 64-bit unique mount id grows host-wide and never
  repeats: each sandbox start adds ~90 mounts, so its delta between two batches counted
  another tenant's sandbox starts exactly (security review, 2026-11-28, second round,
  F4). Every nsfs ``ioctl`` (type 0xb7) is refused too: ``NS_GET_MNTNS_ID`` on
  ``/proc/self/ns/mnt`` gave the 64-bit mount-namespace id, as host-wide and never reused
  (each sandbox start makes one: the same count). The lowest-free counters that remain
  (mount ids in ``/proc/self/mountinfo``, namespace inode numbers) are documented in
  ``docs/threat-model.md``.
- the third round (review, 2026-11-28): ``timer_create`` (ENOSYS; a POSIX timer sent
  SIGCONT and continued the stopped worker between batches, F1); the Linux AIO calls
  (ENOSYS; contexts drawn from the host-wide ``fs.aio-max-nr``, F3); pidfds, whose pidfs
  inode numbers count every process created on the host (``pidfd_open`` ENOSYS,
  ``clone`` with ``CLONE_PIDFD`` and the ``SO_PEERPIDFD``/``SO_PASSPIDFD`` socket
  options EPERM, F7); ``SO_NETNS_COOKIE`` (EPERM; the host-wide network-namespace
  counter, F5).
- the fourth round (review, 2026-11-28): ``prctl(PR_SET_PDEATHSIG, ...)`` (EPERM). The
  worker is the sandbox's pid 1 and bubblewrap's ``--die-with-parent`` is a parent-death
  signal *on it*: one ``prctl(PR_SET_PDEATHSIG, 0)`` in ``reward()`` cleared it, so a
  SIGKILLed (or SIGTERMed) trainer left the sandbox running as init's child, past every
  deadline and CPU watcher the host enforced, its uid free for another tenant's worker.
  Nothing a reward needs sets it (glibc and CPython never do).

No-ops (the call returns 0 and does nothing): ``sync`` and ``syncfs``. Either one wrote
back the whole host's dirty page cache, or a whole host filesystem's (``syncfs`` on an
fd of the shared ``/usr``): 300 MB flushed by one ``os.sync()``, I/O charged to no
sandbox (security review, 2026-11-28). A reward writes only to its scratch tmpfs, which
has nothing to write back; ``fsync``/``fdatasync``/``sync_file_range`` act on one file
of the caller's and stay. ``fadvise64`` too: ``POSIX_FADV_DONTNEED`` on a read-only fd
of a shared ``/usr`` file dropped the *host's* cached pages of it (every tenant's
interpreter start and the host's own Python then read them from disk again; a
flush+reload cache channel besides). Advice is only advice: dropping it changes no
result (security review, 2026-11-28, second round, F2).

Direct I/O is refused with EINVAL (what a filesystem without O_DIRECT answers, so
callers fall back to buffered reads): ``open``/``openat`` whose flags carry ``O_DIRECT``,
and ``fcntl(fd, F_SETFL, ...|O_DIRECT)``. A reward read 1,985 MiB of ``/usr`` with
``O_DIRECT`` in 3 s: every read went to the host's disk, past the page cache, where the
trainer's checkpoints and the other tenants' sandboxes read too. ``openat2`` carries its
flags in a struct the filter cannot read, so it answers ENOSYS (glibc and Python fall
back to ``openat``). Buffered reads that miss the page cache are bounded per worker by
the ``cgroup_blkio`` layer (:func:`sandbox.isolation.worker_cgroups`), not here
(security review, 2026-11-28, second round, F2).

``execve`` stays allowed: the verifier tier runs further code by definition. The filter
is loaded by bubblewrap (``--seccomp FD``) right before the worker interpreter starts, so
it covers all tenant code, and ``no_new_privs`` is set with it.

The second-round entries above (dnotify, the unique mount id, ``fadvise64``, direct
I/O) come from the security review, 2026-11-28, second round; each is proven by a test
in ``tests/integration/test_sandbox_host_resources.py`` or next to the inotify test.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import tempfile
from typing import Any

AF_UNIX = 1

DENIED_SYSCALLS: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "personality",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "vhangup",
    # the read-only /usr every sandbox binds is one set of inodes: a watch on it saw
    # which modules another tenant's sandbox loaded, and when (red-team round three)
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_init",
    "fanotify_mark",
    # host load, RAM, uptime and the host-wide process count, past the /proc masks; the
    # count let tenant A watch tenant B fork (security review, 2026-11-27)
    "sysinfo",
)

#: Answered 0 without running (SCMP_ACT_ERRNO(0)): a reward that syncs or gives advice
#: still works. ``fadvise64_64`` exists on 32-bit arches only (skipped where unknown).
NOOP_SYSCALLS: tuple[str, ...] = ("sync", "syncfs", "fadvise64", "fadvise64_64")

#: Answered ENOSYS, so libc falls back to a call the filter can judge by its arguments
#: (``clone3``, ``openat2``: flags in a struct) or the caller sees "not on this kernel"
#: (``statmount``, ``listmount``; ``statfs``, ``fstatfs``, ``ustat``: a filesystem's free
#: blocks and inodes, which every sandbox's /proc masks, scratch and /usr share with the
#: host and each other, so one tenant read another's artifact sizes and sandbox starts
#: off them: found by review). Numbers are the x86_64/generic ones, used where this
#: libseccomp does not know the name.
ENOSYS_SYSCALLS: tuple[tuple[str, int], ...] = (
    ("clone3", 435),
    ("openat2", 437),
    ("statmount", 457),
    ("listmount", 458),
    ("statfs", 137),
    ("fstatfs", 138),
    ("ustat", 136),
    # POSIX timers: one delivering SIGCONT continued the worker the host had stopped
    # between batches, and its code ran through every wait (review, 2026-11-28, third
    # round, F1); setitimer/alarm stay (their signals do not continue a stopped process)
    ("timer_create", 222),
    # Linux AIO contexts come from the host-wide fs.aio-max-nr: one worker took all
    # 65,536 and every other tenant's io_setup failed, booked to that tenant (F3)
    ("io_setup", 206),
    ("io_destroy", 207),
    ("io_getevents", 208),
    ("io_submit", 209),
    ("io_cancel", 210),
    ("io_pgetevents", 333),
    # a pidfd's inode number (pidfs) counts every process and thread created on the host,
    # never reused: it watched other tenants fork, exactly (F7); see also the clone and
    # socket-option rules
    ("pidfd_open", 434),
)

#: ``O_DIRECT`` on x86_64 (and most arches; arm64 differs: ``os.O_DIRECT`` is used when
#: this Python knows it, which is the host's own ABI, the one the filter is built for).
O_DIRECT = 0o40000
#: ``fcntl`` commands: ``F_SETFL`` (may set ``O_DIRECT`` on an open fd), ``F_NOTIFY``.
F_SETFL = 4
F_NOTIFY = 1026
#: ``statx`` mask bit of the host-wide, never-reused 64-bit mount id (Linux 6.8+).
STATX_MNT_ID_UNIQUE = 0x4000
#: The nsfs ioctls' type byte (``linux/nsfs.h``: ``NSIO``), bits 8-15 of the command;
#: the type is theirs alone (``Documentation/userspace-api/ioctl/ioctl-number.rst``).
NSIO_TYPE, IOCTL_TYPE_MASK = 0xB700, 0xFF00

#: ``clone``'s ``CLONE_PIDFD`` (a pidfd: the host-wide pidfs counter, F7).
CLONE_PIDFD = 0x1000
#: ``SOL_SOCKET`` options refused to ``getsockopt``/``setsockopt``: ``SO_NETNS_COOKIE``
#: (the host-wide network-namespace counter, as the refused ``NS_GET_MNTNS_ID`` was: F5),
#: ``SO_PASSPIDFD`` and ``SO_PEERPIDFD`` (pidfds: F7).
SOL_SOCKET = 1
SOCKET_OPTIONS_REFUSED: tuple[int, ...] = (71, 76, 77)

#: ``prctl`` option that sets (or clears) the caller's parent-death signal.
PR_SET_PDEATHSIG = 1
#: The bits of a 64-bit argument register the kernel reads for an ``int`` argument.
INT_MASK = 0xFFFFFFFF

#: Every CLONE_NEW* flag: user, mount, net, pid, ipc, uts, cgroup, time.
CLONE_NS_BITS: tuple[int, ...] = (
    0x10000000,
    0x00020000,
    0x40000000,
    0x20000000,
    0x08000000,
    0x04000000,
    0x02000000,
    0x00000080,
)


@functools.lru_cache(maxsize=1)
def compiled_filter() -> bytes:
    """The BPF program (bytes) bubblewrap loads via ``--seccomp FD``. Cached per process."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        _add_if_known(flt, deny, name)
    for name in NOOP_SYSCALLS:
        _add_if_known(flt, sc.ERRNO(0), name)
    flt.add_rule(deny, "socket", sc.Arg(0, sc.NE, AF_UNIX))
    flt.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))
    for bit in CLONE_NS_BITS:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    for name, number in ENOSYS_SYSCALLS:
        _add_if_known(flt, sc.ERRNO(errno.ENOSYS), name, number)
    _add_direct_io_rules(flt)
    _add_host_counter_rules(flt)
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()


def _add_if_known(flt: Any, action: int, name: str, number: int | None = None) -> None:
    """Add ``action`` for syscall ``name`` (unconditionally); by ``number`` where this
    libseccomp does not know the name. Silently nothing where neither resolves: a
    syscall this arch lacks needs no rule."""
    for syscall in (name, number):
        if syscall is None:
            continue
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            flt.add_rule(action, syscall)
            return


def _o_direct() -> int:
    """The host's ``O_DIRECT`` (this Python's, the ABI the filter is built for)."""
    import os

    return getattr(os, "O_DIRECT", O_DIRECT)


def _add_direct_io_rules(flt: Any) -> None:
    """EINVAL for ``open``/``openat`` with ``O_DIRECT`` in their flags and for
    ``fcntl(F_SETFL)`` setting it; the flags are passed by value, so the filter sees
    them. Assumes the filter is built for the arch it runs on (bubblewrap loads it on
    the same host)."""
    import pyseccomp as sc

    einval = sc.ERRNO(errno.EINVAL)
    direct = _o_direct()
    for name, flags_arg in (("open", 1), ("openat", 2)):
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            flt.add_rule(einval, name, sc.Arg(flags_arg, sc.MASKED_EQ, direct, direct))
    for name in ("fcntl", "fcntl64"):
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            flt.add_rule(einval, name, _int_eq(1, F_SETFL), sc.Arg(2, sc.MASKED_EQ, direct, direct))


def _add_host_counter_rules(flt: Any) -> None:
    """EPERM for dnotify (``fcntl(F_NOTIFY)``), for ``statx`` asking for the unique
    mount id, for the nsfs ioctls (``NS_GET_MNTNS_ID`` and kin), for ``clone`` with
    ``CLONE_PIDFD`` and for the socket options of :data:`SOCKET_OPTIONS_REFUSED`:
    cross-tenant channels through the shared ``/usr`` inodes and the host-wide mount,
    namespace and pidfs counters (see the module docstring)."""
    import pyseccomp as sc

    deny = sc.ERRNO(errno.EPERM)
    for name in ("fcntl", "fcntl64"):
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            flt.add_rule(deny, name, _int_eq(1, F_NOTIFY))
    with contextlib.suppress(RuntimeError, ValueError, OSError):
        flt.add_rule(
            deny, "statx", sc.Arg(3, sc.MASKED_EQ, STATX_MNT_ID_UNIQUE, STATX_MNT_ID_UNIQUE)
        )
    with contextlib.suppress(RuntimeError, ValueError, OSError):
        flt.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, IOCTL_TYPE_MASK, NSIO_TYPE))
    flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_PIDFD, CLONE_PIDFD))
    flt.add_rule(deny, "prctl", _int_eq(0, PR_SET_PDEATHSIG))  # (--die-with-parent)
    for name in ("getsockopt", "setsockopt"):
        for option in SOCKET_OPTIONS_REFUSED:
            flt.add_rule(deny, name, _int_eq(1, SOL_SOCKET), _int_eq(2, option))


def _int_eq(arg: int, value: int) -> Any:
    """Argument ``arg`` equals ``value`` as the kernel reads an ``int`` (or ``unsigned
    int``) argument: its low 32 bits. A plain ``EQ`` compares the whole 64-bit register,
    so the same option with garbage in the upper half passed the filter and the kernel
    truncated it to the refused call (found by review: ``prctl((1 << 32) |
    PR_SET_PDEATHSIG, 0)`` cleared the death signal, ``getsockopt(SOL_SOCKET, (1 << 32) |
    SO_NETNS_COOKIE)`` read the cookie)."""
    import pyseccomp as sc

    return sc.Arg(arg, sc.MASKED_EQ, INT_MASK, value)
