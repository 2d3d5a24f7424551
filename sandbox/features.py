"""Start-up detection of the kernel features each isolation layer needs.

The sandbox never assumes a kernel: :func:`probe` tries each layer for real (a throwaway
bubblewrap sandbox under an unprivileged uid, a seccomp filter compile, a cgroup directory
with a limit written into it, a tmpfs mount) and reports what works and why not.

:func:`tier_gate` turns that report into a decision per tier. Every built tier needs the
same layers (:data:`REQUIRED_LAYERS`: every layer without an equivalent fallback), and is
refused outright when one is missing or not requested. The tier is picked by an AST scan
of the tenant's own code (:mod:`sandbox.classify`), which the tenant controls
(``getattr(builtins, "__imp" + "ort__")`` hides an import from it): were the function
tier allowed fewer layers, a host missing seccomp would run evasive verifier code
without it (security review, 2026-11-27). Tiers differ in recycling and failure policy
only. Layers with a fallback may be missing; they are named loudly (logged as a warning,
and carried on every outcome) rather than dropped in silence.

Fallbacks that are *not* weaker in kind, and so do not refuse any tier:
``cgroup_pids`` -> RLIMIT_NPROC under the worker's own uid; ``cgroup_memory`` -> RLIMIT_AS;
``cgroup_cpu`` -> RLIMIT_CPU (per process: neither a rate nor a total for the worker's
tree). ``cgroup_blkio`` (a read rate cap on every host block device) has no equivalent
and may still be missing: a host without the v1 blkio controller runs every tier, the
layer named missing on every outcome; seccomp still refuses ``O_DIRECT``, so what is
left unbounded there is buffered reads that miss the page cache (security review,
2026-11-28, second round). ``scratch_tmpfs`` has none and is required (security review,
2026-11-28): the plain host directory it fell back to was bounded per file only
(RLIMIT_FSIZE), not in bytes or files, so one batch wrote 646 MB to the host's disk
past a 256 MiB memory cap, and a tree 1,500 deep then defeated the cleanup. A host that
cannot mount a tmpfs (not root) refuses every tier.

The probe costs ~50 ms and is cached per process (``probe()``); pass explicit paths to probe
a different setup (tests use that to prove refusal).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from sandbox.types import ALL_LAYERS

log = logging.getLogger("runwatch.sandbox")

CGROUP_V1_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "runwatch-sandbox"

#: Layers the bubblewrap probe reports on.
BWRAP_LAYERS = (
    "unprivileged_uid",
    "empty_env",
    "user_ns",
    "mount_ns",
    "net_ns",
    "pid_ns",
    "own_pid1",
    "proc_masked",
)

#: Layers with an equivalent fallback (see module docstring).
FALLBACKS: dict[str, str] = {
    "cgroup_cpu": "RLIMIT_CPU (CPU-seconds per process, no rate cap, no total per tree)",
    "cgroup_pids": "RLIMIT_NPROC under the worker's own uid",
    "cgroup_memory": "RLIMIT_AS",
    "cgroup_blkio": "none: disk reads that miss the page cache are not rate-limited "
    "(O_DIRECT stays refused by seccomp)",
}

#: Layers without which no tier runs: every layer but those with a fallback
#: (:data:`FALLBACKS`). One set for every tier: the tier is the tenant's to influence.
REQUIRED_LAYERS: frozenset[str] = frozenset(ALL_LAYERS) - FALLBACKS.keys()
#: Per tier, for callers that ask by tier: the same set for each (see the module doc).
REQUIRED_BY_TIER: dict[str, frozenset[str]] = {
    tier: REQUIRED_LAYERS for tier in ("function", "verifier", "environment", "reward_model")
}


@dataclass(frozen=True)
class KernelFeatures:
    """What this host allows. ``usable`` maps layer -> bool; ``why`` explains each miss."""

    usable: dict[str, bool]
    why: dict[str, str] = field(default_factory=dict)
    bwrap: str | None = None
    setpriv: str | None = None
    is_root: bool = False

    def missing(self) -> tuple[str, ...]:
        return tuple(layer for layer in ALL_LAYERS if not self.usable.get(layer, False))

    def describe(self) -> str:
        lines = ["sandbox kernel features:"]
        for layer in ALL_LAYERS:
            ok = self.usable.get(layer, False)
            note = "" if ok else f"  <- MISSING: {self.why.get(layer, 'unknown')}"
            if not ok and layer in FALLBACKS:
                note += f" (fallback: {FALLBACKS[layer]})"
            lines.append(f"  {layer:<17} {'yes' if ok else 'NO '}{note}")
        for tier in ("function", "verifier"):
            gate = tier_gate(self, tier)
            lines.append(
                f"  tier {tier:<9} {'allowed' if gate.allowed else 'REFUSED'}"
                f"{'' if not gate.message else ': ' + gate.message}"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class TierGate:
    """Whether a tier may run here, which requested layers are missing, and a message."""

    allowed: bool
    missing: tuple[str, ...]
    message: str


def tier_gate(
    features: KernelFeatures, tier: str, requested: frozenset[str] | None = None
) -> TierGate:
    """Decide whether ``tier`` may run with the ``requested`` layers on this kernel.

    Every built tier needs each layer of :data:`REQUIRED_LAYERS` both usable and
    requested, whatever the tier (it comes from the tenant's code). Layers with a
    fallback that are missing or not requested are reported in ``missing`` (loudly) but
    do not refuse.
    """
    requested = frozenset(ALL_LAYERS) if requested is None else requested
    if tier not in REQUIRED_BY_TIER or tier in ("environment", "reward_model"):
        return TierGate(False, (), f"tier {tier!r} is not built yet (function and verifier are)")
    required = REQUIRED_BY_TIER[tier]
    unusable = {layer for layer in ALL_LAYERS if not features.usable.get(layer, False)}
    not_requested = set(ALL_LAYERS) - requested
    hard_missing = sorted(required & (unusable | not_requested))
    soft_missing = sorted(((unusable | not_requested) & set(ALL_LAYERS)) - set(hard_missing))
    if hard_missing:
        reasons = "; ".join(
            f"{layer}: {features.why.get(layer, 'not requested')}" for layer in hard_missing
        )
        return TierGate(
            False,
            tuple(hard_missing + soft_missing),
            f"refusing the {tier} tier: missing isolation layers {hard_missing} ({reasons})",
        )
    if soft_missing:
        return TierGate(
            True,
            tuple(soft_missing),
            f"{tier} tier runs WITHOUT {soft_missing}"
            + "".join(
                f"; {layer} -> {FALLBACKS[layer]}" for layer in soft_missing if layer in FALLBACKS
            ),
        )
    return TierGate(True, (), "")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(path: str, options: str) -> str | None:
    """Mount a tmpfs on ``path``; returns None on success or the error text."""
    libc = _libc()
    ms_nosuid, ms_nodev, ms_noexec = 2, 4, 8
    rc = libc.mount(
        b"tmpfs", path.encode(), b"tmpfs", ms_nosuid | ms_nodev | ms_noexec, options.encode()
    )
    if rc != 0:
        return os.strerror(ctypes.get_errno())
    return None


def umount(path: str) -> None:
    """Lazily detach a mount (MNT_DETACH); silent when nothing is mounted."""
    _libc().umount2(path.encode(), 2)


def _probe_bwrap(bwrap: str, setpriv: str | None, is_root: bool) -> tuple[dict[str, bool], str]:
    """Run a throwaway sandbox and read back what it saw; without ``--as-pid-1`` and the
    /proc masks if this bubblewrap refuses them (those two layers then read missing)."""
    got, err = _probe_bwrap_once(bwrap, setpriv, is_root, hardened=True)
    if got:
        return got, err
    got, err2 = _probe_bwrap_once(bwrap, setpriv, is_root, hardened=False)
    return got, err2 or f"--as-pid-1 or the /proc masks refused: {err}"


def _probe_bwrap_once(
    bwrap: str, setpriv: str | None, is_root: bool, *, hardened: bool
) -> tuple[dict[str, bool], str]:
    script = (
        "import os;"
        "ns=lambda n: os.readlink('/proc/self/ns/'+n);"
        "print(os.getuid(), ns('net'), ns('mnt'), ns('pid'), ns('user'), os.getpid(),"
        " len(set(os.environ) - {'PWD', 'LC_CTYPE'}), len(open('/proc/stat').read()),"
        " len(os.listdir('/proc/pressure')) if os.path.isdir('/proc/pressure') else 0,"
        " sep='|')"
    )
    with tempfile.TemporaryDirectory(prefix="rw-sbx-empty-") as empty:
        empty_file = os.path.join(empty, "empty")
        open(empty_file, "wb").close()
        os.chmod(empty_file, 0o444)
        os.chmod(empty, 0o555)
        hardening = ["--as-pid-1"] if hardened else []
        masks = ["--ro-bind", empty_file, "/proc/stat"] if hardened else []
        if hardened and os.path.isdir("/proc/pressure"):
            os.makedirs(os.path.join(empty, "dir"), mode=0o555)
            masks += ["--ro-bind", os.path.join(empty, "dir"), "/proc/pressure"]
        return _run_probe(bwrap, setpriv, is_root, script, hardening, masks, hardened)


def _run_probe(
    bwrap: str,
    setpriv: str | None,
    is_root: bool,
    script: str,
    hardening: list[str],
    masks: list[str],
    hardened: bool,
) -> tuple[dict[str, bool], str]:
    inner = [
        bwrap,
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        *hardening,
        "--unshare-net",
        "--unshare-uts",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        *_root_symlinks(),
        "--proc",
        "/proc",
        *masks,
        "--dev",
        "/dev",
        "--remount-ro",
        "/",
        "--clearenv",
        "--",
        default_worker_python(),
        "-I",
        "-S",
        "-c",
        script,
    ]
    uid = 65000
    argv = inner
    if is_root:
        if not setpriv:
            return {}, "setpriv (util-linux) not found: cannot drop to an unprivileged uid"
        argv = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *inner]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"bwrap failed to run: {exc}"
    if proc.returncode != 0:
        return {}, f"bwrap exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    try:
        sb_uid, net, mnt, pid_ns, user, pid, nenv, nstat, npressure = proc.stdout.strip().split("|")
    except ValueError:
        return {}, f"unexpected probe output {proc.stdout[:200]!r}"

    def host(n: str) -> str:
        return os.readlink(f"/proc/self/ns/{n}")

    return (
        {
            "unprivileged_uid": int(sb_uid) != 0,
            "net_ns": net != host("net"),
            "mount_ns": mnt != host("mnt"),
            "pid_ns": pid_ns != host("pid") and int(pid) < 10,
            "user_ns": user != host("user"),
            # bwrap sets PWD, python itself LC_CTYPE (PEP 538); the worker clears both
            "empty_env": int(nenv) == 0,
            # the sandbox's pid 1 is the probe itself: no bwrap init inside
            "own_pid1": hardened and int(pid) == 1,
            "proc_masked": hardened and int(nstat) == 0 and int(npressure) == 0,
        },
        "",
    )


def _root_symlinks() -> list[str]:
    """bwrap args recreating /bin, /lib, /lib64, /sbin as on the host (merged /usr or not)."""
    args: list[str] = []
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def default_worker_python() -> str:
    """The interpreter tenant code runs under: the system python3 (stdlib only)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand):
            return cand
    return os.path.realpath(shutil.which("python3") or "/usr/bin/python3")


