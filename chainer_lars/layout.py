"""The columns of the float64 settings rows, as the constants below and as
``#define LARS_<NAME>`` in the CUDA source; it imports nothing of ours."""

import numpy


#: The settings of one array. The hook fills ``weight_decay`` to ``adapt``;
#: LARS all but ``clip_lr`` and the last four; LAMB ``lr`` (``alpha *
#: eta``), ``weight_decay``, ``eps``, ``adapt``, ``loss_scale``, its betas
#: and the bias corrections ``1 - beta^t``.
COLUMNS = ('lr', 'momentum', 'nesterov', 'weight_decay', 'eps',
           'trust_coefficient', 'threshold', 'require_grad', 'clip_lr',
           'loss_scale', 'adapt', 'beta1', 'beta2', 'correction1',
           'correction2')
(LR, MOMENTUM, NESTEROV, WEIGHT_DECAY, EPS, TRUST_COEFFICIENT, THRESHOLD,
 REQUIRE_GRAD, CLIP_LR, LOSS_SCALE, ADAPT, BETA1, BETA2, CORRECTION1,
 CORRECTION2) = range(len(COLUMNS))

#: The ops: the hook's rescale ``g <- r (g + S wd w)`` (``S``: the loss
#: scale in ``g``), LARS's momentum step, LAMB's moments and step.
RESCALE, STEP, LAMB = 0, 1, 2

#: The state buffers of each op, by name (for errors).
STATE_NAMES = {RESCALE: (), STEP: ('momentum buffer',),
               LAMB: ('first moment', 'second moment')}

#: Columns of the CPU executor's address table (int64, a row per array):
#: the weight, the states, what a mixed16 row writes besides (else 0), the
#: size. The gradients' addresses come with each update.
W, V, V2, OUT, SIZE = range(5)


def written(op, scaled, mixed16=False):
    """Which of ``(w, g, *states)`` an op writes (g: scaled, not mixed16)."""
    if op == RESCALE:
        return () if mixed16 else (1,)
    states = tuple(range(2, 2 + len(STATE_NAMES[op])))
    return (0, 1) + states if scaled and not mixed16 else (0,) + states


def rows(n):
    """``n`` rows of settings: no clipping, no loss scale, the rest 0."""
    table = numpy.zeros((n, len(COLUMNS)))
    table[:, CLIP_LR], table[:, LOSS_SCALE] = -1.0, 1.0
    return table
