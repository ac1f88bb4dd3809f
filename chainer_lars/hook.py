"""GradientLARS: the LARS pre-update hook, a face of the engine."""

import functools
import operator
import weakref

import numpy

import chainer

from chainer_lars import checks
from chainer_lars import engine
from chainer_lars import exclusions
from chainer_lars import fused
from chainer_lars import layout as L


class _RuleDelegate(object):

    """A GradientLARS in a float16 parameter's rule, armed for the next ``t``
    only: hands the rule the float32 gradient the batched pass rescaled
    (mixed16), or rescales it there once the rule has divided out the loss
    scale (``n`` times where listed ``n`` times; later updates take it)."""

    timing, _before, _armed = 'pre', None, None

    def __init__(self, hook):
        self.hook = weakref.ref(hook)  # the model holds us, not the hook

    def arm(self, hook, call, opt, path, grad=None):  # call: hook's pass
        n = 1 + (grad is None and self._armed is not None and self._armed[
            5] is call and self._armed[4])  # a listing more in the pass
        self._armed = (weakref.ref(opt), opt.t + 1, path, grad, n, call, hook)

    def __getstate__(self):  # a copy's calls the copy's hook, if copied
        return dict(self.__dict__, _armed=None, _before=None, hook=self.hook())

    def __setstate__(self, state):  # a hook not copied: a dead reference
        self.__dict__.update(state, hook=weakref.ref(state['hook'] or set()))

    def __call__(self, rule, param):
        armed, self._armed = self._armed, None  # arm()'s (optimizer, t, ...)
        if armed is None or getattr(armed[0](), 't', None) != armed[1]:
            return  # not armed, or its optimizer gone or moved on
        path, grad, n, _, hook = armed[2:]  # the hook held while armed only
        given = grad is not None and grad.dtype == param.dtype  # a master's
        if given:
            param.grad = grad
        for _ in range(0 if given else n):  # a listing each, as Chainer's
            hook._rescale(rule, param, path, 1.0)
        if n > 1 and param.dtype != numpy.float16:  # a master, made anew
            self._armed = armed[:3] + (param.grad, n - 1) + armed[5:]
        if given:
            return
        w, before, self._before = param.array, self._before, None
        if (isinstance(w, numpy.ndarray) and w.dtype == numpy.float16
                and not hook._warned):  # a copy kept until the warning
            self._before = (w.copy(), param.grad != 0)
            if before is not None and before[0].shape == w.shape and (
                    numpy.count_nonzero((before[0] == w) & before[1])
                    > w.size / 2):
                hook._warned, self._before = True, None
                fused.warn_rounded('GradientLARS', [path], 9)  # at update()


_DELEGATE_NAME = 'chainer_lars.GradientLARS'
_FLAGS = operator.attrgetter('enabled', '_use_fp32_update')


