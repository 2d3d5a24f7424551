"""The price list of tenant accounting: configuration, not code (principle 5).

A frozen pydantic model loaded from YAML (the default ships beside this module:
``prices.yaml``); its ``version`` is stamped on every read-model view of a run's usage, so
a changed price is visible in the audit trail.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from stream_processors.config_file import read_mapping

DEFAULT_PRICES_PATH = Path(__file__).parent / "prices.yaml"


class Prices(BaseModel):
    """USD prices. Device-seconds are priced per device kind and pool:
    ``usd_per_gpu_second`` and ``usd_per_cpu_second`` (each per pool); tokens per million
    (optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = "default"
    usd_per_gpu_second: dict[str, float] = Field(default_factory=dict)
    usd_per_cpu_second: dict[str, float] = Field(default_factory=dict)
    usd_per_million_tokens_generated: float = 0.0
    usd_per_million_tokens_trained: float = 0.0

    def device_price(self, kind: str, pool: str) -> float:
        """USD per device-second of ``kind`` (``cpu`` | ``gpu``) in ``pool`` (0: unpriced)."""
        table = self.usd_per_gpu_second if kind == "gpu" else self.usd_per_cpu_second
        return table.get(pool, 0.0) if kind in ("cpu", "gpu") else 0.0

    def gpu_price(self, pool: str) -> float:
        return self.device_price("gpu", pool)

    def by_kind_and_pool(self) -> dict[str, float]:
        """Every price as ``{"<kind>/<pool>": usd}``, GPU prices also under the bare pool
        name (the older key): the form the dead-run detector's money estimate reads."""
        out = dict(self.usd_per_gpu_second)
        out.update({f"gpu/{pool}": usd for pool, usd in self.usd_per_gpu_second.items()})
        out.update({f"cpu/{pool}": usd for pool, usd in self.usd_per_cpu_second.items()})
        return out

    @classmethod
    def load(cls, path: str | Path | None = None) -> Prices:
        """The price list at ``path`` (default: the packaged one); a ``ValueError`` naming
        the file for a missing file, bad YAML or a document that is not a mapping."""
        p = Path(path or DEFAULT_PRICES_PATH)
        data, _ = read_mapping(p)
        # a list written before CPU-seconds were billed would bill them at $0 silently
        missing = [k for k in ("usd_per_gpu_second", "usd_per_cpu_second") if k not in data]
        if missing:
            raise ValueError(
                f"{p}: no {' and no '.join(missing)}: every device kind a run can use is "
                "priced explicitly (write {} to bill it at no cost on purpose)"
            )
        try:
            return cls.model_validate(data)
        except ValueError as exc:
            raise ValueError(f"{p}: {exc}") from None
