"""The passes over memory that LARS makes on CPU.

Every LARS update reads each weight and gradient once for the two norms and
then once more to write the result; these functions do exactly that and
nothing else, so that the hook and the optimizer cost the streaming floor
(see ``benchmarks/bench_lars.py``). The CUDA kernels live in
:mod:`chainer_lars.cuda_kernels`.

CPU, in place, one compute layer:

- float32 and float64 arrays go to the loops Numba compiles
  (:mod:`chainer_lars.jit_kernels`; Numba is a dependency of the package):
  per array for the per-array paths, and through :class:`CpuExecutor` for
  all the arrays of a multi-tensor group at once.
- float16 and mixed-dtype arrays, and every array when Numba is unavailable
  (not importable, or ``CHAINER_LARS_NUMBA=0``), take one NumPy fallback.
  It computes in float32 or wider (float16 in float32) and accumulates
  norms in float64, as the compiled loops do, in chunks of :data:`CHUNK`
  elements with reused scratch buffers, so that each chunk is read from
  memory once and the remaining ufunc calls run in cache: whole-array
  temporaries made it 1.2-1.3x slower on float16 and 1.3-2.2x on float32
  (``benchmarks/README.md``).

Arrays in a non-native byte order or not C-contiguous go through native
contiguous copies on both paths, and the results are copied back, so that
their result is the native one's, bit for bit.
"""

import os
import threading
import warnings

import numpy

from chainer_lars import multi_tensor as _mt


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


#: Elements per chunk of the NumPy fallback: 128 Ki elements, so that the
#: chunks of the operands and the scratch buffers (at most 5 MiB in
#: float64) stay in the last-level cache while several ufuncs run over
#: them; smaller chunks pay the fixed cost of each ufunc call more often
#: (measurements in benchmarks/README.md).
CHUNK = 1 << 17

_local = threading.local()


def _scratch(index, dtype):
    """A reused buffer of :data:`CHUNK` elements (one set per thread)."""
    bufs = getattr(_local, 'bufs', None)
    if bufs is None:
        bufs = _local.bufs = {}
    key = (index, numpy.dtype(dtype), CHUNK)
    buf = bufs.get(key)
    if buf is None:
        buf = bufs[key] = numpy.empty(CHUNK, dtype=dtype)
    return buf


def _flat(*arrays):
    """1-D native C-contiguous versions of ``arrays``, views where possible.

    Returns:
        tuple: ``(flats, copied)``, ``copied`` telling for each whether it
        is a copy that the caller must write back. Numba refuses a
        non-native byte order and a strided view would make it compile
        another loop; in the fallback, NumPy would sum a strided array in
        another order. A native contiguous copy gives the native result,
        bit for bit, on both paths.

    """
    flats = []
    copied = []
    for a in arrays:
        if a.flags.c_contiguous and a.dtype.isnative:
            flats.append(a.reshape(-1))
            copied.append(False)
        else:
            flats.append(numpy.array(a, dtype=a.dtype.newbyteorder('='),
                                     order='C').reshape(-1))
            copied.append(True)
    return flats, copied


def _write_back(arrays, flats, copied):
    for a, flat, c in zip(arrays, flats, copied):
        if c:
            a[...] = flat.reshape(a.shape)


def _compiled(*arrays):
    """The compiled loops if they take these arrays (float32 or float64,
    one dtype and size), else ``None``."""
    jit = _jit()
    first = arrays[0]
    if jit is None or first.dtype.char not in 'fd':
        return None
    for a in arrays:
        if a.dtype != first.dtype or a.size != first.size:
            return None
    return jit


def _compute_dtype(*arrays):
    """float32 for float16 arrays, else the widest of theirs."""
    return numpy.promote_types(numpy.float32, numpy.result_type(*arrays))


def _chunk(flat, index, dtype, start, stop):
    """``flat[start:stop]`` in ``dtype``: the slice itself where it has that
    dtype (operations on it write ``flat``), else a scratch copy."""
    piece = flat[start:stop]
    if piece.dtype == dtype:
        return piece
    buf = _scratch(index, dtype)[:stop - start]
    numpy.copyto(buf, piece)
    return buf


def _store(flat, start, stop, piece):
    """Writes back what :func:`_chunk` copied (another dtype than
    ``flat``'s); a slice of ``flat`` is there already."""
    if piece.dtype != flat.dtype:
        numpy.copyto(flat[start:stop], piece, casting='unsafe')


