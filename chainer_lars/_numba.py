"""The CPU loops, compiled with Numba.

:func:`multi_update` updates every array of a group in one call through a
table of addresses (a group of one runs the same loop: every path agrees
bit for bit). Arrays are stored as float32, float64 or float16, the last
read and written through their bits (``uint16``: Numba has no float16) with
the processor's conversions (:func:`load`, :func:`store`); float16 computes
in float32. A mixed16 row steps its float32 master and momentum from the
float16 gradient, divided by the loss scale on the fly, and writes the
float16 weight as the master rounded to nearest. Norms accumulate in
float64; ``fastmath`` allows only reassociation (sums) and contraction, so
non-finite values propagate as in NumPy; the ratio and the division by the
loss scale round as on the host.
"""

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


_REDUCE = {'reassoc', 'contract'}
_ELEMENTWISE = {'contract'}
#: Division by 0 gives inf or NaN as in NumPy; Python's error model would
#: test every divisor and keep the loop from being vectorised (7x slower).
_DIVIDES = {'error_model': 'numpy'}

trust_ratio = numba.njit(nogil=True, cache=True)(ratio.trust_ratio)


@intrinsic
def _half_to_float(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()),
                             ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _float_to_half(typingctx, x):
    def codegen(context, builder, signature, args):
        # LLVM's fptrunc rounds to nearest-even, as NumPy's astype.
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


def load(a, i):
    """``a[i]`` in the compute type (float16 bits widen to float32)."""


def store(a, i, x):
    """``a[i] = x``, rounded to nearest in the storage type."""


