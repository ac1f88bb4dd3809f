"""The CPU passes of chainer_lars.kernels against float64 NumPy written out.

Every test runs with the chunked NumPy passes and, where Numba is
installed, with the compiled ones. Chunking is exercised with a small
CHUNK so that sizes below, at and above it, and not a multiple of it, all
occur.
"""

import builtins
import os
import sys

import numpy
import pytest

from chainer import testing

import chainer_lars
from chainer_lars import kernels


@pytest.fixture(autouse=True, params=['numpy', 'numba'])
def cpu_backend(request, monkeypatch):
    if request.param == 'numba':
        jit_kernels = pytest.importorskip('chainer_lars.jit_kernels')
        monkeypatch.setattr(kernels, '_jit_module', jit_kernels)
    else:
        monkeypatch.setattr(kernels, '_jit_module', None)
    assert kernels.backend() == request.param
    return request.param


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(kernels, 'CHUNK', 16)
    # Scratch buffers are sized by CHUNK when first made; start afresh.
    monkeypatch.setattr(kernels._local, 'bufs', {}, raising=False)
    yield
    kernels._local.bufs = {}


SIZES = [0, 1, 15, 16, 17, 48, 101]
TOL = {numpy.float16: dict(atol=1e-3, rtol=1e-2),
       numpy.float32: dict(atol=1e-6, rtol=1e-5),
       numpy.float64: dict(atol=1e-12, rtol=1e-12)}


def _arrays(n, dtype, count, seed=0):
    rng = numpy.random.RandomState(seed + n)
    return [rng.uniform(-1, 1, n).astype(dtype) for _ in range(count)]


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
@pytest.mark.parametrize('n', SIZES)
def test_sqnorms(dtype, n):
    w, g = _arrays(n, dtype, 2)
    w_sq, g_sq = kernels.sqnorms(w, g)
    assert isinstance(w_sq, float) and isinstance(g_sq, float)
    w64, g64 = w.astype(numpy.float64), g.astype(numpy.float64)
    testing.assert_allclose(w_sq, (w64 * w64).sum(), rtol=1e-5)
    testing.assert_allclose(g_sq, (g64 * g64).sum(), rtol=1e-5)


def test_sqnorms_float16_accumulates_wider():
    # Sum of squares 4e6, far beyond float16's 65504.
    w = numpy.full(1000, 64.0, numpy.float16)
    assert kernels.sqnorms(w, w)[0] == 64.0 ** 2 * 1000


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
@pytest.mark.parametrize('n', SIZES)
@pytest.mark.parametrize('r,c', [(0.5, 0.25), (2.0, 0.0), (1.0, 0.0),
                                 (1.0, -3.0)])
def test_scale_add(dtype, n, r, c):
    w, g = _arrays(n, dtype, 2)
    expected = r * g.astype(numpy.float64) + c * w.astype(numpy.float64)
    w_before = w.copy()
    kernels.scale_add(g, r, w, c)
    testing.assert_allclose(g, expected, **TOL[dtype])
    numpy.testing.assert_array_equal(w, w_before)


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
@pytest.mark.parametrize('n', SIZES)
@pytest.mark.parametrize('c', [0.0, 0.25])
@pytest.mark.parametrize('r', [1.0, 0.5])
def test_rescale(dtype, n, c, r):
    w, g = _arrays(n, dtype, 2)
    w64, g64 = w.astype(numpy.float64), g.astype(numpy.float64)
    seen = []

    def ratio(w_sq, g_sq):
        seen.append((w_sq, g_sq))
        return r

    w_before = w.copy()
    result = kernels.rescale(g, w, c, ratio)
    assert len(seen) == 1 and result == seen[0]
    testing.assert_allclose(result[0], (w64 * w64).sum(), rtol=1e-5)
    testing.assert_allclose(result[1], (g64 * g64).sum(), rtol=1e-5)
    testing.assert_allclose(g, r * (g64 + c * w64), **TOL[dtype])
    numpy.testing.assert_array_equal(w, w_before)


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
@pytest.mark.parametrize('n', SIZES)
@pytest.mark.parametrize('b', [0.0, 0.125])
@pytest.mark.parametrize('nesterov', [False, True])
def test_momentum_step(dtype, n, b, nesterov):
    w, g, v = _arrays(n, dtype, 3)
    a, m = 0.5, 0.9
    w64, g64, v64 = (x.astype(numpy.float64) for x in (w, g, v))
    u = a * g64 + b * w64
    v_new = m * v64 + u
    w_new = w64 - (u + m * v_new if nesterov else v_new)
    g_before = g.copy()
    kernels.momentum_step(w, g, v, a, b, m, nesterov)
    testing.assert_allclose(v, v_new, **TOL[dtype])
    testing.assert_allclose(w, w_new, **TOL[dtype])
    numpy.testing.assert_array_equal(g, g_before)


