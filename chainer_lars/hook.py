"""GradientLARS: the LARS pre-update hook."""

import collections
import math
import weakref

import numpy

import chainer
from chainer.backends import cuda

from chainer_lars import checks
from chainer_lars import exclusions
from chainer_lars import kernels
from chainer_lars import multi_tensor as _mt
from chainer_lars import observations as _observations
from chainer_lars import ratio


def _cuda_kernels():
    # Imported on first use: the module needs CuPy.
    from chainer_lars import cuda_kernels
    return cuda_kernels


_UNSET = object()


class _Batch(object):

    """A multi-tensor group of the hook, with its settings table."""

    __slots__ = ('group', 'hyper', 'uses_wd', 'adapt', '_inputs')

    def __init__(self, group, uses_wd, adapt):
        self.group = group
        self.hyper = numpy.zeros((len(group), _mt.HOOK_COLUMNS))
        self.hyper[:, _mt.HOOK_ADAPT] = adapt
        self.uses_wd = numpy.array(uses_wd, dtype=numpy.float64)
        self.adapt = adapt
        self._inputs = (_UNSET, _UNSET, _UNSET)

    def settings(self, weight_decay, scales, clips):
        """The settings table for this update.

        Columns are rewritten only when their inputs changed: converting
        the lists costs more than comparing them, and they rarely change.

        """
        hyper = self.hyper
        last_wd, last_scales, last_clips = self._inputs
        if weight_decay != last_wd:
            hyper[:, _mt.HOOK_WEIGHT_DECAY] = weight_decay * self.uses_wd
        if scales != last_scales:
            hyper[:, _mt.HOOK_LOSS_SCALE] = [
                1.0 if scale is None else scale for scale in scales]
        if clips != last_clips:
            hyper[:, _mt.HOOK_CLIP_LR] = -1.0 if clips is None else [
                -1.0 if clip_lr is None else clip_lr for clip_lr in clips]
        self._inputs = (weight_decay, scales, clips)
        return hyper


class _Plan(object):

    """How the hook visits the parameters while the model's structure holds.

    Built from the target's parameters; :meth:`matches` tells whether they
    are still the same objects, with the same update rules, ``enabled``
    flags and arrays (compared by identity, each list in one go).

    Attributes:
        batches (list of _Batch): The multi-tensor groups.
        float16 (list): ``(param, rule, path, adapt)`` of the float16
            parameters, rescaled inside their rules by a delegate.
        cupy (list): ``(param, rule, path, uses_wd, adapt)`` of the CuPy
            parameters that the CUDA kernels batch per update.
        singles (list): ``(param, rule, path, uses_wd, adapt)`` of the
            rest, the per-array path.

    """

    __slots__ = ('_objects', '_ids', '_disabled', 'batches', 'float16',
                 'cupy', 'singles')

    def __init__(self, params, batches, float16, cupy, singles):
        rules = list(map(_mt.UPDATE_RULE, params))
        arrays = list(map(_mt.ARRAY, params))
        # Holding the objects keeps their ids from being reused.
        self._objects = (params, rules, arrays)
        self._ids = _ids(params, rules, arrays)
        self._disabled = _disabled(rules)
        self.batches = batches
        self.float16 = float16
        self.cupy = cupy
        self.singles = singles

    def matches(self, params):
        rules = list(map(_mt.UPDATE_RULE, params))
        return (self._ids == _ids(params, rules, map(_mt.ARRAY, params))
                and self._disabled == _disabled(rules))


def _ids(*lists):
    return [list(map(id, objects)) for objects in lists]


def _disabled(rules):
    return [rule is not None and not rule.enabled for rule in rules]


