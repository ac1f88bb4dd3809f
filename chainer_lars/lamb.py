"""LAMB, a face of :mod:`chainer_lars.engine` with the names of ``Adam``."""

import math
import operator

import numpy

from chainer import optimizer

from chainer_lars import checks
from chainer_lars import fused
from chainer_lars import layout as L


_default_hyperparam = _D = optimizer.Hyperparameter()
vars(_default_hyperparam).update(alpha=0.001, beta1=0.9, beta2=0.999,
                                 eps=1e-6, eta=1.0, weight_decay_rate=0.0)

_HYPER = ('alpha', 'beta1', 'beta2', 'eps', 'eta', 'weight_decay_rate')


def _alpha_t(self):
    """float: Adam's bias-corrected rate ``alpha sqrt(1 - beta2^t) / (1 -
    beta1^t)`` at step ``t`` (Chainer's ``alpha_t``); ``lr`` is the same."""
    hp, t = self.hyperparam, self.t
    if t == 0:
        raise RuntimeError(
            "Can't determine the learning rate of LAMB optimizer because "
            'the update steps have not been started.')
    return (hp.alpha * math.sqrt(1.0 - math.pow(hp.beta2, t))
            / (1.0 - math.pow(hp.beta1, t)))


def _fill_rows(rows, values, steps, uses_wd, paths, dtype):
    """LAMB's settings rows (``values``: one tuple of ``_HYPER`` or one a row;
    ``steps``: the step ``t`` of each), checked as :class:`LAMB` checks
    assignments: values set on a hyperparameter directly fail at the update.
    ``eps`` is above 0 (``0 / 0`` where no gradient came yet) and must not
    round to 0 in the arrays' compute dtype (float32 for float16 ``dtype``)."""
    v = numpy.empty((len(rows), len(_HYPER)))
    v[...] = values
    alpha, b1, b2, eps, eta, wd = v.T
    t = numpy.asarray(steps, numpy.float64)
    with numpy.errstate(invalid='ignore'):
        ok = (numpy.isfinite(v).all(axis=1) & (v >= 0).all(axis=1)
              & (b1 < 1) & (b2 < 1) & (eps > 0))
        whole = t % 1 == 0  # (not where t is not finite)
    for k in numpy.flatnonzero(~ok)[:1]:
        LAMB._check_values(dict(zip(_HYPER, v[k])), ' of ' + paths[k])
    ct = numpy.promote_types(numpy.float32, dtype)
    for k in numpy.flatnonzero(eps.astype(ct) == 0)[:1]:
        raise ValueError('eps of LAMB optimizer is too small for {} ({}), '
                         'at {}'.format(ct.name, eps[k], paths[k]))
    for k in numpy.flatnonzero(~((t >= 1) & whole))[:1]:  # rule.t = -1, 0.5
        checks.count('the step count t of ' + paths[k], steps[k] - 1)
    rows[:, L.LR], rows[:, L.BETA1], rows[:, L.BETA2] = alpha * eta, b1, b2
    rows[:, L.CORRECTION1], rows[:, L.CORRECTION2] = 1 - b1 ** t, 1 - b2 ** t
    rows[:, L.EPS], rows[:, L.WEIGHT_DECAY] = eps, wd * uses_wd


class LAMBRule(fused.FusedRule):

    """Update rule of :class:`LAMB` for one parameter array (states ``m``
    and ``v``), with the arguments of :class:`LARSRule`: its own
    hyperparameters are ``alpha``, ``beta1``, and so on."""

    _face, STATES, OP, _STEPPED = 'LAMB', ('m', 'v'), L.LAMB, True
    _VALUES = operator.attrgetter(*_HYPER)
    _DEFAULTS, _fill_rows = _default_hyperparam, staticmethod(_fill_rows)
    alpha_t, lr = property(_alpha_t), property(_alpha_t)
    _fits = staticmethod(lambda h: numpy.float32(min(h.eps, 1)) != 0)


