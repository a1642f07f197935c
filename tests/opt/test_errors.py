"""Every error path of ggopt.opt: the right exception, raised before anything changed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.errors import DTypeError, InvalidValueError, ShapeError, StateError
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data, make_supervised
from tests.support.state import first_difference, observable_state

# --- Dataset construction -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 1, 6, 1), "ne_datapoint must be > 0"),
        ((2, -1, 6, 1), "ne_label must be >= 0"),
        ((2, 1, 0, 1), "ndata must be > 0"),
        ((2, 1, 6, 0), "ndata_shard must be > 0"),
        ((2, 1, 6, -3), "ndata_shard must be > 0"),
    ],
)
def test_dataset_bad_sizes(args, match):
    with pytest.raises(ShapeError, match=match):
        opt.Dataset(ggopt.F32, ggopt.F32, *args)


def test_dataset_bad_types():
    with pytest.raises(DTypeError, match="unknown tensor type"):
        opt.Dataset(99, ggopt.F32, 2, 1, 6, 1)
    with pytest.raises(DTypeError, match="ndata must be an int"):
        opt.Dataset(ggopt.F32, ggopt.F32, 2, 1, 6.0, 1)


# --- get_batch ----------------------------------------------------------------------------


def _tensors(*specs):
    ctx = ggopt.Context()
    ts = [ctx.new_tensor(t, ne) for t, ne in specs]
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    for t in ts:
        t.numpy()[...] = -7
    return ts


def _untouched(*ts):
    return all(np.all(t.numpy() == -7) for t in ts)


@pytest.mark.parametrize(
    "data_spec, labels_spec, ibatch, exc, match",
    [
        ((ggopt.F32, (3,)), (ggopt.F32, (1,)), 0, ShapeError, "not a whole number of shards"),
        ((ggopt.F32, (6,)), (ggopt.F32, (2,)), 0, ShapeError, "not a whole number of shards"),
        ((ggopt.F32, (4,)), (ggopt.F32, (1,)), 0, ShapeError, "labels_batch has 4 bytes"),
        ((ggopt.F32, (4,)), None, 0, ShapeError, "no labels batch was given"),
        ((ggopt.I32, (4,)), (ggopt.F32, (2,)), 0, DTypeError, "data_batch .* is I32"),
        ((ggopt.F32, (4,)), (ggopt.I32, (2,)), 0, DTypeError, "labels_batch .* is I32"),
        ((ggopt.F32, (4,)), (ggopt.F32, (2,)), 3, ShapeError, "ibatch=3 out of range"),
        ((ggopt.F32, (4,)), (ggopt.F32, (2,)), -1, ShapeError, "ibatch=-1 out of range"),
        ((ggopt.F32, (12,)), (ggopt.F32, (6,)), 1, ShapeError, "out of range"),
    ],
)
def test_get_batch_errors(data_spec, labels_spec, ibatch, exc, match):
    ds = make_supervised(2)  # shards of 2 datapoints: 16 data bytes, 8 label bytes
    specs = [data_spec] + ([labels_spec] if labels_spec else [])
    ts = _tensors(*specs)
    labels = ts[1] if labels_spec else None
    before = observable_state(ds, *ts)
    with pytest.raises(exc, match=match):
        ds.get_batch(ts[0], labels, ibatch)
    assert _untouched(*ts)
    assert observable_state(ds, *ts) == before


def test_get_batch_extra_labels_and_non_tensors():
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 1, 0, 6, 1)
    data, labels = _tensors((ggopt.F32, (2,)), (ggopt.F32, (2,)))
    before = observable_state(ds, data, labels)
    with pytest.raises(ShapeError, match="dataset has no labels"):
        ds.get_batch(data, labels, 0)
    with pytest.raises(DTypeError, match="data_batch must be a Tensor"):
        ds.get_batch(None, None, 0)
    with pytest.raises(DTypeError, match="ibatch must be an int"):
        ds.get_batch(data, None, 0.5)
    assert _untouched(data, labels)
    assert observable_state(ds, data, labels) == before


def test_get_batch_non_contiguous_and_unallocated():
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 2, 0, 6, 1)
    ctx = ggopt.Context()
    base = ctx.new_tensor_2d(ggopt.F32, 2, 2)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    base.numpy()[...] = -7
    view = ggopt.transpose(ctx, base)
    no_memory = ggopt.Context().new_tensor_1d(ggopt.F32, 4)
    before = observable_state(ds, ctx, no_memory)
    with pytest.raises(ShapeError, match="contiguous"):
        ds.get_batch(view, None, 0)
    assert _untouched(base)
    with pytest.raises(StateError, match="no memory"):
        ds.get_batch(no_memory, None, 0)
    assert observable_state(ds, ctx, no_memory) == before


def test_get_batch_host_errors():
    ds = make_supervised(2)
    before = observable_state(ds)
    labels = np.full(2, -7, np.float32)
    cases = [
        (np.full(3, -7, np.float32), labels, 0, ShapeError, "not a whole number of shards"),
        (np.full(4, -7, np.float32), None, 0, ShapeError, "no labels batch"),
        (np.full(4, -7, np.int32), labels, 0, DTypeError, "data_arr has dtype int32"),
        (np.full(4, -7, np.float32), np.full(3, -7, np.float32), 0, ShapeError, "12 bytes"),
        (np.full(4, -7, np.float32), labels, 3, ShapeError, "out of range"),
        (np.full((4, 2), -7, np.float32)[:, 0], labels, 0, ShapeError, "C-contiguous"),
        ([-7.0] * 4, labels, 0, DTypeError, "NumPy array"),
    ]
    for data, lab, ibatch, exc, match in cases:
        with pytest.raises(exc, match=match):
            ds.get_batch_host(data, lab, ibatch)
        assert np.all(np.asarray(data) == -7) and np.all(labels == -7)
    frozen = np.full(4, -7, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ShapeError, match="writeable"):
        ds.get_batch_host(frozen, labels, 0)
    assert observable_state(ds) == before


# --- shuffle ------------------------------------------------------------------------------


@pytest.mark.parametrize("idata, match", [(7, "exceeds ndata=6"), (3, "not a multiple")])
def test_shuffle_bounds(idata, match):
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    ds = make_supervised(2)
    before = observable_state(ds, cd.opt_ctx)
    with pytest.raises(ShapeError, match=match):
        ds.shuffle(cd.opt_ctx, idata)
    assert ds.permutation.tolist() == [0, 1, 2]
    assert observable_state(ds, cd.opt_ctx) == before
    ds.shuffle(cd.opt_ctx, 6)  # the RNG did not advance: same result as a fresh context
    fresh = make_supervised(2)
    fresh.shuffle(make_ctx_data(opt.OptimizerType.ADAMW).opt_ctx, 6)
    assert ds.permutation.tolist() == fresh.permutation.tolist()


def test_shuffle_argument_types():
    ds = make_supervised(1)
    opt_ctx = make_ctx_data(opt.OptimizerType.SGD).opt_ctx
    before = observable_state(ds, opt_ctx)
    with pytest.raises(DTypeError, match="OptContext"):
        ds.shuffle(np.random.default_rng(0))
    with pytest.raises(DTypeError, match="idata must be an int"):
        ds.shuffle(opt_ctx, 2.0)
    assert ds.permutation.tolist() == list(range(6))
    assert observable_state(ds, opt_ctx) == before


# --- OptContext construction --------------------------------------------------------------


def test_init_errors():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    p = cd.params
    cases = [
        (dict(opt_period=0), InvalidValueError, "opt_period must be >= 1"),
        (dict(opt_period=1.5), DTypeError, "opt_period must be an int"),
        (dict(loss_type="hinge"), InvalidValueError, "unknown LossType"),
        (dict(build_type=15), InvalidValueError, "unknown BuildType"),
        (dict(optimizer=5), InvalidValueError, "unknown OptimizerType"),
        (dict(inputs=None), StateError, "all be set"),
        (dict(backend_sched=object()), DTypeError, "Scheduler"),
        (dict(get_opt_pars=None), DTypeError, "callable"),
        (dict(rng_seed=-1), InvalidValueError, "seed"),
    ]
    before = observable_state(cd)
    for change, exc, match in cases:
        params = opt.OptParams(**{**p.__dict__, **change})
        with pytest.raises(exc, match=match):
            opt.OptContext(params)
        assert observable_state(cd) == before  # no flag, tensor or datum of the model changed
    with pytest.raises(DTypeError, match="OptParams"):
        opt.OptContext({"opt_period": 1})


def _init_left_model_unchanged(before: tuple, after: tuple) -> None:
    """A failed OptContext() must leave the model as it was: these checks run after it has
    expanded the forward graph (naming nodes, setting COMPUTE flags), which the context rolls
    back (ggopt.graph.graph_rollback) when a later step raises."""
    assert after == before, f"failed OptContext() changed the model: " \
        f"{first_difference(before, after)}"


def test_init_inputs_not_allocated():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    ctx = ggopt.Context()
    inputs = ctx.new_tensor_1d(ggopt.F32, 1)
    outputs = ggopt.add(cd.ctx_compute, inputs, cd.weights)
    cd.params.inputs, cd.params.outputs = inputs, outputs
    before = observable_state(cd, ctx)
    with pytest.raises(StateError, match="allocated statically"):
        opt.OptContext(cd.params)
    assert not inputs.flags & ggopt.TensorFlag.INPUT
    _init_left_model_unchanged(before, observable_state(cd, ctx))


def test_init_graph_without_parameter():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    cd.params.outputs = ggopt.scale(cd.ctx_compute, cd.inputs, 2.0)
    before = observable_state(cd)
    with pytest.raises(ShapeError, match="no parameter"):
        opt.OptContext(cd.params)
    _init_left_model_unchanged(before, observable_state(cd))


def test_init_cross_entropy_needs_matrix_outputs():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    cube = cd.ctx_static.new_tensor_3d(ggopt.F32, 2, 2, 2)
    gb.alloc_ctx_tensors(cd.ctx_static, gb.cpu_init())
    cd.params.outputs = ggopt.add(cd.ctx_compute, cube, cd.weights)
    cd.params.loss_type = opt.LossType.CROSS_ENTROPY
    before = observable_state(cd)
    with pytest.raises(ShapeError, match="matrix"):
        opt.OptContext(cd.params)
    _init_left_model_unchanged(before, observable_state(cd))


# --- the state machine --------------------------------------------------------------------


def _state(cd, *more):
    """Everything observable of the fixture: the opt context (graphs, accumulators, moments,
    counters, RNG), the scheduler, both contexts' tensors with their flags and data, the
    results and the dataset."""
    return observable_state(cd, *more)


def test_eval_without_alloc():
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    before = _state(cd)
    with pytest.raises(StateError, match="call alloc before eval"):
        cd.opt_ctx.eval(cd.result)
    assert _state(cd) == before


def test_alloc_twice():
    cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False)
    cd.opt_ctx.alloc(True)
    before = _state(cd)
    with pytest.raises(StateError, match="alloc called twice"):
        cd.opt_ctx.alloc(False)
    assert _state(cd) == before
    cd.opt_ctx.eval(cd.result)  # the first alloc still stands: an optimizer step
    assert cd.w == 2.0


def test_forward_context_asked_for_backward():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, build_type=opt.BuildType.FORWARD)
    before = _state(cd)
    with pytest.raises(StateError, match="BuildType.FORWARD"):
        cd.opt_ctx.alloc(True)
    assert _state(cd) == before
    with pytest.raises(StateError, match="no gradients"):
        cd.opt_ctx.grad_acc(cd.weights)


@pytest.mark.parametrize("optimizer", [opt.OptimizerType.ADAMW, opt.OptimizerType.SGD],
                         ids=opt.optimizer_name)
@pytest.mark.parametrize("field, value", [("alpha", 0.0), ("wd", 2.0), ("alpha", math.nan)])
def test_optimizer_params_out_of_bounds_leave_weights(optimizer, field, value):
    pars = get_test_opt_pars()
    cd = make_ctx_data(optimizer, init_opt_ctx=False)
    cd.params.get_opt_pars = lambda ud: ud
    cd.params.get_opt_pars_ud = pars
    cd.opt_ctx = opt.OptContext(cd.params)
    setattr(pars.adamw if optimizer is opt.OptimizerType.ADAMW else pars.sgd, field, value)
    cd.opt_ctx.alloc(True)
    before = _state(cd)
    with pytest.raises(InvalidValueError, match=f"{field} must be"):
        cd.opt_ctx.eval(cd.result)
    assert _state(cd) == before
    # Fix the values: the pending eval goes ahead.
    fixed = get_test_opt_pars()
    pars.adamw, pars.sgd = fixed.adamw, fixed.sgd
    cd.opt_ctx.eval(cd.result)
    assert cd.w == 2.0


def test_adamw_beta_and_eps_bounds():
    pars = get_test_opt_pars()
    pars.adamw.beta2 = 1.5
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    cd.params.get_opt_pars, cd.params.get_opt_pars_ud = opt.get_constant_optimizer_params, pars
    cd.opt_ctx = opt.OptContext(cd.params)
    cd.opt_ctx.alloc(True)
    before = _state(cd)
    with pytest.raises(InvalidValueError, match="beta2"):
        cd.opt_ctx.eval()
    assert cd.w == 3.0 and _state(cd) == before


def test_get_opt_pars_returning_garbage():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = lambda ud: {"alpha": 1.0}
    cd.opt_ctx = opt.OptContext(cd.params)
    cd.opt_ctx.alloc(True)
    before = _state(cd)
    with pytest.raises(DTypeError, match="OptimizerParams"):
        cd.opt_ctx.eval()
    assert cd.w == 3.0 and _state(cd) == before


def test_result_of_another_context_kind():
    sum_cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False)
    sum_cd.opt_ctx.alloc(False)
    sum_cd.opt_ctx.eval(sum_cd.result)
    mean_cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False,
                            loss_type=opt.LossType.MEAN)
    mean_cd.opt_ctx.alloc(True)
    before = _state(mean_cd, sum_cd)
    with pytest.raises(ShapeError, match="another kind of context"):
        mean_cd.opt_ctx.eval(sum_cd.result)
    assert mean_cd.w == 3.0 and sum_cd.result.ndata == 1
    with pytest.raises(DTypeError, match="Result or None"):
        mean_cd.opt_ctx.eval("result")
    assert mean_cd.w == 3.0 and _state(mean_cd, sum_cd) == before


def test_varying_batch_size_in_result():
    a = make_ctx_data(opt.OptimizerType.SGD, nbatch_physical=1, nbatch_logical=1)
    b = make_ctx_data(opt.OptimizerType.SGD, nbatch_physical=1, nbatch_logical=1)
    # Same kind of context, but outputs with two datapoints per eval.
    ctx_static = ggopt.Context()
    inputs = ctx_static.new_tensor_2d(ggopt.F32, 1, 2)
    gb.alloc_ctx_tensors(ctx_static, gb.cpu_init())
    b.params.inputs = inputs
    b.params.outputs = ggopt.add(b.ctx_compute, inputs, b.weights)
    ctx2 = opt.OptContext(b.params)
    a.opt_ctx.alloc(False)
    a.opt_ctx.eval(a.result)
    ctx2.alloc(False)
    before = _state(a, b, ctx2)
    with pytest.raises(ShapeError, match="varying batch size"):
        ctx2.eval(a.result)
    assert a.result.ndata == 1 and _state(a, b, ctx2) == before


def test_grad_acc_bad_node():
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    before = _state(cd)
    with pytest.raises(DTypeError, match="node must be a Tensor"):
        cd.opt_ctx.grad_acc("weights")
    assert _state(cd) == before


# --- static vs dynamic --------------------------------------------------------------------


def test_prepare_alloc_on_static_context():
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    gf = ggopt.new_graph(cd.ctx_compute)
    before = _state(cd, gf)
    with pytest.raises(StateError, match="context is static"):
        cd.opt_ctx.prepare_alloc(cd.ctx_compute, gf, cd.inputs, cd.outputs)
    assert _state(cd, gf) == before


def _dynamic_ctx():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    params = opt.default_params(cd.sched, opt.LossType.SUM)
    params.get_opt_pars = get_test_opt_pars
    return cd, opt.OptContext(params)


def _prepare(cd, ctx):
    ctx_compute = ggopt.Context()
    outputs = ggopt.add(ctx_compute, cd.inputs, cd.weights)
    gf = ggopt.new_graph_custom(ctx_compute, 64, True)
    ggopt.build_forward_expand(gf, outputs)
    ctx.prepare_alloc(ctx_compute, gf, cd.inputs, outputs)
    return ctx_compute, gf, outputs


def test_alloc_dynamic_without_prepare_alloc():
    cd, ctx = _dynamic_ctx()
    before = _state(cd, ctx)
    with pytest.raises(StateError, match="call prepare_alloc"):
        ctx.alloc(True)
    assert _state(cd, ctx) == before
    _prepare(cd, ctx)
    ctx.alloc(True)
    ctx.eval()
    assert cd.w == 2.0
    before = _state(cd, ctx)
    with pytest.raises(StateError, match="call prepare_alloc"):
        ctx.alloc(True)  # the graph of the last eval is gone
    assert cd.w == 2.0 and _state(cd, ctx) == before


def test_prepare_alloc_while_eval_pending_and_bad_args():
    cd, ctx = _dynamic_ctx()
    _prepare(cd, ctx)
    ctx.alloc(False)
    before = _state(cd, ctx)
    with pytest.raises(StateError, match="call eval first"):
        _prepare(cd, ctx)
    assert _state(cd, ctx) == before
    ctx.eval()
    before = _state(cd, ctx)
    with pytest.raises(DTypeError, match="gf must be a Graph"):
        ctx.prepare_alloc(ggopt.Context(), None, cd.inputs, cd.outputs)
    with pytest.raises(DTypeError, match="ctx_compute must be a Context"):
        ctx.prepare_alloc(None, ggopt.new_graph(ggopt.Context()), cd.inputs, cd.outputs)
    assert _state(cd, ctx) == before


def test_dynamic_graph_reused_with_its_loss():
    cd, ctx = _dynamic_ctx()
    ctx_compute, gf, outputs = _prepare(cd, ctx)
    ctx.alloc(True)
    ctx.eval()
    ctx.prepare_alloc(ctx_compute, gf, cd.inputs, outputs)
    before = _state(cd, ctx, ctx_compute, gf)
    with pytest.raises(StateError, match="extra loss terms"):
        ctx.alloc(True)
    assert cd.w == 2.0 and _state(cd, ctx, ctx_compute, gf) == before


def test_dynamic_graph_with_new_parameter():
    cd, ctx = _dynamic_ctx()
    _prepare(cd, ctx)
    ctx.alloc(True)
    ctx.eval()
    extra = cd.ctx_static.new_tensor_1d(ggopt.F32, 1)
    ggopt.set_param(ggopt.set_name(extra, "extra"))
    gb.alloc_ctx_tensors(cd.ctx_static, gb.cpu_init())
    ctx_compute = ggopt.Context()
    outputs = ggopt.add(ctx_compute, ggopt.add(ctx_compute, cd.inputs, cd.weights), extra)
    gf = ggopt.new_graph_custom(ctx_compute, 64, True)
    ggopt.build_forward_expand(gf, outputs)
    ctx.prepare_alloc(ctx_compute, gf, cd.inputs, outputs)
    before = _state(cd, ctx, ctx_compute, gf)
    with pytest.raises(ShapeError, match="'extra' was not in the first graph"):
        ctx.alloc(True)
    assert cd.w == 2.0 and _state(cd, ctx, ctx_compute, gf) == before


# --- epoch and fit ------------------------------------------------------------------------


def test_epoch_errors():
    cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False)
    ds = cd.dataset_unsupervised
    supervised = opt.Dataset(ggopt.F32, ggopt.F32, 1, 1, 6, 1)
    wide = opt.Dataset(ggopt.F32, ggopt.F32, 3, 0, 6, 1)
    before = _state(cd, supervised, wide)
    with pytest.raises(ShapeError, match="takes no labels but the dataset has labels"):
        opt.epoch(cd.opt_ctx, supervised, cd.result, None, -1)
    with pytest.raises(ShapeError, match="idata_split=7"):
        opt.epoch(cd.opt_ctx, ds, cd.result, None, 7)
    with pytest.raises(ShapeError, match="3 elements but inputs.ne"):
        opt.epoch(cd.opt_ctx, wide, cd.result, None, -1)
    with pytest.raises(DTypeError, match="OptContext"):
        opt.epoch(None, ds, cd.result, None, -1)
    assert cd.w == 3.0 and cd.result.ndata == 0
    assert _state(cd, supervised, wide) == before
    dyn_cd, dynamic = _dynamic_ctx()
    before = _state(dyn_cd, dynamic, ds)
    with pytest.raises(StateError, match="requires static graphs"):
        opt.epoch(dynamic, ds, None, None, -1)
    assert _state(dyn_cd, dynamic, ds) == before


def test_epoch_batch_not_dividing_dataset():
    cd = make_ctx_data(opt.OptimizerType.SGD, nbatch_physical=4, nbatch_logical=4,
                       batch_axis=True)
    before = _state(cd)
    with pytest.raises(ShapeError, match="ndata=6 is not a multiple"):
        opt.epoch(cd.opt_ctx, cd.dataset_unsupervised, cd.result, None, -1)
    assert cd.w == 3.0 and _state(cd) == before


@pytest.mark.parametrize(
    "nbatch_logical, nbatch_physical, val_split, match",
    [
        (3, 2, 0.0, "not a multiple of the physical batch size"),
        (4, 2, 0.0, "ndata=6 is not a multiple of nbatch_logical=4"),
        (1, 1, 1.0, r"val_split must be in \[0, 1\)"),
        (1, 1, -0.1, r"val_split must be in \[0, 1\)"),
        (1, 1, math.nan, r"val_split must be in \[0, 1\)"),
        (0, 1, 0.0, "must be >= 1"),
    ],
)
def test_fit_errors(nbatch_logical, nbatch_physical, val_split, match):
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, nbatch_physical=nbatch_physical,
                       batch_axis=True)
    ds = cd.dataset_unsupervised
    exc = InvalidValueError if "val_split" in match else ShapeError
    before = _state(cd)
    with pytest.raises(exc, match=match):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, ds, opt.LossType.SUM,
                opt.OptimizerType.SGD, get_test_opt_pars, 1, nbatch_logical, val_split, True)
    assert cd.w == 3.0 and ds.permutation.tolist() == list(range(6))
    assert _state(cd) == before


def test_fit_checks_dataset_before_shuffling():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    for ds, match in ((make_supervised(1), "2 elements"),
                      (opt.Dataset(ggopt.F32, ggopt.F32, 1, 1, 6, 1), "takes no labels")):
        before = _state(cd, ds)
        with pytest.raises(ShapeError, match=match):
            opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, ds, opt.LossType.SUM)
        assert ds.permutation.tolist() == list(range(6))
        assert _state(cd, ds) == before


def test_fit_argument_types():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    args = (cd.sched, cd.ctx_compute, cd.inputs, cd.outputs)
    before = _state(cd)
    with pytest.raises(DTypeError, match="dataset must be a Dataset"):
        opt.fit(*args, None)
    with pytest.raises(DTypeError, match="val_split must be a float"):
        opt.fit(*args, cd.dataset_unsupervised, val_split="most")
    with pytest.raises(InvalidValueError, match="nepoch must be >= 0"):
        opt.fit(*args, cd.dataset_unsupervised, nepoch=-1)
    assert cd.w == 3.0 and _state(cd) == before
