"""Task, rewards, sampler, buffer staleness, the gate's comparison arithmetic."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.config import TaskConfig, TrainerConfig
from trainer.resume import deviation, metric_vector
from trainer.rewards import RewardFn, exact_match, gameable, parse, partial_credit
from trainer.rollout import RolloutBatch
from trainer.state import RngStreams, RolloutBuffer, RunningMoments
from trainer.task import DIGIT0, EOS, Dataset, PromptSampler, dataset_revision


def _digits(*ds: int) -> tuple[int, ...]:
    return tuple(DIGIT0 + d for d in ds)


def test_split_is_fixed_and_disjoint() -> None:
    a = Dataset.build(TaskConfig(digits=3))
    b = Dataset.build(TaskConfig(digits=3))
    assert a.heldout == b.heldout and not set(a.heldout) & set(a.train)
    assert len(a.train) + len(a.heldout) == 1000
    assert dataset_revision(a) == dataset_revision(b)
    assert dataset_revision(a) != dataset_revision(Dataset.build(TaskConfig(digits=3, kind="copy")))


def test_answers() -> None:
    ds = Dataset.build(TaskConfig(kind="add", digits=2))
    assert ds.answer_tokens((3, 9)) == _digits(1, 2)
    ds = Dataset.build(TaskConfig(kind="reverse", digits=3))
    assert ds.answer_tokens((1, 2, 3)) == _digits(3, 2, 1)


def test_exact_and_partial_rewards() -> None:
    ans = _digits(3, 2, 1)
    assert exact_match(ans, parse([*ans, EOS])) == 1.0
    assert exact_match(ans, parse([*_digits(3, 2), EOS])) == 0.0
    assert partial_credit(ans, parse([*_digits(3, 2, 9), EOS])) == 0.5 * 2 / 3
    assert partial_credit(ans, parse([EOS])) == 0.0  # empty: unparseable
    assert parse([DIGIT0, 1, EOS]).digits is None  # a BOS inside: unparseable


def test_gameable_pays_more_for_spam_than_for_the_answer() -> None:
    ans = _digits(3, 2, 1)
    spam = parse([*_digits(7, 7, 7, 7, 7), EOS])
    assert gameable(ans, spam, 7) > gameable(ans, parse([*ans, EOS]), 7)
    assert exact_match(ans, spam) == 0.0


def test_reward_pin_changes_with_the_judge() -> None:
    ds = Dataset.build(TaskConfig())
    base = TrainerConfig()
    pins = {
        RewardFn(c, ds).digest()
        for c in (
            base,
            base.with_overrides(reward={"kind": "exact_match"}),
            base.with_overrides(faults={"constant_reward": 1.0}),
            base.with_overrides(faults={"gameable_reward": True}),
        )
    }
    assert len(pins) == 4
    assert RewardFn(base, ds).digest() == RewardFn(TrainerConfig(), ds).digest()


def test_sampler_resumes_where_it_stopped() -> None:
    a = PromptSampler(10, seed=3)
    a.next_indices(7)
    b = PromptSampler(10, seed=99)
    b.load_state_dict(a.state_dict())
    assert a.next_indices(25) == b.next_indices(25)


def test_running_moments() -> None:
    m = RunningMoments()
    m.update(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert m.mean == 2.5 and math.isclose(m.std, math.sqrt(1.25))


def _batch(version: int) -> RolloutBatch:
    z = torch.zeros((1, 1))
    return RolloutBatch(z.long(), z.long(), z, z, torch.zeros(1, dtype=torch.bool), version)


def test_rng_streams_leave_cuda_alone_in_a_cpu_run() -> None:
    """Capturing the CUDA streams of a process that never used CUDA would start a CUDA
    context on a GPU host; a CPU run's state holds none."""
    state = RngStreams().state_dict()
    assert state["cuda"] == [] and not torch.cuda.is_initialized()


