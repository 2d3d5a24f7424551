"""Import a trainer's per-step metric history (verl or TRL keys, as they are) into the log.

Formats (one row per step, detected from the content):

- CSV with a header and a ``step`` column (``global_step`` / ``_step`` accepted);
- JSONL, one object per line with a ``step`` key;
- verl's file logger lines ``{"step": N, "data": {...metrics...}}``.

Keys are read as the framework wrote them; nothing has to be renamed. Known keys fill the
typed fields of :class:`~events.catalog.trainer.TrainerStepCompleted` (first present key
wins, see :data:`FIELD_KEYS`); every other key is kept under its original name in
``extra`` (strings, numbers; lists/objects as JSON text), so nothing reported is lost.
Besides the step event, a row yields:

- ``RolloutBatchCompleted`` when it has generation-length keys (verl
  ``response_length/*``, TRL ``completions/*``): ``policy_version`` = the step (an
  on-policy history), ``num_sequences`` 0 (not reported);
- ``StepPhaseTimed`` from verl ``timing_s/*`` (idle is not reported: 0);
- ``UsageRecorded`` (trainer pool) = ``timing_s/step`` x ``gpus`` when ``gpus`` is given;
- ``EvalGateScored`` from held-out keys in the row (verl ``val-core/*/reward/mean@*`` or
  ``val/test_score/*``, TRL ``eval_reward``; several are averaged) and from ``eval_file``
  (same formats; score column ``score`` / ``eval`` / ``eval_score`` or those keys). Its
  ``n_items`` (how many items the eval scored: the reward-hacking detector guesses the
  eval's noise from it while few eval points exist) comes from an ``n_items`` /
  ``eval_n_items`` / ``eval_samples`` / ``eval_num_samples`` / ``num_items`` column, else
  from TRL's ``eval_samples_per_second`` x ``eval_runtime`` (transformers' speed metrics of
  the evaluation: their product is the number of eval samples), else 0 (not reported).

One ``RunSubmitted`` (``algorithm``) and a ``RunStarted`` open the import, at the first
row's time (before 2026-11-28 a lone ``RunSubmitted`` at the import's own time, after every
fact of the history: the run showed SUBMITTED for good); ``ended`` (``runwatch import
metrics --ended completed|failed``) closes it at the last row (billing its last step).
Every fact is named by what it is, never by its place in this import, so importing a file
again, or a longer copy of it (a history that grew), or its second half as a file of its
own, bills nothing twice and
nothing less (accounting drops a ``UsageRecorded`` whose ``seq`` is not beyond its
producer's last one):

- ids are uuid5 of (run, step, kind, lane) and ``seq`` is ``8 x step + the event's place
  in its row + 1`` (``RunSubmitted`` is 0), under the producer ``metrics-import``;
- a step row (not an eval or summary row: :func:`row_kind`) whose step is not beyond the
  step row before it (a run resumed from an earlier checkpoint logs its steps again) opens
  a new *lane*: the producer
  ``metrics-import/lane-<k>`` and ids of their own, so the repeated steps, which were
  really run, are facts of their own (billed) and the lanes are the same on every import
  of the file (a second file that starts again below the first's last step is lane 0 of
  its own import: its repeated steps are taken as the first file's);
- an ``eval_file``'s scores are the producer ``metrics-import/evals``, counted in that
  file's order (an eval file added on a later import shifts nothing of the metrics).

``ts`` is
the row's ``timestamp``/``_timestamp``/``time`` when present, else the import's start time.
Bad rows (not an object, no integer step, a step beyond ``2**53``, bad JSON) are reported
with their line number and skipped; the import goes on. A UTF-8 byte-order mark (Excel's
and pandas' ``utf-8-sig``) is dropped.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.catalog.eval import EvalGateScored
from events.catalog.lifecycle import RunCompleted, RunFailed, RunStarted, RunSubmitted
from events.catalog.rollout import RolloutBatchCompleted
from events.catalog.trainer import StepPhaseTimed, TrainerStepCompleted
from events.catalog.usage import UsageRecorded
from events.envelope import MAX_INT, EventBase, derived_id

PRODUCER = "metrics-import"
#: seqs per step in a lane: a row yields at most 5 events (rollout, step, phases, usage, eval)
ROW_SEQS = 8

STEP_KEYS = ("step", "global_step", "_step", "train/global_step")
#: the largest step imported: every integer up to it is exact as a float (the detectors do
#: arithmetic on steps), and ``ROW_SEQS x`` it fits a signed 64-bit ``seq``; the bound of
#: every integer of an event
MAX_STEP = MAX_INT
TS_KEYS = ("timestamp", "_timestamp", "time")

#: Key prefixes of held-out evaluation, as TRL and verl log them.
EVAL_PREFIXES = ("eval_", "val-core/", "val-aux/", "val/", "test_")
#: Keys only transformers' end-of-training summary carries.
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})
#: Keys that are bookkeeping, not a metric of the step (they never alone make a step).
BOOKKEEPING_KEYS = frozenset({"epoch", "total_flos", *STEP_KEYS, *TS_KEYS})


def is_eval_key(key: str) -> bool:
    return key.startswith(EVAL_PREFIXES)


def row_kind(row: Mapping[str, Any]) -> str:
    """``"summary"``, ``"eval"`` (held-out keys only), ``"empty"`` or ``"step"``: only a
    ``"step"`` row is an optimizer step (TRL logs its evals and its end-of-training summary
    as rows of their own, at the step of the training row before them)."""
    if SUMMARY_KEYS & row.keys():
        return "summary"
    keys = [k for k in row if k not in BOOKKEEPING_KEYS]
    if not keys:
        return "empty"
    if all(is_eval_key(k) or k in ITEMS_KEYS for k in keys):
        return "eval"
    return "step"


#: TrainerStepCompleted field -> source keys, verl first, then TRL.
FIELD_KEYS: dict[str, tuple[str, ...]] = {
    "reward_mean": ("critic/score/mean", "critic/rewards/mean", "reward", "train/reward"),
    "reward_std": ("critic/score/std", "reward_std", "train/reward_std"),
    "kl_to_ref": ("actor/kl_loss", "critic/kl", "kl", "train/kl"),
    "entropy": ("actor/entropy", "entropy", "train/entropy"),
    "grad_norm": ("actor/grad_norm", "grad_norm", "train/grad_norm"),
    "clip_fraction": ("actor/pg_clipfrac", "clip_ratio/region_mean", "clip_ratio"),
    "advantage_mean": ("critic/advantages/mean",),
    "loss": ("actor/pg_loss", "loss", "train/loss"),
    "lr": ("actor/lr", "learning_rate", "train/learning_rate"),
    "tokens_trained": ("perf/total_num_tokens", "num_tokens"),
}
ROLLOUT_KEYS: dict[str, tuple[str, ...]] = {
    "mean_length": ("response_length/mean", "completions/mean_length"),
    "max_length": ("response_length/max", "completions/max_length"),
    "truncation_rate": ("response_length/clip_ratio", "completions/clipped_ratio"),
}
PHASE_KEYS: dict[str, tuple[str, ...]] = {
    "wall_s": ("timing_s/step",),
    "rollout_s": ("timing_s/gen",),
    "score_s": ("timing_s/reward",),
    "sync_s": ("timing_s/update_weights", "timing_s/sync"),
    "optim_s": ("timing_s/update_actor",),
}
EVAL_COLUMNS = ("score", "eval", "eval_score", "eval_reward")
#: how many items an eval scored (its row's or the eval file's column)
ITEMS_KEYS = ("n_items", "eval_n_items", "eval_samples", "eval_num_samples", "num_items")
#: the largest eval set taken at its word (a larger count is no count)
MAX_ITEMS = 10**9


@dataclass
class MetricsImportReport:
    rows: int = 0
    skipped: int = 0
    events: dict[str, int] = field(default_factory=dict)
    mapped: dict[str, str] = field(default_factory=dict)
    extra_keys: set[str] = field(default_factory=set)
    issues: list[str] = field(default_factory=list)
    format: str = ""

    def count(self, ev: EventBase) -> None:
        self.events[ev.type] = self.events.get(ev.type, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "rows": self.rows,
            "skipped": self.skipped,
            "events": dict(sorted(self.events.items())),
            "mapped": dict(sorted(self.mapped.items())),
            "extra_keys": sorted(self.extra_keys),
            "issues": self.issues[:50],
        }


def _scalar(value: Any) -> Any:
    """A CSV cell or JSON value as a scalar: numbers parsed, '' -> None, nested -> JSON."""
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return None
        try:
            number = float(text)
        except ValueError:
            return text
        return (
            int(number)
            if number.is_integer() and "." not in text and "e" not in text.lower()
            else number
        )
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    return value


def read_rows(path: Path, report: MetricsImportReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of every good row; bad ones are reported and skipped.

    ``ValueError`` when the file is not UTF-8 text (a binary file, another encoding):
    nothing of it is imported."""
    try:
        yield from _rows(path, report)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text at byte {exc.start} (a metrics file is CSV or JSON lines)"
        ) from None


