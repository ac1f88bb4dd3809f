"""What an update applied to each array, kept for ``observe()``.

An update records, for each array, the ratio it applied and the two norms,
where it computed them: on CPU as Python floats (or a row of a
multi-tensor group's table of them), for ChainerX as 0-dim arrays on the
device. :func:`to_host` turns a record into ``(ratio, ||w||, ||g||)``
floats when the observer asks, so that recording costs no host
synchronisation. A record is never recomputed from settings read later:
a schedule that changes ``lr`` between the update and the observer does
not change what is reported.
"""

import math

import numpy

import chainer
from chainer.backends import cuda


def to_host(record):
    """``(ratio, ||w||, ||g||)`` of a record, as Python floats."""
    if isinstance(record, CudaPartials):
        return record.to_host()
    return tuple(_float(x) for x in record)


def _float(x):
    if hasattr(x, 'shape'):
        return float(chainer.backend.CpuDevice().send(x))
    return float(x)


class CudaPartials(object):

    """The partial sums of squared norms that the CUDA kernels leave.

    Kept for the GPU paths only, until their kernels record the ratio they
    applied on the device: the ratio is recomputed here, on the host, from
    the partial sums and the settings the update used (captured at update
    time), with the same :class:`~chainer_lars.ratio.RatioForm`.

    Args:
        partials (cupy.ndarray): Pairs ``(||w||^2, ||g||^2)`` per block,
            summed here.
        form (~chainer_lars.ratio.RatioForm): The form of LARS.
        weight_decay, eps, trust_coefficient (float): The update's values.
        clip_lr (float or None): LARC clipping rate, if any.
        loss_scale (float): The factor the stored gradient had.
        adapt (bool): Whether the array was adapted (else ``r = 1``).

    """

    __slots__ = ('partials', 'form', 'weight_decay', 'eps',
                 'trust_coefficient', 'clip_lr', 'loss_scale', 'adapt')

    def __init__(self, partials, form, weight_decay, eps, trust_coefficient,
                 clip_lr=None, loss_scale=1.0, adapt=True):
        self.partials = partials
        self.form = form
        self.weight_decay = weight_decay
        self.eps = eps
        self.trust_coefficient = trust_coefficient
        self.clip_lr = clip_lr
        self.loss_scale = loss_scale
        self.adapt = adapt

    def to_host(self):
        total = cuda.to_cpu(self.partials).astype(numpy.float64)
        w_sq, g_sq = total.reshape(-1, 2).sum(0)
        w_norm = math.sqrt(w_sq)
        g_norm = math.sqrt(g_sq) / self.loss_scale
        r = 1.0
        if self.adapt:
            r = self.form.ratio(w_norm, g_norm, self.weight_decay, self.eps,
                                self.trust_coefficient, self.clip_lr)
        return r, w_norm, g_norm
