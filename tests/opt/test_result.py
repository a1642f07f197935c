"""Result statistics (ggml-opt-spec §2.9) on hand-fed evaluations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggopt.errors import DTypeError, ShapeError
from ggopt.opt.result import Result


def _feed(result, losses, *, per_datapoint=False, opt_period=1, nd=1, pred=None, ncorrect=None):
    for k, loss in enumerate(losses):
        result.check_eval(per_datapoint, opt_period, nd)
        result.add_eval(
            per_datapoint,
            opt_period,
            nd,
            np.float32(loss),
            None if pred is None else pred[k],
            None if ncorrect is None else ncorrect[k],
        )


def test_initial_result():
    r = Result()
    assert r.ndata == 0
    loss, unc = r.loss()
    assert loss == 0.0 and math.isnan(unc)  # ggml crashes here (ggml-opt-spec Q7)
    acc, acc_unc = r.accuracy()
    assert math.isnan(acc) and math.isnan(acc_unc)
    assert r.pred().dtype == np.int32 and r.pred().size == 0


def test_sum_loss_is_total_with_sample_std():
    r = Result()
    _feed(r, [3, 4, 5, 6, 7, 8])
    loss, unc = r.loss()
    assert r.ndata == 6
    assert loss == 33.0
    assert unc == pytest.approx(np.std([3, 4, 5, 6, 7, 8], ddof=1), abs=1e-12)  # not its mean's
    acc, acc_unc = r.accuracy()
    assert math.isnan(acc) and math.isnan(acc_unc)


def test_constant_losses_have_exactly_zero_uncertainty():
    r = Result()
    _feed(r, [3.0] * 6)
    assert r.loss() == (18.0, 0.0)


def test_single_batch_has_nan_uncertainty():
    r = Result()
    _feed(r, [2.5], per_datapoint=True)
    loss, unc = r.loss()
    assert loss == 2.5 and math.isnan(unc)


def test_per_datapoint_loss_undoes_opt_period_scaling():
    r = Result()
    scaled = [np.float32(v) / np.float32(3) for v in (1.0, 2.0, 4.0)]
    _feed(r, scaled, per_datapoint=True, opt_period=3)
    loss, unc = r.loss()
    unscaled = np.array([v * np.float32(3) for v in scaled], np.float64)  # about 1, 2, 4
    assert loss == pytest.approx(unscaled.mean(), abs=1e-12)
    assert abs(loss - 7 / 3) < 1e-6
    # the standard error of the mean; ggml squares the float32 losses in float32, which moves
    # the variance by up to 2^-23 * mean(l*l)
    float32_squares = math.sqrt(2.0**-23 * np.mean(unscaled**2))
    assert unc == pytest.approx(np.std(unscaled, ddof=1) / math.sqrt(3), abs=float32_squares)


def test_loss_uncertainty_is_the_standard_error_of_the_batch_losses():
    rng = np.random.default_rng(3)
    losses = rng.uniform(0.5, 2.5, 50).astype(np.float32)
    r = Result()
    _feed(r, losses, per_datapoint=True)
    loss, unc = r.loss()
    l64 = losses.astype(np.float64)
    assert loss == pytest.approx(l64.mean(), rel=1e-12)
    float32_squares = math.sqrt(2.0**-23 * np.mean(l64**2) / (len(l64) - 1))
    assert unc == pytest.approx(np.std(l64, ddof=1) / math.sqrt(len(l64)), abs=float32_squares)
    assert unc == pytest.approx(np.std(l64, ddof=1) / math.sqrt(len(l64)), rel=1e-3)


def test_accuracy_and_predictions():
    r = Result()
    pred = [np.array([1, 2], np.int32), np.array([3, 0], np.int32)]
    _feed(r, [0.5, 0.25], per_datapoint=True, nd=2, pred=pred, ncorrect=[2, 1])
    acc, unc = r.accuracy()
    assert acc == 0.75
    hits = np.array([1, 1, 1, 0], np.float64)  # the binomial standard error of the hit rate
    assert unc == pytest.approx(np.std(hits, ddof=1) / math.sqrt(4), rel=1e-12)
    np.testing.assert_array_equal(r.pred(), [1, 2, 3, 0])


def test_one_datapoint_accuracy_has_nan_uncertainty():
    r = Result()
    _feed(r, [0.5], per_datapoint=True, nd=1, pred=[np.array([4])], ncorrect=[1])
    acc, unc = r.accuracy()
    assert acc == 1.0 and math.isnan(unc)


def test_missing_ncorrect_poisons_accuracy():
    r = Result()
    _feed(r, [1.0], ncorrect=[None])
    _feed(r, [1.0], ncorrect=[5])
    assert math.isnan(r.accuracy()[0])


def test_reset_keeps_nothing():
    r = Result()
    _feed(r, [1.0, 2.0], per_datapoint=True, opt_period=2, pred=[[1], [2]], ncorrect=[1, 0])
    r.reset()
    assert r.ndata == 0
    assert r.loss()[0] == 0.0
    assert r.pred().size == 0
    # After a reset the next evaluation may come from another kind of context.
    _feed(r, [5.0])
    assert r.loss()[0] == 5.0


def test_varying_batch_size_rejected_without_change():
    r = Result()
    _feed(r, [1.0], nd=2)
    with pytest.raises(ShapeError, match="varying batch size"):
        r.check_eval(False, 1, 3)
    assert r.ndata == 2 and r.loss()[0] == 1.0


@pytest.mark.parametrize("per_datapoint, opt_period", [(True, 1), (False, 2)])
def test_other_context_kind_rejected(per_datapoint, opt_period):
    r = Result()
    _feed(r, [1.0])
    with pytest.raises(ShapeError, match="another kind of context"):
        r.check_eval(per_datapoint, opt_period, 1)
    assert r.ndata == 1


def _state(r: Result):
    return r.ndata, r.loss(), r.accuracy(), r.pred().tolist()


def test_merge_equals_recording_the_parts_in_order():
    losses, preds, ncorrect = [1.5, 2.0, 0.25, 3.0], [[1, 2], [3, 4], [5, 6], [7, 8]], [1, 2, 0, 1]
    whole = Result()
    _feed(whole, losses, per_datapoint=True, opt_period=2, nd=2, pred=preds, ncorrect=ncorrect)
    a, b, empty, merged = Result(), Result(), Result(), Result()
    _feed(a, losses[:1], per_datapoint=True, opt_period=2, nd=2, pred=preds[:1],
          ncorrect=ncorrect[:1])
    _feed(b, losses[1:], per_datapoint=True, opt_period=2, nd=2, pred=preds[1:],
          ncorrect=ncorrect[1:])
    merged.merge([a, empty, b])
    assert _state(merged) == _state(whole)
    assert a.ndata == 2 and b.ndata == 6  # the parts are unchanged


def test_merge_without_accuracy_keeps_none():
    a, b = Result(), Result()
    _feed(a, [1.0], ncorrect=[1])
    _feed(b, [2.0])  # no accuracy (not CROSS_ENTROPY)
    a.merge([b])
    assert a.ndata == 2 and a.loss()[0] == 3.0 and math.isnan(a.accuracy()[0])


@pytest.mark.parametrize("kwargs, match", [({"opt_period": 2}, "another kind of context"),
                                           ({"per_datapoint": True}, "another kind"),
                                           ({"nd": 3}, "varying batch size")])
def test_merge_refuses_other_kinds_before_anything_changes(kwargs, match):
    r, good, bad = Result(), Result(), Result()
    _feed(r, [1.0])
    _feed(good, [2.0])
    _feed(bad, [3.0], **kwargs)
    before = _state(r)
    with pytest.raises(ShapeError, match=match):
        r.merge([good, bad])
    assert _state(r) == before


def test_merge_refuses_what_is_not_a_result():
    r = Result()
    _feed(r, [1.0])
    with pytest.raises(DTypeError, match="parts must be Result, got float"):
        r.merge([1.0])  # type: ignore[list-item]
    assert r.ndata == 1
