"""The CPU executor: the compiled loop, and the NumPy passes.

Native float16, float32 and float64 groups (mixed16 ones included) take
:func:`chainer_lars._numba.multi_update` through a table of addresses;
mixed dtypes, and all arrays without Numba (or ``CHAINER_LARS_NUMBA=0``),
the NumPy passes, in float32 or wider with float64 norms, in chunks of
:data:`CHUNK` elements with reused buffers.
"""

import math
import operator
import os
import threading
import warnings

import numpy

from chainer_lars import checks
from chainer_lars import layout as L
from chainer_lars import ratio


_UNRESOLVED = object()
_jit_module = _UNRESOLVED


def _jit():
    """:mod:`chainer_lars._numba`, or ``None`` (no Numba, or disabled);
    imported on first use, not by ``import chainer_lars``."""
    global _jit_module
    if _jit_module is _UNRESOLVED:
        _jit_module = None
        if os.environ.get('CHAINER_LARS_NUMBA', '1') != '0':
            try:
                from chainer_lars import _numba as _jit_module
            except ImportError:
                pass
            except Exception as e:  # e.g. no writable cache directory
                warnings.warn(
                    'chainer_lars: Numba is installed but its kernels are '
                    'unavailable ({}: {}); using the NumPy passes. Set '
                    'CHAINER_LARS_NUMBA=0 to silence this.'.format(
                        type(e).__name__, e), RuntimeWarning)
    return _jit_module


def backend():
    """``'numba'`` when float32 and float64 arrays get the compiled loops
    (Numba installed, ``CHAINER_LARS_NUMBA`` not ``0``), else ``'numpy'``."""
    return 'numpy' if _jit() is None else 'numba'


#: Elements per chunk of the NumPy passes: chunks and scratch buffers stay
#: in the last-level cache while several ufuncs run over them.
CHUNK = 1 << 17

_local = threading.local()


def _scratch(index, dtype):
    """A reused buffer of :data:`CHUNK` elements (one set per thread)."""
    bufs = _local.__dict__.setdefault('bufs', {})
    key = (index, dtype, CHUNK)
    if key not in bufs:
        bufs[key] = numpy.empty(CHUNK, dtype=dtype)
    return bufs[key]


def native(a):
    """``a`` as a native C-contiguous array: itself, or a copy."""
    if a.flags.c_contiguous and a.dtype.isnative:
        return a
    return numpy.array(a, dtype=a.dtype.newbyteorder('='), order='C')


def _chunk(flat, index, ct, start, stop):
    """``flat[start:stop]`` in the compute dtype ``ct``: the slice itself
    where it has that dtype (operations on it write ``flat``), else a
    scratch copy (written back by :func:`_store`)."""
    piece = flat[start:stop]
    if piece.dtype == ct:
        return piece
    buf = _scratch(index, ct)[:stop - start]
    numpy.copyto(buf, piece)
    return buf


def _store(flat, start, stop, piece):
    if piece.dtype != flat.dtype:
        numpy.copyto(flat[start:stop], piece, casting='unsafe')


_FLOAT64 = numpy.dtype(numpy.float64)


def _sqnorm(flat):
    """``||a||^2`` summed in float64 with BLAS ``dot``, which neither warns
    nor raises on overflow or NaN."""
    total = 0.0
    for start in range(0, flat.size, CHUNK):
        piece = _chunk(flat, 0, _FLOAT64, start, min(start + CHUNK, flat.size))
        total += float(numpy.dot(piece, piece))
    return total


def _step(op, p, q, momentum, nesterov, ct, wf, gf, vf=None):
    """``u = p g + q w`` in chunks (``w`` unread when ``q`` is 0 for the
    hook), which is the hook's new ``g``, or the optimizer's step of
    :func:`chainer_lars._numba.momentum_step` with ``u``."""
    p, q, momentum = ct.type(p), ct.type(q), ct.type(momentum)
    multiply, add = numpy.multiply, numpy.add
    for start in range(0, gf.size, CHUNK):
        stop = min(start + CHUNK, gf.size)
        gs = _chunk(gf, 1, ct, start, stop)
        u = gs if op == L.RESCALE else _scratch(3, ct)[:stop - start]
        t = _scratch(4, ct)[:stop - start]
        multiply(gs, p, out=u)
        if q != 0 or op == L.STEP:
            ws = _chunk(wf, 0, ct, start, stop)
        if q != 0:
            multiply(ws, q, out=t)
            add(u, t, out=u)
        if op == L.RESCALE:
            _store(gf, start, stop, u)
            continue
        vs = _chunk(vf, 2, ct, start, stop)
        multiply(vs, momentum, out=vs)
        add(vs, u, out=vs)
        if nesterov:
            multiply(vs, momentum, out=t)
            add(u, t, out=u)
        numpy.subtract(ws, u if nesterov else vs, out=ws)
        _store(wf, start, stop, ws)
        _store(vf, start, stop, vs)


