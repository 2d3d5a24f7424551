"""Imported once by the demo's warm launcher (:mod:`runwatch.demo.launcher`): the trainer
stack and, where it imports, vLLM's engine modules; then the heap is frozen out of the
garbage collector's sight. Importing this module has no other effect (vLLM's logging goes
to stderr, as in a cold ``runwatch train``)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import warnings

import runwatch.cli.main  # noqa: F401  (the CLI the children run)
import trainer.loop  # torch, transformers, the trainer
import trainer.resume  # noqa: F401
from trainer.rollout_vllm import quiet_vllm_logging

#: vLLM's modules a trainer imports when it starts its engine.
VLLM_MODULES = (
    "vllm.engine.arg_utils",
    "vllm.model_executor.models.llama",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.worker.cpu_worker",
)

quiet_vllm_logging()
# multiprocessing re-runs the demo's main module (``-m runwatch.cli.main``) in every forked
# child as ``__mp_main__``; it is imported here already, which runpy warns about. Harmless:
# the module only defines the CLI (its ``__main__`` guard does not run as ``__mp_main__``).
warnings.filterwarnings(
    "ignore", message="'runwatch.cli.main' found in sys.modules", category=RuntimeWarning
)
with contextlib.suppress(Exception):  # a host without vLLM runs the torch sampler
    for name in VLLM_MODULES:
        importlib.import_module(name)

gc.freeze()
