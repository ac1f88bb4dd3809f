"""LARS written out by hand in float64 NumPy, for the tests to compare with.

Deliberately independent of ``chainer_lars.ratio``: a mistake there must not
be repeated here.
"""

import math

import numpy
import pytest

import chainer
import chainer.links as L


def norm64(a):
    a = numpy.asarray(a, dtype=numpy.float64)
    return math.sqrt(float((a * a).sum()))


def trust_ratio(w_norm, g_norm, weight_decay, eps, trust_coefficient,
                threshold=0.0, require_grad=False, clip_lr=-1.0):
    """The ratio as docs/hook.rst writes it, from the norms: ``eta ||w|| /
    (eps + ||g|| + wd ||w||)`` where ``||w|| > threshold`` (and, with
    ``require_grad``, ``||g|| > 0``) and the denominator is positive, else
    1; ``clip_lr >= 0`` clips it to ``min(r / clip_lr, 1)``."""
    denominator = eps + g_norm + weight_decay * w_norm
    if (w_norm <= threshold or denominator <= 0
            or require_grad and g_norm <= 0):
        return 1.0
    r = trust_coefficient * w_norm / denominator
    if clip_lr is not None and clip_lr >= 0:
        r = min(r / clip_lr, 1.0) if clip_lr > 0 else 1.0
    return r


def hook_gradient(w, g, threshold=1e-2, weight_decay=0.0, eps=1e-9,
                  trust_coefficient=1.0, clip_lr=None, uses_weight_decay=True,
                  uses_adaptation=True):
    """The gradient GradientLARS should leave, from the unscaled ``g``."""
    w = numpy.asarray(w, dtype=numpy.float64)
    g = numpy.asarray(g, dtype=numpy.float64)
    wd = weight_decay if uses_weight_decay else 0.0
    w_norm, g_norm = norm64(w), norm64(g)
    r = 1.0
    den = eps + g_norm + wd * w_norm
    if uses_adaptation and w_norm > threshold and den > 0:
        r = trust_coefficient * w_norm / den
        if clip_lr is not None:
            r = min(r / clip_lr, 1.0) if clip_lr > 0 else 1.0
    return r * (g + wd * w)


def lars_step(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps,
              nesterov=False, uses_weight_decay=True, uses_adaptation=True):
    """One step of the LARS optimizer; returns the new ``(w, v)``."""
    w = numpy.asarray(w, dtype=numpy.float64)
    g = numpy.asarray(g, dtype=numpy.float64)
    wd = weight_decay if uses_weight_decay else 0.0
    w_norm, g_norm = norm64(w), norm64(g)
    r = 1.0
    if uses_adaptation and w_norm > 0 and g_norm > 0:
        r = trust_coefficient * w_norm / (g_norm + wd * w_norm + eps)
    u = lr * r * (g + wd * w)
    v = momentum * v + u
    if nesterov:
        return w - (u + momentum * v), v
    return w - v, v


# The paths of Net's parameters, as namedparams() gives them.
PATHS = ['/conv1/W', '/conv1/b', '/bn1/gamma', '/bn1/beta', '/fc/W', '/fc/b']


class Net(chainer.Chain):

    """A small model with the parameter kinds LARS treats differently."""

    def __init__(self, dtype=numpy.float32):
        super(Net, self).__init__()
        with self.init_scope():
            self.conv1 = L.Linear(6, 5, initialW=_init(dtype),
                                  initial_bias=_init(dtype))
            self.bn1 = L.BatchNormalization(5, dtype=dtype)
            self.fc = L.Linear(5, 3, initialW=_init(dtype),
                               initial_bias=_init(dtype))

    def forward(self, x):
        return self.fc(self.bn1(chainer.functions.relu(self.conv1(x))))


def _init(dtype):
    return chainer.initializers.Normal(0.5, dtype=dtype)


def fill(link, seed, w_scale=1.0, g_scale=1.0):
    """Puts random weights and gradients into every parameter of ``link``."""
    rng = numpy.random.RandomState(seed)
    for param in link.params():
        shape, dtype = param.shape, param.dtype
        param.array[...] = (rng.standard_normal(shape) * w_scale).astype(dtype)
        param.grad = (rng.standard_normal(shape) * g_scale).astype(dtype)


def snapshot(link, attr='array'):
    """``{path: float64 copy}`` of the weights (or ``attr='grad'``)."""
    return {path: numpy.array(getattr(p, attr), dtype=numpy.float64)
            for path, p in link.namedparams()}


