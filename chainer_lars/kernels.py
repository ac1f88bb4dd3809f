"""The passes over memory that LARS makes, on CPU and for generic arrays.

Every LARS update reads each weight and gradient once for the two norms and
then once more to write the result; these functions do exactly that and
nothing else, so that the hook and the optimizer cost the streaming floor
(see ``benchmarks/bench_lars.py``). The CUDA kernels live in
:mod:`chainer_lars.cuda_kernels`.

CPU, in place, two implementations of the same functions:

- With Numba (a dependency of the package), float32 and
  float64 arrays go to :mod:`chainer_lars.jit_kernels`: one compiled loop
  per pass, which reaches the streaming floor.
- Otherwise, and for float16, mixed or non-contiguous arrays, NumPy. NumPy
  evaluates ``r * g + c * w`` as separate passes with an array-sized
  temporary; the passes here walk the arrays in chunks of :data:`CHUNK`
  elements with a reused scratch buffer, so each chunk is read from memory
  once and the remaining arithmetic runs in cache. That keeps the traffic
  at the floor, but not the time: NumPy has no fused multiply-add, and on
  CPUs whose cores are not much faster than their memory (the 2-core EPYC
  VM of ``benchmarks/README.md``) every ufunc call costs about as much as
  a pass, so these passes are arranged for the fewest ufunc calls. The
  norms use BLAS ``dot``, which streams at memory speed. float16 arrays are
  processed in float32 chunks: the norms are accumulated in float32 or
  wider, never in float16.

numexpr, BLAS ``saxpby`` (through ctypes) and two threads were measured
and were slower than chunked NumPy (``benchmarks/README.md``).
"""

import os
import threading
import warnings

import numpy


#: Elements per chunk of the NumPy passes: 128 Ki elements, 512 KiB of
#: float32 per operand, so the chunks of ``w``, ``g``, a momentum buffer and
#: two scratch buffers (2.5 MiB) stay in the last-level cache. Smaller
#: chunks that fit L2 were slower where measured: each chunk costs three to
#: six ufunc calls of 1-2 us overhead (ResNet-50 hook, CPU time: 31.5 ms at
#: 32 Ki, 27.7 ms at 128 Ki, 27.4 ms at 256 Ki).
CHUNK = 1 << 17

_local = threading.local()


def _scratch(index, dtype):
    """A reused buffer of :data:`CHUNK` elements (one per thread)."""
    bufs = getattr(_local, 'bufs', None)
    if bufs is None:
        bufs = _local.bufs = {}
    key = (index, numpy.dtype(dtype))
    buf = bufs.get(key)
    if buf is None:
        buf = bufs[key] = numpy.empty(CHUNK, dtype=dtype)
    return buf


if hasattr(numpy, 'geterrobj'):
    # NumPy 1.x: numpy.errstate costs about 5 us per use (Python-level
    # geterr/seterr), which is as much as a whole small array's pass and is
    # paid for each of ResNet-50's 162 arrays; setting the error mask
    # directly costs under 1 us. NumPy 2 removed these functions and made
    # errstate a cheap context variable.
    from numpy.core import umath as _umath

    _QUIET_MASK = ~((7 << _umath.SHIFT_OVERFLOW)
                    | (7 << _umath.SHIFT_INVALID))

    class _Quiet(object):

        __slots__ = ('saved',)

        def __enter__(self):
            self.saved = numpy.geterrobj()
            quiet = list(self.saved)
            quiet[1] &= _QUIET_MASK
            numpy.seterrobj(quiet)

        def __exit__(self, *exc_info):
            numpy.seterrobj(self.saved)

    def _quiet():
        """Ignores overflow and invalid values in the ufuncs inside.

        Non-finite gradients are expected under dynamic loss scaling, which
        detects them and skips the update; they must pass through silently
        and stay confined to their own array.

        """
        return _Quiet()
else:
    def _quiet():
        return numpy.errstate(over='ignore', invalid='ignore')


