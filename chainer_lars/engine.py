"""The engine under the faces: :class:`Plan` s of :class:`Group` s, their
rows (:func:`settings`) and :func:`update` (``docs/design.rst``)."""

import functools
import gc
import itertools
import operator
import weakref

import numpy

import chainer
from chainer.backends import cuda as _chainer_cuda

from chainer_lars import checks
from chainer_lars import cpu
from chainer_lars import cuda
from chainer_lars import layout as L


#: ``list(map(GRAD, params))`` is twice as fast as a comprehension.
GRAD = operator.attrgetter('grad')
LOSS_SCALE = operator.attrgetter('_loss_scale')
UPDATE_RULE = operator.attrgetter('update_rule')


def raw_arrays(method):  # cuDNN's layouts, read as Chainer's rules read them
    def read_raw(*args, **kwargs):
        with chainer.variable._AllowArrayAccessWithNonstandardLayout():
            return method(*args, **kwargs)
    return functools.wraps(method)(read_raw)


def executor_for(device):
    """The executor of a device; ``None`` for ChainerX."""
    return {numpy: cpu.executor,
            _chainer_cuda.cupy: cuda.executor}.get(device.xp)


def tied(params):
    """Whether each of ``params`` shares its array's buffer (CuPy's: memory)
    with another: a parameter listed twice, tied weights, views of one
    array. Chainer steps each in turn."""
    roots, counts = [], {}
    for a in [d[0] for d in map(operator.attrgetter('_data'), params)]:
        while getattr(a, 'base', None) is not None:
            a = a.base
        roots.append(id(getattr(getattr(a, 'data', 0), 'mem', a)))
        counts[roots[-1]] = counts.get(roots[-1], 0) + 1
    return [r != id(None) and counts[r] > 1 for r in roots]


class Group(object):

    """Arrays of one device, dtype and ``op``, a row each (``mixed16``: float32
    masters, float16 gradients, ``extras`` written too). ``rows``:
    settings, from ``key``; ``state``: the executor's; ``last``: observed."""

    __slots__ = ('executor', 'device', 'op', 'dtype', 'gdtype', 'mixed16',
                 'paths', 'params', 'rules', 'weights', 'states', 'extras',
                 'uses_wd', 'adapt', 'rows', 'key', 'scaled', 'state', 'last')

    def __init__(self, device, dtype, op, mixed16=False):
        self.executor, self.device, self.op = executor_for(device), device, op
        self.dtype = numpy.dtype(dtype).newbyteorder('=')
        self.gdtype = numpy.dtype(numpy.float16) if mixed16 else self.dtype
        self.paths, self.params, self.rules, self.weights = [], [], [], []
        self.states, self.extras, self.uses_wd, self.adapt = [], [], [], []
        self.mixed16, self.scaled = mixed16, False
        self.rows = self.key = self.state = self.last = None

    def __len__(self):
        return len(self.weights)

    def add(self, path, param, rule, weight, states=(), flags=(1, 1),
            extra=None):
        for column, value in zip(
                (self.paths, self.params, self.rules, self.weights,
                 self.states, self.extras, self.uses_wd, self.adapt),
                (path, param, rule, weight, tuple(states), extra) + flags):
            column.append(value)

    def prepare(self, checked=False):
        self.rows = L.rows(len(self))
        self.uses_wd = numpy.array(self.uses_wd, numpy.float64)
        self.adapt = numpy.array(self.adapt, numpy.float64)
        return self.refresh(checked)

    def refresh(self, checked=False):  # (checked: by the caller, just now)
        checked or self.check()
        self.executor.prepare(self)
        self.last = Last(self)
        return self

    def check(self, k=None, grad=None):
        """:func:`~chainer_lars.checks.addressed` of every row's own
        arrays, or of row ``k``'s with ``grad``."""
        names = L.STATE_NAMES[self.op]
        written = [(('weight', 'gradient') + names)[i] for i in L.written(
            self.op, self.scaled, self.mixed16)]
        for j in range(len(self)) if k is None else (k,):
            checks.addressed(
                self.paths[j], self.weights[j], grad, self.states[j],
                written, self.device.xp is not numpy, self.extras[j], names,
                'float16 weight' if self.op != L.RESCALE else
                'float32 gradient', self.gdtype)


