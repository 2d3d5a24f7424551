"""The run-state policy: configuration, not code (principle 5).

A frozen pydantic model loaded from YAML (the default ships beside this module:
``run_state_policy.yaml``). Every derived event and attribution names the policy
``version`` it was decided under, so a changed threshold is visible in the audit trail.
(The price list is tenant accounting's: ``stream_processors/accounting/prices.py``.)

Policy semantics (all windows in training steps, never wall-clock):

- ``detectors[name].failure_class``: whom a run that ends while the alert is active is
  booked to (default ``algorithmic_non_convergence``; the reward-integrity alert says
  ``tenant_code_fault``: its evidence is about the tenant's reward, not the training).
- ``detectors[name].action``: what a firing alert of that detector does to a running run:
  ``degrade`` (RUNNING -> DEGRADED(reason)), ``pause`` (DEGRADED now, and
  PAUSED_BY_GATE(reason) once the trainer confirms ``RunPaused`` — whether the run is
  asked to pause is the run controller's policy, ``stream_processors/control/policy.yaml``;
  ``pause_at_checkpoint`` is the old name of ``pause``), ``advisory`` (recorded, no state
  change). Unknown detectors use ``default_action``.
- Hysteresis: a degraded run returns to RUNNING only when no degrading alert is active
  *and* it has dwelt ``min_dwell_steps`` in DEGRADED (measured on the ``step`` of the
  resolving or a later alert/checkpoint/lifecycle fact). A re-fire inside that dwell keeps
  it DEGRADED without a new event, so a flapping detector cannot flap the customer state.
- ``completion``: a RunCompleted ends FAILED(algorithmic_non_convergence) when any
  detector in ``fail_if_active`` is active at completion or any in ``fail_if_fired`` ever
  fired during the run; SUCCEEDED otherwise.
- ``attribution``: a RunFailed without a producer class is booked to the tenant when the
  tenant share of reward samples that failed is at least ``tenant_failure_ratio``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from events.catalog.lifecycle import FailureClass

Action = Literal["degrade", "pause", "pause_at_checkpoint", "advisory"]

HERE = Path(__file__).parent
DEFAULT_POLICY_PATH = HERE / "run_state_policy.yaml"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DetectorRule(_Frozen):
    action: Action = "degrade"
    #: Customer-facing text; ``{reason}`` is the alert's own reason.
    customer_reason: str = "{reason}"
    #: The class of a run that fails or ends while this alert is active.
    failure_class: FailureClass = "algorithmic_non_convergence"


class CompletionRule(_Frozen):
    fail_if_active: tuple[str, ...] = ()
    fail_if_fired: tuple[str, ...] = ()


class AttributionRule(_Frozen):
    tenant_failure_ratio: float = 0.01
    max_examples: int = 3


class LedgerRule(_Frozen):
    #: A RewardBatchFailed whose failure policy paused the run gates it (PAUSED_BY_GATE).
    pause_on_action_pause: bool = True


class RunStatePolicy(_Frozen):
    version: str = "default"
    default_action: Action = "advisory"
    detectors: dict[str, DetectorRule] = Field(default_factory=dict)
    min_dwell_steps: int = 0
    completion: CompletionRule = CompletionRule()
    attribution: AttributionRule = AttributionRule()
    ledger: LedgerRule = LedgerRule()

    def rule(self, detector: str) -> DetectorRule:
        return self.detectors.get(detector) or DetectorRule(action=self.default_action)

    @classmethod
    def load(cls, path: str | Path | None = None) -> RunStatePolicy:
        return cls.model_validate(_read_yaml(path or DEFAULT_POLICY_PATH))


def _read_yaml(path: str | Path) -> dict:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"config file not found: {p}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping at the top level")
    return data
