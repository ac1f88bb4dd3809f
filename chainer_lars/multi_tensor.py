"""Multi-tensor updates: arrays grouped by device and dtype, one executor each.

Both forms of LARS update all the arrays of one device and dtype together:
the :class:`chainer_lars.LARS` optimizer with ``multi_tensor=True`` and the
:class:`chainer_lars.GradientLARS` hook called with the optimizer. This
module is the device-independent half: which arrays go together
(:class:`Group`), the tables of per-array settings the executors read (the
column numbers below), and a cache that forgets its plan when copied
(:class:`PlanCache`). The device-dependent half is an *executor*, one per
kind of device; :func:`executor_for` picks it.

**Plans.** What stays the same from one update to the next while the
model's structure does (the parameters, their update rules, weights and
state buffers, and which of them are batched) is kept in a plan, built by
the optimizer or the hook when the structure changes and checked each
update by identity, which costs a few attribute reads per array.
Gradients are not part of it: a backward pass after ``cleargrads()``
allocates new ones every iteration, so they are handed to the executor on
every update.

**The executor interface.** An executor is an object with

``supports(*arrays) -> bool``
    Whether these arrays of one parameter (weight, state buffers) can be
    batched; everything else falls back to the per-array path.
``prepare(group)``
    Called once per plan, with ``group.weights`` and ``group.states`` set:
    builds what the executor keeps in ``group.tables`` (on CPU, a table of
    addresses; on GPU it would be a device copy of it).
``lars_step(group, grads, hyper, form) -> list``
    One :class:`~chainer_lars.LARS` update of every array of the group:
    ``grads`` is the list of gradients (the loss scale still in them; the
    step divides it out in place, as Chainer's update rule does),
    ``hyper`` a float64 host table with one row per array and the
    ``LARS_*`` columns (the caller reuses it after the call returns),
    ``form`` the :class:`~chainer_lars.ratio.RatioForm`. Returns the
    indices of the gradients it could not take (``None``, another dtype or
    size, not contiguous); it left those arrays alone, and the caller
    updates them on the per-array path.
``hook_rescale(group, grads, hyper, form, eps, trust_coefficient) -> list``
    The hook's rescaling of every gradient of the group in place, with
    the ``HOOK_*`` columns in ``hyper``; returns what ``lars_step`` does.
``observe(group) -> numpy.ndarray``
    ``(ratio, ||w||, ||g||)`` per array of the last step, float64 on the
    host, shape ``(len(group), 3)``; the ratio is the one the step
    applied, recorded where it was computed.

The CPU executor is :class:`chainer_lars.kernels.CpuExecutor`, the CUDA
one :class:`chainer_lars.cuda_kernels.CudaExecutor`.
"""

import operator

import numpy


#: Attribute readers for lists of parameters: ``list(map(ARRAY, params))``
#: costs half what a list comprehension does, which counts here, since it
#: runs over every parameter on every update.
ARRAY = operator.attrgetter('array')
GRAD = operator.attrgetter('grad')
LOSS_SCALE = operator.attrgetter('_loss_scale')
UPDATE_RULE = operator.attrgetter('update_rule')

# Columns of an address table (int64, one row per array).
W = 0
G = 1
V = 2
SIZE = 3
TABLE_COLUMNS = 4

# Columns of the LARS optimizer's settings table (float64, one row per
# array), read by lars_step.
LARS_LR = 0
LARS_MOMENTUM = 1
LARS_WEIGHT_DECAY = 2  # 0 where the array is excluded from weight decay
LARS_TRUST_COEFFICIENT = 3
LARS_EPS = 4
LARS_NESTEROV = 5  # 0 or 1
LARS_ADAPT = 6  # 0 or 1
LARS_LOSS_SCALE = 7  # 1 where there is none
LARS_COLUMNS = 8

# Columns of the hook's settings table, read by hook_rescale.
HOOK_WEIGHT_DECAY = 0  # 0 where the array is excluded from weight decay
HOOK_ADAPT = 1  # 0 or 1
HOOK_CLIP_LR = 2  # negative: no clipping
HOOK_LOSS_SCALE = 3  # 1 where there is none
HOOK_COLUMNS = 4


class Group(object):

    """The arrays of one device and dtype that one executor updates at once.

    Attributes:
        executor: The executor (see the module's docstring).
        device (~chainer.backend.Device): Their device.
        dtype (numpy.dtype): Their dtype.
        paths (list of str): The parameters' paths.
        params (list of ~chainer.Parameter): The parameters.
        rules (list of ~chainer.UpdateRule): Their update rules.
        weights (list): The weight arrays (``param.array``).
        states (list of tuple): Per parameter, the state buffers the
            executor updates (``(v,)`` for LARS, ``()`` for the hook).
        tables: What the executor's ``prepare`` built.

    """

    __slots__ = ('executor', 'device', 'dtype', 'paths', 'params', 'rules',
                 'weights', 'states', 'tables')

    def __init__(self, executor, device, dtype):
        self.executor = executor
        self.device = device
        self.dtype = dtype
        self.paths = []
        self.params = []
        self.rules = []
        self.weights = []
        self.states = []
        self.tables = None

    def __len__(self):
        return len(self.params)

    def add(self, path, param, rule, weight, states=()):
        self.paths.append(path)
        self.params.append(param)
        self.rules.append(rule)
        self.weights.append(weight)
        self.states.append(states)


class Grouper(object):

    """Sorts parameters into :class:`Group` objects by device and dtype."""

    def __init__(self):
        self._groups = {}

    def group_for(self, device, dtype, *arrays):
        """The group these arrays join, or ``None`` if none can take them."""
        executor = executor_for(device)
        if executor is None or not executor.supports(*arrays):
            return None
        key = (str(device), numpy.dtype(dtype))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(executor, device, dtype)
        return group

    def groups(self):
        """The non-empty groups, each prepared by its executor."""
        groups = [g for g in self._groups.values() if len(g)]
        for group in groups:
            group.executor.prepare(group)
        return groups


def executor_for(device):
    """The executor of a device, or ``None`` (per-array path).

    NumPy (CPU) has one where Numba is available
    (:class:`chainer_lars.kernels.CpuExecutor`), and CUDA devices have
    :class:`chainer_lars.cuda_kernels.CudaExecutor`; ChainerX parameters
    take the per-array path.

    """
    from chainer.backends import cuda

    xp = device.xp
    if xp is numpy:
        from chainer_lars import kernels
        return kernels.cpu_executor()
    if xp is cuda.cupy:
        from chainer_lars import cuda_kernels
        return cuda_kernels.executor
    return None


class PlanCache(object):

    """Holds the plan of the last update; copies and pickles come empty.

    A plan holds the addresses of the arrays it was built for. A deep copy
    or an unpickled copy of the optimizer has other arrays that the plan's
    identity checks would still match (they are copied with it), so
    copying must not carry the plan along.

    Attributes:
        plan: The plan, or ``None`` when there is none yet.

    """

    __slots__ = ('plan',)

    def __init__(self):
        self.plan = None

    def __reduce__(self):
        return PlanCache, ()
