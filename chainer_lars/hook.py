"""GradientLARS: the LARS pre-update hook, a face of the engine."""

import sys
import weakref

import numpy

import chainer

from chainer_lars import checks
from chainer_lars import engine
from chainer_lars import exclusions
from chainer_lars import layout as L


class _RuleDelegate(object):

    """Runs a GradientLARS on one float16 parameter inside its update rule,
    after the rule divides out the loss scale (a float16 gradient cannot
    hold the rescaled result times it), on the float32 master copy if any.
    Armed for the optimizer's next ``t`` only: a skipped update or a removed
    hook leaves nothing behind; arming is not copied."""

    timing = 'pre'

    def __init__(self, hook):
        self.hook = hook
        self._armed = None

    def arm(self, optimizer, path):
        """Makes the call in ``optimizer``'s next update rescale ``path``."""
        self._armed = (weakref.ref(optimizer), optimizer.t + 1, path)

    def __getstate__(self):
        return dict(self.__dict__, _armed=None)

    def __call__(self, rule, param):
        armed, self._armed = self._armed, None
        if armed is None:
            return
        optimizer, t, path = armed
        optimizer = optimizer()
        if optimizer is not None and optimizer.t == t:
            self.hook._rescale(rule, param, path, 1.0)


class _Registration(object):

    """``name`` and ``timing``. Read by Chainer's ``add_hook``, they refuse
    the class given as a hook (``add_hook(GradientLARS)``, which would be
    called as ``GradientLARS(optimizer)``) and ``timing='post'`` (the
    rescaled gradients would be thrown away); elsewhere they are plain."""

    def __init__(self, value):
        self.value = value

    def __get__(self, hook, owner=None):
        caller = sys._getframe(1)
        if caller.f_code is _ADD_HOOK_CODE:
            if hook is None:
                raise TypeError(
                    '{0} is a class: register an instance, add_hook('
                    'chainer_lars.{0}()) with the parentheses'.format(
                        owner.__name__))
            if caller.f_locals.get('timing') == 'post':
                _post_refused()
        return self.value


#: The code of Chainer 7.8.1's add_hook, which reads ``hook.name`` (``None``
#: where Chainer has another).
_ADD_HOOK_CODE = getattr(getattr(getattr(
    chainer.optimizer, '_Hookable', None), 'add_hook', None), '__code__', None)


def _post_refused():
    raise ValueError(
        "GradientLARS rescales the gradients before the update: register "
        "it with timing='pre' or 'auto' (the default), not 'post'")


#: Name of a GradientLARS's delegate on an update rule (``#2``, ``#3``, ...
#: appended while taken: several hooks on one model).
_DELEGATE_NAME = 'chainer_lars.GradientLARS'


