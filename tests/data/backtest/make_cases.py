"""Writes the backtest cases beside this file (run it to regenerate them; seeded).

Each case is a run history in a format ``runwatch import metrics`` reads, keys as the
framework logs them, with the step at which a person noticed the incident
(``CASES[name]``, what the test passes as ``--incident-step``) and whether the current
catalog must page before it:

- ``trl_saturated_reward.jsonl`` (TRL ``log_history`` rows): learns, then from step 150
  every completion scores 1.0 (a saturated reward: ``frac_reward_zero_std`` 1, spread 0);
  noticed at step 400 when someone looked at the flat curve. Must page (``dead_run``).
- ``verl_hacked_eval.jsonl`` (verl file logger lines, ``val-core`` eval every 10 steps):
  from step 200 the training score keeps rising while the held-out score falls; noticed
  at step 320 in an offline eval. Must page (``reward_hacking``).
- ``csv_kl_runaway.csv`` (CSV, verl keys): the LR schedule restarts at step 90 and the KL
  to the reference runs away; noticed at step 160. Must page (``kl_blowup``).
- ``trl_hacked_no_eval.jsonl`` (TRL rows, no eval logged): the same hacking as above, but
  the run never logged an eval: the catalog cannot see it (an advisory
  ``eval_gate_missing`` says why). Must NOT page: the backtest exits 1.

    python tests/data/backtest/make_cases.py
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
#: case file -> (incident step, must a page come first)
CASES: dict[str, tuple[int, bool]] = {
    "trl_saturated_reward.jsonl": (400, True),
    "verl_hacked_eval.jsonl": (320, True),
    "csv_kl_runaway.csv": (160, True),
    "trl_hacked_no_eval.jsonl": (320, False),
}


def _base(rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    t = np.arange(steps, dtype=float)
    noise = np.zeros(steps)
    for i in range(1, steps):
        noise[i] = 0.3 * noise[i - 1] + rng.normal(0, 0.015)
    reward = 0.2 + 0.4 / (1 + np.exp(-(t - 120) / 50)) + noise
    return {
        "t": t,
        "reward": reward,
        "reward_std": 0.3 + rng.normal(0, 0.01, steps),
        "zero_std": np.clip(0.3 + rng.normal(0, 0.05, steps), 0, 0.9),
        "kl": 0.08 * (1 - np.exp(-t / 80)) * np.exp(rng.normal(0, 0.08, steps)),
        "entropy": 0.9 * (1 - 0.2 * t / steps) + rng.normal(0, 0.01, steps),
        "length": 300 * (1 + 0.5 * t / steps) * np.exp(rng.normal(0, 0.03, steps)),
        "eval": 0.3 + 0.3 / (1 + np.exp(-(t - 120) / 50)) + rng.normal(0, 0.01, steps),
    }


def _trl_rows(s: dict[str, np.ndarray], steps: int, evals: bool) -> list[dict]:
    rows = []
    for i in range(1, steps):
        row = {
            "step": i,
            "reward": round(float(s["reward"][i]), 6),
            "reward_std": round(float(s["reward_std"][i]), 6),
            "frac_reward_zero_std": round(float(s["zero_std"][i]), 4),
            "kl": round(float(s["kl"][i]), 6),
            "entropy": round(float(s["entropy"][i]), 6),
            "completions/mean_length": round(float(s["length"][i]), 2),
            "learning_rate": 1e-6,
            "loss": round(float(s["kl"][i]) * 0.04, 6),
            "grad_norm": round(float(0.5 + 0.05 * np.sin(i)), 4),
        }
        if evals and i % 10 == 0:
            row["eval_reward"] = round(float(s["eval"][i]), 6)
        rows.append(row)
    return rows


def _write_jsonl(name: str, rows: list[dict]) -> None:
    (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def saturated() -> None:
    rng = np.random.default_rng(1)
    s = _base(rng, 450)
    s["reward"][150:] = 1.0
    s["reward_std"][150:] = 0.0
    s["zero_std"][150:] = 1.0
    _write_jsonl("trl_saturated_reward.jsonl", _trl_rows(s, 450, evals=True))


def _hacked(rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    s = _base(rng, steps)
    t = s["t"]
    hack = np.maximum(0, t - 200)
    s["reward"] += 0.004 * hack
    s["eval"] -= 0.004 * hack
    return s


def verl_hacked() -> None:
    rng = np.random.default_rng(2)
    s = _hacked(rng, 350)
    lines = []
    for i in range(1, 350):
        data = {
            "critic/score/mean": round(float(s["reward"][i]), 6),
            "critic/score/std": round(float(s["reward_std"][i]), 6),
            "actor/kl_loss": round(float(s["kl"][i]), 6),
            "actor/entropy": round(float(s["entropy"][i]), 6),
            "actor/grad_norm": round(float(0.5 + 0.05 * np.sin(i)), 4),
            "actor/lr": 1e-6,
            "response_length/mean": round(float(s["length"][i]), 2),
            "response_length/clip_ratio": 0.01,
            "timing_s/step": 60.0,
        }
        if i % 10 == 0:
            data["val-core/gsm8k/reward/mean@1"] = round(float(s["eval"][i]), 6)
        lines.append({"step": i, "data": data})
    _write_jsonl("verl_hacked_eval.jsonl", lines)


def trl_hacked_no_eval() -> None:
    rng = np.random.default_rng(2)
    s = _hacked(rng, 350)
    _write_jsonl("trl_hacked_no_eval.jsonl", _trl_rows(s, 350, evals=False))


def csv_kl() -> None:
    rng = np.random.default_rng(3)
    s = _base(rng, 200)
    t = s["t"]
    runaway = np.maximum(0, t - 90)
    s["kl"] += 0.02 * (np.exp(runaway / 12) - 1)
    keys = ["step", "critic/score/mean", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
            "actor/lr", "timing_s/step"]  # fmt: skip
    with open(HERE / "csv_kl_runaway.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for i in range(1, 200):
            lr = 1e-6 if i < 90 else 3e-5
            reward, kl, entropy = (round(float(s[k][i]), 6) for k in ("reward", "kl", "entropy"))
            w.writerow([i, reward, kl, entropy, 0.5, lr, 60.0])


if __name__ == "__main__":
    saturated()
    verl_hacked()
    trl_hacked_no_eval()
    csv_kl()
