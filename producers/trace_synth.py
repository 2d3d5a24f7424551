"""Synthetic verl multi-turn rollout traces in seed 003's layout (tests, benchmarks, demos).

:func:`write_synthetic_traces` writes ``DIR/step_<N>/worker_<R>.jsonl`` exactly as verl's
``SGLangLogManager`` would (naive ISO timestamps at the *end* of each event, then
``event``, ``duration_sec``, ``extra``, ``workid``, ``step``). Per worker and step:

1. ``preprocessing_duration`` (worker-level);
2. per request, per turn ``t`` (1-based): ``engine_async_generate`` (``turn``, tokens and
   ``policy_version`` = step - 1 in ``extra``; the last turn carries ``finish_reason``),
   then ``tool_call`` between turns, and a final ``reward_calc``; a request's completion
   time follows a long-tailed (lognormal) law, so most requests finish early and a few
   drag the step;
3. over-sampling (``abort_share``): the slowest requests of each worker are cancelled at
   the cut time: ``aborted_request_with_cancelled_error`` (duration = time since the
   rollout start) and ``aborted_request_with_cancelled_error_padding``;
4. ``async_rollout_with_monitoring_duration`` (worker-level, with totals in ``extra``),
   ``barrier_wait_duration`` (until the slowest worker is done) and ``broadcast_duration``.

``straggler`` = ``(step, worker, factor)`` stretches that worker's requests by ``factor``.
Everything is drawn from ``random.Random(seed)``: the same arguments write the same files.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SynthSummary:
    """What was written: line count and per-step worker completion times (seconds)."""

    lines: int
    files: int
    steps: tuple[int, ...]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None).isoformat()


def write_synthetic_traces(
    root: str | os.PathLike[str],
    *,
    steps: int = 3,
    workers: int = 4,
    requests_per_worker: int = 64,
    first_step: int = 1,
    max_turns: int = 3,
    abort_share: float = 0.0,
    straggler: tuple[int, int, float] | None = None,
    seed: int = 0,
    start_time: float = 1_754_950_000.0,
    preprocess_s: float = 2.0,
) -> SynthSummary:
    rng = random.Random(seed)
    base = Path(root)
    lines = files = 0
    t0 = start_time
    for step in range(first_step, first_step + steps):
        step_dir = base / f"step_{step}"
        step_dir.mkdir(parents=True, exist_ok=True)
        rollout_start = t0 + preprocess_s
        per_worker: list[list[str]] = []
        ends: list[float] = []
        for w in range(workers):
            out: list[str] = []
            stretch = straggler[2] if straggler and straggler[:2] == (step, w) else 1.0

            def log(
                end: float,
                event: str,
                dur: float,
                extra: dict | None = None,
                out: list[str] = out,
                w: int = w,
                step: int = step,
            ) -> None:
                entry: dict = {"timestamp": _iso(end), "event": event, "duration_sec": dur}
                if extra is not None:
                    entry["extra"] = extra
                entry["workid"] = w
                entry["step"] = step
                out.append(json.dumps(entry))

            log(rollout_start, "preprocessing_duration", preprocess_s)
            totals = sorted(
                (rng.lognormvariate(math.log(8.0), 0.6) * stretch, i)
                for i in range(requests_per_worker)
            )
            n_keep = requests_per_worker - round(abort_share * requests_per_worker)
            cut = totals[n_keep - 1][0] if 0 < n_keep < requests_per_worker else None
            worker_end = rollout_start
            for rank, (total, i) in enumerate(totals):
                rid = f"s{step}-w{w}-r{i}"
                if cut is not None and rank >= n_keep:
                    end = rollout_start + cut + 0.001
                    log(
                        end,
                        "aborted_request_with_cancelled_error",
                        end - rollout_start,
                        {"request_id": rid},
                    )
                    log(
                        end + 0.002,
                        "aborted_request_with_cancelled_error_padding",
                        0.002,
                        {"request_id": rid},
                    )
                    worker_end = max(worker_end, end + 0.002)
                    continue
                n_turns = 1 + min(max_turns - 1, int(rng.expovariate(1.2)))
                now = rollout_start
                gen_share = total * 0.9 / n_turns
                for turn in range(1, n_turns + 1):
                    last = turn == n_turns
                    tokens = rng.randint(50, 400)
                    extra: dict = {
                        "request_id": rid,
                        "turn": turn,
                        "completion_tokens": tokens,
                        "policy_version": step - 1,
                    }
                    if last:
                        extra["finish_reason"] = "length" if total > 20 * stretch else "stop"
                    now += gen_share
                    log(now, "engine_async_generate", gen_share, extra)
                    if not last:
                        tool = total * 0.05 / max(1, n_turns - 1)
                        now += tool
                        log(now, "tool_call", tool, {"request_id": rid, "turn": turn})
                reward = total - (now - rollout_start)
                now += reward
                log(now, "reward_calc", reward, {"request_id": rid})
                worker_end = max(worker_end, now)
            log(
                worker_end,
                "async_rollout_with_monitoring_duration",
                worker_end - rollout_start,
                {
                    "total_requests": requests_per_worker,
                    "target_completion": n_keep,
                    "completed_count": n_keep,
                },
            )
            per_worker.append(out)
            ends.append(worker_end)
        slowest = max(ends)
        for w, out in enumerate(per_worker):
            wait = slowest - ends[w]
            for event, dur, at in (
                ("barrier_wait_duration", wait, slowest),
                ("broadcast_duration", 0.05, slowest + 0.05),
            ):
                out.append(
                    json.dumps(
                        {
                            "timestamp": _iso(at),
                            "event": event,
                            "duration_sec": dur,
                            "workid": w,
                            "step": step,
                        }
                    )
                )
            (step_dir / f"worker_{w}.jsonl").write_text("\n".join(out) + "\n")
            lines += len(out)
            files += 1
        t0 = slowest + 5.0
    return SynthSummary(lines, files, tuple(range(first_step, first_step + steps)))
