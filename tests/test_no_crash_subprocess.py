"""No public call with an absurd thread count, size or stride kills the interpreter.

Each group of probes runs in a fresh Python process (a segfault or an abort in a kernel or the
OpenMP runtime would end it): every call must raise a GgoptError or work, and afterwards the
process must still compute a graph whose kernels run in parallel, then exit normally.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import numpy as np
import ggopt
from ggopt import backend as gb, opt
F32 = ggopt.F32

def probe(name, call):
    try:
        call()
    except ggopt.GgoptError:
        pass
    print("survived", name, flush=True)

def parallel_compute():
    ctx = ggopt.Context(no_alloc=False)
    a = ctx.new_tensor_2d(F32, 1024, 1024)
    a.numpy()[:] = 1.0
    out = ggopt.sum(ctx, ggopt.relu(ctx, ggopt.scale(ctx, a, 2.0)))
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    gb.Scheduler([gb.cpu_init()]).graph_compute(g)
    assert float(out.numpy()[0]) == 2.0 * 1024 * 1024

def small_ctx():
    ctx = ggopt.Context()
    a = ctx.new_tensor_2d(F32, 8, 8)
    b = ctx.new_tensor_2d(F32, 8, 8)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    return ctx, a, b
"""

GROUPS = {
    "thread counts": """
for n in (10**3, 10**5, 2**31, 2**63, -1, 0):
    probe(f"set_n_threads({n})", lambda: ggopt.set_n_threads(n))
    probe(f"cpu_init({n})", lambda: gb.cpu_init(n))
    probe(f"set_n_threads method({n})", lambda: gb.cpu_init().set_n_threads(n))
parallel_compute()
ggopt.set_n_threads(ggopt.backend.cpu.threads.MAX_N_THREADS)
parallel_compute()
""",
    "sizes": """
probe("host tensor 2^31 x 2^31",
      lambda: ggopt.Context(no_alloc=False).new_tensor_2d(F32, 2**31, 2**31))
probe("host tensor 2^62 bytes", lambda: ggopt.Context(no_alloc=False).new_tensor_1d(F32, 2**60))
def huge_ctx_alloc():
    ctx = ggopt.Context()
    ctx.new_tensor_4d(F32, 2**20, 2**20, 2**20, 2**20)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
probe("alloc_ctx_tensors 2^80 elements", huge_ctx_alloc)
probe("dataset 2^40 rows", lambda: opt.Dataset(F32, F32, 2**10, 1, 2**40, 1))
probe("dataset 2^62 x 2^62", lambda: opt.Dataset(F32, F32, 2**62, 1, 2**62, 1))
probe("buffer 2^63", lambda: gb.cpu_init().alloc_buffer(2**63))
probe("graph size 2^62", lambda: ggopt.new_graph_custom(ggopt.Context(), 2**62, True))
def huge_compute():
    ctx = ggopt.Context()
    a = ctx.new_tensor_2d(F32, 2**31, 2**31)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, ggopt.relu(ctx, a))
    gb.Scheduler([gb.cpu_init()]).graph_compute(g)
probe("compute on 2^62 elements", huge_compute)
probe("scale by 10**400", lambda: ggopt.scale(small_ctx()[0], small_ctx()[1], 10**400))
parallel_compute()
""",
    "strides": """
ctx, a, b = small_ctx()
for nb in (-2**62, -64, -4, 2**31, 2**40, 2**62):
    for off in (0, 128, 2**62, -2**62):
        probe(f"view_2d nb={nb} off={off}", lambda: ggopt.view_2d(ctx, b, 4, 4, nb, off))
        probe(f"view_4d nb={nb} off={off}",
              lambda: ggopt.view_4d(ctx, b, 2, 2, 2, 2, nb, nb, nb, off))
        probe(f"acc nb={nb} off={off}",
              lambda: ggopt.acc(ctx, a, ctx.new_tensor_2d(F32, 2, 2), nb, nb, nb, off))
img = ggopt.Context(no_alloc=False)
k = img.new_tensor_4d(F32, 3, 3, 1, 1)
x = img.new_tensor_4d(F32, 8, 8, 1, 1)
def conv(s, p, d):
    out = ggopt.im2col(img, k, x, s, s, p, p, d, d)
    g = ggopt.new_graph(img)
    ggopt.build_forward_expand(g, out)
    gb.Scheduler([gb.cpu_init()]).graph_compute(g)
for s, p, d in ((2**31 - 1, 2**30, 1), (2**31, 0, 1), (1, 2**31, 1), (1, 0, 2**31),
                (2**31 - 1, 2**31 - 1, 2**31 - 1), (1, 2**20, 1)):
    probe(f"im2col s={s} p={p} d={d}", lambda: conv(s, p, d))
for kk, s, p in ((0, 1, 0), (-1, 1, 0), (2**31, 1, 0), (2, 2**31, 0), (2, 1, 2**31)):
    probe(f"pool_2d k={kk} s={s} p={p}",
          lambda: ggopt.pool_2d(img, x, ggopt.OP_POOL_AVG, kk, kk, s, s, p, p))
parallel_compute()
""",
}


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    script = textwrap.dedent(PRELUDE) + textwrap.dedent(code) + '\nprint("ok")\n'
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("group", list(GROUPS))
def test_absurd_arguments_never_kill_the_interpreter(group):
    out = _run(GROUPS[group])
    last = out.stdout.strip().splitlines()[-1:] or ["(nothing)"]
    assert out.returncode == 0, (f"exit {out.returncode} after: {last[0]}\n"
                                 f"{out.stderr[-2000:]}")
    assert out.stdout.rstrip().endswith("ok")


@pytest.mark.parametrize("value", ["100000", "2147483648"])
def test_absurd_omp_num_threads_never_kills_the_interpreter(value):
    out = _run("""
assert 1 <= ggopt.get_n_threads() <= ggopt.backend.cpu.threads.MAX_N_THREADS
parallel_compute()
""", OMP_NUM_THREADS=value)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.rstrip().endswith("ok")
