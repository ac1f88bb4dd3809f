"""LAMB (You et al. 2019, arXiv:1904.00962, Algorithm 2) written out by hand
in float64 NumPy, for the tests to compare with.

Independent of ``chainer_lars.ratio`` and the engine: a mistake there must
not be repeated here.
"""

import math

import numpy


def norm64(a):
    a = numpy.asarray(a, dtype=numpy.float64)
    return math.sqrt(float((a * a).sum()))


def lamb_step(w, g, m, v, t, alpha=1e-3, beta1=0.9, beta2=0.999, eps=1e-6,
              eta=1.0, weight_decay_rate=0.0, uses_weight_decay=True,
              uses_adaptation=True, dtype=numpy.float64):
    """Step ``t`` (from 1) of one array, from the unscaled gradient ``g``;
    returns the new ``(w, m, v)`` and the ratio. The step reads the new
    moments back as stored in ``dtype`` (float16: rounded, or 0 where they
    underflow)."""
    w, g, m, v = (numpy.asarray(a, dtype=numpy.float64) for a in (w, g, m, v))
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m, v = (a.astype(dtype).astype(numpy.float64) for a in (m, v))
    m_hat = m / (1 - beta1 ** t)
    v_hat = v / (1 - beta2 ** t)
    wd = weight_decay_rate if uses_weight_decay else 0.0
    r = m_hat / (numpy.sqrt(v_hat) + eps) + wd * w
    w_norm, r_norm = norm64(w), norm64(r)
    ratio = 1.0
    if uses_adaptation and w_norm > 0 and r_norm > 0:
        ratio = w_norm / r_norm
    return w - alpha * eta * ratio * r, m, v, ratio
