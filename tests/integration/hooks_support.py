"""Shared by the hook tests: a tiny causal LM built from a config (no hub download), a
word-level tokenizer, TRL's real ``GRPOTrainer`` on CPU, and reading a run's events back
from an embedded log or Kafka."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from events.codec import decode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WORDS = list("abcdefghijklmnop")
PROMPTS = ["a b c", "d e f", "g h i", "j k l", "m n o", "p a b", "c d e", "f g h"]


def tiny_model_dir(root: Path) -> Path:
    """Save a 1-layer Llama (hidden 16) and its tokenizer under ``root``; the path."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    import torch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def count_a(completions: Sequence[str], **_: Any) -> list[float]:
    """The reward: how many ``a`` tokens a completion has."""
    return [float(c.split().count("a")) for c in completions]


def grpo_trainer(model_dir: Path, out: Path, *, steps: int, callbacks: list[Any], save_steps: int):
    """TRL's GRPOTrainer on CPU: 4 prompts x 2 generations of up to 6 tokens per step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        logging_steps=1,
        save_steps=save_steps,
        report_to=[],
        use_cpu=True,
        beta=0.1,
        learning_rate=1e-3,
        disable_tqdm=True,
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS * 8})
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=count_a,
        args=args,
        train_dataset=dataset,
        processing_class=None,
        callbacks=callbacks,
    )


def embedded_events(log_dir: Path, run_id: str) -> list[EventBase]:
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    return [e for e in log.iter_events() if isinstance(e, EventBase) and e.run_id == run_id]


def kafka_events(bootstrap: str, run_id: str) -> list[EventBase]:
    """Every record of ``run_id`` on every registry topic (duplicates included)."""
    from events.log.kafka import KafkaLog
    from events.topics import TOPICS

    async def read() -> list[EventBase]:
        out: list[EventBase] = []
        async with KafkaLog(bootstrap, create_registry_topics=False) as log:
            for topic in TOPICS:
                try:
                    parts = await log.partitions(topic)
                except Exception:
                    continue
                for p in parts:
                    async for rec in log.read(topic, p):
                        if rec.key != run_id.encode():
                            continue
                        ev = decode(rec.value)
                        assert isinstance(ev, EventBase), ev
                        out.append(ev)
        return out

    return asyncio.run(read())