def _probe_cgroup(controller: str, limit_file: str, value: str) -> str:
    """Create a child cgroup, write a limit, remove it. Returns '' or the reason."""
    root = os.path.join(CGROUP_V1_ROOT, controller)
    if not os.path.isdir(root) or not os.path.exists(os.path.join(root, "cgroup.procs")):
        if os.path.exists(os.path.join(CGROUP_V1_ROOT, "cgroup.controllers")):
            return f"cgroup v2 only; this build drives the v1 {controller} controller"
        return f"no cgroup v1 {controller} hierarchy mounted at {root}"
    parent = os.path.join(root, CGROUP_PARENT)
    probe_dir = os.path.join(parent, f"probe-{os.getpid()}")
    try:
        os.makedirs(parent, exist_ok=True)
        os.makedirs(probe_dir, exist_ok=True)
        with open(os.path.join(probe_dir, limit_file), "w") as fh:
            fh.write(value)
        return ""
    except OSError as exc:
        return f"{controller} cgroup not writable: {exc}"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe_dir)


def block_devices() -> tuple[str, ...]:
    """``major:minor`` of every block device the kernel lists (``/sys/block/*/dev``), in
    name order: the devices a worker's blkio throttle covers. Assumes the sandbox reads
    the host's disks only through the host's own block devices (``/usr`` is a bind of
    the host's)."""
    out: list[str] = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir("/sys/block"), key=lambda e: e.name):
            with contextlib.suppress(OSError):
                with open(os.path.join(entry.path, "dev")) as fh:
                    dev = fh.read().strip()
                if dev.count(":") == 1 and dev.replace(":", "").isdigit():
                    out.append(dev)
    return tuple(out)


