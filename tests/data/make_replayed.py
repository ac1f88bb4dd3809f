"""Writes ``<case>_replayed.npz``: the weights after three updates of
seeded gradients, replayed on the optimizers that make_snapshots.py and
make_pickles.py wrote, loaded by the code that wrote them.

``<case>_after.npz`` holds the weights after three more *training*
updates; their gradients come through Chainer's forward and backward
passes, whose BLAS kernels round differently on another CPU (AVX-512
against AVX2: a few units in the last place). A replay sets the
gradients itself, so the weights after it are the same on every machine
and tests/test_snapshots.py compares them bit for bit. Run with the code
of each set of files first on the path (from the repository root; a
folder that holds only that commit's ``chainer_lars``)::

    PYTHONPATH=<b8e13bc>:. python tests/data/make_replayed.py \
        snapshots tests/data
    PYTHONPATH=<229bc30>:. python tests/data/make_replayed.py \
        pickles tests/data

The files here were written so, at b8e13bc and 229bc30.
"""

import os
import pickle
import sys

import numpy

from chainer import serializers

from tests.data import make_pickles
from tests.data import make_snapshots


DATA = os.path.dirname(os.path.abspath(__file__))


def load(case, folder=DATA):
    """The optimizer (set up on its model) that a case's file holds."""
    if case in make_pickles.CASES:
        with open(os.path.join(folder, case + '.pkl'), 'rb') as f:
            return pickle.load(f)
    model, opt = make_snapshots.setup(case)
    with numpy.load(os.path.join(folder, case + '.npz')) as npz:
        serializers.NpzDeserializer(npz, path='model/').load(model)
        serializers.NpzDeserializer(npz, path='optimizer/').load(opt)
    return opt


def replay(opt, steps=range(3, 6)):
    """Updates ``opt`` with seeded gradients (times its loss scale, as
    backward leaves them), one set per step."""
    for step in steps:
        rng = numpy.random.RandomState(1000 + step)
        scale = getattr(opt, '_loss_scale', None) or 1.0
        for _, param in sorted(opt.target.namedparams()):
            param.grad = (rng.standard_normal(param.shape) * 0.1
                          * scale).astype(param.dtype)
        opt.update()


def weights(opt):
    return {path: p.array for path, p in opt.target.namedparams()}


def main(which, out):
    cases = {'snapshots': make_snapshots.CASES,
             'pickles': make_pickles.CASES}[which]
    for case in sorted(cases):
        opt = load(case)
        replay(opt)
        numpy.savez_compressed(os.path.join(out, case + '_replayed.npz'),
                               **weights(opt))


if __name__ == '__main__':
    main(*sys.argv[1:])
