"""Seconds per MNIST-FC epoch, in one process or data-parallel, and the all-reduce's share.

    python bench/dist_epoch.py --data DIR --threads 2               # 1 process x 2 threads
    mpiexec -n 2 python bench/dist_epoch.py --data DIR --threads 1  # 2 ranks x 1 thread

Trains ggml's recipe (logical batch 1000 in physical batches of 500, 5 % validation) for
``--epochs`` epochs and prints, per epoch, the wall time and (data-parallel) the seconds spent in
the gradient all-reduce, which include waiting for the slower rank. Then it times the
all-reduce alone on the same number of bytes (``--repeat`` times, after a barrier): the
transfer cost without the waiting. Rank 0 prints; a plain script, not a pytest benchmark.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ggopt
from ggopt import distributed as dist
from ggopt.backend import Scheduler, cpu_init
from ggopt.models.mnist import data as mnist_data
from ggopt.models.mnist import model as mnist_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="full MNIST directory (default: the bundled subset)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args()
    ggopt.set_n_threads(args.threads)
    comm = dist.mpi_world() if dist.launched_by_mpi() else None
    root = comm is None or comm.rank == 0
    images, labels = mnist_data.load_split(args.data, "train")
    ds = mnist_data.make_dataset(images, labels, 10, mnist_model.NBATCH_LOGICAL)
    m = mnist_model.build_model("mnist-fc", Scheduler([cpu_init()]))
    mnist_model.init_params(m, 0)
    nsteps = 0
    for _ in range(args.epochs):
        before = 0.0 if comm is None else comm.stats.seconds
        history = mnist_model.train(m, ds, 1, silent=True, comm=comm)
        steps = int(np.float32(0.95) * np.float32(ds.ndata // mnist_model.NBATCH_LOGICAL))
        nsteps += steps
        line = f"epoch: {history.seconds[0]:.3f} s, {steps} optimizer steps"
        if comm is not None:
            spent = comm.stats.seconds - before
            line += (f", all-reduce (incl. waiting) {spent:.3f} s = "
                     f"{spent / steps * 1e3:.2f} ms/step")
        if root:
            print(line, flush=True)
    if comm is None:
        return
    nbytes = comm.stats.bytes // comm.stats.calls
    buf = np.zeros(nbytes // 4, dtype=np.float32)
    times = []
    for _ in range(args.repeat):
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce_sum_(buf)
        times.append(time.perf_counter() - t0)
    if root:
        print(f"all-reduce alone: {nbytes} bytes, min {min(times) * 1e3:.3f} ms, median "
              f"{np.median(times) * 1e3:.3f} ms over {args.repeat} calls", flush=True)


if __name__ == "__main__":
    main()
