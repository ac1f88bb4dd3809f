"""LARS, a face of :mod:`chainer_lars.engine`."""

import operator

import numpy

from chainer import optimizer

from chainer_lars import checks
from chainer_lars import fused
from chainer_lars import layout as L


_default_hyperparam = _D = optimizer.Hyperparameter()
vars(_D).update(lr=2.0, momentum=0.9, weight_decay=1e-4,
                trust_coefficient=1e-3, eps=0.0, nesterov=False)

#: The rule hyperparameters: the first columns, lr to trust_coefficient.
_HYPER = L.COLUMNS[:L.TRUST_COEFFICIENT + 1]


def _fill_rows(rows, values, steps, uses_wd, paths, dtype):
    """LARS's settings rows, checked as :class:`LARS` checks assignments:
    values set on a hyperparameter directly fail at the update."""
    rows[:, :len(_HYPER)] = values
    rows[:, L.WEIGHT_DECAY] *= uses_wd
    rows[:, L.THRESHOLD], rows[:, L.REQUIRE_GRAD] = 0.0, 1.0
    with numpy.errstate(invalid='ignore'):  # columns of _HYPER, all >= 0
        v = rows[:, :len(_HYPER)]
        ok = (numpy.isfinite(v).all(axis=1) & (v >= 0).all(axis=1)
              & (v[:, L.MOMENTUM] < 1) & (v[:, L.TRUST_COEFFICIENT] > 0))
    for k in numpy.flatnonzero(~ok)[:1]:  # (nesterov: a 0/1 column)
        LARS._check_values({n: v for n, v in zip(_HYPER, rows[k])
                            if n != 'nesterov'}, ' of ' + paths[k])


class LARSRule(fused.FusedRule):

    """Update rule of :class:`LARS` for one parameter array (reads its
    hyperparameters at every update; flags as attributes).

    Args:
        parent_hyperparam (~chainer.optimizer.Hyperparameter): The defaults.
        uses_weight_decay (bool): ``False``: no weight decay on this array.
        uses_adaptation (bool): ``False``: no layer adaptation (ratio 1).
        **hyperparams: Its own ``lr``, ``momentum``, ... (``None``: the
            parent's), as Chainer's rules take them; checked at the update.

    """

    _face, STATES, OP, _STEPPED = 'LARS', ('v',), L.STEP, False
    _VALUES = operator.attrgetter(*_HYPER)
    _DEFAULTS, _fill_rows = _default_hyperparam, staticmethod(_fill_rows)


class LARS(fused.FusedMethod):

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

    In plain text, with the arguments' names: ``r = trust_coefficient * ||w|| /
    (||g|| + weight_decay * ||w|| + eps)`` if both norms are positive, else
    ``r = 1``; ``u = lr * r * (g + weight_decay * w)``, ``v <- momentum * v +
    u``, ``w <- w - v`` (Nesterov: ``w <- w - u - momentum * v``).

    ``lr`` and ``trust_coefficient`` are the paper's :math:`\\gamma` and
    :math:`\\eta`, kept apart as in TensorFlow: an adapted array moves, per
    update and before momentum, by about ``lr * trust_coefficient`` times
    its own norm; one not adapted takes ``lr`` itself. The defaults suit small
    batches; for large ones scale that product with the batch and, biases
    excluded, raise ``trust_coefficient`` to about 0.02 (docs: "The recipe").

    Args:
        lr (float): Learning rate :math:`\\gamma`.
        momentum (float): Momentum :math:`\\mu`, in ``[0, 1)``.
        weight_decay (float): Weight decay :math:`\\lambda`.
        trust_coefficient (float): Trust coefficient :math:`\\eta`.
        eps (float): Added to the denominator; ``0`` stays 0.
        nesterov (bool): Use Nesterov momentum.
        exclude_from_weight_decay (list of str): Regular expressions
            searched in the parameter paths (e.g. ``'/b$'``).
        exclude_from_layer_adaptation (list of str): Likewise: ratio 1.
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
        multi_tensor (bool): As the argument, read only.

    """

    _rule, _face = LARSRule, 'LARS'

    def __init__(self, lr=_D.lr, momentum=_D.momentum,
                 weight_decay=_D.weight_decay,
                 trust_coefficient=_D.trust_coefficient, eps=_D.eps,
                 nesterov=_D.nesterov, exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=(), multi_tensor=True):
        super(LARS, self).__init__(multi_tensor, exclude_from_weight_decay,
                                   exclude_from_layer_adaptation)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.trust_coefficient, self.eps, self.nesterov = (
            trust_coefficient, eps, nesterov)

    lr = checks.CheckedHyperparameter(minimum=0.0)
    momentum = checks.CheckedHyperparameter(minimum=0.0, maximum=1.0)
    weight_decay = checks.CheckedHyperparameter(minimum=0.0)
    trust_coefficient = checks.CheckedHyperparameter(
        minimum=0.0, exclusive=True)
    eps = checks.CheckedHyperparameter(minimum=0.0)
    nesterov = checks.CheckedHyperparameter(checks.boolean)
    _REPR = ('lr', 'momentum', 'weight_decay', 'trust_coefficient', 'eps',
             'nesterov')
