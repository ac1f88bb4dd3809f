"""The CPU executor: the compiled loop's tables, and the NumPy passes."""

import math
import os
import warnings

import numpy

from chainer_lars import checks
from chainer_lars import layout as L
from chainer_lars import ratio


_jit_module = _UNRESOLVED = object()


def _jit():
    """:mod:`chainer_lars._numba` (imported on first use), or ``None``."""
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
    return 'numpy' if _jit() is None else 'numba'


def native(a, dtype=None):
    """``a`` if native, C-contiguous, aligned (of ``dtype``), else a copy."""
    dtype = a.dtype.newbyteorder('=') if dtype is None else dtype
    return a if checks.direct(dtype, (a,)) else numpy.array(
        a, dtype=dtype, order='C')


def _norm(a):
    """``||a||`` in float64 by BLAS ``dot`` (no warning on overflow)."""
    a = a.astype(numpy.float64, copy=False)
    return math.sqrt(float(numpy.dot(a, a)))


def _lamb(row, obs, w, g, m, v, ct):
    """:func:`chainer_lars._numba.lamb_row`; returns the new ``w``."""
    b1, b2, g, w = row[L.BETA1], row[L.BETA2], g.astype(ct), w.astype(ct)
    m[...] = ct(b1) * m.astype(ct) + ct(1.0 - b1) * g
    v[...] = ct(b2) * v.astype(ct) + ct(1.0 - b2) * (g * g)
    # From the moments as stored, as the step of the compiled loop.
    r = (m.astype(ct) / ct(row[L.CORRECTION1])) / (numpy.sqrt(
        v.astype(ct) / ct(row[L.CORRECTION2])) + ct(row[L.EPS])) + ct(
            row[L.WEIGHT_DECAY]) * w
    obs[:3] = 1.0, _norm(w), _norm(r)
    if row[L.ADAPT]:
        obs[0] = ratio.trust_ratio(obs[1], obs[2], 0.0, 0.0, 1.0, 0.0, True,
                                   row[L.CLIP_LR])
    a = row[L.LR] * obs[0]  # past float32's range: in float64
    return w - (a * r.astype(float) if math.isinf(ct(a)) else ct(a) * r)


def _momentum(row, obs, op, w, g, v, ct):
    """The hook's new ``g``, or ``_numba.step_row``'s new ``w``."""
    s = row[L.LOSS_SCALE] if op == L.RESCALE else 1.0
    r, w_norm, g_norm = 1.0, math.nan, math.nan
    if op == L.RESCALE or row[L.ADAPT]:
        w_norm, g_norm = _norm(w), _norm(g) / s
    if row[L.ADAPT]:
        r = ratio.trust_ratio(w_norm, g_norm, row[L.WEIGHT_DECAY], row[L.EPS],
                              row[L.TRUST_COEFFICIENT], row[L.THRESHOLD],
                              bool(row[L.REQUIRE_GRAD]), row[L.CLIP_LR])
    obs[:3] = r, w_norm, g_norm
    p = r if op == L.RESCALE else row[L.LR] * r
    q = p * (s * row[L.WEIGHT_DECAY])  # the hook's g holds the loss scale
    ct = numpy.float64 if math.isinf(ct(p)) else ct  # past float32's range
    u = ct(p) * g.astype(ct)
    if q != 0:  # w unread where 0: 0 * inf would be NaN
        u += ct(q) * w.astype(ct)
    if op == L.RESCALE:
        return u
    m = ct(row[L.MOMENTUM])
    v[...] = v.astype(ct) * m + u
    v = v.astype(ct)
    return w.astype(ct) - (u + v * m if row[L.NESTEROV] else v)


