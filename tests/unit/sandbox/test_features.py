"""Tier gating from a feature report: every tier needs the same layers (the tier comes from
the tenant's code); only layers with a fallback may be missing, named loudly."""

from __future__ import annotations

from sandbox.features import FALLBACKS, REQUIRED_BY_TIER, REQUIRED_LAYERS, KernelFeatures, tier_gate
from sandbox.types import ALL_LAYERS


def feats(*missing: str) -> KernelFeatures:
    return KernelFeatures(
        {layer: layer not in missing for layer in ALL_LAYERS},
        {m: f"{m} absent (test)" for m in missing},
    )


def test_everything_present() -> None:
    for tier in ("function", "verifier"):
        g = tier_gate(feats(), tier)
        assert g.allowed and g.missing == () and g.message == ""


def test_every_tier_refuses_without_seccomp() -> None:
    """Security review 2026-11-27: the function tier ran without seccomp where the verifier
    tier was refused, and the tier is picked by a scan a getattr() evades."""
    for tier in ("function", "verifier"):
        g = tier_gate(feats("seccomp"), tier)
        assert not g.allowed and "seccomp" in g.message and "refusing" in g.message, tier


def test_every_layer_without_a_fallback_is_required_by_every_tier() -> None:
    assert frozenset(ALL_LAYERS) - frozenset(FALLBACKS) == REQUIRED_LAYERS
    assert all(req == REQUIRED_LAYERS for req in REQUIRED_BY_TIER.values())
    for layer in sorted(REQUIRED_LAYERS):
        for tier in ("function", "verifier"):
            g = tier_gate(feats(layer), tier)
            assert not g.allowed and layer in g.message, (tier, layer)


def test_fallbacks_do_not_refuse_but_are_named() -> None:
    for tier in ("function", "verifier"):
        g = tier_gate(feats("cgroup_pids", "cgroup_memory", "cgroup_cpu"), tier)
        assert g.allowed
        assert set(g.missing) == {"cgroup_pids", "cgroup_memory", "cgroup_cpu"}
        assert "RLIMIT_NPROC" in g.message


def test_no_scratch_tmpfs_refuses_every_tier() -> None:
    """Security review 2026-11-28: without the tmpfs, scratch was a plain host directory
    bounded per file only (646 MB written to the host's disk in one batch, and a tree
    1,500 deep defeated its cleanup): no longer a fallback, a required layer."""
    assert "scratch_tmpfs" in REQUIRED_LAYERS and "scratch_tmpfs" not in FALLBACKS
    for tier in ("function", "verifier"):
        g = tier_gate(feats("scratch_tmpfs"), tier)
        assert not g.allowed and "scratch_tmpfs" in g.message, tier
        g = tier_gate(feats(), tier, frozenset(ALL_LAYERS) - {"scratch_tmpfs"})
        assert not g.allowed and "scratch_tmpfs" in g.message, tier


def test_no_network_namespace_refuses_every_tier() -> None:
    for tier in ("function", "verifier"):
        g = tier_gate(feats("net_ns"), tier)
        assert not g.allowed and "net_ns" in g.message


def test_dropping_a_layer_on_request_counts_as_missing() -> None:
    requested = frozenset(ALL_LAYERS) - {"pid_ns"}
    assert not tier_gate(feats(), "verifier", requested).allowed
    assert not tier_gate(feats(), "function", requested).allowed
    with_fallback = frozenset(ALL_LAYERS) - {"cgroup_pids"}
    for tier in ("function", "verifier"):
        g = tier_gate(feats(), tier, with_fallback)
        assert g.allowed and g.missing == ("cgroup_pids",), tier


def test_unbuilt_tiers_refused() -> None:
    for tier in ("reward_model", "environment"):
        g = tier_gate(feats(), tier)
        assert not g.allowed and "not built" in g.message


def test_describe_is_loud_about_missing_layers() -> None:
    text = feats("seccomp").describe()
    assert "seccomp           NO" in text and "tier verifier  REFUSED" in text
    assert "tier function  REFUSED" in text
