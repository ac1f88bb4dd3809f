"""GPU tests: the CUDA kernels against the CPU path, launches, no host sync.

Skipped where CUDA is not available; ``benchmarks/gpu_check.sh`` runs them
on a machine with a GPU.
"""

import numpy
import pytest

from chainer.backends import cuda
from chainer import optimizers
from chainer import testing

import chainer_lars
from tests import lars_reference as ref


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available, reason='CUDA is not available'),
]

PATHS = ['/conv1/W', '/conv1/b', '/bn1/gamma', '/bn1/beta', '/fc/W', '/fc/b']
TOL = {numpy.float16: 5e-3, numpy.float32: 1e-5, numpy.float64: 1e-12}

HOOK_CASES = [
    dict(),
    dict(weight_decay=1e-3, trust_coefficient=0.5, eps=0.0,
         exclude_from_weight_decay=['/b$', 'bn1'],
         exclude_from_layer_adaptation=['/conv1/b', 'gamma']),
    dict(clip=True, trust_coefficient=1e-3, weight_decay=1e-4),
    dict(threshold=0.0, weight_decay=0.1),
]


def _pair(dtype, seed=0):
    cpu, gpu = ref.Net(dtype), ref.Net(dtype)
    ref.fill(cpu, seed)
    ref.fill(gpu, seed)
    gpu.to_gpu()
    return cpu, gpu


class _LaunchCounter(object):

    def __init__(self, monkeypatch):
        from chainer_lars import cuda_kernels
        self.names = []
        original = cuda_kernels._kernel

        def counting(dtype, name):
            kernel = original(dtype, name)

            def launch(*args, **kwargs):
                self.names.append(name)
                return kernel(*args, **kwargs)
            return launch
        monkeypatch.setattr(cuda_kernels, '_kernel', counting)


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('kwargs', HOOK_CASES)
@pytest.mark.parametrize('loss_scale', [None, 2.0 ** 10])
def test_hook_agrees_with_cpu(dtype, multi_tensor, kwargs, loss_scale):
    cpu, gpu = _pair(dtype)
    results = []
    for model in (cpu, gpu):
        opt = optimizers.MomentumSGD(lr=0.05)
        opt.setup(model)
        hook = chainer_lars.GradientLARS(multi_tensor=multi_tensor, **kwargs)
        if loss_scale:
            for p in model.params():
                p.grad *= loss_scale
                p._loss_scale = loss_scale
        hook(opt)
        results.append((ref.snapshot(model, 'grad'), hook.observe()))
    (g_cpu, o_cpu), (g_gpu, o_gpu) = results
    tol = TOL[dtype]
    for path in PATHS:
        testing.assert_allclose(g_gpu[path], g_cpu[path], rtol=tol, atol=tol)
        testing.assert_allclose(o_gpu[path], o_cpu[path], rtol=tol)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_hook_fp16_agrees_with_cpu(fp32_update):
    cpu, gpu = _pair(numpy.float16)
    for model in (cpu, gpu):
        opt = optimizers.MomentumSGD(lr=0.05)
        opt.setup(model)
        if fp32_update:
            opt.use_fp32_update()
        opt.loss_scaling(scale=256.0)
        opt.add_hook(chainer_lars.GradientLARS(weight_decay=1e-3))
        for step in range(3):
            x, t = ref.batch(step, dtype=numpy.float16)
            if model is gpu:
                x, t = cuda.to_gpu(x), cuda.to_gpu(t)
            opt.update(ref.loss_fn(model, x, t))
    a, b = ref.snapshot(cpu), ref.snapshot(gpu)
    for path in PATHS:
        testing.assert_allclose(b[path], a[path], rtol=1e-2, atol=1e-2)


def test_hook_multi_tensor_uses_two_launches(monkeypatch):
    counter = _LaunchCounter(monkeypatch)
    _, gpu = _pair(numpy.float32)
    opt = optimizers.MomentumSGD(lr=0.05)
    opt.setup(gpu)
    chainer_lars.GradientLARS(weight_decay=1e-4)(opt)
    assert counter.names == ['chainer_lars_multi_sqnorms',
                             'chainer_lars_multi_scale_add']


def test_hook_per_array_uses_two_launches_each(monkeypatch):
    counter = _LaunchCounter(monkeypatch)
    _, gpu = _pair(numpy.float32)
    opt = optimizers.MomentumSGD(lr=0.05)
    opt.setup(gpu)
    chainer_lars.GradientLARS(weight_decay=1e-4, multi_tensor=False)(opt)
    assert counter.names == ['chainer_lars_sqnorms',
                             'chainer_lars_scale_add'] * len(PATHS)


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('nesterov', [False, True])
def test_lars_agrees_with_cpu(dtype, nesterov):
    kwargs = dict(lr=0.5, weight_decay=1e-3, nesterov=nesterov,
                  exclude_from_weight_decay=['/b$'],
                  exclude_from_layer_adaptation=['bn1'])
    cpu, gpu = _pair(dtype)
    for model in (cpu, gpu):
        opt = chainer_lars.LARS(**kwargs)
        opt.setup(model)
        for step in range(4):
            x, t = ref.batch(step, dtype=dtype)
            if model is gpu:
                x, t = cuda.to_gpu(x), cuda.to_gpu(t)
            opt.update(ref.loss_fn(model, x, t))
    a, b = ref.snapshot(cpu), ref.snapshot(gpu)
    tol = TOL[dtype] * 10
    for path in PATHS:
        testing.assert_allclose(b[path], a[path], rtol=tol, atol=tol)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_lars_fp16_agrees_with_cpu(fp32_update):
    cpu, gpu = _pair(numpy.float16)
    for model in (cpu, gpu):
        opt = chainer_lars.LARS(lr=1.0, weight_decay=1e-3)
        opt.setup(model)
        if fp32_update:
            opt.use_fp32_update()
        for step in range(3):
            x, t = ref.batch(step, dtype=numpy.float16)
            if model is gpu:
                x, t = cuda.to_gpu(x), cuda.to_gpu(t)
            opt.update(ref.loss_fn(model, x, t))
    a, b = ref.snapshot(cpu), ref.snapshot(gpu)
    for path in PATHS:
        testing.assert_allclose(b[path], a[path], rtol=1e-2, atol=1e-2)


def test_lars_uses_two_launches_per_adapted_array(monkeypatch):
    counter = _LaunchCounter(monkeypatch)
    _, gpu = _pair(numpy.float32)
    opt = chainer_lars.LARS(exclude_from_layer_adaptation=['/b$'])
    opt.setup(gpu)
    opt.update()
    adapted = [p for p in PATHS if not p.endswith('/b')]
    assert counter.names.count('chainer_lars_sqnorms') == len(adapted)
    assert counter.names.count('chainer_lars_momentum') == len(PATHS)


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
])
def test_no_host_synchronisation(make):
    # A kernel that keeps the device busy for about a second is queued
    # first; an update that waited for the device would return after it.
    cupy = cuda.cupy
    _, gpu = _pair(numpy.float32)
    opt, hook = make()
    opt.setup(gpu)
    if hook is not None:
        opt.add_hook(hook)
    opt.update()  # compile the kernels, build the tables
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
