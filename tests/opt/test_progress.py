"""The progress bar's exact format (ggml-opt-spec §4.2)."""

from __future__ import annotations

import io
import math
import types

import numpy as np
import pytest

from ggopt.errors import ShapeError, StateError
from ggopt.opt.progress import epoch_callback_progress_bar, format_hms, progress_bar_line
from ggopt.opt.result import Result

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


def test_callback_writes_to_stream():
    ctx = types.SimpleNamespace(inputs=types.SimpleNamespace(ne=(2, 4, 1, 1)))
    result = Result()
    result.add_eval(False, 1, 4, np.float32(2.0), None, None)
    stream = io.StringIO()
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
    assert captured.err.endswith(" \r\n")


def test_callback_without_result_raises():
    ctx = types.SimpleNamespace(inputs=types.SimpleNamespace(ne=(1, 1, 1, 1)))
    stream = io.StringIO()
    with pytest.raises(StateError, match="Result"):
        epoch_callback_progress_bar(True, ctx, None, None, 1, 1, 0, stream=stream)
    assert stream.getvalue() == ""
