"""The verifiable toy task, its train/held-out split, and the prompt sampler.

Tokens: ``PAD=0, BOS=1, SEP=2, EOS=3`` then the digits ``0..base-1`` as ``4..``. A
prompt is ``BOS d1 .. dn SEP``; a completion is answer digits then ``EOS``. The split is
a fixed hash of the item text (not of the seed), so every run of the same task config
sees the same held-out set; :func:`dataset_revision` pins it.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.config import TaskConfig

PAD, BOS, SEP, EOS = 0, 1, 2, 3
DIGIT0 = 4
#: Bump when the split rule or item encoding changes (it is part of the dataset pin).
SPLIT_RULE = "sha256(item)%100<heldout_percent/v1"


def vocab_size(task: TaskConfig) -> int:
    return DIGIT0 + task.base


def answer_of(task: TaskConfig, digits: tuple[int, ...]) -> tuple[int, ...]:
    """The exact answer (digit values) for an item."""
    if task.kind == "reverse":
        return tuple(reversed(digits))
    if task.kind == "copy":
        return digits
    half = len(digits) // 2
    a = _value(digits[:half], task.base)
    b = _value(digits[half:], task.base)
    return _digits_of(a + b, task.base)


def _value(ds: tuple[int, ...], base: int) -> int:
    v = 0
    for d in ds:
        v = v * base + d
    return v


def _digits_of(v: int, base: int) -> tuple[int, ...]:
    out = [v % base]
    v //= base
    while v:
        out.append(v % base)
        v //= base
    return tuple(reversed(out))


def max_answer_len(task: TaskConfig) -> int:
    return task.digits + 1 if task.kind == "add" else task.digits


@dataclass(frozen=True)
class Dataset:
    """Every item of the task, split into train and held-out (digit tuples)."""

    task: TaskConfig
    train: tuple[tuple[int, ...], ...]
    heldout: tuple[tuple[int, ...], ...]

    @classmethod
    def build(cls, task: TaskConfig) -> Dataset:
        if task.kind == "add" and task.digits % 2:
            raise ValueError("task 'add' needs an even number of digits (two operands)")
        train, held = [], []
        for item in itertools.product(range(task.base), repeat=task.digits):
            h = int.from_bytes(hashlib.sha256(bytes(item)).digest()[:4], "big") % 100
            (held if h < task.heldout_percent else train).append(item)
        return cls(task, tuple(train), tuple(held))

    def prompt_tokens(self, item: tuple[int, ...]) -> list[int]:
        return [BOS, *(DIGIT0 + d for d in item), SEP]

    def answer_tokens(self, item: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(DIGIT0 + d for d in answer_of(self.task, item))


def dataset_revision(ds: Dataset) -> str:
    """The dataset pin: a digest of the task config, the split rule and both splits."""
    h = hashlib.sha256()
    h.update(ds.task.model_dump_json().encode())
    h.update(SPLIT_RULE.encode())
    for split in (ds.train, ds.heldout):
        h.update(b"|")
        for item in split:
            h.update(bytes(item) + b",")
    return "ds-" + h.hexdigest()[:16]


class PromptSampler:
    """Shuffled epochs over the train split. Stateful: its position is checkpointed.

    Randomness: a numpy ``PCG64`` generator seeded from the run seed; each epoch draws
    a new permutation. ``state_dict`` holds the generator state, the current
    permutation and the cursor, so a restored sampler yields the same next prompts.
    """

    def __init__(self, n_items: int, seed: int) -> None:
        self.n = n_items
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.epoch = 0
        self.cursor = 0
        self.perm = self.rng.permutation(self.n)

    def next_indices(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.cursor >= self.n:
                self.epoch += 1
                self.cursor = 0
                self.perm = self.rng.permutation(self.n)
            out.append(int(self.perm[self.cursor]))
            self.cursor += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "perm": [int(x) for x in self.perm],
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.perm = np.asarray(state["perm"], dtype=np.int64)
        self.rng.bit_generator.state = state["rng"]