def _sqnorm(flat):
    """``||a||^2`` of a native contiguous 1-D array, summed in float64.

    BLAS ``dot`` on float64 chunks: it neither raises nor warns on
    overflow or NaN (it is not a ufunc), so no error state is needed.

    """
    total = 0.0
    for start in range(0, flat.size, CHUNK):
        piece = _chunk(flat, 0, numpy.float64, start,
                       min(start + CHUNK, flat.size))
        total += float(numpy.dot(piece, piece))
    return total


def sqnorms(w, g):
    """Returns ``(||w||^2, ||g||^2)`` of two NumPy arrays as floats.

    Accumulated in float64 on every path: a float32 sum of squares would
    overflow for norms above about 1.8e19.

    """
    (wf, gf), _ = _flat(w, g)
    jit = _compiled(w, g)
    if jit is not None:
        return jit.sqnorms(wf, gf)
    return _sqnorm(wf), _sqnorm(gf)


def scale_add(g, r, w, c):
    """``g <- r * g + c * w`` in place, in one pass over memory.

    Args:
        g (numpy.ndarray): The gradient, overwritten.
        r (float): Its factor.
        w (numpy.ndarray): The weight, read only.
        c (float): Its factor; with 0, ``w`` is not read.

    """
    if g.size == 0 or (c == 0 and r == 1):
        return
    operands = (g, w) if c != 0 else (g,)
    flats, copied = _flat(*operands)
    gf = flats[0]
    jit = _compiled(*operands)
    if jit is not None:
        t = gf.dtype.type
        if c != 0:
            jit.scale_add(gf, t(r), flats[1], t(c))
        else:
            jit.scale(gf, t(r))
    else:
        ct = _compute_dtype(*operands)
        r, c = ct.type(r), ct.type(c)
        # NumPy has no fused multiply-add: three ufunc calls per chunk,
        # of which only the first touch of each operand reads memory.
        with numpy.errstate(over='ignore', invalid='ignore'):
            for start in range(0, gf.size, CHUNK):
                stop = min(start + CHUNK, gf.size)
                gs = _chunk(gf, 0, ct, start, stop)
                if c != 0:
                    t = _scratch(2, ct)[:stop - start]
                    numpy.multiply(_chunk(flats[1], 1, ct, start, stop), c,
                                   out=t)
                    numpy.multiply(gs, r, out=gs)
                    numpy.add(gs, t, out=gs)
                else:
                    numpy.multiply(gs, r, out=gs)
                _store(gf, start, stop, gs)
    _write_back((g,), flats[:1], copied[:1])


def momentum_step(w, g, v, a, b, momentum, nesterov):
    """One fused LARS momentum step on NumPy arrays, in place.

    With ``u = a * g + b * w``::

        v <- momentum * v + u
        w <- w - v                      (classic)
        w <- w - (u + momentum * v)     (Nesterov)

    The caller folds the learning rate, the trust ratio and the weight
    decay into ``a`` and ``b``. ``g`` is only read.

    """
    if w.size == 0:
        return
    (wf, gf, vf), copied = _flat(w, g, v)
    jit = _compiled(w, g, v)
    if jit is not None:
        t = wf.dtype.type
        step = jit.nesterov_step if nesterov else jit.momentum_step
        step(wf, gf, vf, t(a), t(b), t(momentum))
    else:
        ct = _compute_dtype(w, g, v)
        a, b, momentum = ct.type(a), ct.type(b), ct.type(momentum)
        with numpy.errstate(over='ignore', invalid='ignore'):
            for start in range(0, wf.size, CHUNK):
                stop = min(start + CHUNK, wf.size)
                _momentum_chunk(wf, gf, vf, start, stop, ct, a, b,
                                momentum, nesterov)
    _write_back((w, v), (wf, vf), (copied[0], copied[2]))


def _momentum_chunk(wf, gf, vf, start, stop, ct, a, b, momentum, nesterov):
    # Six ufunc calls (four without weight decay); the first touches of g,
    # w and v read memory, the rest runs in cache.
    multiply, add, subtract = numpy.multiply, numpy.add, numpy.subtract
    ws = _chunk(wf, 0, ct, start, stop)
    vs = _chunk(vf, 2, ct, start, stop)
    u = _scratch(3, ct)[:stop - start]
    t = _scratch(4, ct)[:stop - start]
    multiply(_chunk(gf, 1, ct, start, stop), a, out=u)
    if b != 0:
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
    _store(wf, start, stop, ws)
    _store(vf, start, stop, vs)