def _lamb(row, obs, arrays):
    """:func:`chainer_lars._numba.lamb_update` in NumPy, on native flat
    ``(w, g, m, v)``, computing in float32 or wider."""
    wf, gf, mf, vf = arrays
    if row[L.LOSS_SCALE] != 1.0:
        gf /= row[L.LOSS_SCALE]
    # NumPy 1 computes float16 arrays with float32 scalars in float16.
    ct = numpy.promote_types(numpy.float32, numpy.result_type(*arrays)).type
    b1, b2, g, w = row[L.BETA1], row[L.BETA2], gf.astype(ct), wf.astype(ct)
    mf[...] = ct(b1) * mf.astype(ct) + ct(1.0 - b1) * g
    vf[...] = ct(b2) * vf.astype(ct) + ct(1.0 - b2) * (g * g)
    # From the moments as stored, as the step of the compiled loop.
    r = (mf.astype(ct) / ct(row[L.CORRECTION1])) / (numpy.sqrt(
        vf.astype(ct) / ct(row[L.CORRECTION2])) + ct(row[L.EPS])) + ct(
            row[L.WEIGHT_DECAY]) * w
    w_norm, r_norm = math.sqrt(_sqnorm(wf)), math.sqrt(_sqnorm(r))
    obs[:] = 1.0, w_norm, r_norm
    if row[L.ADAPT]:
        obs[0] = ratio.trust_ratio(w_norm, r_norm, 0.0, 0.0, 1.0, 0.0, True,
                                   row[L.CLIP_LR])
    wf[...] = w - ct(row[L.LR] * obs[0]) * r


def numpy_update(row, obs, op, w, g, v=None, v2=None):
    """One row of :func:`chainer_lars._numba.multi_update` in NumPy, for
    any dtypes and layouts (through native copies, those written back)."""
    if op == L.LAMB:
        arrays = (w, g, v, v2)
        natives = list(map(native, arrays))
        with numpy.errstate(over='ignore', invalid='ignore', divide='ignore'):
            _lamb(row.tolist(), obs, [a.reshape(-1) for a in natives])
        for k in L.written(op, row[L.LOSS_SCALE] != 1.0):
            if natives[k] is not arrays[k]:
                arrays[k][...] = natives[k]
        return
    arrays = (w, g) if v is None else (w, g, v)
    natives = list(map(native, arrays))
    wf, gf = natives[0].reshape(-1), natives[1].reshape(-1)
    if op == L.RESCALE and gf.size == 0:
        obs[:] = numpy.nan
        return
    row = row.tolist()  # Python floats: faster than NumPy scalars
    s, wd = row[L.LOSS_SCALE], row[L.WEIGHT_DECAY]
    written = L.written(op, s != 1.0)
    r, w_norm, g_norm = 1.0, math.nan, math.nan
    # Only the ufuncs need the error state: dot and floats do not warn.
    if op == L.STEP and s != 1.0:
        with numpy.errstate(over='ignore', invalid='ignore', divide='ignore'):
            gf /= s
        s = 1.0
    if op == L.RESCALE or row[L.ADAPT]:
        w_norm = math.sqrt(_sqnorm(wf))
        g_norm = math.sqrt(_sqnorm(gf)) / s
    if row[L.ADAPT]:
        r = ratio.trust_ratio(
            w_norm, g_norm, wd, row[L.EPS], row[L.TRUST_COEFFICIENT],
            row[L.THRESHOLD], bool(row[L.REQUIRE_GRAD]), row[L.CLIP_LR])
    obs[0], obs[1], obs[2] = r, w_norm, g_norm
    p = r if op == L.RESCALE else row[L.LR] * r
    q = p * (s * wd)  # the hook's g still holds the loss scale s
    # The hook leaves g as it is where r is 1 and no decay is added.
    moves = (q != 0 or p != 1) if op == L.RESCALE else gf.size > 0
    if moves:
        ct = numpy.promote_types(numpy.float32, numpy.result_type(*arrays))
        with numpy.errstate(over='ignore', invalid='ignore'):
            _step(op, p, q, row[L.MOMENTUM], row[L.NESTEROV], ct, wf, gf,
                  *[a.reshape(-1) for a in natives[2:]])
    for k in written[:len(arrays)]:  # a read-only input stays unwritten
        if natives[k] is not arrays[k]:
            arrays[k][...] = natives[k]


def _bits(dtype):
    """The type the compiled loop stores ``dtype`` as (float16 as its
    bits), and computes it in; native (rows of another byte order go as
    copies)."""
    dtype = numpy.dtype(dtype).newbyteorder('=')
    if dtype == numpy.float16:
        return numpy.dtype(numpy.uint16), numpy.dtype(numpy.float32)
    return dtype, dtype


