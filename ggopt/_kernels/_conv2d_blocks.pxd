# The blocks of the direct convolution (_conv2d.pyx): its geometry, and the copies between
# images and the patch matrices that BLAS multiplies.
#
# A patch matrix P has one row per kernel tap (ic, kh, kw), row index (ic*KH + kh)*KW + kw,
# and one column per output position of a block. It comes in two layouts:
#
# - position blocks (any geometry): columns are the output positions m = oh*OW + ow of
#   [m0, m1); P is built straight from the strided input, 0 in the padding.
# - row blocks (stride 1 along the width, and a padded image of reasonable size): the input is
#   first copied into a zero-padded image (IC, PH, PW) with PW = IW + 2*p0, and a block of
#   output rows gets PW columns per row, the last PW - OW of them junk. Each patch row is
#   then one long copy from the padded image (one per output row when s1 > 1) instead of one
#   short copy per output row and tap; the junk columns are set to 0 where a product sums
#   over positions and dropped from the outputs.

from libc.string cimport memcpy, memset

# (its C header, GGOPT_MULTIVERSION included, must precede the C code below)
from ggopt._kernels._common cimport check_shape

cdef extern from *:
    """
    /* Most rows copied here are short (a few dozen floats): GCC would turn each loop into a
       call to memcpy or memset, which costs more than the copy. This applies to every
       function of the module that includes this file; the long copies call memcpy. */
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC optimize ("no-tree-loop-distribute-patterns")
    #endif

    /* d[i] += s[i]: the row blocks' fold, built for AVX2 as well (GGOPT_MULTIVERSION). */
    GGOPT_MULTIVERSION
    static void ggopt_conv_add_row(float *restrict d, const float *restrict s, Py_ssize_t n) {
        for (Py_ssize_t i = 0; i < n; i++) d[i] += s[i];
    }
    """
    void add_row "ggopt_conv_add_row" (float* d, const float* s, Py_ssize_t n) noexcept nogil


# Floats of patch matrix (or of output gradient block) per block.
cdef enum:
    PATCH_BUDGET = 1 << 15


cdef struct Geometry:
    Py_ssize_t N, IC, IH, IW, OC, OH, OW
    Py_ssize_t M       # OH * OW: output positions per image
    Py_ssize_t KK      # IC * KH * KW: rows of the patch matrix
    int KH, KW, s0, s1, p0, p1, d0, d1
    bint rows          # True: row blocks, else position blocks
    Py_ssize_t units   # what the blocks cut: output rows (OH) or positions (M)
    Py_ssize_t per_block  # units per block (the last block may hold fewer)
    Py_ssize_t PH, PW  # row blocks: the padded image's height and width
    Py_ssize_t chunk   # columns of the largest block (rows: per_block*PW)
    Py_ssize_t pad_size  # floats of the padded image and the slack its last reads run into


# A strided (C, H, W) image: its base pointer and byte strides.
cdef struct Image:
    const char* data
    Py_ssize_t sc, sy, sx


cdef inline Py_ssize_t conv_out(Py_ssize_t size, int k, int s, int p, int d) noexcept nogil:
    """ggml's convolution output length (0 when the dilated window does not fit)."""
    cdef Py_ssize_t span = size + 2 * <Py_ssize_t>p - <Py_ssize_t>d * (k - 1) - 1
    return span // s + 1 if span >= 0 else 0