def _depends(mixed16, params):
    """What a plan of the hook's is made from: parameters, rules, flags,
    arrays (a ``mixed16`` row's master: Chainer makes its float16 anew)."""
    rules = list(map(engine.UPDATE_RULE, params))
    arrays = [d[0] for d in map(fused._DATA, params)]
    for k, copy in zip(mixed16, fused.masters([rules[k] for k in mixed16])):
        arrays[k] = copy
    flags = [None if r is None else _FLAGS(r) for r in rules]
    return [params, rules, arrays], flags


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
    optimizer's ``lr`` is the paper's :math:`\\gamma \\eta`: an adapted
    array moves by about ``lr`` times its own norm per update, so ``lr`` is
    small: start from ``MomentumSGD(lr=0.002)``. Arrays at or below
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
        multi_tensor (bool): As the argument, read only.

    """

    name, timing, call_for_each_param = 'GradientLARS', 'pre', False
    adapts_gradients = True  # LARS refuses us (checks.double_adaptation)
    _warned = False  # of a float16 step that rounded away

    threshold = checks.CheckedAttribute(minimum=0.0)
    weight_decay = checks.CheckedAttribute(minimum=0.0)
    eps = checks.CheckedAttribute(minimum=0.0)
    trust_coefficient = checks.CheckedAttribute(minimum=0.0, exclusive=True)
    clip = checks.CheckedAttribute(checks.boolean)
    _REPR = ('threshold', 'weight_decay', 'eps', 'trust_coefficient', 'clip')

    def __init__(self, threshold=1e-2, weight_decay=0.0, eps=1e-9, *,
                 trust_coefficient=1.0, clip=False,
                 exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=(), multi_tensor=True):
        if isinstance(threshold, (chainer.Optimizer, chainer.UpdateRule)):
            raise TypeError(
                'GradientLARS was registered as a class: register an instance,'
                ' add_hook(chainer_lars.GradientLARS()) with the parentheses')
        self._rules = exclusions.ExclusionRules(
            exclude_from_weight_decay, exclude_from_layer_adaptation)
        self.threshold, self.weight_decay, self.eps = (
            threshold, weight_decay, eps)
        self.trust_coefficient, self.clip = trust_coefficient, clip
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        # Plans by optimizer and by parameter (per-rule calls); observe()'s.
        self._plans, self._singles, self._seen = (
            engine.PlanCache(), engine.PlanCache(), {})

    def __getstate__(self):
        return dict(self.__dict__, _seen={})

    def __setstate__(self, state):
        state.pop('_observed', None)
        self.__dict__.update(state, _seen={}, _singles=engine.PlanCache())

    @engine.raw_arrays
    def __call__(self, owner, param=None):  # (optimizer) or (rule, param)
        hookable = getattr(owner, '_hookable', None)  # add_hook hides timing
        if self in getattr(hookable, '_post_update_hooks', {}).values():
            raise ValueError("GradientLARS rescales the gradients before the "
                             "update: register it with timing='pre' or 'auto' "
                             "(the default), not 'post'")
        if getattr(owner, 'adapts_rates', False):  # LARS, LAMB, rules
            checks.double_adaptation(owner._face)
        if param is None:
            return self._update_all(owner)
        self._rescale(owner, param, '/' + (param.name or ''), 1.0)

    def _key(self, clips, scales):
        return (self.weight_decay, self.eps, self.trust_coefficient,
                self.threshold, clips, scales)

    @staticmethod
    def _fill(group, key):
        rows = group.rows
        rows[:, L.WEIGHT_DECAY] = key[0] * group.uses_wd
        rows[:, L.EPS], rows[:, L.TRUST_COEFFICIENT] = key[1:3]
        rows[:, L.THRESHOLD], rows[:, L.CLIP_LR] = key[3:5]
        rows[:, L.ADAPT] = group.adapt
        rows[:, L.LOSS_SCALE] = [1.0 if s is None else s for s in key[5]]

    def _update_all(self, optimizer):
        target = getattr(optimizer, 'target', None)
        if target is None:
            raise TypeError(
                'GradientLARS must be registered on a set-up optimizer '
                '(optimizer.setup(link) first); got {!r}'.format(optimizer))
        if getattr(optimizer, '_loss_scaling_isnan', False):
            self._seen = {}
            return  # the update is skipped: nothing to rescale
        params = list(target.params())
        plan = self._plans.get(optimizer, params, self._build_plan, target)
        grads = []  # all checked before anything changes
        for group in plan.groups:
            g = list(map(engine.GRAD, group.params))
            clips = [self._clip_lr(rule, path) if a and x is not None
                     and x.size else -1.0 for rule, path, a, x in zip(
                         group.rules, group.paths, group.adapt, g)
                     ] if self.clip else -1.0
            engine.settings(group, self._key(clips, list(map(
                engine.LOSS_SCALE, group.params))), self._fill)
            grads.append(g)
        others = []
        for param, rule, path, adapt in plan.others:
            g = param.grad
            if g is not None and engine.executor_for(param.device):
                direct = not (rule._use_fp32_update and g.itemsize == 2)
                checks.addressed(  # (ChainerX's: in _rescale, converted)
                    path, param.array, g, (), ('gradient',) if direct else (),
                    direct and param.device.xp is not numpy)
            if g is not None and g.size:
                if self.clip and adapt:
                    self._clip_lr(rule, path)
                others.append((param, rule, path))
        hooks = list(optimizer._hookable._pre_update_hooks.items())
        mine = [k for k, (_, h) in enumerate(hooks) if h is self]
        if len(mine) > 1:  # float32 rescaled each time, float16 once
            raise ValueError(
                'GradientLARS: one instance is registered on the optimizer '
                'as {}: register it once'.format(' and '.join(
                    hooks[k][0] for k in mine)))
        later = [n for n, h in hooks[mine[0] + 1 if mine else len(hooks):]
                 if not isinstance(h, GradientLARS)]
        if later and (any(g.mixed16 for g in plan.groups) or any(
                p.dtype == numpy.float16 for p, _, _ in others)):
            raise ValueError(
                'GradientLARS rescales float16 gradients in their update '
                'rules, so the changes of the pre-update hooks registered '
                'after it ({}) would be lost or rescaled: register them '
                'before GradientLARS'.format(', '.join(later)))
        lefts, call = engine.update(plan, grads), object()
        live = {id(h) for _, h in hooks}  # registered: their delegates stay
        self._seen = dict(enumerate(group.last for group in plan.groups))
        for group, g, left in zip(plan.groups, grads, lefts):
            for k in range(len(group)) if group.mixed16 else ():
                if g[k] is not None:  # after another's: rescaled in the rule
                    delegate, after = self._delegate(group.rules[k], live)
                    delegate.arm(self, call, optimizer, group.paths[k], None
                                 if k in left or after else group.extras[k])
        for param, rule, path in others:
            if param.dtype == numpy.float16:
                self._delegate(rule, live)[0].arm(self, call, optimizer, path)
            else:  # ChainerX, tied
                self._rescale(rule, param, path, param._loss_scale)

    def _build_plan(self, target, params):
        paths = {id(param): path for path, param in target.namedparams()}
        tied = engine.tied(params)  # each in turn, as ChainerX arrays
        mixed16 = [k for k, param in enumerate(params)
                   if param.update_rule is not None and param.array is not None
                   and fused.master(param, param.update_rule) is not None
                   and engine.executor_for(param.device) is not None]
        plan = engine.Plan(params, functools.partial(_depends, mixed16))
        for k, param in enumerate(params):
            rule, w = param.update_rule, param.array
            if rule is None or not rule.enabled or w is None:
                continue  # as Chainer's optimizers do
            path = paths[id(param)]
            flags, weight, out = self._rules.lookup(path), w, None
            if k in mixed16 and not tied[k]:  # its master's, written to out
                weight = fused.master(param, rule)
                with chainer.using_device(param.device):
                    out = param.device.xp.empty_like(weight)
            elif (w.dtype == numpy.float16  # in its rule (_RuleDelegate)
                    or tied[k] or engine.executor_for(param.device) is None):
                plan.others.append((param, rule, path, flags[1]))
                continue
            plan.add(None if self._multi_tensor else path, param.device,
                     L.RESCALE, path, param, rule, weight, (), flags, out)
        self._rules.warn_unmatched('GradientLARS', list(paths.values()), 12)
        return plan.finish(params)

    def _delegate(self, rule, live):
        """This hook's delegate on ``rule`` and whether another's is armed;
        the spent ones of hooks not ``live`` (registered) are removed."""
        hooks, mine, after = rule._hookable._pre_update_hooks, None, False
        first = next(iter(hooks.values())) if len(hooks) == 1 else None
        if isinstance(first, _RuleDelegate) and first.hook() is self:
            return first, False  # alone, in its place
        for name, h in list(hooks.items()):
            if isinstance(h, _RuleDelegate) and h.hook() is self:
                mine, own = h, name
            elif isinstance(h, _RuleDelegate) and h._armed is not None:
                after = True
            elif isinstance(h, _RuleDelegate) and id(h.hook()) not in live:
                rule.remove_hook(name)
        if mine is None:
            own, n = _DELEGATE_NAME, 1
            while own in hooks or own in rule._hookable._post_update_hooks:
                n, own = n + 1, '{}#{}'.format(_DELEGATE_NAME, n + 1)
            mine = _RuleDelegate(self)
            rule.add_hook(mine, name=own, timing='pre')
        # In the hooks' order of running, before the rule's own (Chainer's).
        for name in [own] + [n for n, h in hooks.items()
                             if not isinstance(h, _RuleDelegate)]:
            hooks.move_to_end(name)
        return mine, after

    def _clip_lr(self, rule, path):
        lr = getattr(getattr(rule, 'hyperparam', None), 'lr', None)
        if lr is None:
            raise TypeError(
                'GradientLARS(clip=True) divides the ratio by the update '
                "rule's learning rate, but the rule of {} ({}) has no "
                "hyperparameter 'lr'".format(path, type(rule).__name__))
        return checks.real('lr of ' + path, lr, minimum=0.0)

    def _rescale(self, rule, param, path, loss_scale):
        """Rescales one gradient in place (``loss_scale`` still in it)."""
        w = param.array
        g = None if w is None else param.grad
        if g is None or (g.size == 0 and w.size == 0):
            return
        device = param.device
        if device.xp is chainer.backend.chainerx:  # as Chainer's rules do
            w, g = chainer.backend.from_chx(w), chainer.backend.from_chx(g)
            device = chainer.backend.get_device_from_array(w)
        plan = self._singles.get(param, [w], self._plan_of_one, device, path)
        group, = plan.groups
        clip_lr = self._clip_lr(rule, path) if (
            group.adapt[0] and self.clip) else -1.0
        engine.settings(group, self._key(clip_lr, [loss_scale]), self._fill)
        if plan.record is None or not plan.record.update([g]):
            engine.update(plan, [[g]])
        self._seen[path] = group.last

    def _plan_of_one(self, device, path, arrays):
        plan = engine.Plan(arrays)
        plan.add(None, device, L.RESCALE, path, None, None, arrays[0], (),
                 self._rules.lookup(path))
        return plan.finish()

    def observe(self):
        """The ratios and norms (floats) of the last update, per path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` (``{}`` if skipped),
            ``g`` the unscaled gradient before rescaling. On a GPU, one
            transfer per group: call it at an interval, not every iteration.
        """
        return {path: row for last in self._seen.values()
                for path, row in engine.observe(last).items()}