_NDARRAY = id(numpy.ndarray)
_LIKES = {}


def _likes(dtype, gdtype):
    """The loop's empty arrays of the storage type of ``dtype``, of
    ``gdtype`` and of the compute type, shared by the groups (each cold
    array costs the loop's call a cache miss)."""
    key = (dtype, gdtype)
    if key not in _LIKES:
        storage, compute = _bits(dtype)
        _LIKES[key] = (numpy.empty(0, storage),
                       numpy.empty(0, _bits(gdtype)[0]),
                       numpy.empty(0, compute))
    return _LIKES[key]


class _Addresses(object):

    """A group's address table (``None``: the NumPy passes) and what it was
    built from: the ids of the arrays it holds (``held`` of them), then of
    the current gradients; their stamps (:func:`chainer_lars._numba.
    restamp`) at the last check passed, and a buffer for the current ones;
    whether the gradients changed since, and whether the table holds them
    (``put``); the sizes each row takes (-2: none), the descr of the
    gradients' dtype, observations and the loop's ``likes`` (empty arrays
    of the storage and compute types)."""

    __slots__ = ('table', 'ids', 'held', 'stamps', 'now', 'changed', 'put',
                 'sizes', 'gdtype', 'descr', 'obs', 'likes')

    def __init__(self, group, jit):
        n = len(group)
        self.obs = numpy.full((n, 3), numpy.nan)
        self.gdtype = group.gdtype
        self.table = None
        if (jit is None or not jit.STAMPS or group.dtype.char not in 'efd'
                or (numpy.float16 in (group.dtype, group.gdtype)
                    and not jit.FLOAT16)):
            return
        self.likes = _likes(group.dtype, group.gdtype)
        # The builtin descr that gradients of this dtype have.
        self.descr = id(numpy.dtype(group.gdtype.char))
        self.table = table = numpy.zeros((n, L.SIZE + 1), numpy.int64)
        table[:, L.SIZE] = -1  # no gradient until one is given
        self.sizes = numpy.array([w.size for w in group.weights], numpy.int64)
        halves = group.halves or [None] * n
        held = []
        for k, (w, states, h) in enumerate(
                zip(group.weights, group.states, halves)):
            held += (w,) + tuple(states) + (() if h is None else (h,))
            if (checks.direct(group.dtype, (w,) + tuple(states))
                    and (h is None or checks.direct(group.gdtype, (h,)))):
                table[k, L.W] = w.ctypes.data
                for column, v in zip((L.V, L.V2), states):
                    table[k, column] = v.ctypes.data
                if h is not None:
                    table[k, L.H] = h.ctypes.data
            else:
                self.sizes[k] = -2
        # The group holds these arrays: their ids stay theirs.
        self.held = len(held)
        self.ids = numpy.zeros(len(held) + n, numpy.int64)
        self.ids[:len(held)] = list(map(id, held))
        self.now = numpy.zeros((len(self.ids), jit.STAMP), numpy.int64)
        self.stamps = numpy.zeros_like(self.now)
        jit.restamp(self.ids[:len(held)], _NDARRAY, self.now, self.stamps,
                    len(held))
        self.changed, self.put = True, False


def _grad_ids(tables, grads):
    """``tables.ids`` with the ids of ``grads`` after the held arrays'."""
    ids = tables.ids
    if len(grads) == 1:  # a group of one: item assignment is 6x faster
        ids[-1] = id(grads[0])
    else:
        ids[tables.held:] = list(map(id, grads))
    return ids


class _Batch(object):

    """The stamps of several groups' tables in one set of arrays, which
    :func:`chainer_lars._numba.restamp_groups` reads in one call: each
    table's ``ids``, ``now`` and ``stamps`` become views of them. Valid
    while the groups keep these ``tables``."""

    __slots__ = ('tables', 'ids', 'now', 'stamps', 'bounds', 'helds',
                 'slots', 'result')

    def __init__(self, tables):
        self.tables = tables
        self.bounds = numpy.zeros(len(tables) + 1, numpy.int64)
        numpy.cumsum([len(t.ids) for t in tables], out=self.bounds[1:])
        self.ids = numpy.concatenate([t.ids for t in tables])
        self.stamps = numpy.concatenate([t.stamps for t in tables])
        self.now = numpy.zeros_like(self.stamps)
        self.helds = numpy.array([t.held for t in tables], numpy.int64)
        # Where each gradient's id goes, in the groups' order.
        self.slots = numpy.concatenate([numpy.arange(a + t.held, b) for t, a, b
                                        in zip(tables, self.bounds,
                                               self.bounds[1:])])
        self.result = numpy.zeros((len(tables), 2), numpy.int64)
        for t, a, b in zip(tables, self.bounds.tolist(),
                           self.bounds[1:].tolist()):
            t.ids, t.now, t.stamps = (
                self.ids[a:b], self.now[a:b], self.stamps[a:b])


