"""The CPU executor against float64 NumPy written out.

Every test runs the engine on CPU groups, with the NumPy passes and, where
Numba is installed, with the compiled loops. A group of many arrays is
checked against groups of one, bit for bit.
"""

import builtins
import math
import os
import re
import sys

import numpy
import pytest

import chainer
from chainer import testing

import chainer_lars
from chainer_lars import cpu
from chainer_lars import engine
from chainer_lars import layout as L
from chainer_lars import ratio
from tests import lamb_reference as lamb_ref
from tests import lars_reference as ref
from tests import numba_util


def _numba():
    return numba_util.require_numba(in_use=False)


@pytest.fixture(params=['numpy', 'numba'])
def cpu_backend(request, monkeypatch):
    if request.param == 'numba':
        monkeypatch.setattr(cpu, '_jit_module', _numba())
    else:
        monkeypatch.setattr(cpu, '_jit_module', None)
    assert cpu.backend() == request.param
    return request.param


SIZES = [0, 1, 15, 16, 17, 48, 101, 4099]
DTYPES = [numpy.float16, numpy.float32, numpy.float64]
TOL = {numpy.float16: dict(atol=1e-3, rtol=1e-2),
       numpy.float32: dict(atol=1e-6, rtol=1e-5),
       numpy.float64: dict(atol=1e-12, rtol=1e-12)}
CPU = chainer.get_device('@numpy')


def _arrays(n, dtype, count, seed=0):
    rng = numpy.random.RandomState(seed + n)
    return [rng.uniform(-1, 1, n).astype(dtype) for _ in range(count)]


def _row(**settings):
    row = L.rows(1)[0]
    for name, value in settings.items():
        row[L.COLUMNS.index(name)] = value
    return row


def _plan(op, weights, states=None, rows=None):
    """A plan of one group of ``weights`` (and ``states``) with ``rows``."""
    plan = engine.Plan(weights, lambda arrays: ([arrays], ()))
    for k, w in enumerate(weights):
        plan.add(None, CPU, op, '/p{}'.format(k), None, None, w,
                 () if states is None else (states[k],))
    group, = plan.finish().groups
    if rows is not None:
        engine.settings(group, numpy.asarray(rows).tobytes(),
                        lambda group, key: group.rows.__setitem__(
                            Ellipsis, rows))
    return plan


def _run(op, row, w, g, v=None):
    """One array through the engine; returns what it observed."""
    plan = _plan(op, [w], None if v is None else [v], row)
    assert engine.update(plan, [[g]]) == [[]]
    return engine.observed(plan.groups[0].last)[0]


def _norms(w, g, scale=1.0):
    w64, g64 = w.astype(numpy.float64), g.astype(numpy.float64)
    return math.sqrt((w64 * w64).sum()), math.sqrt((g64 * g64).sum()) / scale


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('n', SIZES)
@pytest.mark.parametrize('settings', [
    dict(adapt=1, weight_decay=0.25, eps=1e-9, trust_coefficient=0.5),
    dict(adapt=0, weight_decay=0.25, loss_scale=8.0),
    dict(adapt=1, weight_decay=0.0, trust_coefficient=2.0, loss_scale=3.7,
         threshold=1e3),
    dict(adapt=1, trust_coefficient=1.0, clip_lr=0.05, eps=1e-9),
])
def test_rescale(dtype, n, settings):
    w, g = _arrays(n, dtype, 2)
    row = _row(**settings)
    s, wd = row[L.LOSS_SCALE], row[L.WEIGHT_DECAY]
    w_norm, g_norm = _norms(w, g, s)
    r = 1.0
    if row[L.ADAPT]:
        r = ref.trust_ratio(w_norm, g_norm, wd, row[L.EPS],
                            row[L.TRUST_COEFFICIENT], row[L.THRESHOLD],
                            False, row[L.CLIP_LR])
    expected = r * g.astype(numpy.float64) + r * s * wd * w
    w_before = w.copy()
    obs = _run(L.RESCALE, row, w, g)
    testing.assert_allclose(g, expected, **TOL[dtype])
    numpy.testing.assert_array_equal(w, w_before)
    if n == 0:
        assert numpy.isnan(obs).all()  # the hook reports no empty array
    else:
        testing.assert_allclose(obs, [r, w_norm, g_norm], rtol=1e-12)