def _is_fast(*arrays):
    """Whether the in-place chunked passes apply to these arrays."""
    dtype = arrays[0].dtype
    return all(a.dtype == dtype and a.flags.c_contiguous for a in arrays)


_UNRESOLVED = object()
_jit_module = _UNRESOLVED


def _jit():
    """:mod:`chainer_lars.jit_kernels`, or ``None`` (no Numba, or disabled).

    Imported on first use, so that ``import chainer_lars`` does not pay for
    importing Numba.

    """
    global _jit_module
    if _jit_module is _UNRESOLVED:
        _jit_module = None
        if os.environ.get('CHAINER_LARS_NUMBA', '1') != '0':
            try:
                from chainer_lars import jit_kernels
            except ImportError:
                pass
            except Exception as e:
                # Numba is there but cannot set up (e.g. no writable cache
                # directory): slower is better than failing the update.
                warnings.warn(
                    'chainer_lars: Numba is installed but its kernels are '
                    'unavailable ({}: {}); using the NumPy passes. Set '
                    'CHAINER_LARS_NUMBA=0 to silence this.'.format(
                        type(e).__name__, e), RuntimeWarning)
            else:
                _jit_module = jit_kernels
    return _jit_module


def backend():
    """Which CPU passes float32 and float64 arrays get.

    Returns:
        str: ``'numba'`` when Numba is installed and ``CHAINER_LARS_NUMBA``
        is not ``0``, else ``'numpy'``.

    """
    return 'numpy' if _jit() is None else 'numba'


def _jit_for(*arrays):
    """The compiled passes if they apply to these arrays, else ``None``."""
    jit = _jit()
    if jit is None:
        return None
    first = arrays[0]
    if first.dtype.char not in 'fd':
        return None
    size = first.size
    for a in arrays:
        if (a.dtype != first.dtype or a.size != size
                or not a.flags.c_contiguous):
            return None
    return jit


def _sqnorm(a):
    """``||a||^2`` as a Python float, accumulated in float32 or wider.

    BLAS ``dot`` neither raises nor warns on overflow or NaN (it is not a
    ufunc), so no error state is needed here.

    """
    if a.size == 0:
        return 0.0
    flat = a.reshape(-1)
    if a.dtype != numpy.float16:
        return float(numpy.dot(flat, flat))
    buf = _scratch(0, numpy.float32)
    total = 0.0
    for start in range(0, flat.size, CHUNK):
        chunk = flat[start:start + CHUNK]
        b = buf[:chunk.size]
        numpy.copyto(b, chunk)
        total += float(numpy.dot(b, b))
    return total


def sqnorms(w, g):
    """Returns ``(||w||^2, ||g||^2)`` of two NumPy arrays as floats."""
    jit = _jit_for(w, g)
    if jit is not None:
        return jit.sqnorms(w.reshape(-1), g.reshape(-1))
    return _sqnorm(w), _sqnorm(g)


def scale_add(g, r, w, c):
    """``g <- r * g + c * w`` in place, in one pass over memory.

    Args:
        g (numpy.ndarray): The gradient, overwritten.
        r (float): Its factor.
        w (numpy.ndarray): The weight, read only.
        c (float): Its factor.

    """
    if g.size == 0 or (c == 0 and r == 1):
        return
    jit = _jit_for(g, w) if c != 0 else None
    if jit is not None:
        t = g.dtype.type
        jit.scale_add(g.reshape(-1), t(r), w.reshape(-1), t(c))
        return
    with _quiet():
        if not _is_fast(g, w):
            g[...] = r * g.astype(numpy.float64) + c * w.astype(numpy.float64)
        elif g.dtype == numpy.float16:
            _scale_add_upcast(g.reshape(-1), r, w.reshape(-1), c)
        elif c == 0:
            numpy.multiply(g, g.dtype.type(r), out=g)
        else:
            _scale_add_chunks(g.reshape(-1), g.dtype.type(r),
                              w.reshape(-1), g.dtype.type(c))


