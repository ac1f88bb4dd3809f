"""GradientLARS: the LARS pre-update hook, a face of the engine."""

import weakref

import numpy

import chainer

from chainer_lars import checks
from chainer_lars import engine
from chainer_lars import exclusions
from chainer_lars import layout as L


class _RuleDelegate(object):

    """Runs a GradientLARS on one float16 parameter inside its update rule.

    Chainer calls optimizer hooks before the rule divides out the loss scale
    and makes the float32 master copy; a float16 gradient cannot hold the
    rescaled result times the loss scale, so it is rescaled here instead,
    after the division and on the master copy when there is one. The hook
    arms the delegate for the update whose ``t`` follows the optimizer's
    (hooks run, then ``t`` is incremented, then the rules); called in any
    other update it does nothing, so a skipped update leaves nothing behind
    and a removed hook rescales nothing more. It holds its hook, so that a
    copied optimizer's delegates hold the copied hook; arming is not copied.

    """

    timing = 'pre'

    def __init__(self, hook):
        self.hook = hook
        self._armed = None

    def arm(self, optimizer, path):
        """Makes the call in ``optimizer``'s next update rescale ``path``."""
        self._armed = (weakref.ref(optimizer), optimizer.t + 1, path)

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_armed'] = None
        return state

    def __call__(self, rule, param):
        armed, self._armed = self._armed, None
        if armed is None:
            return
        optimizer, t, path = armed
        optimizer = optimizer()
        if optimizer is not None and optimizer.t == t:
            self.hook._rescale(rule, param, path, 1.0)


