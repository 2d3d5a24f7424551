"""Drive verl's real ``Tracking`` the way ``RayPPOTrainer.fit`` does, without GPUs.

Run as a process with ``VERL_USE_EXTERNAL_MODULES=producers.hooks.verl_plugin`` (verl's
own plugin path imports it on ``import verl``). The metric dicts are made by verl's own
metric code over synthetic GRPO batches (``compute_data_metrics``,
``compute_timing_metrics``, ``compute_throughout_metrics``, ``process_validation_metrics``
named into ``val-core/*`` as ``RayPPOTrainer._val_metrics_update`` does) plus the actor
worker's keys (``actor/pg_loss``, ``actor/entropy``, ``actor/ppo_kl``, ``actor/kl_loss``,
...). ``Tracking`` gets ``['file', 'runwatch']``: verl's file logger writes the very
same dicts for ``runwatch import metrics`` to read back. Checkpoints are written in
verl's layout (``global_step_<N>/`` then ``latest_checkpointed_iteration.txt``).

argv: OUT_DIR STEPS. Prints one JSON line (verl's version, the backends, steps logged).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch


def batch(step: int, n: int = 8, prompt_len: int = 6, resp_len: int = 10):
    from verl import DataProto

    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(2, resp_len + 1, (n,), generator=g)
    attention = torch.zeros(n, prompt_len + resp_len, dtype=torch.long)
    attention[:, :prompt_len] = 1
    for i, length in enumerate(lengths):
        attention[i, prompt_len : prompt_len + int(length)] = 1
    response_mask = attention[:, prompt_len:].clone()
    scores = torch.zeros(n, resp_len)
    scores[torch.arange(n), lengths - 1] = torch.rand(n, generator=g) * (0.2 + 0.05 * step)
    adv = torch.randn(n, resp_len, generator=g) * response_mask
    data = DataProto.from_single_dict(
        {
            "prompts": torch.ones(n, prompt_len, dtype=torch.long),
            "responses": torch.ones(n, resp_len, dtype=torch.long),
            "attention_mask": attention,
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": scores.clone(),
            "advantages": adv,
            "returns": adv.clone(),
        },
        meta_info={"global_token_num": attention.sum(-1).tolist()},
    )
    return data


def val_metrics(step: int) -> dict[str, float]:
    """``val-core/*`` / ``val-aux/*`` keys, named as RayPPOTrainer._val_metrics_update does."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    rng = np.random.default_rng(step)
    n = 12
    sources = ["gsm8k"] * n
    uids = [f"q{i // 3}" for i in range(n)]
    infos = {"reward": list(rng.random(n) * (0.3 + 0.02 * step))}
    out: dict[str, float] = {}
    for source, var2metric in process_validation_metrics(sources, uids, infos).items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var, metric2val in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for name, value in metric2val.items():
                core = (
                    var == core_var
                    and any(name.startswith(p) for p in ("mean", "maj", "best"))
                    and f"@{n_max}" in name
                )
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = value
    return out


def main() -> None:
    out_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
    import verl
    from verl.trainer.ppo.metric_utils import (
        compute_data_metrics,
        compute_throughout_metrics,
        compute_timing_metrics,
    )
    from verl.utils.tracking import Tracking

    ckpt = out_dir / "checkpoints"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out_dir / "verl-file-logger.jsonl")
    config = {
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
            "actor": {"optim": {"lr": 1e-6}, "use_kl_loss": True, "kl_loss_coef": 0.001},
            "rollout": {"name": "vllm", "n": 4},
        },
        "data": {"train_batch_size": 8, "max_response_length": 10},
        "trainer": {
            "project_name": "runwatch-verl",
            "experiment_name": "gsm8k-grpo",
            "logger": ["file", "runwatch"],
            "nnodes": 1,
            "n_gpus_per_node": 2,
            "default_local_dir": str(ckpt),
            "save_freq": 2,
            "runwatch": {
                "run_id": "verl-run",
                "tenant_id": "acme",
                "log": str(out_dir / "log"),
                "spool": str(out_dir / "spool"),
                "install_exit_hooks": False,
            },
        },
    }
    tracking = Tracking(
        project_name=config["trainer"]["project_name"],
        experiment_name=config["trainer"]["experiment_name"],
        default_backend=config["trainer"]["logger"],
        config=config,
    )
    tracking.log(data=val_metrics(0), step=0)  # val_before_train
    for step in range(1, steps + 1):
        data = batch(step)
        timing = {
            "gen": 0.8,
            "reward": 0.1,
            "old_log_prob": 0.2,
            "ref": 0.2,
            "adv": 0.01,
            "update_actor": 0.6,
            "update_weights": 0.05,
            "step": 2.0 + 0.01 * step,
        }
        metrics = {
            "actor/pg_loss": float(-0.01 * step),
            "actor/pg_clipfrac": 0.002,
            "actor/ppo_kl": 1e-4,
            "actor/entropy": float(1.2 - 0.01 * step),
            "actor/kl_loss": float(0.001 * step),
            "actor/grad_norm": 0.5,
            "actor/lr": 1e-6,
            "training/global_step": step,
            "training/epoch": 0,
        }
        metrics.update(compute_data_metrics(data, use_critic=False))
        metrics.update(compute_timing_metrics(data, timing))
        metrics.update(compute_throughout_metrics(data, timing, n_gpus=2))
        if step % 2 == 0:
            metrics.update(val_metrics(step))
            folder = ckpt / f"global_step_{step}" / "actor"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model_world_size_2_rank_0.pt").write_bytes(os.urandom(4096))
            (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))
        tracking.log(data=metrics, step=step)
    tracking.finish()
    print(json.dumps({"verl": verl.__version__, "backends": list(tracking.logger), "steps": steps}))


if __name__ == "__main__":
    main()
