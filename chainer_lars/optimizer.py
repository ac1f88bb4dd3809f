"""LARS: the layer-wise adaptive rate scaling momentum optimizer."""

import collections
import math
import operator
import warnings

import numpy

import chainer
from chainer import optimizer
from chainer import variable

from chainer_lars import checks
from chainer_lars import exclusions
from chainer_lars import kernels
from chainer_lars import multi_tensor as _mt
from chainer_lars import observations as _observations
from chainer_lars import ratio


_default_hyperparam = optimizer.Hyperparameter()
_default_hyperparam.lr = 1e-3
_default_hyperparam.momentum = 0.9
_default_hyperparam.weight_decay = 1e-4
_default_hyperparam.trust_coefficient = 1e-3
_default_hyperparam.eps = 0.0
_default_hyperparam.nesterov = False


class LARSRule(optimizer.UpdateRule):

    """Update rule of :class:`LARS` for one parameter array.

    See :class:`LARS` for the math. The rule reads ``lr``, ``momentum``,
    ``weight_decay``, ``trust_coefficient``, ``eps`` and ``nesterov`` from
    its hyperparameter on every update, so schedules take effect at once.

    Args:
        parent_hyperparam (~chainer.optimizer.Hyperparameter): Hyperparameter
            that provides the default values.
        uses_weight_decay (bool): ``False`` for an array excluded from
            weight decay.
        uses_adaptation (bool): ``False`` for an array excluded from layer
            adaptation (its ratio is 1).

    Attributes:
        uses_weight_decay (bool): See above.
        uses_adaptation (bool): See above.

    """

    is_elementwise = False

    def __init__(self, parent_hyperparam=None, uses_weight_decay=True,
                 uses_adaptation=True):
        super(LARSRule, self).__init__(
            parent_hyperparam or _default_hyperparam)
        self.uses_weight_decay = uses_weight_decay
        self.uses_adaptation = uses_adaptation
        self._observation = None
        self._tables = None

    def __getstate__(self):
        # The observation is that of the last update this rule made, and the
        # GPU table cache holds device memory: a copy or an unpickled rule
        # starts without both, and makes the cache when it needs it.
        state = self.__dict__.copy()
        state['_observation'] = None
        state['_tables'] = None
        return state

    def init_state(self, param):
        with chainer.using_device(param.device):
            self.state['v'] = param.device.xp.zeros_like(param.array)

    def serialize(self, serializer):
        """Serializes the state, and the float32 master copy if there is one.

        Chainer does not save the master copy that ``use_fp32_update()``
        keeps of a float16 parameter; a resumed run would then restart from
        the rounded float16 weights and drift from the uninterrupted one.
        A snapshot without the entry (an older one) loads as before.

        """
        super(LARSRule, self).serialize(serializer)
        master = self._fp32_param
        current = None if master is None else master.array
        if isinstance(serializer, chainer.serializer.Serializer):
            if current is not None:
                serializer('fp32_param', current)
            return
        try:
            value = serializer('fp32_param', current)
        except KeyError:
            return
        if value is not None and current is None:
            self._fp32_param = chainer.Parameter(value)

    def update(self, param):
        master = self._fp32_param
        if (master is not None and master.array is not None
                and master.device != param.device):
            # A master copy loaded from a snapshot lives on the CPU.
            master.to_device(param.device)
        super(LARSRule, self).update(param)

    def _step_args(self):
        hp = self.hyperparam
        wd = hp.weight_decay if self.uses_weight_decay else 0.0
        return hp, wd

    def update_core_cpu(self, param):
        w, g = param.array, param.grad
        if g is None:
            return
        hp, wd = self._step_args()
        r = 1.0
        self._observation = None
        if self.uses_adaptation:
            w_sq, g_sq = kernels.sqnorms(w, g)
            w_norm, g_norm = math.sqrt(w_sq), math.sqrt(g_sq)
            r = ratio.OPTIMIZER_FORM.ratio(w_norm, g_norm, wd, hp.eps,
                                           hp.trust_coefficient)
            self._observation = (r, w_norm, g_norm)
        a = hp.lr * r
        kernels.momentum_step(w, g, self.state['v'], a, a * wd,
                              hp.momentum, hp.nesterov)

    # ChainerX arrays take UpdateRule's default path: memory-shared NumPy or
    # CuPy views of them are passed to the methods below.

    def update_core_gpu(self, param):
        from chainer_lars import cuda_kernels

        w, g = param.array, param.grad
        if g is None:
            return
        v = self.state['v']
        xp = param.device.xp
        arrays = (w, g, v)
        if not cuda_kernels.supports(w, g, v):
            # Not C-contiguous (a gradient from a transposing backward, say):
            # the kernels update contiguous copies, written back.
            arrays = tuple(xp.ascontiguousarray(a) for a in arrays)
            if not cuda_kernels.supports(*arrays):
                raise ValueError(
                    'LARS needs weight, gradient and momentum arrays of one '
                    'dtype (float16, float32 or float64); got {}, {}, {} '
                    'for {}'.format(w.dtype, g.dtype, v.dtype, param.name))
        hp, wd = self._step_args()
        if w.size == 0:
            # Nothing to launch (a grid of no blocks is an error); as on
            # the CPU, both norms are 0.
            self._observation = ((1.0, 0.0, 0.0) if self.uses_adaptation
                                 else None)
            return
        if self._tables is None:
            self._tables = cuda_kernels.TableCache(capacity=1)
        # The loss scale is already divided out (UpdateRule.update).
        rows = cuda_kernels.settings(
            1, wd, hp.eps, hp.trust_coefficient, 1.0, self.uses_adaptation,
            lr=hp.lr, momentum=hp.momentum, nesterov=hp.nesterov)
        w_dev, g_dev, v_dev = arrays
        stats = cuda_kernels.lars_update(
            xp, self._tables, w.dtype, [w_dev], [g_dev], [v_dev], rows,
            ratio.OPTIMIZER_FORM).stats
        for array, updated in ((w, w_dev), (v, v_dev)):
            if updated is not array:
                array[...] = updated
        # The stats hold the ratio the step applies.
        self._observation = (_observations.DeviceObservation(stats, 0, 1.0)
                             if self.uses_adaptation else None)


