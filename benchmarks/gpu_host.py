"""The host cost of the GPU path, without a GPU: launches that do nothing.

The ``--gpu-host`` mode of ``benchmarks/bench_lars.py``. Runs updates of
each GPU variant on the emulated device of
:mod:`chainer_lars.testing.emulated_cupy` with ``execute=False,
check=False``: the whole host code runs (Chainer's update loop, our plans,
tables, the settings upload) but every kernel launch is only counted, a
no-op. In the same run, interleaved, it times Chainer's ``MomentumSGD`` CPU
update of the same parameter set, and reports each as microseconds per
update and per array.

The target (issue "One update for all arrays"): the GPU path's host cost
per array at most a quarter of ``MomentumSGD``'s CPU cost per array on the
ResNet-20 set. What CuPy itself costs per launch (a few microseconds, two
launches per update and dtype here) is not in it. The emulated arrays'
``shape``, ``dtype`` and ``strides`` are plain attributes, read at C
speed as CuPy's are; ``data``, ``flags`` and ``device`` are Python
properties and their methods Python functions, slower than CuPy's.
"""

import os
import sys
import time

import numpy

from chainer import optimizers

try:
    import chainer_lars
except ImportError:
    # Run from a source checkout without installing.
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    import chainer_lars
from chainer_lars.testing import emulated_cupy


VARIANTS = {
    'lars': lambda: (chainer_lars.LARS(lr=1.0), None),
    'lars per array': lambda: (chainer_lars.LARS(lr=1.0,
                                                 multi_tensor=False), None),
    'hook': lambda: (optimizers.MomentumSGD(lr=0.1),
                     chainer_lars.GradientLARS(weight_decay=5e-4)),
    'momentum_sgd': lambda: (optimizers.MomentumSGD(lr=0.1), None),
}
#: Timed as hook(optimizer) alone, so that its row is the hook's host
#: cost; the optimizer's own update is the ``momentum_sgd (GPU host)`` row
#: (Chainer's host code, its elementwise launches counted no-ops).
HOOK_ALONE = ('hook',)


def _setup(build_model, model, device, make):
    link = build_model(model, numpy.float32)
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


def _step(opt, hook, name):
    if name in HOOK_ALONE:
        return lambda: hook(opt)
    return opt.update


#: The baseline every GPU variant is compared with, per array.
BASELINE = 'momentum_sgd (CPU)'
#: The variants the target applies to, and its bound.
TARGETED = ('lars (GPU host)', 'hook (GPU host)')
BOUND = 0.25


def run(build_model, model='cifar_resnet20', reps=200, warmup=3):
    """Times the GPU host code of every variant and the CPU baseline.

    ``build_model(model, dtype)`` makes the link (``bench_lars``'s).

    The variants run interleaved, one call each per repetition in a
    rotating order, so that a slow spell of a shared machine slows all of
    them alike; ratios are medians of the per-repetition ratios.

    Returns:
        dict: ``{'model', 'n_arrays', 'reps', 'variants': {name: {'us',
        'us_per_array', 'launches', 'per_array_vs_baseline'}}, 'targets'}``.

    """
    if reps < 1:
        raise ValueError('reps must be at least 1, got {}'.format(reps))
    steps, counts, launches = {}, {}, {}
    with emulated_cupy.installed(execute=False, check=False):
        opt, hook, n = _setup(build_model, model, '@numpy',
                              VARIANTS['momentum_sgd'])
        steps[BASELINE] = opt.update
        counts[BASELINE] = n
        for name, make in VARIANTS.items():
            opt, hook, n = _setup(build_model, model, '@cupy:0', make)
            steps[name + ' (GPU host)'] = _step(opt, hook, name)
            counts[name + ' (GPU host)'] = n
        for name, step in steps.items():
            for _ in range(warmup):  # state, plans, tables, modules
                step()
            emulated_cupy.stats.reset()
            step()
            launches[name] = len(emulated_cupy.stats.launches)
        names = list(steps)
        times = {name: [] for name in names}
        for rep in range(reps):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                start = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - start)
    base = numpy.array(times[BASELINE]) / counts[BASELINE]
    variants = {}
    for name in names:
        t = numpy.array(times[name])
        variants[name] = {
            'us': float(numpy.median(t)) * 1e6,
            'us_per_array': float(numpy.median(t)) * 1e6 / counts[name],
            'launches': launches[name],
            'per_array_vs_baseline': float(numpy.median(
                t / counts[name] / base)),
        }
    targets = [{
        'name': '{} per array <= {} x {} per array'.format(
            name, BOUND, BASELINE),
        'value': variants[name]['per_array_vs_baseline'], 'bound': BOUND,
        'pass': variants[name]['per_array_vs_baseline'] <= BOUND}
        for name in TARGETED]
    return {'model': model, 'n_arrays': counts[BASELINE], 'reps': reps,
            'variants': variants, 'targets': targets}


def format_result(result):
    """The result of :func:`run` as the lines ``bench_lars.py`` prints."""
    lines = ['GPU host code ({} launches are no-ops), {}: {} arrays, median '
             'of {} interleaved repetitions'.format(
                 'emulated', result['model'], result['n_arrays'],
                 result['reps']),
             '{:<28} {:>11} {:>10} {:>9} {:>15}'.format(
                 'variant', 'us/update', 'us/array', 'launches',
                 'per array / CPU')]
    for name, v in result['variants'].items():
        lines.append('{:<28} {:>11.1f} {:>10.2f} {:>9} {:>15.3f}'.format(
            name, v['us'], v['us_per_array'], v['launches'],
            v['per_array_vs_baseline']))
    for t in result['targets']:
        lines.append('target: {}: {:.3f} {}'.format(
            t['name'], t['value'], 'PASS' if t['pass'] else 'FAIL'))
    return lines
