"""The GPU path against the CPU path: kernels, launch code, update rules.

Every test runs twice: on the emulated device (the kernels' CUDA source
compiled for the CPU by :mod:`chainer_lars.testing.cuda_emulator`, with
Chainer taking :mod:`chainer_lars.testing.emulated_cupy` for CuPy), in the
default suite; and on a real GPU (marked ``gpu``, skipped without one; run
by ``benchmarks/gpu_check.sh``). The CPU path is checked against float64
NumPy written out by hand in the other test modules; here the GPU path must
equal it within the rounding of each dtype.
"""

import functools
import gc
import io
import warnings
import weakref

import numpy
import pytest

import chainer
from chainer.backends import cuda
from chainer import optimizers
from chainer import serializers
from chainer import testing

import chainer_lars
from chainer_lars import cuda as cuda_kernels
from chainer_lars.testing import emulated_cupy
from tests import lars_reference as ref
from tests import optimizer_of


THREADS, CHUNK = cuda_kernels.THREADS, cuda_kernels.CHUNK
#: Sizes at the edges of a block's threads and of a block's chunk, and an
#: array of many chunks (past 128 blocks of 4 elements a thread).
SIZES = [0, 1, THREADS - 1, THREADS, THREADS + 1, CHUNK - 1, CHUNK,
         CHUNK + 1, 128 * THREADS * 4 + 1]
#: Many arrays of mixed sizes, for the tests of every option (the large
#: arrays of SIZES cost seconds in the emulator).
MIXED = [0, 1, THREADS + 1, CHUNK + 1] + list(
    numpy.random.RandomState(0).randint(1, 3 * THREADS, 10))
#: The relative tolerance of each dtype's rounding, for one update.
RTOL = {numpy.float16: 4e-3, numpy.float32: 2e-6, numpy.float64: 1e-13}
DTYPES = [numpy.float16, numpy.float32, numpy.float64]


@pytest.fixture(params=['emulated',
                        pytest.param('cuda', marks=pytest.mark.gpu)])
def gpu(request, monkeypatch):
    """The device under test; records our kernels' launches by name."""
    # Chainer caches its elementwise kernels on the update rule classes.
    monkeypatch.setattr(optimizers.momentum_sgd.MomentumSGDRule, '_kernel',
                        None)
    launches = []
    original = cuda_kernels._kernels

    def counted(kernel, name):
        def launch(*args, **kwargs):
            launches.append(name)
            return kernel(*args, **kwargs)
        return launch

    def counting(xp, group):  # a group's kernels, each launch recorded
        return [counted(kernel, name) for kernel, name in zip(
            original(xp, group), cuda_kernels._KERNELS[group.op])]
    monkeypatch.setattr(cuda_kernels, '_kernels', counting)
    if request.param == 'emulated':
        with emulated_cupy.installed():
            emulated_cupy.stats.reset()
            yield _Gpu(emulated_cupy, launches)
    else:
        yield _Gpu(cuda.cupy, launches)


class _Gpu(object):

    def __init__(self, xp, launches):
        self.xp = xp
        self.launches = launches
        self.emulated = xp is emulated_cupy

    def send(self, link):
        return link.to_device('@cupy:0')


