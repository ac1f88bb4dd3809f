"""The one settings layout, and the CUDA source's use of it."""

import re

import numpy

from chainer_lars import cuda
from chainer_lars import layout as L


def test_columns_are_named_once_and_numbered_in_order():
    assert len(set(L.COLUMNS)) == len(L.COLUMNS)
    for k, name in enumerate(L.COLUMNS):
        assert getattr(L, name.upper()) == k


def test_new_rows_clip_nothing_and_scale_nothing():
    rows = L.rows(3)
    assert rows.shape == (3, len(L.COLUMNS)) and rows.dtype == numpy.float64
    assert (rows[:, L.CLIP_LR] == -1).all()
    assert (rows[:, L.LOSS_SCALE] == 1).all()
    assert not rows[:, [L.LR, L.ADAPT, L.WEIGHT_DECAY]].any()


def test_the_cuda_source_takes_its_column_numbers_from_the_layout():
    for dtype in (numpy.float16, numpy.float32, numpy.float64):
        source = cuda.source(dtype)
        defines = dict(re.findall(r'#define LARS_([A-Z0-9_]+) (\d+)', source))
        for k, name in enumerate(L.COLUMNS):
            assert defines[name.upper()] == str(k)
        assert defines['COLUMNS'] == str(len(L.COLUMNS))
        # Every settings column the kernels read is one of the layout's.
        read = set(re.findall(r's\[LARS_([A-Z0-9_]+)\]', source))
        assert read and read <= {name.upper() for name in L.COLUMNS}
