"""LARS: the layer-wise adaptive rate scaling momentum optimizer."""

import math

import numpy

import chainer
from chainer.backends import cuda
from chainer import optimizer

from chainer_lars import checks
from chainer_lars import exclusions
from chainer_lars import kernels
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
        if self.uses_adaptation:
            w_sq, g_sq = kernels.sqnorms(w, g)
            self._observation = (w_sq, g_sq)
            r = ratio.trust_ratio(
                math.sqrt(w_sq), math.sqrt(g_sq), wd, hp.eps,
                hp.trust_coefficient, require_grad=True)
        else:
            self._observation = None
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
        if not cuda_kernels.supports(w, g, v):
            raise ValueError(
                'LARS needs C-contiguous weight, gradient and momentum '
                'arrays of one dtype (float16, float32 or float64); got '
                '{}, {}, {} for {}'.format(w.dtype, g.dtype, v.dtype,
                                           param.name))
        hp, wd = self._step_args()
        if w.size == 0:
            # Nothing to launch (a grid of no blocks is an error); as on
            # the CPU, both norms are 0.
            self._observation = (0.0, 0.0) if self.uses_adaptation else None
            return
        xp = param.device.xp
        if self._tables is None:
            self._tables = cuda_kernels.TableCache(capacity=1)
        table = self._tables.get(xp, w.dtype, [w], [g], [v])
        settings = numpy.zeros((1, cuda_kernels.SETTINGS))
        s = settings[0]
        s[cuda_kernels.WEIGHT_DECAY] = wd
        s[cuda_kernels.EPS] = hp.eps
        s[cuda_kernels.TRUST_COEFFICIENT] = hp.trust_coefficient
        s[cuda_kernels.CLIP_LR] = -1.0
        # The loss scale is already divided out (UpdateRule.update).
        s[cuda_kernels.LOSS_SCALE] = 1.0
        s[cuda_kernels.ADAPT] = self.uses_adaptation
        s[cuda_kernels.LR] = hp.lr
        s[cuda_kernels.MOMENTUM] = hp.momentum
        s[cuda_kernels.NESTEROV] = hp.nesterov
        table.set_settings(settings)
        self._observation = cuda_kernels.norms(xp, table, w.dtype, 0.0, True)
        cuda_kernels.momentum_step(xp, table, w.dtype)

    def observation(self):
        """``(ratio, ||w||, ||g||)`` of the last update, on the host."""
        hp, wd = self._step_args()
        if self._observation is None:
            return None
        sq = self._observation
        if not isinstance(sq, tuple):
            # The stats of the GPU kernels: the ratio they applied.
            r, w_sq, g_sq = cuda.to_cpu(sq).astype(numpy.float64)[0]
            if not self.uses_adaptation:
                return None
            return float(r), math.sqrt(w_sq), math.sqrt(g_sq)
        w_sq, g_sq = sq
        w_norm, g_norm = math.sqrt(w_sq), math.sqrt(g_sq)
        r = ratio.trust_ratio(w_norm, g_norm, wd, hp.eps,
                              hp.trust_coefficient, require_grad=True)
        return r, w_norm, g_norm


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
    memory for the two norms and one for the step, and on GPU one reduction
    kernel and one elementwise kernel per array, with the ratio kept on the
    device.

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
                 exclude_from_layer_adaptation=()):
        super(LARS, self).__init__()
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

    def observe(self):
        """The ratios and norms of the last update, per parameter path.

        Returns:
            dict: ``{path: (ratio, ||w||, ||g||)}`` as floats, for the
            arrays that are adapted. Values on a GPU are brought to the host
            here: call it at an interval, not on every iteration.

        """
        result = {}
        for path, param in self.target.namedparams():
            rule = getattr(param, 'update_rule', None)
            if isinstance(rule, LARSRule):
                observed = rule.observation()
                if observed is not None:
                    result[path] = observed
        return result