class Params(chainer.Chain):

    """Parameters ``/l<i>/W`` of the given sizes; ``/l<i>/b`` of 3 elements
    in the first ``biases`` links."""

    def __init__(self, sizes, dtype, seed=0, g_scale=1.0, biases=4):
        super(Params, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            for i, n in enumerate(sizes):
                link = chainer.Link()
                with link.init_scope():
                    link.W = chainer.Parameter(
                        rng.standard_normal(n).astype(dtype))
                    if i < biases:
                        link.b = chainer.Parameter(
                            (rng.standard_normal(3) * 1e-3).astype(dtype))
                setattr(self, 'l{}'.format(i), link)
        self.refill_grads(seed + 1, g_scale)

    def refill_grads(self, seed, g_scale=1.0):
        rng = numpy.random.RandomState(seed)
        for _, param in sorted(self.namedparams()):
            xp = param.device.xp
            g = (rng.standard_normal(param.shape) * g_scale).astype(
                param.dtype)
            # As after cleargrads() and backward(): the old gradient is
            # freed before the new one is made.
            param.grad = None
            param.grad = g if xp is numpy else xp.asarray(g)


def _pair(gpu, sizes, dtype, **kwargs):
    cpu = Params(sizes, dtype, **kwargs)
    dev = Params(sizes, dtype, **kwargs)
    gpu.send(dev)
    return cpu, dev


def _host(link, attr='array'):
    return {path: numpy.asarray(cuda.to_cpu(getattr(p, attr)),
                                numpy.float64)
            for path, p in link.namedparams()}


def _start(link):
    """:func:`_host`, a copy (float64 arrays are the link's own)."""
    return {path: a.copy() for path, a in _host(link).items()}


def _assert_close(actual, expected, dtype, factor=1.0):
    rtol = RTOL[dtype] * factor
    for path in expected:
        a, e = actual[path], expected[path]
        scale = numpy.abs(e).max() if e.size else 0.0
        numpy.testing.assert_allclose(
            a, e, rtol=rtol, atol=rtol * scale, err_msg=path)


#: The tolerance of the device's steps against the CPU's, beside an ulp of
#: the weight, relative to the array's largest step: the device adds up
#: the norms in the compute type (float32 for float16 arrays), the CPU in
#: float64; with LAMB, float16 moments may round the other way.
STEP_RTOL = {numpy.float16: 1e-2, numpy.float32: 1e-4, numpy.float64: 1e-9}


def _assert_same_steps(actual, expected, start, dtype):
    """The device's steps from the weights ``start``, ``actual - start``,
    are the CPU's, ``expected - start``, to an ulp of the weight (at the
    larger of its ends) and ``STEP_RTOL`` of the array's largest step:
    ``_assert_close``'s tolerance, a part of the largest weight, is beyond
    a whole float16 step."""
    for path in expected:
        step, want = actual[path] - start[path], expected[path] - start[path]
        ulp = numpy.spacing(numpy.maximum(
            abs(start[path]), abs(expected[path])).astype(dtype))
        bound = ulp.astype(numpy.float64) + STEP_RTOL[dtype] * (
            abs(want).max() if want.size else 0.0)
        bad = abs(step - want) > bound
        assert not bad.any(), '{}: {} of {} steps off: {} for {}'.format(
            path, bad.sum(), bad.size, step[bad][:4], want[bad][:4])


def _assert_same_observations(observers, dtype):
    """What ``observe()`` of the CPU and the GPU run (in this order)
    report: the same paths, the same values within the dtype's rounding."""
    observed_cpu, observed_gpu = (o.observe() for o in observers)
    assert sorted(observed_gpu) == sorted(observed_cpu)
    for path, expected in observed_cpu.items():
        numpy.testing.assert_allclose(observed_gpu[path], expected,
                                      rtol=RTOL[dtype] * 10, err_msg=path)


HOOK_CASES = [
    dict(),
    dict(weight_decay=1e-3, trust_coefficient=0.5, eps=0.0,
         exclude_from_weight_decay=['/b$', 'l2/'],
         exclude_from_layer_adaptation=['l1/', 'l3/W']),
    dict(clip=True, trust_coefficient=1e-3, weight_decay=1e-4),
    dict(threshold=0.0, weight_decay=0.1),
]


def _run(model, optimizer, hook, scaling, fp32_update=False, steps=2,
         g_scale=1.0):
    optimizer.setup(model)
    if fp32_update:
        optimizer.use_fp32_update()
    if scaling == 'static':
        optimizer.loss_scaling(scale=2.0 ** 10)
    elif scaling == 'dynamic':
        optimizer.loss_scaling(interval=1000)
        optimizer._loss_scale = 2.0 ** 10  # dynamic scaling starts at 1
    if hook is not None:
        optimizer.add_hook(hook)
    for step in range(steps):
        model.refill_grads(100 + step, g_scale)
        _scale_grads(model, optimizer._loss_scale)
        optimizer.update()
    return optimizer


def _scale_grads(model, loss_scale):
    # What backward(loss_scale=S) leaves: S times the gradient, and S on
    # every parameter.
    for param in model.params():
        if loss_scale is not None:
            param.grad *= loss_scale
        param._loss_scale = loss_scale


# Every option with static scaling; every scaling and the per-array path
# with the option that touches most of the kernels' code.
HOOK_RUNS = ([(kwargs, 'static', True) for kwargs in HOOK_CASES]
             + [(HOOK_CASES[1], scaling, True)
                for scaling in (None, 'dynamic')]
             + [(kwargs, 'static', False) for kwargs in HOOK_CASES[1:3]])


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('kwargs, scaling, multi_tensor', HOOK_RUNS)
@ref.ROUNDS_AWAY  # in float16 without masters
def test_hook_agrees_with_cpu(gpu, dtype, kwargs, scaling, multi_tensor):
    _check_hook(gpu, dtype, multi_tensor, kwargs, scaling, MIXED)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('multi_tensor', [True, False])
@ref.ROUNDS_AWAY  # in float16 without masters
def test_hook_agrees_with_cpu_at_every_size(gpu, dtype, multi_tensor):
    _check_hook(gpu, dtype, multi_tensor, HOOK_CASES[1], 'static', SIZES)


def _check_hook(gpu, dtype, multi_tensor, kwargs, scaling, sizes):
    g_scale = 1e-2 if dtype == numpy.float16 else 1.0
    cpu, dev = _pair(gpu, sizes, dtype)
    hooks = []
    for model in (cpu, dev):
        hook = chainer_lars.GradientLARS(multi_tensor=multi_tensor, **kwargs)
        _run(model, optimizers.MomentumSGD(lr=0.05), hook, scaling,
             g_scale=g_scale)
        hooks.append(hook)
    _assert_close(_host(dev), _host(cpu), dtype)
    _assert_same_observations(hooks, dtype)


@pytest.mark.parametrize('dtype', DTYPES)
def test_hook_fp32_update_agrees_with_cpu(gpu, dtype):
    cpu, dev = _pair(gpu, MIXED, dtype)
    for model in (cpu, dev):
        _run(model, optimizers.MomentumSGD(lr=0.05),
             chainer_lars.GradientLARS(weight_decay=1e-3), 'static',
             fp32_update=True, g_scale=1e-2)
    _assert_close(_host(dev), _host(cpu), dtype)


def test_hook_skipped_update_agrees_with_cpu(gpu):
    # Dynamic loss scaling skips an update with an inf in a gradient: the
    # hook still runs, the inf stays in its own array, no weight moves.
    cpu, dev = _pair(gpu, [5, CHUNK + 3], numpy.float32)
    results = []
    for model in (cpu, dev):
        opt = optimizers.MomentumSGD(lr=0.05)
        opt.setup(model)
        opt.loss_scaling(interval=1000)
        opt._loss_scale = 2.0 ** 10
        opt.add_hook(chainer_lars.GradientLARS(weight_decay=1e-3))
        before = _host(model)
        model.l1.W.grad[7] = numpy.inf
        _scale_grads(model, opt._loss_scale)
        with pytest.warns(UserWarning, match='Non finite'):
            opt.update()
        results.append((before, _host(model), _host(model, 'grad'),
                        opt._loss_scale))
    (b0, w0, g0, s0), (b1, w1, g1, s1) = results
    assert s0 == s1 == 2.0 ** 9
    for path in b0:
        numpy.testing.assert_array_equal(w1[path], b1[path])
        numpy.testing.assert_array_equal(w0[path], b0[path])
        assert (numpy.isfinite(g1[path]) == numpy.isfinite(g0[path])).all()
    assert not numpy.isfinite(g1['/l1/W']).all()
    assert numpy.isfinite(g1['/l0/W']).all()
    _assert_close({'/l0/W': g1['/l0/W']}, {'/l0/W': g0['/l0/W']},
                  numpy.float32)


LARS_CASES = [
    dict(),
    dict(nesterov=True, weight_decay=1e-3),
    dict(exclude_from_weight_decay=['/b$', 'l2/'],
         exclude_from_layer_adaptation=['l1/', 'l3/W'], eps=1e-9),
]


LARS_RUNS = ([(kwargs, 'static', True) for kwargs in LARS_CASES]
             + [(LARS_CASES[2], scaling, True)
                for scaling in (None, 'dynamic')]
             + [(kwargs, 'static', False) for kwargs in LARS_CASES[1:]])


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('kwargs, scaling, multi_tensor', LARS_RUNS)
@ref.ROUNDS_AWAY  # in float16 without masters
def test_lars_agrees_with_cpu(gpu, dtype, kwargs, scaling, multi_tensor):
    _check_lars(gpu, dtype, dict(kwargs, multi_tensor=multi_tensor),
                scaling, MIXED)


@pytest.mark.parametrize('dtype', DTYPES)
def test_lars_agrees_with_cpu_at_every_size(gpu, dtype):
    _check_lars(gpu, dtype, LARS_CASES[2], 'static', SIZES)


def _check_lars(gpu, dtype, kwargs, scaling, sizes):
    cpu, dev = _pair(gpu, sizes, dtype)
    start, opts = _start(cpu), []
    for model in (cpu, dev):
        opts.append(_run(model, chainer_lars.LARS(lr=2.0, **kwargs), None,
                         scaling, g_scale=1e-2))
    _assert_close(_host(dev), _host(cpu), dtype, factor=4)
    _assert_same_steps(_host(dev), _host(cpu), start, dtype)
    _assert_same_observations(opts, dtype)


def test_lars_fp32_update_agrees_with_cpu(gpu):
    cpu, dev = _pair(gpu, MIXED, numpy.float16)
    for model in (cpu, dev):
        _run(model, chainer_lars.LARS(lr=2.0, weight_decay=1e-3), None,
             'dynamic', fp32_update=True, g_scale=1e-2)
    _assert_close(_host(dev), _host(cpu), numpy.float16)


def _masters(link):
    return {path: cuda.to_cpu(p.update_rule._fp32_param.array)
            for path, p in link.namedparams()}


@pytest.mark.parametrize('scaling', [None, 'static', 'dynamic'])
def test_lars_mixed16_batched_agrees_with_the_rule_path(gpu, scaling):
    """The mixed16 group's kernels (float16 gradients and weights, float32
    masters and momentum) against Chainer's fp32 update of each rule on the
    device and against the CPU: masters to float32 rounding, float16
    weights within one unit in the last place."""
    cpu = Params(MIXED, numpy.float16)
    devs = [gpu.send(Params(MIXED, numpy.float16)) for _ in range(2)]
    for model, multi_tensor in ((cpu, True), (devs[0], True),
                                (devs[1], False)):
        _run(model, chainer_lars.LARS(lr=2.0, weight_decay=1e-3,
                                      multi_tensor=multi_tensor),
             None, scaling, fp32_update=True, steps=3, g_scale=1e-2)
    batched, per_rule = devs
    for expected in (per_rule, cpu):
        _assert_close(_masters(batched), _masters(expected), numpy.float32,
                      factor=4)
        for path, half in _host(batched).items():
            other = _host(expected)[path]
            # One float16 ulp of the larger magnitude.
            ulp = numpy.spacing(numpy.maximum(
                numpy.abs(half), numpy.abs(other)).astype(numpy.float16))
            assert (numpy.abs(half - other) <= ulp).all(), path


def _resnet50_shapes():
    """The sizes of ResNet-50's 161 parameter arrays, scaled down 1000
    times (the emulator runs every thread on the CPU)."""
    with chainer.using_config('dtype', numpy.float16):
        link = chainer.links.ResNet50Layers(pretrained_model=None)
    return [max(1, p.size // 1000) for _, p in sorted(link.namedparams())]


def test_lars_mixed16_launches_twice_whatever_the_number_of_arrays(gpu):
    sizes = _resnet50_shapes()
    counts = []
    for n in (len(sizes), 8):
        _, dev = _pair(gpu, sizes[:n], numpy.float16, biases=0)
        opt = chainer_lars.LARS()
        opt.setup(dev)
        opt.use_fp32_update()
        opt.update()  # the rules make their masters and states
        del gpu.launches[:]
        opt.update()
        mixed = [g for g in ref.plan_of(opt).groups if g.mixed16]
        assert [len(g) for g in mixed] == [n]
        counts.append(list(gpu.launches))
    assert counts == [['chainer_lars_multi_norms',
                       'chainer_lars_multi_momentum']] * 2


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_zero_weight_array_moves_as_on_the_cpu(gpu, multi_tensor):
    # ||w|| = 0 is not above the threshold (0 for both forms here): r = 1,
    # so a zero-initialised array that is adapted still moves.
    dtype = numpy.float32
    cpu, dev = _pair(gpu, [5, THREADS + 1], dtype)
    for model in (cpu, dev):
        model.l1.W.array[...] = 0
    hooks, opts = [], []
    for model in (cpu, dev):
        hook = chainer_lars.GradientLARS(threshold=0.0, weight_decay=1e-3,
                                         multi_tensor=multi_tensor)
        _run(model, optimizers.MomentumSGD(lr=0.05), hook, None, steps=1)
        hooks.append(hook)
    assert (_host(dev)['/l1/W'] != 0).all()
    _assert_close(_host(dev), _host(cpu), dtype)
    _assert_same_observations(hooks, dtype)
    cpu, dev = _pair(gpu, [5, THREADS + 1], dtype)
    for model in (cpu, dev):
        model.l1.W.array[...] = 0
        opts.append(_run(model, chainer_lars.LARS(
            lr=2.0, multi_tensor=multi_tensor), None, None, steps=1))
    assert (_host(dev)['/l1/W'] != 0).all()
    _assert_close(_host(dev), _host(cpu), dtype)
    _assert_same_observations(opts, dtype)


@pytest.mark.parametrize('dtype', DTYPES)
def test_hook_launches_twice_per_dtype(gpu, dtype):
    _, dev = _pair(gpu, MIXED, dtype)
    opt = optimizers.MomentumSGD(lr=0.05)
    hook = chainer_lars.GradientLARS(weight_decay=1e-4)
    opt.setup(dev)
    hook(opt)
    per_update = ['chainer_lars_multi_norms', 'chainer_lars_multi_scale_add']
    if dtype == numpy.float16:
        # float16 gradients are rescaled inside their update rules.
        assert gpu.launches == []
    else:
        assert gpu.launches == per_update


def test_hook_launches_per_dtype_in_a_mixed_model(gpu):
    model = chainer.Chain()
    with model.init_scope():
        model.a = Params([CHUNK + 1, 7], numpy.float32)
        model.b = Params([9], numpy.float64)
    gpu.send(model)
    opt = optimizers.MomentumSGD(lr=0.05)
    opt.setup(model)
    chainer_lars.GradientLARS()(opt)
    assert gpu.launches == ['chainer_lars_multi_norms',
                            'chainer_lars_multi_scale_add'] * 2


def test_hook_per_array_launches_twice_per_array(gpu):
    _, dev = _pair(gpu, MIXED, numpy.float32)
    opt = optimizers.MomentumSGD(lr=0.05)
    opt.setup(dev)
    chainer_lars.GradientLARS(multi_tensor=False)(opt)
    arrays = sum(1 for p in dev.params() if p.size)
    assert gpu.launches == ['chainer_lars_multi_norms',
                            'chainer_lars_multi_scale_add'] * arrays


# Each fused face's two kernels.
FACES = [(chainer_lars.LARS, ['chainer_lars_multi_norms',
                              'chainer_lars_multi_momentum']),
         (chainer_lars.LAMB, ['chainer_lars_lamb_norms',
                              'chainer_lars_lamb_step'])]


@pytest.mark.parametrize('face, kernels', FACES)
@pytest.mark.parametrize('dtype', DTYPES)
@ref.ROUNDS_AWAY  # in float16 without masters
def test_fused_faces_launch_twice_per_dtype(gpu, dtype, face, kernels):
    _, dev = _pair(gpu, MIXED, dtype)
    opt = face()
    opt.setup(dev)
    opt.update()  # the first update of a rule makes its state: per rule
    del gpu.launches[:]
    opt.update()
    assert gpu.launches == kernels


@pytest.mark.parametrize('face, kernels', FACES)
def test_fused_faces_per_array_launch_twice_per_array(gpu, face, kernels):
    _, dev = _pair(gpu, MIXED, numpy.float32)
    opt = face(multi_tensor=False)
    opt.setup(dev)
    opt.update()
    arrays = sum(1 for p in dev.params() if p.size)
    assert gpu.launches == kernels * arrays


@pytest.mark.parametrize('make', [
    lambda: (optimizers.MomentumSGD(lr=0.1),
             chainer_lars.GradientLARS(weight_decay=1e-4)),
    lambda: (optimizers.MomentumSGD(lr=0.1),
             chainer_lars.GradientLARS(weight_decay=1e-4,
                                       multi_tensor=False, clip=True)),
    lambda: (chainer_lars.LARS(), None),
    lambda: (chainer_lars.LAMB(), None),
])
@pytest.mark.parametrize('dtype', DTYPES)
@ref.ROUNDS_AWAY  # in float16 without masters
def test_no_transfer_to_the_host_in_an_update(gpu, make, dtype):
    if not gpu.emulated:
        pytest.skip('counted by the emulator; on a GPU, '
                    'test_no_host_synchronisation')
    _, dev = _pair(gpu, MIXED, dtype)
    opt, hook = make()
    _run(dev, opt, hook, 'static', steps=1, g_scale=1e-2)
    emulated_cupy.stats.reset()
    dev.refill_grads(7, 1e-2)
    _scale_grads(dev, opt._loss_scale)
    opt.update()
    assert emulated_cupy.stats.to_host == 0
    assert emulated_cupy.stats.launches  # the update did run on the device


@pytest.mark.parametrize('make', [
    lambda: (optimizers.MomentumSGD(lr=0.05), chainer_lars.GradientLARS()),
    lambda: (optimizers.MomentumSGD(lr=0.05),
             chainer_lars.GradientLARS(multi_tensor=False)),
    lambda: (chainer_lars.LARS(), None),
    lambda: (chainer_lars.LAMB(), None),
])
def test_an_update_uploads_its_addresses_in_one_copy_a_group(gpu, make):
    """The gradients' addresses travel with the settings of each update,
    in one copy a group, whatever they are: nothing is allocated on the
    device and nothing is cached by address."""
    if not gpu.emulated:
        pytest.skip('counted by the emulator')
    _, dev = _pair(gpu, MIXED, numpy.float32)
    opt, hook = make()
    _run(dev, opt, hook, None, steps=2)
    groups = ref.plan_of(hook or opt).groups
    for step in range(3):
        kept = [p.grad for p in dev.params()]  # the next are elsewhere
        dev.refill_grads(3 + step)
        assert all(a.data.ptr != p.grad.data.ptr  # an empty one's: 0
                   for a, p in zip(kept, dev.params()) if a.size)
        emulated_cupy.stats.reset()
        opt.update()
        assert emulated_cupy.stats.to_device == len(
            [g for g in groups if any(w.size for w in g.weights)])
        assert emulated_cupy.stats.allocations == 0
        assert ref.plan_of(hook or opt).groups == groups


@pytest.mark.parametrize('make, dtype, fp32_update', [
    (lambda: (optimizers.MomentumSGD(lr=0.05),
              chainer_lars.GradientLARS(weight_decay=1e-3)),
     numpy.float32, False),
    (lambda: (optimizers.MomentumSGD(lr=0.05),
              chainer_lars.GradientLARS(multi_tensor=False)),
     numpy.float32, False),
    # The hook's batched pass rescales the masters' gradients.
    (lambda: (optimizers.MomentumSGD(lr=0.05), chainer_lars.GradientLARS()),
     numpy.float16, True),
    (lambda: (chainer_lars.LARS(weight_decay=1e-3), None),
     numpy.float32, False),
    (lambda: (chainer_lars.LARS(weight_decay=1e-3), None),
     numpy.float16, True),
    (lambda: (chainer_lars.LAMB(), None), numpy.float64, False),
])
def test_gradients_at_new_addresses_at_every_update_as_the_cpu(
        gpu, make, dtype, fp32_update):
    """Gradients at new addresses at every update, as in a run, where their
    memory is the pool's to give: every update is the CPU's."""
    cpu, dev = _pair(gpu, MIXED, dtype, g_scale=1e-2)
    kept = []  # every gradient stays alive: no address comes back
    runs = []
    for model in (cpu, dev):
        opt, hook = make()
        _run(model, opt, hook, None, fp32_update=fp32_update, steps=0)
        runs.append(opt)
    for step in range(6):
        for model, opt in zip((cpu, dev), runs):
            model.refill_grads(200 + step, 1e-2)
            kept.append([p.grad for p in model.params()])
            opt.update()
    if fp32_update:
        _assert_close(_masters(dev), _masters(cpu), numpy.float32, factor=4)
    else:
        _assert_close(_host(dev), _host(cpu), dtype, factor=4)


_SPIN = r'''
extern "C" __global__ void chainer_lars_test_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
'''


@pytest.mark.parametrize('make', [
    lambda: (optimizers.MomentumSGD(lr=0.1),
             chainer_lars.GradientLARS(weight_decay=1e-4)),
    lambda: (optimizers.MomentumSGD(lr=0.1),
             chainer_lars.GradientLARS(weight_decay=1e-4,
                                       multi_tensor=False)),
    lambda: (chainer_lars.LARS(), None),
    lambda: (chainer_lars.LAMB(), None),
])
def test_no_host_synchronisation(gpu, make):
    # A kernel that keeps the device busy for about a second is queued
    # first; an update that waited for the device would return after it.
    if gpu.emulated:
        pytest.skip('launches are synchronous in the emulator; transfers '
                    'are counted by test_no_transfer_to_the_host_in_an_update')
    cupy = gpu.xp
    _, dev = _pair(gpu, MIXED, numpy.float32)
    opt, hook = make()
    _run(dev, opt, hook, None, steps=1)
    cupy.cuda.Device().synchronize()
    spin = cupy.RawKernel(_SPIN, 'chainer_lars_test_spin')
    rate = cupy.cuda.runtime.deviceGetAttribute(
        cupy.cuda.runtime.cudaDevAttrClockRate, 0)  # kHz
    spin((1,), (1,), (numpy.int64(rate * 1000),))
    spun = cupy.cuda.get_current_stream().record()
    opt.update()
    still_spinning = not spun.done
    cupy.cuda.Device().synchronize()
    assert still_spinning, 'the update waited for the device'


def test_fp16_model_matches_reference_net(gpu):
    # The model of the CPU tests, through forward-free updates, in float16
    # with loss scaling: the delegate path of the hook on the device.
    cpu, dev = ref.Net(numpy.float16), ref.Net(numpy.float16)
    ref.fill(cpu, 0, g_scale=1e-2)
    ref.fill(dev, 0, g_scale=1e-2)
    gpu.send(dev)
    for model in (cpu, dev):
        opt = optimizers.MomentumSGD(lr=0.05)
        opt.setup(model)
        opt.add_hook(chainer_lars.GradientLARS(weight_decay=1e-3))
        opt.update()
    a, b = ref.snapshot(cpu), _host(dev)
    for path in a:
        testing.assert_allclose(b[path], a[path], rtol=1e-2, atol=1e-3)


def test_executor_takes_what_it_can_and_the_engine_the_rest(gpu):
    """CudaExecutor.take on odd gradients: a contiguous one of another
    shape but the same size is not taken, and the engine refuses it before
    anything moves, as NumPy would (it was taken: a (2, 3) gradient
    stepped a (6,) weight); the others are left to the engine (no
    gradient; strided: a contiguous copy); the results equal the CPU
    executor's."""
    from chainer_lars import engine
    from chainer_lars import layout as L

    dtype = numpy.float32
    rng = numpy.random.RandomState(3)
    sizes = [6, 6, 6, 6, THREADS + 3]
    host = [rng.standard_normal(n).astype(dtype) for n in sizes]
    host_g = [rng.standard_normal(n).astype(dtype) * 1e-2 for n in sizes]
    rows = L.rows(len(sizes))
    rows[:, L.LR] = 2.0
    rows[:, L.MOMENTUM] = 0.9
    rows[:, L.WEIGHT_DECAY] = 1e-3
    rows[:, L.TRUST_COEFFICIENT] = 0.02
    rows[:, L.EPS] = 1e-6
    rows[:, L.ADAPT] = 1.0
    rows[:, L.REQUIRE_GRAD] = 1.0
    xp = gpu.xp

    def plan_of(device):
        device = chainer.get_device(device)
        weights = [device.send(w.copy()) for w in host]
        plan = engine.Plan(weights, lambda arrays: ([arrays], ()))
        for k, w in enumerate(weights):
            plan.add(None, device, L.STEP, '/p{}'.format(k), None, None, w,
                     (device.send(numpy.zeros_like(host[k])),))
        plan.finish().groups[0].rows[...] = rows
        return plan

    dev, cpu = plan_of('@cupy:0'), plan_of('@numpy')
    dev_g = [xp.asarray(g) for g in host_g]
    cpu_g = list(host_g)
    dev_g[1] = cpu_g[1] = None
    dev_g[2] = xp.asarray(numpy.repeat(host_g[2], 2))[::2]
    cpu_g[2] = numpy.repeat(host_g[2], 2)[::2]
    dev_g[3] = xp.asarray(host_g[3].reshape(2, 3))  # the same size
    cpu_g[3] = host_g[3].reshape(2, 3)
    group = dev.groups[0]
    (gptr,), missing = group.executor.take(dev, [group], [dev_g])
    assert numpy.flatnonzero(gptr == 0).tolist() == [1, 2, 3]
    for plan, grads in ((dev, dev_g), (cpu, cpu_g)):
        before = [cuda.to_cpu(w) for w in plan.groups[0].weights]
        with pytest.raises(ValueError, match=r'^/p3: the gradient has shape '
                           r'\(2, 3\) but the weight \(6,\)'):
            engine.update(plan, [grads])
        for w, b in zip(plan.groups[0].weights, before):
            numpy.testing.assert_array_equal(cuda.to_cpu(w), b)
    dev_g[3], cpu_g[3] = xp.asarray(host_g[3]), host_g[3]
    (gptr,), missing = group.executor.take(dev, [group], [dev_g])
    assert missing == 2
    assert numpy.flatnonzero(gptr == 0).tolist() == [1, 2]
    assert gptr[3] == dev_g[3].data.ptr
    assert engine.update(dev, [dev_g]) == [[1]]
    assert engine.update(cpu, [cpu_g]) == [[1]]
    assert list(group.last.copies) == [2]
    for k in (0, 2, 3, 4):
        numpy.testing.assert_allclose(cuda.to_cpu(group.weights[k]),
                                      cpu.groups[0].weights[k], rtol=1e-5,
                                      atol=1e-7)
    observed = engine.observed(group.last)
    assert numpy.isnan(observed[1]).all()
    numpy.testing.assert_allclose(
        observed[[0, 2, 3, 4]],
        engine.observed(cpu.groups[0].last)[[0, 2, 3, 4]], rtol=1e-5)
    assert sorted(engine.observe(group.last)) == ['/p0', '/p2', '/p3', '/p4']


def test_overlapping_marks_the_rows_that_share_memory():
    """The rows whose byte ranges overlap another's: one array given to
    two rows, views that overlap; not those that only touch, nor empty
    or untaken rows (start 0) inside another's range."""
    start = numpy.array([64, 0, 64, 200, 208, 264, 0, 300], numpy.int64)
    nbytes = numpy.array([16, 8, 16, 16, 8, 8, 0, 8], numpy.int64)
    assert sorted(cuda_kernels._overlapping(start, nbytes)) == [0, 2, 3, 4]
    assert not len(cuda_kernels._overlapping(start[5:], nbytes[5:]))


@pytest.mark.parametrize('share', ['same', 'overlapping'])
@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_gradients_sharing_memory_are_written_in_turn_as_the_cpu(
        gpu, share, face, multi_tensor, dtype):
    """Two parameters given one gradient array, or overlapping views of
    one: where the op writes the gradient (the hook; LARS and LAMB under a
    loss scale), each is stepped in turn, after the others' launch, as on
    the CPU (a launch would write the same memory from two rows at once);
    where it only reads it (no loss scale), they stay in the launch."""
    n = THREADS + 3
    for scale in (8.0, None):
        cpu, dev = _pair(gpu, [n, n, 5], dtype)
        observers = []
        for model in (cpu, dev):
            xp = model.l0.W.device.xp
            if face == 'hook':
                opt = optimizers.MomentumSGD(lr=0.05)
                observers.append(chainer_lars.GradientLARS(
                    weight_decay=1e-3, multi_tensor=multi_tensor))
                opt.setup(model)
                opt.add_hook(observers[-1])
            else:
                opt = getattr(chainer_lars, face)(multi_tensor=multi_tensor)
                observers.append(opt)
                opt.setup(model)
            if scale is not None:
                opt.loss_scaling(scale=scale)
            for step in range(2):  # the first makes the states, per rule
                rng = numpy.random.RandomState(step)
                base = xp.asarray(rng.standard_normal(2 * n).astype(dtype))
                model.l0.W.grad = base[:n]
                model.l1.W.grad = base[3 * (share == 'overlapping'):][:n]
                for param in model.params():
                    param._loss_scale = scale
                del gpu.launches[:]
                opt.update()
        if multi_tensor:  # one group's two launches; each row not in it two
            assert len(gpu.launches) == (
                6 if scale or face == 'hook' else 2), gpu.launches
        _assert_close(_host(dev), _host(cpu), dtype)
        _assert_close(_host(dev, 'grad'), _host(cpu, 'grad'), dtype)
        _assert_same_observations(observers, dtype)


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_mixed16_gradients_sharing_memory_are_rescaled_as_they_came(
        gpu, multi_tensor):
    """Under use_fp32_update(), the hook writes each float16 gradient's
    rescaled copy into its own master's: two parameters given one gradient
    both read it as it came, on the CPU and on a GPU, in the one launch."""
    n = THREADS + 3
    hooks, (cpu, dev) = [], _pair(gpu, [n, n, 5], numpy.float16)
    for model in (cpu, dev):
        opt = optimizers.MomentumSGD(lr=0.05).setup(model)
        opt.use_fp32_update()
        hooks.append(chainer_lars.GradientLARS(multi_tensor=multi_tensor))
        opt.add_hook(hooks[-1])
        for step in range(2):  # the first makes the masters
            model.refill_grads(step)
            model.l1.W.grad = model.l0.W.grad
            del gpu.launches[:]
            opt.update()
        assert len(gpu.launches) == (2 if multi_tensor else 12) * (
            model is dev)
        observed = hooks[-1].observe()
        assert observed['/l0/W'][2] == observed['/l1/W'][2]
    _assert_same_observations(hooks, numpy.float16)
    _assert_close(_host(dev), _host(cpu), numpy.float16)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_hook_rescales_strided_gradients_as_the_cpu(gpu, dtype, multi_tensor):
    """A gradient that is not C-contiguous goes through the kernels as a
    contiguous copy, written back into the strided array."""
    sizes = [1, THREADS + 1, 40]
    cpu, dev = _pair(gpu, sizes, dtype)
    rng = numpy.random.RandomState(5)
    hooks, parents = [], []
    for model in (cpu, dev):
        xp = model.l0.W.device.xp
        opt = optimizers.MomentumSGD(lr=0.05)
        opt.setup(model)
        for i, n in enumerate(sizes):
            g = (rng.standard_normal(n) * 1e-2).astype(dtype)
            parent = xp.asarray(numpy.repeat(g, 2)) if xp is not numpy \
                else numpy.repeat(g, 2)
            getattr(model, 'l{}'.format(i)).W.grad = parent[::2]
            parents.append(parent)
        rng = numpy.random.RandomState(5)
        before = _host(model, 'grad')
        hook = chainer_lars.GradientLARS(weight_decay=1e-3,
                                         multi_tensor=multi_tensor)
        if dtype == numpy.float16:
            # Called with the optimizer, the hook defers float16 to the
            # rules' updates; called per parameter, it rescales.
            for param in model.params():
                hook(param.update_rule, param)
        else:
            hook(opt)
        hooks.append(hook)
    assert not dev.l1.W.grad.flags.c_contiguous
    assert (_host(dev, 'grad')['/l1/W'] != before['/l1/W']).all()
    _assert_close(_host(dev, 'grad'), _host(cpu, 'grad'), dtype)
    # The other elements of the parent arrays are left as they were.
    for cpu_parent, dev_parent in zip(parents[:3], parents[3:]):
        numpy.testing.assert_array_equal(cuda.to_cpu(dev_parent)[1::2],
                                         cpu_parent[1::2])
    _assert_same_observations(hooks, dtype)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('loss_scale', [None, 8.0])
def test_lars_steps_with_strided_gradients_as_the_cpu(gpu, dtype,
                                                      multi_tensor,
                                                      loss_scale):
    """A gradient that is not C-contiguous takes the per-rule path, whose
    kernels update contiguous copies, written back: under a loss scale the
    gradient too, left unscaled as Chainer's rule leaves it."""
    sizes = [1, THREADS + 1, 40]
    cpu, dev = _pair(gpu, sizes, dtype)
    opts = []
    for model in (cpu, dev):
        xp = model.l0.W.device.xp
        # A strided weight, too.
        w = model.l2.W.array
        w0 = cuda.to_cpu(w).copy()
        model.l2.W.array = xp.concatenate([w[:, None], w[:, None]],
                                          axis=1)[:, 0]
        opt = chainer_lars.LARS(lr=2.0, weight_decay=1e-3,
                                multi_tensor=multi_tensor)
        opt.setup(model)
        if loss_scale is not None:
            opt.loss_scaling(scale=loss_scale)
        for step in range(2):
            rng = numpy.random.RandomState(7 + step)
            unscaled = []
            for i, n in enumerate(sizes):
                g = numpy.repeat(
                    (rng.standard_normal(n) * 1e-2).astype(dtype), 2)
                unscaled.append(g[::2])
                if loss_scale is not None:
                    g = g * dtype(loss_scale)  # a power of two: exact
                param = getattr(model, 'l{}'.format(i)).W
                param.grad = (g if xp is numpy else xp.asarray(g))[::2]
                param._loss_scale = loss_scale
            opt.update()
            for i, g in enumerate(unscaled):
                numpy.testing.assert_array_equal(cuda.to_cpu(getattr(
                    model, 'l{}'.format(i)).W.grad), g)
        opts.append(opt)
    assert not dev.l1.W.grad.flags.c_contiguous
    assert not dev.l2.W.array.flags.c_contiguous
    # The step reached the strided weight (in float16 it is below the
    # tolerance of the comparison that follows).
    assert (cuda.to_cpu(dev.l2.W.array) != w0).mean() > 0.5
    _assert_close(_host(dev), _host(cpu), dtype, factor=4)
    for path, p in dev.namedparams():
        numpy.testing.assert_allclose(
            cuda.to_cpu(p.update_rule.state['v']),
            dict(cpu.namedparams())[path].update_rule.state['v'],
            rtol=RTOL[dtype] * 4, atol=1e-7, err_msg=path)
    _assert_same_observations(opts, dtype)


def test_dynamic_loss_scaling_checks_with_one_transfer(gpu):
    """LARS's check of the gradients for dynamic loss scaling brings one
    array of flags to the host, where Chainer's brings one per array; it
    warns for the same arrays and skips the same update."""
    if not gpu.emulated:
        pytest.skip('counted by the emulator')
    runs = []
    for multi_tensor in (True, False):
        _, dev = _pair(gpu, MIXED, numpy.float32)
        opt = chainer_lars.LARS(lr=2.0, multi_tensor=multi_tensor)
        _run(dev, opt, None, 'dynamic', steps=1, g_scale=1e-2)
        dev.refill_grads(8, 1e-2)
        _scale_grads(dev, opt._loss_scale)
        emulated_cupy.stats.reset()
        opt.update()
        transfers = emulated_cupy.stats.to_host
        dev.refill_grads(9, 1e-2)
        _scale_grads(dev, opt._loss_scale)
        for link in (dev.l2, dev.l5):
            g = cuda.to_cpu(link.W.grad)
            g[0] = numpy.inf
            link.W.grad[...] = gpu.xp.asarray(g)
        before = _bytes(dev)
        with pytest.warns(UserWarning, match='Non finite') as caught:
            opt.update()
        messages = [str(w.message) for w in caught
                    if 'Non finite' in str(w.message)]
        assert _bytes(dev) == before  # skipped
        runs.append((transfers, messages, opt._loss_scale, before))
    (ours, messages, scale, weights), (chainers, theirs, their_scale,
                                       their_weights) = runs
    assert ours == 1 and chainers == len(list(dev.params()))
    assert messages == theirs and len(messages) == 2
    assert scale == their_scale
    assert weights == their_weights


def _bytes(link):
    return {path: array.tobytes() for path, array in _host(link).items()}


LAMB_CASES = [
    dict(),
    dict(alpha=0.05, beta1=0.8, beta2=0.99, eps=1e-3, eta=0.5,
         weight_decay_rate=0.1, exclude_from_weight_decay=['/b$', 'l2/'],
         exclude_from_layer_adaptation=['l1/', 'l3/W']),
]
LAMB_RUNS = ([(kwargs, 'static', True) for kwargs in LAMB_CASES]
             + [(LAMB_CASES[1], scaling, True)
                for scaling in (None, 'dynamic')]
             + [(LAMB_CASES[1], 'static', False)])


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('kwargs, scaling, multi_tensor', LAMB_RUNS)
@ref.ROUNDS_AWAY  # in float16 without masters
def test_lamb_agrees_with_cpu(gpu, dtype, kwargs, scaling, multi_tensor):
    _check_lamb(gpu, dtype, dict(kwargs, multi_tensor=multi_tensor),
                scaling, MIXED)


@pytest.mark.parametrize('dtype', DTYPES)
def test_lamb_agrees_with_cpu_at_every_size(gpu, dtype):
    _check_lamb(gpu, dtype, LAMB_CASES[1], 'static', SIZES)


def _check_lamb(gpu, dtype, kwargs, scaling, sizes):
    # Gradients near 1: float16 moments hold their squares.
    cpu, dev = _pair(gpu, sizes, dtype)
    start = _start(cpu)
    opts = [_run(model, chainer_lars.LAMB(**kwargs), None, scaling,
                 steps=3) for model in (cpu, dev)]
    _assert_close(_host(dev), _host(cpu), dtype, factor=4)
    _assert_same_steps(_host(dev), _host(cpu), start, dtype)
    for key in ('m', 'v'):
        _assert_close(*({path: numpy.asarray(cuda.to_cpu(
            p.update_rule.state[key]), numpy.float64)
            for path, p in model.namedparams()} for model in (dev, cpu)),
            dtype, factor=4)
    _assert_same_observations(opts, dtype)


@pytest.mark.parametrize('scaling', [None, 'static', 'dynamic'])
def test_lamb_mixed16_batched_agrees_with_the_rule_path(gpu, scaling):
    """As LARS's: the mixed16 group's kernels against the rule's path on
    the device and against the CPU."""
    cpu = Params(MIXED, numpy.float16)
    devs = [gpu.send(Params(MIXED, numpy.float16)) for _ in range(2)]
    opts = [_run(model, chainer_lars.LAMB(
        alpha=0.01, weight_decay_rate=1e-2, multi_tensor=multi_tensor),
        None, scaling, fp32_update=True, steps=3, g_scale=1e-2)
        for model, multi_tensor in ((cpu, True), (devs[0], True),
                                    (devs[1], False))]
    assert all(g.mixed16 for g in ref.plan_of(opts[1]).groups)
    batched, per_rule = devs
    for expected in (per_rule, cpu):
        _assert_close(_masters(batched), _masters(expected), numpy.float32,
                      factor=4)
        for path, half in _host(batched).items():
            other = _host(expected)[path]
            ulp = numpy.spacing(numpy.maximum(
                numpy.abs(half), numpy.abs(other)).astype(numpy.float16))
            assert (numpy.abs(half - other) <= ulp).all(), path


def test_hook_mixed16_launches_as_often_for_8_arrays_as_for_64(gpu):
    """With float32 masters, the float16 gradients are rescaled in one
    batched pass: our launches do not grow with the number of arrays."""
    counts = []
    for n in (8, 64):
        _, dev = _pair(gpu, [THREADS + 1] * n, numpy.float16, biases=0)
        opt = optimizers.MomentumSGD(lr=0.05)
        _run(dev, opt, chainer_lars.GradientLARS(), 'dynamic',
             fp32_update=True, steps=2, g_scale=1e-2)  # the masters made
        del gpu.launches[:]
        dev.refill_grads(9, 1e-2)
        _scale_grads(dev, opt._loss_scale)
        opt.update()
        counts.append(list(gpu.launches))
    assert counts[0] == counts[1] == ['chainer_lars_multi_norms',
                                      'chainer_lars_multi_scale_add']


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_hook_mixed16_batched_agrees_with_the_rule_path(gpu, multi_tensor):
    """The batched pass against the hook in each rule, on the device,
    through an overflow under dynamic scaling: masters and momentum to
    float32 rounding, float16 weights within one unit in the last place;
    and against the CPU's batched pass."""
    from tests import test_hook
    runs, hook = test_hook._mixed16_runs(multi_tensor, xp=gpu.xp,
                                         send=gpu.send)
    cpu_runs, cpu_hook = test_hook._mixed16_runs(multi_tensor)
    for (model, _), (cpu, _) in zip(runs, cpu_runs):
        for path, param in model.namedparams():
            rule = param.update_rule
            cpu_param = dict(cpu.namedparams())[path]
            for x, y in ((rule._fp32_param.array,
                          cpu_param.update_rule._fp32_param.array),
                         (rule.state['v'], cpu_param.update_rule.state['v'])):
                testing.assert_allclose(cuda.to_cpu(x), y, rtol=1e-5,
                                        atol=1e-7)
    ref.assert_mixed16_close(runs[0][0], runs[1][0], states=('v',))
    _assert_same_observations([cpu_hook, hook], numpy.float32)


@pytest.mark.parametrize('make', [lambda: chainer_lars.LARS(lr=1e-3),
                                  lambda: chainer_lars.LAMB(alpha=1e-5)])
def test_a_float16_step_that_rounds_away_is_warned_of_without_waiting(
        gpu, make):
    """On the device the kernels count the float16 weights whose step
    rounded away; the counts reach the host in a copy it never waits for,
    read once done, and the optimizer warns once."""
    _, dev = _pair(gpu, MIXED, numpy.float16, g_scale=1e-2)
    opt = make().setup(dev)
    with pytest.warns(RuntimeWarning, match='rounded away') as caught:
        for step in range(4):
            if gpu.emulated:
                emulated_cupy.stats.reset()
            dev.refill_grads(20 + step, 1e-2)
            opt.update()
            if gpu.emulated:
                assert emulated_cupy.stats.to_host == 0
                assert emulated_cupy.stats.to_host_async >= 1
        if not gpu.emulated:
            cuda.cupy.cuda.Device().synchronize()
            opt.update()
    assert len([w for w in caught if 'rounded away' in str(w.message)]) == 1


@pytest.mark.parametrize('make', [
    lambda: chainer_lars.LARS(lr=100.0, weight_decay=0.0),
    lambda: chainer_lars.LARS(lr=100.0, weight_decay=0.0,
                              multi_tensor=False),
    lambda: chainer_lars.LAMB(alpha=0.1, weight_decay_rate=0.0)])
def test_float16_rows_without_a_gradient_are_not_steps_that_rounded_away(
        gpu, make):
    """As on the CPU (tests/test_lifetime.py): without weight decay, the
    elements whose gradient is 0 stand still, which the kernels must not
    count as steps that rounded away; only the rows that moved are steps,
    and they moved."""
    model = chainer.Link()
    with model.init_scope():
        model.w = chainer.Parameter(numpy.ones(64, numpy.float16))
        model.b = chainer.Parameter(
            numpy.linspace(-1, 1, 64).astype(numpy.float16))
    gpu.send(model)
    opt = make().setup(model)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        for _ in range(4):
            w = cuda.to_cpu(model.w.array)
            for param in model.params():
                g = numpy.zeros(param.shape, param.dtype)
                g[:8] = 1e-2
                param.grad = gpu.xp.asarray(g)
            opt.update()
            if not gpu.emulated:
                cuda.cupy.cuda.Device().synchronize()
            moved = cuda.to_cpu(model.w.array) != w
            assert moved[:8].all() and not moved[8:].any()
        opt.update()  # reads the last update's counts


@pytest.mark.parametrize('face', ['lars', 'hook'])
def test_a_strided_float16_gradient_of_a_mixed16_row_is_taken(gpu, face):
    """It is checked against float16, the gradients' dtype, not against
    the float32 master's; the result is the CPU's."""
    weights = []
    for xp in (numpy, gpu.xp):
        link = chainer.links.Linear(
            3, 2, initialW=chainer.initializers.Normal(1.0, numpy.float16),
            initial_bias=chainer.initializers.Zero(numpy.float16))
        link.W.array[...] = numpy.arange(6).reshape(2, 3) / 8
        if xp is not numpy:
            gpu.send(link)
        if face == 'lars':
            opt = chainer_lars.LARS(lr=0.5).setup(link)
        else:
            opt = optimizers.MomentumSGD(lr=0.5).setup(link)
            opt.add_hook(chainer_lars.GradientLARS(weight_decay=1e-3))
        opt.use_fp32_update()
        for step in range(2):  # the masters are made at the first
            link.W.grad = xp.asarray(
                numpy.arange(6, dtype=numpy.float16).reshape(3, 2) / 4).T
            link.b.grad = xp.ones(2, numpy.float16)
            assert not link.W.grad.flags.c_contiguous
            opt.update()
        weights.append(chainer.backends.cuda.to_cpu(link.W.array))
    testing.assert_allclose(weights[0], weights[1], rtol=4e-3)


FACES = {'lars': functools.partial(chainer_lars.LARS, lr=2.0),
         'lamb': functools.partial(chainer_lars.LAMB, alpha=0.1)}


@pytest.mark.filterwarnings('ignore:.*rounded away:RuntimeWarning')
@pytest.mark.parametrize('face', sorted(FACES))
@pytest.mark.parametrize('dtype,fp32_update', [
    (numpy.float32, False), (numpy.float16, False), (numpy.float16, True)])
def test_a_run_resumed_on_the_device_continues_it_bit_for_bit(
        gpu, face, dtype, fp32_update):
    """A snapshot loads the rules' states as NumPy arrays, on a model
    already sent to the device: they move there, as Chainer's rules move
    theirs, and the run goes on as if never stopped."""
    runs = []
    for resumed in (False, True):
        model = gpu.send(Params(MIXED, dtype))
        opt = _run(model, FACES[face](), None, None, fp32_update, steps=1)
        if resumed:
            snapshot = io.BytesIO()
            serializers.save_npz(snapshot, opt)
            again = gpu.send(Params(MIXED, dtype, seed=7))
            again.copyparams(model)
            opt = FACES[face]().setup(again)
            if fp32_update:
                opt.use_fp32_update()
            serializers.load_npz(io.BytesIO(snapshot.getvalue()), opt)
            model = again
        for step in (1, 2):
            model.refill_grads(100 + step)
            opt.update()
        for _, param in model.namedparams():
            for state in param.update_rule.state.values():
                assert isinstance(state, gpu.xp.ndarray)
        runs.append(_host(model))
    for path, expected in runs[0].items():
        numpy.testing.assert_array_equal(runs[1][path], expected, path)


@pytest.mark.parametrize('face', sorted(FACES))
def test_a_model_moved_between_updates_takes_its_states_along(gpu, face):
    """Trained on the host, then on the device, then on the host again:
    the batched path as the per-rule one (which Chainer's rule moves)."""
    runs = []
    for multi_tensor in (True, False):
        model = Params(MIXED, numpy.float32)
        opt = FACES[face](multi_tensor=multi_tensor).setup(model)
        for step, device in enumerate(['@numpy', '@cupy:0', '@numpy']):
            model.to_device(device)
            model.refill_grads(100 + step)
            opt.update()
        runs.append(_host(model))
    for path, expected in runs[1].items():
        numpy.testing.assert_array_equal(runs[0][path], expected, path)


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('face, state', [('LARS', 'momentum buffer'),
                                         ('LAMB', 'first moment')])
def test_a_weight_of_another_dtype_than_its_states_is_refused(
        gpu, face, state, multi_tensor):
    # The kernels read a row's arrays in one dtype: a float64 weight beside
    # float32 states would be read past their end. Refused, naming both,
    # before anything moves (NumPy computes it: the CPU path does).
    model = gpu.send(Params([5, 7], numpy.float32))
    opt = getattr(chainer_lars, face)(multi_tensor=multi_tensor)
    opt.setup(model)
    opt.update()
    model.l0.W.array = model.l0.W.array.astype(numpy.float64)
    model.refill_grads(2)
    before = _host(model)
    with pytest.raises(TypeError, match='^/l0/W: the {} is float32 but the '
                       'weight float64$'.format(state)):
        opt.update()
    after = _host(model)
    assert all((after[path] == before[path]).all() for path in before)


@pytest.mark.parametrize('snapshot', [False, True])
@pytest.mark.parametrize('face, state', [('LARS', 'momentum buffer'),
                                         ('LAMB', 'first moment')])
def test_float16_states_beside_a_master_about_to_be_made_are_refused_first(
        gpu, face, state, snapshot):
    # A float16 rule with states, switched to master copies (by
    # use_fp32_update(), or a float16 run's snapshot loaded into a mixed16
    # optimizer), makes its master at its next update; the kernels read
    # states of the master's dtype. Refused before the batched group (/l2,
    # float32: as BatchNorm's in a float16 model) or a rule moves.
    model = gpu.send(Params([5, 7], numpy.float16))
    with model.init_scope():
        model.l2 = chainer.Link()
        with model.l2.init_scope():
            model.l2.W = chainer.Parameter(numpy.ones(3, numpy.float32))
    gpu.send(model)
    opt = getattr(chainer_lars, face)().setup(model)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # rounded away
        for step in range(2):
            model.refill_grads(step)
            opt.update()
    if snapshot:
        saved = io.BytesIO()
        serializers.save_npz(saved, opt)
        opt = getattr(chainer_lars, face)().setup(model)
        opt.use_fp32_update()
        saved.seek(0)
        serializers.load_npz(saved, opt)
    else:
        model.l0.W.update_rule.use_fp32_update()
    model.refill_grads(2)
    before = _host(model)
    before_t = [p.update_rule.t for p in model.params()]
    with pytest.raises(TypeError, match='^/l0/W: the {} is float16 but the '
                       'weight float32$'.format(state)):
        opt.update()
    after = _host(model)
    assert all((after[path] == before[path]).all() for path in before)
    assert [p.update_rule.t for p in model.params()] == before_t


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('face', sorted(FACES))
def test_a_mixed16_model_moved_to_the_host_lets_its_device_arrays_go(
        gpu, face, multi_tensor):
    # The masters move with the model at the next update; Chainer's
    # Parameter kept the device array it was made of (its initializer).
    model = gpu.send(Params([5, 7], numpy.float16))
    opt = FACES[face](multi_tensor=multi_tensor).setup(model)
    opt.use_fp32_update()
    for step in range(2):
        model.refill_grads(step)
        opt.update()
    old = [weakref.ref(a) for p in model.params() for a in [
        p.array, p.update_rule._fp32_param.array] + list(
            p.update_rule.state.values())]
    model.to_device('@numpy')
    model.refill_grads(2)
    opt.update()
    gc.collect()
    assert [ref() is None for ref in old] == [True] * len(old)


def test_a_mixed16_model_moved_to_the_host_under_the_hook_fails_as_chainer(
        gpu):
    # Chainer leaves the masters on the device: the hook's plan, made of
    # them, stayed, and its kernels read a NumPy gradient's address
    # ('memoryview' object has no attribute 'ptr'). Left to the rules.
    errors = []
    for hook in (False, True):
        model = gpu.send(Params([5, 7], numpy.float16))
        opt = chainer.optimizers.MomentumSGD(lr=0.1).setup(model)
        if hook:
            opt.add_hook(chainer_lars.GradientLARS())
        opt.use_fp32_update()
        for step in range(2):  # the first makes the masters
            model.refill_grads(step)
            opt.update()
        model.to_device('@numpy')
        model.refill_grads(2)
        with pytest.raises(TypeError) as error:
            opt.update()
        errors.append(str(error.value))
    assert errors[1] == errors[0]
    assert errors[0].startswith('Type of data and grad mismatch')


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
def test_a_mixed16_gradient_of_another_dtype_is_refused_naming_the_weights(
        gpu, face):
    # Chainer's grad_var.array takes any dtype; a mixed16 row's kernels
    # read the float16 gradient: refused before anything moves, naming the
    # user's float16 weight (it said "the float16 weight float16").
    model = gpu.send(Params([5, 7], numpy.float16))
    opt = optimizer_of(face, model)
    opt.use_fp32_update()
    model.refill_grads(1)
    opt.update()
    model.refill_grads(2)
    model.l0.W.grad_var.array = model.l0.W.grad.astype(numpy.float64)
    before = _host(model)
    with pytest.raises(TypeError, match='^/l0/W: the gradient is float64 '
                       'but the weight float16$'):
        opt.update()
    after = _host(model)
    assert all((after[path] == before[path]).all() for path in before)


def _on_device_1(gpu, array):
    """A copy of the device array ``array`` in the memory of GPU 1."""
    if gpu.xp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip('one GPU: no other device to give a gradient on')
    with gpu.xp.cuda.Device(1):
        return gpu.xp.asarray(cuda.to_cpu(array))


def _set_up_on_gpu_0(gpu, face, multi_tensor, mixed16, scaling, sizes):
    model = gpu.send(Params(sizes, numpy.float16 if mixed16 else
                            numpy.float32))
    opt = optimizer_of(face, model, multi_tensor)
    if mixed16:
        opt.use_fp32_update()
    if scaling:
        opt.loss_scaling(**({'scale': 8.0} if scaling == 'static' else {}))
        for param in model.params():
            param._loss_scale = opt._loss_scale
    opt.update()
    model.refill_grads(2)
    return model, opt


_OURS = r'^{}: the gradient is on <.*Device 1> but the weight on <.*Device 0>$'
_CUPYS = r'^The device where the array resides \(1\) is different from the ' \
    r'current device \(0\)\. Peer access is unavailable'


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
@pytest.mark.parametrize('mixed16', [False, True])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('scaling', [None, 'static', 'dynamic'])
def test_a_gradient_on_another_gpu_is_refused_before_anything_moves(
        gpu, face, mixed16, multi_tensor, scaling):
    # Chainer's grad setter takes a CuPy array on any GPU; the kernels
    # would read (the hook: write) it from the weight's GPU through its
    # address, an illegal memory access without peer access. Refused,
    # naming the path and both devices, before any array moves; where
    # CuPy reads it first (dynamic loss scaling's check; Chainer's own
    # rule dividing the loss scale out, or casting a float16 gradient),
    # CuPy refuses it, as it would Chainer's optimizers.
    model, opt = _set_up_on_gpu_0(gpu, face, multi_tensor, mixed16, scaling,
                                  [THREADS + 3, 5, 7])
    one_by_one = face != 'hook' and not multi_tensor  # as in Chainer's loop
    cupys = scaling == 'dynamic' or one_by_one and (scaling or mixed16)
    if cupys and not gpu.emulated and (
            gpu.xp.cuda.runtime.deviceCanAccessPeer(0, 1)):
        pytest.skip('peer access: CuPy copies the gradient to GPU 0')
    model.l1.W.grad = _on_device_1(gpu, model.l1.W.grad)
    before = [_host(model), _host(model, 'grad')]
    with pytest.raises(ValueError, match=_CUPYS if cupys else _OURS.format(
            '/l1/W')):
        opt.update()
    # (rules stepping one by one: /l0's have, unless checked before all)
    kept = sorted(before[0])[2:] if one_by_one and scaling != 'dynamic' else (
        sorted(before[0]))
    for arrays, attr in zip(before, ('array', 'grad')):
        after = _host(model, attr)
        assert all((after[path] == arrays[path]).all() for path in kept)
    model.refill_grads(3)  # gradients on GPU 0 again: it steps
    opt.update()
    assert (_host(model)['/l1/W'] != before[0]['/l1/W']).any()


@pytest.mark.parametrize('face, multi_tensor', [
    ('hook', True), ('hook', False), ('LARS', True)])  # (LARS's False: above)
def test_a_tied_gradient_on_another_gpu_is_refused_before_anything_moves(
        gpu, face, multi_tensor):
    # Tied weights step one by one, after the batched groups: checked
    # before those, as the others (the hook rescaled the others first).
    model, opt = _set_up_on_gpu_0(gpu, face, multi_tensor, False, None,
                                  [THREADS + 3, 7, 7])
    model.l2.W.array = model.l1.W.array
    opt.update()
    model.refill_grads(3)
    model.l2.W.grad = _on_device_1(gpu, model.l2.W.grad)
    before = [_host(model), _host(model, 'grad')]
    with pytest.raises(ValueError, match=_OURS.format('/l2/W')):
        opt.update()
    for arrays, attr in zip(before, ('array', 'grad')):
        after = _host(model, attr)
        assert all((after[path] == arrays[path]).all() for path in arrays)


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
def test_a_gradient_of_a_cupy_subclass_on_another_gpu_is_refused(gpu, face):
    if not gpu.emulated:
        pytest.skip('a subclass view of a device array: the emulator\'s')

    class Sub(gpu.xp.ndarray):
        pass

    model, opt = _set_up_on_gpu_0(gpu, face, True, False, None,
                                  [THREADS + 3, 5, 7])
    g = _on_device_1(gpu, model.l1.W.grad)
    model.l1.W.grad = Sub._view(g._alloc, g._a)
    before = _host(model)
    with pytest.raises(ValueError, match=_OURS.format('/l1/W')):
        opt.update()
    after = _host(model)
    assert all((after[path] == before[path]).all() for path in before)


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
def test_the_first_update_in_fp32_leaves_another_gpus_gradient_to_cupy(
        gpu, face):
    # Before Chainer's rules have made the masters (the first update after
    # use_fp32_update(), or after a snapshot, which holds none), each rule
    # casts its float16 gradient itself: CuPy's copy refuses one of another
    # GPU (without peer access), after the rules before it have stepped,
    # as Chainer's own optimizers do; no kernel of ours sees it.
    model = gpu.send(Params([THREADS + 3, 5, 7], numpy.float16))
    opt = optimizer_of(face, model)
    opt.use_fp32_update()
    if not gpu.emulated and gpu.xp.cuda.runtime.getDeviceCount() > 1 and (
            gpu.xp.cuda.runtime.deviceCanAccessPeer(0, 1)):
        pytest.skip('peer access: CuPy copies the gradient to GPU 0')
    model.l1.W.grad = _on_device_1(gpu, model.l1.W.grad)
    before = _host(model)
    with pytest.raises(ValueError, match=_CUPYS):
        opt.update()
    after = _host(model)
    assert all((after[path] == before[path]).all()
               for path in sorted(before)[2:])


@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
def test_a_state_on_another_gpu_moves_to_its_weights_as_chainer_moves_it(
        gpu, face):
    # Chainer's rules send their states to the parameter's device when
    # they update; a plan made anew does the same before its checks.
    models = [gpu.send(Params([THREADS + 3, 5], numpy.float32))
              for _ in range(2)]
    for model in models:
        opt = getattr(chainer_lars, face)().setup(model)
        opt.update()
        model.refill_grads(2)
        if model is models[1]:
            state = model.l0.W.update_rule.state
            for name in sorted(state):
                state[name] = _on_device_1(gpu, state[name])
        opt.update()
    state = models[1].l0.W.update_rule.state
    assert state and all(a.device.id == 0 for a in state.values())
    assert _host(models[1]).keys() == _host(models[0]).keys()
    for path, array in _host(models[0]).items():
        numpy.testing.assert_array_equal(_host(models[1])[path], array)


def test_pinned_buffers_outlive_the_copies_still_pending(monkeypatch):
    # A GPU runs behind the host: a group's words are copied from pinned
    # memory when the stream gets there. A state that dies first (the
    # per-array copy route makes one per update, a plan rebuilt drops its
    # own) keeps the buffers of its copies until their events are done, or
    # CuPy's pool hands them out again while a copy still reads them.
    class Buffer(bytearray):  # (one a weak reference can follow)
        pass

    made, copied = [], set()
    gc.collect()  # the states other tests left
    monkeypatch.setattr(cuda_kernels, '_RETIRED', [])

    def allocate(size):
        made.append(Buffer(int(size)))
        return made[-1]

    def recorded(method, host):  # the buffers copies read or write
        def copy(self, *args, **kwargs):
            copied.add(id(getattr(host(args, kwargs).base, 'obj', None)))
            return method(self, *args, **kwargs)
        return copy

    with emulated_cupy.installed():
        monkeypatch.setattr(emulated_cupy.cuda, 'alloc_pinned_memory',
                            allocate)
        monkeypatch.setattr(emulated_cupy.ndarray, 'set', recorded(
            emulated_cupy.ndarray.set, lambda args, kwargs: args[0]))
        monkeypatch.setattr(emulated_cupy.ndarray, 'get', recorded(
            emulated_cupy.ndarray.get, lambda args, kwargs: kwargs.get(
                'out', numpy.empty(0))))
        monkeypatch.setattr(emulated_cupy.Event, 'done', False)
        model = Params([5, 7], numpy.float16)
        model.to_device('@cupy:0')
        model.l1.W.array = model.l1.W.array[::-1]  # the copy route
        opt = chainer_lars.LARS().setup(model)
        for step in range(4):  # the first makes the states, rule by rule
            model.refill_grads(step)
            opt.update()
        used = [weakref.ref(b) for b in made if id(b) in copied]
        del made[:]
        gc.collect()
        assert len(used) > 8 and all(ref() is not None for ref in used)
        # The rules' plans of the first update, two updates' copy routes.
        assert len(cuda_kernels._RETIRED) == 4 + 2
        monkeypatch.setattr(emulated_cupy.Event, 'done', True)
        model.refill_grads(4)
        opt.update()
        gc.collect()
    assert cuda_kernels._RETIRED == []
    # The batched group's ring and the last copy route's are in use.
    assert 0 < sum(ref() is not None for ref in used) < len(used)


@pytest.mark.parametrize('name', ['SGD', 'MomentumSGD'])
def test_chainer_s_own_optimizers_step_on_the_device_as_on_the_cpu(
        gpu, monkeypatch, name):
    """Chainer's ``SGD`` and ``MomentumSGD``, which the other tests set
    beside ours, run their own elementwise kernels on the device (SGD's
    operation has no closing ';', which CuPy adds: the emulator did not)."""
    module = {'SGD': optimizers.sgd, 'MomentumSGD': optimizers.momentum_sgd}
    monkeypatch.setattr(getattr(module[name], name + 'Rule'), '_kernel',
                        None)
    models = [Params([5, THREADS + 1], numpy.float32) for _ in range(2)]
    models[1] = gpu.send(models[1])
    for model in models:
        opt = getattr(optimizers, name)(lr=0.05)
        opt.setup(model)
        for step in range(2):
            model.refill_grads(100 + step)
            opt.update()
    for (path, cpu), (_, device) in zip(sorted(models[0].namedparams()),
                                        sorted(models[1].namedparams())):
        numpy.testing.assert_allclose(cuda.to_cpu(device.array), cpu.array,
                                      rtol=RTOL[numpy.float32], err_msg=path)