class Last(object):

    """What :func:`observe` reads of an update (no array; copies by row)."""

    __slots__ = ('paths', 'executor', 'state', 'copies')

    def __init__(self, group):
        self.paths, self.executor = group.paths, group.executor
        self.state, self.copies = group.state, {}


class Plan(object):

    """A face's groups (by device, dtype, op, key), valid while :meth:`matches`
    (``depends(params)``: objects by identity, values by ``==``). ``where``:
    positions in ``params``; ``record``: CPU stamps; ``executors``: groups."""

    __slots__ = ('groups', 'where', 'others', 'record', 'executors',
                 '_by_key', '_depends', '_objects', '_values')

    def __init__(self, params, depends=None):
        self._depends, self._by_key, self.record = depends, {}, None
        self._objects, self._values = depends(params) if depends else (
            [params], ())  # no depends: the arrays ``params`` alone
        self.groups, self.where, self.others = [], [], []

    def add(self, key, device, op, path, param, rule, weight, states=(),
            flags=(1, 1), extra=None):
        """Puts an array in its group (with ``extra``: a mixed16 one)."""
        mixed16 = extra is not None
        key = (str(device), weight.dtype.newbyteorder('='), op, mixed16, key)
        if key not in self._by_key:
            self._by_key[key] = Group(device, weight.dtype, op, mixed16)
        self._by_key[key].add(path, param, rule, weight, states, flags, extra)

    def finish(self, params=()):
        """Prepares the groups (``where``: in ``params``); returns self."""
        self.groups = [group.prepare() for group in self._by_key.values()]
        compiled = [g for g in self.groups if g.executor is cpu.executor
                    and g.state.table is not None]  # stamped with the tables
        self.record = cpu.Record(compiled) if compiled else None
        position = {id(p): k for k, p in enumerate(params)}
        self.where = [[position.get(id(p)) for p in group.params]
                      for group in self.groups]
        self.executors = [(e, [k for k, g in enumerate(self.groups)
                               if g.executor is e]) for e in dict.fromkeys(
                                   g.executor for g in self.groups)]
        return self

    def matches(self, params):
        if not same(params, self._objects[0]):
            return False
        if self._depends is None:
            return True
        objects, values = self._depends(params)
        return all(map(same, objects[1:], self._objects[1:])) and (
            values == self._values)


class PlanCache(object):

    """A face's plans by owner, kept while the owner and its target live."""

    __slots__ = ('_plans',)

    def __init__(self):
        self._plans = {}  # id(owner) -> (weak references to both, plan)

    def __reduce__(self):
        return PlanCache, ()

    def get(self, owner, params, build, *args):
        """The owner's plan if it matches, else ``build(*args, params)``."""
        entry = self._plans.get(id(owner))
        if entry and entry[0]() is owner and entry[2].matches(params):
            return entry[2]
        plan, plans, key = build(*args + (params,)), self._plans, id(owner)
        plans[key] = tuple(weakref.ref(o, lambda _: plans.pop(key, None))
                           for o in (owner, getattr(owner, 'target', owner)))
        plans[key] += (plan,)  # (an optimizer's target: setup() changes it)
        return plan

    def plans(self):
        return [entry[2] for entry in list(self._plans.values())
                if entry[0]() is not None]


def same(objects, held):
    return len(objects) == len(held) and all(map(operator.is_, objects, held))


def settings(group, key, fill):
    """``fill(group, key)`` where ``key`` (plain values) changed."""
    if key != group.key:
        group.key = None
        fill(group, key)
        group.key = key
        group.scaled = bool((group.rows[:, L.LOSS_SCALE] != 1.0).any())


