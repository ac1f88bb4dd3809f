"""The update's cost inside a training loop, and the tables it builds.

``bench_lars.py`` times updates of fixed gradients. In a run, backward
makes new gradient arrays at every iteration (``cleargrads()``), and the
memory pool decides their addresses; on a GPU the kernels' pointer tables
(``chainer_lars.cuda``) follow them. This trains an MLP of ``--layers``
linear layers (two arrays each) on random data and, per variant, prints
the median time of ``optimizer.update()`` alone (the device synchronised
before and after) over the iterations after the first five, and how many
tables the update built and repointed per iteration there::

    python benchmarks/train_loop.py --device 0 --dtype mixed16

Variants: ``momentum_sgd``, ``momentum_sgd+hook`` (``GradientLARS`` on
it), ``momentum_sgd+hook_pa`` (its per-array path), ``lars``,
``lars_pa``. ``mixed16``: float16 parameters with float32 masters
(``use_fp32_update``), where the hook rescales each master's gradient, a
new array at every update, in its rule.
"""

import argparse
import contextlib
import os
import sys
import time

import numpy

import chainer
import chainer.functions as F
import chainer.links as L

try:
    import chainer_lars
except ImportError:
    # Run from a source checkout without installing.
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    import chainer_lars
from chainer_lars import cuda as cuda_kernels


VARIANTS = {
    'momentum_sgd': lambda: (chainer.optimizers.MomentumSGD(lr=0.01), None),
    'momentum_sgd+hook': lambda: (
        chainer.optimizers.MomentumSGD(lr=0.01),
        chainer_lars.GradientLARS(weight_decay=5e-4)),
    'momentum_sgd+hook_pa': lambda: (
        chainer.optimizers.MomentumSGD(lr=0.01),
        chainer_lars.GradientLARS(weight_decay=5e-4, multi_tensor=False)),
    'lars': lambda: (chainer_lars.LARS(lr=1.0, weight_decay=5e-4), None),
    'lars_pa': lambda: (chainer_lars.LARS(lr=1.0, weight_decay=5e-4,
                                          multi_tensor=False), None),
}


class MLP(chainer.ChainList):

    def __init__(self, layers, width):
        super(MLP, self).__init__(
            *[L.Linear(width, width) for _ in range(layers - 1)]
            + [L.Linear(width, 10)])

    def forward(self, x):
        for link in self[:-1]:
            x = F.relu(link(x))
        return self[-1](x)


@contextlib.contextmanager
def _counting_tables():
    """Counts the tables built and repointed while in the context."""
    counts = {'built': 0, 'repointed': 0}
    saved = {}
    for name, key in (('__init__', 'built'), ('repoint', 'repointed')):
        method = vars(cuda_kernels.Table).get(name)
        if method is None:  # a version without repoint
            continue

        def counting(self, *args, _method=method, _key=key, **kwargs):
            counts[_key] += 1
            return _method(self, *args, **kwargs)
        saved[name] = method
        setattr(cuda_kernels.Table, name, counting)
    try:
        yield counts
    finally:
        for name, method in saved.items():
            setattr(cuda_kernels.Table, name, method)


def run_variant(name, device, dtype, args, counts):
    mixed16 = dtype == 'mixed16'
    param_dtype = numpy.float16 if mixed16 else numpy.dtype(dtype)
    with chainer.using_config('dtype', param_dtype):
        model = MLP(args.layers, args.width)
    model.to_device(device)
    opt, hook = VARIANTS[name]()
    opt.setup(model)
    if mixed16:
        opt.use_fp32_update()
    if hook is not None:
        opt.add_hook(hook)
    xp = device.xp
    sync = (lambda: None) if xp is numpy else device.device.synchronize
    rng = numpy.random.RandomState(0)
    times, built, repointed = [], 0, 0
    for it in range(args.iters):
        x = xp.asarray(rng.standard_normal(
            (args.batch, args.width)).astype(param_dtype))
        t = xp.asarray(rng.randint(0, 10, args.batch).astype(numpy.int32))
        model.cleargrads()
        loss = F.softmax_cross_entropy(model(x), t)
        loss.backward()
        sync()
        before = dict(counts)
        start = time.perf_counter()
        opt.update()
        sync()
        if it >= 5:
            times.append(time.perf_counter() - start)
            built += counts['built'] - before['built']
            repointed += counts['repointed'] - before['repointed']
    n = len(times)
    return {'ms': float(numpy.median(times)) * 1e3, 'built': built / n,
            'repointed': repointed / n,
            'arrays': sum(1 for _ in model.params())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', '-d', default='@numpy')
    parser.add_argument('--dtype', default='float32',
                        choices=('float32', 'mixed16'))
    parser.add_argument('--variants', default=','.join(VARIANTS),
                        help='comma-separated, of: ' + ', '.join(VARIANTS))
    parser.add_argument('--layers', type=int, default=40)
    parser.add_argument('--width', type=int, default=512)
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--iters', type=int, default=25)
    args = parser.parse_args(argv)
    if args.iters <= 5:
        parser.error('--iters must be more than 5 (the first five are not '
                     'timed), got {}'.format(args.iters))
    names = args.variants.split(',')
    for name in names:
        if name not in VARIANTS:
            parser.error('--variants: unknown {!r}; choose from {}'.format(
                name, ', '.join(VARIANTS)))
    device = chainer.get_device(args.device)
    print('{} {}, MLP of {} layers of {}, batch {}, median of {} updates'
          .format(device, args.dtype, args.layers, args.width, args.batch,
                  args.iters - 5))
    print('{:24} {:>8} {:>10} {:>14} {:>17}'.format(
        'variant', 'arrays', 'update ms', 'tables built', 'tables repointed'))
    with _counting_tables() as counts:
        for name in names:
            r = run_variant(name, device, args.dtype, args, counts)
            print('{:24} {:>8} {:>10.3f} {:>14.2f} {:>17.2f}'.format(
                name, r['arrays'], r['ms'], r['built'], r['repointed']))


if __name__ == '__main__':
    main()
