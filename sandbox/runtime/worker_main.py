"""The sandbox worker: runs INSIDE the sandbox, stdlib only, copied in read-only.

Invoked as ``python3 -I -S -B /runtime/worker_main.py FD``; it is the sandbox's pid 1
(bubblewrap ``--as-pid-1``), so nothing but the tenant's own processes lives in the
sandbox. Order matters:
1. read the ``limits`` frame and apply the rlimits to itself (inherited by everything it
   or the tenant starts; an unprivileged process can never raise a hard limit back),
2. close every fd but the socket, clear the environment, point stdio at /dev/null,
3. say ``hello`` and wait for ``go`` (the host records the process baseline meanwhile),
4. import the tenant artifact ``/artifact/reward.py`` (tenant code runs from here on),
5. serve ``score`` requests until EOF or ``shutdown``. Before each batch it reaps the
   zombies of processes the host killed (as pid 1, orphans are its children); after each
   batch it reports ``threads``: more than one means tenant code left a thread running,
   and the host retires the worker instead of reusing it. The host does not trust this
   report (tenant code can rewrite this module): it counts the worker's threads itself,
   and keeps the worker stopped (SIGSTOP) between batches.

Framing and messages: see ``sandbox/protocol.py`` (this file must stay import-free of the
project: the project tree is not visible in the sandbox).
"""

import collections
import errno
import json
import os
import resource
import struct
import sys
import traceback

HEADER = struct.Struct(">I")
RESOURCE_ERRNOS = {
    errno.EAGAIN,
    errno.ENOMEM,
    errno.EFBIG,
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOSPC,
    errno.EDQUOT,
}


def send(fd, message):
    try:
        body = json.dumps(message, separators=(",", ":"), allow_nan=True).encode()
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        body = json.dumps(
            {
                "op": "error",
                "id": message.get("id"),
                "kind": "bad_output",
                "message": f"scores are not JSON-serializable: {exc}",
            }
        ).encode()
    data = HEADER.pack(len(body)) + body
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def recv(fd):
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    (length,) = HEADER.unpack(head)
    body = _read_exact(fd, length)
    return None if body is None else json.loads(body)


def _read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


#: Pending signals queued per uid (sigqueue, real-time signals): the kernel counts them
#: per user, and its default (~the host's RAM in pages / 64) is a host-wide budget.
SIGPENDING_LIMIT = 64


def apply_limits(limits):
    """Set each limit, soft = hard, on this process (inherited by all it starts).

    Besides the contract's: no POSIX message queue bytes (RLIMIT_MSGQUEUE 0: mq_open
    fails), a few pending signals, no real-time priority. Those budgets are counted per
    uid (the worker's own, unique on the host), and a stdlib reward needs none of them."""
    pairs = (
        (resource.RLIMIT_AS, limits["memory_bytes"]),
        (resource.RLIMIT_CPU, limits["cpu_seconds"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["file_size_bytes"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, limits["nproc"]),
        (resource.RLIMIT_MSGQUEUE, 0),
        (resource.RLIMIT_SIGPENDING, SIGPENDING_LIMIT),
        (resource.RLIMIT_RTPRIO, 0),
    )
    for which, value in pairs:
        if value is None or value < 0:
            continue
        resource.setrlimit(which, (value, value))


def classify(exc):
    if isinstance(exc, MemoryError):
        return "resource"
    if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        return "resource"
    return "crash"


def describe(exc):
    """The last frames, the exception's type and its message, bounded (2,000 characters).

    The message is cut before anything is formatted: a tenant may raise one of 100 MB,
    which ``traceback.format_exception`` would copy several times over, past the memory
    limit (the worker died and the message was lost); and only the last frames are
    formatted (a recursion 190,000 deep took a second to format whole). Never raises."""
    try:
        tail = collections.deque(maxlen=5)  # the last frames; only those are formatted
        tb = exc.__traceback__
        while tb is not None:
            tail.append(tb)
            tb = tb.tb_next
        frames = "".join(traceback.format_list(traceback.extract_tb(tail[0]))) if tail else ""
    except BaseException:
        frames = ""
    try:
        text = str(exc)  # an exact str argument comes back as itself: no copy
        if not isinstance(text, str):
            text = "<exception str() failed>"
    except BaseException:
        text = "<exception str() failed>"
    if len(text) > 1200:
        text = f"{text[:600]} ... [{len(text) - 1200} characters cut] ... {text[-600:]}"
    try:
        name, module = type(exc).__qualname__, type(exc).__module__
        if module not in ("builtins", "__main__"):
            name = f"{module}.{name}"
    except BaseException:
        name = "exception"
    return f"{frames}{name}: {text}\n"[-2000:]


def reap_children():
    """Collect exited children (orphans re-parent to pid 1, which this process is)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def thread_count():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def main():
    fd = int(sys.argv[1])
    limits = recv(fd)
    if not limits or limits.get("op") != "limits":
        return 0
    apply_limits(limits)
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)
    os.environ.clear()
    for k in list(os.environ):
        os.unsetenv(k)
    devnull = os.open("/dev/null", os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    os.close(devnull)
    send(fd, {"op": "hello"})
    msg = recv(fd)
    if not msg or msg.get("op") != "go":
        return 0
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("reward_artifact", "/artifact/reward.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["reward_artifact"] = module
        spec.loader.exec_module(module)
        fn = getattr(module, "reward", None)
        if not callable(fn):
            send(
                fd,
                {
                    "op": "load_error",
                    "kind": "bad_output",
                    "message": "artifact defines no callable reward(batch)",
                },
            )
            return 0
    except BaseException as exc:
        send(fd, {"op": "load_error", "kind": classify(exc), "message": describe(exc)})
        return 0
    send(fd, {"op": "ready"})
    while True:
        msg = recv(fd)
        if msg is None or msg.get("op") == "shutdown":
            return 0
        if msg.get("op") != "score":
            continue
        rid = msg.get("id")
        reap_children()
        try:
            batch = msg.get("batch")
            scores = fn(batch)
            if isinstance(scores, tuple):
                scores = list(scores)
            if isinstance(scores, list) and len(scores) != len(batch):
                # refused by the host's gate anyway; not encoding a list of 10**7 floats
                # spares the deadline and the memory limit (the host still judges)
                wrong = f"wrong shape: {len(scores)} scores for a batch of {len(batch)}"
                send(fd, {"op": "error", "id": rid, "kind": "bad_output", "message": wrong})
                continue
            send(fd, {"op": "result", "id": rid, "scores": scores, "threads": thread_count()})
        except BaseException as exc:
            send(fd, {"op": "error", "id": rid, "kind": classify(exc), "message": describe(exc)})


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:
        code = 70
    os._exit(code or 0)
