"""The CPU passes of chainer_lars.kernels against float64 NumPy written out.

Every test of the per-array passes runs with the NumPy fallback and, where
Numba is installed, with the compiled loops. The fallback's chunking is
exercised with a small CHUNK, so that sizes below, at and above it, and not
a multiple of it, all occur. The multi-tensor executor is checked against
the per-array passes, bit for bit.
"""

import builtins
import math
import os
import sys

import numpy
import pytest

from chainer import testing

import chainer_lars
from chainer_lars import kernels
from chainer_lars import multi_tensor as mt
from chainer_lars import ratio


def _numba():
    return pytest.importorskip('chainer_lars.jit_kernels')


@pytest.fixture(params=['numpy', 'numba'])
def cpu_backend(request, monkeypatch):
    if request.param == 'numba':
        monkeypatch.setattr(kernels, '_jit_module', _numba())
    else:
        monkeypatch.setattr(kernels, '_jit_module', None)
    assert kernels.backend() == request.param
    return request.param


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # The scratch buffers are keyed by CHUNK, so none is too short.
    monkeypatch.setattr(kernels, 'CHUNK', 16)


SIZES = [0, 1, 15, 16, 17, 48, 101, 4099]
DTYPES = [numpy.float16, numpy.float32, numpy.float64]
TOL = {numpy.float16: dict(atol=1e-3, rtol=1e-2),
       numpy.float32: dict(atol=1e-6, rtol=1e-5),
       numpy.float64: dict(atol=1e-12, rtol=1e-12)}


def _arrays(n, dtype, count, seed=0):
    rng = numpy.random.RandomState(seed + n)
    return [rng.uniform(-1, 1, n).astype(dtype) for _ in range(count)]


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('n', SIZES)
def test_sqnorms(dtype, n):
    w, g = _arrays(n, dtype, 2)
    w_sq, g_sq = kernels.sqnorms(w, g)
    assert isinstance(w_sq, float) and isinstance(g_sq, float)
    w64, g64 = w.astype(numpy.float64), g.astype(numpy.float64)
    testing.assert_allclose(w_sq, (w64 * w64).sum(), rtol=1e-12)
    testing.assert_allclose(g_sq, (g64 * g64).sum(), rtol=1e-12)


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
def test_sqnorms_accumulate_in_float64(dtype):
    # float16: the sum of squares 4e6 is far beyond 65504. float32 and
    # float64: each square, 9e40, is beyond float32's 3.4e38.
    value = 64.0 if dtype == numpy.float16 else 3e20
    w = numpy.full(1000, value, dtype)
    w_sq, _ = kernels.sqnorms(w, w)
    assert w_sq == pytest.approx(float(dtype(value)) ** 2 * 1000, rel=1e-12)


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
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


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
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


def _odd_layouts(dtype):
    """Makers of the same values in another byte order or layout."""
    swapped = numpy.dtype(dtype).newbyteorder('S')
    return {
        'byte-swapped': lambda a: a.astype(swapped),
        'strided': lambda a: numpy.repeat(a, 2)[::2],
        'fortran': lambda a: numpy.asfortranarray(
            numpy.stack([a, a], axis=1))[:, 0],
    }


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('layout', ['byte-swapped', 'strided', 'fortran'])
def test_other_layouts_give_the_native_result(dtype, layout):
    odd = _odd_layouts(dtype)[layout]
    w, g, v = _arrays(101, dtype, 3)
    ow, og, ov = odd(w), odd(g), odd(v)
    assert kernels.sqnorms(ow, og) == kernels.sqnorms(w, g)
    kernels.scale_add(g, 0.5, w, 0.25)
    kernels.scale_add(og, 0.5, ow, 0.25)
    assert og.astype(dtype).tobytes() == g.tobytes()
    kernels.momentum_step(w, g, v, 0.5, 0.125, 0.9, True)
    kernels.momentum_step(ow, og, ov, 0.5, 0.125, 0.9, True)
    assert ow.astype(dtype).tobytes() == w.tobytes()
    assert ov.astype(dtype).tobytes() == v.tobytes()


@pytest.mark.usefixtures('cpu_backend')
def test_mixed_dtypes_take_the_fallback():
    w = numpy.arange(40, dtype=numpy.float32).reshape(4, 10)[:, ::2]
    g = numpy.ones((4, 5), numpy.float64)
    kernels.scale_add(g, 0.5, w, 2.0)
    testing.assert_allclose(g, 0.5 + 2.0 * w)
    g[...] = 1
    v = numpy.zeros((4, 5), numpy.float32)
    w2 = w.copy()
    kernels.momentum_step(w, g, v, 1.0, 0.0, 0.9, False)
    testing.assert_allclose(v, g)
    testing.assert_allclose(w, w2 - g)


