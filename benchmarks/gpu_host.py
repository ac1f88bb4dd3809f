#!/usr/bin/env python
"""The host cost of the GPU path, without a GPU: launches that do nothing.

Runs one update of each GPU variant on the emulated device of
:mod:`chainer_lars.testing.emulated_cupy` with ``execute=False``: the whole
host code runs (Chainer's update loop, our plans, tables, settings upload,
argument packing and checking) but every kernel launch returns at once. In
the same run it times Chainer's ``MomentumSGD`` CPU update of the same
parameter set, and reports each as microseconds per update and per array.

The target (issue "One update for all arrays"): the GPU path's host cost
per array at most a quarter of ``MomentumSGD``'s CPU cost per array on the
ResNet-20 set. The emulator's own argument checking is counted as host
cost, so this overstates what CuPy's launches cost.

Usage::

    python benchmarks/gpu_host.py [--model cifar_resnet20] [--reps 200]
"""

import argparse
import os
import statistics
import sys
import time

import numpy

from chainer import optimizers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import chainer_lars  # NOQA: E402
from chainer_lars.testing import emulated_cupy  # NOQA: E402

import bench_lars  # NOQA: E402  (its models)


VARIANTS = {
    'lars': lambda: (chainer_lars.LARS(lr=1.0), None),
    'lars per array': lambda: (chainer_lars.LARS(lr=1.0,
                                                 multi_tensor=False), None),
    'hook': lambda: (optimizers.MomentumSGD(lr=0.1),
                     chainer_lars.GradientLARS(weight_decay=5e-4)),
    'momentum_sgd': lambda: (optimizers.MomentumSGD(lr=0.1), None),
}
#: Timed as hook(optimizer) alone: MomentumSGD's own launches go through
#: the emulator's Python stand-in for CuPy's ElementwiseKernel, whose cost
#: says nothing of CuPy's.
HOOK_ALONE = ('hook',)


def _setup(model, device, make):
    link = bench_lars.build_model(model, numpy.float32)
    rng = numpy.random.RandomState(0)
    for param in link.params():
        param.grad = (rng.standard_normal(param.shape) * 1e-2).astype(
            numpy.float32)
    link.to_device(device)
    opt, hook = make()
    opt.setup(link)
    if hook is not None:
        opt.add_hook(hook)
    n_arrays = sum(1 for _ in link.params())
    return opt, hook, n_arrays


def _time(step, reps):
    for _ in range(3):  # state, plans, tables, compiled modules
        step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _step(opt, hook, name):
    if name in HOOK_ALONE:
        return lambda: hook(opt)
    return opt.update


def run(model='cifar_resnet20', reps=200):
    """``{variant: (us per update, us per array, launches per update)}``."""
    result = {}
    opt, _, n = _setup(model, '@numpy', VARIANTS['momentum_sgd'])
    cpu = _time(opt.update, reps)
    result['momentum_sgd (CPU)'] = (cpu * 1e6, cpu * 1e6 / n, 0)
    with emulated_cupy.installed(execute=False):
        for name, make in VARIANTS.items():
            opt, hook, n = _setup(model, '@cupy:0', make)
            step = _step(opt, hook, name)
            t = _time(step, reps)
            emulated_cupy.stats.reset()
            step()
            launches = len(emulated_cupy.stats.launches)
            result[name + ' (GPU host)'] = (t * 1e6, t * 1e6 / n, launches)
    return result, n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='cifar_resnet20',
                        choices=bench_lars.MODELS)
    parser.add_argument('--reps', type=int, default=200)
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error('--reps must be at least 1, got {}'.format(args.reps))
    result, n = run(args.model, args.reps)
    print('{}: {} arrays, median of {} updates'.format(
        args.model, n, args.reps))
    print('{:<30} {:>12} {:>12} {:>9}'.format(
        'variant', 'us/update', 'us/array', 'launches'))
    for name, (total, per_array, launches) in result.items():
        print('{:<30} {:>12.1f} {:>12.2f} {:>9}'.format(
            name, total, per_array, launches))
    cpu = result['momentum_sgd (CPU)'][1]
    ok = True
    for name in ('lars (GPU host)', 'hook (GPU host)'):
        ratio = result[name][1] / cpu
        passed = ratio <= 0.25
        ok &= passed
        print('target: {} per array <= 0.25 x momentum_sgd (CPU) per '
              'array: {:.3f} {}'.format(name, ratio,
                                        'PASS' if passed else 'FAIL'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
