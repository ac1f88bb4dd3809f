"""The engine under both faces: plans, groups, executors, observations.

A face keeps a :class:`Plan` of its target's arrays in :class:`Group` s of
one device and dtype, fills each group's settings rows and calls
:func:`run`. An executor (:mod:`chainer_lars.cpu`, :mod:`chainer_lars.cuda`)
has ``prepare(group)``, ``run(group, grads, op)`` (returns the rows it
cannot take as they are) and ``observe(group)`` (``(ratio, ||w||, ||g||)``
per row, NaN where nothing was applied); ``docs/design.rst`` has more.
"""

import operator

import numpy

import chainer
from chainer.backends import cuda as _chainer_cuda

from chainer_lars import checks
from chainer_lars import cpu
from chainer_lars import cuda
from chainer_lars import layout as L


#: ``list(map(GRAD, params))`` costs half what a list comprehension does.
ARRAY = operator.attrgetter('array')
GRAD = operator.attrgetter('grad')
LOSS_SCALE = operator.attrgetter('_loss_scale')
UPDATE_RULE = operator.attrgetter('update_rule')
_STATE = operator.attrgetter('_state')

#: The names of each op's state buffers, for errors.
STATE_NAMES = {L.RESCALE: (), L.STEP: ('momentum buffer',),
               L.LAMB: ('first moment', 'second moment')}


def executor_for(device):
    """The executor of a device; ``None`` for ChainerX."""
    xp = device.xp
    if xp is numpy:
        return cpu.executor
    if xp is _chainer_cuda.cupy:
        return cuda.executor
    return None


class Group(object):

    """Arrays of one device and dtype that one executor updates at once:
    per array its path, parameter, rule, weight, state buffers (``(v,)``,
    ``(m, v)`` or ``()``) and settings row; ``static``: the face's flags
    ``(uses weight decay, adapted)``, a 2 x n array once prepared; ``op`` and
    ``copies`` (row -> group of one) of the last :func:`run`; the
    executor's ``tables``; what the face filled the rows from (``inputs``);
    whether a step divides out a loss scale (``scaled``); the op and
    ``scaled`` of the last :func:`check` passed (``checked``). A mixed16
    group (``halves``: the float16 weights) steps float32 masters (the
    ``weights``) with float16 gradients (``gdtype``).
    """

    __slots__ = ('executor', 'device', 'dtype', 'gdtype', 'paths', 'params',
                 'rules', 'weights', 'halves', 'states', 'rows', 'op',
                 'copies', 'tables', 'static', 'inputs', 'scaled', 'checked')

    def __init__(self, device, dtype, mixed16=False):
        self.executor = executor_for(device)
        self.device = device
        self.dtype = numpy.dtype(dtype)
        self.gdtype = numpy.dtype(numpy.float16 if mixed16 else dtype)
        self.halves = [] if mixed16 else None
        self.paths, self.params, self.rules = [], [], []
        self.weights, self.states, self.static = [], [], []
        self.rows = self.tables = self.op = self.inputs = None
        self.checked = None
        self.scaled = False
        self.copies = {}

    def __len__(self):
        return len(self.weights)

    def add(self, path, param, rule, weight, states=(), static=(1, 1),
            half=None):
        self.paths.append(path)
        self.params.append(param)
        self.rules.append(rule)
        self.weights.append(weight)
        self.states.append(states)
        self.static.append(static)
        if half is not None:
            self.halves.append(half)

    def prepare(self):
        self.rows = L.rows(len(self))
        self.static = numpy.array(self.static, numpy.float64).reshape(-1, 2).T
        self.executor.prepare(self)
        return self


def group_of_one(cached, device, path, weight, states=()):
    """``cached`` if it is the group of these very arrays, else a new one."""
    if (cached is not None and cached.weights[0] is weight
            and (cached.device is device or cached.device == device)
            and len(cached.states[0]) == len(states)
            and all(map(operator.is_, cached.states[0], states))):
        return cached
    group = Group(device, weight.dtype)
    group.add(path, None, None, weight, states)
    return group.prepare()


class Plan(object):

    """A face's groups (by device, dtype and a key of the face's), valid
    while ``params`` keep their rules, arrays, ``flags(rules)`` and (with
    ``states``, the keys of the rules' state buffers, ``True`` for
    ``('v',)``) those buffers, rule hooks and the float32 master copies of
    mixed16 rows; ``where``: each group's positions in ``params``;
    ``others``: what else the face keeps."""

    __slots__ = ('_objects', '_flags', '_flag_fn', '_states', '_masters',
                 '_hooks', '_hook_counts', '_by_key', 'groups', 'where',
                 'others', 'stamps')

    def __init__(self, params, flags, states=()):
        self._states = ('v',) if states is True else states
        self._flag_fn = flags
        # Held, the objects are known by identity (their ids stay theirs).
        self._objects = objects = self._structure(params)
        self._flags = flags(objects[1])
        # Rules keep their hooks in these dicts, changed in place.
        self._hooks = [d for r in objects[1] if states and r is not None
                       for d in (r._hookable._pre_update_hooks,
                                 r._hookable._post_update_hooks)]
        self._hook_counts = list(map(len, self._hooks))
        self._masters = []  # (rule, master array) of the mixed16 rows
        self._by_key = {}
        self.groups, self.where, self.others = [], [], []
        self.stamps = None  # the CPU executor's, of all groups at once

    def add(self, key, device, path, param, rule, weight, states=(),
            static=(1, 1), half=None):
        """Puts an array in the group of its device, dtype and ``key``
        (with ``half``, its float16 weight: of its mixed16 group)."""
        mixed16 = half is not None
        if mixed16:
            self._masters.append((rule, weight))
        key = (str(device), weight.dtype, mixed16, key)
        group = self._by_key.get(key)
        if group is None:
            group = self._by_key[key] = Group(device, weight.dtype, mixed16)
        group.add(path, param, rule, weight, states, static, half)

    def finish(self, params):
        """Prepares the groups; returns the plan."""
        self.groups = [group.prepare() for group in self._by_key.values()]
        position = {id(p): k for k, p in enumerate(params)}
        self.where = [[position[id(p)] for p in group.params]
                      for group in self.groups]
        return self

    def _structure(self, params):
        rules = list(map(UPDATE_RULE, params))
        objects = (params, rules, list(map(ARRAY, params)))
        if self._states:
            try:
                dicts = list(map(_STATE, rules))
                objects += tuple(list(map(operator.methodcaller('get', key),
                                          dicts)) for key in self._states)
            except AttributeError:  # no rule, or no state yet
                dicts = [None if r is None else r.state for r in rules]
                objects += tuple([None if d is None else d.get(key)
                                  for d in dicts] for key in self._states)
        return objects

    def matches(self, params):
        if not same(params, self._objects[0]):
            return False
        objects = self._structure(params)
        return (all(map(same, objects[1:], self._objects[1:]))
                and self._flag_fn(objects[1]) == self._flags
                and list(map(len, self._hooks)) == self._hook_counts
                and all(rule._fp32_param is not None
                        and rule._fp32_param.array is master
                        for rule, master in self._masters))