def _scale_add_chunks(gf, r, wf, c):
    # NumPy has no fused multiply-add, so this is three ufunc calls per
    # chunk; only the first two touch memory, the sum runs in cache.
    multiply, add = numpy.multiply, numpy.add
    buf = _scratch(0, gf.dtype)
    size = gf.size
    for start in range(0, size, CHUNK):
        stop = min(start + CHUNK, size)
        gs = gf[start:stop]
        b = buf[:stop - start]
        multiply(wf[start:stop], c, out=b)
        multiply(gs, r, out=gs)
        add(gs, b, out=gs)


def _scale_add_upcast(gf, r, wf, c):
    """:func:`scale_add` for float16 arrays, computed in float32."""
    bg = _scratch(0, numpy.float32)
    bw = _scratch(1, numpy.float32)
    for start in range(0, gf.size, CHUNK):
        gs = gf[start:start + CHUNK]
        n = gs.size
        numpy.copyto(bg[:n], gs)
        numpy.multiply(bg[:n], r, out=bg[:n])
        if c != 0:
            numpy.copyto(bw[:n], wf[start:start + n])
            numpy.multiply(bw[:n], c, out=bw[:n])
            numpy.add(bg[:n], bw[:n], out=bg[:n])
        numpy.copyto(gs, bg[:n], casting='unsafe')


def rescale(g, w, c, ratio):
    """``g <- r * (g + c * w)`` in place, with ``r`` from the norms.

    ``r = ratio(||w||^2, ||g||^2)`` is computed from the incoming ``g``.
    This is :func:`sqnorms` followed by :func:`scale_add` with ``(r, r * c)``,
    but cheaper for float32 and float64: the norm pass also adds ``c * w``
    to each chunk while it is in cache, and the second pass is a single
    in-place multiply, five ufunc calls per element instead of six (on
    ResNet-50's arrays the hook's CPU time drops by about 15 %). float16
    keeps the two-call path, which rounds to float16 once, not twice.

    Args:
        g (numpy.ndarray): The gradient, overwritten.
        w (numpy.ndarray): The weight, read only.
        c (float): The factor of ``w`` (weight decay times loss scale).
        ratio (callable): ``ratio(w_sq, g_sq)`` returns ``r`` as a float.

    Returns:
        tuple of float: ``(||w||^2, ||g||^2)`` of the incoming arrays.

    """
    if (g.size == 0 or g.dtype == numpy.float16 or c == 0
            or not _is_fast(g, w) or _jit_for(g, w) is not None):
        # With Numba, sqnorms and scale_add are one pass each already.
        w_sq, g_sq = sqnorms(w, g)
        r = ratio(w_sq, g_sq)
        scale_add(g, r, w, r * c)
        return w_sq, g_sq
    gf, wf = g.reshape(-1), w.reshape(-1)
    with _quiet():
        w_sq, g_sq = _sqnorms_add_chunks(gf, wf, g.dtype.type(c))
        r = ratio(w_sq, g_sq)
        if r != 1:
            numpy.multiply(gf, g.dtype.type(r), out=gf)
    return w_sq, g_sq


def _sqnorms_add_chunks(gf, wf, c):
    dot, multiply, add = numpy.dot, numpy.multiply, numpy.add
    buf = _scratch(0, gf.dtype)
    size = gf.size
    w_sq = g_sq = 0.0
    for start in range(0, size, CHUNK):
        stop = min(start + CHUNK, size)
        gs, ws = gf[start:stop], wf[start:stop]
        b = buf[:stop - start]
        w_sq += float(dot(ws, ws))
        g_sq += float(dot(gs, gs))
        multiply(ws, c, out=b)
        add(gs, b, out=gs)
    return w_sq, g_sq