class CpuExecutor(object):

    """The executor of NumPy devices (see :mod:`chainer_lars.engine`)."""

    def prepare(self, group):
        group.tables = _Addresses(group, _jit())

    def changed(self, group, grads):
        """Whether the arrays of ``run(group, grads, ...)`` may differ from
        those of the last :meth:`passed` check: another gradient, or one
        changed in place (another buffer, dtype, layout, size or flags).
        The group's own arrays changed in place make its table anew."""
        tables = group.tables
        if tables.table is None:
            return True  # no stamps: NumPy checks every operation
        held, changed = _jit().restamp(_grad_ids(tables, grads), _NDARRAY,
                                       tables.stamps, tables.now, tables.held)
        if held:
            self.prepare(group)
            return self.changed(group, grads)
        tables.changed = changed > 0
        return tables.changed

    def passed(self, group):
        """The arrays of the last :meth:`changed` passed the engine's
        checks: later updates compare with them."""
        tables = group.tables
        if tables.table is not None and tables.changed:
            tables.stamps[...] = tables.now  # views of a _Batch's
            tables.put = False

    def unchanged(self, groups, grads, holder):
        """Per group, whether ``changed(group, grads[k])`` would be
        ``False``, the stamps of all read in one call (kept in ``holder.
        stamps``); ``False`` for a group that is not of this executor or
        has no stamps."""
        stamped = [k for k, group in enumerate(groups) if group.executor
                   is self and group.tables.table is not None]
        result = [False] * len(groups)
        if not stamped:
            return result
        tables = [groups[k].tables for k in stamped]
        batch = holder.stamps
        if batch is None or len(batch.tables) != len(tables) or not all(
                map(operator.is_, tables, batch.tables)):
            batch = holder.stamps = _Batch(tables)
        batch.ids[batch.slots] = [id(g) for k in stamped for g in grads[k]]
        _jit().restamp_groups(batch.ids, _NDARRAY, batch.stamps, batch.now,
                              batch.bounds, batch.helds, batch.result)
        for k, (held, changed) in zip(stamped, batch.result.tolist()):
            groups[k].tables.changed = bool(held or changed)
            result[k] = not (held or changed)
        return result

    def run_unchanged(self, group, grads, op):
        """Runs the update of :meth:`run`, in one compiled call, if the
        arrays are as at the last check passed and the table holds the
        gradients; returns whether it did."""
        tables = group.tables
        if tables.table is None or not tables.put:
            return False
        return _jit().restamp_update(
            _grad_ids(tables, grads), _NDARRAY, tables.stamps, tables.now,
            tables.held,
            tables.table, group.rows, tables.obs, *tables.likes, op)

    def run(self, group, grads, op):
        tables, rows = group.tables, group.rows
        slow = range(len(grads))
        if tables.table is not None:
            slow = self._put(group, grads)
            _jit().multi_update(tables.table, rows, tables.obs,
                                *tables.likes, op)
        rejected = []
        dtype = group.dtype.newbyteorder('=') if slow else None
        for k in slow:
            g = grads[k]
            states = group.states[k] if op != L.RESCALE else ()
            # Beside the loop, the NumPy passes take only arrays of mixed
            # dtypes; the rest goes back (the loop takes native copies).
            # Mixed16 rows go back whole: their rule converts them.
            if (g is None or group.halves is not None
                    or tables.table is not None and all(
                        a.dtype.newbyteorder('=') == dtype
                        for a in (g,) + tuple(states))):
                tables.obs[k] = numpy.nan
                rejected.append(k)
            else:
                numpy_update(rows[k], tables.obs[k], op, group.weights[k], g,
                             *states)
        return rejected

    def _put(self, group, grads):
        """Puts the gradients' addresses in the table, unless it holds
        them; returns the rows it cannot take this update (skipped by the
        loop)."""
        tables = group.tables
        if group.checked is None:  # the engine's copies: never checked
            self.changed(group, grads)
            self.passed(group)
        if tables.put:
            return []
        table, left = tables.table, []
        if _jit().put_grads(table, tables.stamps[tables.held:], tables.descr,
                            tables.sizes):
            for k in numpy.flatnonzero(table[:, L.SIZE] < 0).tolist():
                g = grads[k]
                # Another descr of the dtype, or a subclass: as it is.
                if (g is not None and tables.sizes[k] == g.size
                        and checks.direct(tables.gdtype, (g,))):
                    table[k, L.G] = g.ctypes.data
                    table[k, L.SIZE] = g.size
                else:
                    left.append(k)
        tables.put = not left
        return left

    def observe(self, group):
        return group.tables.obs


executor = CpuExecutor()