class PlanCache(object):

    """Holds a face's plan; copies come empty (a copy's arrays would pass
    the original plan's identity checks)."""

    __slots__ = ('plan',)

    def __init__(self):
        self.plan = None

    def __reduce__(self):
        return PlanCache, ()


def _contiguous(device, a):
    if device.xp is numpy:
        return cpu.native(a)
    with chainer.using_device(device):
        return device.xp.ascontiguousarray(a)


def same(objects, held):
    """Whether two lists hold the very same objects, in order."""
    return len(objects) == len(held) and all(map(operator.is_, objects, held))


def check(group, grads, op):
    """Checks the arrays of ``run(group, grads, op)`` (:func:`chainer_lars.
    checks.addressed`) unless the executor finds them as they were at the
    last check passed, with the same op and ``scaled``: a face checks every
    group before it runs any, so an error leaves all as it was. The CPU
    executor knows arrays by their stamps (address, dtype, flags, size),
    the CUDA one gradients by shape (device memory has no read-only flag);
    neither holds a gradient past the update."""
    executor = group.executor
    if not executor.changed(group, grads) and group.checked == (
            op, group.scaled):
        return
    group.checked = None
    mixed16 = group.halves is not None
    names = STATE_NAMES[op]
    written = [(('weight', 'gradient') + names)[i]
               for i in L.written(op, group.scaled and not mixed16)]
    one_dtype = group.device.xp is not numpy
    for k, g in enumerate(grads):
        if g is not None:
            checks.addressed(group.paths[k], group.weights[k], g,
                             group.states[k] if op != L.RESCALE else (),
                             written, one_dtype,
                             group.halves[k] if mixed16 else None, names)
    executor.passed(group)
    group.checked = (op, group.scaled)


def check_all(groups, grads, op, plan):
    """:func:`check` of each group with its ``grads``, the CPU groups'
    stamps read in one call (kept by the ``plan``)."""
    unchanged = cpu.executor.unchanged(groups, grads, plan)
    for group, g, same_arrays in zip(groups, grads, unchanged):
        if not same_arrays or group.checked != (op, group.scaled):
            check(group, g, op)


def run(group, grads, op, checked=False):
    """One update of a group's arrays with its rows, once :func:`check`
    passes them (``checked``: the caller has just checked these
    ``grads``); returns the rows left alone: no gradient, or one no
    executor takes even as a contiguous copy (on a GPU, of another dtype
    than its weight)."""
    if not checked:
        # Arrays as at the last check passed: the executor's one call.
        if group.checked == (op, group.scaled) and (
                group.executor.run_unchanged(group, grads, op)):
            group.copies.clear()
            return []
        check(group, grads, op)
    group.op = op
    group.copies.clear()
    left = []
    for k in group.executor.run(group, grads, op):
        g = grads[k]
        # A mixed16 row goes to its rule, which converts the arrays.
        if g is None or group.halves is not None:
            left.append(k)
            continue
        arrays = (group.weights[k], g) + (
            group.states[k] if op != L.RESCALE else ())
        copies = [_contiguous(group.device, a) for a in arrays]
        one = group_of_one(None, group.device, group.paths[k], copies[0],
                           tuple(copies[2:]))
        one.rows[0] = group.rows[k]
        if one.executor.run(one, copies[1:2], op):
            left.append(k)
            continue
        one.op = op
        group.copies[k] = one
        for i in L.written(op, group.rows[k, L.LOSS_SCALE] != 1.0):
            if i < len(arrays) and copies[i] is not arrays[i]:
                arrays[i][...] = copies[i]
    return left


def observed(group):
    """``(ratio, ||w||, ||g||)`` per row of a group's last update (float64,
    NaN where it applied nothing), the copies' rows included."""
    table = group.executor.observe(group)
    if group.copies:
        table = table.copy()
        for k, one in group.copies.items():
            table[k] = one.executor.observe(one)[0]
    return table


def observe(group, report=None):
    """``{path: (ratio, ||w||, ||g||)}`` of a group's last update, for the
    rows that had one and where ``report`` (a sequence of flags) is true."""
    return {path: tuple(row) for k, (path, row) in enumerate(
        zip(group.paths, observed(group).tolist()))
        if row[0] == row[0] and (report is None or report[k])}
