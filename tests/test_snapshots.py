"""Snapshots and pickles written by earlier versions load and continue the
same run.

The files in tests/data were written by tests/data/make_snapshots.py at
b8e13bc (before the engine rewrite): the model and optimizer after three
updates, and the weights after three more. Loaded into today's code, the
three more updates must give those weights, bit for bit.
"""

import os
import pickle

import numpy
import pytest

from chainer import serializers

from tests.data import make_pickles
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
    with numpy.load(os.path.join(DATA, case + '_after.npz')) as after:
        assert sorted(after.files) == sorted(p for p, _ in
                                             model.namedparams())
        for path, param in model.namedparams():
            assert param.array.tobytes() == after[path].tobytes(), path


@pytest.mark.parametrize('case', sorted(make_pickles.CASES))
def test_an_old_pickle_continues_the_run(case):
    """Pickles written at 229bc30 (tests/data/make_pickles.py), before the
    lighter engine: the optimizer, its model, rules, hooks and state load
    and the three more updates give the original's weights, bit for bit."""
    with open(os.path.join(DATA, case + '.pkl'), 'rb') as f:
        opt = pickle.load(f)
    assert opt.t == 3
    make_pickles.train(case, opt.target, opt, 3)
    with numpy.load(os.path.join(DATA, case + '_after.npz')) as after:
        params = dict(opt.target.namedparams())
        assert sorted(after.files) == sorted(params)
        for path, param in params.items():
            assert param.array.tobytes() == after[path].tobytes(), path
