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
#: its optimizer's); LARS fills all but ``clip_lr`` and the last four;
#: LAMB ``lr`` (``alpha * eta``), ``weight_decay`` (``weight_decay_rate``),
#: ``eps``, ``adapt``, ``loss_scale`` and the last four: ``beta1``,
#: ``beta2`` and the bias corrections ``1 - beta1^t``, ``1 - beta2^t``.
COLUMNS = ('lr', 'momentum', 'nesterov', 'weight_decay', 'eps',
           'trust_coefficient', 'threshold', 'require_grad', 'clip_lr',
           'loss_scale', 'adapt', 'beta1', 'beta2', 'correction1',
           'correction2')
(LR, MOMENTUM, NESTEROV, WEIGHT_DECAY, EPS, TRUST_COEFFICIENT, THRESHOLD,
 REQUIRE_GRAD, CLIP_LR, LOSS_SCALE, ADAPT, BETA1, BETA2, CORRECTION1,
 CORRECTION2) = range(len(COLUMNS))

#: What an update does with the ratio: the hook rescales the gradient in
#: place, ``g <- r (g + S wd w)`` with ``S`` the loss scale still in ``g``;
#: LARS divides ``S`` out of ``g`` and makes the momentum step; LAMB
#: divides it out, updates its moments ``m`` and ``v`` and steps along
#: ``r = mh / (sqrt(vh) + eps) + wd w`` times ``||w|| / ||r||``.
RESCALE, STEP, LAMB = 0, 1, 2

#: The state buffers each op reads and writes, by name (for errors): LARS
#: its momentum ``v``, LAMB its moments ``m`` and ``v``.
STATE_NAMES = {RESCALE: (), STEP: ('momentum buffer',),
               LAMB: ('first moment', 'second moment')}
STATES = {op: len(names) for op, names in STATE_NAMES.items()}

#: Columns of the CPU executor's address table (int64, a row per array):
#: the addresses of the weight, first and second state buffer and, in a
#: mixed16 row (whose weight is the float32 master), of what it writes
#: besides: the float16 weight of a step, the hook's float32 gradient
#: (else 0); and the size. The gradients' addresses come with each update.
W, V, V2, OUT, SIZE = range(5)


def written(op, scaled):
    """Which of ``(w, g, *states)`` an op writes: the hook's rescale
    ``g``; a step ``w`` and its states, and ``g`` where it divides out a
    loss scale."""
    if op == RESCALE:
        return (1,)
    states = tuple(range(2, 2 + STATES[op]))
    return (0, 1) + states if scaled else (0,) + states


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