def _half_ulp(x):
    """Half the float16 spacing at ``x``: the error of its rounding."""
    return numpy.spacing(abs(x).astype(numpy.float16)).astype(
        numpy.float64) / 2


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('n', SIZES)
@pytest.mark.parametrize('wd', [0.0, 0.125])
@pytest.mark.parametrize('nesterov', [False, True])
@pytest.mark.parametrize('adapt', [0, 1])
def test_momentum_step(dtype, n, wd, nesterov, adapt):
    w, g, v = _arrays(n, dtype, 3)
    row = _row(lr=0.5, momentum=0.9, nesterov=nesterov, weight_decay=wd,
               trust_coefficient=0.02, eps=1e-6, require_grad=1,
               adapt=adapt)
    w64, g64, v64 = (x.astype(numpy.float64) for x in (w, g, v))
    w_norm, g_norm = _norms(w, g)
    r = ref.trust_ratio(w_norm, g_norm, wd, 1e-6, 0.02, 0.0,
                        True) if adapt else 1.0
    u = 0.5 * r * (g64 + wd * w64)
    v_new = 0.9 * v64 + u
    w_new = w64 - (u + 0.9 * v_new if nesterov else v_new)
    g_before = g.copy()
    obs = _run(L.STEP, row, w, g, v)
    testing.assert_allclose(v, v_new, **TOL[dtype])
    testing.assert_allclose(w, w_new, **TOL[dtype])
    if dtype == numpy.float16:
        # The adapted u, 1e-2 of w, is within rtol=1e-2: the step of w and
        # v, each rounded once to float16 (half an ulp; the NumPy pass
        # steps w from v as stored) from float32 sums (1e-6 of the terms).
        terms = abs(0.9 * v64) + abs(u)
        step, want = w - w64, w_new - w64
        assert (abs(step - want) <= _half_ulp(w_new) + _half_ulp(v_new)
                + 1e-6 * (abs(w64) + terms)).all()
        assert (abs(v - v_new) <= _half_ulp(v_new) + 1e-6 * terms).all()
    numpy.testing.assert_array_equal(g, g_before)
    expected = [r, w_norm, g_norm] if adapt else [1.0, math.nan, math.nan]
    testing.assert_allclose(obs, expected, rtol=1e-12)


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
def test_step_divides_the_loss_scale_out_of_the_gradient(dtype):
    w, g, v = _arrays(48, dtype, 3)
    scaled = (g * dtype(8)).astype(dtype)
    row = _row(lr=0.5, momentum=0.9, adapt=1, trust_coefficient=0.02,
               require_grad=1, loss_scale=8.0)
    _run(L.STEP, row, w, scaled, v)
    numpy.testing.assert_array_equal(scaled, (g * dtype(8)) / dtype(8))


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', DTYPES)
def test_norms_accumulate_in_float64(dtype):
    # float16: the sum of squares 4e6 is far beyond 65504. float32 and
    # float64: each square, 9e40, is beyond float32's 3.4e38.
    # The gradient is the weight: both norms, and the ratio they give.
    value = 64.0 if dtype == numpy.float16 else 3e20
    w = numpy.full(1000, value, dtype)
    obs = _run(L.RESCALE, _row(adapt=1, trust_coefficient=0.5), w, w.copy())
    norm = float(dtype(value)) * 1000 ** 0.5
    r = ref.trust_ratio(norm, norm, 0.0, 0.0, 0.5)  # 0.5
    numpy.testing.assert_allclose(obs[:3], [r, norm, norm], rtol=1e-12)


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('face, w_scale, g_scale, wd', [
    ('hook', 1.0, 1e-43, 0.0), ('hook', 1.0, 1e-43, 1e-43),
    ('LARS', 1.0, 1e-43, 0.0), ('hook', 1e30, 1e-12, 0.0),
    ('LARS', 1e30, 1e-12, 0.0), ('LAMB', 1e30, 1e-20, 0.0)])
