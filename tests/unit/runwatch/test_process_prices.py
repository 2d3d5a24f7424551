"""``runwatch process --prices``: the bills are priced with the list the views are.

Found by review: ``process`` had no ``--prices`` (``serve api``, ``replay``, ``audit
verify`` and ``backtest`` do), so with a custom list the published bills were priced at
the packaged one while the API's views used the custom one (0.336 against 3.0 USD).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from events import TenantUsageUpdated, TrainerStepCompleted, UsageRecorded
from events.log.embedded import EmbeddedLog
from runwatch.cli.main import main
from runwatch.hosting.replay import rebuild_from_log
from stream_processors.accounting import Prices

CUSTOM = """version: "custom-1"
usd_per_gpu_second: {trainer: 0.01, rollout_fleet: 0.01}
usd_per_cpu_second: {trainer: 0.0, rollout_fleet: 0.0}
"""


def _log(path: Path) -> Path:
    log = EmbeddedLog(path)
    log.open_sync()
    events = []
    for step in range(1, 4):
        env = {"tenant_id": "acme", "run_id": "r", "step": step, "producer": "trainer/r"}
        events += [
            TrainerStepCompleted(event_id=uuid.uuid4(), ts=float(2 * step), seq=2 * step,
                                 algorithm="grpo", **env),
            UsageRecorded(event_id=uuid.uuid4(), ts=float(2 * step + 1), seq=2 * step + 1,
                          pool="trainer", phase="optim", device_kind="gpu",
                          device_seconds=100.0, **env),
        ]  # fmt: skip
    log.append_events_sync(events)
    return path


def test_process_prices_the_bills_as_the_views(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(CUSTOM)
    log = _log(tmp_path / "log")
    assert main(["process", "--log", str(log), "--once", "--prices", str(prices)]) == 0
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    bills = [e for e in reader.iter_events(["runwatch.tenant-usage"])]
    assert bills and all(isinstance(b, TenantUsageUpdated) for b in bills)
    last = bills[-1]
    assert last.spend_usd == pytest.approx(200.0 * 0.01)  # usage of steps 1-2 at step 3
    view = rebuild_from_log(log, prices=Prices.load(prices)).host.view.views["r"]  # type: ignore[union-attr]
    assert view.usage["spend_usd"] == pytest.approx(300.0 * 0.01)  # to the last second


def test_a_bad_price_list_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "prices.yaml"
    bad.write_text("version: x\n")
    assert (
        main(["process", "--log", str(_log(tmp_path / "log")), "--once", "--prices", str(bad)]) == 1
    )
    assert "usd_per_gpu_second" in capsys.readouterr().err