class _RuleDelegate(object):

    """Runs a GradientLARS on one float16 parameter inside its update rule.

    The optimizer calls its hooks before the update rule divides the
    gradient by the loss scale and before it makes the float32 master copy
    (``use_fp32_update()``). For float32 and float64 gradients the hook
    folds the loss scale into its arithmetic; a float16 gradient cannot hold
    the rescaled result multiplied by the loss scale without overflowing, so
    it is rescaled here instead, after the rule has unscaled it and on the
    master copy when there is one.

    The hook arms the delegate for one update of one optimizer: the update
    whose ``t`` follows the optimizer's ``t`` at the hook's call (Chainer's
    optimizers call their pre-update hooks, then increment ``t``, then
    update each parameter). A delegate called in any other update does
    nothing, so an update that never reached the rule (dynamic loss scaling
    skipped it) leaves nothing behind: once the hook is removed from the
    optimizer, no further gradient is rescaled.

    The delegate holds its hook, so that a copy or an unpickled optimizer
    holds delegates of the copied hook. Arming is not copied.

    Args:
        hook (GradientLARS): The hook to run.

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

    A pre-update hook that rescales each parameter's gradient in place. See
    `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_ and, for ``threshold`` and ``eps``,
    `Convergence Analysis of Gradient Descent Algorithms with Proportional
    Updates <https://arxiv.org/abs/1801.03137>`_.

    For each parameter array :math:`w` with gradient :math:`g`,

    .. math::

        r &= \\eta \\frac{\\|w\\|}{\\epsilon + \\|g\\| + \\lambda \\|w\\|}
             \\quad \\text{if } \\|w\\| > \\tau, \\quad 1 \\text{ otherwise},
             \\\\
        g &\\leftarrow r (g + \\lambda w),

    with :math:`\\lambda` the weight decay, :math:`\\eta` the trust
    coefficient and :math:`\\tau` the threshold. The optimizer (usually
    :class:`~chainer.optimizers.MomentumSGD`) then applies ``g`` with its own
    learning rate, which plays the part of the paper's global rate; with
    the default ``trust_coefficient=1`` that rate is small (about 1e-2 to
    1e-1), as with Chainer's own hook.

    With default arguments this is a drop-in replacement for
    :class:`chainer.optimizer_hooks.GradientLARS`, and unlike it, it is
    correct under ``optimizer.loss_scaling()`` (the result equals the
    unscaled run), takes norms of float16 arrays in float32 (and of the
    float32 master copy under ``use_fp32_update()``), runs a fused CUDA
    kernel on GPU with the ratio kept on the device, and offers the trust
    coefficient, LARC clipping and exclusion lists.

    **How it is called.** Registered with ``optimizer.add_hook(hook)``, it is
    called once per update with the optimizer (``call_for_each_param`` is
    ``False``) and visits every parameter itself, which gives it each
    parameter's path for the exclusion lists. It can also be registered on
    a single update rule (``param.update_rule.add_hook(hook)``); it then
    runs after the rule has unscaled the gradient, but sees only the
    parameter, not its path, so the exclusion patterns are searched in
    ``'/' + param.name`` (``'/b'``, ``'/gamma'``) there.

    Float16 gradients are rescaled inside their update rules, by a small
    delegate the hook registers on each such rule; a call of the hook
    rescales them in the optimizer update that follows it, and in no other,
    so that once the hook is removed nothing more is rescaled, even after
    an update that dynamic loss scaling skipped.

    The hook, and an optimizer that holds it, can be pickled and deep
    copied, also after float16 updates; the copy continues exactly like the
    original. What :meth:`observe` reports is not copied: a copy reports
    nothing until its first update.

    Args:
        threshold (float): The ratio is applied only to arrays with
            ``||w|| > threshold``; smaller ones (zero-initialised biases,
            BatchNorm beta) keep ``r = 1``.
        weight_decay (float): The weight decay :math:`\\lambda`, added to the
            gradient and to the ratio's denominator.
        eps (float): Added to the denominator for numerical stability.
        trust_coefficient (float): The paper's :math:`\\eta`, a factor on
            the ratio.
        clip (bool): LARC clipping: the effective step is
            ``min(r * lr, lr)``, i.e. the ratio is divided by the update
            rule's ``lr`` and capped at 1. Needs an update rule that has a
            hyperparameter ``lr``.
        exclude_from_weight_decay (list of str): Regular expressions; a
            parameter whose path (as :meth:`chainer.Link.namedparams`
            spells it, e.g. ``'/predictor/conv1/b'``) matches one
            (:func:`re.search`) gets no weight decay, in the gradient nor in
            the denominator, but is still adapted.
        exclude_from_layer_adaptation (list of str): Regular expressions; a
            matching parameter gets ``r = 1`` but keeps its weight decay.
        multi_tensor (bool): Called with the optimizer, rescale all the
            float32 (or float64) arrays of one device together: on CPU in
            one compiled call per update and dtype (see
            :mod:`chainer_lars.multi_tensor`), with the per-array path's
            result bit for bit; on GPU in two kernel launches per update,
            instead of two per array. ``False`` keeps the per-array passes.

    Attributes:
        ~GradientLARS.threshold (float): See above.
        ~GradientLARS.weight_decay (float): See above.
        ~GradientLARS.eps (float): See above.
        ~GradientLARS.trust_coefficient (float): See above.
        ~GradientLARS.clip (bool): See above.
        ~GradientLARS.timing (str): ``'pre'``.
        ~GradientLARS.call_for_each_param (bool): ``False``: called once per
            update with the optimizer.

    """

    name = 'GradientLARS'
    call_for_each_param = False
    timing = 'pre'

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
        self._observations = {}
        self._observed_tables = []
        self._plans = _mt.PlanCache()
        self._multi_tensor = checks.boolean('multi_tensor', multi_tensor)
        self._tables = None

    threshold = checks.CheckedAttribute(checks.real, minimum=0.0)
    weight_decay = checks.CheckedAttribute(checks.real, minimum=0.0)
    eps = checks.CheckedAttribute(checks.real, minimum=0.0)
    trust_coefficient = checks.CheckedAttribute(
        checks.real, minimum=0.0, exclusive=True)
    clip = checks.CheckedAttribute(checks.boolean)

    def __getstate__(self):
        # The observations are those of the last update made by this object,
        # and the GPU tables hold device memory: a copy or an unpickled hook
        # starts without both, and makes them as it needs them.
        state = self.__dict__.copy()
        state['_observations'] = {}
        state['_observed_tables'] = []
        state['_tables'] = None
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
        clip = self._clip
        batched = []
        for batch in plan.batches:
            group = batch.group
            grads = list(map(_mt.GRAD, group.params))
            scales = list(map(_mt.LOSS_SCALE, group.params))
            clips = None
            if clip:
                clips = [
                    self._clip_lr(rule, path) if adapt and g is not None
                    and g.size else None
                    for rule, path, adapt, g in zip(
                        group.rules, group.paths, batch.adapt, grads)]
            batched.append((batch, grads, scales, clips))
        delegates = []
        for param, rule, path, adapt in plan.float16:
            g = param.grad
            if g is not None and g.size:
                if clip and adapt:
                    self._clip_lr(rule, path)
                delegates.append((rule, path))
        singles = []
        for param, rule, path, uses_wd, adapt in plan.singles:
            job = self._job(param, rule, path, uses_wd, adapt)
            if job is not None:
                singles.append(job)
        cupy_batches = collections.OrderedDict()
        for param, rule, path, uses_wd, adapt in plan.cupy:
            job = self._job(param, rule, path, uses_wd, adapt)
            if job is None:
                continue
            w, g = param.array, param.grad
            if not _cuda_kernels().supports(w, g):
                singles.append(job)
                continue
            _, _, loss_scale, _, _, clip_lr = job
            key = (param.device.name, g.dtype, loss_scale, clip_lr)
            if not self._multi_tensor:
                key += (path,)
            cupy_batches.setdefault(key, (param.device, []))[1].append(
                (path, w, g, uses_wd, adapt))

        self._observations.clear()
        self._observed_tables = []
        for rule, path in delegates:
            self._delegate(rule).arm(optimizer, path)
        form = self._form()
        for batch, grads, scales, clips in batched:
            group = batch.group
            hyper = batch.settings(self._weight_decay, scales, clips)
            rejected = group.executor.hook_rescale(
                group, grads, hyper, form, self._eps,
                self._trust_coefficient)
            for k in rejected:
                # A gradient the executor cannot take (another dtype or
                # layout this time) takes the per-array path.
                if grads[k] is not None and grads[k].size:
                    singles.append((
                        group.params[k], group.paths[k],
                        float(hyper[k, _mt.HOOK_LOSS_SCALE]),
                        bool(batch.uses_wd[k]), batch.adapt[k],
                        None if clips is None else clips[k]))
            # Read in observe(): on a GPU, that is a transfer.
            self._observed_tables.append(group)
        for key, (device, items) in cupy_batches.items():
            self._rescale_on_device(device, items, key[2], key[3])
        for job in singles:
            self._rescale_with(*job)

    def _job(self, param, rule, path, uses_wd, adapt):
        """The arguments of :meth:`_rescale_with`, or ``None`` (no grad)."""
        g = param.grad
        if g is None or g.size == 0:
            return None
        clip_lr = self._clip_lr(rule, path) if adapt else None
        loss_scale = param._loss_scale
        loss_scale = 1.0 if loss_scale is None else float(loss_scale)
        return param, path, loss_scale, uses_wd, adapt, clip_lr

    def _build_plan(self, target, params):
        paths = {id(param): path for path, param in target.namedparams()}
        grouper = _mt.Grouper()
        float16, cupy, singles = [], [], []
        for param in params:
            rule = param.update_rule
            w = param.array
            if rule is None or not rule.enabled or w is None:
                # Chainer's optimizers skip a parameter without an update
                # rule (a link added after setup()) or with a disabled one.
                continue
            path = paths[id(param)]
            uses_wd, adapt = self._rules.lookup(path)
            xp = param.device.xp
            if (w.dtype == numpy.float16
                    and xp is not chainer.backend.chainerx):
                float16.append((param, rule, path, adapt))
                continue
            if self._multi_tensor:
                group = grouper.group_for(param.device, w.dtype, w)
                if group is not None:
                    group.add(path, param, rule, w)
                    continue
            if xp is cuda.cupy:
                # The CUDA kernels' tables, per update (one array per table
                # with multi_tensor=False).
                cupy.append((param, rule, path, uses_wd, adapt))
                continue
            singles.append((param, rule, path, uses_wd, adapt))
        batches = []
        for group in grouper.groups():
            flags = [self._rules.lookup(path) for path in group.paths]
            batches.append(_Batch(group, [f[0] for f in flags],
                                  [f[1] for f in flags]))
        return _Plan(params, batches, float16, cupy, singles)

    def _form(self):
        return ratio.hook_form(self._threshold)

    def _rescale_on_device(self, device, items, loss_scale, clip_lr):
        """Rescales CuPy arrays of one dtype in two kernel launches.

        Args:
            items (list): ``(path, w, g, uses_weight_decay, adapt)`` each.

        """
        cuda_kernels = _cuda_kernels()
        if self._tables is None:
            self._tables = cuda_kernels.TableCache(capacity=1024)
        rows = cuda_kernels.settings(
            len(items), [self._weight_decay if uses_wd else 0.0
                         for _, _, _, uses_wd, _ in items],
            self._eps, self._trust_coefficient, loss_scale,
            [adapt for _, _, _, _, adapt in items], clip_lr=clip_lr)
        with chainer.using_device(device):
            stats = cuda_kernels.hook_update(
                device.xp, self._tables, items[0][1].dtype,
                [item[1] for item in items], [item[2] for item in items],
                rows, self._form()).stats
        for row, item in enumerate(items):
            self._observations[item[0]] = _observations.DeviceObservation(
                stats, row, loss_scale)

    def _delegate(self, rule):
        """This hook's delegate on ``rule``, registered there on first use.

        It is looked up on the rule, not in a table of the hook's, so that
        a deep copy or an unpickled optimizer finds the copied delegate on
        each copied rule. Chainer offers no public way to list a rule's
        hooks; ``_hookable`` is where Chainer 7.8.1 keeps them.

        """
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
        if not self._clip:
            return None
        lr = getattr(getattr(rule, 'hyperparam', None), 'lr', None)
        if lr is None:
            raise TypeError(
                'GradientLARS(clip=True) divides the ratio by the update '
                "rule's learning rate, but the rule of {} ({}) has no "
                "hyperparameter 'lr'".format(path, type(rule).__name__))
        return checks.real('lr of ' + path, lr, minimum=0.0)

    def _rescale(self, rule, param, path, loss_scale):
        """Rescales one parameter's gradient in place.

        ``loss_scale`` is the factor by which the stored gradient still
        exceeds the true one; the result is stored with the same factor, so
        that the update rule's later division gives the right gradient.

        """
        w = param.array
        g = None if w is None else param.grad
        if g is None or g.size == 0:
            return
        uses_wd, adapt = self._rules.lookup(path)
        clip_lr = self._clip_lr(rule, path) if adapt else None
        self._rescale_with(param, path, loss_scale, uses_wd, adapt, clip_lr)

    def _rescale_with(self, param, path, loss_scale, uses_wd, adapt,
                      clip_lr):
        """:meth:`_rescale` with the settings of the parameter given."""
        w = param.array
        g = param.grad
        device = param.device
        if device.xp is chainer.backend.chainerx:
            # As Chainer's update rules do: the NumPy or CuPy arrays that
            # share a ChainerX array's memory, rewritten in place below.
            w, g = chainer.backend.from_chx(w), chainer.backend.from_chx(g)
            device = chainer.backend.get_device_from_array(w)
        xp = device.xp
        if xp is not numpy:
            cuda_kernels = _cuda_kernels()
            if cuda_kernels.supports(w, g):
                self._rescale_on_device(
                    device, [(path, w, g, uses_wd, adapt)], loss_scale,
                    clip_lr)
                return
            # Not C-contiguous: the kernels rescale a contiguous copy,
            # which is then copied back.
            with chainer.using_device(device):
                w_copy = xp.ascontiguousarray(w)
                copy = xp.ascontiguousarray(g)
                if not cuda_kernels.supports(w_copy, copy):
                    raise TypeError(
                        'GradientLARS rescales float16, float32 and float64 '
                        "gradients of their weight's dtype on GPU; {} has a "
                        '{} weight and a {} gradient'.format(
                            path, w.dtype, g.dtype))
                self._rescale_on_device(
                    device, [(path, w_copy, copy, uses_wd, adapt)],
                    loss_scale, clip_lr)
                g[...] = copy
            return
        wd = self._weight_decay if uses_wd else 0.0
        w_sq, g_sq = kernels.sqnorms(w, g)
        w_norm = math.sqrt(w_sq)
        g_norm = math.sqrt(g_sq) / loss_scale
        r = 1.0
        if adapt:
            r = self._form().ratio(w_norm, g_norm, wd, self._eps,
                                   self._trust_coefficient, clip_lr)
        kernels.scale_add(g, r, w, r * (loss_scale * wd))
        self._observations[path] = (r, w_norm, g_norm)

    def observe(self):
        """The ratios and norms of the last update, per parameter path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` as floats, with ``g``
            the unscaled gradient before rescaling, and the ratio the
            update applied, recorded where it was computed. Values on a GPU
            are brought to the host here, once per call: call it at an
            interval, not on every iteration.

        """
        fetched = {}
        result = {path: _observations.to_host(record, fetched)
                  for path, record in self._observations.items()}
        for group in self._observed_tables:
            table = group.executor.observe(group)
            for path, row in zip(group.paths, table.tolist()):
                if row[0] == row[0]:  # NaN: not in the last update
                    result[path] = tuple(row)
        return result