def _probe_blkio() -> str:
    """The blkio layer: a child group that accepts a read throttle on a block device."""
    devices = block_devices()
    if not devices:
        return "no block device listed under /sys/block"
    err = ""
    for dev in devices:  # the first device the kernel accepts a rule for will do
        err = _probe_cgroup("blkio", "blkio.throttle.read_bps_device", f"{dev} {64 << 20}")
        if not err or "hierarchy" in err or "v2" in err:
            return err
    return err


def _probe_tmpfs(is_root: bool) -> str:
    if not is_root:
        return "mounting a tmpfs needs root"
    d = tempfile.mkdtemp(prefix="rw-sbx-probe-")
    try:
        err = mount_tmpfs(d, "size=1m,mode=0700")
        if err:
            return f"tmpfs mount failed: {err}"
        umount(d)
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _probe_seccomp() -> str:
    try:
        from sandbox.seccomp_policy import compiled_filter

        compiled_filter()
    except Exception as exc:
        return f"cannot compile the seccomp filter: {exc}"
    try:
        with open("/proc/self/status") as fh:
            if "Seccomp:" not in fh.read():
                return "kernel has no seccomp (no Seccomp: line in /proc/self/status)"
    except OSError as exc:
        return f"cannot read /proc/self/status: {exc}"
    return ""