def momentum_step(w, g, v, a, b, momentum, nesterov):
    """One fused LARS momentum step on NumPy arrays, in place.

    With ``u = a * g + b * w``::

        v <- momentum * v + u
        w <- w - v                      (classic)
        w <- w - (u + momentum * v)     (Nesterov)

    The caller folds the learning rate, the trust ratio, the weight decay and
    the loss scale into ``a`` and ``b``. ``g`` is only read.

    """
    if w.size == 0:
        return
    jit = _jit_for(w, g, v)
    if jit is not None:
        t = w.dtype.type
        step = jit.nesterov_step if nesterov else jit.momentum_step
        step(w.reshape(-1), g.reshape(-1), v.reshape(-1), t(a), t(b),
             t(momentum))
        return
    with _quiet():
        if not _is_fast(w, g, v):
            u = a * g.astype(numpy.float64) + b * w.astype(numpy.float64)
            v_new = momentum * v + u
            v[...] = v_new
            w[...] = w - (u + momentum * v_new if nesterov else v_new)
        elif w.dtype == numpy.float16:
            _momentum_step_upcast(w.reshape(-1), g.reshape(-1),
                                  v.reshape(-1), a, b, momentum, nesterov)
        else:
            t = w.dtype.type
            _momentum_step_chunks(w.reshape(-1), g.reshape(-1),
                                  v.reshape(-1), t(a), t(b), t(momentum),
                                  nesterov)


def _momentum_step_chunks(wf, gf, vf, a, b, momentum, nesterov):
    # Six ufunc calls per chunk (four without weight decay); the first
    # touches of g, w and v read memory, the rest runs in cache.
    multiply, add, subtract = numpy.multiply, numpy.add, numpy.subtract
    bu = _scratch(0, wf.dtype)
    bt = _scratch(1, wf.dtype)
    size = wf.size
    for start in range(0, size, CHUNK):
        stop = min(start + CHUNK, size)
        n = stop - start
        ws, gs, vs = wf[start:stop], gf[start:stop], vf[start:stop]
        u, t = bu[:n], bt[:n]
        multiply(gs, a, out=u)
        if b:
            multiply(ws, b, out=t)
            add(u, t, out=u)
        multiply(vs, momentum, out=vs)
        add(vs, u, out=vs)
        if nesterov:
            multiply(vs, momentum, out=t)
            add(u, t, out=u)
            subtract(ws, u, out=ws)
        else:
            subtract(ws, vs, out=ws)


def _momentum_step_upcast(wf, gf, vf, a, b, momentum, nesterov):
    """:func:`momentum_step` for float16 arrays, computed in float32."""
    bw = _scratch(0, numpy.float32)
    bg = _scratch(1, numpy.float32)
    bv = _scratch(2, numpy.float32)
    for start in range(0, wf.size, CHUNK):
        ws = wf[start:start + CHUNK]
        n = ws.size
        w32, g32, v32 = bw[:n], bg[:n], bv[:n]
        numpy.copyto(w32, ws)
        numpy.copyto(g32, gf[start:start + n])
        numpy.copyto(v32, vf[start:start + n])
        numpy.multiply(g32, a, out=g32)
        g32 += b * w32
        v32 *= momentum
        v32 += g32
        if nesterov:
            g32 += momentum * v32
            w32 -= g32
        else:
            w32 -= v32
        numpy.copyto(ws, w32, casting='unsafe')
        numpy.copyto(vf[start:start + n], v32, casting='unsafe')


def sqnorms_generic(xp, w, g):
    """``(||w||^2, ||g||^2)`` as 0-dim device arrays of any array module.

    Used for ChainerX, where neither NumPy nor the CUDA kernels apply; the
    result never leaves the device.

    """
    w32 = w.astype(numpy.float32) if w.dtype == numpy.float16 else w
    g32 = g.astype(numpy.float32) if g.dtype == numpy.float16 else g
    return xp.sum(w32 * w32), xp.sum(g32 * g32)