@pytest.mark.usefixtures('cpu_backend')
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
    assert numpy.geterr()['over'] == 'warn'


# -- the multi-tensor executor ---------------------------------------------

class _Group(object):

    """What the executor reads of a multi_tensor.Group, for one dtype."""

    def __init__(self, dtype, sizes, with_state, seed=0):
        rng = numpy.random.RandomState(seed)
        self.dtype = numpy.dtype(dtype)
        self.weights = [rng.standard_normal(n).astype(dtype) for n in sizes]
        self.grads = [rng.standard_normal(n).astype(dtype) for n in sizes]
        self.states = [(rng.standard_normal(n).astype(dtype),)
                       if with_state else () for n in sizes]
        self.tables = None

    def __len__(self):
        return len(self.weights)

    def copy(self):
        other = _Group.__new__(_Group)
        other.dtype = self.dtype
        other.weights = [w.copy() for w in self.weights]
        other.grads = [g.copy() for g in self.grads]
        other.states = [tuple(s.copy() for s in st) for st in self.states]
        other.tables = None
        return other


GROUP_SIZES = [0, 1, 7, 64, 300, 4099]


@pytest.fixture
def numba_passes(monkeypatch):
    """The per-array passes on the compiled loops, which the executor's
    result is compared with (also under CHAINER_LARS_NUMBA=0)."""
    jit = _numba()
    monkeypatch.setattr(kernels, '_jit_module', jit)
    return jit


