"""Failure attribution: exactly one class per terminal failure, and the customer's message.

Pure functions over the reward ledger and the alert history the run-state fold keeps.
The three classes (seed 000 step 4, extending the infra-vs-user split of platform SLOs):

- ``platform_fault``: spends the platform's error budget; the customer is told it was ours.
- ``tenant_code_fault``: reward function or dataset errors; surfaced with ledger counts and
  a few offending inputs ("your reward function raised on 3% of samples; 3 examples
  attached").
- ``algorithmic_non_convergence``: no fault; surfaced with the run's health history.

Rates are over reward *samples* (``n`` of each batch attempt), so a retried batch counts
every attempt: the rate is "of the samples we tried to score, how many failed because of
the tenant's code".
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from events import RewardBatchFailed, RewardBatchScored
from events.catalog.lifecycle import FailureClass

#: The tenant-code causes of the reward ledger (each a ``tenant_code_fault``).
TENANT_CAUSES = (
    "tenant_timeout",
    "tenant_crash",
    "tenant_bad_output",
    "tenant_resource_exceeded",
    "tenant_bad_artifact",
)
#: Every failure column, in storage order: new causes are appended, never inserted, so a
#: ledger stored before they existed keeps its indices (it is padded with zeros on load).
#: ``bad_input`` (a batch the caller could not encode) is the caller's, not the tenant's.
CAUSES = (
    "tenant_timeout",
    "tenant_crash",
    "tenant_bad_output",
    "tenant_resource_exceeded",
    "platform_error",
    "tenant_bad_artifact",
    "bad_input",
)
_TENANT_INDEX = tuple(CAUSES.index(c) for c in TENANT_CAUSES)
#: How many of the newest reward facts a ledger keeps individually (see ``Ledger.recent``).
RECENT_CAP = 256
_VERB = {
    "tenant_crash": "raised",
    "tenant_timeout": "timed out",
    "tenant_bad_output": "returned invalid output",
    "tenant_resource_exceeded": "exceeded its resource limits",
    "tenant_bad_artifact": "was refused before scoring (not a valid reward artifact)",
}


@dataclass(frozen=True, slots=True)
class Ledger:
    """Commutative reward-ledger totals of one run (order of arrival does not matter).

    ``examples``: the ``max_examples`` offending inputs with the smallest (ts, event id),
    so the kept set is the same whatever order the batches arrived in.

    ``recent``: the newest :data:`RECENT_CAP` facts as (ts, event id, cause index or -1 for
    ok, samples), so :meth:`as_of` can give the ledger *as of* a terminal event's time even
    when reward facts from after it were read first (another topic ran ahead). Facts older
    than the newest ``RECENT_CAP`` are settled; a terminal event arriving later than that
    many reward batches behind would count them (a documented lag bound, not a silent one:
    the replay orders it the same way whenever the lag stays under the cap).
    """

    ok_samples: int = 0
    failed_samples: tuple[int, ...] = (0,) * len(CAUSES)
    ok_batches: int = 0
    failed_batches: int = 0
    examples: tuple[tuple[float, str, str, str], ...] = ()  # (ts, event_id, cause, text)
    recent: tuple[tuple[float, str, int, int], ...] = ()

    def __post_init__(self) -> None:
        if len(self.failed_samples) < len(CAUSES):  # stored before a cause was added
            pad = (0,) * (len(CAUSES) - len(self.failed_samples))
            object.__setattr__(self, "failed_samples", (*self.failed_samples, *pad))

    @property
    def total_samples(self) -> int:
        return self.ok_samples + sum(self.failed_samples)

    def count(self, cause: str) -> int:
        return self.failed_samples[CAUSES.index(cause)]

    @property
    def tenant_failed(self) -> int:
        return sum(self.failed_samples[i] for i in _TENANT_INDEX)

    def counts(self) -> dict[str, int]:
        return {"ok": self.ok_samples, **dict(zip(CAUSES, self.failed_samples))}

    def _recent_with(
        self, fact: tuple[float, str, int, int]
    ) -> tuple[tuple[float, str, int, int], ...]:
        recent = self.recent
        if not recent or fact > recent[-1]:
            out = (*recent, fact)
        else:
            i = bisect_left(recent, fact)
            out = (*recent[:i], fact, *recent[i:])
        return out[-RECENT_CAP:] if len(out) > RECENT_CAP else out

    def add(self, event: RewardBatchScored | RewardBatchFailed, max_examples: int) -> Ledger:
        if type(event) is RewardBatchScored:
            return Ledger(
                self.ok_samples + event.n,
                self.failed_samples,
                self.ok_batches + 1,
                self.failed_batches,
                self.examples,
                self._recent_with((event.ts, str(event.event_id), -1, event.n)),
            )
        i = CAUSES.index(event.cause)
        fs = self.failed_samples
        failed = (*fs[:i], fs[i] + event.n, *fs[i + 1 :])
        examples = self.examples
        if event.examples and event.cause in TENANT_CAUSES:
            new = tuple((event.ts, str(event.event_id), event.cause, x) for x in event.examples)
            examples = tuple(sorted(examples + new))[:max_examples]
        return Ledger(
            self.ok_samples,
            failed,
            self.ok_batches,
            self.failed_batches + 1,
            examples,
            self._recent_with((event.ts, str(event.event_id), i, event.n)),
        )

    def as_of(self, ts: float) -> Ledger:
        """The ledger without the (recent) facts whose event time is after ``ts``."""
        ok, failed = self.ok_samples, list(self.failed_samples)
        ok_batches, failed_batches = self.ok_batches, self.failed_batches
        for fact_ts, _, cause, n in self.recent:
            if fact_ts <= ts:
                continue
            if cause < 0:
                ok, ok_batches = ok - n, ok_batches - 1
            else:
                failed[cause] -= n
                failed_batches -= 1
        examples = tuple(x for x in self.examples if x[0] <= ts)
        return Ledger(ok, tuple(failed), ok_batches, failed_batches, examples)


@dataclass(frozen=True, slots=True)
class Attribution:
    failure_class: FailureClass
    message: str
    ledger: tuple[tuple[str, int], ...] = ()
    examples: tuple[str, ...] = ()
    #: (detector, reason, window_start, window_end) of the alerts the run fired (the
    #: latest, at most ``run_state.MAX_FIRED_KEPT``, every detector that fired named).
    health_history: tuple[tuple[str, str, int, int], ...] = ()
    detail: str = ""


def _pct(part: int, whole: int) -> str:
    share = 100.0 * part / whole if whole else 0.0
    return f"{share:.0f}%" if share >= 1 or share == 0 else f"{share:.1g}%"


def tenant_fault(ledger: Ledger, detail: str = "") -> Attribution:
    tenant = [(ledger.count(c), c) for c in TENANT_CAUSES if ledger.count(c)]
    n, cause = max(tenant) if tenant else (0, "tenant_crash")
    examples = tuple(x[3] for x in ledger.examples)
    if cause == "tenant_bad_artifact":  # nothing ran: there is no rate to speak of
        msg = "your reward file was refused before scoring: it is not a valid reward artifact"
    else:
        msg = f"your reward function {_VERB[cause]} on {_pct(n, ledger.total_samples)} of samples"
    others = [f"{_VERB[c]} on {_pct(k, ledger.total_samples)}" for k, c in tenant if c != cause]
    if others:
        msg += f" (it also {', '.join(others)})"
    if not tenant and detail:
        msg = f"your code failed: {detail}"
    if tenant or examples or not detail:  # (a job's own error has no scored examples)
        msg += f"; {len(examples)} example{'s' if len(examples) != 1 else ''} attached"
    return Attribution(
        "tenant_code_fault", msg, tuple(ledger.counts().items()), examples, detail=detail
    )


def platform_fault(ledger: Ledger, detail: str) -> Attribution:
    msg = "the run stopped because of a platform fault, not because of your code or data"
    if detail:
        msg += f" ({detail})"
    return Attribution("platform_fault", msg, tuple(ledger.counts().items()), detail=detail)


def non_convergence(
    history: tuple[tuple[str, str, int, int], ...], reasons: tuple[str, ...], detail: str = ""
) -> Attribution:
    why = "; ".join(reasons) if reasons else (detail or "no learning progress")
    msg = f"training did not converge: {why}; the run's health history is attached"
    return Attribution("algorithmic_non_convergence", msg, (), (), history, detail=detail)


def attribute_failure(
    producer_class: FailureClass | None,
    detail: str,
    ledger: Ledger,
    tenant_failure_ratio: float,
    history: tuple[tuple[str, str, int, int], ...],
    active_reasons: tuple[str, ...],
    reported_by_tenant: bool = False,
) -> Attribution:
    """Exactly one class for a RunFailed. The producer's class is a hint; without one the
    ledger decides (tenant share of failed samples), then active algorithmic alerts, and
    otherwise the platform takes the blame (an unexplained failure is ours) — unless the
    failure was reported by the tenant's own job (``reported_by_tenant``: a customer's
    hook, whose process raised): then it is the tenant's code, and a hook's claim of a
    platform fault is not taken (found by review: every hooked run's own exception, and
    a forged ``failure_class``, was booked as a platform fault, spending the platform's
    error budget and paging operators; the platform's own faults in a hooked run are the
    platform's to report)."""
    tenant_share = ledger.tenant_failed / ledger.total_samples if ledger.total_samples else 0.0
    if reported_by_tenant and producer_class == "platform_fault":
        producer_class = None
    if producer_class == "tenant_code_fault":
        return tenant_fault(ledger, detail)
    if producer_class == "platform_fault":
        return platform_fault(ledger, detail)
    if producer_class == "algorithmic_non_convergence":
        return non_convergence(history, active_reasons, detail)
    if ledger.tenant_failed and tenant_share >= tenant_failure_ratio:
        return tenant_fault(ledger, detail)
    if active_reasons:
        return non_convergence(history, active_reasons, detail)
    if reported_by_tenant:
        return tenant_fault(ledger, detail)
    return platform_fault(ledger, detail)
