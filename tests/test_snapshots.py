"""Snapshots and pickles written by earlier versions load and continue the
same run.

The files in tests/data were written by tests/data/make_snapshots.py at
b8e13bc (before the engine rewrite) and make_pickles.py at 229bc30
(before the lighter engine): the model and optimizer after three updates,
and the weights after three more. Loaded into today's code, three more
updates of seeded gradients must give the weights that the writing code
gave (make_replayed.py), bit for bit on every machine; three more
training updates, those of the original run, to the rounding of the
gradients: Chainer's forward and backward passes round differently on
another CPU (BLAS kernels for AVX-512 against AVX2).
"""

import os
import pickle

import numpy
import pytest

from chainer import serializers

from tests.data import make_pickles
from tests.data import make_replayed
from tests.data import make_snapshots


DATA = os.path.join(os.path.dirname(__file__), 'data')


@pytest.mark.parametrize('case', sorted(make_snapshots.CASES))
def test_an_old_snapshot_continues_the_run(case):
    model, opt = make_snapshots.setup(case)
    with numpy.load(os.path.join(DATA, case + '.npz')) as npz:
        if 'fp32' in case:
            assert any(k.endswith('/fp32_param') for k in npz.files)
        serializers.NpzDeserializer(npz, path='model/').load(model)
        serializers.NpzDeserializer(npz, path='optimizer/').load(opt)
    assert opt.t == 3
    make_snapshots.train(case, model, opt, 3)
    _same(opt, case + '_after', maxulp=8)


@pytest.mark.parametrize('case', sorted(make_pickles.CASES))
def test_an_old_pickle_continues_the_run(case):
    """Pickles written at 229bc30 (tests/data/make_pickles.py), before the
    lighter engine: the optimizer, its model, rules, hooks and state load
    and the three more updates give the original's weights, bit for bit."""
    with open(os.path.join(DATA, case + '.pkl'), 'rb') as f:
        opt = pickle.load(f)
    assert opt.t == 3
    make_pickles.train(case, opt.target, opt, 3)
    _same(opt, case + '_after', maxulp=8)


@pytest.mark.parametrize('case', sorted(make_snapshots.CASES)
                         + sorted(make_pickles.CASES))
def test_an_old_file_continues_seeded_updates_bit_for_bit(case):
    """No forward or backward pass: the same bits on every machine."""
    opt = make_replayed.load(case, DATA)
    assert opt.t == 3
    make_replayed.replay(opt)
    _same(opt, case + '_replayed')


def _same(opt, name, maxulp=0):
    """The weights are those of ``name``.npz (bit for bit, or within
    ``maxulp`` units in the last place)."""
    with numpy.load(os.path.join(DATA, name + '.npz')) as expected:
        params = dict(opt.target.namedparams())
        assert sorted(expected.files) == sorted(params)
        for path, param in params.items():
            if maxulp:
                numpy.testing.assert_array_max_ulp(
                    param.array, expected[path], maxulp)
            else:
                assert (param.array.tobytes()
                        == expected[path].tobytes()), path
