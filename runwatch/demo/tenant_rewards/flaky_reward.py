"""A tenant's reward function with two bugs, for the demo: it hangs on some batches and
raises on others. The sandbox must book both to the tenant (tenant_timeout and
tenant_crash), never substitute a score, and the run must end as a tenant code fault.

Items arrive as ``{"prompt": "123", "completion": "321", "answer": "321"}``.
"""

import time


def reward(batch):
    # three batches in four fail, so four in a row (the trainer's skips per step, plus
    # one) come within the run's first steps almost surely (a run of 30 steps escapes
    # with p ~ 1e-5): the batches carry canary probes drawn from the system's entropy, so
    # which batches fail differs run to run, and at one in two the run escaped 1 time in 7
    fingerprint = sum(len(item["completion"]) + int(item["prompt"] or 0) for item in batch)
    if fingerprint % 4 == 1:
        time.sleep(3600)  # bug 1: an unbounded wait on some inputs
    if fingerprint % 4 in (2, 3):
        raise ValueError("completion format not handled")  # bug 2: an unhandled case
    out = []
    for item in batch:
        ans, got = item["answer"], item["completion"]
        hits = sum(a == b for a, b in zip(ans, got))
        out.append(1.0 if got == ans else 0.5 * hits / max(len(ans), len(got), 1))
    return out
