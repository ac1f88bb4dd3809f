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
from chainer_lars import ratio


def _cuda_kernels():
    # Imported on first use: the module needs CuPy.
    from chainer_lars import cuda_kernels
    return cuda_kernels


class _Observation(object):

    """What an update computed for one array, kept for the ratio observer.

    ``sqnorms`` is either a ``(||w||^2, ||g||^2)`` pair of floats or an
    array on the device (summed along its first axis on demand), so that
    recording costs no host synchronisation.

    """

    __slots__ = ('sqnorms', 'loss_scale', 'weight_decay', 'adapt', 'clip_lr')

    def __init__(self, sqnorms, loss_scale, weight_decay, adapt, clip_lr):
        self.sqnorms = sqnorms
        self.loss_scale = loss_scale
        self.weight_decay = weight_decay
        self.adapt = adapt
        self.clip_lr = clip_lr


class _DeviceObservation(object):

    """Row ``row`` of the per-array ``stats`` a GPU update left on the device:
    the ratio it applied and the squared norms (``g`` as stored, i.e.
    times ``loss_scale``)."""

    __slots__ = ('stats', 'row', 'loss_scale')

    def __init__(self, stats, row, loss_scale):
        self.stats = stats
        self.row = row
        self.loss_scale = loss_scale

    def to_host(self, fetched):
        """``(ratio, ||w||, ||g||)``; ``fetched`` caches host copies."""
        host = fetched.get(id(self.stats))
        if host is None:
            host = fetched[id(self.stats)] = (
                cuda.to_cpu(self.stats).astype(numpy.float64))
        r, w_sq, g_sq = host[self.row]
        return (float(r), math.sqrt(w_sq),
                math.sqrt(g_sq) / self.loss_scale)


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
        multi_tensor (bool): On GPU, rescale all float32 (or float64)
            arrays of one device in two kernel launches per update, instead
            of two per array. ``False`` keeps the per-array kernels.

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
        self._observations.clear()
        batches = collections.OrderedDict()
        for path, param in target.namedparams():
            rule = getattr(param, 'update_rule', None)
            if rule is not None and not rule.enabled:
                continue
            w = param.array
            g = None if w is None else param.grad  # no grad before init
            if g is None or g.size == 0:
                continue
            xp = param.device.xp
            if (g.dtype == numpy.float16 and rule is not None
                    and xp is not chainer.backend.chainerx):
                self._delegate(rule).arm(optimizer, path)
                continue
            loss_scale = param._loss_scale
            loss_scale = 1.0 if loss_scale is None else float(loss_scale)
            if xp is cuda.cupy and _cuda_kernels().supports(w, g):
                uses_wd, adapt = self._rules.lookup(path)
                clip_lr = self._clip_lr(rule, path) if adapt else None
                key = (param.device.name, g.dtype, loss_scale, clip_lr)
                if not self._multi_tensor:
                    key += (path,)
                batches.setdefault(key, (param.device, []))[1].append(
                    (path, w, g, uses_wd, adapt))
                continue
            self._rescale(rule, param, path, loss_scale)
        for (_, _, loss_scale, clip_lr), (device, items) in (
                (key[:4], value) for key, value in batches.items()):
            self._rescale_on_device(device, items, loss_scale, clip_lr)

    def _rescale_on_device(self, device, items, loss_scale, clip_lr):
        """Rescales CuPy arrays of one dtype in two kernel launches.

        Args:
            items (list): ``(path, w, g, uses_weight_decay, adapt)`` each.

        """
        cuda_kernels = _cuda_kernels()
        if self._tables is None:
            self._tables = cuda_kernels.TableCache(capacity=1024)
        xp = device.xp
        dtype = items[0][1].dtype
        settings = numpy.zeros((len(items), cuda_kernels.SETTINGS))
        settings[:, cuda_kernels.WEIGHT_DECAY] = [
            self._weight_decay if uses_wd else 0.0
            for _, _, _, uses_wd, _ in items]
        settings[:, cuda_kernels.EPS] = self._eps
        settings[:, cuda_kernels.TRUST_COEFFICIENT] = self._trust_coefficient
        settings[:, cuda_kernels.CLIP_LR] = (
            -1.0 if clip_lr is None else clip_lr)
        settings[:, cuda_kernels.LOSS_SCALE] = loss_scale
        settings[:, cuda_kernels.ADAPT] = [
            adapt for _, _, _, _, adapt in items]
        with chainer.using_device(device):
            table = self._tables.get(xp, dtype, [item[1] for item in items],
                                     [item[2] for item in items])
            table.set_settings(settings)
            stats = cuda_kernels.norms(xp, table, dtype, self._threshold,
                                       False)
            cuda_kernels.scale_add(xp, table, dtype)
        for row, item in enumerate(items):
            self._observations[item[0]] = _DeviceObservation(
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
        wd = self._weight_decay if uses_wd else 0.0
        clip_lr = self._clip_lr(rule, path) if adapt else None
        xp = param.device.xp
        with chainer.using_device(param.device):
            if xp is numpy:
                def ratio_of(w_sq, g_sq):
                    if not adapt:
                        return 1.0
                    return ratio.trust_ratio(
                        math.sqrt(w_sq), math.sqrt(g_sq) / loss_scale, wd,
                        self._eps, self._trust_coefficient, self._threshold,
                        clip_lr=clip_lr)
                sqnorms = kernels.rescale(g, w, loss_scale * wd, ratio_of)
            elif xp is cuda.cupy and _cuda_kernels().supports(w, g):
                self._rescale_on_device(
                    param.device, [(path, w, g, uses_wd, adapt)],
                    loss_scale, clip_lr)
                return
            else:
                sqnorms = rescale_generic(
                    xp, w, g, wd, self._eps, self._trust_coefficient,
                    self._threshold, clip_lr, loss_scale, adapt)
        self._observations[path] = _Observation(
            sqnorms, loss_scale, wd, adapt, clip_lr)

    def observe(self):
        """The ratios and norms of the last update, per parameter path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` as floats, with ``g``
            the unscaled gradient before rescaling. Values on a GPU are
            brought to the host here, once per call: call it at an
            interval, not on every iteration.

        """
        fetched = {}
        return {path: o.to_host(fetched) if isinstance(o, _DeviceObservation)
                else observation_to_host(o, self._eps,
                                         self._trust_coefficient,
                                         self._threshold, False)
                for path, o in self._observations.items()}


def rescale_generic(xp, w, g, weight_decay, eps, trust_coefficient,
                    threshold, clip_lr, loss_scale, adapt):
    """Rescales ``g`` in place with the operations of the array module.

    The hook's path for arrays that neither NumPy's passes nor the CUDA
    kernels take: ChainerX arrays, and CuPy arrays that are not
    C-contiguous or whose weight and gradient differ in dtype. The ratio is
    a 0-dim array of ``xp`` (:func:`chainer_lars.ratio.trust_ratio_xp`), so
    nothing leaves the device.

    Args:
        xp: The array module of ``w`` and ``g``.
        w: The weight, read only.
        g: The gradient, still multiplied by ``loss_scale``; overwritten
            with ``r * (g + loss_scale * weight_decay * w)``.
        weight_decay (float): The effective weight decay of this array.
        eps (float): See :class:`GradientLARS`.
        trust_coefficient (float): See :class:`GradientLARS`.
        threshold (float): See :class:`GradientLARS`.
        clip_lr (float or None): The learning rate to clip with, if any.
        loss_scale (float): The factor by which ``g`` exceeds the true
            gradient.
        adapt (bool): ``False`` for an array excluded from layer
            adaptation (``r = 1``).

    Returns:
        tuple: ``(||w||^2, ||g||^2)`` of the incoming arrays, as 0-dim
        arrays of ``xp``.

    """
    sqnorms = kernels.sqnorms_generic(xp, w, g)
    if adapt:
        r = ratio.trust_ratio_xp(
            xp, sqnorms[0], sqnorms[1], weight_decay, eps,
            trust_coefficient, threshold, clip_lr=clip_lr,
            loss_scale=loss_scale)
        g *= r.astype(g.dtype)
        if weight_decay:
            g += (r * (loss_scale * weight_decay)).astype(g.dtype) * w
    elif weight_decay:
        g += w * (loss_scale * weight_decay)
    return sqnorms


def observation_to_host(o, eps, trust_coefficient, threshold, require_grad):
    """Turns an :class:`_Observation` into ``(ratio, ||w||, ||g||)``."""
    sq = o.sqnorms
    if isinstance(sq, tuple) and not hasattr(sq[0], 'shape'):
        w_sq, g_sq = sq
    elif isinstance(sq, tuple):
        w_sq, g_sq = (float(chainer.backend.CpuDevice().send(s)) for s in sq)
    else:
        total = cuda.to_cpu(sq).astype(numpy.float64).reshape(-1, 2).sum(0)
        w_sq, g_sq = float(total[0]), float(total[1])
    w_norm = math.sqrt(w_sq)
    g_norm = math.sqrt(g_sq) / o.loss_scale
    r = 1.0
    if o.adapt:
        r = ratio.trust_ratio(w_norm, g_norm, o.weight_decay, eps,
                              trust_coefficient, threshold, require_grad,
                              o.clip_lr)
    return r, w_norm, g_norm
