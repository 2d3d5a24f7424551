"""Closed sets said once (issue 16 item 4): derived from their one definition."""

from __future__ import annotations

import threading
from typing import get_args

from events.catalog.derived import RunState
from events.envelope import Stamper
from projections.exporter import STATES, make_registry
from projections.store import InMemoryReadModel
from sandbox.types import ALL_LAYERS, Layer


def test_the_exporter_knows_every_run_state_of_the_enum() -> None:
    assert get_args(RunState) == STATES
    registry = make_registry(InMemoryReadModel())
    for state in get_args(RunState):  # a state added to the enum is exported, at 0
        assert registry.get_sample_value("runwatch_runs", {"state": state}) == 0


def test_every_isolation_layer_is_one_literal() -> None:
    assert get_args(Layer) == ALL_LAYERS and len(set(ALL_LAYERS)) == len(ALL_LAYERS)


def test_the_stamper_counts_seq_once_per_envelope_across_threads() -> None:
    stamper = Stamper(tenant_id="t", run_id="r", producer="p", first_seq=1)
    seqs: list[int] = []

    def stamp() -> None:
        for _ in range(500):
            seqs.append(stamper.stamp(step=3, ts=1.5)["seq"])

    threads = [threading.Thread(target=stamp) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seqs) == list(range(1, 2001)) and stamper.seq == 2001
    env = stamper.stamp(run_id="other")
    assert (env["run_id"], env["tenant_id"], env["producer"]) == ("other", "t", "p")