def _rows(path: Path, report: MetricsImportReport) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, newline="", encoding="utf-8-sig") as f:  # (a BOM is no part of a key)
        head = f.read(4096)
        f.seek(0)
        if head.lstrip().startswith("{"):
            report.format = "jsonl"
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    _skip(report, f"{path.name}:{n}: not JSON: {exc.msg}")
                    continue
                except ValueError as exc:  # an integer of more than 4300 digits
                    _skip(report, f"{path.name}:{n}: not a metrics row: {exc}"[:300])
                    continue
                if not isinstance(obj, dict):
                    _skip(report, f"{path.name}:{n}: expected an object")
                    continue
                if isinstance(obj.get("data"), dict) and "step" in obj:
                    report.format = "verl-file-logger"
                    obj = {**obj["data"], "step": obj["step"]}
                yield n, {str(k): _scalar(v) for k, v in obj.items()}
        else:
            report.format = "csv"
            for n, row in enumerate(csv.DictReader(f), 2):
                yield n, {str(k): _scalar(v) for k, v in row.items() if k is not None}


def check_gpus(gpus: float | None) -> float | None:
    """``gpus`` (the GPUs a run's step time is billed on) if it is ``None`` or a finite
    number above 0, else ``ValueError``: usage is never negative, NaN or infinite."""
    if gpus is None:
        return None
    if isinstance(gpus, bool) or not isinstance(gpus, int | float):
        raise ValueError(f"gpus must be a number, not {gpus!r}")
    if not (math.isfinite(gpus) and gpus > 0):
        raise ValueError(f"gpus must be a finite number above 0, not {gpus!r}")
    return float(gpus)