def test_a_step_past_float32s_range_is_taken_in_float64(face, w_scale,
                                                        g_scale, wd):
    """SPEC 4: finite inputs, a finite step. ``lr * r`` (the hook: ``r``)
    can pass float32's 3.4e38 where its product with ``g`` does not: a
    subnormal gradient with eps=0 and no weight decay (LARS's defaults
    for an excluded array), or weights 1e42 times the gradient. The
    hook's weight decay of 1e-43 makes ``r wd w`` as large as ``r g``."""
    w = (numpy.linspace(1, 2, 16) * w_scale).astype(numpy.float32)
    g = (numpy.linspace(-1, 3, 16) * g_scale).astype(numpy.float32)
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(w.copy())
    link.p.grad = g.copy()
    opt = {'hook': lambda: chainer.optimizers.SGD(lr=1.0),
           'LARS': lambda: chainer_lars.LARS(exclude_from_weight_decay=['p']),
           'LAMB': chainer_lars.LAMB}[face]()
    opt.setup(link)
    if face == 'hook':
        opt.add_hook(chainer_lars.GradientLARS(eps=0.0, weight_decay=wd))
    opt.update()
    if face == 'hook':
        testing.assert_allclose(link.p.grad, ref.hook_gradient(
            w, g, eps=0.0, weight_decay=wd), rtol=1e-6)
        return
    expected = (ref.lars_step(w, g, 0.0, 2.0, 0.9, 0.0, 1e-3, 0.0)[0]
                if face == 'LARS' else
                lamb_ref.lamb_step(w, g, 0.0, 0.0, 1, dtype=numpy.float32)[0])
    w64 = w.astype(numpy.float64)
    testing.assert_allclose(link.p.array - w64, expected - w64, rtol=1e-5,
                            atol=float(numpy.spacing(w).max()))


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('face', ['hook', 'LARS'])
def test_a_mixed16_step_past_float32s_range_is_taken_in_float64(face):
    """The same in a mixed16 row (float32 master, float16 gradient divided by
    the loss scale on the fly), from the second update (the first makes the
    master): a static loss scale of 2^120 makes ``g / s`` tiny. The hook's
    weight decay of 1e-40 makes ``r wd w`` as large as ``r g / s``."""
    s, wd = 2.0 ** 120, 1e-40
    w = numpy.linspace(1, 2, 16).astype(numpy.float16)
    g = (numpy.linspace(-1, 3, 16) * 1e-3).astype(numpy.float16)
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(w.copy())
    opt = chainer.optimizers.SGD(lr=1.0) if face == 'hook' else (
        chainer_lars.LARS(trust_coefficient=1.0,
                          exclude_from_weight_decay=['p']))
    opt.setup(link)
    link.p.update_rule.use_fp32_update()
    opt.loss_scaling(scale=s)
    if face == 'hook':
        opt.add_hook(chainer_lars.GradientLARS(eps=0.0, weight_decay=wd))
    for lr in (0.0, opt.lr):  # the first update steps nothing
        opt.lr = lr
        link.p.grad, link.p._loss_scale = g.copy(), s
        opt.update()
    w64, g64 = w.astype(numpy.float64), g.astype(numpy.float32) / (
        numpy.float32(s))  # as Chainer's fp32 update divides it
    expected = (w64 - ref.hook_gradient(w64, g64, eps=0.0, weight_decay=wd)
                if face == 'hook' else
                ref.lars_step(w64, g64, 0.0, 2.0, 0.9, 0.0, 1.0, 0.0)[0])
    master = link.p.update_rule._fp32_param.array
    testing.assert_allclose(master, expected, rtol=1e-6, atol=1e-6)
    numpy.testing.assert_array_equal(link.p.array, master.astype('e'))


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
@pytest.mark.parametrize('which', ['all', 'grad'])
def test_other_layouts_give_the_native_result(dtype, layout, which):
    odd = _odd_layouts(dtype)[layout]
    w, g, v = _arrays(101, dtype, 3)
    ow, og, ov = (odd(a) if which == 'all' or a is g else a.copy()
                  for a in (w, g, v))
    row = _row(lr=0.5, momentum=0.9, nesterov=1, weight_decay=0.25,
               trust_coefficient=0.02, adapt=1, loss_scale=2.0)
    for op in (L.RESCALE, L.STEP):
        expected = _run(op, row, w, g, v if op == L.STEP else None)
        got = _run(op, row, ow, og, ov if op == L.STEP else None)
        numpy.testing.assert_array_equal(got, expected)
        for a, o in ((w, ow), (g, og), (v, ov)):
            assert o.astype(dtype).tobytes() == a.tobytes()


