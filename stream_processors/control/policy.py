"""The run-control policy: which alerts stop a run. Configuration, not code (principle 5).

A frozen pydantic model loaded from YAML (default: ``policy.yaml`` beside this module).
Layers, later wins: the defaults, ``algorithms.<algo>``, ``tenants.<tenant>``; each may
set ``pause_on`` (the alert routings that pause: ``page`` by default; ``ticket`` and
``advisory`` alerts never pause unless a layer says so) and ``advisory_detectors``
(detectors demoted to advisory for control: they still fire and page, they never pause)
and ``pause_unanswered_steps`` / ``pause_unanswered_grace_s`` (how many steps, and
seconds of the run's own clock, a run may train past a pause request before the
controller pages ``pause_unanswered``: 2 and 3 s by default, one step in flight plus the
hook's command poll and publishing delay; both must pass).
Every request the controller makes names the policy ``version`` plus the first 8 hex
digits of the file's sha256, so an edit without a version bump is still told apart.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_processors.config_file import read_mapping

DEFAULT_POLICY_PATH = Path(__file__).with_name("policy.yaml")
RoutingName = Literal["page", "ticket", "advisory"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ControlLayer(_Frozen):
    pause_on: tuple[RoutingName, ...] | None = None
    advisory_detectors: tuple[str, ...] | None = None
    pause_unanswered_steps: int | None = Field(None, ge=1)
    pause_unanswered_grace_s: float | None = Field(None, ge=0, allow_inf_nan=False)


class ControlPolicy(_Frozen):
    version: str = "default"
    pause_on: tuple[RoutingName, ...] = ("page",)
    advisory_detectors: tuple[str, ...] = ()
    #: steps a run may train past a pause request with no answer before it pages
    pause_unanswered_steps: int = Field(2, ge=1)
    #: ... and seconds of the run's own clock (its step facts' ``ts``)
    pause_unanswered_grace_s: float = Field(3.0, ge=0, allow_inf_nan=False)
    algorithms: dict[str, ControlLayer] = Field(default_factory=dict)
    tenants: dict[str, ControlLayer] = Field(default_factory=dict)

    def pauses(self, *, tenant: str, algorithm: str, detector: str, routing: str) -> bool:
        """Whether an alert of ``detector`` routed ``routing`` pauses this tenant's run."""
        pause_on, advisory = self.pause_on, self.advisory_detectors
        for layer in (self.algorithms.get(algorithm), self.tenants.get(tenant)):
            if layer is None:
                continue
            if layer.pause_on is not None:
                pause_on = layer.pause_on
            if layer.advisory_detectors is not None:
                advisory = layer.advisory_detectors
        return routing in pause_on and detector not in advisory

    def unanswered_after(self, *, tenant: str, algorithm: str) -> tuple[int, float]:
        """How many steps, and seconds of its own clock, this tenant's run may train past
        a pause request unanswered before ``pause_unanswered`` pages (both must pass)."""
        steps, grace = self.pause_unanswered_steps, self.pause_unanswered_grace_s
        for layer in (self.algorithms.get(algorithm), self.tenants.get(tenant)):
            if layer is None:
                continue
            if layer.pause_unanswered_steps is not None:
                steps = layer.pause_unanswered_steps
            if layer.pause_unanswered_grace_s is not None:
                grace = layer.pause_unanswered_grace_s
        return steps, grace

    @classmethod
    def load(cls, path: str | Path | None = None) -> ControlPolicy:
        """Read and validate a policy file; a bad file is a ``ValueError`` naming the key."""
        p = Path(path or DEFAULT_POLICY_PATH)
        data, raw = read_mapping(p, "control policy")
        try:
            policy = cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"{p}: {exc}") from None
        digest = hashlib.sha256(raw).hexdigest()[:8]
        return policy.model_copy(update={"version": f"{policy.version}+{digest}"})
