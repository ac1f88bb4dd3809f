"""The CPU passes compiled with Numba, for float32 and float64 arrays.

:mod:`chainer_lars.kernels` uses these unless ``CHAINER_LARS_NUMBA`` is
``0`` or Numba cannot be imported; otherwise it runs its chunked NumPy
passes. Each function is one loop
over memory, which NumPy cannot express: it has no fused multiply-add, so
``r * g + c * w`` costs three ufunc calls, and on CPUs whose cores are not
much faster than their memory every ufunc call costs about one pass (see
``benchmarks/README.md``). Compiled, the hook's two passes run at the
streaming floor and the LARS step makes one pass over ``w``, ``g`` and
``v`` instead of six ufunc calls.

All arguments are 1-D C-contiguous arrays of one dtype, and scalars of that
dtype; the caller checks. Norms accumulate in float64. ``fastmath`` allows
only reassociation (to vectorise the sums) and contraction (fused
multiply-add), never the no-NaN/no-inf assumptions, so non-finite values
propagate as in NumPy, and no floating-point warnings are raised.
"""

import numba
import numpy


_REDUCE = {'reassoc', 'contract'}
_ELEMENTWISE = {'contract'}


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