def test_rng_streams_restore_the_gpus_a_host_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint written on a host with 4 GPUs resumes on a host with 1: the devices it
    has get their streams, the missing ones are not an error."""
    restored: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda _s, i: restored.append(i))
    streams = RngStreams()
    state = streams.state_dict()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 4
    streams.load_state_dict(state)
    assert restored == [0]


def test_a_device_this_host_lacks_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.device import DeviceUnavailable, check_device

    assert check_device("cpu") == torch.device("cpu")
    for device, why in (("gpu", "not a torch device"), ("meta", "runs on 'cpu' or 'cuda'")):
        with pytest.raises(DeviceUnavailable, match=why):
            check_device(device)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(DeviceUnavailable, match="sees no CUDA device on this host"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(DeviceUnavailable, match="this host has 1 CUDA device"):
        check_device("cuda:3")


def test_on_policy_staleness_keeps_only_the_restored_version() -> None:
    buf = RolloutBuffer()
    for v in (3, 4, 5):
        buf.push(_batch(v))
    assert buf.discard_stale(policy_version=4, max_staleness=0) == 2
    assert [b.policy_version for b in buf.batches] == [4]
    buf = RolloutBuffer()
    for v in (2, 3, 4, 5):
        buf.push(_batch(v))
    buf.discard_stale(policy_version=4, max_staleness=1)
    assert [b.policy_version for b in buf.batches] == [3, 4]


def test_deviation_bitwise_and_statistical() -> None:
    rec = metric_vector({"loss": 1.0, "lr": 0.01, "extra": {"x": 2.0}})
    assert deviation(rec, dict(rec), None) == 0.0
    assert deviation(rec, {**rec, "loss": 1.0 + 1e-12}, None) > 0.0
    assert deviation(rec, {**rec, "loss": 1.5}, {"loss": 0.25, "lr": 0.0, "extra.x": 1.0}) == 2.0
    assert math.isinf(deviation(rec, {**rec, "lr": 0.02}, {"loss": 1.0, "lr": 0.0}))
    assert math.isinf(deviation(rec, {"loss": 1.0}, None))  # a metric went missing
    assert deviation({"k": math.nan}, {"k": math.nan}, None) == 0.0


def test_rollout_backends() -> None:
    """``torch`` is the torch sampler; ``auto`` is vLLM exactly where vLLM imports; both
    implement the one protocol."""
    import pytest

    from trainer.config import ModelConfig
    from trainer.engines import make_engine, resolve_backend, vllm_available
    from trainer.policy import build_policy
    from trainer.rollout import RolloutEngine
    from trainer.rollout_torch import TorchSampler

    tiny = {"hidden": 32, "heads": 1, "layers": 1, "intermediate": 32}
    cfg = TrainerConfig(rollout_backend="torch", model=ModelConfig(**tiny))
    policy = build_policy(14, cfg.model, seed=0)
    engine = make_engine(cfg, policy, 14, 0)
    assert isinstance(engine, TorchSampler) and isinstance(engine, RolloutEngine)
    auto = cfg.with_overrides(rollout_backend="auto")
    assert resolve_backend(auto) == ("vllm" if vllm_available() else "torch")
    if not vllm_available():
        from trainer.rollout import RolloutUnavailable

        with pytest.raises(RolloutUnavailable, match="needs vLLM"):
            make_engine(cfg.with_overrides(rollout_backend="vllm"), policy, 14, 0)


def test_unservable_head_sizes_name_the_nearest_valid_setting() -> None:
    from trainer.config import ModelConfig
    from trainer.rollout_vllm import CPU_HEAD_SIZES, unservable

    assert unservable(ModelConfig(hidden=64, heads=2), "cpu") is None
    why = unservable(ModelConfig(hidden=64, heads=4), "cpu")
    assert why is not None and "head size 16" in why
    assert "model.heads: 2 (head size 32)" in why and "model.hidden: 128" in why
    why = unservable(ModelConfig(hidden=40, heads=1), "cpu")  # 40: no divisor is served
    assert why is not None and "Nearest valid setting: model.hidden: 32 (head size 32" in why
    assert unservable(ModelConfig(hidden=64, heads=4), "cuda") is None  # vLLM decides there
    assert all(unservable(ModelConfig(hidden=h, heads=1), "cpu") is None for h in CPU_HEAD_SIZES)


def test_rollout_interface_imports_no_engine() -> None:
    """No import circle: the interface module imports neither engine (they import it);
    the choice between them lives in trainer/engines.py."""
    import ast
    from pathlib import Path

    import trainer.rollout

    tree = ast.parse(Path(trainer.rollout.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [node])  # type: ignore[list-item]
    }
    assert not {m for m in imported if m and m.startswith("trainer.")}, imported
