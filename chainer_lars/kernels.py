"""The passes over memory that LARS makes, on CPU and for generic arrays.

Every LARS update reads each weight and gradient once for the two norms and
then once more to write the result; these functions do exactly that and
nothing else, so that the hook and the optimizer cost the streaming floor
(see ``benchmarks/bench_lars.py``). The CUDA kernels live in
:mod:`chainer_lars.cuda_kernels`.

CPU, NumPy, in place. NumPy evaluates ``r * g + c * w`` as separate passes
with an array-sized temporary; the passes here walk the arrays in chunks of
:data:`CHUNK` elements with a reused scratch buffer, so each chunk is read
from memory once and the remaining arithmetic runs in cache. That keeps the
traffic at the floor without a compiled extension or a new runtime
dependency. The norms use BLAS ``dot``, which streams at memory speed.
float16 arrays are processed in float32 chunks: the norms are accumulated
in float32 or wider, never in float16.
"""

import functools
import threading

import numpy


#: Elements per chunk. 32 Ki elements is 128 KiB of float32 per operand, so
#: the chunks of ``w``, ``g``, a momentum buffer and the scratch buffers
#: together stay in a core's L2 cache.
CHUNK = 1 << 15

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


def _quiet(func):
    """Runs ``func`` without NumPy's overflow and invalid-value warnings.

    Non-finite gradients are expected under dynamic loss scaling, which
    detects them and skips the update; they must pass through silently and
    stay confined to their own array.

    """
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with numpy.errstate(over='ignore', invalid='ignore'):
            return func(*args, **kwargs)
    return wrapper


def _is_fast(*arrays):
    """Whether the in-place chunked passes apply to these arrays."""
    dtype = arrays[0].dtype
    return all(a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def _sqnorm(a):
    """``||a||^2`` as a Python float, accumulated in float32 or wider."""
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


@_quiet
def sqnorms(w, g):
    """Returns ``(||w||^2, ||g||^2)`` of two NumPy arrays as floats."""
    return _sqnorm(w), _sqnorm(g)


@_quiet
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
    if not _is_fast(g, w):
        g[...] = r * g.astype(numpy.float64) + c * w.astype(numpy.float64)
        return
    gf = g.reshape(-1)
    if c == 0 and g.dtype != numpy.float16:
        gf *= r
        return
    wf = w.reshape(-1)
    if g.dtype == numpy.float16:
        bg = _scratch(0, numpy.float32)
        bw = _scratch(1, numpy.float32)
        for start in range(0, gf.size, CHUNK):
            gs = gf[start:start + CHUNK]
            n = gs.size
            numpy.copyto(bg[:n], gs)
            numpy.multiply(bg[:n], r, out=bg[:n])
            numpy.copyto(bw[:n], wf[start:start + n])
            numpy.multiply(bw[:n], c, out=bw[:n])
            numpy.add(bg[:n], bw[:n], out=bg[:n])
            numpy.copyto(gs, bg[:n], casting='unsafe')
        return
    buf = _scratch(0, g.dtype)
    for start in range(0, gf.size, CHUNK):
        gs = gf[start:start + CHUNK]
        b = buf[:gs.size]
        numpy.multiply(wf[start:start + gs.size], c, out=b)
        numpy.multiply(gs, r, out=gs)
        numpy.add(gs, b, out=gs)


@_quiet
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
    if not _is_fast(w, g, v):
        u = a * g.astype(numpy.float64) + b * w.astype(numpy.float64)
        v_new = momentum * v + u
        v[...] = v_new
        w[...] = w - (u + momentum * v_new if nesterov else v_new)
        return
    wf, gf, vf = w.reshape(-1), g.reshape(-1), v.reshape(-1)
    if w.dtype == numpy.float16:
        _momentum_step_upcast(wf, gf, vf, a, b, momentum, nesterov)
        return
    bu = _scratch(0, w.dtype)
    bt = _scratch(1, w.dtype)
    for start in range(0, wf.size, CHUNK):
        ws = wf[start:start + CHUNK]
        n = ws.size
        gs, vs, u, t = gf[start:start + n], vf[start:start + n], bu[:n], bt[:n]
        numpy.multiply(gs, a, out=u)
        numpy.multiply(ws, b, out=t)
        numpy.add(u, t, out=u)
        numpy.multiply(vs, momentum, out=vs)
        numpy.add(vs, u, out=vs)
        if nesterov:
            numpy.multiply(vs, momentum, out=t)
            numpy.add(u, t, out=u)
            numpy.subtract(ws, u, out=ws)
        else:
            numpy.subtract(ws, vs, out=ws)


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
