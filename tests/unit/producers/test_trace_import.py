"""The seed-003 trace importer: layout, field mapping, malformed lines, real embedded log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events import RolloutTraceRecorded
from events.log.embedded import EmbeddedLog
from producers.sinks import EmbeddedSink, MemorySink
from producers.trace_import import ImportReport, import_traces, iter_trace_events
from tests.trace_dirs import T0, iso, line, write_dir

#: The four lines of the seed's over-sampling example, verbatim.
SEED_LINES = [
    '{"timestamp": "2025-08-11T23:19:45.001830", "event": "aborted_request_with_cancelled_error_padding", "duration_sec": 0.002585887908935547, "extra": {"request_id": "661a96a0-35e6-4662-9fff-bf9194bd3d49"}, "workid": 2, "step": 4}',  # noqa: E501
    '{"timestamp": "2025-08-11T23:19:45.001989", "event": "aborted_request_with_cancelled_error", "duration_sec": 84.5104877948761, "extra": {"request_id": "45bb6a77-b6b2-4ed5-afde-97ccf622cdb0"}, "workid": 2, "step": 4}',  # noqa: E501
    '{"timestamp": "2025-08-11T23:19:45.004511", "event": "aborted_request_with_cancelled_error_padding", "duration_sec": 0.0025205612182617188, "extra": {"request_id": "45bb6a77-b6b2-4ed5-afde-97ccf622cdb0"}, "workid": 2, "step": 4}',  # noqa: E501
    '{"timestamp": "2025-08-11T23:19:45.005685", "event": "async_rollout_with_monitoring_duration", "duration_sec": 84.51417350769043, "extra": {"total_requests": 1024, "target_completion": 921, "completed_count": 921}, "workid": 2, "step": 4}',  # noqa: E501
]


def imported(root: Path) -> tuple[list[RolloutTraceRecorded], ImportReport]:
    sink = MemorySink()
    report = import_traces(root, run_id="run-1", tenant_id="acme", write=sink.write)
    return sink.events, report  # type: ignore[return-value]


def test_the_seeds_own_lines_import_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "step_4" / "worker_2.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(SEED_LINES) + "\n")
    events, report = imported(tmp_path)
    assert report.issues == [] and report.imported == 4 and report.files == 1
    pad, abort, _, whole = events
    assert abort.step == 4 and abort.worker == "2"
    assert abort.event_name == "aborted_request_with_cancelled_error" and abort.aborted
    assert abort.request_id == "45bb6a77-b6b2-4ed5-afde-97ccf622cdb0"
    assert abort.duration_s == pytest.approx(84.5104877948761)
    assert abort.ts == pytest.approx(1754954385.001989)  # naive timestamps read as UTC
    assert abort.started_at == pytest.approx(abort.ts - abort.duration_s)
    assert pad.aborted and pad.request_id == "661a96a0-35e6-4662-9fff-bf9194bd3d49"
    assert whole.request_id is None and not whole.aborted
    assert dict(whole.extra) == {
        "total_requests": 1024,
        "target_completion": 921,
        "completed_count": 921,
    }
    assert [e.seq for e in events] == [0, 1, 2, 3]
    assert all(e.producer == "trace-import" and e.run_id == "run-1" for e in events)


def test_known_keys_are_typed_and_every_other_key_is_kept(tmp_path: Path) -> None:
    write_dir(
        tmp_path,
        [
            line(
                1,
                0,
                "engine_async_generate",
                0.0,
                1.5,
                {
                    "request_id": 17,
                    "turn": 2,
                    "output_tokens": 321,
                    "finish_reason": "length",
                    "logprobs": [0.1, 0.2],
                },
                prompt_tokens=40,
                sampling={"temperature": 1.0},
                node="gpu-3",
            ),
        ],
    )
    (ev,), report = imported(tmp_path)
    assert report.issues == []
    assert (ev.request_id, ev.turn, ev.completion_tokens, ev.prompt_tokens) == ("17", 2, 321, 40)
    assert ev.finish_reason == "length"
    assert dict(ev.extra) == {
        "logprobs": "[0.1, 0.2]",
        "sampling": '{"temperature": 1.0}',
        "node": "gpu-3",
    }


def test_step_and_worker_come_from_the_path_when_the_line_lacks_them(tmp_path: Path) -> None:
    path = tmp_path / "step_7" / "worker_3.jsonl"
    path.parent.mkdir()
    lines = [
        {"timestamp": iso(T0), "event": "preprocessing_duration", "duration_sec": 1.0},
        {"timestamp": iso(T0), "event": "x", "duration_sec": 1.0, "workid": 5, "step": 7},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    events, report = imported(tmp_path)
    assert [(e.step, e.worker) for e in events] == [(7, "3"), (7, "5")]
    (warning,) = report.issues
    assert (warning.kind, warning.line, warning.skipped) == ("path_mismatch", 2, False)
    assert report.imported == 2 and report.skipped == 0


def test_malformed_lines_are_reported_with_file_and_line_and_skipped(tmp_path: Path) -> None:
    good = line(1, 0, "engine_async_generate", 0.0, 1.0, {"request_id": "a"})
    bad = [
        '{"timestamp": "2025-08-11T23:19:45", "event": "x", "duration_sec": 1.0,',  # bad JSON
        '{"event": "x", "duration_sec": 1.0, "workid": 0, "step": 1}',  # no timestamp
        '{"timestamp": "2025-08-11T23:19:45", "duration_sec": 1.0}',  # no event
        '{"timestamp": "2025-08-11T23:19:45", "event": "x"}',  # no duration
        '{"timestamp": "2025-08-11T23:19:45", "event": "x", "duration_sec": -0.5}',
        '{"timestamp": "2025-08-11T23:19:45", "event": "x", "duration_sec": NaN}',
        '{"timestamp": "yesterday", "event": "x", "duration_sec": 1.0}',
        '{"timestamp": "2025-08-11T23:19:45", "event": "x", "duration_sec": "slow"}',
        '{"timestamp": "2025-08-11T23:19:45", "event": "x", "duration_sec": 1, "step": "one"}',
        "[1, 2, 3]",
        "\x00\xff garbage",
    ]
    path = tmp_path / "step_1" / "worker_0.jsonl"
    path.parent.mkdir()
    path.write_bytes(
        ("\n".join([good, *bad, "", good]) + "\n").encode("utf-8", "surrogateescape")
        + b"\xff\xfe{not utf8\n"
    )
    events, report = imported(tmp_path)
    assert len(events) == 2 and report.imported == 2
    kinds = [(i.line, i.kind) for i in report.issues]
    assert kinds == [
        (2, "bad_json"),
        (3, "missing_field"),
        (4, "missing_field"),
        (5, "missing_field"),
        (6, "negative_duration"),
        (7, "bad_duration"),
        (8, "bad_timestamp"),
        (9, "bad_field"),
        (10, "bad_field"),
        (11, "not_an_object"),
        (12, "bad_json"),
        (15, "bad_json"),
    ]
    assert all(i.path == str(path) and i.skipped for i in report.issues)
    assert report.skipped == 12 and report.lines == 14  # the blank line is no line
    assert str(report.issues[4]).startswith(f"{path}:6: negative_duration:")
    assert "missing timestamp" in report.issues[1].message
    # skipped lines leave gaps in seq, so the loss stays visible downstream
    assert [e.seq for e in events] == [0, 13]


def test_a_mistyped_optional_field_keeps_the_line_and_warns(tmp_path: Path) -> None:
    write_dir(tmp_path, [line(1, 0, "gen", 0.0, 1.0, {"request_id": "a", "turn": "second"})])
    (ev,), report = imported(tmp_path)
    assert ev.turn is None and dict(ev.extra) == {"turn": "second"}
    (warning,) = report.issues
    assert warning.kind == "bad_field" and not warning.skipped


def test_layout_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        imported(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"step_<N>/worker_<R>\.jsonl"):
        imported(tmp_path)
    write_dir(tmp_path, [line(1, 0, "x", 0.0, 1.0)])
    (tmp_path / "step_1" / "rank_0.log").write_text("?")
    _, report = imported(tmp_path)
    assert sorted(i.kind for i in report.issues) == ["unexpected_entry", "unexpected_entry"]
    assert report.imported == 1 and report.skipped == 0


def test_files_are_read_in_numeric_step_and_worker_order(tmp_path: Path) -> None:
    write_dir(tmp_path, [line(s, w, "x", 0.0, 1.0) for s in (10, 2, 1) for w in (11, 3)])
    events, _ = imported(tmp_path)
    assert [(e.step, e.worker) for e in events] == [
        (1, "3"),
        (1, "11"),
        (2, "3"),
        (2, "11"),
        (10, "3"),
        (10, "11"),
    ]


def test_import_into_a_real_embedded_log_is_batched_and_idempotent(tmp_path: Path) -> None:
    src = write_dir(
        tmp_path / "traces",
        [
            line(1, w, "engine_async_generate", 0.0, 1.0 + i, {"request_id": f"{w}-{i}"})
            for w in range(3)
            for i in range(10)
        ],
    )
    writes: list[int] = []
    sink = EmbeddedSink(tmp_path / "log")

    def write(batch: list) -> None:
        writes.append(len(batch))
        sink.write(batch)

    report = import_traces(src, run_id="r", tenant_id="t", write=write, batch_size=8)
    assert writes == [8, 8, 8, 6] and report.imported == 30
    again = ImportReport()
    second = list(iter_trace_events(src, run_id="r", tenant_id="t", report=again))
    log = EmbeddedLog(tmp_path / "log", readonly=True)
    log.open_sync()
    stored = list(log.iter_events(["runwatch.traces"]))
    assert len(stored) == 30 and all(isinstance(e, RolloutTraceRecorded) for e in stored)
    assert [e.event_id for e in stored] == [e.event_id for e in second]  # same ids again
    assert stored == second


def test_events_equal_their_validated_copies_and_ids_are_derived_ids(tmp_path: Path) -> None:
    """The importer builds events without a second validation pass: pin that a fully
    validated copy and a codec round trip are equal, and that ids are ``derived_id``."""
    from events import decode, encode
    from events.envelope import derived_id
    from producers.trace_synth import write_synthetic_traces

    write_synthetic_traces(
        tmp_path / "s", steps=2, workers=2, requests_per_worker=6, abort_share=0.2
    )
    path = tmp_path / "s" / "step_1" / "worker_0.jsonl"
    with path.open("a") as fh:
        fh.write(
            json.dumps(
                {
                    "timestamp": 1754954385.5,
                    "event": "odd",
                    "duration_sec": 0,
                    "extra": [1, {"a": None}],
                    "workid": "0",
                    "turn_id": "3",
                    "completion_tokens": 7.0,
                    "aborted": False,
                    "note": None,
                    "policy_version": 4,
                    "unparseable": "no json",
                }
            )
            + "\n"
        )
    events, report = imported(tmp_path / "s")
    assert report.issues == [] and len(events) > 20
    for ev in events:
        assert RolloutTraceRecorded.model_validate(ev.model_dump()) == ev
        assert decode(encode(ev)) == ev
        rel = f"step_{ev.step}/worker_{ev.worker}.jsonl"
        line_no = (
            ev.seq
            + 1
            - sum(
                len(p.read_text().splitlines())
                for p in sorted((tmp_path / "s").glob("step_*/worker_*.jsonl"))
                if (int(p.parent.name[5:]), int(p.stem[7:])) < (ev.step, int(ev.worker))
            )
        )
        assert ev.event_id == derived_id("trace-import", "run-1", rel, line_no)
    odd = events[[e.event_name for e in events].index("odd")]
    assert (odd.turn, odd.completion_tokens, odd.policy_version, odd.unparseable) == (3, 7, 4, True)
    assert dict(odd.extra) == {"extra": '[1, {"a": null}]', "note": None}
    assert odd.ts == 1754954385.5 and odd.duration_s == 0.0