class GradientLARS(exclusions.ExclusionProperties):

    """Layer-wise adaptive rate scaling of the gradients (LARS).

    A pre-update hook that rescales each parameter's gradient in place (`You
    et al. <https://arxiv.org/abs/1708.03888>`_; ``threshold`` and ``eps``
    from `arXiv:1801.03137 <https://arxiv.org/abs/1801.03137>`_):

    .. math::

        r = \\eta \\frac{\\|w\\|}{\\epsilon + \\|g\\| + \\lambda \\|w\\|}
            \\ \\text{if } \\|w\\| > \\tau \\text{, else } 1, \\qquad
        g \\leftarrow r (g + \\lambda w).

    In plain text, with the arguments' names: ``r = trust_coefficient *
    ||w|| / (eps + ||g|| + weight_decay * ||w||)`` if ``||w|| > threshold``,
    else ``r = 1``; then ``g <- r * (g + weight_decay * w)``.

    A drop-in for Chainer's hook, correct under loss scaling and in float16,
    with Chainer's defaults. Called on one update rule, the patterns search
    ``'/' + param.name``.

    With the default ``trust_coefficient=1`` (Chainer's convention) the
    optimizer's ``lr`` is the paper's :math:`\\gamma \\eta`: an adapted array
    moves, per update and before momentum, by about ``lr`` times its own
    norm, so ``lr`` is small: start from ``MomentumSGD(lr=0.002)`` (about
    1e-3 to 1e-2). The plain ``lr=0.1`` of ``MomentumSGD`` moves every array
    by a tenth of its norm per update and diverges. :class:`LARS` keeps
    :math:`\\eta` apart, TensorFlow's ``trust_coefficient=1e-3``, with an
    ``lr`` 1,000 times larger for the same step. Arrays at or below
    ``threshold`` (biases starting at 0) get the plain ``lr``.

    Args:
        threshold (float): ``r = 1`` unless ``||w|| > threshold``.
        weight_decay (float): :math:`\\lambda`.
        eps (float): Added to the denominator.
        trust_coefficient (float): :math:`\\eta`.
        clip (bool): LARC clipping, ``r <- min(r / lr, 1)`` (rule's ``lr``).
        exclude_from_weight_decay (list of str): Regular expressions
            searched in the parameter paths: no weight decay there.
        exclude_from_layer_adaptation (list of str): Likewise: ``r = 1``.
        multi_tensor (bool): Rescale each device's and dtype's together.

    Attributes:
        threshold (float): As the argument; settable and checked on
            assignment, as are the four below.
        weight_decay (float): As the argument.
        eps (float): As the argument.
        trust_coefficient (float): As the argument.
        clip (bool): As the argument.
        exclude_from_weight_decay (tuple of str): The patterns, read only.
        exclude_from_layer_adaptation (tuple of str): Likewise.

    """

    name = _Registration('GradientLARS')
    call_for_each_param = False
    timing = _Registration('pre')
    # LARS refuses us as a hook (checks.double_adaptation).
    adapts_gradients = True

    threshold = checks.CheckedAttribute(checks.real, minimum=0.0)
    weight_decay = checks.CheckedAttribute(checks.real, minimum=0.0)
    eps = checks.CheckedAttribute(checks.real, minimum=0.0)
    trust_coefficient = checks.CheckedAttribute(
        checks.real, minimum=0.0, exclusive=True)
    clip = checks.CheckedAttribute(checks.boolean)
    _REPR = ('threshold', 'weight_decay', 'eps', 'trust_coefficient', 'clip',
             'exclude_from_weight_decay', 'exclude_from_layer_adaptation')

    def __init__(self, threshold=1e-2, weight_decay=0.0, eps=1e-9, *,
                 trust_coefficient=1.0, clip=False,
                 exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=(), multi_tensor=True):
        if isinstance(threshold, (chainer.Optimizer, chainer.UpdateRule)):
            # Chainer calling the class registered by add_hook(GradientLARS)
            raise TypeError(
                'GradientLARS was registered as a class: register an '
                'instance, add_hook(chainer_lars.GradientLARS()) with the '
                'parentheses')
        self._rules = exclusions.ExclusionRules(
            exclude_from_weight_decay, exclude_from_layer_adaptation)
        self.threshold = threshold
        self.weight_decay = weight_decay
        self.eps = eps
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        self._plans = engine.PlanCache()
        # Groups of one array (per-rule calls, float16 delegates) by
        # parameter, and the last update's groups, for observe().
        self._singles = {}
        self._observed = {}

    def __getstate__(self):
        # A copy starts without the original's observations and tables.
        return dict(self.__dict__, _singles={}, _observed={})

    def __call__(self, *args):
        owner = args[0] if args else None
        # Registered where add_hook read neither name nor timing.
        hookable = getattr(owner, '_hookable', None)
        if hookable is not None and any(
                h is self for h in hookable._post_update_hooks.values()):
            _post_refused()
        if getattr(owner, 'adapts_rates', False):  # LARS, LAMB, rules
            checks.double_adaptation(owner._face)
        if len(args) == 1:
            self._update_all(args[0])
        elif len(args) == 2:
            rule, param = args
            self._rescale(rule, param, '/' + (param.name or ''), 1.0)
        else:
            raise TypeError(
                'GradientLARS is called as hook(optimizer) or '
                'hook(update_rule, param), got {} arguments'.format(
                    len(args)))

    def _fill(self, group, clips, scales):
        """Fills the group's settings rows, where what they come from
        changed since the last update."""
        inputs = (self.weight_decay, self.eps, self.trust_coefficient,
                  self.threshold, clips, scales, group.static)
        if inputs != group.inputs:
            rows, (uses_wd, adapt) = group.rows, group.static
            rows[:, L.WEIGHT_DECAY] = self.weight_decay * uses_wd
            rows[:, [L.EPS, L.TRUST_COEFFICIENT, L.THRESHOLD]] = inputs[1:4]
            rows[:, L.ADAPT] = adapt
            rows[:, L.CLIP_LR] = clips
            rows[:, L.LOSS_SCALE] = [1.0 if s is None else s for s in scales]
            group.inputs = inputs

    def _update_all(self, optimizer):
        target = getattr(optimizer, 'target', None)
        if target is None:
            raise TypeError(
                'GradientLARS must be registered on a set-up optimizer '
                '(optimizer.setup(link) first); got {!r}'.format(optimizer))
        self._observed = {}
        if getattr(optimizer, '_loss_scaling_isnan', False):
            # Non-finite gradients under dynamic loss scaling (Chainer's
            # check_nan_in_grads): the update is skipped, and so is the
            # rescaling (nothing to observe).
            return
        params = list(target.params())
        plan = self._plans.plan
        if plan is None or not plan.matches(params):
            plan = self._plans.plan = self._build_plan(target, params)
        # Everything is read and checked before anything changes: an error
        # (clip=True on a rule without 'lr') leaves all as it was.
        jobs = []
        for group in plan.groups:
            grads = list(map(engine.GRAD, group.params))
            clips = -1.0
            if self.clip:
                clips = [self._clip_lr(rule, path) if a and g is not None
                         and g.size else -1.0 for rule, path, a, g in zip(
                             group.rules, group.paths, group.static[1], grads)]
            jobs.append((group, grads, clips))
        engine.check_all(plan.groups, [job[1] for job in jobs], L.RESCALE,
                         plan)
        others = []
        for param, rule, path, adapt in plan.others:
            g = param.grad
            if g is not None and param.dtype == numpy.float16:
                direct = not rule._use_fp32_update  # the delegate's arrays
                checks.addressed(
                    path, param.array, g, (), ('gradient',) if direct else (),
                    direct and param.device.xp is not numpy)
            if g is not None and g.size:
                if self.clip and adapt:
                    self._clip_lr(rule, path)
                others.append((param, rule, path))

        for param, rule, path in others:
            if param.dtype == numpy.float16:
                self._delegate(rule).arm(optimizer, path)
        for group, grads, clips in jobs:
            self._fill(group, clips,
                       list(map(engine.LOSS_SCALE, group.params)))
            for k in engine.run(group, grads, L.RESCALE, checked=True):
                self._unsupported(group.paths[k], group.weights[k], grads[k])
            self._observed[id(group)] = group
        for param, rule, path in others:
            if param.dtype != numpy.float16:  # ChainerX
                scale = param._loss_scale
                self._rescale(rule, param, path,
                              1.0 if scale is None else scale)

    def _build_plan(self, target, params):
        paths = {id(param): path for path, param in target.namedparams()}
        plan = engine.Plan(params, _enabled)
        for param in params:
            rule, w = param.update_rule, param.array
            if rule is None or not rule.enabled or w is None:
                continue  # as Chainer's optimizers do
            path = paths[id(param)]
            flags = self._rules.lookup(path)
            if (w.dtype == numpy.float16  # in its rule (_RuleDelegate)
                    or engine.executor_for(param.device) is None):  # chx
                plan.others.append((param, rule, path, flags[1]))
            else:
                plan.add(None if self._multi_tensor else path, param.device,
                         path, param, rule, w, static=flags)
        return plan.finish(params)

    def _unsupported(self, path, w, g):
        if g is not None:
            raise TypeError(
                'GradientLARS rescales float16, float32 and float64 '
                "gradients of their weight's dtype on GPU; {} has a "
                '{} weight and a {} gradient'.format(path, w.dtype, g.dtype))

    def _delegate(self, rule):
        """This hook's delegate on ``rule`` (in Chainer 7.8.1's
        ``_hookable``, so a copied optimizer finds the copied one), made on
        first use."""
        registry = rule._hookable
        for hook in registry._pre_update_hooks.values():
            if isinstance(hook, _RuleDelegate) and hook.hook is self:
                return hook
        name, n = _DELEGATE_NAME, 1
        while (name in registry._pre_update_hooks
               or name in registry._post_update_hooks):
            n += 1
            name = '{}#{}'.format(_DELEGATE_NAME, n)
        delegate = _RuleDelegate(self)
        rule.add_hook(delegate, name=name, timing='pre')
        return delegate

    def _clip_lr(self, rule, path):
        lr = getattr(getattr(rule, 'hyperparam', None), 'lr', None)
        if lr is None:
            raise TypeError(
                'GradientLARS(clip=True) divides the ratio by the update '
                "rule's learning rate, but the rule of {} ({}) has no "
                "hyperparameter 'lr'".format(path, type(rule).__name__))
        return checks.real('lr of ' + path, lr, minimum=0.0)

    def _rescale(self, rule, param, path, loss_scale):
        """Rescales one gradient in place as a group of one; ``loss_scale``
        is the factor still in the stored gradient (the result keeps it)."""
        w = param.array
        g = None if w is None else param.grad
        if g is None or (g.size == 0 and w.size == 0):
            return
        uses_wd, adapt = self._rules.lookup(path)
        clip_lr = self._clip_lr(rule, path) if adapt and self.clip else -1.0
        device = param.device
        if device.xp is chainer.backend.chainerx:  # as Chainer's rules do
            w, g = chainer.backend.from_chx(w), chainer.backend.from_chx(g)
            device = chainer.backend.get_device_from_array(w)
        key = id(param)
        cached = self._singles.get(key, (None, None))[1]
        group = engine.group_of_one(cached, device, path, w)
        if group is not cached:
            # Held weakly: a deleted parameter takes its entry with it.
            self._singles[key] = (weakref.ref(
                param, lambda _, singles=self._singles, key=key:
                singles.pop(key, None)), group)
        group.static = (uses_wd, adapt)
        self._fill(group, clip_lr, [loss_scale])
        if engine.run(group, [g], L.RESCALE):
            self._unsupported(path, w, g)
        self._observed[path] = group

    def observe(self):
        """The ratios and norms of the last update, per parameter path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` as floats, ``g`` the
            unscaled gradient before rescaling. On a GPU, one transfer per
            group: call it at an interval, not on every iteration.
        """
        result = {}
        for group in self._observed.values():
            result.update(engine.observe(group))
        return result


def _enabled(rules):
    return [rule is not None and rule.enabled for rule in rules]
