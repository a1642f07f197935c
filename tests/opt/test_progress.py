"""The progress bar's exact format (ggml-opt-spec §4.2)."""

from __future__ import annotations

import io
import math
import re
import types

import numpy as np
import pytest

from ggopt.errors import ShapeError, StateError
from ggopt.models.llama.weights import ProgressBar
from ggopt.opt.progress import (
    epoch_callback_progress_bar,
    format_hms,
    is_milestone,
    is_terminal,
    progress_bar_line,
    write_progress,
)
from ggopt.opt.result import Result
from tests.support.terminal import Terminal

NAN2 = (math.nan, math.nan)


def _cells(line):
    return line[line.index("[") + 1 : line.index("]")]


@pytest.mark.parametrize(
    "ibatch, ibatch_max, cells",
    [
        (1, 3, "██▋     "),
        (3, 3, "███████▉"),
        (1, 8, "▉       "),
        (1, 40, "▏       "),
        (1, 64, "        "),
        (1, 100, "        "),
        (50, 100, "███▉    "),
        (6, 6, "███████▉"),
    ],
)
def test_cells(ibatch, ibatch_max, cells):
    assert _cells(progress_bar_line(True, ibatch, ibatch_max, 1, NAN2, NAN2, 0)) == cells


def test_finished_line_matches_ggml_sample():
    line = progress_bar_line(True, 3, 3, 1, (11.0, 2.3094010767585), NAN2, 400)
    assert line == (
        "train: [███████▉] data=0000003/0000003 loss=11.00000±2.30940 acc=nan±nan% "
        "t=00:00:00 ETA=00:00:00 \r\n"
    )


def test_unfinished_val_line_has_no_newline_and_eta():
    line = progress_bar_line(False, 1, 3, 500, (0.5, 0.01), (0.9775, 0.0027), 61_500_000)
    assert line == (
        "val:   [██▋     ] data=0000500/0001500 loss=0.50000±0.01000 acc=97.75±0.27% "
        "t=00:01:01 ETA=00:02:03 \r"
    )


def test_negative_nan_is_spelled_like_glibc():
    neg_nan = -np.float64(np.nan)
    line = progress_bar_line(True, 1, 1, 1, (neg_nan, math.nan), NAN2, 0)
    assert "loss=-nan±nan" in line


def test_hms_hours_can_exceed_two_digits():
    assert format_hms(0) == "00:00:00"
    assert format_hms(3_599_999_000_000) == "999:59:59"
    assert format_hms(3_600_000_000 + 62_000_000) == "01:01:02"


def test_ibatch_zero_rejected():
    with pytest.raises(ShapeError, match="ibatch"):
        progress_bar_line(True, 0, 3, 1, NAN2, NAN2, 0)


def test_callback_redraws_in_place_on_a_terminal():
    ctx = types.SimpleNamespace(inputs=types.SimpleNamespace(ne=(2, 4, 1, 1)))
    result = Result()
    result.add_eval(False, 1, 4, np.float32(2.0), None, None)
    stream = Terminal()
    epoch_callback_progress_bar(True, ctx, None, result, 1, 2, 0, stream=stream)
    line = stream.getvalue()
    assert line.startswith(
        "train: [███▉    ] data=0000004/0000008 loss=2.00000±nan acc=nan±nan% t="
    )
    assert line.endswith(" \r")


def test_callback_defaults_to_stderr(capsys):
    ctx = types.SimpleNamespace(inputs=types.SimpleNamespace(ne=(1, 1, 1, 1)))
    epoch_callback_progress_bar(False, ctx, None, Result(), 1, 1, 0)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "val:   [███████▉] data=0000001/0000001 loss=0.00000±nan"
    )
    assert captured.err.endswith("ETA=00:00:00\n")  # captured stderr: not a terminal


def test_callback_without_result_raises():
    ctx = types.SimpleNamespace(inputs=types.SimpleNamespace(ne=(1, 1, 1, 1)))
    stream = io.StringIO()
    with pytest.raises(StateError, match="Result"):
        epoch_callback_progress_bar(True, ctx, None, None, 1, 1, 0, stream=stream)
    assert stream.getvalue() == ""


#: the redraws a non-terminal shows of 272 steps: the first, each new tenth, the last
TENTHS_OF_272 = [1, 28, 55, 82, 109, 136, 164, 191, 218, 245, 272]


def test_milestones_are_the_first_each_tenth_and_the_last():
    assert [d for d in range(1, 273) if is_milestone(d, 272)] == TENTHS_OF_272
    assert [d for d in range(1, 4) if is_milestone(d, 3)] == [1, 2, 3]
    assert [d for d in range(1, 21) if is_milestone(d, 20)] == [1, *range(2, 21, 2)]


def test_epoch_bar_off_a_terminal_is_a_line_per_tenth():
    ctx = types.SimpleNamespace(inputs=types.SimpleNamespace(ne=(1, 1, 1, 1)))
    result = Result()
    result.add_eval(False, 1, 1, np.float32(2.0), None, None)
    stream = io.StringIO()
    for i in range(1, 273):
        epoch_callback_progress_bar(True, ctx, None, result, i, 272, 0, stream=stream)
    lines = stream.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in stream.getvalue()
    assert [int(line.split("data=")[1][:7]) for line in lines[:-1]] == TENTHS_OF_272
    assert all(re.fullmatch(r"train: \[.{8}\] data=\d{7}/0000272 loss=2\.00000±nan .* "
                            r"ETA=\d+:\d\d:\d\d", line) for line in lines[:-1])


def test_write_progress_passes_every_redraw_to_a_terminal():
    stream = Terminal()
    for i in range(1, 6):
        write_progress(stream, f"\rx {i}/5" + ("\n" if i == 5 else ""), i, 5)
    assert stream.getvalue() == "\rx 1/5\rx 2/5\rx 3/5\rx 4/5\rx 5/5\n"
    assert is_terminal(stream) and not is_terminal(io.StringIO())


def test_a_closed_or_odd_stream_is_not_a_terminal():
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)
    assert not is_terminal(types.SimpleNamespace())  # type: ignore[arg-type]


def test_model_load_bar_suits_its_sink():
    plain = io.StringIO()
    bar = ProgressBar(272, plain)
    for _ in range(272):
        bar.update(_ + 1, 1_000_000)
    lines = plain.getvalue().split("\n")
    assert "\r" not in plain.getvalue() and lines[-1] == ""
    assert [int(line.split("] ")[1].split("/")[0]) for line in lines[:-1]] == TENTHS_OF_272
    assert lines[-2] == "load: [" + "#" * 30 + "] 272/272 tensors, 272 MB"
    term = Terminal()
    bar = ProgressBar(272, term)
    for _ in range(272):
        bar.update(_ + 1, 1_000_000)
    frames = term.getvalue().split("\r")[1:]
    assert len(frames) == 31  # one per filled cell (0..30), redrawn in place
    assert frames[-1] == "load: [" + "#" * 30 + "] 272/272 tensors, 272 MB\n"
