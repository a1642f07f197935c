"""Scenarios run by tests/distributed/test_mpi.py, one process per rank (under ``mpiexec -n N``).

``python tests/support/dist_worker.py SCENARIO OUTDIR [ARGS...]``. Rank 0 writes its results into
OUTDIR; a rank that catches a GgoptError writes ``<ErrorType>: <message>`` to OUTDIR/error.R
and exits 3.
Without an MPI launcher the scenario runs in one process, with no communicator.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import ggopt
from ggopt import distributed as dist
from ggopt import ops as g
from ggopt.backend import Scheduler, alloc_ctx_tensors, cpu_init, tensor_get, tensor_set
from ggopt.models.mnist import data as mnist_data
from ggopt.models.mnist import model as mnist_model
from ggopt.opt import Dataset, LossType, OptimizerType, get_default_optimizer_params


def world() -> dist.Communicator | None:
    return dist.mpi_world() if dist.launched_by_mpi() else None


def rank_of(comm) -> int:
    return 0 if comm is None else comm.rank


def mnist_fc(comm, nbatch_logical: int, nimages: int, val_split: float, get_opt_pars=None):
    """Train MNIST-FC for one epoch on the bundled subset; return (model, history)."""
    images, labels = mnist_data.load_split(None, "train")
    ds = mnist_data.make_dataset(images[:nimages], labels[:nimages], 10, nbatch_logical)
    m = mnist_model.build_model("mnist-fc", Scheduler([cpu_init()]))
    mnist_model.init_params(m, seed=0)
    history = ggopt.opt.fit(
        m.sched, m.ctx_compute, m.images, m.logits, ds, LossType.CROSS_ENTROPY,
        OptimizerType.ADAMW, get_opt_pars or get_default_optimizer_params, 1, nbatch_logical,
        val_split, True, comm=comm,
    )
    return m, history


def save_fit(outdir: str, m, history) -> None:
    arrays = {f"w:{k}": v for k, v in mnist_model.get_params(m).items()}
    for name in ("train_loss", "train_loss_unc", "train_acc", "val_loss", "val_acc"):
        arrays[f"h:{name}"] = np.array(getattr(history, name))
    np.savez(os.path.join(outdir, "result.npz"), **arrays)


def scenario_fit(comm, outdir: str, nbatch_logical: str, nimages: str) -> None:
    m, history = mnist_fc(comm, int(nbatch_logical), int(nimages), 0.25)
    if rank_of(comm) == 0:
        save_fit(outdir, m, history)


def failing_opt_pars(comm, action: str):
    """get_opt_pars that makes rank 1 fail at the second optimizer step."""
    calls = [0]

    def get_opt_pars(epoch: int):
        calls[0] += 1
        if rank_of(comm) == 1 and calls[0] == 2:
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if action == "stall":  # far longer than the watchdog's timeout
                time.sleep(60)
            raise RuntimeError("rank 1 fails on purpose in the middle of the epoch")
        return get_default_optimizer_params(epoch)

    return get_opt_pars


def scenario_fault(comm, outdir: str, action: str) -> None:
    sys.stderr.write(f"worker: {comm.describe()}\n")
    mnist_fc(comm, 1000, 4000, 0.0, failing_opt_pars(comm, action))


def scenario_check(comm, outdir: str, corrupt: str) -> None:
    """Consistency check on every step; with corrupt=yes rank 1 nudges a weight first."""
    comm.check_every = 1
    holder = {}

    def get_opt_pars(epoch: int):
        if corrupt == "yes" and comm.rank == 1 and "m" in holder:
            w = holder["m"].params["fc2.bias"]
            tensor_set(w, tensor_get(w) + np.float32(1e-3))
        return get_default_optimizer_params(epoch)

    images, labels = mnist_data.load_split(None, "train")
    ds = mnist_data.make_dataset(images[:2000], labels[:2000], 10, 1000)
    m = mnist_model.build_model("mnist-fc", Scheduler([cpu_init()]))
    holder["m"] = m
    mnist_model.init_params(m, seed=comm.rank)  # different on purpose: rank 0's are broadcast
    ggopt.opt.fit(m.sched, m.ctx_compute, m.images, m.logits, ds, LossType.CROSS_ENTROPY,
                  OptimizerType.ADAMW, get_opt_pars, 2, 1000, 0.0, True, comm=comm)
    if comm.rank == 0:
        open(os.path.join(outdir, "ok"), "w").close()


def linear(comm, nout: int, ndata: int, opt_period: int) -> None:
    """A linear model trained by epoch() on random data (the misuse scenarios)."""
    nin, nbatch = 6, 4
    sched = Scheduler([cpu_init()])
    ctx_static, ctx_compute = ggopt.Context(), ggopt.Context()
    x = ctx_static.new_tensor_2d(ggopt.F32, nin, nbatch)
    w = g.set_name(ctx_static.new_tensor_2d(ggopt.F32, nin, nout), "w")
    g.set_input(x)
    g.set_param(w)
    alloc_ctx_tensors(ctx_static, sched.get_backend(0))
    tensor_set(w, np.full((nout, nin), 0.1, np.float32))
    y = g.mul_mat(ctx_compute, w, x)
    params = ggopt.opt.default_params(sched, LossType.MEAN_SQUARED_ERROR)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, x, y
    params.opt_period, params.comm = opt_period, comm
    ds = Dataset(ggopt.F32, ggopt.F32, nin, nout, ndata, 1)
    ds.data.numpy()[:] = np.random.default_rng(0).standard_normal((ndata, nin))
    ds.labels.numpy()[:] = 1.0
    with ggopt.opt.OptContext(params) as opt_ctx:
        ggopt.opt.epoch(opt_ctx, ds, ggopt.opt.Result(), None, -1)


def scenario_misuse(comm, outdir: str, what: str) -> None:
    odd = comm.rank == 1
    nout = 3 if odd and what == "shape" else 2
    ndata = 24 if odd and what == "ndata" else 16
    opt_period = 4 if odd and what == "period" else 2
    linear(comm, nout, ndata, opt_period)


def scenario_dynamic(comm, outdir: str) -> None:
    """A linear model on dynamic graphs (a fresh graph per micro-batch), opt_period 2."""
    nin, nout, nbatch, ndata, period = 6, 2, 4, 32, 2
    size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
    sched = Scheduler([cpu_init()])
    ctx_static = ggopt.Context()
    w = g.set_name(ctx_static.new_tensor_2d(ggopt.F32, nin, nout), "w")
    g.set_param(w)
    alloc_ctx_tensors(ctx_static, sched.get_backend(0))
    tensor_set(w, np.random.default_rng(1).standard_normal((nout, nin)).astype(np.float32))
    ds = Dataset(ggopt.F32, ggopt.F32, nin, nout, ndata, 1)
    data_rng = np.random.default_rng(2)
    ds.data.numpy()[:] = data_rng.standard_normal((ndata, nin))
    ds.labels.numpy()[:] = data_rng.standard_normal((ndata, nout))
    params = ggopt.opt.default_params(sched, LossType.MEAN_SQUARED_ERROR)
    params.opt_period, params.comm = period, comm
    result = ggopt.opt.Result()
    with ggopt.opt.OptContext(params) as opt_ctx:
        local = period // size
        for k in range(ndata // nbatch // period):
            for j in range(local):
                ctx = ggopt.Context()
                x = ctx.new_tensor_2d(ggopt.F32, nin, nbatch)
                g.set_input(x)
                y = g.mul_mat(ctx, w, x)
                gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, True)
                ggopt.build_forward_expand(gf, y)
                opt_ctx.prepare_alloc(ctx, gf, x, y)
                opt_ctx.alloc(True)
                ds.get_batch(x, opt_ctx.labels, k * period + rank * local + j)
                opt_ctx.eval(result)
    if rank == 0:
        np.save(os.path.join(outdir, "w.npy"), tensor_get(w))


def scenario_size1(comm, outdir: str) -> None:
    """A communicator of one rank changes nothing: same bits, same history, comm is None."""
    from mpi4py import MPI

    runs = []
    for c in (None, dist.Communicator(MPI.COMM_SELF), dist.mpi_world()):
        assert c is None or c.size == 1
        m, history = mnist_fc(c, 1000, 3000, 1 / 3)
        runs.append((mnist_model.get_params(m), history))
    params = ggopt.opt.default_params(Scheduler([cpu_init()]), LossType.MEAN)
    params.comm = dist.Communicator(MPI.COMM_SELF)
    with ggopt.opt.OptContext(params) as opt_ctx:
        assert opt_ctx.comm is None
    (w0, h0), *others = runs
    for w, h in others:
        h.seconds = h0.seconds
        assert h == h0, (h, h0)
        for k in w0:
            assert np.array_equal(w[k], w0[k]), k
    open(os.path.join(outdir, "ok"), "w").close()


def main() -> int:
    scenario, outdir, *args = sys.argv[1:]
    ggopt.set_n_threads(1)
    comm = world()
    try:
        globals()[f"scenario_{scenario}"](comm, outdir, *args)
    except ggopt.GgoptError as exc:
        with open(os.path.join(outdir, f"error.{rank_of(comm)}"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
