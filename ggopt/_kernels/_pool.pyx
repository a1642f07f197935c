"""Pooling kernels: pool_2d and pool_2d_back (ggml_pool_2d, MAX and AVG).

float32 only. Arrays are in NumPy order (a ggml ``ne=[W, H, C, N]`` tensor is ``(N, C, H, W)``).
Inputs may have any byte strides; outputs are C-contiguous and are never allocated here. Each
kernel releases the GIL and runs an OpenMP ``prange`` over image planes, so no two threads ever
write the same element. Each kernel checks its shapes (the output shape must be the one ggml
computes from the input and the window), window parameters and thread count before it writes
anything (ShapeError / InvalidValueError).

Parameter names follow ggml: index 0 acts on the width (last axis), index 1 on the height.
"""

from cython.parallel cimport prange
from libc.float cimport FLT_MAX
from libc.string cimport memset

from ggopt._kernels._common cimport (
    check_n_threads,
    check_positive,
    check_shape,
    check_strides_pads_dilations,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import InvalidValueError

cdef enum:
    C_POOL_MAX = 0
    C_POOL_AVG = 1

POOL_MAX = C_POOL_MAX
POOL_AVG = C_POOL_AVG

# Below this much work (output elements times window size) a kernel runs on the calling thread.
cdef Py_ssize_t MIN_PARALLEL_WORK = min_parallel_work(1 << 12)


cdef inline Py_ssize_t _pool_out(Py_ssize_t size, int k, int s, int p) noexcept nogil:
    """ggml's pooling output length (the quotient truncates toward zero, as in ggml)."""
    cdef Py_ssize_t out = (size + 2 * <Py_ssize_t>p - k) / s + 1
    return out if out > 0 else 0


cdef int _check_pool(str fn, int op, int k0, int k1, int s0, int s1, int p0,
                     int p1) except -1:
    if op != C_POOL_MAX and op != C_POOL_AVG:
        raise InvalidValueError(f"{fn}: op must be POOL_MAX ({C_POOL_MAX}) or POOL_AVG "
                                f"({C_POOL_AVG}), got {op}")
    check_positive(fn, "k0 (window width)", k0)
    check_positive(fn, "k1 (window height)", k1)
    check_strides_pads_dilations(fn, s0, s1, p0, p1, 1, 1)
    return 0


cdef inline bint _is_max_2x2(int op, int k0, int k1, int s0, int s1, int p0, int p1,
                             Py_ssize_t sx, Py_ssize_t IH, Py_ssize_t IW, Py_ssize_t OH,
                             Py_ssize_t OW) noexcept nogil:
    """True when the 2x2 stride-2 MAX fast path applies: every window lies inside ``x``
    (a 1-pixel-wide input still gets one clipped window) and ``x`` rows are contiguous."""
    return (op == C_POOL_MAX and k0 == 2 and k1 == 2 and s0 == 2 and s1 == 2 and p0 == 0
            and p1 == 0 and sx == <Py_ssize_t>sizeof(float) and 2 * OH <= IH and 2 * OW <= IW)


cdef void _pool_plane(const char* xp, Py_ssize_t sy, Py_ssize_t sx, Py_ssize_t IH,
                      Py_ssize_t IW, float* out, Py_ssize_t OH, Py_ssize_t OW, int op,
                      int k0, int k1, int s0, int s1, int p0, int p1) noexcept nogil:
    """Pool one (IH, IW) plane into ``out`` (OH, OW)."""
    cdef Py_ssize_t oy, ox, iy, ix, ky, kx, ky_lo, ky_hi, kx_lo, kx_hi
    cdef const char* xrow
    cdef float res, v
    cdef float ka = <float>(k0 * k1)
    for oy in range(OH):
        iy = oy * s1 - p1
        ky_lo = 0 if iy >= 0 else -iy
        ky_hi = k1 if iy + k1 <= IH else IH - iy
        for ox in range(OW):
            ix = ox * s0 - p0
            kx_lo = 0 if ix >= 0 else -ix
            kx_hi = k0 if ix + k0 <= IW else IW - ix
            if op == C_POOL_MAX:
                res = -FLT_MAX
                for ky in range(ky_lo, ky_hi):
                    xrow = xp + (iy + ky) * sy
                    for kx in range(kx_lo, kx_hi):
                        v = (<const float*>(xrow + (ix + kx) * sx))[0]
                        res = v if v > res else res
            else:
                res = 0.0
                for ky in range(ky_lo, ky_hi):
                    xrow = xp + (iy + ky) * sy
                    for kx in range(kx_lo, kx_hi):
                        res = res + (<const float*>(xrow + (ix + kx) * sx))[0]
                res = res / ka
            out[oy * OW + ox] = res


cdef void _max_pool_2x2_plane(const char* xp, Py_ssize_t sy, float* out, Py_ssize_t OH,
                              Py_ssize_t OW) noexcept nogil:
    """MAX pool with k=2, s=2, p=0 over a plane whose rows are contiguous."""
    cdef Py_ssize_t oy, ox
    cdef const float* r0
    cdef const float* r1
    cdef float res, v
    for oy in range(OH):
        r0 = <const float*>(xp + 2 * oy * sy)
        r1 = <const float*>(xp + (2 * oy + 1) * sy)
        for ox in range(OW):
            # Same scan order and strict '>' as the general loop.
            res = -FLT_MAX
            v = r0[2 * ox]
            res = v if v > res else res
            v = r0[2 * ox + 1]
            res = v if v > res else res
            v = r1[2 * ox]
            res = v if v > res else res
            v = r1[2 * ox + 1]
            res = v if v > res else res
            out[oy * OW + ox] = res


def pool_2d(const float[:, :, :, :] x not None, float[:, :, :, ::1] dst not None, int op, int k0,
            int k1, int s0, int s1, int p0, int p1, int n_threads):
    """2-D max or average pooling over the last two axes.

    Parameters
    ----------
    x : (N, C, IH, IW) float32, any strides
    dst : (N, C, OH, OW) float32, C-contiguous, overwritten
    op : int
        ``POOL_MAX`` (starts at ``-FLT_MAX``, padding skipped, NaN never wins) or
        ``POOL_AVG`` (sum of the in-bounds cells divided by ``k0*k1``).
    k0, k1, s0, s1, p0, p1 : int
        Window, stride and padding (index 0: width, 1: height).
    n_threads : int

    ggml: ggml_compute_forward_pool_2d
    """
    cdef str fn = "pool_2d (ggml_pool_2d)"
    check_n_threads(fn, n_threads)
    _check_pool(fn, op, k0, k1, s0, s1, p0, p1)
    cdef Py_ssize_t IH = x.shape[2], IW = x.shape[3]
    check_shape(fn, "dst", dst.shape, 4, x.shape[0], x.shape[1], _pool_out(IH, k1, s1, p1),
                _pool_out(IW, k0, s0, p0))
    cdef Py_ssize_t N = dst.shape[0], C = dst.shape[1], OH = dst.shape[2], OW = dst.shape[3]
    cdef Py_ssize_t nplanes = N * C, p
    if nplanes * OH * OW == 0:
        return
    cdef float* db = &dst[0, 0, 0, 0]
    if IH == 0 or IW == 0:
        # Every window is empty: MAX keeps its start value, AVG its zero sum.
        for p in range(nplanes * OH * OW):
            db[p] = -FLT_MAX if op == C_POOL_MAX else 0.0
        return
    cdef const char* xb = <const char*>&x[0, 0, 0, 0]
    cdef Py_ssize_t sn = x.strides[0], sc = x.strides[1], sy = x.strides[2], sx = x.strides[3]
    cdef bint fast = _is_max_2x2(op, k0, k1, s0, s1, p0, p1, sx, IH, IW, OH, OW)
    # planes go to the threads dynamically: one slowed by another process holds up no other
    for p in prange(nplanes, nogil=True, schedule="dynamic", chunksize=8,
                    num_threads=n_threads,
                    use_threads_if=nplanes * OH * OW * k0 * k1 >= MIN_PARALLEL_WORK):
        if fast:
            _max_pool_2x2_plane(xb + (p // C) * sn + (p % C) * sc, sy, db + p * OH * OW,
                                OH, OW)
        else:
            _pool_plane(xb + (p // C) * sn + (p % C) * sc, sy, sx, IH, IW,
                        db + p * OH * OW, OH, OW, op, k0, k1, s0, s1, p0, p1)


cdef inline Py_ssize_t _pick(bint take, Py_ssize_t new, Py_ssize_t old) noexcept nogil:
    """``new if take else old`` in arithmetic, so the compiler cannot turn it into a branch
    (a mispredicted branch per window cell costs more than the memory traffic)."""
    return old + take * (new - old)


cdef void _pool_back_plane(const char* gp, Py_ssize_t gsy, Py_ssize_t gsx, Py_ssize_t OH,
                           Py_ssize_t OW, const char* xp, Py_ssize_t sy, Py_ssize_t sx,
                           float* plane, Py_ssize_t IH, Py_ssize_t IW, int op,
                           int k0, int k1, int s0, int s1, int p0, int p1) noexcept nogil:
    """Route the gradient of one pooled (OH, OW) plane back onto ``plane`` (IH, IW)."""
    cdef Py_ssize_t oy, ox, iy, ix, ky, kx, ky_lo, ky_hi, kx_lo, kx_hi, best
    cdef const char* xrow
    cdef float gv, v, res
    cdef float ka = <float>(k0 * k1)
    memset(plane, 0, IH * IW * sizeof(float))
    for oy in range(OH):
        iy = oy * s1 - p1
        ky_lo = 0 if iy >= 0 else -iy
        ky_hi = k1 if iy + k1 <= IH else IH - iy
        for ox in range(OW):
            ix = ox * s0 - p0
            kx_lo = 0 if ix >= 0 else -ix
            kx_hi = k0 if ix + k0 <= IW else IW - ix
            gv = (<const float*>(gp + oy * gsy + ox * gsx))[0]
            if op == C_POOL_MAX:
                # First strict maximum in scan order; none above -FLT_MAX drops the gradient.
                res = -FLT_MAX
                best = 0
                for ky in range(ky_lo, ky_hi):
                    xrow = xp + (iy + ky) * sy
                    for kx in range(kx_lo, kx_hi):
                        v = (<const float*>(xrow + (ix + kx) * sx))[0]
                        best = _pick(v > res, (iy + ky) * IW + ix + kx, best)
                        res = v if v > res else res
                if res > -FLT_MAX:
                    plane[best] += gv
            else:
                gv = gv / ka
                for ky in range(ky_lo, ky_hi):
                    for kx in range(kx_lo, kx_hi):
                        plane[(iy + ky) * IW + ix + kx] += gv


cdef extern from *:
    """
    #include <float.h>
    #include <stdint.h>
    #include <string.h>

    static inline uint32_t ggopt_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
    static inline float ggopt_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
    /* mask ? t : f, for a mask of all ones or all zeros, without a branch */
    static inline float ggopt_select(uint32_t mask, float t, float f) {
        return ggopt_u2f((ggopt_f2u(t) & mask) | (ggopt_f2u(f) & ~mask));
    }

    /* One row of 2x2 stride-2 MAX windows of pool_2d_back: the window over r0[2j..2j+1] and
       r1[2j..2j+1] sends g[j] (at byte stride gs) to its first strict maximum in scan order (r0
       before r1, left before right), i.e. to the last cell that raised the running maximum, and 0
       to its other cells; a window where nothing beats -FLT_MAX gets 0 everywhere. Bit masks hand
       g[j] down from the last cell to the first: no branch, and the loop vectorizes
       (GGOPT_MULTIVERSION). */
    GGOPT_ROW_INLINE void ggopt_max_pool_2x2_back_cells(
            const float *restrict r0, const float *restrict r1, const char *restrict g,
            Py_ssize_t gs, float *restrict q0, float *restrict q1, Py_ssize_t n) {
        for (Py_ssize_t j = 0; j < n; j++) {
            float a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
            uint32_t ta = -(uint32_t)(a > -FLT_MAX);
            float m = ggopt_select(ta, a, -FLT_MAX);
            uint32_t tb = -(uint32_t)(b > m);
            m = ggopt_select(tb, b, m);
            uint32_t tc = -(uint32_t)(c > m);
            m = ggopt_select(tc, c, m);
            uint32_t td = -(uint32_t)(d > m);
            uint32_t left = ggopt_f2u(*(const float *)(g + j * gs));
            q1[2 * j + 1] = ggopt_u2f(left & td);
            left &= ~td;
            q1[2 * j] = ggopt_u2f(left & tc);
            left &= ~tc;
            q0[2 * j + 1] = ggopt_u2f(left & tb);
            left &= ~tb;
            q0[2 * j] = ggopt_u2f(left & ta);
        }
    }

    GGOPT_MULTIVERSION
    static void ggopt_max_pool_2x2_back_row(const float *r0, const float *r1, const char *g,
                                            Py_ssize_t gs, float *q0, float *q1, Py_ssize_t n) {
        if (gs == (Py_ssize_t)sizeof(float))  /* contiguous g: plain vector loads */
            ggopt_max_pool_2x2_back_cells(r0, r1, g, sizeof(float), q0, q1, n);
        else
            ggopt_max_pool_2x2_back_cells(r0, r1, g, gs, q0, q1, n);
    }
    """
    void _max_pool_2x2_back_row "ggopt_max_pool_2x2_back_row" (
        const float* r0, const float* r1, const char* g, Py_ssize_t gs, float* q0, float* q1,
        Py_ssize_t n) noexcept nogil


cdef void _max_pool_2x2_back_plane(const char* gp, Py_ssize_t gsy, Py_ssize_t gsx,
                                   Py_ssize_t OH, Py_ssize_t OW, const char* xp, Py_ssize_t sy,
                                   float* plane, Py_ssize_t IH, Py_ssize_t IW) noexcept nogil:
    """:func:`_pool_back_plane` for MAX, k=2, s=2, p=0 and contiguous ``x`` rows.

    The windows do not overlap, so each one writes all four of its cells (see
    ``ggopt_max_pool_2x2_back_row``); only the rows and columns no window covers are cleared
    separately.
    """
    cdef Py_ssize_t oy, j
    cdef float* q0
    for oy in range(OH):
        q0 = plane + 2 * oy * IW
        _max_pool_2x2_back_row(<const float*>(xp + 2 * oy * sy),
                               <const float*>(xp + (2 * oy + 1) * sy),
                               gp + oy * gsy, gsx, q0, q0 + IW, OW)
        for j in range(2 * OW, IW):
            q0[j] = 0.0
            q0[IW + j] = 0.0
    memset(plane + 2 * OH * IW, 0, (IH - 2 * OH) * IW * sizeof(float))


def pool_2d_back(const float[:, :, :, :] g not None, const float[:, :, :, :] x not None,
                 float[:, :, :, ::1] dst not None, int op, int k0, int k1, int s0, int s1,
                 int p0, int p1, int n_threads):
    """Gradient of :func:`pool_2d` with respect to its input.

    Parameters
    ----------
    g : (N, C, OH, OW) float32, any strides
        Gradient of the pooled output.
    x : (N, C, IH, IW) float32, any strides
        The forward input (MAX needs it to find each window's maximum).
    dst : (N, C, IH, IW) float32, C-contiguous, overwritten. MAX: each window's whole
        gradient goes to its first strict maximum (ky outer, kx inner), ``+=`` where windows
        overlap. AVG: ``g / (k0*k1)`` goes to every in-bounds cell of the window.
    op, k0, k1, s0, s1, p0, p1 : int
        As for :func:`pool_2d`.
    n_threads : int

    ggml: ggml_compute_forward_pool_2d_back
    """
    cdef str fn = "pool_2d_back (ggml_pool_2d_back)"
    check_n_threads(fn, n_threads)
    _check_pool(fn, op, k0, k1, s0, s1, p0, p1)
    cdef Py_ssize_t N = dst.shape[0], C = dst.shape[1], IH = dst.shape[2], IW = dst.shape[3]
    check_shape(fn, "x", x.shape, 4, N, C, IH, IW)
    check_shape(fn, "g", g.shape, 4, N, C, _pool_out(IH, k1, s1, p1), _pool_out(IW, k0, s0, p0))
    cdef Py_ssize_t OH = g.shape[2], OW = g.shape[3]
    cdef Py_ssize_t nplanes = N * C, p
    if nplanes * IH * IW == 0:
        return
    cdef float* db = &dst[0, 0, 0, 0]
    if OH == 0 or OW == 0:
        memset(db, 0, nplanes * IH * IW * sizeof(float))
        return
    cdef const char* gb = <const char*>&g[0, 0, 0, 0]
    cdef const char* xb = <const char*>&x[0, 0, 0, 0]
    cdef Py_ssize_t gsn = g.strides[0], gsc = g.strides[1], gsy = g.strides[2]
    cdef Py_ssize_t gsx = g.strides[3]
    cdef Py_ssize_t sn = x.strides[0], sc = x.strides[1], sy = x.strides[2], sx = x.strides[3]
    cdef bint fast = _is_max_2x2(op, k0, k1, s0, s1, p0, p1, sx, IH, IW, OH, OW)
    # planes go to the threads dynamically: one slowed by another process holds up no other
    for p in prange(nplanes, nogil=True, schedule="dynamic", chunksize=8,
                    num_threads=n_threads,
                    use_threads_if=nplanes * OH * OW * k0 * k1 >= MIN_PARALLEL_WORK):
        if fast:
            _max_pool_2x2_back_plane(gb + (p // C) * gsn + (p % C) * gsc, gsy, gsx, OH, OW,
                                     xb + (p // C) * sn + (p % C) * sc, sy,
                                     db + p * IH * IW, IH, IW)
        else:
            _pool_back_plane(gb + (p // C) * gsn + (p % C) * gsc, gsy, gsx, OH, OW,
                             xb + (p // C) * sn + (p % C) * sc, sy, sx,
                             db + p * IH * IW, IH, IW, op, k0, k1, s0, s1, p0, p1)
