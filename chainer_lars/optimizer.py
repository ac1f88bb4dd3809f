"""LARS, a face of :mod:`chainer_lars.engine`: :class:`LARS` updates its
arrays in groups, :class:`LARSRule` one array as a group of one."""

import operator
import warnings

import numpy

import chainer
from chainer import optimizer
from chainer import variable

from chainer_lars import checks
from chainer_lars import engine
from chainer_lars import exclusions
from chainer_lars import layout as L


_default_hyperparam = optimizer.Hyperparameter()
_default_hyperparam.lr = 2.0
_default_hyperparam.momentum = 0.9
_default_hyperparam.weight_decay = 1e-4
_default_hyperparam.trust_coefficient = 1e-3
_default_hyperparam.eps = 0.0
_default_hyperparam.nesterov = False

#: The rule hyperparameters, in the order of the layout's first columns.
_HYPER = ('lr', 'momentum', 'nesterov', 'weight_decay', 'eps',
          'trust_coefficient')
assert L.COLUMNS[:len(_HYPER)] == _HYPER
_HYPER_VALUES = operator.attrgetter(*('hyperparam.' + n for n in _HYPER))
_BASE_VALUES = operator.attrgetter(*_HYPER)


def _check_rows(rows, paths):
    """Checks ``rows`` as :class:`LARS` checks assignments: values set on a
    hyperparameter directly (``hyperparam.lr = -1``) fail at the update."""
    with numpy.errstate(invalid='ignore'):
        ok = (numpy.isfinite(rows[:, :len(_HYPER)]).all(axis=1)
              & (rows[:, L.LR] >= 0) & (rows[:, L.MOMENTUM] >= 0)
              & (rows[:, L.MOMENTUM] < 1) & (rows[:, L.WEIGHT_DECAY] >= 0)
              & (rows[:, L.EPS] >= 0) & (rows[:, L.TRUST_COEFFICIENT] > 0))
    for k in numpy.flatnonzero(~ok)[:1]:
        for name in _HYPER:
            if name != 'nesterov':
                getattr(LARS, name).check(rows[k, L.COLUMNS.index(name)], (
                    'LARS hyperparameter {} of {}'.format(name, paths[k])))


def _check_dtype(path, array, face):
    if array.dtype.kind != 'f':
        raise TypeError(
            '{} updates floating-point parameters (float16, float32, '
            'float64); {} is {}'.format(face, path, array.dtype))


def _fill(rows, values, uses_wd, adapt):
    """The optimizer's settings rows from rule hyperparameter values."""
    rows[:, :len(_HYPER)] = values
    rows[:, L.WEIGHT_DECAY] *= uses_wd
    rows[:, L.THRESHOLD] = 0.0
    rows[:, L.REQUIRE_GRAD] = 1.0
    rows[:, L.ADAPT] = adapt


# Chainer's Optimizer attributes of loss scaling, with the value each has
# before ``loss_scaling()``; Optimizer.serialize saves none of them.
_LOSS_SCALING = (('_loss_scale', None), ('_loss_scale_max', 65504.0),
                 ('_loss_scaling_is_dynamic', False),
                 ('_loss_scaling_multiplier', None),
                 ('_loss_scaling_isnan_ever', False))


def serialize_loss_scaling(optimizer, serializer):
    """Saves or loads ``optimizer``'s loss scale and dynamic-scaling state
    (Chainer's private attributes, ``None`` as NaN); a snapshot without
    them leaves the optimizer as it is."""
    for k, (name, default) in enumerate(_LOSS_SCALING):
        value = getattr(optimizer, name, default)
        try:
            value = serializer(name[1:], numpy.nan if value is None
                               else float(value))
        except KeyError:
            if k:  # a snapshot with some of them is damaged
                raise
            return
        if isinstance(serializer, chainer.serializer.Deserializer):
            value = float(value)
            setattr(optimizer, name, None if numpy.isnan(value) else
                    bool(value) if isinstance(default, bool) else value)


def serialize_master(rule, serializer, device=None):
    """Saves or loads ``rule``'s float32 master copy, which Chainer leaves
    out of snapshots (a resumed float16 run would restart from rounded
    weights): into the copy there is, else a new one (sent to ``device``
    where given); a snapshot without one loads as before."""
    master = rule._fp32_param
    current = None if master is None else master.array
    if isinstance(serializer, chainer.serializer.Serializer):
        if current is not None:
            serializer('fp32_param', current)
        return
    try:
        value = serializer('fp32_param', current)
    except KeyError:  # not made yet when the snapshot was written
        return
    if value is not None and current is None:
        if device is not None:
            value = device.send(value)
        rule._fp32_param = chainer.Parameter(value)


