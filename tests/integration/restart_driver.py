"""A customer's training loop with the runwatch hook, for the restart tests.

``python restart_driver.py LOG SPOOL RUN TENANT START KL CRASH_AT LAST``: a step every
50 ms from ``START`` (a restart from that step's checkpoint when > 0) to ``LAST``, logging
``kl=KL``; at ``CRASH_AT`` (> 0) it raises, as a CUDA error would (the hook's exit hook
publishes ``RunFailed``). It obeys the run's commands at each step's end and prints
``cancelled at N`` when cancelled.
"""

from __future__ import annotations

import sys
import time

from producers.hooks import RunwatchHook


def main(argv: list[str]) -> int:
    log, spool, run, tenant, start_s, kl_s, crash_s, last_s = argv
    start, kl, crash_at, last = int(start_s), float(kl_s), int(crash_s), int(last_s)
    hook = RunwatchHook(run, tenant, log=log, spool=spool, gpus=1, command_poll_s=0.05)
    if start:
        hook.start({}, resumed_from=f"out/checkpoint-{start}", resumed_step=start)
    else:
        hook.start({})
    step = start
    while step < last:
        if hook.obey(step):
            print("cancelled at", step, flush=True)
            break
        step += 1
        time.sleep(0.05)
        hook.log({"loss": 1.0, "reward": 0.5 + 0.001 * step, "kl": kl, "entropy": 1.0}, step=step)
        hook.step_done(step)
        if step == crash_at:
            hook.flush(10)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    hook.finish()
    hook.close(10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
