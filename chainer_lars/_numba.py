"""The CPU loops, compiled with Numba, for native float32 and float64.

:func:`multi_update` updates every array of a group in one call through a
table of addresses (a group of one runs the same loop: every path agrees
bit for bit). Norms accumulate in float64; ``fastmath`` allows only
reassociation (sums) and contraction, so non-finite values propagate as in
NumPy; the ratio and the division by the loss scale round as on the host.
"""

import math

import numba
from numba.core import cgutils
from numba.core import types
from numba.extending import intrinsic
import numpy

from chainer_lars import layout as L
from chainer_lars import ratio


_REDUCE = {'reassoc', 'contract'}
_ELEMENTWISE = {'contract'}
#: Division by 0 gives inf or NaN as in NumPy; Python's error model would
#: test every divisor and keep the loop from being vectorised (7x slower).
_DIVIDES = {'error_model': 'numpy'}

trust_ratio = numba.njit(nogil=True, cache=True)(ratio.trust_ratio)


@numba.njit(nogil=True, cache=True, fastmath=_REDUCE)
def sqnorms(w, g):
    """``(||w||^2, ||g||^2)`` in one pass that reads both arrays."""
    sw = 0.0
    sg = 0.0
    for i in range(w.size):
        x = numpy.float64(w[i])
        y = numpy.float64(g[i])
        sw += x * x
        sg += y * y
    return sw, sg


@numba.njit(nogil=True, cache=True)
def unscale(g, s):
    for i in range(g.size):
        g[i] = g[i] / s


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def scale_add(g, r, w, c):
    """``g <- r g + c w`` (``w`` unread when ``c`` is 0)."""
    if c != 0:
        for i in range(g.size):
            g[i] = r * g[i] + c * w[i]
    else:
        for i in range(g.size):
            g[i] = r * g[i]


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def momentum_step(w, g, v, a, b, momentum, nesterov):
    """``u = a g + b w; v <- m v + u; w <- w - v`` in one pass (Nesterov:
    ``w <- w - (u + m v)``)."""
    for i in range(w.size):
        u = a * g[i] + b * w[i]
        vi = momentum * v[i] + u
        v[i] = vi
        w[i] = w[i] - (u + momentum * vi if nesterov else vi)


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def lamb_direction(w, m, v, c1, c2, eps, wd):
    """LAMB's ``r = (m / c1) / (sqrt(v / c2) + eps) + wd w`` of one
    element."""
    return (m / c1) / (math.sqrt(v / c2) + eps) + wd * w


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def lamb_moment(g, m, v, b1, d1, b2, d2):
    return b1 * m + d1 * g, b2 * v + d2 * (g * g)


@numba.njit(nogil=True, cache=True, fastmath=_REDUCE, **_DIVIDES)
def lamb_moments(w, g, m, v, b1, d1, b2, d2, c1, c2, eps, wd):
    """LAMB's ``m <- b1 m + d1 g``, ``v <- b2 v + d2 g^2`` (``d = 1 - b``)
    and ``(||w||^2, ||r||^2)`` in one pass (the sums alone reassociated)."""
    sw = 0.0
    sr = 0.0
    for i in range(w.size):
        mi, vi = lamb_moment(g[i], m[i], v[i], b1, d1, b2, d2)
        m[i] = mi
        v[i] = vi
        x = numpy.float64(w[i])
        y = numpy.float64(lamb_direction(w[i], mi, vi, c1, c2, eps, wd))
        sw += x * x
        sr += y * y
    return sw, sr


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def lamb_step(w, m, v, a, c1, c2, eps, wd):
    """``w <- w - a r``."""
    for i in range(w.size):
        w[i] = w[i] - a * lamb_direction(w[i], m[i], v[i], c1, c2, eps, wd)