@pytest.mark.usefixtures('cpu_backend')
def test_mixed_dtypes_take_the_numpy_passes():
    w = numpy.arange(40, dtype=numpy.float32).reshape(4, 10)[:, ::2]
    g = numpy.ones((4, 5), numpy.float64)
    _run(L.RESCALE, _row(weight_decay=2.0), w, g)
    testing.assert_allclose(g, 1 + 2.0 * w)
    g[...] = 1
    v = numpy.zeros((4, 5), numpy.float32)
    w2 = w.copy()
    _run(L.STEP, _row(lr=1.0, momentum=0.9), w, g, v)
    testing.assert_allclose(v, g)
    testing.assert_allclose(w, w2 - g)


@pytest.mark.usefixtures('cpu_backend')
def test_non_finite_values_pass_silently_and_stay_in_their_array():
    # Warnings are errors in this suite (setup.cfg).
    bad = [numpy.inf, -numpy.inf, numpy.nan, 1.0] * 10
    g = numpy.array(bad, numpy.float32)
    w = numpy.ones_like(g)
    other = numpy.ones_like(g)
    plan = _plan(L.RESCALE, [w, other.copy()], rows=numpy.stack(
        [_row(adapt=1, trust_coefficient=1.0)] * 2))
    engine.update(plan, [[g, other]])
    # ||g|| is NaN, so r = 1: the values stay where they are.
    assert numpy.isnan(g[2::4]).all() and numpy.isinf(g[0::4]).all()
    assert (other != 0).all() and numpy.isfinite(other).all()
    g = numpy.array(bad, numpy.float32)
    v = numpy.zeros_like(g)
    _run(L.STEP, _row(lr=1.0, momentum=0.9), w, g, v)
    assert numpy.isnan(v[2]) and numpy.isinf(v[0]) and v[3] == 1.0
    assert numpy.geterr()['over'] == 'warn'


# -- a group against groups of one ------------------------------------------

GROUP_SIZES = [0, 1, 7, 64, 300, 4099]


