"""What :class:`~chainer_lars.LARS` and :class:`~chainer_lars.LAMB` share."""

import functools
import operator
import warnings

import numpy

import chainer
from chainer import optimizer

from chainer_lars import checks
from chainer_lars import engine
from chainer_lars import exclusions
from chainer_lars import layout as L


# Chainer's loss scaling (left out of its snapshots), with its defaults.
_LOSS_SCALING = (('_loss_scale', None), ('_loss_scale_max', 65504.0),
                 ('_loss_scaling_is_dynamic', False),
                 ('_loss_scaling_multiplier', None),
                 ('_loss_scaling_isnan_ever', False))


def serialize_loss_scaling(optimizer, serializer):
    """Saves or loads the loss-scaling state (``None`` as NaN): all or none;
    a snapshot without a scale leaves one set up (float32 to mixed16)."""
    values = []
    for name, default in _LOSS_SCALING:
        value = getattr(optimizer, name, default)
        try:
            values.append(serializer(name[1:], numpy.nan if value is None
                                     else float(value)))
        except KeyError:
            if values:  # a snapshot with some of them is damaged
                raise
            return
    if isinstance(serializer, chainer.serializer.Deserializer) and not (
            numpy.isnan(values[0]) and optimizer._loss_scale is not None):
        values = list(map(float, values))  # all read before any is set
        for (name, default), value in zip(_LOSS_SCALING, values):
            if not (value in (0, 1) if isinstance(default, bool) else 0 <
                    value < numpy.inf or name == '_loss_scale_max' and value
                    > 0 or default is None and value != value):  # max: inf too
                raise ValueError('{}: the snapshot holds {} = {}: not a loss '
                                 'scaling setting'.format(type(
                                     optimizer).__name__, name[1:], value))
        for (name, default), value in zip(_LOSS_SCALING, values):
            setattr(optimizer, name, None if numpy.isnan(value) else
                    bool(value) if isinstance(default, bool) else value)


def read(serializer, key, value=None, missing=None):
    """``serializer(key, value)``, or ``missing`` where ``key`` is absent."""
    try:
        return serializer(key, value)
    except KeyError:
        return missing


def serialize_master(rule, serializer, device=None):
    """Saves or loads ``rule``'s float32 master copy, if any (a new one
    sent to ``device``, where the rule uses one: ``use_fp32_update()``)."""
    if isinstance(serializer, chainer.serializer.Serializer):
        if getattr(rule._fp32_param, 'array', None) is not None:  # a copy
            serializer('fp32_param', rule._fp32_param.array)
        return
    value = read(serializer, 'fp32_param')  # (strict=False: None too)
    if value is None or rule._use_fp32_update:  # None: made anew
        rule._fp32_param = None if value is None else chainer.Parameter(
            value if device is None else device.send(value))


def drop_masters(params, keep=(numpy.float16,)):
    """Drops the master copies but of weights of the ``keep`` dtypes (a
    float32's: unused, not to be saved); an uninitialized one's is unknown."""
    for p in params:
        if p.raw_array is not None and getattr(p, 'update_rule', None) and (
                p.dtype not in keep):
            p.update_rule._fp32_param = None


def master(param, rule):
    """A float16 parameter's float32 master (made, on its device), or None."""
    copy = getattr(rule, '_fp32_param', None)
    made = (rule._use_fp32_update and param.dtype == numpy.float16
            and copy is not None and copy.array is not None
            and copy.device == param.device)
    return copy.array if made else None


def masters(rules):
    """Each rule's master copy's array or ``None``, at C speed (per update)."""
    try:
        return [d[0] for d in map(_MASTER_DATA, rules)]
    except (AttributeError, TypeError):
        return [getattr(getattr(r, '_fp32_param', None), 'raw_array', None)
                for r in rules]


def warn_rounded(face, paths, stacklevel):
    """The warning of float16 weights whose step rounded away."""
    warnings.warn('{}: the step of {} rounded away in float16 for most of '
                  'its elements (the weights did not change): call '
                  'optimizer.use_fp32_update() to step float32 master '
                  'copies of float16 parameters'.format(face, ', '.join(
                      paths)), RuntimeWarning, stacklevel=stacklevel)