@overload(load)
def _load(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: _half_to_float(a[i])
    return lambda a, i: a[i]


@overload(store)
def _store(a, i, x):
    if a.dtype == types.uint16:
        def store_half(a, i, x):
            a[i] = _float_to_half(numpy.float32(x))
        return store_half

    def store_plain(a, i, x):
        a[i] = x
    return store_plain


@numba.njit(nogil=True, cache=True)
def halves(bits, out):
    """float16 bits to float32 through :func:`load` (tested against
    NumPy at import by :mod:`chainer_lars.cpu`)."""
    for i in range(bits.size):
        out[i] = load(bits, i)


@numba.njit(nogil=True, cache=True)
def to_halves(x, bits):
    """float32 to float16 bits through :func:`store`."""
    for i in range(x.size):
        store(bits, i, x[i])


@numba.njit(nogil=True, cache=True, fastmath=_REDUCE)
def sqnorms(w, g, s, inverse):
    """``(||w||^2, ||g / s||^2)`` in one pass that reads both arrays (the
    division in the compute type; by a power of two, the same as the product
    with its ``inverse``, which is faster; ``inverse`` 0: divide)."""
    sw = 0.0
    sg = 0.0
    if inverse != 0:
        for i in range(w.size):
            x = numpy.float64(load(w, i))
            y = numpy.float64(load(g, i) * inverse)
            sw += x * x
            sg += y * y
    else:
        for i in range(w.size):
            x = numpy.float64(load(w, i))
            y = numpy.float64(load(g, i) / s)
            sw += x * x
            sg += y * y
    return sw, sg


# Each loop below calls a function of one element: Numba vectorises a loop
# whose stores go through store() only so (one loop of two stores of it,
# written out, runs element by element).

@numba.njit(nogil=True, cache=True)
def _unscale_at(g, i, s):
    store(g, i, load(g, i) / s)


@numba.njit(nogil=True, cache=True)
def unscale(g, s):
    for i in range(g.size):
        _unscale_at(g, i, s)


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def _scale_add_at(g, i, r, w, c):
    store(g, i, r * load(g, i) + c * load(w, i))


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def _scale_at(g, i, r):
    store(g, i, r * load(g, i))


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def scale_add(g, r, w, c):
    """``g <- r g + c w`` (``w`` unread when ``c`` is 0)."""
    if c != 0:
        for i in range(g.size):
            _scale_add_at(g, i, r, w, c)
    else:
        for i in range(g.size):
            _scale_at(g, i, r)


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def _step_at(w, v, i, gi, a, b, momentum, nesterov):
    """The step of element ``i`` with the gradient ``gi``. The products
    are fused with their sums as written (``fma``), not as the compiler
    might choose, so that every path that steps agrees bit for bit."""
    wi = load(w, i)
    u = _fma(a, gi, b * wi)
    vi = _fma(momentum, load(v, i), u)
    store(v, i, vi)
    wi = wi - (_fma(momentum, vi, u) if nesterov else vi)
    store(w, i, wi)
    return wi


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def momentum_step(w, g, v, a, b, momentum, nesterov):
    """``u = a g + b w; v <- m v + u; w <- w - v`` in one pass (Nesterov:
    ``w <- w - (u + m v)``), in the storage type of ``w``."""
    for i in range(w.size):
        _step_at(w, v, i, load(g, i), a, b, momentum, nesterov)


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def _mixed_at(w, v, h, i, gi, a, b, momentum, nesterov):
    store(h, i, _step_at(w, v, i, gi, a, b, momentum, nesterov))


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def mixed_step(w, g, v, a, b, momentum, nesterov, s, inverse, h):
    """:func:`momentum_step` of a float32 master ``w`` and momentum ``v``
    with the float16 gradient ``g / s`` (``g`` unwritten; as the product
    with ``inverse`` where that is not 0), and ``h``, the float16 weight, set
    to the new ``w`` rounded to nearest."""
    if inverse != 0:
        for i in range(w.size):
            _mixed_at(w, v, h, i, load(g, i) * inverse, a, b, momentum,
                      nesterov)
    else:
        for i in range(w.size):
            _mixed_at(w, v, h, i, load(g, i) / s, a, b, momentum, nesterov)


# LAMB (layout.LAMB). ``c``: the constants of lamb_update, in the compute
# type: b1, 1 - b1, b2, 1 - b2, c1, c2, eps, wd, and the loss scale still
# in g (mixed16; else 1). Products fused with their sums as written
# (``fma``), so that the batched and per-rule paths agree bit for bit.

@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def lamb_direction(wi, mi, vi, c):
    """LAMB's ``r = (m / c1) / (sqrt(v / c2) + eps) + wd w`` of one
    element."""
    return _fma(c[7], wi, (mi / c[4]) / (math.sqrt(vi / c[5]) + c[6]))


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def _lamb_moments_at(w, m, v, i, gi, c):
    store(m, i, _fma(c[0], load(m, i), c[1] * gi))
    store(v, i, _fma(c[2], load(v, i), c[3] * (gi * gi)))
    return lamb_direction(load(w, i), load(m, i), load(v, i), c)


@numba.njit(nogil=True, cache=True, fastmath=_REDUCE, **_DIVIDES)
def lamb_moments(w, g, m, v, c):
    """LAMB's ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``
    (``g`` divided by ``c[8]`` on the fly) and ``(||w||^2, ||r||^2)``, ``r``
    from the moments as stored, in one pass."""
    sw = 0.0
    sr = 0.0
    for i in range(w.size):
        r = _lamb_moments_at(w, m, v, i, load(g, i) / c[8], c)
        x = numpy.float64(load(w, i))
        y = numpy.float64(r)
        sw += x * x
        sr += y * y
    return sw, sr


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def _lamb_step_at(w, m, v, i, a, c):
    wi = load(w, i)
    wn = _fma(-a, lamb_direction(wi, load(m, i), load(v, i), c), wi)
    store(w, i, wn)
    return wn


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def _lamb_mixed_at(w, m, v, h, i, a, c):
    store(h, i, _lamb_step_at(w, m, v, i, a, c))


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE, **_DIVIDES)
def lamb_step(w, m, v, a, c, h, mixed):
    """``w <- w - a r`` (mixed16: and ``h``, the float16 weight, set to the
    new ``w`` rounded to nearest)."""
    if mixed:
        for i in range(w.size):
            _lamb_mixed_at(w, m, v, h, i, a, c)
    else:
        for i in range(w.size):
            _lamb_step_at(w, m, v, i, a, c)


@numba.njit(nogil=True, cache=True)
def lamb_update(table, k, row, obs, w, g, likes, s, mixed):
    """Row ``k`` of a LAMB update, ``g`` unscaled (mixed16: divided by ``s``
    on the fly): the moments, ``(ratio, ||w||, ||r||)`` into ``obs`` and the
    step."""
    like_w, like_g, like_c = likes
    # Stores into this array round the float64 values to the compute type.
    cast = numpy.empty(10, like_c.dtype)
    cast[0], cast[1] = row[L.BETA1], 1.0 - row[L.BETA1]
    cast[2], cast[3] = row[L.BETA2], 1.0 - row[L.BETA2]
    cast[4], cast[5] = row[L.CORRECTION1], row[L.CORRECTION2]
    cast[6], cast[7], cast[8] = row[L.EPS], row[L.WEIGHT_DECAY], s
    # A tuple of values: no array the loops would have to reload.
    c = (cast[0], cast[1], cast[2], cast[3], cast[4], cast[5], cast[6],
         cast[7], cast[8])
    m = _array(table, k, L.V, like_w)
    v = _array(table, k, L.V2, like_w)
    w_sq, r_sq = lamb_moments(w, g, m, v, c)
    w_norm, r_norm = math.sqrt(w_sq), math.sqrt(r_sq)
    r = 1.0
    if row[L.ADAPT] != 0.0:
        r = trust_ratio(w_norm, r_norm, 0.0, 0.0, 1.0, 0.0, True,
                        row[L.CLIP_LR])
    obs[k, 0], obs[k, 1], obs[k, 2] = r, w_norm, r_norm
    cast[9] = row[L.LR] * r
    lamb_step(w, m, v, cast[9], c,
              _array(table, k, L.H, like_g) if mixed else g, mixed)