def _rows(n, op, clip=False):
    rng = numpy.random.RandomState(1)
    rows = L.rows(n)
    rows[:, L.LR] = rng.uniform(0.1, 2.0, n)
    rows[:, L.MOMENTUM] = 0.9
    rows[:, L.NESTEROV] = numpy.arange(n) % 3 == 0
    rows[:, L.WEIGHT_DECAY] = [0.0, 1e-3] * (n // 2) + [1e-3] * (n % 2)
    rows[:, L.TRUST_COEFFICIENT] = 0.02
    rows[:, L.EPS] = 1e-6
    rows[:, L.ADAPT] = numpy.arange(n) % 4 != 1
    rows[:, L.LOSS_SCALE] = [1.0, 3.7, 1.0, 2.0 ** 10, 3.7, 1.0][:n]
    if op == L.STEP:
        rows[:, L.REQUIRE_GRAD] = 1.0
    else:
        rows[:, L.THRESHOLD] = 1e-2
        rows[:, L.CLIP_LR] = 0.05 if clip else -1.0
    return rows


@pytest.mark.usefixtures('cpu_backend')
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
@pytest.mark.parametrize('op, clip', [(L.STEP, False), (L.RESCALE, False),
                                      (L.RESCALE, True)])
def test_a_group_equals_groups_of_one(dtype, op, clip):
    rng = numpy.random.RandomState(0)
    n = len(GROUP_SIZES)
    arrays = [[rng.standard_normal(k).astype(dtype) for k in GROUP_SIZES]
              for _ in range(3)]
    copies = [[a.copy() for a in x] for x in arrays]
    rows = _rows(n, op, clip)
    states = arrays[2] if op == L.STEP else None
    plan = _plan(op, arrays[0], states, rows)
    assert engine.update(plan, [arrays[1]]) == [[]]
    obs = engine.observed(plan.groups[0].last)
    for k in range(n):
        one = _run(op, rows[k], copies[0][k], copies[1][k],
                   copies[2][k] if op == L.STEP else None)
        numpy.testing.assert_array_equal(obs[k], one)
        for x, y in zip(arrays, copies):
            assert x[k].tobytes() == y[k].tobytes(), k


def test_the_executor_takes_what_it_can_and_the_engine_the_rest():
    numba_util.require_numba()  # the compiled loop's table takes them
    rng = numpy.random.RandomState(0)
    weights = [rng.standard_normal(6).astype(numpy.float32)
               for _ in range(5)]
    grads = [rng.standard_normal(6).astype(numpy.float32) for _ in range(5)]
    plan = _plan(L.STEP, weights, [numpy.zeros(6, numpy.float32)
                                   for _ in range(5)], _rows(5, L.STEP))
    group, = plan.groups
    before = [w.copy() for w in weights]
    grads[1] = None
    grads[2] = grads[2].astype(numpy.float64)  # the NumPy passes take it
    grads[3] = numpy.repeat(grads[3], 2)[::2]  # strided: a copy is taken
    grads[4] = grads[4][:5]  # another size: nobody takes it
    (gptr,), missing = group.executor.take(plan, [group], [grads])
    assert missing == 4
    assert numpy.flatnonzero(gptr == 0).tolist() == [1, 2, 3, 4]
    assert gptr[0] == grads[0].ctypes.data
    # The engine refuses it as NumPy would, before anything moves.
    moved = [w.copy() for w in weights]
    with pytest.raises(ValueError, match=re.escape(
            '/p4: the gradient has shape (5,) but the weight (6,)')):
        engine.update(plan, [grads])
    assert all(w.tobytes() == m.tobytes() for w, m in zip(weights, moved))
    grads[4] = None
    assert engine.update(plan, [grads]) == [[1, 4]]
    assert list(group.last.copies) == [3]
    observed = engine.observe(group.last)
    assert sorted(observed) == ['/p0', '/p2', '/p3']
    for k in (1, 4):
        assert weights[k].tobytes() == before[k].tobytes()
    for k in (0, 2, 3):
        assert weights[k].tobytes() != before[k].tobytes()


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
    monkeypatch.setattr(cpu, '_jit_module', cpu._UNRESOLVED)
    monkeypatch.setitem(os.environ, 'CHAINER_LARS_NUMBA', '0')
    assert cpu.backend() == 'numpy'


def test_missing_numba_means_numpy(monkeypatch):
    monkeypatch.setattr(cpu, '_jit_module', cpu._UNRESOLVED)
    monkeypatch.delenv('CHAINER_LARS_NUMBA', raising=False)
    # None in sys.modules makes the import raise ImportError, once the
    # package no longer holds the submodule from an earlier import.
    monkeypatch.setitem(sys.modules, 'chainer_lars._numba', None)
    monkeypatch.delattr(chainer_lars, '_numba', raising=False)
    assert cpu.backend() == 'numpy'


def test_broken_numba_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(cpu, '_jit_module', cpu._UNRESOLVED)
    monkeypatch.delenv('CHAINER_LARS_NUMBA', raising=False)
    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and '_numba' in fromlist:
            raise RuntimeError('cannot cache function')
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, '__import__', fake_import)
    with pytest.warns(RuntimeWarning, match='cannot cache function'):
        assert cpu.backend() == 'numpy'


@pytest.mark.parametrize('require', ['1', ''])
@pytest.mark.parametrize('missing', ['off', 'not importable'])
def test_tests_of_the_compiled_loops_fail_where_numba_is_required(
        monkeypatch, require, missing):
    """tests/numba_util.py: without the compiled loops their tests skip,
    or fail with CHAINER_LARS_REQUIRE_NUMBA=1 (.ci/run sets it)."""
    monkeypatch.setenv('CHAINER_LARS_REQUIRE_NUMBA', require)
    monkeypatch.setattr(cpu, '_jit_module', None)  # the NumPy passes
    if missing == 'not importable':
        monkeypatch.setitem(sys.modules, 'chainer_lars._numba', None)
        monkeypatch.delattr(chainer_lars, '_numba', raising=False)
    expected = pytest.fail.Exception if require else pytest.skip.Exception
    with pytest.raises(expected, match=(
            'CHAINER_LARS_REQUIRE_NUMBA=1 but ' if require else '^')
            + '(Numba does not import|the library runs the NumPy passes)'):
        numba_util.require_numba()
    if missing == 'off':  # a test that installs the module itself
        assert numba_util.require_numba(in_use=False).__name__ == (
            'chainer_lars._numba')


