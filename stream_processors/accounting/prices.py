"""The price list of tenant accounting: configuration, not code (principle 5).

A frozen pydantic model loaded from YAML (the default ships beside this module:
``prices.yaml``); its ``version`` is stamped on every read-model view of a run's usage, so
a changed price is visible in the audit trail.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PRICES_PATH = Path(__file__).parent / "prices.yaml"


class Prices(BaseModel):
    """USD prices. GPU-seconds are priced per pool; tokens per million (optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = "default"
    usd_per_gpu_second: dict[str, float] = Field(default_factory=dict)
    usd_per_million_tokens_generated: float = 0.0
    usd_per_million_tokens_trained: float = 0.0

    def gpu_price(self, pool: str) -> float:
        return self.usd_per_gpu_second.get(pool, 0.0)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Prices:
        """The price list at ``path`` (default: the packaged one); a ``ValueError`` naming
        the file for a missing file, bad YAML or a document that is not a mapping."""
        p = Path(path or DEFAULT_PRICES_PATH)
        try:
            data = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise ValueError(f"config file not found: {p}") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{p}: expected a mapping at the top level")
        return cls.model_validate(data)