@intrinsic
def _void_pointer(typingctx, addr):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@numba.njit(nogil=True, cache=True)
def _array(table, k, column, like):
    return numba.carray(_void_pointer(table[k, column]), table[k, L.SIZE],
                        like.dtype)


#: Byte offsets in NumPy's array object (``PyArrayObject_fields``, part of
#: NumPy's ABI: its C macros read these fields in compiled extensions), in
#: 32-bit words: nd, and flags; in 64-bit words: type, data, dimensions,
#: descr. :data:`STAMPS` says whether they read as NumPy reports.
_ND, _FLAGS = 6, 16
_TYPE, _DATA, _DIMS, _DESCR = 1, 2, 4, 7
#: The columns of a stamp: data address, descr, flags, size; and 1 for a
#: plain ``numpy.ndarray`` (the rest 0 for any other object).
STAMP = 5


@numba.njit(nogil=True, cache=True)
def restamp(ids, ndarray, last, out, held):
    """Stamps the objects at the addresses ``ids`` (alive: held by the
    caller) into ``out``; returns how many of the first ``held`` and how
    many of the rest differ from ``last``. Only the type is read of an
    object that is not a plain ndarray."""
    changed_held = changed = 0
    for k in range(ids.size):
        head = numba.carray(_void_pointer(ids[k]), 8, numpy.int64)
        out[k, :] = 0
        if head[_TYPE] == ndarray:
            ints = numba.carray(_void_pointer(ids[k]), 17, numpy.int32)
            dims = numba.carray(_void_pointer(head[_DIMS]), ints[_ND],
                                numpy.int64)
            size = 1
            for d in dims:
                size *= d
            out[k, 0] = head[_DATA]
            out[k, 1] = head[_DESCR]
            out[k, 2] = ints[_FLAGS]
            out[k, 3] = size
            out[k, 4] = 1
        for j in range(STAMP):
            if out[k, j] != last[k, j]:
                if k < held:
                    changed_held += 1
                else:
                    changed += 1
                break
    return changed_held, changed


@numba.njit(nogil=True, cache=True)
def restamp_groups(ids, ndarray, last, out, bounds, helds, result):
    """:func:`restamp` of several groups' objects at once, group ``j`` in
    rows ``bounds[j]`` to ``bounds[j + 1]`` with ``helds[j]`` held; its
    two counts into ``result[j]``."""
    for j in range(helds.size):
        a, b = bounds[j], bounds[j + 1]
        result[j, 0], result[j, 1] = restamp(ids[a:b], ndarray, last[a:b],
                                             out[a:b], helds[j])


#: NumPy's flags that a table's array needs: C-contiguous and aligned.
_DIRECT = 0x1 | 0x100


@numba.njit(nogil=True, cache=True)
def put_grads(table, stamps, descr, sizes):
    """Puts in ``table`` the gradients whose stamps say they can go as
    they are (a plain ndarray of the dtype whose descr is ``descr``,
    C-contiguous, aligned, of the row's size; ``sizes`` -2: the row's
    other arrays cannot); returns the number of rows left (size -1)."""
    left = 0
    for k in range(table.shape[0]):
        st = stamps[k]
        if (st[4] == 1 and st[1] == descr and st[3] == sizes[k]
                and (st[2] & _DIRECT) == _DIRECT):
            table[k, L.G] = st[0]
            table[k, L.SIZE] = st[3]
        else:
            table[k, L.SIZE] = -1
            left += 1
    return left