class FusedRule(optimizer.UpdateRule):

    """What the rules of the fused faces share: the exclusion flags, the
    state buffers named in ``STATES``, the float32 master copy in
    snapshots, and the engine's ``OP`` on a group of one array. A face's
    rule has its ``_DEFAULTS``, and ``_fill_rows(rows, values, steps,
    uses_weight_decay, adapt, paths, dtype)`` fills and checks its
    settings rows from the hyperparameter values (``_VALUES`` of a
    ``Hyperparameter``, ``_RULE_VALUES`` of a rule) and, where
    ``_STEPPED``, the steps ``t``."""

    # GradientLARS refuses to run on us (checks.double_adaptation).
    adapts_rates = True

    is_elementwise = False

    def __init__(self, parent_hyperparam=None, uses_weight_decay=True,
                 uses_adaptation=True):
        super(FusedRule, self).__init__(
            parent_hyperparam or self._DEFAULTS)
        self.uses_weight_decay = uses_weight_decay
        self.uses_adaptation = uses_adaptation
        # The per-rule path's group of one; whether the last update took it;
        # the parameter's path, once the optimizer's setup names it.
        self._group = None
        self._observed = False
        self._path = None

    def __getstate__(self):
        return dict(self.__dict__, _group=None, _observed=False)

    def init_state(self, param):
        with chainer.using_device(param.device):
            for key in self.STATES:
                self.state[key] = param.device.xp.zeros_like(param.array)

    def serialize(self, serializer):
        """Serializes the state and the float32 master copy
        (:func:`serialize_master`)."""
        super(FusedRule, self).serialize(serializer)
        serialize_master(self, serializer)

    def update(self, param):
        master = self._fp32_param
        if (master is not None and master.array is not None
                and master.device != param.device):
            # A master copy loaded from a snapshot lives on the CPU.
            master.to_device(param.device)
        super(FusedRule, self).update(param)

    # ChainerX arrays take UpdateRule's default path: memory-shared NumPy or
    # CuPy views of them are passed here.
    def update_core_cpu(self, param):
        w, g = param.array, param.grad
        if g is None:
            return
        states = tuple(map(self.state.__getitem__, self.STATES))
        path = self._path or param.name
        group = engine.group_of_one(self._group, param.device, path, w,
                                    states)
        if group is not self._group:
            _check_dtype(path, w, self._face)
            self._group = group
        # The loss scale is already divided out (UpdateRule.update); t
        # counts this step already.
        # A hyperparameter holding only its parent has the parent's values,
        # read directly (through its __getattr__, 3 us of 10 per array).
        own = self.hyperparam.__dict__
        values = (self._VALUES(own['_parent']) if len(own) == 1
                  and '_parent' in own else self._RULE_VALUES(self))
        inputs = (values, self.t if self._STEPPED else None,
                  self.uses_weight_decay, self.uses_adaptation)
        if inputs != group.inputs:
            group.inputs = None  # the rows hold no inputs until checked
            self._fill_rows(group.rows, inputs[0], [inputs[1]], inputs[2],
                            inputs[3], group.paths, group.dtype)
            group.inputs = inputs
        if engine.run(group, [g], self.OP):
            raise ValueError(
                '{} needs the weight, gradient and {} of one dtype '
                '(float16, float32 or float64); got {} for {}'.format(
                    self._face, ' and '.join(engine.STATE_NAMES[self.OP]),
                    ', '.join(str(a.dtype) for a in (w, g) + states),
                    group.paths[0]))
        self._observed = True

    update_core_gpu = update_core_cpu


