"""Writes the pickles that tests/test_snapshots.py loads.

Run with the code whose pickles must keep loading (the files here were
written at 229bc30, before the lighter engine), from the repository root:

    PYTHONPATH=. python tests/data/make_pickles.py tests/data

For each case: ``pickle.dumps`` of the optimizer (with its model, rules,
hooks and state) after 3 updates (``<case>.pkl``), and the weights after
3 more updates of the original (``<case>_after.npz``).
"""

import os
import pickle
import sys

import numpy

from chainer import optimizers

import chainer_lars
from tests import lars_reference as ref


def _lars(multi_tensor=True):
    return chainer_lars.LARS(lr=0.2, nesterov=True, weight_decay=1e-3,
                             exclude_from_weight_decay=['/b$'],
                             multi_tensor=multi_tensor), None


def _lamb():
    return chainer_lars.LAMB(alpha=0.01, weight_decay_rate=1e-3,
                             exclude_from_layer_adaptation=['/b$']), None


def _hooked(multi_tensor=True):
    return optimizers.MomentumSGD(lr=0.05), chainer_lars.GradientLARS(
        weight_decay=1e-3, multi_tensor=multi_tensor)


#: case -> (dtype, optimizer and hook, use_fp32_update)
CASES = {
    'pickle_lars_float32': (numpy.float32, _lars, False),
    'pickle_lars_per_rule_float32': (numpy.float32, lambda: _lars(False),
                                     False),
    'pickle_lars_mixed16': (numpy.float16, _lars, True),
    'pickle_lamb_float32': (numpy.float32, _lamb, False),
    'pickle_lamb_mixed16': (numpy.float16, _lamb, True),
    'pickle_hook_float32': (numpy.float32, _hooked, False),
    'pickle_hook_per_array_float32': (numpy.float32,
                                      lambda: _hooked(False), False),
    'pickle_hook_float16': (numpy.float16, _hooked, False),
    'pickle_hook_mixed16': (numpy.float16, _hooked, True),
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
        opt.loss_scaling()
    return model, opt


def train(case, model, opt, start, steps=3):
    for step in range(start, start + steps):
        x, t = ref.batch(step, dtype=CASES[case][0])
        opt.update(ref.loss_fn(model, x, t))


def main(out):
    for case in CASES:
        model, opt = setup(case)
        train(case, model, opt, 0)
        with open(os.path.join(out, case + '.pkl'), 'wb') as f:
            pickle.dump(opt, f, protocol=4)
        train(case, model, opt, 3)
        numpy.savez_compressed(
            os.path.join(out, case + '_after.npz'),
            **{path: p.array for path, p in model.namedparams()})


if __name__ == '__main__':
    main(sys.argv[1])