class _Plan(object):

    """How :meth:`LARS.update` updates the parameters while they stay put.

    Built from the target's parameters; :meth:`matches` tells whether they
    are still the same objects with the same rules, arrays, momentum
    buffers and flags (compared by identity, each list in one go). The
    gradients are not compared: a backward pass allocates new ones on
    every iteration.

    Attributes:
        groups (list): ``(group, (hyper, uses_wd))`` per batched
            :class:`~chainer_lars.multi_tensor.Group`: its settings table
            and the weight-decay column's mask.
        where (list): Per group, its parameters' positions in ``params``.
        per_rule (list): The parameters that take Chainer's per-rule path.

    """

    __slots__ = ('_objects', '_ids', '_flags', '_hooks', 'groups', 'where',
                 'per_rule')

    def __init__(self, params, groups, per_rule):
        objects = _structure(params)
        # Holding the objects keeps their ids from being reused.
        self._objects = objects
        self._ids = [list(map(id, o)) for o in objects]
        # With every parameter batched (the usual case) every rule is a
        # LARSRule with state, enabled and without hooks, and the check
        # reads the flags with one C-level pass each.
        if per_rule:
            self._flags = _flags(objects[1])
        else:
            self._flags = list(map(_RULE_FLAGS, objects[1]))
            # Rule hooks are added to these dicts of each rule (checked by
            # identity) in place.
            self._hooks = (list(map(_PRE_HOOKS, objects[1]))
                           + list(map(_POST_HOOKS, objects[1])))
        self.groups = groups
        position = {id(p): k for k, p in enumerate(params)}
        self.where = [[position[id(p)] for p in group.params]
                      for group, _ in groups]
        self.per_rule = per_rule

    def matches(self, params):
        if self.per_rule:
            objects = _structure(params)
            return (self._ids == [list(map(id, o)) for o in objects]
                    and self._flags == _flags(objects[1]))
        ids = self._ids
        if list(map(id, params)) != ids[0]:
            return False
        rules = list(map(_mt.UPDATE_RULE, params))
        if list(map(id, rules)) != ids[1]:
            return False
        try:
            # The same rules, so LARSRules; an AttributeError: a state
            # reset to None.
            states = list(map(_MOMENTUM, map(_STATE, rules)))
        except AttributeError:
            return False
        return (list(map(id, map(_mt.ARRAY, params))) == ids[2]
                and list(map(id, states)) == ids[3]
                and list(map(_RULE_FLAGS, rules)) == self._flags
                and not any(map(len, self._hooks)))