class LARSRule(FusedRule):

    """Update rule of :class:`LARS` for one parameter array (reads its
    hyperparameters at every update).

    Args:
        parent_hyperparam (~chainer.optimizer.Hyperparameter): The defaults.
        uses_weight_decay (bool): ``False``: no weight decay on this array.
        uses_adaptation (bool): ``False``: no layer adaptation (ratio 1).

    Attributes:
        uses_weight_decay (bool): As the argument.
        uses_adaptation (bool): As the argument.

    """

    _face, STATES, OP, _STEPPED = 'LARS', ('v',), L.STEP, False
    _DEFAULTS, _VALUES, _RULE_VALUES = (
        _default_hyperparam, _BASE_VALUES, _HYPER_VALUES)

    @staticmethod
    def _fill_rows(rows, values, steps, uses_wd, adapt, paths, dtype):
        _fill(rows, values, uses_wd, adapt)
        _check_rows(rows, paths)


_RULE_FLAGS = operator.attrgetter('enabled', 'uses_weight_decay',
                                  'uses_adaptation', '_use_fp32_update')
_HYPER_PARENT = operator.attrgetter('hyperparam._parent')
_HYPER_OWN = operator.attrgetter('hyperparam.__dict__')


def _flags(rules):
    """Per rule: enabled, the exclusion flags and the fp32 update flag."""
    try:
        return list(map(_RULE_FLAGS, rules))
    except AttributeError:  # no rule, or not a FusedRule: never batched
        return [_RULE_FLAGS(r) if isinstance(r, FusedRule) else None
                for r in rules]


def _batchable(param, rule, cls):
    """Whether the batched step does what ``param.update()`` would: a plain
    ``cls`` (no rule: a link added after setup(), which Chainer skips),
    enabled, with no rule hooks (they run between the division by the loss
    scale and the step), its state made, Chainer's layout, and for a
    float16 parameter with ``use_fp32_update()``, its float32 master copy
    made, on the parameter's device (see :func:`_master`)."""
    return (type(rule) is cls and rule.enabled
            and not rule._hookable._pre_update_hooks
            and not rule._hookable._post_update_hooks
            and param.array is not None and rule.state is not None
            and param.layout is None
            and (_master(param, rule) is not None
                 or not (rule._use_fp32_update
                         and param.dtype == numpy.float16)))


def _master(param, rule):
    """The float32 master copy that a float16 parameter's rule steps under
    ``use_fp32_update()``, where it is made and on the parameter's device
    (a master loaded from a snapshot lives on the CPU until the rule's
    first update), else ``None``."""
    master = rule._fp32_param
    if (rule._use_fp32_update and param.dtype == numpy.float16
            and master is not None and master.array is not None
            and master.device == param.device):
        return master.array
    return None


def _check_unbatched(param):
    """The engine's check of a FusedRule's arrays on the per-rule path (its
    own check would come after the batched groups moved)."""
    rule, w, g = param.update_rule, param.array, param.grad
    if (isinstance(rule, FusedRule) and rule.enabled and w is not None
            and g is not None and not (
                rule._use_fp32_update and w.dtype == numpy.float16)):
        checks.addressed(rule._path or param.name, w, g,
                         tuple(map(rule.state.__getitem__, rule.STATES))
                         if rule.state else (),
                         one_dtype=param.device.xp is not numpy,
                         names=engine.STATE_NAMES[rule.OP])


