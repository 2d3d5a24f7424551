"""The threshold catalog: versioned configuration over defaults kept in code.

Thresholds are config, not code (seed 000, Rollback). Each detector module declares its
``Params`` dataclass with defaults, its routing and its first-response text. The catalog
file (``catalog.yaml`` beside this module, or any file given to :func:`load_catalog`)
overrides them in layers, later wins::

    code defaults  <  attached  <  detectors.<name>  <  algorithms.<algo>.<name>
                   <  tenants.<tenant>.<name>

``attached`` is what the composition root adds from other configuration (the accounting
price list, :meth:`Catalog.with_prices`), so the file need not repeat it.

Each layer may set ``routing`` (page / ticket / advisory), ``escalated_routing``,
``first_response`` and any subset of ``params``. Demoting an alert is a routing change;
the metric and the detector keep running. The run's algorithm comes from
``RunSubmitted.algorithm`` (or the step events' ``algorithm`` field).

Every alert carries ``config_version``: the file's ``version`` plus the first 8 hex digits
of the file's sha256, so an edit without a version bump is still told apart.
Bad files fail at load with a message naming the offending key, never at alert time.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from events.catalog.derived import Routing
from stream_processors.detectors.base import Detector, Settings

DEFAULT_CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
ROUTINGS: frozenset[str] = frozenset(get_args(Routing))
_LAYER_KEYS = frozenset({"routing", "escalated_routing", "first_response", "params"})


class CatalogError(ValueError):
    """The catalog file is not valid; the message names the offending key."""


@dataclass(frozen=True)
class Catalog:
    version: str
    detectors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    algorithms: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    tenants: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    #: params attached by the composition root, below the file's layers
    attached: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def with_prices(self, usd_per_gpu_second: Mapping[str, float], version: str) -> Catalog:
        """This catalog with the accounting price list attached: every detector whose
        ``Params`` has ``usd_per_gpu_second`` (the dead-run alert's money) prices spend
        per pool with it. Pure: the caller reads the price file."""
        prices = tuple(sorted((str(k), float(v)) for k, v in usd_per_gpu_second.items()))
        attached = dict(self.attached)
        for name in _priced_detectors():
            attached[name] = {"usd_per_gpu_second": prices, "prices_version": version}
        return dataclasses.replace(self, attached=attached)

    def settings(self, detector: Detector[Any, Any], tenant: str, algorithm: str) -> Settings:
        """The detector's resolved settings for one tenant running one algorithm."""
        layers = (
            {"params": self.attached[detector.name]} if detector.name in self.attached else {},
            self.detectors.get(detector.name, {}),
            self.algorithms.get(algorithm, {}).get(detector.name, {}),
            self.tenants.get(tenant, {}).get(detector.name, {}),
        )
        routing = detector.default_routing
        escalated = "page"
        first_response = detector.first_response
        params = detector.Params()
        for layer in layers:
            routing = layer.get("routing", routing)
            escalated = layer.get("escalated_routing", escalated)
            first_response = layer.get("first_response", first_response)
            params = _with_params(params, layer.get("params", {}), detector.name)
        return Settings(
            detector=detector.name,
            layer=detector.layer,
            routing=routing,
            first_response=first_response,
            params=params,
            config_version=self.version,
            escalated_routing=escalated,
        )


def _priced_detectors() -> tuple[str, ...]:
    from stream_processors.detectors.registry import DETECTORS

    return tuple(
        d.name
        for d in DETECTORS
        if "usd_per_gpu_second" in {f.name for f in dataclasses.fields(d.Params)}
    )


def defaults() -> Catalog:
    """Code defaults only (no file)."""
    return Catalog(version="defaults")


def load_catalog(
    path: str | Path | None = None, detectors: Iterable[Detector[Any, Any]] | None = None
) -> Catalog:
    """Read and validate a catalog file (default: the packaged ``catalog.yaml``)."""
    if detectors is None:
        from stream_processors.detectors.registry import DETECTORS

        detectors = DETECTORS
    path = Path(path) if path is not None else DEFAULT_CATALOG_PATH
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CatalogError(f"cannot read detector catalog {path}: {exc}") from None
    try:
        doc = yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None
    return parse_catalog(doc, {d.name: d for d in detectors}, raw, str(path))


def parse_catalog(
    doc: Any, known: Mapping[str, Detector[Any, Any]], raw: bytes = b"", where: str = "catalog"
) -> Catalog:
    if not isinstance(doc, dict):
        raise CatalogError(f"{where}: top level must be a mapping")
    unknown = set(doc) - {"version", "detectors", "algorithms", "tenants", "description"}
    if unknown:
        raise CatalogError(f"{where}: unknown top-level keys {sorted(unknown)}")
    if "version" not in doc:
        raise CatalogError(f"{where}: missing 'version' (bump it on every threshold change)")
    digest = hashlib.sha256(raw or repr(doc).encode()).hexdigest()[:8]
    detectors = _layer(doc.get("detectors") or {}, known, f"{where}: detectors")
    algorithms = {
        str(algo): _layer(block or {}, known, f"{where}: algorithms.{algo}")
        for algo, block in _mapping(doc.get("algorithms") or {}, f"{where}: algorithms").items()
    }
    tenants = {
        str(t): _layer(block or {}, known, f"{where}: tenants.{t}")
        for t, block in _mapping(doc.get("tenants") or {}, f"{where}: tenants").items()
    }
    return Catalog(f"{doc['version']}#{digest}", detectors, algorithms, tenants)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CatalogError(f"{where} must be a mapping")
    return value


def _layer(
    block: Any, known: Mapping[str, Detector[Any, Any]], where: str
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, entry in _mapping(block, where).items():
        if name not in known:
            raise CatalogError(f"{where}: unknown detector {name!r}; known: {sorted(known)}")
        entry = _mapping(entry or {}, f"{where}.{name}")
        bad = set(entry) - _LAYER_KEYS
        if bad:
            raise CatalogError(f"{where}.{name}: unknown keys {sorted(bad)}")
        for key in ("routing", "escalated_routing"):
            if key in entry and entry[key] not in ROUTINGS:
                raise CatalogError(
                    f"{where}.{name}.{key}: {entry[key]!r} is not one of {sorted(ROUTINGS)}"
                )
        params = _mapping(entry.get("params") or {}, f"{where}.{name}.params")
        _with_params(known[name].Params(), params, f"{where}.{name}")  # validate now
        out[str(name)] = dict(entry)
    return out


def _with_params(params: Any, overrides: Mapping[str, Any], where: str) -> Any:
    if not overrides:
        return params
    fields = {f.name: f for f in dataclasses.fields(params)}
    coerced: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in fields:
            raise CatalogError(
                f"{where}.params: unknown parameter {key!r}; known: {sorted(fields)}"
            )
        current = getattr(params, key)
        try:
            if isinstance(current, bool):
                if not isinstance(value, bool):
                    raise TypeError("expected true/false")
                coerced[key] = value
            elif isinstance(current, int):
                if isinstance(value, bool) or int(value) != value:
                    raise TypeError("expected an integer")
                coerced[key] = int(value)
            elif isinstance(current, float):
                if isinstance(value, bool):
                    raise TypeError("expected a number")
                coerced[key] = float(value)
            elif isinstance(current, tuple):  # (key, value) pairs: a mapping in the file
                if isinstance(value, Mapping):
                    value = tuple(sorted((str(k), float(v)) for k, v in value.items()))
                if not isinstance(value, tuple):
                    raise TypeError("expected a mapping")
                coerced[key] = value
            else:
                coerced[key] = value
        except (TypeError, ValueError) as exc:
            raise CatalogError(f"{where}.params.{key}: {value!r}: {exc}") from None
    return dataclasses.replace(params, **coerced)