class _CpuTables(object):

    """What :class:`CpuExecutor` keeps for one group (``group.tables``).

    ``table`` has a row per array (columns ``W``, ``G``, ``V``, ``SIZE`` of
    :mod:`chainer_lars.multi_tensor`); a row whose size is negative has no
    gradient this update and is skipped. ``grads`` are the gradients whose
    addresses the table holds, ``ids`` their ids when it holds all of them,
    ``sizes`` the arrays' sizes.

    """

    __slots__ = ('table', 'sizes', 'grads', 'ids', 'obs', 'like')

    def __init__(self, table, sizes, dtype):
        self.table = table
        self.sizes = sizes
        self.grads = [None] * len(sizes)
        self.ids = None
        self.obs = numpy.full((len(sizes), 3), numpy.nan)
        self.like = numpy.empty(0, dtype)


class CpuExecutor(object):

    """The multi-tensor passes on CPU, with the compiled loops.

    Implements the executor interface of :mod:`chainer_lars.multi_tensor`:
    one call of :func:`chainer_lars.jit_kernels.lars_multi_step` (or
    ``hook_multi_rescale``) per update and group, which walks an int64 table
    of the arrays' addresses and sizes built once per plan; only the
    addresses of gradients that are new objects are written each update.

    """

    def __init__(self, jit):
        self._jit = jit

    def supports(self, *arrays):
        """Native, C-contiguous float32 or float64 arrays of one dtype."""
        dtype = arrays[0].dtype
        if dtype.char not in 'fd' or not dtype.isnative:
            return False
        return all(a.dtype == dtype and a.flags.c_contiguous
                   for a in arrays)

    def prepare(self, group):
        n = len(group)
        table = numpy.zeros((n, _mt.TABLE_COLUMNS), numpy.int64)
        address = self._jit.address
        for k, (w, states) in enumerate(zip(group.weights, group.states)):
            table[k, _mt.W] = address(w)
            if states:
                table[k, _mt.V] = address(states[0])
        sizes = [w.size for w in group.weights]
        table[:, _mt.SIZE] = -1  # no gradient until one is given
        group.tables = _CpuTables(table, sizes, group.dtype)

    def _set_grads(self, group, grads):
        """Puts the gradients' addresses in the table; returns the indices
        of those it cannot take (``None``, another dtype or size, not
        contiguous), whose rows are skipped this update."""
        tables = group.tables
        ids = list(map(id, grads))
        if ids == tables.ids:
            # The same arrays as last time (held in tables.grads, so their
            # ids are not reused), e.g. gradients kept across updates.
            return []
        table, sizes, cached = tables.table, tables.sizes, tables.grads
        dtype = group.dtype
        put = self._jit.put_grad
        rejected = []
        for k, g in enumerate(grads):
            if g is cached[k] and g is not None:
                continue
            # The dtype is checked here: Numba cannot type a non-native one.
            if (g is not None and g.dtype == dtype
                    and put(table, k, g, sizes[k])):
                cached[k] = g
            else:
                cached[k] = None
                table[k, _mt.SIZE] = -1
                rejected.append(k)
        tables.ids = None if rejected else ids
        return rejected

    def lars_step(self, group, grads, hyper, form):
        tables = group.tables
        rejected = self._set_grads(group, grads)
        self._jit.lars_multi_step(tables.table, hyper, tables.obs,
                                  tables.like, form.threshold,
                                  form.require_grad)
        return rejected

    def hook_rescale(self, group, grads, hyper, form, eps,
                     trust_coefficient):
        tables = group.tables
        rejected = self._set_grads(group, grads)
        self._jit.hook_multi_rescale(tables.table, hyper, tables.obs,
                                     tables.like, form.threshold,
                                     form.require_grad, eps,
                                     trust_coefficient)
        return rejected

    def observe(self, group):
        return group.tables.obs


def cpu_executor():
    """The :class:`CpuExecutor`, or ``None`` when Numba is unavailable."""
    jit = _jit()
    if jit is None:
        return None
    executor = _executors.get(jit)
    if executor is None:
        executor = _executors[jit] = CpuExecutor(jit)
    return executor


_executors = {}