class FusedMethod(exclusions.ExclusionProperties, optimizer.GradientMethod):

    """What the fused faces share: ``update`` (a fork of Chainer's), the
    plan of groups, the settings rows, the exclusions, the loss-scaling
    state in snapshots and ``observe``. A face names its rule class
    (``_rule``) and itself (``_face``)."""

    # GradientLARS refuses to run on us (checks.double_adaptation).
    adapts_rates = True
    # Whether the last update stepped (not skipped for non-finite gradients).
    _stepped = True

    def __init__(self, multi_tensor):
        super(FusedMethod, self).__init__()
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        self._plans = engine.PlanCache()

    def create_update_rule(self):
        return self._rule(self.hyperparam)

    def add_hook(self, hook, name=None, timing='auto'):
        """Registers a hook, as :meth:`chainer.Optimizer.add_hook`; a
        :class:`GradientLARS` is refused: it would adapt the rates twice."""
        if getattr(hook, 'adapts_gradients', False):  # GradientLARS
            checks.double_adaptation(self._face)
        super(FusedMethod, self).add_hook(hook, name, timing)

    def setup(self, link):
        super(FusedMethod, self).setup(link)
        for path, param in link.namedparams():
            rule = param.update_rule
            if isinstance(rule, self._rule):
                rule.uses_weight_decay, rule.uses_adaptation = (
                    self._rules.lookup(path))
                rule._path = path
        return self

    def serialize(self, serializer):
        """Chainer's, and the loss-scaling state, which Chainer leaves out
        (a resumed run would restart its dynamic scale at 1)."""
        super(FusedMethod, self).serialize(serializer)
        serialize_loss_scaling(self, serializer)

    def update(self, lossfun=None, *args, **kwds):
        """Updates the parameters, as :meth:`chainer.GradientMethod.update`
        does: with ``lossfun``, computes the loss of ``lossfun(*args,
        **kwds)`` and its gradients first; then the hooks, the step of
        every parameter, and the loss scale's update."""
        # A fork of Chainer 7.8.1's GradientMethod.update, with its
        # check_nan_in_grads and reallocate_cleared_grads (below): the same
        # steps on one listing of the parameters, param.update() replaced by
        # _update_params, reading Chainer's private _loss_scale, _hookable,
        # _loss_scaling_* and _set_grad; tests/test_optimizer.py fails if
        # they change (docs/design.rst).
        if not self._multi_tensor:
            super(FusedMethod, self).update(lossfun, *args, **kwds)
            self._stepped = self.is_safe_to_update()
            return
        if lossfun is not None:
            use_cleargrads = getattr(self, '_use_cleargrads', True)
            loss = lossfun(*args, **kwds)
            if use_cleargrads:
                self.target.cleargrads()
            else:
                self.target.zerograds()
            loss.backward(loss_scale=self._loss_scale)
            del loss

        # One listing for the reallocations and the update (Chainer makes
        # three); hooks may change the model, so it is made again after them.
        params = list(self.target.params())
        grads = self._reallocate(params)
        self._check_finite(params, grads)
        if self._hookable._pre_update_hooks:
            self.call_hooks('pre')
            # Hooks may replace gradients, too.
            params, grads = list(self.target.params()), None

        self.t += 1
        unbatched = params
        self._stepped = self.is_safe_to_update()
        if self._stepped:
            unbatched = self._update_params(params, grads)

        # The batched parameters had gradients and the update kept them.
        self._reallocate(unbatched)

        self.call_hooks('post')
        self.update_loss_scale()

    def _check_finite(self, params, grads):
        """Chainer's ``check_nan_in_grads`` (its warnings, in its order),
        with one transfer of flags per device, not one per array."""
        self._loss_scaling_isnan = False
        if not self._loss_scaling_is_dynamic:
            return
        by_device = {}  # str(device) -> (device, [(k, all finite)])
        for k, (param, g) in enumerate(zip(params, grads)):
            if g is not None:
                device, xp = param.device, param.device.xp
                with chainer.using_device(device):
                    by_device.setdefault(str(device), (device, []))[1].append(
                        (k, xp.all(xp.isfinite(g))))
        bad = []
        for device, flags in by_device.values():
            where, finite = zip(*flags)
            if device.xp not in (numpy, chainer.backend.chainerx):
                with chainer.using_device(device):
                    finite = device.xp.stack(finite).get()
            bad += [k for k, ok in zip(where, finite) if not ok]
        if bad:
            self._loss_scaling_isnan = self._loss_scaling_isnan_ever = True
            names = {id(p): name for name, p in self.target.namedparams()}
            for k in sorted(bad):
                warnings.warn(
                    'Non finite number found in param.grad of {}'
                    ' (iteration: {}, loss_scale: {})'.format(
                        names[id(params[k])], self.t, self._loss_scale))

    def reallocate_cleared_grads(self):
        """Chainer's (also called after each optimizer hook), without
        building every parameter's path."""
        self._reallocate(list(self.target.params()))

    @staticmethod
    def _reallocate(params):
        """Zero gradients for the initialised ``params`` that have none;
        returns every parameter's gradient after that."""
        with variable._AllowArrayAccessWithNonstandardLayout():
            grads = list(map(engine.GRAD, params))
        for k in [k for k, g in enumerate(grads) if g is None]:
            param, device = params[k], params[k].device
            # Chainer's listing leaves uninitialised parameters out.
            if param.raw_array is not None:
                with chainer.using_device(device):
                    param._set_grad(device.xp.zeros_like(param.raw_array),
                                    layout_check=False)
                grads[k] = param.grad
        return grads

    def _update_params(self, params, grads=None):
        """``param.update()`` for every parameter, batched (``grads``: theirs,
        or ``None``); returns those that took the per-rule path."""
        plan = self._plans.plan
        if plan is None or not plan.matches(params):
            plan = self._plans.plan = self._build_plan(params)
        picks = []
        for group, where in zip(plan.groups, plan.where):
            # All checked before anything moves.
            self._settings(group)
            picked = (list(map(engine.GRAD, group.params)) if grads is None
                      # A group of every parameter has them in their order.
                      else grads if len(where) == len(grads)
                      else list(map(grads.__getitem__, where)))
            picks.append(picked)
        engine.check_all(plan.groups, picks, self._rule.OP, plan)
        for param in plan.others:
            _check_unbatched(param)
        unbatched = list(plan.others)
        for group, picked in zip(plan.groups, picks):
            left = engine.run(group, picked, self._rule.OP, checked=True)
            for rule in group.rules:
                rule.t += 1
            for k in left:
                # A gradient the executor cannot take (none, or another
                # dtype): the rule's own path, which counts t itself.
                group.rules[k].t -= 1
                group.params[k].update()
                unbatched.append(group.params[k])
        for param in plan.others:
            param.update()
        return unbatched

    def _settings(self, group):
        """Fills the group's settings rows for this update, where the
        values they come from changed, and checks them then."""
        rules, base, cls = group.rules, self.hyperparam, self._rule
        values = cls._VALUES(base)
        # Unless a rule has values of its own (a hyperparameter holds its
        # parent and nothing else otherwise).
        if (list(map(_HYPER_PARENT, rules)).count(base) != len(rules)
                or sum(map(len, map(_HYPER_OWN, rules))) != len(rules)):
            values = list(map(cls._RULE_VALUES, rules))
        scales = list(map(engine.LOSS_SCALE, group.params))
        # The step each rule makes (t counts after it), where the rows
        # depend on it.
        steps = [r.t + 1 for r in rules] if cls._STEPPED else None
        if (values, scales, steps) == group.inputs:
            return
        rows, group.inputs = group.rows, None  # none until checked
        rows[:, L.LOSS_SCALE] = [1.0 if s is None else s for s in scales]
        cls._fill_rows(rows, values, steps, *group.static, group.paths,
                       group.dtype)
        group.inputs = (values, scales, steps)
        group.scaled = bool((rows[:, L.LOSS_SCALE] != 1.0).any())

    def _build_plan(self, params):
        paths = {id(param): path for path, param in self.target.namedparams()}
        plan = engine.Plan(params, _flags, states=self._rule.STATES)
        for param in params:
            rule = param.update_rule
            if (_batchable(param, rule, self._rule)
                    and engine.executor_for(param.device) is not None):
                path, w = paths[id(param)], param.array
                _check_dtype(path, w, self._face)
                master = _master(param, rule)
                plan.add(None, param.device, path, param, rule,
                         w if master is None else master,
                         tuple(map(rule.state.__getitem__, rule.STATES)),
                         (rule.uses_weight_decay, rule.uses_adaptation),
                         None if master is None else w)
                rule._observed = False  # the group's observation from now on
            else:
                plan.others.append(param)
        return plan.finish(params)

    def observe(self):
        """``{path: (ratio, ||w||, ||g||)}`` of the last update, as floats,
        for the adapted and enabled arrays (see :meth:`GradientLARS.observe
        <chainer_lars.GradientLARS.observe>`)."""
        if self.target is None:
            raise RuntimeError(
                '{}.observe() reports the last update: call '
                'optimizer.setup(link) and update() first'.format(
                    type(self).__name__))
        result = {}
        if not self._stepped:  # skipped: nothing was applied
            return result
        for path, param in self.target.namedparams():
            rule = getattr(param, 'update_rule', None)
            # A disabled rule made no step in the last update.
            if (isinstance(rule, self._rule) and rule.enabled
                    and rule._observed and rule.uses_adaptation):
                for row in engine.observe(rule._group).values():
                    result[path] = row
        plan = self._plans.plan
        for group in () if plan is None else plan.groups:
            result.update(engine.observe(group, group.static[1]))
        return result


