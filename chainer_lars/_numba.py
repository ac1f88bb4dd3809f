"""The CPU loops, compiled with Numba (float16 as its bits)."""

import math

from llvmlite import ir
import numba
from numba.core import cgutils
from numba.core import types
from numba.extending import intrinsic
from numba.extending import overload
import numpy

from chainer_lars import layout as L
from chainer_lars import ratio


_REDUCE, _ELEMENTWISE = {'reassoc', 'contract'}, {'contract'}  # fastmath
_DIVIDES, _JIT = dict(error_model='numpy'), dict(nogil=True, cache=True)

trust_ratio = numba.njit(**_JIT)(ratio.trust_ratio)


@intrinsic
def _half_to_float(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()),
                             ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _float_to_half(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()),
                               ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's ``fma``)."""
    def codegen(context, builder, signature, args):
        t = args[0].type
        f = builder.module.declare_intrinsic(
            'llvm.fma', [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(f, args)
    return a(a, a, a), codegen


@intrinsic
def _void_pointer(typingctx, addr):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


def load(a, i):
    """``a[i]`` in the compute type (float16 bits widen to float32)."""


def store(a, i, x):
    """``a[i] = x``, rounded to nearest; whether it was what was there."""


def compute(like, x):
    """``x`` rounded to nearest in the dtype of ``like``."""


@overload(load)
def _load(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: _half_to_float(a[i])
    return lambda a, i: a[i]


@overload(store)
def _store(a, i, x):
    if a.dtype == types.uint16:
        def store_half(a, i, x):
            old, new = a[i], _float_to_half(numpy.float32(x))
            a[i] = new
            return new == old and x != _half_to_float(old)
        return store_half

    def store_plain(a, i, x):
        a[i] = x
        return False
    return store_plain


@overload(compute)
def _compute(like, x):
    if like.dtype == types.float32:
        return lambda like, x: numpy.float32(x)
    return lambda like, x: numpy.float64(x)


@numba.njit(fastmath=_REDUCE, **_JIT)
def norms(w, g, s, inverse):
    """``(||w||, ||g / s||)`` (``inverse``, not 0: ``1 / s``, faster)."""
    sw = sg = 0.0
    for i in range(w.size):
        x = numpy.float64(load(w, i))
        y = numpy.float64(load(g, i) * inverse if inverse != 0 else
                          load(g, i) / s)
        sw += x * x
        sg += y * y
    return math.sqrt(sw), math.sqrt(sg)


# Loops call a function of one element: Numba vectorises only so.

@numba.njit(**_JIT)
def _unscale_at(out, g, i, s):
    store(out, i, load(g, i) / s)


@numba.njit(**_JIT)
def unscale(out, g, s):
    """``out <- g / s`` in the compute type (``out`` may be ``g``)."""
    for i in range(g.size):
        _unscale_at(out, g, i, s)


@numba.njit(fastmath=_ELEMENTWISE, **_JIT)
def _scale_add_at(g, i, r, w, c):
    store(g, i, r * load(g, i) + c * load(w, i))


@numba.njit(fastmath=_ELEMENTWISE, **_JIT)
def _scale_at(g, i, r):
    store(g, i, r * load(g, i))


@numba.njit(fastmath=_ELEMENTWISE, **_JIT)
def scale_add(g, r, w, c):
    """``g <- r g + c w`` (``w`` unread when ``c`` is 0)."""
    if c != 0:
        for i in range(g.size):
            _scale_add_at(g, i, r, w, c)
    else:
        for i in range(g.size):
            _scale_at(g, i, r)


@numba.njit(fastmath=_ELEMENTWISE, **_JIT)
def _step_at(w, v, i, gi, a, b, momentum, nesterov):
    """Element ``i``'s step: the new weight, whether it rounded away."""
    wi = load(w, i)
    u = _fma(a, gi, b * wi)
    vi = _fma(momentum, load(v, i), u)
    store(v, i, vi)
    wn = wi - (_fma(momentum, vi, u) if nesterov else vi)
    return wn, store(w, i, wn)


@numba.njit(fastmath=_ELEMENTWISE, **_JIT)
def _mixed_at(w, v, h, i, gi, a, b, momentum, nesterov):
    store(h, i, _step_at(w, v, i, gi, a, b, momentum, nesterov)[0])


@numba.njit(fastmath=_ELEMENTWISE, **_JIT)
def momentum_step(w, g, v, a, b, momentum, nesterov, s, inverse, h, mixed):
    """``u = a g + b w; v <- m v + u; w <- w - v`` (Nesterov: ``w <- w - (u
    + m v)``); ``mixed``: ``g / s``, ``h`` written. Returns the steps lost."""
    lost = 0
    if not mixed:
        for i in range(w.size):
            lost += _step_at(w, v, i, load(g, i), a, b, momentum, nesterov)[1]
    elif inverse != 0:
        for i in range(w.size):
            _mixed_at(w, v, h, i, load(g, i) * inverse, a, b, momentum,
                      nesterov)
    else:
        for i in range(w.size):
            _mixed_at(w, v, h, i, load(g, i) / s, a, b, momentum, nesterov)
    return lost


# LAMB: ob1 = 1 - b1, ob2 = 1 - b2, c1 = 1 - b1^t, c2 = 1 - b2^t.

@numba.njit(fastmath=_ELEMENTWISE, **_DIVIDES, **_JIT)
def lamb_direction(wi, mi, vi, c1, c2, eps, wd):
    """``r = (m / c1) / (sqrt(v / c2) + eps) + wd w`` of one element."""
    return _fma(wd, wi, (mi / c1) / (math.sqrt(vi / c2) + eps))


@numba.njit(fastmath=_ELEMENTWISE, **_DIVIDES, **_JIT)
def _lamb_moments_at(w, m, v, i, gi, b1, ob1, b2, ob2, c1, c2, eps, wd):
    store(m, i, _fma(b1, load(m, i), ob1 * gi))
    store(v, i, _fma(b2, load(v, i), ob2 * (gi * gi)))
    return lamb_direction(load(w, i), load(m, i), load(v, i), c1, c2, eps, wd)


@numba.njit(fastmath=_REDUCE, **_DIVIDES, **_JIT)
def lamb_moments(w, g, m, v, b1, ob1, b2, ob2, c1, c2, eps, wd, s):
    """``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2`` (``g / s``)
    and ``(||w||^2, ||r||^2)``, ``r`` from the moments as stored."""
    sw = sr = 0.0
    for i in range(w.size):
        r = _lamb_moments_at(w, m, v, i, load(g, i) / s, b1, ob1, b2, ob2,
                             c1, c2, eps, wd)
        x, y = numpy.float64(load(w, i)), numpy.float64(r)
        sw += x * x
        sr += y * y
    return sw, sr


@numba.njit(fastmath=_ELEMENTWISE, **_DIVIDES, **_JIT)
def _lamb_step_at(w, m, v, i, a, c1, c2, eps, wd):
    wi = load(w, i)
    wn = _fma(-a, lamb_direction(wi, load(m, i), load(v, i), c1, c2, eps, wd),
              wi)
    return wn, store(w, i, wn)


@numba.njit(fastmath=_ELEMENTWISE, **_DIVIDES, **_JIT)
def _lamb_mixed_at(w, m, v, h, i, a, c1, c2, eps, wd):
    store(h, i, _lamb_step_at(w, m, v, i, a, c1, c2, eps, wd)[0])


@numba.njit(fastmath=_ELEMENTWISE, **_DIVIDES, **_JIT)
def lamb_step(w, m, v, a, c1, c2, eps, wd, h, mixed):
    """``w <- w - a r`` (``mixed``: ``h`` too), as :func:`momentum_step`."""
    lost = 0
    if mixed:
        for i in range(w.size):
            _lamb_mixed_at(w, m, v, h, i, a, c1, c2, eps, wd)
    else:
        for i in range(w.size):
            lost += _lamb_step_at(w, m, v, i, a, c1, c2, eps, wd)[1]
    return lost


@numba.njit(**_JIT)
def _array(address, size, like):
    return numba.carray(_void_pointer(address), size, like.dtype)


@numba.njit(**_JIT)
def _divisor(like, s):
    """``s`` and its inverse where exact (a power of two; else 0)."""
    mantissa, _ = math.frexp(s)
    exact = mantissa == 0.5 and 2.0 ** -126 <= s <= 2.0 ** 126
    return compute(like, s), compute(like, 1.0 / s if exact else 0.0)


@numba.njit(**_JIT)
def rescale_row(row, obs, w, g, out, mixed, like_c):
    """The hook's row: ``g <- r g + r s wd w`` (``s``: the loss scale in
    ``g``); ``mixed``: ``out <- r (g / s) + r wd w``, ``g / s`` first."""
    s, one = row[L.LOSS_SCALE], compute(like_c, 1.0)
    if mixed:
        unscale(out, g, compute(like_c, s))
        s = 1.0
    w_norm, g_norm = norms(w, out, one, one)
    g_norm /= s
    r = 1.0 if row[L.ADAPT] == 0.0 else trust_ratio(
        w_norm, g_norm, row[L.WEIGHT_DECAY], row[L.EPS],
        row[L.TRUST_COEFFICIENT], row[L.THRESHOLD],
        row[L.REQUIRE_GRAD] != 0.0, row[L.CLIP_LR])
    obs[0], obs[1], obs[2] = r, w_norm, g_norm
    c = r * (s * row[L.WEIGHT_DECAY])
    if math.isinf(compute(like_c, r)):  # past float32's range: in float64
        scale_add(out, r, w, c)
    elif c != 0.0 or r != 1.0:
        scale_add(out, compute(like_c, r), w, compute(like_c, c))


@numba.njit(**_JIT)
def step_row(row, obs, w, g, v, h, mixed, like_c):
    """LARS's step of a row (``mixed``: ``g / s`` on the fly)."""
    scale, inverse = _divisor(like_c, row[L.LOSS_SCALE] if mixed else 1.0)
    r, w_norm, g_norm = 1.0, numpy.nan, numpy.nan
    if row[L.ADAPT] != 0.0:
        w_norm, g_norm = norms(w, g, scale, inverse)
        r = trust_ratio(w_norm, g_norm, row[L.WEIGHT_DECAY], row[L.EPS],
                        row[L.TRUST_COEFFICIENT], row[L.THRESHOLD],
                        row[L.REQUIRE_GRAD] != 0.0, row[L.CLIP_LR])
    obs[0], obs[1], obs[2] = r, w_norm, g_norm
    a, t = row[L.LR] * r, (row[L.NESTEROV] != 0.0, scale, inverse, h, mixed)
    b, m = a * row[L.WEIGHT_DECAY], row[L.MOMENTUM]
    if math.isinf(compute(like_c, a)):  # as rescale_row
        obs[3] = momentum_step(w, g, v, a, b, m, *t)
    else:
        obs[3] = momentum_step(w, g, v, compute(like_c, a),
                               compute(like_c, b), compute(like_c, m), *t)


@numba.njit(**_JIT)
def lamb_row(row, obs, w, g, m, v, h, mixed, like_c):
    """LAMB's row (``mixed`` as :func:`step_row`)."""
    b1, b2 = compute(like_c, row[L.BETA1]), compute(like_c, row[L.BETA2])
    ob1 = compute(like_c, 1.0 - row[L.BETA1])
    ob2 = compute(like_c, 1.0 - row[L.BETA2])
    c1 = compute(like_c, row[L.CORRECTION1])
    c2 = compute(like_c, row[L.CORRECTION2])
    eps, wd = compute(like_c, row[L.EPS]), compute(like_c, row[L.WEIGHT_DECAY])
    s = compute(like_c, row[L.LOSS_SCALE] if mixed else 1.0)
    w_sq, r_sq = lamb_moments(w, g, m, v, b1, ob1, b2, ob2, c1, c2, eps, wd, s)
    w_norm, r_norm = math.sqrt(w_sq), math.sqrt(r_sq)
    r = 1.0 if row[L.ADAPT] == 0.0 else trust_ratio(
        w_norm, r_norm, 0.0, 0.0, 1.0, 0.0, True, row[L.CLIP_LR])
    obs[0], obs[1], obs[2] = r, w_norm, r_norm
    a, t = row[L.LR] * r, (c1, c2, eps, wd, h, mixed)
    obs[3] = (lamb_step(w, m, v, a, *t) if math.isinf(compute(like_c, a))
              else lamb_step(w, m, v, compute(like_c, a), *t))  # as above


@numba.njit(**_JIT)
def multi_update(table, gptr, rows, obs, like_w, like_g, like_c, op):
    """One update (``op``) of the rows whose gradient address ``gptr`` gives
    (0: left); ``like_*``: dtypes; ``obs``: ``(r, ||w||, ||g||, lost)``."""
    for k in range(table.shape[0]):
        size = table[k, L.SIZE]
        obs[k, :] = numpy.nan
        if gptr[k] == 0 or (op == L.RESCALE and size == 0):
            continue
        obs[k, 3] = 0.0
        w = _array(table[k, L.W], size, like_w)
        g = _array(gptr[k], size, like_g)
        mixed, s = table[k, L.OUT] != 0, rows[k, L.LOSS_SCALE]
        if op != L.RESCALE and s != 1.0 and not mixed:
            one = numpy.empty(1, like_g.dtype)
            store(one, 0, s)
            unscale(g, g, load(one, 0))
        if op == L.RESCALE:
            out = _array(table[k, L.OUT] if mixed else gptr[k], size, like_w)
            rescale_row(rows[k], obs[k], w, g, out, mixed, like_c)
            continue
        h = _array(table[k, L.OUT], size, like_g) if mixed else g
        v = _array(table[k, L.V], size, like_w)
        if op == L.STEP:
            step_row(rows[k], obs[k], w, g, v, h, mixed, like_c)
        else:
            lamb_row(rows[k], obs[k], w, g, v,
                     _array(table[k, L.V2], size, like_w), h, mixed, like_c)


#: Offsets in NumPy's array object (``PyArrayObject_fields``, its ABI), in
#: 32-bit (nd, flags) and 64-bit words; :data:`STAMPS` checks them.
_ND, _FLAGS = 6, 16
_TYPE, _DATA, _DIMS, _DESCR = 1, 2, 4, 7
#: A stamp: data address, descr, flags, size, 1 (a plain ndarray; else 0),
#: the shape's hash (a reshape in place changes it).
STAMP, _MIX = 6, 0x9E3779B97F4A7C15
DATA, DESCR, FLAGS, SIZE, PLAIN, SHAPE = range(STAMP)
#: Held arrays, a row each: id, group, stamp; gradients, a column each: id,
#: address taken, the row's weight's size, descr, flags, own arrays direct,
#: the weight's shape hash.
ID, GROUP, STAMPED = 0, 1, 2
GID, GPTR, EXPECT = 0, 1, 2


@numba.njit(**_JIT)
def _stamp(address, ndarray, out):
    """Stamps the object at ``address`` (alive: held by the caller)."""
    head = numba.carray(_void_pointer(address), 8, numpy.int64)
    out[:] = 0
    if head[_TYPE] == ndarray:
        ints = numba.carray(_void_pointer(address), 17, numpy.int32)
        dims = numba.carray(_void_pointer(head[_DIMS]), ints[_ND], numpy.int64)
        out[DATA], out[DESCR] = head[_DATA], head[_DESCR]
        out[FLAGS], out[SIZE], out[PLAIN] = ints[_FLAGS], numpy.prod(dims), 1
        shape = numpy.uint64(_MIX) * numpy.uint64(ints[_ND] + 1)  # unsigned
        for d in dims:
            shape = (shape ^ numpy.uint64(d)) * numpy.uint64(_MIX)
            shape ^= shape >> numpy.uint64(31)
        out[SHAPE] = numpy.int64(shape)


@numba.njit(**_JIT)
def stamp(held, ndarray):
    for k in range(held.shape[0]):
        _stamp(held[k, ID], ndarray, held[k, STAMPED:])


@numba.njit(**_JIT)
def restamp(held, changed, grads, none, ndarray):
    """Reads a plan's arrays' headers: ``changed[g]``: group ``g``'s changed
    arrays; a gradient as its row expects gets its address; how many not."""
    now = numpy.empty(STAMP, numpy.int64)
    changed[:] = 0
    for k in range(held.shape[0]):
        _stamp(held[k, ID], ndarray, now)
        for j in range(STAMP):
            if now[j] != held[k, STAMPED + j]:
                changed[held[k, GROUP]] += 1
                break
    left = grads.shape[1]  # less each one taken
    for k in range(grads.shape[1]):
        e = grads[:, k]
        e[GPTR] = 0
        if e[GID] == none:
            continue
        _stamp(e[GID], ndarray, now)
        if (e[EXPECT + 3] and now[PLAIN] and now[DESCR] == e[EXPECT + 1]
                and now[SIZE] == e[EXPECT] and now[SHAPE] == e[EXPECT + 4]
                and (now[FLAGS] & e[EXPECT + 2]) == e[EXPECT + 2]):
            e[GPTR] = now[DATA]
            left -= 1
    return left


@numba.njit(**_JIT)
def restamp_update(held, changed, grads, none, ndarray, table, rows, obs,
                   like_w, like_g, like_c, op):
    """:func:`restamp`, then :func:`multi_update` if all go; whether it ran."""
    if restamp(held, changed, grads, none, ndarray) or changed.any():
        return False
    multi_update(table, grads[GPTR], rows, obs, like_w, like_g, like_c, op)
    return True


def _stamps_agree():
    """Whether :func:`restamp` reads what NumPy reports of its arrays."""
    arrays = [numpy.zeros((3, 5), 'f'), numpy.ones(7)[::2],
              numpy.empty((2, 0, 4), 'e'), numpy.zeros(6, '>f4')]
    arrays[0].flags.writeable = False
    held = numpy.zeros((len(arrays) + 1, STAMPED + STAMP), numpy.int64)
    held[:, ID] = [id(a) for a in arrays] + [id(None)]
    stamp(held, id(numpy.ndarray))
    return held[:, STAMPED:STAMPED + SHAPE].tolist() == [[
        a.ctypes.data, id(a.dtype), a.flags.num, a.size, 1]
        for a in arrays] + [[0] * SHAPE]


#: Whether the compiled loop may be used: its stamps read NumPy's arrays.
STAMPS = _stamps_agree()
