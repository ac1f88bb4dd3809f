"""Writes the snapshot files that tests/test_snapshots.py loads.

Run with the code whose snapshots must keep loading (the files here were
written at b8e13bc, before the engine rewrite), from the repository root:

    PYTHONPATH=. python tests/data/make_snapshots.py tests/data

For each case: the model and the optimizer after 3 updates
(``<case>.npz``, as Chainer's snapshot extension writes them) and the
weights after 3 more (``<case>_after.npz``).
"""

import os
import sys

import numpy

from chainer import optimizers
from chainer import serializers

import chainer_lars
from tests import lars_reference as ref


def _lars():
    return chainer_lars.LARS(lr=0.2, nesterov=True, weight_decay=1e-3,
                             exclude_from_weight_decay=['/b$'])


def _hooked():
    return optimizers.MomentumSGD(lr=0.05), chainer_lars.GradientLARS(
        weight_decay=1e-3)


#: case -> (dtype, optimizer and hook, use_fp32_update)
CASES = {
    'lars_float32': (numpy.float32, lambda: (_lars(), None), False),
    'lars_float16_fp32_update': (numpy.float16, lambda: (_lars(), None),
                                 True),
    'momentum_hook_float32': (numpy.float32, _hooked, False),
}


def setup(case):
    """A fresh model and optimizer of a case, set up."""
    dtype, make, fp32_update = CASES[case]
    model = ref.Net(dtype)
    ref.fill(model, 0)
    opt, hook = make()
    opt.setup(model)
    if hook is not None:
        opt.add_hook(hook)
    if fp32_update:
        opt.use_fp32_update()
    return model, opt


def train(case, model, opt, start, steps=3):
    for step in range(start, start + steps):
        x, t = ref.batch(step, dtype=CASES[case][0])
        opt.update(ref.loss_fn(model, x, t))


def main(out):
    for case in CASES:
        model, opt = setup(case)
        train(case, model, opt, 0)
        serializer = serializers.DictionarySerializer()
        model.serialize(serializer['model'])
        opt.serialize(serializer['optimizer'])
        numpy.savez_compressed(os.path.join(out, case + '.npz'),
                               **serializer.target)
        train(case, model, opt, 3)
        numpy.savez_compressed(
            os.path.join(out, case + '_after.npz'),
            **{path: p.array for path, p in model.namedparams()})


if __name__ == '__main__':
    main(sys.argv[1])
