"""A customer's multi-process training job: a plain ``transformers.Trainer`` under
``torchrun`` (two CPU processes, gloo), with :class:`producers.hooks.RunwatchCallback`.

argv: MODEL_DIR LOG_DIR OUT_DIR RUN_ID MAX_STEPS DDP_TIMEOUT_S [rank0-only]. With
``rank0-only`` the hook's callback is on process zero alone (a misconfigured job: it must
still train, its commands unfollowed). The process group is made
here with that timeout (on the CPU transformers leaves ``ddp_timeout`` out of it; on GPUs it
passes it to NCCL as this does), and ``ddp_timeout`` says the same. Every rank appends
``<step>`` to ``OUT_DIR/steps-rank<R>.txt`` at each step's end (before the hook's own
callback, which may block it), so a test sees what each rank did; each then sleeps
``STEP_SLEEP_S`` (a step of a real size, without spending the CPUs). The last line a rank
prints is ``done rank=<R> step=<global step>``; then it destroys the process group.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

STEP_SLEEP_S = 0.02


def main() -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from producers.hooks import RunwatchCallback

    model_dir, log_dir, out, run_id = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    max_steps, timeout = int(sys.argv[5]), int(sys.argv[6])
    rank0_only = sys.argv[7:] == ["rank0-only"]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    steps_file = out / f"steps-rank{rank}.txt"

    class Marker(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            with steps_file.open("a") as f:
                f.write(f"{state.global_step}\n")
            time.sleep(STEP_SLEEP_S)

    ids = [[2, 3, 4, 5, 6, 1]] * 64
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        ddp_timeout=timeout,
        seed=0,
    )
    hooked = RunwatchCallback(
        run_id=run_id,
        tenant_id="acme",
        log=log_dir,
        spool=out / f"spool-{rank}",
        gpus=2,
        install_exit_hooks=False,
        command_poll_s=0.05,
        join_wait_s=3.0,
    )
    trainer = Trainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}),
        callbacks=[Marker()] if rank0_only and rank != 0 else [Marker(), hooked],
    )
    trainer.train()
    print(f"done rank={rank} step={trainer.state.global_step}", flush=True)
    # as a torchrun script should (torch warns otherwise): a gloo group left to the
    # interpreter's exit sometimes aborts there ("terminate called without an active
    # exception", SIGABRT after both ranks said done: the job then exits non-zero)
    dist.destroy_process_group()
    # and then leave without tearing the objects down: DDP's reducer still holds the gloo
    # group, and freeing it with main()'s frame deadlocks now and then (a torch bug, not
    # the hook's: the group's destructor waits, holding the GIL, for its worker thread,
    # which is freeing a finished collective's tensor and waits for the GIL). Found in a
    # full run, on rank 1 of the rank0-only job, which has no hook at all: both ranks
    # said done and the job never exited.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