def billed_seconds(wall_s: float, gpus: float | None) -> float | None:
    """GPU-seconds a step of ``wall_s`` seconds bills on ``gpus`` GPUs; ``None`` when there
    is nothing to bill: no GPUs, or a step time that is negative or not finite (usage is
    finite and >= 0; the step's timing is kept as it is)."""
    if not gpus:
        return None
    billed = wall_s * gpus
    return billed if math.isfinite(billed) and billed >= 0 else None


def _skip(report: MetricsImportReport, issue: str) -> None:
    report.skipped += 1
    report.issues.append(issue)


def _step_of(row: dict[str, Any]) -> int | None:
    """The row's integer step (an integral float counts); ``None`` without one. A step
    beyond :data:`MAX_STEP` is returned as it is: the caller refuses it, saying why."""
    for key in STEP_KEYS:
        value = row.get(key)
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and float(value).is_integer()
        ):
            return int(value)
    return None


def _bad_step(step: int | None) -> str | None:
    """Why ``step`` cannot be imported, or ``None`` when it can."""
    if step is None or step < 0:
        return "no integer 'step' of 0 or more"
    if step > MAX_STEP:
        shown = str(step) if step < 10**18 else f"~1e{int(math.log10(step))}"
        return f"step {shown} is beyond 2**53 - 1, the largest step runwatch counts exactly"
    return None


def eval_items(row: Mapping[str, Any]) -> int:
    """How many items the row's eval scored (:data:`ITEMS_KEYS`, else TRL's
    ``eval_samples_per_second`` x ``eval_runtime``); 0 when it does not say."""
    hit = _pick(dict(row), ITEMS_KEYS)
    if hit is not None:
        value = float(hit[1])
    else:
        rate, runtime = row.get("eval_samples_per_second"), row.get("eval_runtime")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (rate, runtime)):
            return 0
        value = round(float(rate) * float(runtime))  # type: ignore[arg-type]
    if not math.isfinite(value) or not 1 <= value <= MAX_ITEMS:
        return 0
    return round(value)