def numpy_update(row, obs, op, *arrays):
    """One row of ``_numba.multi_update`` in NumPy, any dtypes and layouts."""
    natives = list(map(native, arrays))
    flat = [a.reshape(-1) for a in natives]
    row = row.tolist()  # Python floats: faster than NumPy scalars
    obs[:] = numpy.nan
    # NumPy 1 computes float16 arrays with float32 scalars in float16.
    ct = numpy.promote_types(numpy.float32, numpy.result_type(*flat)).type
    with numpy.errstate(over='ignore', invalid='ignore', divide='ignore'):
        if op != L.RESCALE and row[L.LOSS_SCALE] != 1.0:
            flat[1] /= row[L.LOSS_SCALE]  # as the rule divides g in place
        if op == L.LAMB:
            flat[0][...] = _lamb(row, obs, *flat, ct)
        elif op == L.STEP:
            flat[0][...] = _momentum(row, obs, op, *flat, ct)
        elif flat[1].size:  # the hook reports no empty array
            flat[1][...] = _momentum(row, obs, op, *flat, None, ct)
    for k in L.written(op, row[L.LOSS_SCALE] != 1.0):
        if natives[k] is not arrays[k]:  # a read-only input stays unwritten
            arrays[k][...] = natives[k]


#: Empty arrays of the weights', gradients' and compute type (float16: bits).
LIKES = {(numpy.dtype(w), numpy.dtype(g)): tuple(numpy.empty(0, t) for t in (
    w.replace('e', 'H'), g.replace('e', 'H'), w.replace('e', 'f')))
    for w, g in ('ee', 'ff', 'dd', 'fe')}

_NDARRAY, _NONE = id(numpy.ndarray), id(None)
#: NumPy's flags: C-contiguous and aligned; writeable.
_DIRECT, _WRITEABLE = 0x1 | 0x100, 0x400
#: The refusal of an array that code moved while the engine checked it.
MOVED = '{}: an array moved or changed in memory during the checks'


class _Table(object):

    """A group's table of addresses (``None``: no loop), its observations."""

    __slots__ = ('table', 'obs', 'descr', 'update', 'arguments')

    def __init__(self, group):
        self.obs, self.table = numpy.full((len(group), 4), numpy.nan), None
        jit, key = _jit(), (group.dtype, group.gdtype)
        if jit is None or not jit.STAMPS or key not in LIKES:
            return
        self.table = numpy.zeros((len(group), L.SIZE + 1), numpy.int64)
        self.update = jit.multi_update  # (table, gptr, *arguments)
        self.arguments = (group.rows, self.obs) + LIKES[key] + (group.op,)
        self.descr = id(numpy.dtype(group.gdtype.char))
        for k, (w, states, x) in enumerate(
                zip(group.weights, group.states, group.extras)):
            self.table[k, L.SIZE] = w.size
            if checks.direct(group.dtype, (w,) + tuple(states)) and (
                    x is None or checks.direct(x.dtype, (x,))):
                for column, a in zip((L.W, L.V, L.V2), (w,) + tuple(states)):
                    self.table[k, column] = a.ctypes.data
                self.table[k, L.OUT] = 0 if x is None else x.ctypes.data