@numba.njit(nogil=True, cache=True)
def multi_update(table, rows, obs, like_w, like_g, like_c, op):
    """One update (``op``: ``RESCALE``, ``STEP`` or ``LAMB``) of every array
    of a table.

    ``like_w``, ``like_g``, ``like_c``: empty arrays (passed apart: a tuple
    costs the call 0.4 us) of the storage type of the weights and states,
    of the gradients, and of the compute type. ``obs`` gets ``(ratio,
    ||w||, ||g||)`` per array (``g`` unscaled): all NaN for a skipped row
    (no gradient; the hook's empty arrays), NaN norms where the optimizer
    does not adapt. Each array's step follows its norms while it is in the
    cache (6 to 20 % faster than norms first). A row with a half weight
    (``H``) is a mixed16 step."""
    likes = (like_w, like_g, like_c)
    # Stores into these arrays round the float64 scalars to the types.
    cast = numpy.empty(5, like_c.dtype)
    stored = numpy.empty(1, like_g.dtype)
    for k in range(table.shape[0]):
        size = table[k, L.SIZE]
        if size < 0 or (op == L.RESCALE and size == 0):
            obs[k, 0] = obs[k, 1] = obs[k, 2] = numpy.nan
            continue
        row = rows[k]
        w = _array(table, k, L.W, like_w)
        g = _array(table, k, L.G, like_g)
        mixed = table[k, L.H] != 0
        s = row[L.LOSS_SCALE]
        # The scale to divide g by on the fly (mixed16; else 1), and its
        # inverse where the product is exactly the quotient (a power of two).
        cast[3] = cast[4] = 1.0
        if op != L.RESCALE and s != 1.0:
            if mixed:  # as the rule divides its float32 copy of g
                cast[3] = s
                mantissa, _ = math.frexp(s)
                cast[4] = (1.0 / s if mantissa == 0.5
                           and 2.0 ** -126 <= s <= 2.0 ** 126 else 0.0)
            else:  # as the rule divides g in place, by s in g's type
                store(stored, 0, s)
                unscale(g, load(stored, 0))
            s = 1.0
        if op == L.LAMB:
            lamb_update(table, k, row, obs, w, g, likes, cast[3], mixed)
            continue
        r = 1.0
        w_norm = g_norm = numpy.nan
        if op == L.RESCALE or row[L.ADAPT] != 0.0:
            w_sq, g_sq = sqnorms(w, g, cast[3], cast[4])
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
            v = _array(table, k, L.V, like_w)
            if mixed:
                mixed_step(w, g, v, cast[0], cast[1], cast[2],
                           row[L.NESTEROV] != 0.0, cast[3], cast[4],
                           _array(table, k, L.H, like_g))
            else:
                momentum_step(w, g, v, cast[0], cast[1], cast[2],
                              row[L.NESTEROV] != 0.0)
        elif q != 0.0 or p != 1.0:
            scale_add(g, cast[0], w, cast[1])


@numba.njit(nogil=True, cache=True)
def restamp_update(ids, ndarray, last, out, held, table, rows, obs, like_w,
                   like_g, like_c, op):
    """:func:`multi_update` of ``table``, if :func:`restamp` finds every
    object as it was at ``last`` (one call where two would be); returns
    whether it ran."""
    changed_held, changed = restamp(ids, ndarray, last, out, held)
    if changed_held or changed:
        return False
    multi_update(table, rows, obs, like_w, like_g, like_c, op)
    return True


def _halves_agree():
    """Whether :func:`load` and :func:`store` convert as NumPy does: every
    float16, the midpoints between neighbours (ties to even) and the
    values next to them, and the overflow to infinity (NaN payloads may
    differ: the processor quiets them)."""
    bits = numpy.arange(1 << 16, dtype=numpy.uint16)
    wide = numpy.empty(bits.size, numpy.float32)
    halves(bits, wide)
    expected = bits.view(numpy.float16).astype(numpy.float32)
    finite = numpy.isfinite(expected)
    exact = numpy.sort(expected[finite])
    mid = ((exact[:-1].astype(numpy.float64) + exact[1:]) / 2).astype(
        numpy.float32)
    values = numpy.concatenate([
        exact, mid, numpy.nextafter(mid, numpy.float32(numpy.inf)),
        numpy.nextafter(mid, numpy.float32(-numpy.inf)),
        numpy.float32([65519.996, 65520.0, -65520.0, 1e30, numpy.inf])])
    narrowed = numpy.empty(values.size, numpy.uint16)
    to_halves(values, narrowed)
    with numpy.errstate(over='ignore'):
        reference = values.astype(numpy.float16).view(numpy.uint16)
    return bool(numpy.array_equal(wide[finite], expected[finite])
                and numpy.array_equal(narrowed, reference))


#: Whether float16 storage goes through the compiled loop (else the NumPy
#: passes take it, as without Numba).
FLOAT16 = _halves_agree()


def _stamps_agree():
    """Whether :func:`restamp` reads what NumPy reports of its arrays."""
    arrays = [numpy.zeros((3, 5), numpy.float32), numpy.ones(7)[::2],
              numpy.empty((2, 0, 4), numpy.float16),
              numpy.zeros(6, numpy.dtype('>f4'))]
    arrays[0].flags.writeable = False
    ids = numpy.array([id(a) for a in arrays] + [id(None)], numpy.int64)
    out = numpy.empty((ids.size, STAMP), numpy.int64)
    restamp(ids, id(numpy.ndarray), numpy.zeros_like(out), out, 0)
    expected = [[a.ctypes.data, id(a.dtype), a.flags.num, a.size, 1]
                for a in arrays] + [[0] * STAMP]
    return out.tolist() == expected


#: Whether array stamps are read in the compiled loop (else by Python).
STAMPS = _stamps_agree()