def _lars_hyper(n, scales):
    hyper = numpy.zeros((n, mt.LARS_COLUMNS))
    rng = numpy.random.RandomState(1)
    hyper[:, mt.LARS_LR] = rng.uniform(0.1, 2.0, n)
    hyper[:, mt.LARS_MOMENTUM] = 0.9
    hyper[:, mt.LARS_WEIGHT_DECAY] = [0.0, 1e-3] * (n // 2) + [1e-3] * (n % 2)
    hyper[:, mt.LARS_TRUST_COEFFICIENT] = 0.02
    hyper[:, mt.LARS_EPS] = 1e-6
    hyper[:, mt.LARS_NESTEROV] = numpy.arange(n) % 3 == 0
    hyper[:, mt.LARS_ADAPT] = numpy.arange(n) % 4 != 1
    hyper[:, mt.LARS_LOSS_SCALE] = scales
    return hyper


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_executor_lars_step_equals_per_array_passes(dtype, numba_passes):
    executor = kernels.CpuExecutor(numba_passes)
    n = len(GROUP_SIZES)
    group = _Group(dtype, GROUP_SIZES, with_state=True)
    expected = group.copy()
    scales = [1.0, 3.7, 1.0, 2.0 ** 10, 3.7, 1.0]
    hyper = _lars_hyper(n, scales)
    executor.prepare(group)
    assert executor.lars_step(group, group.grads, hyper,
                              ratio.OPTIMIZER_FORM) == []
    obs = executor.observe(group)
    for k in range(n):
        w, g = expected.weights[k], expected.grads[k]
        v, = expected.states[k]
        h = hyper[k]
        if scales[k] != 1.0:
            g /= scales[k]  # as UpdateRule.update does
        r, w_norm, g_norm = 1.0, math.nan, math.nan
        if h[mt.LARS_ADAPT]:
            w_sq, g_sq = kernels.sqnorms(w, g)
            w_norm, g_norm = math.sqrt(w_sq), math.sqrt(g_sq)
            r = ratio.OPTIMIZER_FORM.ratio(
                w_norm, g_norm, h[mt.LARS_WEIGHT_DECAY], h[mt.LARS_EPS],
                h[mt.LARS_TRUST_COEFFICIENT])
        a = h[mt.LARS_LR] * r
        kernels.momentum_step(w, g, v, a, a * h[mt.LARS_WEIGHT_DECAY],
                              h[mt.LARS_MOMENTUM],
                              bool(h[mt.LARS_NESTEROV]))
        for got, want in ((group.weights[k], w), (group.grads[k], g),
                          (group.states[k][0], v)):
            assert got.tobytes() == want.tobytes(), k
        numpy.testing.assert_array_equal(obs[k], [r, w_norm, g_norm])


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('clip', [False, True])
def test_executor_hook_rescale_equals_per_array_passes(dtype, clip,
                                                       numba_passes):
    executor = kernels.CpuExecutor(numba_passes)
    n = len(GROUP_SIZES)
    group = _Group(dtype, GROUP_SIZES, with_state=False)
    expected = group.copy()
    hyper = numpy.zeros((n, mt.HOOK_COLUMNS))
    hyper[:, mt.HOOK_WEIGHT_DECAY] = [1e-3, 0.0] * (n // 2)
    hyper[:, mt.HOOK_ADAPT] = numpy.arange(n) % 4 != 1
    hyper[:, mt.HOOK_CLIP_LR] = 0.05 if clip else -1.0
    hyper[:, mt.HOOK_LOSS_SCALE] = [1.0, 8.0, 3.7, 1.0, 1.0, 8.0]
    form = ratio.hook_form(1e-2)
    executor.prepare(group)
    assert executor.hook_rescale(group, group.grads, hyper, form, 1e-9,
                                 0.5) == []
    obs = executor.observe(group)
    for k in range(n):
        w, g = expected.weights[k], expected.grads[k]
        h = hyper[k]
        if g.size == 0:
            assert numpy.isnan(obs[k]).all()
            continue
        scale = h[mt.HOOK_LOSS_SCALE]
        w_sq, g_sq = kernels.sqnorms(w, g)
        w_norm, g_norm = math.sqrt(w_sq), math.sqrt(g_sq) / scale
        r = 1.0
        if h[mt.HOOK_ADAPT]:
            r = form.ratio(w_norm, g_norm, h[mt.HOOK_WEIGHT_DECAY], 1e-9,
                           0.5, 0.05 if clip else None)
        kernels.scale_add(g, r, w, r * (scale * h[mt.HOOK_WEIGHT_DECAY]))
        assert group.grads[k].tobytes() == g.tobytes(), k
        numpy.testing.assert_array_equal(obs[k], [r, w_norm, g_norm])


def test_executor_rejects_gradients_it_cannot_take():
    executor = kernels.CpuExecutor(_numba())
    group = _Group(numpy.float32, [6, 6, 6, 6, 6], with_state=True)
    executor.prepare(group)
    before = [w.copy() for w in group.weights]
    grads = list(group.grads)
    grads[1] = None
    grads[2] = grads[2].astype(numpy.float64)
    grads[3] = numpy.repeat(grads[3], 2)[::2]  # strided
    grads[4] = grads[4][:5]  # another size
    hyper = _lars_hyper(5, 1.0)
    rejected = executor.lars_step(group, grads, hyper, ratio.OPTIMIZER_FORM)
    assert rejected == [1, 2, 3, 4]
    assert numpy.isnan(executor.observe(group)[1:]).all()
    assert group.weights[0].tobytes() != before[0].tobytes()
    for k in rejected:
        assert group.weights[k].tobytes() == before[k].tobytes()
    # A later update with gradients it can take takes them all.
    assert executor.lars_step(group, group.grads, hyper,
                              ratio.OPTIMIZER_FORM) == []


def test_executor_supports_only_native_contiguous_float32_and_float64():
    executor = kernels.CpuExecutor(_numba())
    a = numpy.zeros((3, 4), numpy.float32)
    assert executor.supports(a, a.copy())
    assert executor.supports(a.astype(numpy.float64))
    assert not executor.supports(a.astype(numpy.float16))
    assert not executor.supports(a.astype('>f4'))
    assert not executor.supports(a.T)
    assert not executor.supports(a, a.astype(numpy.float64))


def test_trust_ratio_is_compiled_from_the_host_function():
    jit = _numba()
    cases = [(w, g, wd, eps, thr, req, clip)
             for w in [0.0, 1e-3, 2.0] for g in [0.0, 1e-4, 3.0]
             for wd in [0.0, 0.1] for eps in [0.0, 1e-9]
             for thr in [0.0, 1e-2] for req in [False, True]
             for clip in [-1.0, 0.0, 0.05, 10.0]]
    for case in cases:
        assert jit.trust_ratio(*case) == ratio.trust_ratio(*case), case
    assert jit.trust_ratio.py_func is ratio.trust_ratio


# -- switching Numba off -------------------------------------------------

def test_numba_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(kernels, '_jit_module', kernels._UNRESOLVED)
    monkeypatch.setitem(os.environ, 'CHAINER_LARS_NUMBA', '0')
    assert kernels.backend() == 'numpy'
    assert kernels.cpu_executor() is None


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
