"""The demo's runs: what each one is, for which tenant, and what the plane must show.

Every run is a real GRPO training run (``runwatch train``) configured from the trainer's
packaged configs; faults are config switches. ``expect_state`` / ``expect_alerts`` are
what the customer-facing state and alert catalog must say at the end; the demo table
prints them beside what actually happened, and the CI test asserts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"
TENANT_REWARDS = Path(__file__).resolve().parent / "tenant_rewards"

Kind = Literal["train", "kill_resume", "kill_drop_optimizer_resume"]


@dataclass(frozen=True)
class Scenario:
    run_id: str
    tenant_id: str
    title: str
    base_config: str
    overrides: dict[str, Any] = field(default_factory=dict)
    kind: Kind = "train"
    #: for kill scenarios: SIGKILL the trainer once this step was recorded
    kill_after_step: int | None = None
    expect_states: tuple[str, ...] = ()
    expect_alerts: tuple[str, ...] = ()
    expect_failure_class: str | None = None
    #: what the tenant does each time the plane pauses the run (the i-th pause gets the
    #: i-th action, the last one repeats): ``cancel`` it, or ``resume`` it with ``fix``
    #: (settings changed on resume); empty: leave it paused
    on_pause: tuple[Literal["cancel", "resume"], ...] = ()
    fix: dict[str, Any] = field(default_factory=dict)
    #: the run must have been paused (by the run controller, on a paging alert)
    expect_paused: bool = False


def scenarios(short: bool = False) -> list[Scenario]:
    """The demo's runs. ``short`` shrinks step counts for CI (same faults, same story);
    the constant-reward and gameable runs keep theirs (they are cancelled at their page
    anyway: the dead-run page comes at step 5, the hacking page at step 20).

    Healthy runs stop at 60 steps: the transformer policy's held-out exact match is ~0.8 by
    then (from ~0.3) and still rising; a longer healthy run shows nothing new and costs the
    demo its time budget (~0.15 s a step with vLLM rollouts on this box).
    """
    s = 0.6 if short else 1.0

    def steps(n: int) -> int:
        return max(30, int(n * s))

    return [
        Scenario(
            "acme-healthy", "acme", "healthy run", "default.yaml",
            {"steps": steps(60)},
            expect_states=("SUCCEEDED",),
        ),
        Scenario(
            "acme-constant-reward", "acme", "reward is constant: nothing to learn",
            "canary-constant-reward.yaml", {"steps": 120},
            expect_states=("CANCELLED",), expect_alerts=("dead_run",),
            on_pause=("cancel",), expect_paused=True,
        ),
        Scenario(
            "globex-oversized-lr", "globex", "learning rate 30x too large",
            "canary-oversized-lr.yaml",
            {"steps": steps(60), "checkpoint": {"every": 10, "keep": 3, "at_start": True}},
            expect_states=("SUCCEEDED",), expect_alerts=("kl_blowup",),
            # the tenant's fix: the intended LR, from the checkpoint before the blowup
            on_pause=("resume",), fix={"lr": 0.001, "rollback_to_step": 0}, expect_paused=True,
        ),
        Scenario(
            "globex-gameable-reward", "globex", "reward can be gamed (eval gate disagrees)",
            "canary-gameable-reward.yaml", {"steps": 60},
            # the hacking gate pauses it at the third eval (step 20: held-out exact match
            # fell 0.66 -> 0.19 while the reward rose), in the step the KL gate pages too
            # (the eval's fact comes first); the tenant gives up
            expect_states=("CANCELLED",), expect_alerts=("reward_hacking",),
            on_pause=("cancel",), expect_paused=True,
        ),
        Scenario(
            "acme-flaky-reward", "acme", "tenant reward function hangs and crashes",
            "test.yaml",
            {
                "steps": 30,
                "reward": {
                    "kind": "sandbox",
                    "sandbox_path": str(TENANT_REWARDS / "flaky_reward.py"),
                    "sandbox_deadline_s": 1.0,
                },
            },
            expect_states=("FAILED",), expect_failure_class="tenant_code_fault",
        ),
        Scenario(
            "globex-preempted", "globex", "killed mid-run (preempted) and resumed",
            "default.yaml", {"steps": steps(60), "resume": {"tier": "bitwise"}},
            kind="kill_resume", kill_after_step=steps(60) - 10,
            expect_states=("SUCCEEDED",),
        ),
        Scenario(
            "acme-resume-bad-optimizer", "acme",
            "killed, then resumed from a checkpoint whose optimizer state was dropped",
            "default.yaml", {"steps": steps(60), "resume": {"tier": "bitwise"}},
            kind="kill_drop_optimizer_resume", kill_after_step=steps(60) - 10,
            expect_states=("SUCCEEDED",),
        ),
    ]  # fmt: skip