cdef inline void plan_blocks(Geometry* g) noexcept nogil:
    """Choose the layout and the block sizes of ``g`` (from the shapes alone)."""
    cdef Py_ssize_t width = max(g.KK, g.OC, 1)
    g.PW = g.IW + 2 * <Py_ssize_t>g.p0
    g.PH = max((g.OH - 1) * g.s1 + (g.KH - 1) * <Py_ssize_t>g.d1 + 1, g.IH + g.p1)
    # row blocks only when the junk columns are at most half of a row and the padded image is
    # not much larger than the input and output planes
    g.rows = (g.s0 == 1 and g.OH > 0 and g.PW <= 2 * g.OW and g.PW <= PATCH_BUDGET
              and g.PH * g.PW <= 4 * (g.IH * g.IW + g.M) + 64)
    if g.rows:
        g.units = g.OH
        g.per_block = max(1, min(g.OH, PATCH_BUDGET // (width * g.PW)))
        g.chunk = g.per_block * g.PW
        g.pad_size = g.IC * g.PH * g.PW + (g.KW - 1) * <Py_ssize_t>g.d0
    else:
        g.units = g.M
        g.per_block = max(1, min(g.M, PATCH_BUDGET // width))
        g.chunk = g.per_block
        g.pad_size = 0


cdef inline Image image_at(Image im, Py_ssize_t byte_offset) noexcept nogil:
    im.data = im.data + byte_offset
    return im


# --- position blocks ------------------------------------------------------------------------


cdef inline Py_ssize_t _first_inside(Py_ssize_t off, int s) noexcept nogil:
    """The first output column ``ow`` with ``ow*s + off >= 0``."""
    return 0 if off >= 0 else (-off + s - 1) // s


cdef inline Py_ssize_t _end_inside(Py_ssize_t off, int s, Py_ssize_t size) noexcept nogil:
    """One past the last output column ``ow`` with ``ow*s + off < size`` (0 when none)."""
    return 0 if off > size - 1 else (size - 1 - off) // s + 1


cdef inline Py_ssize_t _clamp(Py_ssize_t v, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    return lo if v < lo else (hi if v > hi else v)


cdef inline void position_patches(const Geometry* g, Image x, float* P, Py_ssize_t m0,
                                  Py_ssize_t m1) noexcept nogil:
    """``P`` (KK, m1 - m0): column ``m - m0`` holds what each tap reads for output position
    ``m`` (0 in the padding)."""
    cdef Py_ssize_t mb = m1 - m0
    cdef Py_ssize_t ic, kh, kw, oh, ow0, ow1, lo, hi, ow, iy, xoff, lo_all, hi_all
    cdef Py_ssize_t oh0 = m0 // g.OW
    cdef float* out
    cdef const char* src
    cdef const float* srcf
    cdef bint unit = x.sx == <Py_ssize_t>sizeof(float) and g.s0 == 1
    for ic in range(g.IC):
        for kh in range(g.KH):
            for kw in range(g.KW):
                xoff = <Py_ssize_t>kw * g.d0 - g.p0
                lo_all = _first_inside(xoff, g.s0)
                hi_all = _end_inside(xoff, g.s0, g.IW)
                # out[ow] is column ow of output row oh, starting at row oh0
                out = P + ((ic * g.KH + kh) * g.KW + kw) * mb - (m0 - oh0 * g.OW)
                oh = oh0
                ow0 = m0 - oh0 * g.OW
                while oh * g.OW + ow0 < m1:
                    ow1 = min(g.OW, m1 - oh * g.OW)
                    iy = oh * g.s1 + <Py_ssize_t>kh * g.d1 - g.p1
                    lo = ow1
                    hi = ow1
                    if 0 <= iy < g.IH:
                        lo = _clamp(lo_all, ow0, ow1)
                        hi = _clamp(hi_all, lo, ow1)
                    for ow in range(ow0, lo):
                        out[ow] = 0.0
                    src = x.data + ic * x.sc + iy * x.sy
                    if unit:
                        srcf = (<const float*>src) + xoff
                        for ow in range(lo, hi):
                            out[ow] = srcf[ow]
                    else:
                        for ow in range(lo, hi):
                            out[ow] = (<const float*>(src + (ow * g.s0 + xoff) * x.sx))[0]
                    for ow in range(hi, ow1):
                        out[ow] = 0.0
                    out += g.OW
                    oh += 1
                    ow0 = 0


cdef inline void position_fold(const Geometry* g, const float* dP, float* dx, Py_ssize_t m0,
                               Py_ssize_t m1) noexcept nogil:
    """Add ``dP`` (KK, m1 - m0) onto the C-contiguous image ``dx`` (IC, IH, IW): the adjoint
    of :func:`position_patches` (entries that fall in the padding are dropped)."""
    cdef Py_ssize_t mb = m1 - m0
    cdef Py_ssize_t ic, kh, kw, oh, ow0, ow1, lo, hi, ow, iy, xoff, lo_all, hi_all
    cdef Py_ssize_t oh0 = m0 // g.OW
    cdef const float* inp
    cdef float* dst
    for ic in range(g.IC):
        for kh in range(g.KH):
            for kw in range(g.KW):
                xoff = <Py_ssize_t>kw * g.d0 - g.p0
                lo_all = _first_inside(xoff, g.s0)
                hi_all = _end_inside(xoff, g.s0, g.IW)
                inp = dP + ((ic * g.KH + kh) * g.KW + kw) * mb - (m0 - oh0 * g.OW)
                oh = oh0
                ow0 = m0 - oh0 * g.OW
                while oh * g.OW + ow0 < m1:
                    ow1 = min(g.OW, m1 - oh * g.OW)
                    iy = oh * g.s1 + <Py_ssize_t>kh * g.d1 - g.p1
                    if 0 <= iy < g.IH:
                        lo = _clamp(lo_all, ow0, ow1)
                        hi = _clamp(hi_all, lo, ow1)
                        dst = dx + (ic * g.IH + iy) * g.IW + xoff
                        if g.s0 == 1:
                            for ow in range(lo, hi):
                                dst[ow] = dst[ow] + inp[ow]
                        else:
                            for ow in range(lo, hi):
                                dst[ow * g.s0] = dst[ow * g.s0] + inp[ow]
                    inp += g.OW
                    oh += 1
                    ow0 = 0


cdef inline const float* position_rows(const Geometry* g, Image a, bint matrix, Py_ssize_t m0,
                                       Py_ssize_t m1, float* scratch, int* ld) noexcept nogil:
    """Columns ``[m0, m1)`` of the (OC, OH*OW) image ``a`` (an output gradient) as a BLAS
    matrix: in place when ``matrix`` (``*ld`` its row stride), else copied into ``scratch``
    (``*ld = m1 - m0``)."""
    cdef Py_ssize_t r, m
    cdef float* d
    if matrix:
        ld[0] = <int>max(a.sc // <Py_ssize_t>sizeof(float), m1 - m0) if g.OC > 1 \
            else <int>(m1 - m0)
        return (<const float*>a.data) + m0
    ld[0] = <int>(m1 - m0)
    for r in range(g.OC):
        d = scratch + r * (m1 - m0)
        for m in range(m0, m1):
            d[m - m0] = (<const float*>(a.data + r * a.sc + (m // g.OW) * a.sy
                                        + (m % g.OW) * a.sx))[0]
    return scratch


# --- row blocks -----------------------------------------------------------------------------


cdef inline bint pad_image(const Geometry* g, Image x, float* pad) noexcept nogil:
    """Copy ``x`` into the interior of the padded image ``pad``, whose border stays 0 from
    its allocation (nothing else writes there); True when every value is finite."""
    cdef Py_ssize_t ic, iy, ix
    cdef float* row
    cdef const char* src
    cdef const float* srcf
    cdef float v
    cdef int nonfinite = 0
    for ic in range(g.IC):
        for iy in range(g.IH):
            row = pad + (ic * g.PH + iy + g.p1) * g.PW + g.p0
            src = x.data + ic * x.sc + iy * x.sy
            if x.sx == <Py_ssize_t>sizeof(float):
                srcf = <const float*>src
                for ix in range(g.IW):
                    v = srcf[ix]
                    row[ix] = v
                    nonfinite = nonfinite | (v - v != 0)  # inf - inf and NaN are NaN
            else:
                for ix in range(g.IW):
                    v = (<const float*>(src + ix * x.sx))[0]
                    row[ix] = v
                    nonfinite = nonfinite | (v - v != 0)
    return nonfinite == 0


cdef inline bint all_finite(const float* a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef int nonfinite = 0
    for i in range(n):
        nonfinite = nonfinite | (a[i] - a[i] != 0)
    return nonfinite == 0


cdef inline const float* _pad_row(const Geometry* g, const float* pad, Py_ssize_t ic,
                                  Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t oh) noexcept nogil:
    """Where tap (ic, kh, kw) reads output row ``oh`` of the padded image."""
    return pad + (ic * g.PH + oh * g.s1 + kh * g.d1) * g.PW + kw * g.d0


cdef inline void zero_junk(const Geometry* g, float* a, Py_ssize_t nrows,
                           Py_ssize_t rb) noexcept nogil:
    """Zero the junk columns of the ``nrows`` rows of the row block ``a`` (rb output rows)."""
    cdef Py_ssize_t r, oh, j
    cdef float* p
    for r in range(nrows):
        p = a + r * rb * g.PW
        for oh in range(rb):
            for j in range(g.OW, g.PW):
                p[oh * g.PW + j] = 0.0


cdef inline void row_patches(const Geometry* g, const float* pad, float* P, Py_ssize_t oh0,
                             Py_ssize_t rb) noexcept nogil:
    """``P`` (KK, rb*PW): the patches of output rows ``[oh0, oh0 + rb)``, junk included."""
    cdef Py_ssize_t L = rb * g.PW
    cdef Py_ssize_t ic, kh, kw, oh
    cdef float* out = P
    for ic in range(g.IC):
        for kh in range(g.KH):
            for kw in range(g.KW):
                if g.s1 == 1:
                    memcpy(out, _pad_row(g, pad, ic, kh, kw, oh0), L * sizeof(float))
                else:
                    for oh in range(rb):
                        memcpy(out + oh * g.PW, _pad_row(g, pad, ic, kh, kw, oh0 + oh),
                               g.PW * sizeof(float))
                out += L


cdef inline void row_fold(const Geometry* g, const float* dP, float* pad, Py_ssize_t oh0,
                          Py_ssize_t rb) noexcept nogil:
    """Add ``dP`` (KK, rb*PW), whose junk columns are 0, onto the padded image: the adjoint
    of :func:`row_patches`."""
    cdef Py_ssize_t L = rb * g.PW
    cdef Py_ssize_t ic, kh, kw, oh
    cdef const float* inp = dP
    for ic in range(g.IC):
        for kh in range(g.KH):
            for kw in range(g.KW):
                if g.s1 == 1:
                    add_row(<float*>_pad_row(g, pad, ic, kh, kw, oh0), inp, L)
                else:
                    for oh in range(rb):
                        add_row(<float*>_pad_row(g, pad, ic, kh, kw, oh0 + oh),
                                inp + oh * g.PW, g.PW)
                inp += L


cdef inline void unpad_image(const Geometry* g, const float* pad, float* dx) noexcept nogil:
    """The interior of the padded image into the C-contiguous image ``dx`` (IC, IH, IW)."""
    cdef Py_ssize_t ic, iy, ix
    cdef const float* row
    cdef float* out
    for ic in range(g.IC):
        for iy in range(g.IH):
            row = pad + (ic * g.PH + iy + g.p1) * g.PW + g.p0
            out = dx + (ic * g.IH + iy) * g.IW
            for ix in range(g.IW):
                out[ix] = row[ix]


cdef inline void rows_to_block(const Geometry* g, Image a, float* out, Py_ssize_t oh0,
                               Py_ssize_t rb) noexcept nogil:
    """``out`` (OC, rb*PW): output rows ``[oh0, oh0 + rb)`` of the (OC, OH, OW) image ``a``
    (an output gradient), junk columns 0."""
    cdef Py_ssize_t oc, oh, ow
    cdef const char* src
    cdef const float* srcf
    cdef float* row
    for oc in range(g.OC):
        for oh in range(rb):
            row = out + (oc * rb + oh) * g.PW
            src = a.data + oc * a.sc + (oh0 + oh) * a.sy
            if a.sx == <Py_ssize_t>sizeof(float):
                srcf = <const float*>src
                for ow in range(g.OW):
                    row[ow] = srcf[ow]
            else:
                for ow in range(g.OW):
                    row[ow] = (<const float*>(src + ow * a.sx))[0]
            for ow in range(g.OW, g.PW):
                row[ow] = 0.0


cdef inline void block_to_rows(const Geometry* g, const float* blk, float* y, Py_ssize_t oh0,
                               Py_ssize_t rb) noexcept nogil:
    """Output rows ``[oh0, oh0 + rb)`` of the C-contiguous (OC, OH, OW) image ``y`` from the
    row block ``blk`` (OC, rb*PW), junk dropped."""
    cdef Py_ssize_t oc, oh, ow
    cdef const float* src
    cdef float* row
    for oc in range(g.OC):
        for oh in range(rb):
            src = blk + (oc * rb + oh) * g.PW
            row = y + (oc * g.OH + oh0 + oh) * g.OW
            for ow in range(g.OW):
                row[ow] = src[ow]