class _RefusesGradientLARS(object):

    adapts_rates = True  # GradientLARS refuses to run on us

    def add_hook(self, hook, name=None, timing='auto'):
        """Chainer's; a ``GradientLARS`` (ours or Chainer's) is refused."""
        if getattr(hook, 'adapts_gradients', False) or isinstance(
                hook, chainer.optimizer_hooks.GradientLARS):  # Chainer's
            checks.double_adaptation(self._face)
        super(_RefusesGradientLARS, self).add_hook(hook, name, timing)


class FusedRule(_RefusesGradientLARS, optimizer.UpdateRule):

    """What the faces' rules share: flags, ``STATES``, master copies in
    snapshots, the engine's ``OP`` on a plan of one array. A face's rule has
    ``_DEFAULTS``, ``_VALUES``, ``_STEPPED``, ``_fill_rows`` (rows, values,
    steps, uses_wd, paths, dtype); ``_lost``: rounded paths."""

    is_elementwise = True  # a layout permutes elements: no norm changes
    _lost = _own_checked = None
    _fits = staticmethod(lambda hyperparam: True)  # in every dtype
    uses_weight_decay = checks.CheckedAttribute(checks.boolean)
    uses_adaptation = checks.CheckedAttribute(checks.boolean)

    def __init__(self, parent_hyperparam=None, *, uses_weight_decay=True,
                 uses_adaptation=True, **hyperparams):
        super(FusedRule, self).__init__(parent_hyperparam or self._DEFAULTS)
        self.uses_weight_decay = uses_weight_decay
        self.uses_adaptation = uses_adaptation
        checks.unexpected(type(self).__name__, [n for n in hyperparams if (
            n.startswith('_') or n not in vars(self._DEFAULTS))], {})
        for name in [n for n, v in hyperparams.items() if v is not None]:
            setattr(self.hyperparam, name, hyperparams[name])  # as Chainer's
        self._plan, self._observed, self._path = None, False, None

    def __getstate__(self):
        state = dict(self.__dict__, _plan=None, _observed=False)
        state.pop('_group', None)  # a pickle of 0.2.0's
        return state

    def init_state(self, param):
        with chainer.using_device(param.device):
            for key in self.STATES:
                self.state[key] = param.device.xp.zeros_like(param.array)

    def serialize(self, serializer):
        """Serializes the state and the float32 master copy."""
        t = read(serializer, 't') if isinstance(
            serializer, chainer.serializer.Deserializer) else None
        if t is not None:  # a damaged one's: LAMB's steps would be NaN
            checks.count("the snapshot's t of " + (self._path or 'the rule'),
                         numpy.asarray(t).item())
        super(FusedRule, self).serialize(serializer)
        serialize_master(self, serializer)

    def update(self, param):
        master = self._fp32_param
        if (master is not None and master.array is not None
                and master.device != param.device):
            master.to_device(param.device)  # loaded from a snapshot
            master.initializer = None  # (Chainer's: the array it was made of)
        super(FusedRule, self).update(param)

    # ChainerX: UpdateRule's default path passes NumPy or CuPy views here.
    def update_core_cpu(self, param):
        w, g = param.array, param.grad
        if g is None or w is None:  # (untouched, as an uninitialized one)
            return
        states = list(map(self.state.__getitem__, self.STATES))
        plan = getattr(self, '_plan', None)
        if plan is None or not engine.same([w] + states, plan.others):
            path = self._path or param.name or 'an unnamed parameter'
            plan = engine.Plan([w] + states)  # kept once its checks pass
            plan.add(None, param.device, self.OP, path, None, self, w, states)
            self._plan, plan.others = plan.finish(), [w] + states
        group, = plan.groups
        # Only the parent's values: read directly (3 us of 10 per array).
        own = self.hyperparam.__dict__
        values = (self._VALUES(own['_parent']) if len(own) == 1
                  and '_parent' in own else self._VALUES(self.hyperparam))
        engine.settings(group, (values, [None], [self.t] if self._STEPPED
                                else None, self.uses_weight_decay,
                                self.uses_adaptation), self._fill_group)
        if plan.record is None or not plan.record.update([g]):
            engine.update(plan, [[g]])
        self._observed = True
        if self._lost is not None and w.dtype.char == 'e':  # float16
            self._lost += engine.rounded_away(group)

    update_core_gpu = update_core_cpu

    @classmethod
    def _fill_group(cls, group, key):
        """Fills rows from ``(values, loss scales, steps[, flags])``."""
        if len(key) > 3:
            group.uses_wd[:], group.adapt[:] = key[3:]
        group.rows[:, L.LOSS_SCALE] = [1.0 if s is None else s for s in key[1]]
        group.rows[:, L.ADAPT] = group.adapt
        cls._fill_rows(group.rows, key[0], key[2], group.uses_wd, group.paths,
                       group.dtype)


