"""What an update applied to each array, kept for ``observe()``.

An update records, for each array, the ratio it applied and the two norms,
where it computed them: on CPU as Python floats (or a row of a
multi-tensor group's table of them), on a GPU as a row of the ``stats``
array the CUDA kernels leave
(:class:`DeviceObservation`). :func:`to_host` turns a record into
``(ratio, ||w||, ||g||)`` floats when the observer asks, so that recording
costs no host synchronisation. A record is never recomputed from settings
read later: a schedule that changes ``lr`` between the update and the
observer does not change what is reported.
"""

import math

import numpy

import chainer
from chainer.backends import cuda


def to_host(record, fetched=None):
    """``(ratio, ||w||, ||g||)`` of a record, as Python floats.

    Args:
        record: A tuple of three floats or 0-dim arrays, or a
            :class:`DeviceObservation`.
        fetched (dict): Host copies of device arrays already fetched, so
            that observing many rows of one ``stats`` array copies it once.

    """
    if isinstance(record, DeviceObservation):
        return record.to_host({} if fetched is None else fetched)
    return tuple(_float(x) for x in record)


def _float(x):
    if hasattr(x, 'shape'):
        return float(chainer.backend.CpuDevice().send(x))
    return float(x)


class DeviceObservation(object):

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