def test_non_contiguous_and_mixed_dtypes_take_the_generic_path():
    w = numpy.arange(40, dtype=numpy.float32).reshape(4, 10)[:, ::2]
    g = numpy.ones((4, 5), numpy.float64)
    kernels.scale_add(g, 0.5, w, 2.0)
    testing.assert_allclose(g, 0.5 + 2.0 * w)
    g[...] = 1
    kernels.rescale(g, w, 2.0, lambda w_sq, g_sq: 0.5)
    testing.assert_allclose(g, 0.5 + w)
    g[...] = 1
    v = numpy.zeros((4, 5), numpy.float32)
    w2 = w.copy()
    kernels.momentum_step(w, g, v, 1.0, 0.0, 0.9, False)
    testing.assert_allclose(v, g)
    testing.assert_allclose(w, w2 - g)


def test_non_finite_values_pass_silently_and_stay_in_their_array():
    # Warnings are errors in this suite (setup.cfg).
    g = numpy.array([numpy.inf, -numpy.inf, numpy.nan, 1.0] * 10,
                    numpy.float32)
    w = numpy.ones_like(g)
    kernels.sqnorms(w, g)
    kernels.scale_add(g, 0.0, w, 1e38)
    assert numpy.isnan(g[2])
    big = numpy.full(40, 3e38, numpy.float32)
    kernels.scale_add(big, 10.0, w, 0.0)
    assert numpy.isinf(big).all()
    g = numpy.array([numpy.inf, -numpy.inf, numpy.nan, 1.0] * 10,
                    numpy.float32)
    v = numpy.zeros_like(g)
    kernels.momentum_step(w, g, v, 1.0, 0.0, 0.9, False)
    assert numpy.isnan(v[2]) and numpy.isinf(v[0]) and v[3] == 1.0
    # The error state is restored afterwards.
    assert numpy.geterr()['over'] == 'warn'


def test_numba_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(kernels, '_jit_module', kernels._UNRESOLVED)
    monkeypatch.setitem(os.environ, 'CHAINER_LARS_NUMBA', '0')
    assert kernels.backend() == 'numpy'


def test_missing_numba_means_numpy(monkeypatch):
    monkeypatch.setattr(kernels, '_jit_module', kernels._UNRESOLVED)
    monkeypatch.delenv('CHAINER_LARS_NUMBA', raising=False)
    # None in sys.modules makes the import raise ImportError, once the
    # package no longer holds the submodule from an earlier import.
    monkeypatch.setitem(sys.modules, 'chainer_lars.jit_kernels', None)
    monkeypatch.delattr(chainer_lars, 'jit_kernels', raising=False)
    assert kernels.backend() == 'numpy'


def test_broken_numba_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(kernels, '_jit_module', kernels._UNRESOLVED)
    monkeypatch.delenv('CHAINER_LARS_NUMBA', raising=False)
    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and 'jit_kernels' in fromlist:
            raise RuntimeError('cannot cache function')
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, '__import__', fake_import)
    with pytest.warns(RuntimeWarning, match='cannot cache function'):
        assert kernels.backend() == 'numpy'
