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

No-ops (the call returns 0 and does nothing): ``sync`` and ``syncfs``. Either one wrote
back the whole host's dirty page cache, or a whole host filesystem's (``syncfs`` on an
fd of the shared ``/usr``): 300 MB flushed by one ``os.sync()``, I/O charged to no
sandbox (security review, 2026-11-28). A reward writes only to its scratch tmpfs, which
has nothing to write back; ``fsync``/``fdatasync``/``sync_file_range`` act on one file
of the caller's and stay.

``execve`` stays allowed: the verifier tier runs further code by definition. The filter
is loaded by bubblewrap (``--seccomp FD``) right before the worker interpreter starts, so
it covers all tenant code, and ``no_new_privs`` is set with it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import tempfile

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

#: Answered 0 without running (SCMP_ACT_ERRNO(0)): a reward that syncs still works.
NOOP_SYSCALLS: tuple[str, ...] = ("sync", "syncfs")

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
        try:
            flt.add_rule(deny, name)
        except (RuntimeError, ValueError, OSError):
            continue  # syscall unknown to this libseccomp/arch: nothing to deny
    for name in NOOP_SYSCALLS:
        flt.add_rule(sc.ERRNO(0), name)
    flt.add_rule(deny, "socket", sc.Arg(0, sc.NE, AF_UNIX))
    flt.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))
    for bit in CLONE_NS_BITS:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    with contextlib.suppress(RuntimeError, ValueError, OSError):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()