def _pick(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in keys:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return key, value
    return None


def _eval_score(row: dict[str, Any]) -> float | None:
    values = [
        float(v)
        for k, v in row.items()
        if isinstance(v, int | float)
        and not isinstance(v, bool)
        and (
            (k.startswith("val-core/") and "/reward/mean" in k)
            or k.startswith("val/test_score/")
            or k in EVAL_COLUMNS
        )
    ]
    return sum(values) / len(values) if values else None


@dataclass
class _Place:
    """Where an import's next event goes: its producer and id suffix (by lane), its seq."""

    base: str
    lane: int = 0
    seq: int = 0

    @property
    def suffix(self) -> str:
        return f"/lane-{self.lane}" if self.lane else ""

    @property
    def producer(self) -> str:
        return self.base + self.suffix


def import_metrics(
    path: str | Path,
    *,
    run_id: str,
    tenant_id: str,
    write: Callable[[Sequence[EventBase]], None],
    algorithm: str = "grpo",
    eval_file: str | Path | None = None,
    gpus: float | None = None,
    batch_size: int = 2000,
    report: MetricsImportReport | None = None,
    ended: str | None = None,
) -> MetricsImportReport:
    """Read ``path`` (and ``eval_file``) and ``write`` the events in batches.

    ``ended``: how the history ended, ``"completed"`` or ``"failed"`` (its last row's
    time and step; the run's last step is billed then), or ``None``: a run still going
    (its history may grow and be imported again).

    ``ValueError``, nothing written, when ``path`` is not UTF-8 text or has no row with a
    step (an empty file, a header only, every row skipped): no run without a step."""
    if ended not in (None, "completed", "failed"):
        raise ValueError(f"ended is 'completed', 'failed' or None, not {ended!r}")
    path = Path(path)
    report = report or MetricsImportReport()
    now = time.time()
    evals: dict[int, list[tuple[float, int]]] = {}
    if eval_file is not None:
        eval_report = MetricsImportReport()
        for n, row in read_rows(Path(eval_file), eval_report):
            step, score = _step_of(row), _eval_score(row)
            if step is None or score is None:
                _skip(eval_report, f"{Path(eval_file).name}:{n}: needs a step and a score")
                continue
            if (why := _bad_step(step)) is not None:
                _skip(eval_report, f"{Path(eval_file).name}:{n}: {why}")
                continue
            evals.setdefault(step, []).append((score, eval_items(row)))
        report.issues.extend(eval_report.issues)
        report.skipped += eval_report.skipped
    batch: list[EventBase] = []
    rows = _Place(PRODUCER)  # the metrics file's events (RunSubmitted: seq 0)
    scores = _Place(f"{PRODUCER}/evals")  # the eval file's, counted in its order
    life = _Place(f"{PRODUCER}/lifecycle")  # RunStarted, and the end when told

    def emitter(place: _Place) -> Callable[..., None]:
        def emit(cls: type[EventBase], step: int | None, ts: float, kind: str, **payload: Any):
            ev = cls(
                event_id=derived_id(PRODUCER, tenant_id, run_id, kind + place.suffix, step),
                tenant_id=tenant_id,
                run_id=run_id,
                step=step,
                ts=ts,
                producer=place.producer,
                seq=place.seq,
                **payload,
            )
            place.seq += 1
            report.count(ev)
            batch.append(ev)
            if len(batch) >= batch_size:
                write(list(batch))
                batch.clear()

        return emit

    emit, emit_score, emit_life = emitter(rows), emitter(scores), emitter(life)

    def emit_evals(step: int, ts: float) -> None:
        for i, (score, items) in enumerate(evals[step]):
            emit_score(EvalGateScored, step, ts, f"eval-file/{i}", score=score, n_items=items)

    pending_evals = sorted(evals)
    last_step = None
    last: tuple[int, float] | None = None  # the last row's step and time
    for n, row in read_rows(path, report):
        step = _step_of(row)
        if (why := _bad_step(step)) is not None:
            _skip(report, f"{path.name}:{n}: {why}")
            continue
        assert step is not None
        report.rows += 1
        if row_kind(row) == "step":  # (an eval or summary row repeats its step's number)
            if last_step is not None and step <= last_step:  # steps begin again: a new lane
                rows.lane += 1
            last_step = step
        ts = next((float(row[k]) for k in TS_KEYS if isinstance(row.get(k), int | float)), now)
        if last is None:  # the run began at its first row: submitted and started then
            source = {"source": path.name}
            emit(RunSubmitted, None, ts, "submitted", algorithm=algorithm, config=source)
            emit_life(RunStarted, None, ts, "started")
        last = (step, ts) if last is None or step >= last[0] else last
        while pending_evals and pending_evals[0] < step:
            emit_evals(pending_evals.pop(0), ts)
        rows.seq = ROW_SEQS * step + 1
        emit_row(emit, row, step, ts, algorithm, gpus, report)
        if rows.seq > ROW_SEQS * (step + 1):  # emit_row grew: seqs would run into the next step
            raise RuntimeError(f"a row yielded more than {ROW_SEQS - 1} events")
        if pending_evals and pending_evals[0] == step:
            emit_evals(pending_evals.pop(0), ts)
    if not report.rows:  # only the RunSubmitted is held (nothing was written): a run of nothing
        first = f"; the first: {report.issues[0]}" if report.issues else ""
        raise ValueError(f"{path}: no metric rows with a step ({report.skipped} skipped{first})")
    for s in pending_evals:
        emit_evals(s, now)
    if ended is not None and last is not None:
        end_step, end_ts = last
        if ended == "completed":
            emit_life(RunCompleted, end_step, end_ts, "ended")
        else:
            emit_life(
                RunFailed, end_step, end_ts, "ended", reason="the imported history ended failed"
            )
    if batch:
        write(list(batch))
    return report


def emit_row(
    emit: Callable[..., None],
    row: dict[str, Any],
    step: int,
    ts: float,
    algorithm: str,
    gpus: float | None,
    report: MetricsImportReport,
) -> None:
    """The events of one metric row, handed to ``emit(cls, step, ts, kind, **payload)``.

    The one key mapping (:data:`FIELD_KEYS`, :data:`ROLLOUT_KEYS`, :data:`PHASE_KEYS`,
    held-out keys): the importer and the live hooks (:mod:`producers.hooks`) both call
    it, so a run watched live and the same history imported later give the same events
    (``kind`` names each, for ids). ``row`` holds scalars (numbers, strings, ``None``).
    """
    fields: dict[str, Any] = {}
    used = set(STEP_KEYS) | set(TS_KEYS)
    for name, keys in FIELD_KEYS.items():
        hit = _pick(row, keys)
        if hit is None:
            continue
        key, value = hit
        if name == "tokens_trained":
            if not math.isfinite(value) or not -MAX_INT <= value <= MAX_INT:
                continue  # stays in extra (the nan_metric detector sees a NaN there; an
            value = int(value)  # integer past an event's bound goes as a float, found
            # by review: it failed the whole step, the step fact the controller counts too)
        fields[name] = float(value) if name != "tokens_trained" else value
        used.add(key)
        report.mapped[name] = key
    extra = {k: v for k, v in row.items() if k not in used and v is not None}
    report.extra_keys.update(extra)
    rollout = {name: hit for name, keys in ROLLOUT_KEYS.items() if (hit := _pick(row, keys))}
    if "mean_length" in rollout:
        max_len = rollout.get("max_length")
        emit(
            RolloutBatchCompleted,
            step,
            ts,
            "rollout",
            policy_version=step,
            num_sequences=0,
            mean_length=float(rollout["mean_length"][1]),
            max_length=int(max_len[1])
            if max_len and math.isfinite(max_len[1]) and abs(max_len[1]) <= MAX_INT
            else None,
            truncation_rate=float(rollout["truncation_rate"][1])
            if "truncation_rate" in rollout
            else 0.0,
        )
    emit(TrainerStepCompleted, step, ts, "step", algorithm=algorithm, extra=extra, **fields)
    phases = {name: float(hit[1]) for name, keys in PHASE_KEYS.items() if (hit := _pick(row, keys))}
    if "wall_s" in phases:
        emit(StepPhaseTimed, step, ts, "phases", **phases)
        billed = billed_seconds(phases["wall_s"], gpus)
        if gpus and billed is None:
            report.issues.append(
                f"step {step}: step time {phases['wall_s']!r} s x {gpus} GPUs is no usage; "
                "not billed"
            )
        elif billed is not None:
            emit(
                UsageRecorded,
                step,
                ts,
                "usage",
                pool="trainer",
                phase="step",
                device_kind="gpu",
                device_seconds=billed,
            )
    score = _eval_score(row)
    if score is not None:
        emit(EvalGateScored, step, ts, "eval-inline", score=score, n_items=eval_items(row))
