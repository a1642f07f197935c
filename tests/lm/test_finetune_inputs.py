"""A bad micro-batch call is refused before the optimization context is touched: the
fine-tuner stays usable and its weights finite."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.lm.windows import Windows
from ggopt.models import llama
from tests.support.finetune import tiny, windows


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("ibatch, weight, exc", [
    (10**6, 1.0, ShapeError), (-1, 1.0, ShapeError), ("0", 1.0, ShapeError),
    (0, math.nan, InvalidValueError), (0, -1.0, InvalidValueError),
])
def test_bad_microbatch_leaves_the_tuner_usable(static, ibatch, weight, exc):
    """An out-of-range ibatch left a graph allocated and every later call a StateError; a NaN
    weight trained every weight to NaN."""
    net = tiny()
    ft = FineTuner(net, windows(8), FinetuneParams(n_batch=2, lr=1e-3, val_split=0.25,
                                                   static=static))
    try:
        with pytest.raises(exc):
            ft.microbatch(ibatch, True, weight)
        assert math.isfinite(ft.train_epoch().loss)
        assert all(np.isfinite(w).all() for w in llama.get_weights(net).values())
    finally:
        ft.close()


@pytest.mark.parametrize("kwargs", [{"n_batch": "2"}, {"n_batch": 4.0, "n_ubatch": 2.0},
                                    {"n_batch": True}, {"lr": "1"}, {"val_split": "0.1"}])
def test_params_of_the_wrong_type(kwargs):
    """Strings were compared with ints (a raw TypeError); 4.0 / 2.0 windows passed the check
    and failed later in make_inputs."""
    with pytest.raises(DTypeError, match="finetune: "):
        FineTuner(tiny(), windows(8), FinetuneParams(**kwargs))


@pytest.mark.parametrize("tokens, labels, exc", [
    (np.zeros((8, 16), np.int32), np.zeros((8, 15), np.int32), ShapeError),
    (np.zeros(16, np.int32), np.zeros(16, np.int32), ShapeError),
    (np.zeros((8, 16), np.float32), np.zeros((8, 16), np.int32), DTypeError),
    ([[0] * 16] * 8, np.zeros((8, 16), np.int32), DTypeError),
])
def test_malformed_windows(tokens, labels, exc):
    """Were a broadcast ValueError, IndexError or AttributeError inside to_dataset."""
    with pytest.raises(exc, match="windows: "):
        Windows(tokens, labels)


@pytest.mark.parametrize("n_epochs, exc", [(-1, InvalidValueError), (1.5, DTypeError),
                                           ("2", DTypeError)])
def test_fit_refuses_a_bad_epoch_count(n_epochs, exc):
    """fit(-1) returned an empty history as if it had trained."""
    ft = FineTuner(tiny(), windows(8), FinetuneParams(val_split=0.25))
    try:
        with pytest.raises(exc, match="n_epochs"):
            ft.fit(n_epochs)
        assert len(ft.fit(1).train_loss) == 1  # still usable
    finally:
        ft.close()