class LAMB(fused.FusedMethod):

    """Adam with layer-wise adaptive rate scaling (`LAMB
    <https://arxiv.org/abs/1904.00962>`_, Algorithm 2). Per array, step
    :math:`t` from 1, :math:`g` unscaled,

    .. math::

        m &\\leftarrow \\beta_1 m + (1 - \\beta_1) g, \\qquad
        v \\leftarrow \\beta_2 v + (1 - \\beta_2) g^2, \\\\
        r &= \\frac{m / (1 - \\beta_1^t)}{\\sqrt{v / (1 - \\beta_2^t)}
             + \\epsilon} + \\lambda w, \\qquad
        w \\leftarrow w - \\alpha \\eta \\frac{\\|w\\|}{\\|r\\|} r,

    the ratio 1 where :math:`\\|w\\|` or :math:`\\|r\\|` is 0 or the array is
    excluded from adaptation, :math:`\\lambda` 0 where it is excluded from
    weight decay. The names are those of Chainer's
    :class:`~chainer.optimizers.Adam` (the weight decay decoupled, as in
    it); no gradient clipping. An adapted array moves by ``alpha * eta``
    times its own norm per update: start from the defaults and scale
    ``alpha`` with the batch (with a warm-up), or drive ``eta``.

    Args:
        alpha (float): The rate :math:`\\alpha`.
        beta1 (float): Decay rate of the first moment, in ``[0, 1)``.
        beta2 (float): Decay rate of the second moment, in ``[0, 1)``.
        eps (float): :math:`\\epsilon` (above 0), for numerical stability.
        eta (float): Schedule multiplier :math:`\\eta`.
        weight_decay_rate (float): :math:`\\lambda`.
        exclude_from_weight_decay (list of str): Regular expressions
            searched in the parameter paths (e.g. ``'/b$'``).
        exclude_from_layer_adaptation (list of str): Likewise: ratio 1.
        multi_tensor (bool): Update each device's and dtype's together.

    Attributes:
        alpha (float): The rate; settable (e.g. by a schedule) and checked
            on assignment, as are the four below and ``eta``.
        beta1 (float): The first moment's decay rate.
        beta2 (float): The second moment's decay rate.
        eps (float): The term added to the denominator.
        weight_decay_rate (float): The weight decay rate.
        eta (float): The schedule multiplier.
        exclude_from_weight_decay (tuple of str): The patterns, read only.
        exclude_from_layer_adaptation (tuple of str): Likewise.
        multi_tensor (bool): As the argument, read only.

    """

    _rule, _face = LAMBRule, 'LAMB'

    def __init__(
            self, alpha=_D.alpha, beta1=_D.beta1, beta2=_D.beta2, eps=_D.eps,
            eta=_D.eta, weight_decay_rate=_D.weight_decay_rate,
            exclude_from_weight_decay=(), exclude_from_layer_adaptation=(),
            multi_tensor=True, **unexpected):
        checks.unexpected('LAMB', unexpected, {
            'lr': "its rate is alpha, as in chainer.optimizers.Adam (lr "
                  "is read only: the bias-corrected rate); LAMB(alpha=...)",
            'weight_decay': 'LAMB(weight_decay_rate=...), as in Adam',
            'momentum': 'LAMB(beta1=...), as in Adam'})
        super(LAMB, self).__init__(multi_tensor, exclude_from_weight_decay,
                                   exclude_from_layer_adaptation)
        self.alpha, self.beta1, self.beta2, self.eps = alpha, beta1, beta2, eps
        self.eta, self.weight_decay_rate = eta, weight_decay_rate

    alpha = checks.CheckedHyperparameter(minimum=0.0)
    beta1 = checks.CheckedHyperparameter(minimum=0.0, maximum=1.0)
    beta2 = checks.CheckedHyperparameter(minimum=0.0, maximum=1.0)
    eps = checks.CheckedHyperparameter(minimum=0.0, exclusive=True)
    eta = checks.CheckedHyperparameter(minimum=0.0)
    weight_decay_rate = checks.CheckedHyperparameter(minimum=0.0)
    _REPR = _HYPER
    alpha_t, lr = property(_alpha_t), property(_alpha_t)