def _equal(a, b):
    """``a == b``; ``False`` where it is ambiguous (its check names it)."""
    try:
        return a == b
    except ValueError:
        return False


_RULE_FLAGS = operator.attrgetter('enabled', 'uses_weight_decay',
                                  'uses_adaptation', '_use_fp32_update')
_HYPER_OWN = operator.attrgetter('hyperparam.__dict__')
_MASTER_DATA = operator.attrgetter('_fp32_param._data')
_DATA = operator.attrgetter('_data')
# Rules keep their hooks in dicts changed in place: their lengths count.
_HOOKS = (operator.attrgetter('_hookable._pre_update_hooks'),
          operator.attrgetter('_hookable._post_update_hooks'))


def _batchable(param, rule, cls):
    """Whether the batched step does what ``param.update()`` would: a plain
    enabled ``cls`` without hooks, its state (and :func:`master`) made; a
    master's float16 weight writeable, it and its states plain float32."""
    return (type(rule) is cls and rule.enabled
            and not any(hooks(rule) for hooks in _HOOKS)
            and param.array is not None and rule.state is not None
            and engine.executor_for(param.device) is not None
            and ((copy := master(param, rule)) is not None
                 and getattr(param.array.flags, 'writeable', True)
                 and checks.direct(numpy.float32, [copy, *rule.state.values()])
                 or not (rule._use_fp32_update
                         and param.dtype == numpy.float16)))


def _check_unbatched(param):
    """The per-rule path's checks, before the batched groups move (a
    float16 weight's: of the master its rule steps, or on a GPU makes)."""
    rule, w, g = param.update_rule, param.array, param.grad
    if not (isinstance(rule, FusedRule) and rule.enabled and w is not None
            and g is not None):
        return
    copy, gpu = master(param, rule), param.device.xp is not numpy
    if copy is None and rule._use_fp32_update and w.dtype == numpy.float16:
        if not (gpu and rule.state):
            return  # the rule makes its master now, and states if it has none
        copy = numpy.empty(w.shape, numpy.float32)  # as the master will be
    if copy is not None and copy.dtype != numpy.float32:  # as Chainer
        raise TypeError('{}: the master copy is {}, not float32'.format(
            rule._path or param.name, copy.dtype))
    names = L.STATE_NAMES[rule.OP]
    written = ('weight',) + names + (('gradient',) if copy is None and (
        param._loss_scale is not None) else ())  # (the rule divides g)
    checks.addressed(
        rule._path or param.name, w if copy is None else copy, g,
        tuple(map(rule.state.__getitem__, rule.STATES)) if rule.state else (),
        written, gpu, names=names, gdtype=None if copy is None else g.dtype)


def _depends(states, mixed16, reassigned, params):
    """What an optimizer's plan is made from: parameters, rules, arrays (of
    the ``reassigned``: masters), ``states``, ``mixed16`` masters; flags."""
    rules = list(map(engine.UPDATE_RULE, params))
    objects = [params, rules, [d[0] for d in map(_DATA, params)]]
    for k, copy in zip(reassigned, masters([rules[k] for k in reassigned])):
        objects[2][k] = copy  # per rule: Chainer's fp32 update assigns w anew
    try:  # at C speed: a plan compares these at every update
        dicts = list(map(operator.attrgetter('_state'), rules))
        objects += [list(map(dict.get, dicts, [key] * len(dicts)))
                    for key in states]
        values = [list(map(_RULE_FLAGS, rules))] + [
            list(map(len, map(hooks, rules))) for hooks in _HOOKS]
    except (AttributeError, TypeError):  # no rule or state, not Fused
        dicts = [getattr(r, '_state', None) or {} for r in rules]
        objects += [[d.get(key) for d in dicts] for key in states]
        values = [[None if r is None else (_RULE_FLAGS(r) if isinstance(
            r, FusedRule) else ()) + tuple(len(h(r)) for h in _HOOKS)
            for r in rules]]
    objects.append(masters([rules[k] for k in mixed16]))
    return objects, values