def batch(seed, n=16, dtype=numpy.float32):
    rng = numpy.random.RandomState(seed)
    x = rng.standard_normal((n, 6)).astype(dtype)
    t = rng.randint(0, 3, size=n).astype(numpy.int32)
    return x, t


def loss_fn(model, x, t):
    def loss():
        return chainer.functions.softmax_cross_entropy(model(x), t)
    return loss


def assert_same_momentum_state(link, expected, fp32_update=False):
    """Weights, momentum buffers (and master copies) equal bit for bit."""
    ours = dict(expected.namedparams())
    for path, param in link.namedparams():
        assert param.array.tobytes() == ours[path].array.tobytes(), path
        rule, our_rule = param.update_rule, ours[path].update_rule
        assert (rule.state['v'].tobytes()
                == our_rule.state['v'].tobytes()), path
        if fp32_update:
            assert (rule._fp32_param.array.tobytes()
                    == our_rule._fp32_param.array.tobytes()), path


#: Exclusion lists for the parameters of :class:`Net`, and the
#: ``(uses weight decay, uses adaptation)`` they give, worked out by hand.
EXCLUDE_FROM_WEIGHT_DECAY = ['/b$', r'/bn\d+/']
EXCLUDE_FROM_LAYER_ADAPTATION = ['/conv1/b$', 'gamma']
EXCLUDED_FLAGS = {
    '/conv1/W': (True, True),
    '/conv1/b': (False, False),
    '/bn1/gamma': (False, False),
    '/bn1/beta': (False, True),
    '/fc/W': (True, True),
    '/fc/b': (False, True),
}


_host = chainer.backends.cuda.to_cpu


def exact_mixed16():
    """Whether the CPU's mixed16 update is documented to equal each rule's
    own fp32 update bit for bit here: compiled by Numba 0.68 or newer
    (docs/design.rst, "Mixed precision"; not with the NumPy passes)."""
    from chainer_lars import cpu
    if cpu.backend() != 'numba':
        return False
    import numba
    version = tuple(int(part) for part in numba.__version__.split('.')[:2])
    return version >= (0, 68)


def assert_mixed16_close(a, b, states, exact=None):
    """Two mixed16 runs agree as the docs say the batched update agrees
    with each rule's fp32 update. On the CPU with Numba 0.68 or newer
    (``exact``, by default :func:`exact_mixed16` where the arrays are
    NumPy's): bit for bit, weights, masters and ``states``. Elsewhere as
    the issue asks: float32 masters and ``states`` to float32 rounding
    over a few updates, float16 weights within one unit in the last place
    (older Numba vectorises the norms' sums of float16 and float32 loads
    in another order, which moves a ratio by an ulp of float64; a GPU's
    kernels may contract their products otherwise than CuPy's)."""
    theirs = dict(b.namedparams())
    for path, p in a.namedparams():
        q = theirs[path]
        pairs = [(p.array, q.array), (p.update_rule._fp32_param.array,
                                      q.update_rule._fp32_param.array)] + [
            (p.update_rule.state[k], q.update_rule.state[k]) for k in states]
        if exact is None:
            exact = exact_mixed16() and all(
                isinstance(x, numpy.ndarray) for pair in pairs for x in pair)
        if exact:
            names = ['weight', 'master'] + list(states)
            for name, (u, v) in zip(names, pairs):
                assert u.dtype == v.dtype, (path, name)
                assert u.tobytes() == v.tobytes(), (path, name)
            assert p.update_rule.t == q.update_rule.t
            continue
        # to_cpu: CuPy refuses numpy.asarray (the emulator allows it).
        x, y = (numpy.asarray(_host(r.array), numpy.float64)
                for r in (p, q))
        ulp = numpy.spacing(numpy.maximum(numpy.abs(x), numpy.abs(y))
                            .astype(numpy.float16)).astype(numpy.float64)
        assert (numpy.abs(x - y) <= ulp).all(), path
        for u, v in pairs[1:]:
            numpy.testing.assert_allclose(_host(u), _host(v), rtol=1e-5,
                                          atol=1e-7, err_msg=path)
        assert p.update_rule.t == q.update_rule.t


def plan_of(face):
    """The plan a face (an optimizer of ours, or the hook) keeps for the
    one optimizer it ran on; ``None`` before its first update."""
    plans = face._plans.plans()
    assert len(plans) <= 1, plans
    return plans[0] if plans else None


#: The mark of a float16 test without master copies whose steps round
#: away for some arrays: the warning it gets is tests/test_lifetime.py's.
ROUNDS_AWAY = pytest.mark.filterwarnings(
    'ignore:.*rounded away in float16:RuntimeWarning')
