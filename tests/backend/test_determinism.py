"""Training gives the same bits whatever the thread count (kernels and BLAS products alike)."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt.models.mnist import data as mnist_data
from ggopt.models.mnist import model as mnist_model


def _train(arch: str, n_threads: int) -> dict[str, np.ndarray]:
    ggopt.set_n_threads(n_threads)
    try:
        data = mnist_data.load_mnist()
        ds = mnist_data.make_dataset(data.train_images[:2000], data.train_labels[:2000], 10, 1000)
        model = mnist_model.build_model(arch, mnist_model.make_scheduler("cpu"))
        mnist_model.init_params(model, seed=3)
        mnist_model.train(model, ds, nepoch=1, val_split=0.0, silent=True)
        return mnist_model.get_params(model)
    finally:
        ggopt.set_n_threads(None)


@pytest.mark.parametrize("arch", ["mnist-fc", "mnist-cnn"])
def test_weights_do_not_depend_on_the_thread_count(arch):
    one, two = _train(arch, 1), _train(arch, 2)
    for name in one:
        assert one[name].tobytes() == two[name].tobytes(), name