class FusedMethod(_RefusesGradientLARS, exclusions.ExclusionProperties,
                  optimizer.GradientMethod):

    """What the faces share: ``update`` (a fork of Chainer's), plans,
    exclusions, snapshots, ``observe``; a face names ``_rule``, ``_face``."""

    _stepped, _warned, _checked, _placed = True, False, None, True
    check_nan_in_grads = engine.raw_arrays(  # Chainer's, reading layouts
        optimizer.GradientMethod.check_nan_in_grads)

    def __init__(self, multi_tensor, exclude_from_weight_decay,
                 exclude_from_layer_adaptation):
        super(FusedMethod, self).__init__()
        self._rules = exclusions.ExclusionRules(
            exclude_from_weight_decay, exclude_from_layer_adaptation)
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        self._plans, self._lost = engine.PlanCache(), []

    def create_update_rule(self):
        rule = self._rule(self.hyperparam)
        rule._lost, rule._path, self._placed = self._lost, '', False
        return rule

    def setup(self, link):
        super(FusedMethod, self).setup(link)
        self._place()
        return self

    def _place(self):
        """Path and flags (only cleared) of :meth:`create_update_rule`'s."""
        last = {id(p): (path, p) for path, p in self.target.namedparams()}
        for path, param in last.values():  # a tied one's: its last path
            rule = param.update_rule
            if isinstance(rule, self._rule) and rule._path == '':  # (made)
                rule._path, (wd, adapt) = path, self._rules.lookup(path)
                rule.uses_weight_decay &= wd
                rule.uses_adaptation &= adapt
        self._placed = True

    def serialize(self, serializer):
        """Chainer's and the loss scaling it leaves out; before any is loaded,
        refuses another class's states or none (strict) if no array has its."""
        found = []  # enabled rules' arrays with a t, or another class's v
        for path, p in self.target.namedparams() if isinstance(
                serializer, chainer.serializer.Deserializer) else ():
            ours = isinstance(p.update_rule, self._rule)
            held = [k for k in 'mv' if ours
                    and read(serializer[path], k) is not None]
            if held == list(self._rule.STATES):
                break  # one array's states tell the class that saved them
            if 'v' in held or not held and ours and p.update_rule.enabled and (
                    read(serializer[path], 'v', None, KeyError) is KeyError
                    and read(serializer[path], 't') is not None):  # strict
                found.append((path, held))
        else:
            for path, held in found[:1]:
                raise ValueError('{}: the snapshot holds {} for {}, {}'.format(
                    self._face, ' and '.join(held) or 'no state', path,
                    'the state of {}: load it into the optimizer class '
                    'that saved it'.format('LAMB or Adam' if 'm' in held
                                           else 'LARS or MomentumSGD')
                    if held else "as SGD's, or any saved before its first "
                    'update: no {} to resume'.format(' and '.join(
                        self._rule.STATES))))
        serialize_loss_scaling(self, serializer)  # damaged: before t is set
        drop_masters(self.target.params())  # float32's: not saved
        super(FusedMethod, self).serialize(serializer)
        drop_masters(self.target.params())  # nor loaded

    def update(self, lossfun=None, *args, **kwds):
        """Updates the parameters, as :meth:`chainer.GradientMethod.update`
        does: with ``lossfun``, computes the loss of ``lossfun(*args,
        **kwds)`` and its gradients first; then the hooks, the step of
        every parameter, and the loss scale's update."""
        # Forked from Chainer 7.8.1 (docs/design.rst says what it reads).
        if self.target is None:
            raise RuntimeError(
                '{0} is not set up: call optimizer.setup(link) first, then '
                'update()'.format(type(self).__name__))
        if not self._placed:
            self._place()
        if not getattr(self._rules, '_warned', False):  # once, all the paths
            self._rules.warn_unmatched(self._face, dict(
                self.target.namedparams()), 2)
        own = vars(self.hyperparam)  # values set directly: checked on change,
        if not _equal(own, self._checked):  # before the hooks and t
            self._check_values(own, '')
            fits = self._rule._fits(self.hyperparam)  # else LAMB's eps is
            self._checked = dict(own) if fits else None  # checked each rule
        if not self._multi_tensor:
            self._check_rules(list(self.target.params()))
            super(FusedMethod, self).update(lossfun, *args, **kwds)
            self._stepped = self.is_safe_to_update()
            return self._warn_rounded([], 3)
        if lossfun is not None:  # the gradients kept if a rule's refused
            self._check_rules(list(self.target.params()))
            loss = lossfun(*args, **kwds)
            (self.target.cleargrads if getattr(self, '_use_cleargrads', True)
             else self.target.zerograds)()
            loss.backward(loss_scale=self._loss_scale)
            del loss
        params = list(self.target.params())
        self._check_rules(params)
        grads = self._reallocate(params)
        self._check_finite(params, grads)
        if self._hookable._pre_update_hooks:
            self.call_hooks('pre')
            params, grads = list(self.target.params()), None
        self.t += 1
        self._stepped = self.is_safe_to_update()
        self._reallocate(self._update_params(params, grads) if self._stepped
                         else params)  # the unbatched
        self.call_hooks('post')
        self.update_loss_scale()

    def _check_rules(self, params):
        """Rules' hyperparameter values, before the hooks and ``t``: their own
        once set; all, each time, where one may not fit a dtype (LAMB eps)."""
        every = self._checked is None  # (the optimizer's: see update())
        for p in params if self._rule._STEPPED else ():  # LAMB's: NaN steps
            r = p.update_rule
            if isinstance(r, self._rule) and r.enabled and (
                    not r.t >= 0 or r.t % 1):  # -1, 0.5, NaN
                checks.count('the step count t of ' + (r._path or p.name), r.t)
        try:  # at C speed: usually every rule reads its parent's alone
            if not every and sum(map(len, map(_HYPER_OWN, map(
                    engine.UPDATE_RULE, params)))) == len(params):
                return
        except (AttributeError, TypeError):  # no rule, or another kind
            pass
        for p, r in zip(params, map(engine.UPDATE_RULE, params)):
            own = vars(r.hyperparam) if isinstance(r, self._rule) else {}
            if own and r.enabled and p.raw_array is not None and (every or len(
                    own) > 1 and not _equal(r._own_checked, (own, p.dtype))):
                self._check_values(own, ' of ' + (r._path or p.name))
                r._fill_rows(L.rows(1), [r._VALUES(r.hyperparam)], [r.t + 1],
                             r.uses_weight_decay, [r._path or p.name], p.dtype)
                r._own_checked = (dict(own), p.dtype)

    @classmethod
    def _check_values(cls, own, of):
        """Checks the values set on a hyperparameter directly, by name."""
        for name, value in own.items():
            check = checks.find_check(cls, name)
            if check is not None:
                check(value, '{} hyperparameter {}{}'.format(
                    cls._face, name, of))

    def _check_finite(self, params, grads):
        """Chainer's ``check_nan_in_grads`` (its warnings); a copy a device."""
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
            for name in [names[id(params[k])] for k in sorted(bad)]:
                warnings.warn('Non finite number found in param.grad of {} '
                              '(iteration: {}, loss_scale: {})'.format(
                                  name, self.t, self._loss_scale))

    def reallocate_cleared_grads(self):
        """Chainer's, without building every parameter's path."""
        self._reallocate(list(self.target.params()))

    @staticmethod
    @engine.raw_arrays
    def _reallocate(params):
        """Zero gradients where ``params`` have none; every gradient."""
        grads = list(map(engine.GRAD, params))
        for k in [k for k, g in enumerate(grads) if g is None]:
            param, device = params[k], params[k].device
            if param.raw_array is not None:
                with chainer.using_device(device):
                    param._set_grad(device.xp.zeros_like(param.raw_array),
                                    layout_check=False)
                grads[k] = param.grad
        return grads

    @engine.raw_arrays
    def _update_params(self, params, grads=None):
        """``param.update()`` of every parameter, batched; returns the rest."""
        plan, picks = self._plans.get(self, params, self._build_plan), []
        for group, where in zip(plan.groups, plan.where):
            engine.settings(group, self._key(group), self._rule._fill_group)
            picks.append(list(map(engine.GRAD, group.params)) if grads is None
                         else grads if len(where) == len(grads)
                         else list(map(grads.__getitem__, where)))
        for param in plan.others:
            _check_unbatched(param)
        unbatched = list(plan.others)
        for group, left in zip(plan.groups, engine.update(plan, picks)):
            for r in [r for k, r in enumerate(group.rules) if k not in left]:
                r.t += 1
            for k in left:
                group.params[k].update()
                unbatched.append(group.params[k])
        for param in plan.others:
            param.update()
        self._warn_rounded(plan.groups, 5)
        return unbatched

    def _warn_rounded(self, groups, stacklevel):
        """Warns, once, of float16 steps that mostly rounded away."""
        lost = [p for g in groups for p in engine.rounded_away(g)]
        lost += self.__dict__.get('_lost', ())
        if lost and not self._warned:
            self._warned = True
            warn_rounded(self._face, lost, stacklevel + 1)
        del self.__dict__.get('_lost', [])[:]

    def _key(self, group):
        """Values, loss scales and (stepped) steps of a group's rows."""
        rules, base, cls = group.rules, self.hyperparam, self._rule
        values = cls._VALUES(base)
        if list(map(_HYPER_OWN, rules)).count({'_parent': base}) != len(rules):
            values = [cls._VALUES(r.hyperparam) for r in rules]
        return (values, list(map(engine.LOSS_SCALE, group.params)),
                [r.t + 1 for r in rules] if cls._STEPPED else None)

    def _build_plan(self, params):
        for p in params:  # states loaded on the host: moved as Chainer's are
            if isinstance(p.update_rule, FusedRule) and p.update_rule.state:
                p.update_rule._init_states(p)
        paths = {id(param): path for path, param in self.target.namedparams()}
        batchable = [_batchable(p, p.update_rule, self._rule) and not tied
                     for p, tied in zip(params, engine.tied(params))]
        ruled = [not b and getattr(getattr(p.array, 'flags', None),
                                   'writeable', True)  # (else: batched next)
                 for p, b in zip(params, batchable)]
        plan = engine.Plan(params, functools.partial(
            _depends, self._rule.STATES, *([
                k for k, p in enumerate(params) if rows[k] and p.update_rule
                and master(p, p.update_rule) is not None]
                for rows in (batchable, ruled))))
        plan.others = [p for p, b in zip(params, batchable) if not b]
        for param in [p for p, b in zip(params, batchable) if b]:
            rule, path, w = param.update_rule, paths[id(param)], param.array
            copy = master(param, rule)
            weight, extra = (w, None) if copy is None else (copy, w)
            plan.add(None if self._multi_tensor else path, param.device,
                     self._rule.OP, path, param, rule, weight,
                     list(map(rule.state.__getitem__, rule.STATES)),
                     (rule.uses_weight_decay, rule.uses_adaptation), extra)
        for r in [r for g in plan.finish(params).groups for r in g.rules]:
            r._observed, r._plan = False, None  # the groups observe and hold
        return plan

    def observe(self):
        """``{path: (ratio, ||w||, ||g||)}`` (LAMB: ``||r||``) of the last
        update (``{}``: skipped), as floats, of adapted, enabled arrays (see
        :meth:`GradientLARS.observe <chainer_lars.GradientLARS.observe>`)."""
        if self.target is None:
            raise RuntimeError('{}.observe() reports the last update: call '
                               'optimizer.setup(link) and update() first'
                               .format(type(self).__name__))
        result = {}
        if not self._stepped:  # skipped: nothing was applied
            return result
        for path, param in self.target.namedparams():
            rule = getattr(param, 'update_rule', None)
            if (isinstance(rule, self._rule) and rule.enabled
                    and rule._observed and rule.uses_adaptation):
                result.update((path, row) for row in engine.observe(
                    rule._plan.groups[0].last).values())
        for group in [g for plan in self._plans.plans() for g in plan.groups]:
            result.update(engine.observe(group.last, group.adapt))
        return result
