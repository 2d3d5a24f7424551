"""Per-worker isolation resources, each acquired by one helper and released in ``finally``.

One worker owns: an unprivileged uid/gid (its own on the whole host, :class:`UidAllocator`,
so every per-uid kernel budget counts only its tree), a pids cgroup and a memory cgroup (v1,
when writable), a private scratch directory (a size- and inode-capped tmpfs) and the
bubblewrap command line that stacks the namespaces, read-only minimal filesystem view,
empty environment and seccomp filter. Trees are removed without recursion
(:func:`remove_tree`, :func:`empty_dir`): a tenant decides how deep its scratch goes.

Host layout (never visible inside any sandbox)::

    <base>/pool-<pid>-<id>/artifact/reward.py     tenant artifact, read-only, root-owned
    <base>/pool-<pid>-<id>/runtime/worker_main.py the in-sandbox loop, read-only copy
    <base>/w-<pid>-<n>/scratch                    one worker's scratch (tmpfs), its uid's
    <base>/uids/<uid>                             lock file: flock held while a worker has it

``<pid>`` is the host process that made it, so :func:`reap_stale` can clean up after a
host process that was killed before its ``finally`` blocks ran.

Inside a sandbox the filesystem is only: /usr (ro) and its /bin, /lib* links, /etc/ld.so.cache
(ro), a fresh /proc of the sandbox's pid namespace, a read-only minimal /dev, /runtime and
/artifact (ro) and /scratch (rw, private, emptied after every batch).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import logging
import os
import shlex
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox.classify import MAX_ARTIFACT_BYTES, read_artifact
from sandbox.features import (
    CGROUP_PARENT,
    CGROUP_V1_ROOT,
    KernelFeatures,
    _root_symlinks,
    block_devices,
    mount_tmpfs,
    umount,
)
from sandbox.types import ResourceLimits

log = logging.getLogger("runwatch.sandbox")

RUNTIME_SOURCE = Path(__file__).with_name("runtime") / "worker_main.py"
UID_BASE = 200_000
CFS_PERIOD_US = 100_000
#: The cgroup v1 controllers a worker may get, keyed as in :func:`worker_cgroups`.
CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "blkio")
UID_SLOTS = 256
#: Ranges of ``UID_SLOTS`` uids: the sandbox uids are UID_BASE .. UID_BASE + 256,000 - 1.
UID_RANGES = 1000


def base_dir() -> Path:
    """Where pool and worker directories live: /run when root, else the temp dir."""
    for cand in ("/run/runwatch-sandbox", os.path.join(tempfile.gettempdir(), "runwatch-sandbox")):
        try:
            os.makedirs(cand, mode=0o711, exist_ok=True)
            os.chmod(cand, 0o711)
            return Path(cand)
        except OSError:
            continue
    return Path(tempfile.mkdtemp(prefix="runwatch-sandbox-"))


class UidAllocator:
    """Hands out per-worker uids, unique host-wide: one lock file per uid.

    A uid is this worker's while this allocator holds an exclusive ``flock`` on
    ``<base>/uids/<uid>`` (a root-only directory), from :meth:`acquire` to :meth:`release`;
    the kernel drops the lock when the holding process dies, so a crashed trainer leaves
    nothing to clean up. Two trainer processes on one host therefore never run two
    tenants under one uid, whose per-user kernel budgets (RLIMIT_NPROC, pipe pages, POSIX
    mqueue bytes, pending signals, ...) one tenant could then spend for the other
    (security review, 2026-11-28: uids were keyed by the host pid modulo 1000).

    The scan for a free uid starts at a range keyed by this process's pid (``_base``:
    distinct processes rarely contend) and covers all ``UID_RANGES`` x ``UID_SLOTS`` uids.
    Assumes every process that runs sandboxes on this host uses this allocator and the
    same base directory, and that nothing else on the host uses these uids.
    """

    def __init__(self, lock_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # uid -> fd of its locked file
        self._handed_out: set[int] = set()
        self._lock_dir = lock_dir
        self._base = UID_BASE + (os.getpid() % UID_RANGES) * UID_SLOTS

    def acquire(self) -> int | None:
        """A uid no other worker on this host holds, held until :meth:`release`; None
        when all are taken or the lock directory is unusable."""
        with self._lock:
            try:
                lock_dir = self._directory()
            except OSError:
                log.error("sandbox uid lock directory unusable", exc_info=True)
                return None
            first = self._base - UID_BASE
            for i in range(UID_RANGES * UID_SLOTS):
                uid = UID_BASE + (first + i) % (UID_RANGES * UID_SLOTS)
                if uid not in self._held and self._try_lock(lock_dir, uid):
                    self._handed_out.add(uid)
                    return uid
        return None

    def release(self, uid: int) -> None:
        """Give ``uid`` back (after every process of its worker is dead)."""
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # drops the flock

    def held(self) -> frozenset[int]:
        """The uids this allocator holds now."""
        with self._lock:
            return frozenset(self._held)

    def handed_out(self) -> frozenset[int]:
        """Every uid this allocator has handed out (tests look for processes left under them)."""
        with self._lock:
            return frozenset(self._handed_out)

    def _directory(self) -> Path:
        path = self._lock_dir or base_dir() / "uids"
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        if path.is_symlink() or not path.is_dir():
            raise OSError(f"{path} is not a directory")
        os.chmod(path, 0o700)
        self._lock_dir = path
        return path

    def _try_lock(self, lock_dir: Path, uid: int) -> bool:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(lock_dir / str(uid), flags, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._held[uid] = fd
        return True


UIDS = UidAllocator()


@dataclass(frozen=True)
class ArtifactBundle:
    """A tenant artifact staged read-only for workers, with its digest."""

    root: Path
    artifact_dir: Path
    runtime_dir: Path
    digest: str


def stage_artifact(source: Path, max_bytes: int = MAX_ARTIFACT_BYTES) -> ArtifactBundle:
    """Copy ``source`` and the worker runtime into a fresh root-owned read-only directory.

    Reads at most ``max_bytes`` (every worker gets a copy): raises
    :class:`sandbox.classify.ArtifactTooLarge` past it, ``OSError`` when unreadable."""
    data = read_artifact(Path(source), max_bytes)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    root = base_dir() / f"pool-{os.getpid()}-{uuid.uuid4().hex[:12]}-{pid_namespace()}"
    (root / "artifact").mkdir(parents=True, mode=0o755)
    (root / "runtime").mkdir(mode=0o755)
    os.chmod(root, 0o755)
    (root / "artifact" / "reward.py").write_bytes(data)
    shutil.copyfile(RUNTIME_SOURCE, root / "runtime" / "worker_main.py")
    for f in (root / "artifact" / "reward.py", root / "runtime" / "worker_main.py"):
        os.chmod(f, 0o444)
    return ArtifactBundle(root, root / "artifact", root / "runtime", digest)


def unstage_artifact(bundle: ArtifactBundle) -> None:
    remove_tree(bundle.root)


#: set when this kernel (or Python) has no ``pidfd_open``: :meth:`Cgroup.kill_all` kills
#: by pid then, racing pid reuse as before
_NO_PIDFD: list[bool] = []


def _pidfds(pids: set[int]) -> dict[int, int]:
    """A pidfd for each of ``pids`` still alive (the process is pinned: its pid can no
    longer name another); {} and :data:`_NO_PIDFD` set where pidfds are not available."""
    out: dict[int, int] = {}
    if _NO_PIDFD or not hasattr(os, "pidfd_open"):
        _NO_PIDFD[:] = [True]
        return out
    for pid in pids:
        try:
            out[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone already
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                _NO_PIDFD[:] = [True]
                for fd in out.values():
                    os.close(fd)
                return {}
    return out


class Cgroup:
    """One v1 cgroup directory of one controller, with a limit; ``close`` kills and removes."""

    def __init__(self, controller: str, name: str) -> None:
        self.controller = controller
        self.path = Path(CGROUP_V1_ROOT) / controller / CGROUP_PARENT / name

    def create(self, limits: dict[str, str]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for fname, value in limits.items():
            try:
                (self.path / fname).write_text(value)
            except OSError:
                if not fname.startswith("memory.memsw"):  # no swap accounting: fine
                    raise

    def write_each(self, fname: str, lines: list[str]) -> int:
        """Write each line to ``fname`` in its own write (per-device files take one rule
        per write); returns how many the kernel accepted, skipping those it refused."""
        accepted = 0
        for line in lines:
            try:
                (self.path / fname).write_text(line)
                accepted += 1
            except OSError:
                continue
        return accepted

    def procs(self) -> set[int]:
        try:
            return {int(x) for x in (self.path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def read_counter(self, fname: str, key: str) -> int:
        """A ``key value`` line of a flat-keyed file (pids.events, memory.oom_control)."""
        try:
            for line in (self.path / fname).read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == key:
                    return int(parts[1])
        except (OSError, ValueError):
            pass
        return 0

    def cpu_seconds(self) -> float:
        """CPU time used by the group so far (``cpuacct.usage``; 0 where absent)."""
        return self.read_int("cpuacct.usage") / 1e9

    def read_int(self, fname: str) -> int:
        try:
            return int((self.path / fname).read_text().strip())
        except (OSError, ValueError):
            return 0

    def kill_all(self, keep: set[int] | None = None, rounds: int = 50) -> bool:
        """SIGKILL every process of the group but ``keep``, round after round while new
        ones appear (forked between a listing and its kill). True when none is left; False
        after ``rounds`` (processes that keep forking): the caller must not trust it.

        A listed pid is signalled through a pidfd opened after the listing and only if
        the group still lists it once the pidfd is open: a process that exited after the
        listing and whose pid the host reused meanwhile is never the one killed (a plain
        ``kill(pid)`` could hit a host process; suspected by review, closed here)."""
        keep = keep or set()
        for _ in range(rounds):
            victims = self.procs() - keep
            if not victims:
                return True
            pinned = _pidfds(victims)
            still = self.procs() if pinned else set()
            for pid, fd in pinned.items():
                try:
                    if pid in still:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass
                finally:
                    os.close(fd)
            if not pinned and _NO_PIDFD:  # a kernel without pidfds: as before
                for pid in victims:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        return not (self.procs() - keep)

    def close(self) -> None:
        try:
            self.kill_all()
        finally:
            self._rmdir()

    def _rmdir(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)


@contextlib.contextmanager
def worker_cgroups(
    name: str, limits: ResourceLimits, features: KernelFeatures, layers: frozenset[str]
) -> Iterator[dict[str, Cgroup]]:
    """The pids, memory, cpu and blkio cgroups of one worker (those usable and
    requested), keyed by controller name (``pids``, ``memory``, ``cpu``, ``cpuacct``,
    ``blkio``)."""
    groups: dict[str, Cgroup] = {}
    try:
        if "cgroup_pids" in layers and features.usable.get("cgroup_pids"):
            cg = Cgroup("pids", name)
            groups["pids"] = cg
            cg.create({"pids.max": str(limits.pids)})
        if "cgroup_memory" in layers and features.usable.get("cgroup_memory"):
            cg = Cgroup("memory", name)
            groups["memory"] = cg
            cg.create(
                {
                    "memory.limit_in_bytes": str(limits.memory_bytes),
                    "memory.memsw.limit_in_bytes": str(limits.memory_bytes),
                }
            )
        if "cgroup_cpu" in layers and features.usable.get("cgroup_cpu"):
            cg = Cgroup("cpu", name)
            groups["cpu"] = cg
            cg.create(
                {
                    "cpu.cfs_period_us": str(CFS_PERIOD_US),
                    "cpu.cfs_quota_us": str(max(1000, int(limits.cpu_cores * CFS_PERIOD_US))),
                }
            )
            # CPU-time evidence (RLIMIT_CPU kills with SIGKILL): cpuacct, where it is a
            # hierarchy of its own (on a joint cpu,cpuacct mount the cpu group has it)
            acct = Path(CGROUP_V1_ROOT) / "cpuacct"
            if acct.is_dir() and acct.resolve() != (Path(CGROUP_V1_ROOT) / "cpu").resolve():
                cg = Cgroup("cpuacct", name)
                groups["cpuacct"] = cg
                cg.create({})
        if "cgroup_blkio" in layers and features.usable.get("cgroup_blkio"):
            cg = Cgroup("blkio", name)
            groups["blkio"] = cg
            cg.create({})
            throttle_reads(cg, limits)
        yield groups
    finally:
        for cg in groups.values():
            with contextlib.suppress(Exception):
                cg.close()


def throttle_reads(cg: Cgroup, limits: ResourceLimits) -> None:
    """Cap the group's reads from every host block device (:func:`block_devices`) at
    ``disk_read_bps`` bytes/s and ``disk_read_iops`` operations/s. Devices the kernel
    refuses a rule for (a partition-less placeholder, say) are skipped; raises ``OSError``
    when it accepts none (the probe said it would: the spawn fails, the platform's)."""
    devices = block_devices()
    for fname, value in (
        ("blkio.throttle.read_bps_device", limits.disk_read_bps),
        ("blkio.throttle.read_iops_device", limits.disk_read_iops),
    ):
        if not cg.write_each(fname, [f"{dev} {max(1, int(value))}" for dev in devices]):
            raise OSError(f"blkio: no block device accepted {fname} ({len(devices)} listed)")


def scratch_inodes(limits: ResourceLimits) -> int:
    """Files the scratch tmpfs may hold: one per 4 KiB page of its size (16,384 for 64 MiB).

    ``size=`` bounds a tmpfs's data, not its files: an empty file costs no page but ~1 KiB
    of kernel memory, and the default bound is half the host's RAM pages (a reward made
    166,000 empty files, 152 MB of kernel memory, in 4 s). The memory cgroup would stop it
    near its cap; this stops it at a few MiB, with or without that cgroup."""
    return max(1024, limits.scratch_bytes // 4096)


@contextlib.contextmanager
def scratch_dir(
    name: str, uid: int, limits: ResourceLimits, features: KernelFeatures, layers: frozenset[str]
) -> Iterator[Path]:
    """A private scratch directory owned by ``uid``: a size- and inode-capped tmpfs.

    ``scratch_tmpfs`` is a required layer (:data:`sandbox.features.REQUIRED_LAYERS`): a
    plain directory, bounded per file only, is made here only for a worker started below
    the tier gate without that layer (the controls of the tests). A failed mount raises
    (the spawn fails: ``platform_error``) rather than fall back to one."""
    root = base_dir() / f"w-{name}"
    scratch = root / "scratch"
    mounted = False
    try:
        root.mkdir(mode=0o700)
        scratch.mkdir(mode=0o700)
        if "scratch_tmpfs" in layers and features.usable.get("scratch_tmpfs"):
            err = mount_tmpfs(
                str(scratch),
                f"size={limits.scratch_bytes},nr_inodes={scratch_inodes(limits)},"
                f"mode=0700,uid={uid},gid={uid}",
            )
            if err is not None:  # never a silent plain directory: it would bound nothing
                raise OSError(f"scratch tmpfs mount failed: {err}")
            mounted = True
        if not mounted and os.geteuid() == 0:
            os.chown(scratch, uid, uid)
        os.chmod(root, 0o711)
        yield scratch
    finally:
        if mounted:
            umount(str(scratch))
        remove_tree(root)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True


@functools.lru_cache(maxsize=1)
def pid_namespace() -> str:
    """This process's pid namespace, as the inode of ``/proc/self/ns/pid`` ("0" where it
    cannot be read). Worker names carry it (:func:`worker_name`): a pid names a process
    only inside its own namespace."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def worker_name(n: int) -> str:
    """``<pid>-<n>-<pid namespace>``: the name of this process's ``n``-th worker (its
    cgroups, ``w-<name>`` its scratch). Two trainers in different pid namespaces (two
    containers) that share the host's cgroup hierarchy may have the same pid: with the
    namespace in the name they never share a group (one tenant's limits and CPU time
    booked to another), and :func:`reap_stale` reaps only what its own namespace left
    (security review, 2026-11-28, second round: a suspicion, not reproduced here)."""
    return f"{os.getpid()}-{n}-{pid_namespace()}"


def reap_stale() -> int:
    """Remove scratch mounts and cgroups left by host processes that died without their
    ``finally`` (SIGKILL, power loss). Names carry the creating pid and its pid namespace:
    ``w-<pid>-<n>-<ns>``, ``<pid>-<n>-<ns>`` (before 2026-11-28 without the namespace:
    taken as this one's). What another pid namespace's process made is never reaped here:
    whether its pid is alive cannot be told from this one. Returns how many were reaped.
    Never raises."""
    reaped = 0
    try:
        root = base_dir()
        entries = list(os.scandir(root))
    except Exception:
        entries = []
    ours = pid_namespace()
    for entry in entries:
        parts = entry.name.split("-")
        if entry.name.startswith(("w-", "pool-")) and _ours(parts[3:], ours, len(parts) - 3):
            reaped += _reap_one(entry.path, parts[1], functools.partial(_reap_dir, entry.path))
    for controller in CONTROLLERS:
        parent = Path(CGROUP_V1_ROOT) / controller / CGROUP_PARENT
        try:
            groups = [e.name for e in os.scandir(parent) if e.is_dir()]
        except Exception:
            continue
        for name in groups:
            parts = name.split("-")
            if _ours(parts[2:], ours, len(parts) - 2):
                close = Cgroup(controller, name).close
                reaped += _reap_one(f"{controller}:{name}", parts[0], close)
    return reaped


def _ours(tail: list[str], ours: str, extra: int) -> bool:
    """Is a leftover whose name ends in ``tail`` (after its pid and number) this pid
    namespace's? No tail: an old name, taken as ours; one part: its namespace."""
    return extra == 0 or (extra == 1 and tail[0] == ours)


def _reap_one(what: str, pid: str, reap: Callable[[], object]) -> int:
    """Reap one leftover made by host process ``pid`` if that process is dead: 1 if
    reaped, else 0. Never raises: one bad entry does not stop the others."""
    if not pid.isdigit():
        return 0
    try:
        if _pid_alive(int(pid)):
            return 0
        reap()
        return 1
    except Exception:
        log.warning("sandbox leftover %s not reaped", what, exc_info=True)
        return 0


def _reap_dir(path: str) -> None:
    umount(os.path.join(path, "scratch"))
    if not remove_tree(Path(path)):
        raise OSError(f"{path} could not be removed whole")


def empty_dir(path: Path) -> bool:
    """Remove everything inside ``path`` (kept itself); True when it is empty after.

    Host side, with the tenant's processes stopped or dead. Without recursion, without
    following a symlink and without building long paths (see :func:`_drain`), so neither
    a tree thousands of directories deep (``shutil.rmtree`` is recursive on Python 3.11:
    RecursionError at ~1,000 levels) nor a directory without permissions leaves anything
    behind. Never raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return _drain(fd)
    except Exception:
        return False
    finally:
        os.close(fd)


def remove_tree(path: Path) -> bool:
    """Remove ``path`` and everything under it like :func:`empty_dir` (a symlink or file
    at ``path`` is unlinked, never followed). True when it is gone. Never raises."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True
        empty_dir(path)
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _drain(top: int) -> bool:
    """Empty the directory open at ``top``: unlink what is not a directory, and for each
    subdirectory move *its* subdirectories up into ``top`` (under fresh names), unlink its
    other entries and remove it. Each round removes at least one directory, so any depth
    takes constant fds and stack. Stops when a round makes no progress; True if empty."""
    hoisted = itertools.count()
    while True:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(top)]
        if not entries:
            return True
        progress = False
        for name, is_dir in entries:
            try:
                if is_dir:
                    _flatten_one(top, name, hoisted)
                    os.rmdir(name, dir_fd=top)
                else:
                    os.unlink(name, dir_fd=top)
                progress = True
            except OSError:
                continue
        if not progress:
            return False


def _flatten_one(top: int, name: str, hoisted: Iterator[int]) -> None:
    """Move the subdirectories of ``top/name`` up into ``top`` and unlink its other
    entries, leaving it empty (``top/name`` was seen as a directory, not a symlink)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    except PermissionError:  # not root: a directory the tenant made unreadable (its own)
        _chmod_dir_at(top, name)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o700)  # its entries can be unlinked and moved out
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    _chmod_dir_at(fd, entry.name)  # a directory moved needs w
                fresh = f".rw-rm-{os.getpid()}-{next(hoisted)}-{uuid.uuid4().hex[:8]}"
                os.rename(entry.name, fresh, src_dir_fd=fd, dst_dir_fd=top)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)


def _chmod_dir_at(dir_fd: int, name: str) -> None:
    """``chmod 0700`` the directory ``name`` in ``dir_fd``, never what a symlink there
    points at: opened ``O_PATH|O_NOFOLLOW|O_DIRECTORY`` (a symlink is refused, ENOTDIR),
    then changed through its ``/proc/self/fd`` link, the inode opened, never a path looked
    up again. (Found by review: a path ``chmod`` here followed a symlink the tenant swapped
    in after the listing, and the host, as root, made a host file 0700.) Raises OSError."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
    finally:
        os.close(fd)


#: Top-level /proc entries a sandbox keeps: its own processes (numeric), ``self``,
#: ``thread-self`` and the symlinks into them. Everything else in /proc describes the
#: host (``stat``, ``pressure``, ``cgroups`` counts live sandboxes of other tenants,
#: ``loadavg``, ``sys/kernel/random/boot_id``...) and is masked: files by a read-only
#: empty file, directories by a read-only empty directory — the procfs equivalent of
#: ``subset=pid``, which bubblewrap cannot pass to its /proc mount.
PROC_KEEP = frozenset({"self", "thread-self"})


@functools.lru_cache(maxsize=1)
def proc_masks() -> tuple[tuple[str, bool], ...]:
    """The host-describing /proc entries to mask, as ``(name, is_dir)`` (read once)."""
    masks: list[tuple[str, bool]] = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir("/proc"), key=lambda e: e.name):
            if entry.name.isdigit() or entry.name in PROC_KEEP or entry.is_symlink():
                continue
            with contextlib.suppress(OSError):
                masks.append((entry.name, entry.is_dir(follow_symlinks=False)))
    return tuple(masks)


