"""Unit tests for the pure text helpers: summary block, FAIL marker, progress lines, error line."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from runner.logtail import LogTailer, read_log_end
from runner.result import Outcome, RunResult, last_error_line, tail_lines
from runner.summary import ProgressPoint, has_fail_marker, parse_progress, parse_summary

# --- parse_summary -------------------------------------------------------------------------


def test_summary_block_parsed_with_floats_strings_and_nan() -> None:
    text = (
        "step 1 | loss 4.0\n"
        "---\n"
        "val_bpb:          0.997900\n"
        "mfu_percent:      nan\n"
        "peak_memory_mb:   inf\n"
        "num_steps:        953\n"
        "device: cuda:0\n"
    )
    summary = parse_summary(text)
    assert summary["val_bpb"] == pytest.approx(0.9979)
    assert math.isnan(summary["mfu_percent"])  # type: ignore[arg-type]
    assert summary["peak_memory_mb"] == math.inf
    assert summary["num_steps"] == 953.0
    assert summary["device"] == "cuda:0"


def test_summary_no_block_is_empty() -> None:
    assert parse_summary("") == {}
    assert parse_summary("val_bpb: 1.0\nnothing else\n") == {}


def test_summary_last_block_wins() -> None:
    text = "---\nval_bpb: 2.0\nold: 1\n\nmore output\n---\nval_bpb: 1.5\n"
    assert parse_summary(text) == {"val_bpb": 1.5}


def test_summary_stops_at_first_non_key_value_line() -> None:
    text = "---\nval_bpb: 1.25\nthis is garbage\nnum_steps: 10\n"
    assert parse_summary(text) == {"val_bpb": 1.25}


def test_summary_separator_tolerates_whitespace_but_not_longer_rules() -> None:
    assert parse_summary("  ---  \r\nval_bpb: 1.0\r\n") == {"val_bpb": 1.0}
    assert parse_summary("----\nval_bpb: 1.0\n") == {}


def test_summary_keys_must_be_identifiers() -> None:
    text = "---\nval_bpb: 1.0\n2bad: 3\nnum_steps: 4\n"
    assert parse_summary(text) == {"val_bpb": 1.0}


def test_summary_empty_block_at_end() -> None:
    assert parse_summary("---\nval_bpb: 1.0\n---\n") == {}


# --- has_fail_marker -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("step 1\nFAIL\n", True),
        ("  FAIL  \n", True),
        ("FAILED\n", False),
        ("fail\n", False),
        ("assert FAIL in x\n", False),
        ("", False),
    ],
)
def test_fail_marker(text: str, expected: bool) -> None:
    assert has_fail_marker(text) is expected


# --- parse_progress ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step 120 | loss 3.41 | elapsed 31.2s", ProgressPoint(120, 3.41, 31.2)),
        (
            "step 00120/01000 (12.0%) | loss: 3.410000 | lrm: 1.00 | dt: 250ms | elapsed: 31.2s",
            ProgressPoint(120, 3.41, 31.2),
        ),
        ("step=120 loss=3.41", ProgressPoint(120, 3.41, None)),
        ("elapsed=5s loss=2.5e-1 step=7", ProgressPoint(7, 0.25, 5.0)),
        ("Step: 3 | tok/sec: 1000 | Loss: 4", ProgressPoint(3, 4.0, None)),
        ("\rstep 00005 (0.5%) | loss: 9.000000 | remaining: 290s", ProgressPoint(5, 9.0, None)),
    ],
)
def test_progress_parsed(line: str, expected: ProgressPoint) -> None:
    assert parse_progress(line) == expected


@pytest.mark.parametrize(
    ("line", "elapsed"),
    [
        ("step 3 | loss 0.63 | 0.7s", 0.7),  # a field of its own
        ("step 3 | loss 0.63 | time 1.2s", 1.2),
        ("step=3 loss=0.63 elapsed=3.4", 3.4),
        ("step 3 | loss 0.63 | 12 sec", 12.0),
        ("step 3: loss 0.63, time 9.70ms, mfu 0.01%", None),  # a step's time, in ms (nanoGPT)
        ("step 3 | loss 0.63 | epoch time 3.2s", None),  # an epoch's time, not the run's
        ("step 3 | loss 0.63 | step time 0.3s", None),
        ("step 3 | loss 0.63 | 3.18s/it", None),  # tqdm: seconds per step
        ("step 3 | loss 0.63 | remaining: 290s", None),
    ],
)
def test_the_elapsed_time_a_progress_line_prints(line: str, elapsed: float | None) -> None:
    point = parse_progress(line)
    assert point is not None and point.elapsed_s == elapsed


def test_a_progress_regex_without_an_elapsed_group_still_reads_the_elapsed_time() -> None:
    import re

    made = re.compile(r"loss\s+(?P<loss>[\d.]+)")  # what adopt fits to `epoch 0 | loss ...`
    assert parse_progress("epoch   3 | loss 0.6312 | 0.7s", made) == ProgressPoint(-1, 0.6312,
                                                                                  0.7)
    own = re.compile(r"loss\s+(?P<loss>[\d.]+)(?: \| (?P<elapsed>[\d.]+)m)?")
    assert parse_progress("epoch 3 | loss 0.5 | 0.7s", own) == ProgressPoint(-1, 0.5, None)


def test_progress_nan_loss() -> None:
    point = parse_progress("step 2 | loss nan | elapsed 0.2s")
    assert point is not None and point.step == 2 and math.isnan(point.loss)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "---",
        "val_bpb: 0.99",
        "step 120",  # no loss
        "loss 3.41",  # no step
        "num_steps: 953",
        "step 5 | val_loss 3.2",  # val_loss is not loss
        "steps 5 | loss 3.2",
        "step 5 | loss: abc",
    ],
)
def test_progress_rejects(line: str) -> None:
    assert parse_progress(line) is None


# --- last_error_line -----------------------------------------------------------------------


def test_error_line_from_traceback() -> None:
    text = (
        "step 1 | loss 4.0\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "    print(x)\n"
        "          ^\n"
        "NameError: name 'x' is not defined\n"
    )
    assert last_error_line(text) == "NameError: name 'x' is not defined"


def test_error_line_uses_last_traceback_of_a_chain() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "a.py", line 1\n'
        "KeyError: 'a'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "a.py", line 3\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "some output printed after the traceback\n"
    )
    assert last_error_line(text) == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("KeyboardInterrupt\n", "KeyboardInterrupt"),
        ("__main__.Boom: custom exception\n", "__main__.Boom: custom exception"),
        ("AssertionError\n", "AssertionError"),
    ],
)
def test_error_line_any_name_inside_traceback(tail: str, expected: str) -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 1\n    f()\n' + tail
    assert last_error_line(text) == expected


def test_error_line_without_traceback_header() -> None:
    text = (
        '  File "/tmp/syntax_error.py", line 3\n'
        "    def broken(:\n"
        "               ^\n"
        "SyntaxError: invalid syntax\n"
    )
    assert last_error_line(text) == "SyntaxError: invalid syntax"


@pytest.mark.parametrize(
    "text",
    ["", "all good\nDone\n", "step 1 | loss 3.0\n---\nval_bpb: 1.0\n", "FAIL\n"],
)
def test_error_line_none_for_ordinary_output(text: str) -> None:
    assert last_error_line(text) is None


def test_error_line_ignores_warnings() -> None:
    text = "/x/train.py:12: UserWarning: something odd\n  warnings.warn(msg)\n"
    assert last_error_line(text) is None


# --- RunResult, tails ----------------------------------------------------------------------


def _result(**overrides: object) -> RunResult:
    fields: dict[str, object] = {
        "outcome": Outcome.EXITED,
        "exit_code": 0,
        "signal": None,
        "wall_s": 1.0,
        "summary": {},
        "fail_marker": False,
        "log_path": Path("run.log"),
        "log_tail": "",
        "pgid": 123,
    }
    fields.update(overrides)
    return RunResult(**fields)  # type: ignore[arg-type]


def test_result_ok_rules() -> None:
    assert _result().ok
    assert not _result(exit_code=1).ok
    assert not _result(fail_marker=True).ok
    assert not _result(outcome=Outcome.TIMED_OUT, exit_code=None).ok
    assert _result().error is None
    assert Outcome("timed_out") is Outcome.TIMED_OUT and Outcome.TIMED_OUT.value == "timed_out"


def test_tail_lines_keeps_last_fifty() -> None:
    text = "\n".join(f"line {i}" for i in range(120))
    tail = tail_lines(text)
    assert tail.splitlines()[0] == "line 70" and tail.splitlines()[-1] == "line 119"


# --- LogTailer -----------------------------------------------------------------------------


def test_tailer_splits_chunks_crlf_cr_and_multibyte(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(b"")
    seen: list[str] = []
    tailer = LogTailer(log, seen.append)
    chunks = [b"fir", b"st\r", b"\nsec", "ond é".encode()[:-1], "é".encode()[-1:], b"\n\rp1\rp2"]
    for chunk in chunks:
        with open(log, "ab") as handle:
            handle.write(chunk)
        tailer.poll()
    assert seen == ["first", "second é", "", "p1"]
    tailer.flush()
    assert seen == ["first", "second é", "", "p1", "p2"]


def test_tailer_survives_callback_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "run.log"
    log.write_text("a\nb\n")

    def boom(line: str) -> None:
        raise RuntimeError(line)

    tailer = LogTailer(log, boom)
    with caplog.at_level(logging.DEBUG, logger="runner.logtail"):
        tailer.flush()
    failed = [(r.levelno, r.exc_info[1]) for r in caplog.records if r.exc_info]
    assert [(level, str(exc)) for level, exc in failed] == [(logging.ERROR, "a"),
                                                             (logging.DEBUG, "b")]


def test_read_log_end_starts_at_line_boundary(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("aaaa\nbbbb\ncccc\n")
    assert read_log_end(log, max_bytes=8) == "cccc\n"
    assert read_log_end(tmp_path / "missing.log") == ""


def test_progress_regex_parses_a_script_s_own_format() -> None:
    import re

    pattern = re.compile(r"(?P<step>\d+)/\s*\d+ batches .*loss\s+(?P<loss>[\d.]+)")
    line = "| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 38.42 | loss  7.63 | ppl 2064"
    assert parse_progress(line) is None  # the built-in format does not know it
    assert parse_progress(line, pattern) == ProgressPoint(step=200, loss=7.63, elapsed_s=None)
    assert parse_progress("step 3 | loss 1.5", pattern) == ProgressPoint(3, 1.5, None)
    no_step = re.compile(r"loss=(?P<loss>[\d.]+)")
    assert parse_progress("train loss=0.5", no_step) == ProgressPoint(-1, 0.5, None)
