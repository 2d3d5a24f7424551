"""The run-state policy and the price list: configuration, not code (principle 5).

Both are frozen pydantic models loaded from YAML (defaults ship beside this module:
``run_state_policy.yaml`` and ``prices.yaml``). Every derived event and attribution names
the policy ``version`` it was decided under, so a changed threshold is visible in the
audit trail.

Policy semantics (all windows in training steps, never wall-clock):

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

Action = Literal["degrade", "pause", "pause_at_checkpoint", "advisory"]

HERE = Path(__file__).parent
DEFAULT_POLICY_PATH = HERE / "run_state_policy.yaml"
DEFAULT_PRICES_PATH = HERE / "prices.yaml"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DetectorRule(_Frozen):
    action: Action = "degrade"
    #: Customer-facing text; ``{reason}`` is the alert's own reason.
    customer_reason: str = "{reason}"


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


class Prices(_Frozen):
    """USD prices. Device-seconds are priced per device kind (``cpu``, ``gpu``) and pool;
    tokens per million (optional). ``usd_per_gpu_second`` (per pool) is the older form of
    the GPU prices and is used where ``usd_per_device_second`` names no ``gpu`` prices."""

    version: str = "default"
    usd_per_device_second: dict[str, dict[str, float]] = Field(default_factory=dict)
    usd_per_gpu_second: dict[str, float] = Field(default_factory=dict)
    usd_per_million_tokens_generated: float = 0.0
    usd_per_million_tokens_trained: float = 0.0

    def device_price(self, kind: str, pool: str) -> float:
        """USD per device-second of ``kind`` in ``pool`` (0 when not priced)."""
        by_pool = self.usd_per_device_second.get(kind)
        if by_pool is None and kind == "gpu":
            by_pool = self.usd_per_gpu_second
        return (by_pool or {}).get(pool, 0.0)

    def gpu_price(self, pool: str) -> float:
        return self.device_price("gpu", pool)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Prices:
        return cls.model_validate(_read_yaml(path or DEFAULT_PRICES_PATH))


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