def probe_uncached(bwrap: str | None = None, setpriv: str | None = None) -> KernelFeatures:
    """Probe every layer now. ``bwrap``/``setpriv`` override the looked-up binaries."""
    is_root = os.geteuid() == 0
    bwrap = bwrap if bwrap is not None else shutil.which("bwrap")
    setpriv = setpriv if setpriv is not None else shutil.which("setpriv")
    usable: dict[str, bool] = {layer: False for layer in ALL_LAYERS}
    why: dict[str, str] = {}
    usable["rlimits"] = True

    if bwrap and os.path.exists(bwrap):
        got, err = _probe_bwrap(bwrap, setpriv, is_root)
        usable.update(got)
        for layer in BWRAP_LAYERS:
            if not usable[layer]:
                why[layer] = err or f"the probe sandbox did not get {layer}"
    else:
        for layer in BWRAP_LAYERS:
            why[layer] = "bubblewrap (bwrap) not installed: run scripts/setup-sandbox.sh"

    err = _probe_seccomp()
    usable["seccomp"] = not err
    if err:
        why["seccomp"] = err
    for layer, controller, limit_file, value in (
        ("cgroup_pids", "pids", "pids.max", "16"),
        ("cgroup_memory", "memory", "memory.limit_in_bytes", str(64 << 20)),
        ("cgroup_cpu", "cpu", "cpu.cfs_quota_us", "50000"),
    ):
        err = _probe_cgroup(controller, limit_file, value) if is_root else "needs root"
        usable[layer] = not err
        if err:
            why[layer] = err
    err = _probe_blkio() if is_root else "needs root"
    usable["cgroup_blkio"] = not err
    if err:
        why["cgroup_blkio"] = err
    err = _probe_tmpfs(is_root)
    usable["scratch_tmpfs"] = not err
    if err:
        why["scratch_tmpfs"] = err
    features = KernelFeatures(usable, why, bwrap, setpriv, is_root)
    if features.missing():
        log.warning("%s", features.describe())
    return features


@functools.lru_cache(maxsize=1)
def probe() -> KernelFeatures:
    """The cached probe of this host (see :func:`probe_uncached`)."""
    return probe_uncached()
