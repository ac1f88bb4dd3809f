"""The CPU passes compiled with Numba, for native float32 and float64 arrays.

:mod:`chainer_lars.kernels` calls these unless ``CHAINER_LARS_NUMBA`` is
``0`` or Numba cannot be imported. Each pass is one loop over memory, which
NumPy cannot express: it has no fused multiply-add, so ``r * g + c * w``
costs three ufunc calls, and on CPUs whose cores are not much faster than
their memory every ufunc call costs about one pass (see
``benchmarks/README.md``).

Two kinds of entry points, built from the same loops:

- per array (:func:`sqnorms`, :func:`scale`, :func:`scale_add`,
  :func:`momentum_step`, :func:`nesterov_step`): 1-D C-contiguous arrays of
  one dtype and scalars of that dtype; the caller checks.
- multi-tensor (:func:`lars_multi_step`, :func:`hook_multi_rescale`): all
  the arrays of one group in one call, found through a table of addresses
  and sizes (:class:`chainer_lars.kernels.CpuExecutor` builds it), with the
  per-array settings in a float64 table (columns in
  :mod:`chainer_lars.multi_tensor`). They call the per-array loops and
  round the scalars to the arrays' dtype as the per-array callers do, so a
  batched update equals the per-array one bit for bit.

Norms accumulate in float64. ``fastmath`` allows only reassociation (to
vectorise the sums) and contraction (fused multiply-add), never the
no-NaN/no-inf assumptions, so non-finite values propagate as in NumPy and
no floating-point warnings are raised. The ratio is
:func:`chainer_lars.ratio.trust_ratio` itself, compiled without
``fastmath``, so that it rounds exactly as on the host. Division by the
loss scale is compiled without ``fastmath`` too, so that it rounds as
NumPy's ``g /= loss_scale`` in Chainer's ``UpdateRule.update`` does.
"""

import math

import numba
from numba.core import cgutils
from numba.core import types
from numba.extending import intrinsic
import numpy

from chainer_lars import multi_tensor as _mt
from chainer_lars import ratio as _ratio


_REDUCE = {'reassoc', 'contract'}
_ELEMENTWISE = {'contract'}

trust_ratio = numba.njit(nogil=True, cache=True)(_ratio.trust_ratio)


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
    """``g <- g / s``, rounded as NumPy's in-place division."""
    for i in range(g.size):
        g[i] = g[i] / s


@numba.njit(nogil=True, cache=True)
def scale(g, r):
    """``g <- r * g`` in one pass."""
    for i in range(g.size):
        g[i] = r * g[i]


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def scale_add(g, r, w, c):
    """``g <- r * g + c * w`` in one pass."""
    for i in range(g.size):
        g[i] = r * g[i] + c * w[i]


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def momentum_step(w, g, v, a, b, momentum):
    """Classic LARS momentum step in one pass (see kernels.momentum_step)."""
    for i in range(w.size):
        vi = momentum * v[i] + (a * g[i] + b * w[i])
        v[i] = vi
        w[i] = w[i] - vi


@numba.njit(nogil=True, cache=True, fastmath=_ELEMENTWISE)
def nesterov_step(w, g, v, a, b, momentum):
    """Nesterov LARS momentum step in one pass."""
    for i in range(w.size):
        u = a * g[i] + b * w[i]
        vi = momentum * v[i] + u
        v[i] = vi
        w[i] = w[i] - (u + momentum * vi)


@numba.njit(nogil=True, cache=True)
def address(a):
    """The address of ``a``'s data (for the multi-tensor tables)."""
    return a.ctypes.data


@numba.njit(nogil=True, cache=True)
def put_grad(table, k, g, size):
    """Puts gradient ``g`` in row ``k`` of an address table, if it fits.

    Returns:
        bool: Whether ``g`` is C-contiguous with ``size`` elements; if not,
        the table is left alone.

    """
    if g.size != size or not g.flags.c_contiguous:
        return False
    table[k, _mt.G] = g.ctypes.data
    table[k, _mt.SIZE] = size
    return True


