"""Reward functions the optimizer trains on, and the reward pin.

Every scorer maps ``(item, completion tokens)`` to a float. The built-ins are exact
checks against the task's answer; the canary faults replace or bend them (constant,
gameable); ``sandbox`` sends the batch to the tenant's function through the sandbox's
typed client (:mod:`sandbox.client`), never by importing tenant code here.

The *reward pin* (:meth:`RewardFn.digest`) is what a resume compares: a digest of the
scoring code and its parameters (for a tenant file: of the file's bytes), so a resumed
run scored by a different judge is refused by name. A tenant file is read once, bounded
by the sandbox's artifact cap (:func:`pin_artifact`), and the sandbox is handed a
private copy of exactly the bytes pinned: the file's size cannot set the trainer's
memory, and a file changed after the pin cannot run under it (security review,
2026-11-28, second round).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import TrainerConfig
from trainer.task import DIGIT0, EOS, Dataset

if TYPE_CHECKING:
    from sandbox.integrity import CanaryProbe as CanaryProbeT


@dataclass(frozen=True)
class Parsed:
    """A completion read as an answer: its digit tokens, or ``None`` if unparseable
    (empty, or a non-digit token before EOS)."""

    digits: tuple[int, ...] | None
    length: int


def parse(completion: Sequence[int]) -> Parsed:
    out: list[int] = []
    for t in completion:
        if t == EOS:
            break
        if t < DIGIT0:
            return Parsed(None, len(completion))
        out.append(int(t))
    return Parsed(tuple(out) if out else None, len(out))


def exact_match(answer: tuple[int, ...], got: Parsed) -> float:
    return 1.0 if got.digits == answer else 0.0


def partial_credit(answer: tuple[int, ...], got: Parsed) -> float:
    """1 for exact; else half the fraction of positions right (length mismatch counts
    against), so the sparse exact-match signal is learnable from scratch."""
    if got.digits is None:
        return 0.0
    if got.digits == answer:
        return 1.0
    hits = sum(a == b for a, b in zip(answer, got.digits))
    return 0.5 * hits / max(len(answer), len(got.digits))


def gameable(answer: tuple[int, ...], got: Parsed, token: int, bonus: float = 0.3) -> float:
    """Canary: partial credit plus ``bonus`` per occurrence of one digit anywhere. Spamming
    that digit out-earns a correct answer, so the reward climbs while held-out exact
    match falls: the hacking signature."""
    base = partial_credit(answer, got)
    if got.digits is None:
        return base
    return base + bonus * sum(1 for d in got.digits if d == DIGIT0 + token)


class RewardFn:
    """Scores a batch. ``digest`` is the reward pin."""

    def __init__(self, cfg: TrainerConfig, dataset: Dataset) -> None:
        self.cfg = cfg
        self.dataset = dataset
        f = cfg.faults
        if f.constant_reward is not None:
            self.kind = "constant"
        elif f.gameable_reward:
            self.kind = "gameable"
        else:
            self.kind = cfg.reward.kind
        self._sandbox: SandboxReward | None = None
        if self.kind == "sandbox":
            assert cfg.reward.sandbox_path
            self._sandbox = SandboxReward(Path(cfg.reward.sandbox_path), cfg, dataset)

    def digest(self) -> str:
        params = {"kind": self.kind}
        f = self.cfg.faults
        if self.kind == "constant":
            params["value"] = repr(f.constant_reward)
        if self.kind == "gameable":
            params["token"] = str(f.gameable_token)
            params["bonus"] = repr(f.gameable_bonus)
        h = hashlib.sha256(json.dumps(params, sort_keys=True).encode())
        if self._sandbox is not None:
            h.update(self._sandbox.file_digest().encode())
        else:
            for fn in (parse, exact_match, partial_credit, gameable):
                h.update(inspect.getsource(fn).encode())
        return "r-" + h.hexdigest()[:32]

    def drain_events(self) -> list[object]:
        """Reward events produced since the last call (sandbox scoring only)."""
        if self._sandbox is None:
            return []
        out, self._sandbox.pending_events = self._sandbox.pending_events, []
        return out

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()

    def score(
        self,
        items: Sequence[tuple[int, ...]],
        completions: Sequence[Sequence[int]],
        step: int | None = None,
    ) -> list[float]:
        """One float per completion; raises :class:`RewardUnavailable` if the sandbox could
        not score the batch (never a substituted value)."""
        if self.kind == "sandbox":
            assert self._sandbox is not None
            return self._sandbox.score(self.dataset, items, completions, step)
        out: list[float] = []
        for item, comp in zip(items, completions):
            answer = self.dataset.answer_tokens(item)
            got = parse(comp)
            if self.kind == "constant":
                out.append(float(self.cfg.faults.constant_reward))  # type: ignore[arg-type]
            elif self.kind == "gameable":
                f = self.cfg.faults
                out.append(gameable(answer, got, f.gameable_token, f.gameable_bonus))
            elif self.kind == "exact_match":
                out.append(exact_match(answer, got))
            else:
                out.append(partial_credit(answer, got))
        return out


class RewardUnavailable(RuntimeError):
    """The reward could not be computed; the caller must not train on the batch.

    ``action`` is what the sandbox's failure policy decided: ``skip`` (leave this batch
    out, try another), ``pause`` (stop the run for tenant action) or ``fail``;
    ``failure_class`` is the attribution (tenant code or platform).
    """

    def __init__(
        self, message: str, action: str = "fail", failure_class: str = "tenant_code_fault"
    ) -> None:
        super().__init__(message)
        self.action = action
        self.failure_class = failure_class


def sandbox_item(prompt: Sequence[int], completion: Sequence[int], answer: Sequence[int]) -> dict:
    """One batch item as the tenant's ``reward(batch)`` sees it (digit values in, digit
    strings out): the one place real items and canary probes are both shaped."""
    return {
        "prompt": "".join(str(d) for d in prompt),
        "completion": "".join(str(d) for d in completion),
        "answer": "".join(str(d) for d in answer),
    }


def wrong_everywhere(length: int, answer: str, base: int, rng: random.Random) -> str:
    """A completion of ``length`` digits that matches ``answer`` at no position: no
    exact-match or per-position credit for this answer. Where ``length`` is the answer's,
    a shuffle of the answer's own digits (what a model that reverses badly writes) if one
    is wrong everywhere; else digits drawn at random, none the answer's at its position.
    Made fresh, never copied from a real completion: a near copy of another group in the
    batch told a reward which group was the probe (red-team round three)."""
    if length == len(answer):
        pool = list(answer)
        for _ in range(20):
            rng.shuffle(pool)
            if all(p != a for p, a in zip(pool, answer)):
                return "".join(pool)
    digits = [str(d) for d in range(min(base, 10))]
    return "".join(
        rng.choice([d for d in digits if i >= len(answer) or d != answer[i]]) for i in range(length)
    )


@dataclass(frozen=True)
class PinnedArtifact:
    """A tenant reward file as pinned: ``digest`` (hex sha256 of ``data``; for a file
    over the cap, ``too-large:`` and why) and ``data``, the bytes read (None when over
    the cap: never read whole)."""

    digest: str
    data: bytes | None


def pin_artifact(path: Path) -> PinnedArtifact:
    """Read the tenant's file once, bounded: a regular file, at most the sandbox's
    artifact cap (:func:`sandbox.classify.read_artifact`, ``MAX_ARTIFACT_BYTES``). Over
    the cap, nothing past its first bytes is read and the pin says so; the client
    refuses that file as ``tenant_bad_artifact``. Raises ``OSError`` when unreadable or
    not a regular file."""
    from sandbox.classify import ArtifactTooLarge, read_artifact

    try:
        data = read_artifact(path)
    except ArtifactTooLarge as exc:
        return PinnedArtifact("too-large:" + str(exc), None)
    return PinnedArtifact(hashlib.sha256(data).hexdigest(), data)


class SandboxReward:
    """A tenant reward file scored through :class:`sandbox.client.RewardClient`.

    Batch sent to the tenant's ``reward(batch)``: one dict per completion,
    ``{"prompt": "123", "completion": "321", "answer": "321"}`` (digit strings; the
    completion is ``""`` when unparseable); one float per element comes back through the
    sandbox's schema gate. The client's reward events (RewardBatchScored/Failed,
    CanaryProbeScored) are queued in :attr:`pending_events` for the trainer to publish.

    Canary probes (:meth:`draw_probes`), when ``reward.canary_every`` is not 0: every
    batch carries one more GRPO group that is indistinguishable from the real ones — a
    train prompt not in the batch, its true ``answer``, and ``group_size`` completions as
    long as those of a real group of the same batch (empties included: the model's own
    lengths), made fresh and wrong at every position (never copies of a real completion:
    a near copy told which group was the probe); the same keys, order and types
    as every item, placed at a group boundary drawn from the system's entropy. Every
    batch, so that no batch is longer than another (a reward that counts its items would
    otherwise know when to be honest); scoring costs one group more per batch. Every
    ``reward.canary_every``-th batch the probes of the batches since the last verdict are
    judged: an honest judge of this task scores them 0; a mean above
    ``reward.canary_tolerance`` marks that batch's ``CanaryProbeScored`` inflated. Probe
    scores never reach the optimizer; the event reaches the log with the step's other
    reward events (the reward-integrity detector reads it). (What they cannot see: a
    reward that inflates only partly right answers — the platform has no reference score
    for partial credit; the probes are right at no position, so such a reward can also
    leave every probe alone.)
    """

    def __init__(self, path: Path, cfg: TrainerConfig, dataset: Dataset | None = None) -> None:
        if not path.is_file():
            raise ValueError(f"reward file {path} does not exist")
        self.path = path
        self.cfg = cfg
        self.dataset = dataset
        self._client = None
        self._pin: PinnedArtifact | None = None
        self._probes = 0
        self.pending_events: list[object] = []

    def draw_probes(
        self, batch: Sequence[Mapping[str, Any]], rng: random.Random
    ) -> tuple[CanaryProbeT, ...]:
        """One group of probes shaped and drawn like the real groups of ``batch``."""
        from sandbox.integrity import CanaryProbe

        ds, group = self.dataset, self.cfg.grpo.group_size
        if ds is None or not ds.train or not batch or len(batch) % group:
            return ()
        seen = {str(x.get("prompt")) for x in batch}
        for _ in range(32):
            item = ds.train[rng.randrange(len(ds.train))]
            if "".join(str(d) for d in item) not in seen:
                break
        else:
            return ()
        answer = [d - DIGIT0 for d in ds.answer_tokens(item)]
        start = rng.randrange(len(batch) // group) * group
        probes = []
        for k in range(group):
            real = str(batch[start + k].get("completion", ""))  # its length only
            shaped = sandbox_item(item, (), answer)
            wrong = wrong_everywhere(len(real), shaped["answer"], self.cfg.task.base, rng)
            self._probes += 1
            probes.append(
                CanaryProbe(
                    f"canary-{self._probes}",
                    shaped["prompt"],
                    wrong,
                    expected=0.0,
                    fields=(("answer", shaped["answer"]),),
                )
            )
        return tuple(probes)

    def file_digest(self) -> str:
        """The pin of the tenant's file (:func:`pin_artifact`), read once: the bytes the
        sandbox is later given are these same bytes (:meth:`_get_client`)."""
        return self.pinned().digest

    def pinned(self) -> PinnedArtifact:
        """The tenant's file as read (bounded) the first time it was needed."""
        if self._pin is None:
            self._pin = pin_artifact(self.path)
        return self._pin

    def _get_client(self):  # type: ignore[no-untyped-def]
        if self._client is None:
            pin = self.pinned()
            with tempfile.TemporaryDirectory(prefix="runwatch-reward-") as private:
                # the client stages what it reads here once, at construction: a private
                # copy of the pinned bytes, which the tenant cannot change in between
                source = self.path
                if pin.data is not None:
                    source = Path(private) / self.path.name
                    source.write_bytes(pin.data)
                client = self._make_client(source)
            if not client.refused and client.artifact_digest != "sha256:" + pin.digest:
                # only a file over the cap at the pin, under it now, gets here
                client.close()
                raise RewardUnavailable(
                    "reward file changed since the run pinned it: refusing to run code the "
                    "pin does not name",
                    "fail",
                )
            self._client = client
        return self._client

    def _make_client(self, source: Path):  # type: ignore[no-untyped-def]
        """A :class:`sandbox.client.RewardClient` for the artifact at ``source``."""
        from sandbox.client import RewardClient  # the sandbox's typed boundary
        from sandbox.integrity import CanarySet
        from sandbox.types import ResourceLimits, SandboxConfig

        limits = ResourceLimits(deadline_s=self.cfg.reward.sandbox_deadline_s)
        rc = self.cfg.reward
        canaries = CanarySet(
            every=rc.canary_every,
            tolerance=rc.canary_tolerance,
            group=self.cfg.grpo.group_size,
            draw=self.draw_probes,
        )
        return RewardClient(
            source,
            self.cfg.tenant_id,
            run_id=self.cfg.run_id,
            producer=f"sandbox/{self.cfg.run_id}",
            config=SandboxConfig(limits=limits),
            canaries=canaries if self.dataset is not None and rc.canary_every else None,
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def score(
        self,
        ds: Dataset,
        items: Sequence[tuple[int, ...]],
        completions: Sequence[Sequence[int]],
        step: int | None = None,
    ) -> list[float]:
        if self.dataset is None:
            self.dataset = ds
        batch = []
        for item, comp in zip(items, completions):
            got = parse(comp)
            batch.append(
                sandbox_item(
                    item,
                    [d - DIGIT0 for d in got.digits or ()],
                    [d - DIGIT0 for d in ds.answer_tokens(item)],
                )
            )
        client = self._get_client()
        outcome = client.score(batch, step=step)
        self.pending_events.extend(client.outcome_events(outcome))
        if outcome.ok and outcome.scores is not None:
            return [float(x) for x in outcome.scores]
        status = outcome.status.value
        cause = outcome.cause.value
        action = {"skipped": "skip", "paused": "pause"}.get(status, "fail")
        # bad_input: the trainer (the platform) built a batch that cannot be sent
        klass = (
            "platform_fault" if cause in ("platform_error", "bad_input") else "tenant_code_fault"
        )
        raise RewardUnavailable(
            f"sandbox outcome {status} ({cause}): {outcome.message[:500]}", action, klass
        )