def _structure(params):
    """The parameters, their rules, arrays and momentum buffers."""
    rules = list(map(_mt.UPDATE_RULE, params))
    arrays = list(map(_mt.ARRAY, params))
    states = [None if r is None or r.state is None else r.state.get('v')
              for r in rules]
    return params, rules, arrays, states


# UpdateRule.state is a property returning _state: read at C speed.
_STATE = operator.attrgetter('_state')
_MOMENTUM = operator.methodcaller('get', 'v')
_RULE_FLAGS = operator.attrgetter('enabled', 'uses_weight_decay',
                                  'uses_adaptation')
_PRE_HOOKS = operator.attrgetter('_hookable._pre_update_hooks')
_POST_HOOKS = operator.attrgetter('_hookable._post_update_hooks')
_HYPER_PARENT = operator.attrgetter('hyperparam._parent')
_HYPER_OWN = operator.attrgetter('hyperparam.__dict__')


def _flags(rules):
    """Per rule: enabled, has hooks, uses weight decay, uses adaptation."""
    return [None if r is None else (
        bool(r.enabled),
        bool(r._hookable._pre_update_hooks
             or r._hookable._post_update_hooks),
        bool(getattr(r, 'uses_weight_decay', False)),
        bool(getattr(r, 'uses_adaptation', False))) for r in rules]


def _per_rule_reason(param, rule):
    """Why ``param`` cannot be batched, or ``None`` if it can."""
    if type(rule) is not LARSRule:
        # No rule (a link added after setup(): Chainer skips it), another
        # rule, or a subclass that may override the step: Chainer's path.
        return 'not a LARSRule'
    if not rule.enabled:
        return 'disabled'
    hooks = rule._hookable
    if hooks._pre_update_hooks or hooks._post_update_hooks:
        # Rule hooks run between the division by the loss scale and the
        # step, and may read or rewrite the gradient.
        return 'update-rule hooks'
    if param.array is None:
        return 'uninitialised'
    if rule.state is None:
        # The rule's own first update makes the momentum buffer.
        return 'no state yet'
    if param.layout is not None:
        # Chainer refuses this for a rule that is not elementwise.
        return 'non-standard layout'
    if rule._use_fp32_update and param.dtype == numpy.float16:
        # The rule makes the float32 master copy and writes it back.
        return 'float32 master copy'
    return None