#: Name under which a GradientLARS registers its delegate on an update rule;
#: ``#2``, ``#3``, ... are appended while the name is taken (several hooks on
#: one model).
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

    With the defaults, a drop-in for Chainer's hook that is correct under
    loss scaling and in float16 (see the docs). On one update rule, the
    exclusion patterns are searched in ``'/' + param.name``.

    Args:
        threshold (float): ``r = 1`` unless ``||w|| > threshold``.
        weight_decay (float): :math:`\\lambda`.
        eps (float): Added to the denominator.
        trust_coefficient (float): :math:`\\eta`.
        clip (bool): LARC clipping, ``r <- min(r / lr, 1)`` with the update
            rule's ``lr``.
        exclude_from_weight_decay (list of str): Regular expressions
            searched in the parameter paths: no weight decay there.
        exclude_from_layer_adaptation (list of str): Likewise: ``r = 1``.
        multi_tensor (bool): Rescale the arrays of one device and dtype
            together.

    Attributes:
        ~GradientLARS.threshold, ~GradientLARS.weight_decay,
        ~GradientLARS.eps, ~GradientLARS.trust_coefficient,
        ~GradientLARS.clip: As above; settable, checked on assignment.

    """

    name = 'GradientLARS'
    call_for_each_param = False
    timing = 'pre'

    threshold = checks.CheckedAttribute(checks.real, minimum=0.0)
    weight_decay = checks.CheckedAttribute(checks.real, minimum=0.0)
    eps = checks.CheckedAttribute(checks.real, minimum=0.0)
    trust_coefficient = checks.CheckedAttribute(
        checks.real, minimum=0.0, exclusive=True)
    clip = checks.CheckedAttribute(checks.boolean)

    def __init__(self, threshold=1e-2, weight_decay=0.0, eps=1e-9, *,
                 trust_coefficient=1.0, clip=False,
                 exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=(), multi_tensor=True):
        self.threshold = threshold
        self.weight_decay = weight_decay
        self.eps = eps
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self._rules = exclusions.ExclusionRules(
            exclude_from_weight_decay, exclude_from_layer_adaptation)
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        self._plans = engine.PlanCache()
        # Groups of one array (per-rule calls, float16 delegates), by
        # parameter, and what the last update ran, for observe().
        self._singles = {}
        self._observed = {}

    def __getstate__(self):
        # Observations and GPU tables are the original's: a copy starts
        # without them.
        state = self.__dict__.copy()
        state['_singles'] = {}
        state['_observed'] = {}
        return state

    def __repr__(self):
        return ('GradientLARS(threshold={}, weight_decay={}, eps={}, '
                'trust_coefficient={}, clip={}, '
                'exclude_from_weight_decay={}, '
                'exclude_from_layer_adaptation={})'.format(
                    self.threshold, self.weight_decay, self.eps,
                    self.trust_coefficient, self.clip,
                    self.exclude_from_weight_decay,
                    self.exclude_from_layer_adaptation))

    def __call__(self, *args):
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

    def _settings(self):
        return self.weight_decay, self.eps, self.trust_coefficient, \
            self.threshold

    @staticmethod
    def _fill(group, settings, clips, scales):
        """Fills the group's settings rows where what they come from
        changed (the rows keep the last update's)."""
        inputs = (settings, clips, scales)
        if inputs == group.inputs:
            return
        rows = group.rows
        uses_wd, adapt = group.static
        weight_decay, eps, trust_coefficient, threshold = settings
        rows[:, L.WEIGHT_DECAY] = weight_decay * uses_wd
        rows[:, L.EPS] = eps
        rows[:, L.TRUST_COEFFICIENT] = trust_coefficient
        rows[:, L.THRESHOLD] = threshold
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
        params = list(target.params())
        plan = self._plans.plan
        if plan is None or not plan.matches(params):
            plan = self._plans.plan = self._build_plan(target, params)
        # Everything is read and checked before anything changes, so that
        # a configuration error (clip=True on a rule without 'lr') leaves
        # every gradient, array and rule as it was.
        jobs = []
        for group in plan.groups:
            adapt = group.static[1]
            grads = list(map(engine.GRAD, group.params))
            clips = -1.0
            if self.clip:
                clips = [self._clip_lr(rule, path) if a and g is not None
                         and g.size else -1.0 for rule, path, a, g in zip(
                             group.rules, group.paths, adapt, grads)]
            jobs.append((group, grads, clips))
        others = []
        for param, rule, path, adapt in plan.others:
            g = param.grad
            if g is not None and g.size:
                if self.clip and adapt:
                    self._clip_lr(rule, path)
                others.append((param, rule, path))

        self._observed = {}
        for param, rule, path in others:
            if param.dtype == numpy.float16:
                self._delegate(rule).arm(optimizer, path)
        settings = self._settings()
        for group, grads, clips in jobs:
            self._fill(group, settings, clips,
                       list(map(engine.LOSS_SCALE, group.params)))
            for k in engine.run(group, grads, L.RESCALE):
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
        grouper = engine.Grouper()
        for param in params:
            rule = param.update_rule
            w = param.array
            if rule is None or not rule.enabled or w is None:
                # Chainer's optimizers skip a parameter without an update
                # rule (a link added after setup()) or with a disabled one.
                continue
            path = paths[id(param)]
            if (w.dtype == numpy.float16
                    or engine.executor_for(param.device) is None):
                # float16: rescaled inside its rule, after the loss scale
                # is divided out (_RuleDelegate); ChainerX: one at a time.
                plan.others.append((param, rule, path,
                                    self._rules.lookup(path)[1]))
            else:
                grouper.add(None if self._multi_tensor else path,
                            param.device, path, param, rule, w)
        plan.groups = grouper.groups()
        for group in plan.groups:
            flags = numpy.array([self._rules.lookup(p) for p in group.paths],
                                dtype=numpy.float64).reshape(-1, 2)
            group.static = (flags[:, 0], flags[:, 1])
        return plan

    def _unsupported(self, path, w, g):
        if g is not None:
            raise TypeError(
                'GradientLARS rescales float16, float32 and float64 '
                "gradients of their weight's dtype on GPU; {} has a "
                '{} weight and a {} gradient'.format(path, w.dtype, g.dtype))

    def _delegate(self, rule):
        """This hook's delegate on ``rule``, registered on first use; looked
        up on the rule (Chainer 7.8.1 keeps its hooks in ``_hookable``), so
        that a copied optimizer finds the copied delegate."""
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
        """Rescales one parameter's gradient in place, through a group of
        one; ``loss_scale`` is the factor by which the stored gradient still
        exceeds the true one (the result keeps it)."""
        w = param.array
        g = None if w is None else param.grad
        if g is None or g.size == 0:
            return
        uses_wd, adapt = self._rules.lookup(path)
        clip_lr = self._clip_lr(rule, path) if adapt and self.clip else -1.0
        device = param.device
        if device.xp is chainer.backend.chainerx:
            # As Chainer's update rules do: the NumPy or CuPy arrays that
            # share a ChainerX array's memory.
            w, g = chainer.backend.from_chx(w), chainer.backend.from_chx(g)
            device = chainer.backend.get_device_from_array(w)
        if len(self._singles) > 4096:
            self._singles.clear()
        key = id(param)
        cached = self._singles.get(key, (None, None))[1]
        group = engine.group_of_one(cached, device, path, w)
        group.static = (uses_wd, adapt)
        self._singles[key] = (param, group)
        self._fill(group, self._settings(), clip_lr, [loss_scale])
        if engine.run(group, [g], L.RESCALE):
            self._unsupported(path, w, g)
        self._observed[path] = group

    def observe(self):
        """The ratios and norms of the last update, per parameter path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` as floats, ``g`` the
            unscaled gradient before rescaling, the ratio the update
            applied. On a GPU this is one transfer per group: call it at an
            interval, not on every iteration.

        """
        result = {}
        for group in self._observed.values():
            result.update(engine.observe(group))
        return result


def _enabled(rules):
    return [rule is not None and rule.enabled for rule in rules]