def empty_masks() -> tuple[str, str]:
    """A root-owned read-only empty (directory, file) pair that masks /proc entries."""
    path = base_dir() / "empty"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o755)
    d, f = path / "dir", path / "file"
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o555)
    if not f.exists():
        f.write_bytes(b"")
    os.chmod(d, 0o555)
    os.chmod(f, 0o444)
    return str(d), str(f)


def bwrap_argv(
    *,
    features: KernelFeatures,
    layers: frozenset[str],
    scratch: Path,
    python: str,
    fd: int,
    seccomp_fd: int | None,
    artifact_fd: int,
    runtime_fd: int,
) -> list[str]:
    """The bubblewrap command line of one worker (namespaces + minimal read-only view).

    The worker is the sandbox's pid 1 (``--as-pid-1``): no process of bubblewrap's runs
    inside the sandbox, so there is no foreign init for tenant code to write to through
    ``/proc/1/mem`` — pid 1 is the tenant's own process, under the tenant's own rlimits and
    cgroups, holding no host fd. The artifact and the worker runtime are copied in from
    fds (``--ro-bind-data``), so no host path appears in the sandbox's mount table.
    """
    assert features.bwrap is not None
    argv = [features.bwrap, "--unshare-user", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    if "net_ns" in layers:
        argv.append("--unshare-net")
    if "pid_ns" in layers:
        argv.append("--unshare-pid")
        if "own_pid1" in layers:
            argv.append("--as-pid-1")
    argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr", *_root_symlinks()]
    if os.path.exists("/etc/ld.so.cache"):
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    py_real = os.path.realpath(python)
    if not py_real.startswith("/usr/"):
        prefix = str(Path(py_real).parent.parent)
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--proc", "/proc"]
    if "proc_masked" in layers:
        empty_dir_, empty_file_ = empty_masks()
        for name, is_dir in proc_masks():
            argv += ["--ro-bind", empty_dir_ if is_dir else empty_file_, f"/proc/{name}"]
    # a new devpts instance still draws on the kernel's one pty pool (kernel.pty.max,
    # shared by every devpts but the host's): both ways in are masked, so no sandbox can
    # exhaust it for the host's containers and the other tenants' sandboxes
    empty_file = empty_masks()[1]
    argv += ["--dev", "/dev", "--ro-bind", empty_file, "/dev/ptmx"]
    argv += ["--ro-bind", empty_file, "/dev/pts/ptmx", "--remount-ro", "/dev"]
    argv += ["--perms", "0555", "--dir", "/runtime", "--perms", "0555", "--dir", "/artifact"]
    argv += ["--perms", "0444", "--ro-bind-data", str(runtime_fd), "/runtime/worker_main.py"]
    argv += ["--perms", "0444", "--ro-bind-data", str(artifact_fd), "/artifact/reward.py"]
    argv += ["--bind", str(scratch), "/scratch", "--remount-ro", "/", "--chdir", "/scratch"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--", python, "-I", "-S", "-B", "/runtime/worker_main.py", str(fd)]
    return argv


def launch_argv(
    *, uid: int | None, setpriv: str | None, cgroups: dict[str, Cgroup], inner: list[str]
) -> list[str]:
    """Wrap ``inner``: join the cgroups as root, then drop to ``uid`` and exec.

    The shell joins its own pid to each cgroup before anything else runs, so every process
    of the sandbox starts inside them (no race with an early fork).
    """
    script = "".join(
        f"echo $$ > {shlex.quote(str(cg.path / 'cgroup.procs'))} || exit 97; "
        for cg in cgroups.values()
    )
    script += 'exec "$@"'
    dropped = inner
    if uid is not None and setpriv:
        dropped = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *inner]
    return ["/bin/sh", "-c", script, "sandbox-launch", *dropped]