class LARS(exclusions.ExclusionProperties, optimizer.GradientMethod):

    """Momentum SGD with layer-wise adaptive rate scaling (LARS).

    See `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_. For each parameter array :math:`w`
    with gradient :math:`g` (after the loss scale is divided out),

    .. math::

        r &= \\eta \\frac{\\|w\\|}{\\|g\\| + \\lambda \\|w\\| + \\epsilon}
             \\quad \\text{if } \\|w\\| > 0 \\text{ and } \\|g\\| > 0,
             \\quad 1 \\text{ otherwise}, \\\\
        v &\\leftarrow \\mu v + \\gamma r (g + \\lambda w), \\\\
        w &\\leftarrow w - v \\quad \\text{or, with Nesterov,} \\quad
        w \\leftarrow w - (\\gamma r (g + \\lambda w) + \\mu v),

    with :math:`\\gamma` the learning rate, :math:`\\mu` the momentum,
    :math:`\\lambda` the weight decay and :math:`\\eta` the trust
    coefficient. The ratio is fused into the momentum step: one pass over
    memory for the two norms and one for the step, with the ratio kept on
    the device on GPU.

    **Multi-tensor update.** With ``multi_tensor=True`` (the default), the
    arrays of one device and dtype are updated together: on CPU the
    float32 and float64 ones, one compiled call per dtype and update, with
    the same result, bit for bit, as the per-rule path; on GPU float16,
    float32 and float64, two kernel launches per dtype and update (see
    :mod:`chainer_lars.multi_tensor`); and with the same effect on
    everything around it:
    each rule's ``t`` and hyperparameters (a value set on one
    ``param.update_rule.hyperparam`` applies to that array), ``enabled``,
    loss scaling (the gradient is divided by the loss scale in place, as
    :meth:`chainer.UpdateRule.update` does) and snapshots. Arrays that
    cannot be batched take the per-rule path (two launches per array on
    GPU): float16 ones on CPU, float16 ones with ``use_fp32_update()``,
    those with update-rule hooks, and any other rule than
    :class:`LARSRule`.

    The two exclusion lists act independently (unlike the TensorFlow
    optimizer this follows, where exclusion from adaptation also drops the
    weight decay): an array excluded from weight decay is adapted with
    :math:`\\lambda = 0`; an array excluded from layer adaptation gets
    :math:`r = 1` and keeps its weight decay. The large-batch recipes
    exclude biases and BatchNorm parameters from both, e.g.
    ``exclude_from_weight_decay=['/b$', '/beta$', '/gamma$']``.

    Args:
        lr (float): Learning rate :math:`\\gamma` (the paper's global rate).
        momentum (float): Momentum :math:`\\mu`, in ``[0, 1)``.
        weight_decay (float): Weight decay :math:`\\lambda`.
        trust_coefficient (float): Trust coefficient :math:`\\eta` (called
            ``eeta`` in TensorFlow).
        eps (float): Added to the ratio's denominator. ``0`` is kept as 0;
            the ratio is 1 whenever a norm is 0, so it never divides by 0.
        nesterov (bool): Use Nesterov momentum.
        exclude_from_weight_decay (list of str): Regular expressions searched
            (:func:`re.search`) in each parameter's path as
            :meth:`chainer.Link.namedparams` spells it, e.g.
            ``'/predictor/conv1/b'``.
        exclude_from_layer_adaptation (list of str): Likewise.
        multi_tensor (bool): Update the arrays of one device and dtype
            together where possible (see above). ``False`` keeps Chainer's
            per-rule loop.

    Attributes:
        lr (float): See above; settable, e.g. by a schedule extension.
        momentum (float): See above; settable.
        weight_decay (float): See above; settable.
        trust_coefficient (float): See above; settable.
        eps (float): See above; settable.
        nesterov (bool): See above; settable.

    """

    def __init__(self, lr=_default_hyperparam.lr,
                 momentum=_default_hyperparam.momentum,
                 weight_decay=_default_hyperparam.weight_decay,
                 trust_coefficient=_default_hyperparam.trust_coefficient,
                 eps=_default_hyperparam.eps,
                 nesterov=_default_hyperparam.nesterov,
                 exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=(), multi_tensor=True):
        super(LARS, self).__init__()
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        self._plans = _mt.PlanCache()
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.nesterov = nesterov
        self._rules = exclusions.ExclusionRules(
            exclude_from_weight_decay, exclude_from_layer_adaptation)

    lr = checks.CheckedHyperparameter(checks.real, minimum=0.0)
    momentum = checks.CheckedHyperparameter(
        checks.real, minimum=0.0, maximum=1.0)
    weight_decay = checks.CheckedHyperparameter(checks.real, minimum=0.0)
    trust_coefficient = checks.CheckedHyperparameter(
        checks.real, minimum=0.0, exclusive=True)
    eps = checks.CheckedHyperparameter(checks.real, minimum=0.0)
    nesterov = checks.CheckedHyperparameter(checks.boolean)

    def create_update_rule(self):
        return LARSRule(self.hyperparam)

    def setup(self, link):
        super(LARS, self).setup(link)
        for path, param in link.namedparams():
            rule = param.update_rule
            if isinstance(rule, LARSRule):
                rule.uses_weight_decay, rule.uses_adaptation = (
                    self._rules.lookup(path))
        return self

    def update(self, lossfun=None, *args, **kwds):
        """Updates the parameters (see :meth:`chainer.GradientMethod.update`).

        With ``multi_tensor=True`` this is Chainer 7.8.1's
        ``GradientMethod.update`` step by step (loss, hooks, ``t``, loss
        scaling), except that the loop calling ``param.update()`` for each
        parameter is :meth:`_update_params`.

        """
        if not self._multi_tensor:
            return super(LARS, self).update(lossfun, *args, **kwds)
        if lossfun is not None:
            use_cleargrads = getattr(self, '_use_cleargrads', True)
            loss = lossfun(*args, **kwds)
            if use_cleargrads:
                self.target.cleargrads()
            else:
                self.target.zerograds()
            loss.backward(loss_scale=self._loss_scale)
            del loss

        # One listing of the parameters serves the reallocation before the
        # hooks, the update and the reallocation after it (Chainer lists
        # them three times): nothing between them changes the model's
        # structure, except hooks, after which it is listed again.
        params = list(self.target.params())
        grads = self._reallocate(params)
        self._check_finite(params, grads)
        if self._hookable._pre_update_hooks:
            self.call_hooks('pre')
            # Hooks may replace gradients, too.
            params, grads = list(self.target.params()), None

        self.t += 1
        unbatched = params
        if self.is_safe_to_update():
            unbatched = self._update_params(params, grads)

        # The batched parameters had gradients and the update kept them.
        self._reallocate(unbatched)

        self.call_hooks('post')
        self.update_loss_scale()

    def check_nan_in_grads(self):
        """Chainer's, with one transfer per device instead of one per array.

        With dynamic loss scaling, Chainer brings each gradient's "all
        finite" to the host in turn, a synchronisation per array on a GPU.
        Here the flags of a device's gradients are stacked on the device
        and brought over once; the warnings are Chainer's, one per array
        with a non-finite value, in the same order. A parameter without a
        gradient (one not initialised) is skipped. ``multi_tensor=False``
        keeps Chainer's.

        """
        if not self._multi_tensor:
            return super(LARS, self).check_nan_in_grads()
        params = list(self.target.params())
        with variable._AllowArrayAccessWithNonstandardLayout():
            grads = list(map(_mt.GRAD, params))
        self._check_finite(params, grads)

    def _check_finite(self, params, grads):
        """:meth:`check_nan_in_grads` on a listing and its gradients."""
        self._loss_scaling_isnan = False
        if not self._loss_scaling_is_dynamic:
            return
        by_device = collections.OrderedDict()
        for k, (param, g) in enumerate(zip(params, grads)):
            if g is None:
                continue
            device = param.device
            xp = device.xp
            with chainer.using_device(device):
                flag = xp.all(xp.isfinite(g))
            _, where, flags = by_device.setdefault(
                str(device), (device, [], []))
            where.append(k)
            flags.append(flag)
        bad = []
        for device, where, flags in by_device.values():
            xp = device.xp
            if xp is numpy or xp is chainer.backend.chainerx:
                finite = [bool(f) for f in flags]
            else:
                with chainer.using_device(device):
                    finite = xp.stack(flags).get().tolist()
            bad.extend(k for k, ok in zip(where, finite) if not ok)
        if not bad:
            return
        self._loss_scaling_isnan = True
        self._loss_scaling_isnan_ever = True
        # The paths are only needed for the warnings.
        names = {id(param): name for name, param in self.target.namedparams()}
        for k in sorted(bad):
            warnings.warn(
                'Non finite number found in param.grad of {}'
                ' (iteration: {}, loss_scale: {})'.format(
                    names[id(params[k])], self.t, self._loss_scale))

    def reallocate_cleared_grads(self):
        """Chainer's, without building every parameter's path.

        Called by Chainer after each optimizer hook as well.

        """
        self._reallocate(list(self.target.params()))

    @staticmethod
    def _reallocate(params):
        """Zero gradients for the initialised ``params`` that have none.

        Returns:
            list: Every parameter's gradient after that.

        """
        with variable._AllowArrayAccessWithNonstandardLayout():
            grads = list(map(_mt.GRAD, params))
        for k in [k for k, g in enumerate(grads) if g is None]:
            param = params[k]
            # Chainer's listing leaves uninitialised parameters out.
            if param.raw_array is None:
                continue
            device = param.device
            with chainer.using_device(device):
                param._set_grad(device.xp.zeros_like(param.raw_array),
                                layout_check=False)
            grads[k] = param.grad
        return grads

    def _update_params(self, params, grads=None):
        """What ``param.update()`` for every parameter would do, batched.

        Args:
            params (list): The target's parameters, in its order.
            grads (list): Their gradients, or ``None`` to read them here.

        Returns:
            list: The parameters that took the per-rule path.

        """
        plan = self._plans.plan
        if plan is None or not plan.matches(params):
            plan = self._plans.plan = self._build_plan(params)
        hp = self.hyperparam
        defaults = (hp.lr, hp.momentum, hp.weight_decay, hp.trust_coefficient,
                    hp.eps, float(hp.nesterov))
        unbatched = list(plan.per_rule)
        for (group, static), where in zip(plan.groups, plan.where):
            if grads is None:
                group_grads = list(map(_mt.GRAD, group.params))
            else:
                group_grads = list(map(grads.__getitem__, where))
            hyper = self._settings(group, static, defaults)
            rejected = group.executor.lars_step(
                group, group_grads, hyper, ratio.OPTIMIZER_FORM)
            for rule in group.rules:
                rule.t += 1
            for k in rejected:
                # A gradient the executor cannot take (none, or another
                # dtype or layout this time): the rule's own path, which
                # counts t itself.
                group.rules[k].t -= 1
                group.params[k].update()
                unbatched.append(group.params[k])
        for param in plan.per_rule:
            param.update()
        return unbatched

    def _settings(self, group, static, defaults):
        """The group's settings table (``LARS_*`` columns) for this update."""
        hyper, uses_wd = static
        hyper[:, :_mt.LARS_NESTEROV + 1] = defaults
        scales = list(map(_mt.LOSS_SCALE, group.params))
        if scales.count(None) == len(scales):
            hyper[:, _mt.LARS_LOSS_SCALE] = 1.0
        else:
            hyper[:, _mt.LARS_LOSS_SCALE] = [
                1.0 if scale is None else scale for scale in scales]
        base = self.hyperparam
        rules = group.rules
        if (list(map(_HYPER_PARENT, rules)).count(base) == len(rules)
                and sum(map(len, map(_HYPER_OWN, rules))) == len(rules)):
            # No rule has values of its own (a hyperparameter holds its
            # parent and nothing else).
            rules = ()
        for k, rule in enumerate(rules):
            hp = rule.hyperparam
            if hp._parent is not base or len(hp.__dict__) != 1:
                # Set on this rule (or on another parent): its own values.
                hyper[k, :_mt.LARS_NESTEROV + 1] = (
                    hp.lr, hp.momentum, hp.weight_decay,
                    hp.trust_coefficient, hp.eps, float(hp.nesterov))
        hyper[:, _mt.LARS_WEIGHT_DECAY] *= uses_wd
        return hyper

    def _build_plan(self, params):
        paths = {id(param): path for path, param in self.target.namedparams()}
        grouper = _mt.Grouper()
        per_rule = []
        for param in params:
            rule = param.update_rule
            group = None
            if _per_rule_reason(param, rule) is None:
                w, v = param.array, rule.state['v']
                group = grouper.group_for(param.device, w.dtype, w, v)
            if group is None:
                per_rule.append(param)
                continue
            group.add(paths[id(param)], param, rule, w, (v,))
            # Its observation is the group's from now on.
            rule._observation = None
        groups = []
        for group in grouper.groups():
            hyper = numpy.zeros((len(group), _mt.LARS_COLUMNS))
            hyper[:, _mt.LARS_ADAPT] = [r.uses_adaptation for r in group.rules]
            uses_wd = numpy.array([float(r.uses_weight_decay)
                                   for r in group.rules])
            groups.append((group, (hyper, uses_wd)))
        return _Plan(params, groups, per_rule)

    def observe(self):
        """The ratios and norms of the last update, per parameter path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` as floats, for the
            arrays that are adapted and enabled: the ratio the update
            applied, recorded where it was computed. Values on a GPU are
            brought to the host here: call it at an interval, not on every
            iteration.

        """
        result = {}
        fetched = {}
        for path, param in self.target.namedparams():
            rule = getattr(param, 'update_rule', None)
            # A disabled rule made no step in the last update.
            if (isinstance(rule, LARSRule) and rule.enabled
                    and rule._observation is not None):
                result[path] = _observations.to_host(rule._observation,
                                                     fetched)
        plan = self._plans.plan
        for group, (hyper, _) in () if plan is None else plan.groups:
            table = group.executor.observe(group).tolist()
            for path, adapt, row in zip(group.paths, hyper[:, _mt.LARS_ADAPT],
                                        table):
                # A NaN ratio: the array was not in the last step.
                if adapt and row[0] == row[0]:
                    result[path] = tuple(row)
        return result
