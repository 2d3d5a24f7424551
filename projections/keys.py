"""API keys: a YAML file mapping keys to a tenant, or to the operator role.

::

    keys:
      - key: "rk_acme_3f9..."        # plain key, or
      - sha256: "9c56cc51b374..."    #   its hex sha256 (keeps secrets out of the file)
        tenant: acme
      - key: "rk_ops_..."
        operator: true

Keys are looked up by their sha256, so the comparison does not depend on how many
leading characters of a guessed key match. A key is exactly one of tenant or operator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str | None
    operator: bool = False

    def can_read(self, tenant_id: str) -> bool:
        return self.operator or self.tenant_id == tenant_id


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    def __init__(self, entries: dict[str, Principal]) -> None:
        self._by_digest = dict(entries)

    @classmethod
    def from_mapping(cls, data: dict) -> ApiKeys:
        entries: dict[str, Principal] = {}
        for i, item in enumerate(data.get("keys") or []):
            if not isinstance(item, dict):
                raise ValueError(f"keys[{i}]: expected a mapping")
            if ("key" in item) == ("sha256" in item):
                raise ValueError(f"keys[{i}]: give exactly one of 'key' or 'sha256'")
            operator = bool(item.get("operator", False))
            tenant = item.get("tenant")
            if operator == (tenant is not None):
                raise ValueError(f"keys[{i}]: give exactly one of 'tenant' or 'operator: true'")
            d = digest(str(item["key"])) if "key" in item else str(item["sha256"]).lower()
            entries[d] = Principal(None if operator else str(tenant), operator)
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError:
            raise ValueError(f"API keys file not found: {p}") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{p}: expected a mapping with a 'keys' list")
        return cls.from_mapping(data)

    def resolve(self, key: str | None) -> Principal | None:
        if not key:
            return None
        return self._by_digest.get(digest(key))
