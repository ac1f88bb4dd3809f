"""The passes over memory that LARS makes, on CPU and for generic arrays.

Every LARS update reads each weight and gradient once for the two norms and
then once more to write the result; these functions do exactly that and
nothing else, so that the hook and the optimizer cost the streaming floor
(see ``benchmarks/bench_lars.py``). The CUDA kernels live in
:mod:`chainer_lars.cuda_kernels`.

CPU, in place, one compute layer:

- float32 and float64 arrays go to the loops Numba compiles
  (:mod:`chainer_lars.jit_kernels`; Numba is a dependency of the package):
  per array for the per-array paths, and through :class:`CpuExecutor` for
  all the arrays of a multi-tensor group at once. Arrays in a non-native
  byte order or not C-contiguous are copied into native contiguous ones
  for the loops and the results copied back, so that their result is the
  native one's, bit for bit.
- float16 and mixed-dtype arrays, and every array when Numba is unavailable
  (not importable, or ``CHAINER_LARS_NUMBA=0``), take one plain NumPy
  fallback. It computes in float32 or wider (float16 in float32) and
  accumulates norms in float64, as the compiled loops do, with whole-array
  temporaries: it is the correct path, not the fast one.
"""

import os
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


def _compiled(*arrays):
    """The compiled loops for these arrays, and the arrays to give them.

    Returns:
        tuple: ``(jit, flats, copied)``: the module, 1-D native
        C-contiguous versions of ``arrays`` (views where possible), and
        whether each is a copy that the caller must write back; ``jit`` is
        ``None`` where the loops do not apply.

    """
    jit = _jit()
    first = arrays[0]
    dtype = first.dtype
    if jit is None or dtype.char not in 'fd':
        return None, None, None
    size = first.size
    for a in arrays:
        if a.dtype != dtype or a.size != size:
            return None, None, None
    flats = []
    copied = []
    for a in arrays:
        if a.flags.c_contiguous and dtype.isnative:
            flats.append(a.reshape(-1))
            copied.append(False)
        else:
            # Numba refuses a non-native byte order, and a strided view
            # would make it compile another loop; a native copy gives the
            # native result.
            flats.append(numpy.array(a, dtype=dtype.newbyteorder('='),
                                     order='C').reshape(-1))
            copied.append(True)
    return jit, flats, copied


def _write_back(arrays, flats, copied):
    for a, flat, c in zip(arrays, flats, copied):
        if c:
            a[...] = flat.reshape(a.shape)


def _compute_dtype(*arrays):
    """float32 for float16 arrays, else the widest of theirs."""
    return numpy.promote_types(numpy.float32, numpy.result_type(*arrays))


def _sqnorm(a):
    """``||a||^2`` accumulated in float64, whatever ``a``'s dtype.

    The array is made native and contiguous first (a copy only where it is
    not), since ``einsum`` sums a strided or byte-swapped array in another
    order, which would make the result depend on the layout.

    """
    flat = numpy.ascontiguousarray(
        a, dtype=a.dtype.newbyteorder('=')).reshape(-1)
    return float(numpy.einsum('i,i->', flat, flat, dtype=numpy.float64))


def sqnorms(w, g):
    """Returns ``(||w||^2, ||g||^2)`` of two NumPy arrays as floats.

    Accumulated in float64 on every path: a float32 sum of squares would
    overflow for norms above about 1.8e19.

    """
    jit, flats, _ = _compiled(w, g)
    if jit is not None:
        return jit.sqnorms(*flats)
    return _sqnorm(w), _sqnorm(g)


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
    jit, flats, copied = _compiled(*operands)
    if jit is not None:
        t = flats[0].dtype.type
        if c != 0:
            jit.scale_add(flats[0], t(r), flats[1], t(c))
        else:
            jit.scale(flats[0], t(r))
        _write_back((g,), flats[:1], copied[:1])
        return
    ct = _compute_dtype(*operands).type
    with numpy.errstate(over='ignore', invalid='ignore'):
        u = g.astype(ct)
        u *= ct(r)
        if c != 0:
            u += ct(c) * w.astype(ct, copy=False)
        g[...] = u


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
    jit, flats, copied = _compiled(w, g, v)
    if jit is not None:
        t = flats[0].dtype.type
        step = jit.nesterov_step if nesterov else jit.momentum_step
        step(flats[0], flats[1], flats[2], t(a), t(b), t(momentum))
        _write_back((w, g, v), flats, (copied[0], False, copied[2]))
        return
    ct = _compute_dtype(w, g, v).type
    a, b, momentum = ct(a), ct(b), ct(momentum)
    with numpy.errstate(over='ignore', invalid='ignore'):
        wt = w.astype(ct)
        u = a * g.astype(ct, copy=False)
        if b != 0:
            u += b * wt
        vt = v.astype(ct)
        vt *= momentum
        vt += u
        if nesterov:
            u += momentum * vt
            wt -= u
        else:
            wt -= vt
        w[...] = wt
        v[...] = vt


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


def sqnorms_generic(xp, w, g):
    """``(||w||^2, ||g||^2)`` as 0-dim device arrays of any array module.

    Used for ChainerX, where neither NumPy nor the CUDA kernels apply; the
    result never leaves the device.

    """
    w32 = w.astype(numpy.float32) if w.dtype == numpy.float16 else w
    g32 = g.astype(numpy.float32) if g.dtype == numpy.float16 else g
    return xp.sum(w32 * w32), xp.sum(g32 * g32)