@numba.njit(nogil=True, cache=True)
def lamb_update(table, k, row, obs, w, g, like):
    """Row ``k`` of a LAMB update: ``g`` unscaled in place, the moments,
    ``(ratio, ||w||, ||r||)`` into ``obs`` and the step."""
    # b1, 1 - b1, b2, 1 - b2, c1, c2, eps, wd and the step's rate, rounded
    # to the arrays' dtype as they are stored.
    c = numpy.empty(9, like.dtype)
    if row[L.LOSS_SCALE] != 1.0:
        c[0] = row[L.LOSS_SCALE]
        unscale(g, c[0])
    c[0], c[1] = row[L.BETA1], 1.0 - row[L.BETA1]
    c[2], c[3] = row[L.BETA2], 1.0 - row[L.BETA2]
    c[4], c[5] = row[L.CORRECTION1], row[L.CORRECTION2]
    c[6], c[7] = row[L.EPS], row[L.WEIGHT_DECAY]
    m = _array(table, k, L.V, like)
    v = _array(table, k, L.V2, like)
    w_sq, r_sq = lamb_moments(w, g, m, v, c[0], c[1], c[2], c[3], c[4],
                              c[5], c[6], c[7])
    w_norm, r_norm = math.sqrt(w_sq), math.sqrt(r_sq)
    r = 1.0
    if row[L.ADAPT] != 0.0:
        r = trust_ratio(w_norm, r_norm, 0.0, 0.0, 1.0, 0.0, True,
                        row[L.CLIP_LR])
    obs[k, 0], obs[k, 1], obs[k, 2] = r, w_norm, r_norm
    c[8] = row[L.LR] * r
    lamb_step(w, m, v, c[8], c[4], c[5], c[6], c[7])


@numba.njit(nogil=True, cache=True)
def put_grad(table, k, g, size):
    """Puts ``g`` in row ``k`` if C-contiguous of ``size``; says if it did."""
    if g.size != size or not g.flags.c_contiguous:
        return False
    table[k, L.G] = g.ctypes.data
    table[k, L.SIZE] = size
    return True


@intrinsic
def _void_pointer(typingctx, addr):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@numba.njit(nogil=True, cache=True)
def _array(table, k, column, like):
    return numba.carray(_void_pointer(table[k, column]), table[k, L.SIZE],
                        like.dtype)


@numba.njit(nogil=True, cache=True)
def multi_update(table, rows, obs, like, op):
    """One update (``op``: ``RESCALE``, ``STEP`` or ``LAMB``) of every array
    of a table.

    ``obs`` gets ``(ratio, ||w||, ||g||)`` per array (``g`` unscaled): all
    NaN for a skipped row (no gradient; the hook's empty arrays), NaN norms
    where the optimizer does not adapt. Each array's step follows its norms
    while it is in the cache (6 to 20 % faster than norms first)."""
    # Stores into this array round the float64 scalars to the arrays' dtype.
    cast = numpy.empty(3, like.dtype)
    for k in range(table.shape[0]):
        size = table[k, L.SIZE]
        if size < 0 or (op == L.RESCALE and size == 0):
            obs[k, 0] = obs[k, 1] = obs[k, 2] = numpy.nan
            continue
        row = rows[k]
        w = _array(table, k, L.W, like)
        g = _array(table, k, L.G, like)
        if op == L.LAMB:
            lamb_update(table, k, row, obs, w, g, like)
            continue
        s = row[L.LOSS_SCALE]
        if op == L.STEP and s != 1.0:
            cast[0] = s
            unscale(g, cast[0])
            s = 1.0
        r = 1.0
        w_norm = g_norm = numpy.nan
        if op == L.RESCALE or row[L.ADAPT] != 0.0:
            w_sq, g_sq = sqnorms(w, g)
            w_norm = math.sqrt(w_sq)
            g_norm = math.sqrt(g_sq) / s
        if row[L.ADAPT] != 0.0:
            r = trust_ratio(w_norm, g_norm, row[L.WEIGHT_DECAY], row[L.EPS],
                            row[L.TRUST_COEFFICIENT], row[L.THRESHOLD],
                            row[L.REQUIRE_GRAD] != 0.0, row[L.CLIP_LR])
        obs[k, 0], obs[k, 1], obs[k, 2] = r, w_norm, g_norm
        # u = p g + q w; the hook's g still holds the loss scale s.
        p = r if op == L.RESCALE else row[L.LR] * r
        q = p * (s * row[L.WEIGHT_DECAY])
        cast[0], cast[1], cast[2] = p, q, row[L.MOMENTUM]
        if op == L.STEP:
            momentum_step(w, g, _array(table, k, L.V, like), cast[0],
                          cast[1], cast[2], row[L.NESTEROV] != 0.0)
        elif q != 0.0 or p != 1.0:
            scale_add(g, cast[0], w, cast[1])