class LARS(FusedMethod):

    """Momentum SGD with layer-wise adaptive rate scaling (`LARS
    <https://arxiv.org/abs/1708.03888>`_). Per array, :math:`g` unscaled,

    .. math::

        r &= \\eta \\frac{\\|w\\|}{\\|g\\| + \\lambda \\|w\\| + \\epsilon}
             \\ \\text{if } \\|w\\| > 0 \\text{ and } \\|g\\| > 0
             \\text{, else } 1, \\\\
        v &\\leftarrow \\mu v + \\gamma r (g + \\lambda w), \\qquad
        w \\leftarrow w - v
        \\quad (\\text{Nesterov: } w \\leftarrow w - \\gamma r (g + \\lambda w)
        - \\mu v).

    In plain text, with the arguments' names: ``r = trust_coefficient *
    ||w|| / (||g|| + weight_decay * ||w|| + eps)`` if both norms are
    positive, else ``r = 1``; ``u = lr * r * (g + weight_decay * w)``, ``v <-
    momentum * v + u``, ``w <- w - v`` (Nesterov: ``w <- w - u - momentum *
    v``).

    ``lr`` and ``trust_coefficient`` are the paper's :math:`\\gamma` and
    :math:`\\eta`, kept apart as in TensorFlow: an adapted array moves, per
    update and before momentum, by about ``lr * trust_coefficient`` times
    its own norm. :class:`GradientLARS` has the same two names with
    Chainer's defaults, ``trust_coefficient=1``, where the optimizer's
    ``lr`` is that product itself: for the same step the hook's ``lr`` is
    1,000 times smaller than this one's (``LARS(lr=2.0)``, or
    ``MomentumSGD(lr=0.002)`` with ``GradientLARS()``). Start from the
    defaults, ``lr=2`` and ``trust_coefficient=1e-3`` (tried at batch 128),
    and scale ``lr`` with the batch. TensorFlow's defaults are ``lr=1e-3,
    trust_coefficient=1e-3``: a step of a millionth of the norm, which
    trains next to nothing in a few hundred updates.

    Args:
        lr (float): Learning rate :math:`\\gamma`.
        momentum (float): Momentum :math:`\\mu`, in ``[0, 1)``.
        weight_decay (float): Weight decay :math:`\\lambda`.
        trust_coefficient (float): :math:`\\eta` (TensorFlow's ``eeta``).
        eps (float): Added to the denominator; ``0`` stays 0.
        nesterov (bool): Use Nesterov momentum.
        exclude_from_weight_decay (list of str): Regular expressions
            searched in the parameter paths (e.g. ``'/b$'``).
        exclude_from_layer_adaptation (list of str): Likewise: ratio 1, the
            plain rate ``lr``.
        multi_tensor (bool): Update each device's and dtype's together.

    Attributes:
        lr (float): The learning rate; settable (e.g. by a schedule) and
            checked on assignment, as are the five below.
        momentum (float): The momentum.
        weight_decay (float): The weight decay.
        trust_coefficient (float): The trust coefficient.
        eps (float): The term added to the denominator.
        nesterov (bool): Whether the momentum is Nesterov's.
        exclude_from_weight_decay (tuple of str): The patterns, read only.
        exclude_from_layer_adaptation (tuple of str): Likewise.

    """

    _rule, _face = LARSRule, 'LARS'

    def __init__(self, lr=_default_hyperparam.lr,
                 momentum=_default_hyperparam.momentum,
                 weight_decay=_default_hyperparam.weight_decay,
                 trust_coefficient=_default_hyperparam.trust_coefficient,
                 eps=_default_hyperparam.eps,
                 nesterov=_default_hyperparam.nesterov,
                 exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=(), multi_tensor=True):
        super(LARS, self).__init__(multi_tensor)
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.nesterov = nesterov
        self._rules = exclusions.ExclusionRules(
            exclude_from_weight_decay, exclude_from_layer_adaptation)

    lr = checks.CheckedHyperparameter(checks.real, minimum=0.0)
    momentum = checks.CheckedHyperparameter(checks.real, minimum=0.0,
                                            maximum=1.0)
    weight_decay = checks.CheckedHyperparameter(checks.real, minimum=0.0)
    trust_coefficient = checks.CheckedHyperparameter(
        checks.real, minimum=0.0, exclusive=True)
    eps = checks.CheckedHyperparameter(checks.real, minimum=0.0)
    nesterov = checks.CheckedHyperparameter(checks.boolean)
    _REPR = ('lr', 'momentum', 'weight_decay', 'trust_coefficient', 'eps',
             'nesterov', 'exclude_from_weight_decay',
             'exclude_from_layer_adaptation', '_multi_tensor')