@intrinsic
def _void_pointer(typingctx, addr):
    """An int64 address as a ``void *``, for :func:`numba.carray`."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@numba.njit(nogil=True, cache=True)
def _array(table, k, column, like):
    """Array ``column`` of row ``k`` of an address table, typed as ``like``.
    """
    return numba.carray(_void_pointer(table[k, column]),
                        table[k, _mt.SIZE], like.dtype)


@numba.njit(nogil=True, cache=True)
def lars_multi_step(table, hyper, obs, like, threshold, require_grad):
    """The LARS optimizer's update of every array of a table.

    Args:
        table (numpy.ndarray): int64, one row per array: the addresses of
            ``w``, ``g`` and ``v`` and the size (columns ``W``, ``G``, ``V``,
            ``SIZE`` of :mod:`chainer_lars.multi_tensor`); rows whose
            ``SIZE`` is negative are skipped (no gradient this update).
        hyper (numpy.ndarray): float64, one row per array, columns
            ``LARS_*`` of :mod:`chainer_lars.multi_tensor`.
        obs (numpy.ndarray): float64 ``(n, 3)``, overwritten with
            ``(ratio, ||w||, ||g||)`` of each array: ``NaN`` norms where it
            is not adapted, all ``NaN`` where it was skipped.
        like (numpy.ndarray): Any array of the arrays' dtype.
        threshold (float), require_grad (bool): The form's settings
            (:data:`chainer_lars.ratio.OPTIMIZER_FORM`).

    For each array, the loss scale is divided out of ``g`` in place (as
    Chainer's update rule does), then come the norms and the fused momentum
    step. One array's passes follow each other, rather than all the norms
    before all the steps, because the step then finds the array in the
    cache: 6 to 20 % less time on the ResNet-20 and ResNet-50 sets (see
    ``benchmarks/README.md``).

    """
    # Stores into this array round the float64 scalars to the arrays'
    # dtype, as the per-array path's numpy.float32(a) does.
    cast = numpy.empty(3, like.dtype)
    for k in range(table.shape[0]):
        if table[k, _mt.SIZE] < 0:
            obs[k, 0] = obs[k, 1] = obs[k, 2] = numpy.nan
            continue
        w = _array(table, k, _mt.W, like)
        g = _array(table, k, _mt.G, like)
        if hyper[k, _mt.LARS_LOSS_SCALE] != 1.0:
            cast[0] = hyper[k, _mt.LARS_LOSS_SCALE]
            unscale(g, cast[0])
        r = 1.0
        w_norm = g_norm = numpy.nan
        wd = hyper[k, _mt.LARS_WEIGHT_DECAY]
        if hyper[k, _mt.LARS_ADAPT] != 0.0:
            w_sq, g_sq = sqnorms(w, g)
            w_norm = math.sqrt(w_sq)
            g_norm = math.sqrt(g_sq)
            r = trust_ratio(w_norm, g_norm, wd, hyper[k, _mt.LARS_EPS],
                            hyper[k, _mt.LARS_TRUST_COEFFICIENT], threshold,
                            require_grad, -1.0)
        obs[k, 0] = r
        obs[k, 1] = w_norm
        obs[k, 2] = g_norm
        a = hyper[k, _mt.LARS_LR] * r
        cast[0] = a
        cast[1] = a * wd
        cast[2] = hyper[k, _mt.LARS_MOMENTUM]
        v = _array(table, k, _mt.V, like)
        if hyper[k, _mt.LARS_NESTEROV] != 0.0:
            nesterov_step(w, g, v, cast[0], cast[1], cast[2])
        else:
            momentum_step(w, g, v, cast[0], cast[1], cast[2])


@numba.njit(nogil=True, cache=True)
def hook_multi_rescale(table, hyper, obs, like, threshold, require_grad,
                       eps, trust_coefficient):
    """The hook's rescaling ``g <- r (g + S wd w)`` of every array of a table.

    Args:
        table (numpy.ndarray): int64, one row per array: the addresses of
            ``w`` and ``g`` and the size; rows whose ``SIZE`` is not
            positive are skipped (no gradient this update, or empty).
        hyper (numpy.ndarray): float64, one row per array, columns
            ``HOOK_*`` of :mod:`chainer_lars.multi_tensor`: the effective
            weight decay, whether the array is adapted, the clipping rate
            (negative: none) and the loss scale ``S`` by which the stored
            gradient exceeds the true one (the result keeps that factor).
        obs (numpy.ndarray): float64 ``(n, 3)``, overwritten with
            ``(ratio, ||w||, ||g||)``, ``g`` unscaled and before rescaling;
            all ``NaN`` where the array was skipped.
        like (numpy.ndarray): Any array of the arrays' dtype.
        threshold, require_grad, eps, trust_coefficient: The hook's form
            and settings.

    Each array's norms, then its rescaling, array after array, for the
    reason given in :func:`lars_multi_step`.

    """
    cast = numpy.empty(2, like.dtype)
    for k in range(table.shape[0]):
        if table[k, _mt.SIZE] <= 0:
            obs[k, 0] = obs[k, 1] = obs[k, 2] = numpy.nan
            continue
        w = _array(table, k, _mt.W, like)
        g = _array(table, k, _mt.G, like)
        w_sq, g_sq = sqnorms(w, g)
        w_norm = math.sqrt(w_sq)
        g_norm = math.sqrt(g_sq) / hyper[k, _mt.HOOK_LOSS_SCALE]
        r = 1.0
        if hyper[k, _mt.HOOK_ADAPT] != 0.0:
            r = trust_ratio(w_norm, g_norm, hyper[k, _mt.HOOK_WEIGHT_DECAY],
                            eps, trust_coefficient, threshold, require_grad,
                            hyper[k, _mt.HOOK_CLIP_LR])
        obs[k, 0] = r
        obs[k, 1] = w_norm
        obs[k, 2] = g_norm
        c = r * (hyper[k, _mt.HOOK_LOSS_SCALE]
                 * hyper[k, _mt.HOOK_WEIGHT_DECAY])
        cast[0] = r
        if c != 0.0:
            cast[1] = c
            scale_add(g, cast[0], w, cast[1])
        elif r != 1.0:
            scale(g, cast[0])
