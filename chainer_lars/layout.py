"""The one layout of per-array settings, shared by every executor.

An update hands each executor a float64 table with a row per array and
the columns :data:`COLUMNS`; the CPU loops index it with the constants
below, and the CUDA source gets the same numbers as ``#define LARS_<NAME>``
lines from :func:`cuda_defines`. This module imports nothing of ours, so
every other module may import it.
"""

import numpy


#: The settings of one array, in column order. The hook fills
#: ``weight_decay`` to ``adapt`` (``lr``, ``momentum`` and ``nesterov`` are
#: its optimizer's); the optimizer fills all but ``clip_lr``.
COLUMNS = ('lr', 'momentum', 'nesterov', 'weight_decay', 'eps',
           'trust_coefficient', 'threshold', 'require_grad', 'clip_lr',
           'loss_scale', 'adapt')
(LR, MOMENTUM, NESTEROV, WEIGHT_DECAY, EPS, TRUST_COEFFICIENT, THRESHOLD,
 REQUIRE_GRAD, CLIP_LR, LOSS_SCALE, ADAPT) = range(len(COLUMNS))

#: What an update does with the ratio: the hook rescales the gradient in
#: place, ``g <- r (g + S wd w)`` with ``S`` the loss scale still in ``g``;
#: the optimizer divides ``S`` out of ``g`` and makes the momentum step.
RESCALE, STEP = 0, 1

#: Columns of the CPU executor's address table (int64, a row per array):
#: the addresses of the weight, gradient and momentum buffer, and the size
#: (negative: no gradient this update).
W, G, V, SIZE = range(4)


def written(op, scaled):
    """Which of ``(w, g, v)`` an op writes: the hook's rescale ``g``; a
    step ``w`` and ``v``, and ``g`` where it divides out a loss scale."""
    if op == RESCALE:
        return (1,)
    return (0, 1, 2) if scaled else (0, 2)


def rows(n):
    """``n`` rows of settings: no clipping, no loss scale, the rest 0."""
    table = numpy.zeros((n, len(COLUMNS)))
    table[:, CLIP_LR] = -1.0
    table[:, LOSS_SCALE] = 1.0
    return table


def cuda_defines():
    """The column numbers as C ``#define`` lines, for the CUDA source."""
    lines = ['#define LARS_{} {}'.format(name.upper(), k)
             for k, name in enumerate(COLUMNS)]
    lines.append('#define LARS_COLUMNS {}'.format(len(COLUMNS)))
    return '\n'.join(lines)