class Record(object):

    """The stamps of a plan's arrays (``held``) and what each row expects
    of a gradient (``grads``), read by ``_numba.restamp`` in one call."""

    def __init__(self, groups, old=None):
        jit, self.groups = _jit(), groups
        if old is not None:  # its stamps match no array (if this one fails)
            old.held[:, jit.STAMPED + jit.DATA] = -1
        held = [(k, a, r, c) for k, g in enumerate(groups) for r, (
            w, states, x) in enumerate(zip(g.weights, g.states, g.extras))
            for c, a in zip((L.W, L.V, L.V2)[:1 + len(states)] + (L.OUT,), (
                w,) + states + (x,) * (x is not None))]
        self.held = numpy.zeros((len(held), jit.STAMPED + jit.STAMP),
                                numpy.int64)
        self.held[:, [jit.ID, jit.GROUP]] = [(id(h[1]), h[0]) for h in held]
        self.dtypes = [h[1].dtype for h in held]  # stamped by address
        jit.stamp(self.held, _NDARRAY)
        for (k, _, r, c), d, now in zip(  # each as its table took it (code
                held, self.dtypes, self.held[:, jit.STAMPED:]):  # ran since)
            g, t = groups[k], groups[k].state.table[r]
            if c == L.W:  # (its row's first)
                shape = now[jit.SHAPE]
            need = _DIRECT | (_WRITEABLE if c or g.op else 0)  # (hook: w read)
            if t[c] and (now[jit.DATA], now[jit.SIZE], now[jit.SHAPE], now[
                    jit.DESCR], d, now[jit.FLAGS] & need) != (
                        t[c], t[L.SIZE], shape, id(d), g.gdtype if
                        c == L.OUT and g.op else g.dtype, need):
                raise RuntimeError(MOVED.format(g.paths[r]))
        self.changed = numpy.zeros(len(groups), numpy.int64)
        # A row a field (one layout, one compile): ids, addresses, ...
        self.grads = numpy.zeros((jit.EXPECT + 5, sum(map(len, groups))),
                                 numpy.int64)
        rows = [i for i, h in enumerate(held) if h[3] == L.W]  # weights
        self.grads[jit.EXPECT + 4] = self.held[rows, jit.STAMPED + jit.SHAPE]
        self.gids = self.grads[jit.GID]
        self.bounds = numpy.cumsum([0] + list(map(len, groups))).tolist()
        self.gptrs = [self.grads[jit.GPTR, a:b]  # views: restamp fills them
                      for a, b in zip(self.bounds, self.bounds[1:])]
        for g, a, b in zip(groups, self.bounds, self.bounds[1:]):
            e, t = self.grads[jit.EXPECT:, a:b], g.state
            e[0], e[1], e[3] = t.table[:, L.SIZE], t.descr, t.table[:, L.W] > 0
        self.scaled, self.restamp_update = None, jit.restamp_update
        self.arguments = (self.held, self.changed, self.grads, _NONE, _NDARRAY,
                          groups[0].state.table) + groups[0].state.arguments

    def take(self, grads):
        """How many gradients are not taken; ``None``: a held array changed."""
        self._required()
        self.gids[:] = [id(a) for gs in grads for a in gs]
        left = _jit().restamp(*self.arguments[:5])  # held, ..., _NDARRAY
        return None if self.changed.any() else left

    def update(self, grads):
        """:meth:`take` and the update of a plan of one group, where every
        array goes as it is; whether it ran (a face may call it first)."""
        if self.scaled is None or self.scaled[0] != self.groups[0].scaled:
            self._required()
        if len(grads) == 1:  # item assignment: 6x faster
            self.gids[0] = id(grads[0])
        else:
            self.gids[:] = list(map(id, grads))
        ran = self.restamp_update(*self.arguments)
        if ran and self.groups[0].last.copies:
            self.groups[0].last.copies = {}
        return ran

    def _required(self):
        """The gradients' flags: writeable where the op writes them."""
        scaled = [g.scaled for g in self.groups]
        if scaled != self.scaled:
            for group, a, b in zip(self.groups, self.bounds, self.bounds[1:]):
                self.grads[_jit().EXPECT + 2, a:b] = _DIRECT | _WRITEABLE * (
                    1 in L.written(group.op, group.scaled, group.mixed16))
            self.scaled = scaled


class CpuExecutor(object):

    """The executor of NumPy devices (see :mod:`chainer_lars.engine`)."""

    def prepare(self, group):
        group.state = _Table(group)

    def take(self, plan, groups, grads):
        """As :func:`chainer_lars.engine._taken`; ``None``: arrays changed."""
        record = plan.record  # of the groups with a table (Plan.finish)
        compiled = [] if record is None else record.groups
        found, left = {}, sum(len(g) for g in groups if g.state.table is None)
        if compiled:
            missing = record.take([grads[groups.index(g)] for g in compiled]
                                  if len(compiled) != len(groups) else grads)
            if missing is None:
                return None
            found = dict(zip(map(id, compiled), record.gptrs))
            left += missing
        return [found[id(g)] if id(g) in found else numpy.zeros(
            len(g), numpy.int64) for g in groups], left

    @staticmethod
    def changed(plan):
        """The groups whose own arrays changed in place."""
        record = plan.record
        return [g for g, n in zip(record.groups, record.changed) if n]

    def update(self, plan, grads):
        """:meth:`Record.update` of a plan of one compiled group."""
        compiled = plan.groups[0].state.table is not None
        return compiled and plan.record.update(grads)

    address = staticmethod(lambda array: array.ctypes.data)

    @staticmethod
    def run(group, gptr):
        """The update of the rows whose gradient address ``gptr`` gives."""
        table = group.state
        if table.table is not None:
            table.update(table.table, gptr, *table.arguments)
        else:
            table.obs[...] = numpy.nan

    observe = staticmethod(lambda table: table.obs[:, :3])
    rounded = staticmethod(lambda table: table.obs[:, 3])


executor = CpuExecutor()
