"""Tier gating from a feature report: hostile tiers refuse, the function tier degrades loudly."""

from __future__ import annotations

from sandbox.features import KernelFeatures, tier_gate
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


def test_hostile_tier_refuses_without_seccomp_function_tier_degrades() -> None:
    g = tier_gate(feats("seccomp"), "verifier")
    assert not g.allowed and "seccomp" in g.message and "refusing" in g.message
    g = tier_gate(feats("seccomp"), "function")
    assert g.allowed and g.missing == ("seccomp",) and "WITHOUT" in g.message


def test_fallbacks_do_not_refuse_but_are_named() -> None:
    g = tier_gate(feats("cgroup_pids", "cgroup_memory", "scratch_tmpfs"), "verifier")
    assert g.allowed
    assert set(g.missing) == {"cgroup_pids", "cgroup_memory", "scratch_tmpfs"}
    assert "RLIMIT_NPROC" in g.message


def test_no_network_namespace_refuses_every_tier() -> None:
    for tier in ("function", "verifier"):
        g = tier_gate(feats("net_ns"), tier)
        assert not g.allowed and "net_ns" in g.message


def test_dropping_a_layer_on_request_counts_as_missing() -> None:
    requested = frozenset(ALL_LAYERS) - {"pid_ns"}
    assert not tier_gate(feats(), "verifier", requested).allowed
    assert tier_gate(feats(), "function", requested).allowed


def test_unbuilt_tiers_refused() -> None:
    for tier in ("reward_model", "environment"):
        g = tier_gate(feats(), tier)
        assert not g.allowed and "not built" in g.message


def test_describe_is_loud_about_missing_layers() -> None:
    text = feats("seccomp").describe()
    assert "seccomp           NO" in text and "tier verifier  REFUSED" in text