def test_float16_conversions_are_numpys():
    """The compiled loop's float16 loads and stores (the processor's
    conversions, F16C) convert as NumPy does: every float16, the midpoints
    between neighbours (ties to even) and the values next to them, the
    overflow to infinity (NaN payloads may differ: the processor quiets
    them)."""
    jit = _numba()
    import numba

    @numba.njit
    def widen(bits, out):
        for i in range(bits.size):
            out[i] = jit.load(bits, i)

    @numba.njit
    def narrow(x, bits):
        for i in range(x.size):
            jit.store(bits, i, x[i])

    bits = numpy.arange(1 << 16, dtype=numpy.uint16)
    wide = numpy.empty(bits.size, numpy.float32)
    widen(bits, wide)
    expected = bits.view(numpy.float16).astype(numpy.float32)
    finite = numpy.isfinite(expected)
    numpy.testing.assert_array_equal(wide[finite], expected[finite])
    exact = numpy.sort(expected[finite])
    mid = ((exact[:-1].astype(numpy.float64) + exact[1:]) / 2).astype(
        numpy.float32)
    values = numpy.concatenate([
        exact, mid, numpy.nextafter(mid, numpy.float32(numpy.inf)),
        numpy.nextafter(mid, numpy.float32(-numpy.inf)),
        numpy.float32([65519.996, 65520.0, -65520.0, 1e30, numpy.inf])])
    narrowed = numpy.empty(values.size, numpy.uint16)
    narrow(values, narrowed)
    with numpy.errstate(over='ignore'):
        numpy.testing.assert_array_equal(
            narrowed, values.astype(numpy.float16).view(numpy.uint16))


def test_the_stamps_shape_hash_tells_shapes_of_one_size_apart():
    """The stamps hold a hash of the shape (besides the size): a reshape in
    place changes it, and a gradient is taken only where its hash is its
    weight's. Every shape of up to 5 dimensions and 64 elements, and some
    empty ones, hash apart: among them the pairs that earlier hashes mixed
    up, (1, 2P) and (2, P) (a linear hash of base P = 1000003), () and
    (1,), (3, 1, 7) and (3, 7) (a hash seeded with the number of
    dimensions, which a first dimension equal to it cancelled); one shape
    in two arrays hashes alike."""
    import itertools
    from chainer_lars import _numba as jit
    if not jit.STAMPS:
        pytest.skip('the stamps do not read this NumPy')
    p = 1000003
    shapes = {(), (0,), (0, 4), (4, 0), (0, 0), (2, 0, 3), (1, 2 * p),
              (2, p), (6 * p,), (2, 3 * p), (1,) * 32}
    for n in range(1, 65):
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        for ndim in range(1, 6):
            shapes.update(dims for dims in itertools.product(
                divisors, repeat=ndim) if math.prod(dims) == n)
    shapes = sorted(shapes)
    arrays = [numpy.lib.stride_tricks.as_strided(
        numpy.zeros(1, 'f'), shape, (0,) * len(shape)) for shape in shapes]
    arrays.append(numpy.zeros((3, 1, 7), 'f'))  # (3, 1, 7) again
    held = numpy.zeros((len(arrays), jit.STAMPED + jit.STAMP), numpy.int64)
    held[:, jit.ID] = list(map(id, arrays))
    jit.stamp(held, id(numpy.ndarray))
    hashes = held[:, jit.STAMPED + jit.SHAPE].tolist()
    assert len(set(hashes[:-1])) == len(shapes) > 6000
    assert hashes[-1] == hashes[shapes.index((3, 1, 7))]
    assert held[:, jit.STAMPED + jit.SIZE].tolist() == [
        a.size for a in arrays]