def update(plan, grads):
    """A plan's groups' update, all checked first; each one's rows left.
    No garbage collection (``gc.callbacks``, cycles' finalizers) in it."""
    groups, collecting = plan.groups, gc.isenabled()
    try:
        gc.disable()  # (a collection's code could move an array taken)
        if len(groups) == 1 and groups[0].executor.update(plan, grads[0]):
            return [[]]
        gptrs, missing = _taken(plan, grads)
        routes = list(map(_route, groups, grads, map(numpy.copy, gptrs))
                      ) if missing else [(p, (), (), ()) for p in gptrs]
        for group, p, route in zip(  # the same after the checks (arrays' code)
                groups, _taken(plan, grads)[0], routes) if missing else ():
            for path in itertools.compress(group.paths, p != route[0]):
                raise RuntimeError(cpu.MOVED.format(path))
        for group, route in zip(groups, routes):  # every loop on the addresses
            if group.last.copies:  # taken before an array's code (an ndarray
                group.last.copies = {}  # subclass's) writes a copy back
            group.executor.run(group, route[0])
        for group, g, route in zip(groups, grads, routes) if missing else ():
            _rest(group, g, *route[1:])
        return [route[3] for route in routes]
    finally:
        collecting and gc.enable()


def _taken(plan, grads):
    """Each group's gradient addresses (0: not taken), how many are not."""
    gptrs, missing = [None] * len(grads), 0
    for executor, ks in plan.executors:
        picked = [plan.groups[k] for k in ks]
        found = executor.take(plan, picked, [grads[k] for k in ks])
        if found is None:
            for group in [g for g in executor.changed(plan) if not g.check()]:
                group.refresh(True)  # all checked first: no table made of some
            plan.record = cpu.Record(plan.record.groups, plan.record)
            found = executor.take(plan, picked, [grads[k] for k in ks])
        missing += found[1]
        for k, gptr in zip(ks, found[0]):
            gptrs[k] = gptr
    return gptrs, missing


def _route(group, grads, gptr):
    """The rows not taken: ``copies`` (another layout), ``passes`` (CPU,
    mixed dtypes), ``left`` (no gradient; mixed16, to its rule)."""
    copies, passes, left = [], [], []
    for k in numpy.flatnonzero(gptr == 0).tolist():
        g = grads[k]
        if g is not None:
            group.check(k, g)
        if g is None or group.mixed16:
            left.append(k)
        elif group.executor is cpu.executor and (
                group.state.table is None or any(
                    a.dtype.newbyteorder('=') != group.dtype
                    for a in (g,) + group.states[k])):
            passes.append(k)
        else:
            copies.append(k)
    return gptr, copies, passes, left


def _rest(group, grads, copies, passes, left):
    """The rows not taken, after every group's loop."""
    for k in passes:  # observed in the table's rows
        cpu.numpy_update(group.rows[k], group.state.obs[k], group.op,
                         group.weights[k], grads[k], *group.states[k])
    for k in copies:  # checked again: an array's own code may have run
        group.check(k, grads[k])
        arrays = (group.weights[k], grads[k]) + group.states[k]
        with chainer.using_device(group.device):  # in the loop's dtype (no
            native = [cpu.native(a, group.dtype)  # mixed16 row is copied)
                      if group.device.xp is numpy else group.device.xp
                      .ascontiguousarray(a, group.dtype) for a in arrays]
        one = Group(group.device, group.dtype, group.op)
        one.add(group.paths[k], None, None, native[0], native[2:])
        one.check(0, native[1])  # as copied: code may have run since
        one.prepare(checked=True).rows[0] = group.rows[k]
        one.executor.run(one, numpy.array([one.executor.address(native[1])],
                                          numpy.int64))
        group.last.copies[k] = one.last
        for i in L.written(group.op, group.rows[k, L.LOSS_SCALE] != 1.0):
            if native[i] is not arrays[i]:
                arrays[i][...] = native[i]


def observed(last):
    """``(ratio, ||w||, ||g||)`` per row of a :class:`Last` (or NaN)."""
    table = last.executor.observe(last.state)
    if last.copies:
        table = table.copy()
        for k, one in last.copies.items():
            table[k] = one.executor.observe(one.state)[0]
    return table


def observe(last, report=None):
    """``{path: (ratio, ||w||, ||g||)}`` of the rows that had one."""
    return {path: tuple(row) for k, (path, row) in enumerate(
        zip(last.paths, observed(last).tolist()))
        if row[0] == row[0] and (report is None or report[k])}


def rounded_away(group):
    """The paths of float16 weights whose last step mostly rounded away."""
    counts = group.executor.rounded(group.state) if (
        group.dtype == numpy.float16 and group.op != L.RESCALE) else None
    return [] if counts is None else [path for path, w, n in zip(
        group.paths, group.weights, counts) if n > w.size / 2]
