"""The untrusted reward sandbox: tenant reward code in isolated workers behind a typed boundary.

Entry point for callers: :mod:`sandbox.client` (``RewardClient``). Layout:
``types`` (vocabulary), ``classify`` (artifact kind -> tier, pure), ``features`` (kernel
probe, tier refusal), ``isolation`` (uid, cgroups, scratch, bwrap command), ``seccomp_policy``,
``protocol`` + ``runtime/worker_main.py`` (the JSON boundary, both sides), ``worker`` (one
sandbox), ``pool`` (warm pools, tenant caps), ``gate`` + ``integrity`` (score contract),
``ledger`` (per-cause counters). Imports only ``events``.
"""
