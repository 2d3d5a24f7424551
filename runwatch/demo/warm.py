"""Imported once by the demo's warm launcher (:mod:`runwatch.demo.launcher`): the trainer
stack and, where it imports, vLLM's engine modules; then the heap is frozen out of the
garbage collector's sight. Importing this module has no other effect."""

from __future__ import annotations

import contextlib
import gc

import runwatch.cli.main  # noqa: F401  (the CLI the children run)
import trainer.loop
import trainer.resume  # noqa: F401

with contextlib.suppress(Exception):  # a host without vLLM runs the torch sampler
    import vllm.engine.arg_utils
    import vllm.model_executor.models.llama
    import vllm.v1.engine.llm_engine
    import vllm.v1.worker.cpu_model_runner
    import vllm.v1.worker.cpu_worker  # noqa: F401

gc.freeze()
