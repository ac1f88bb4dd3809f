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

With ``--interleave`` the variants train side by side, each with its own
model, one iteration of each in turn on the same data (the order rotated
every iteration), and each variant's time over the first one's is printed
as the median of the per-iteration ratios: the hook's cost in mixed16
(issue 46's target, at most 1.15; ``gpu_floor.py`` prints it too)::

    python benchmarks/train_loop.py --device 0 --dtype mixed16 \
        --variants momentum_sgd,momentum_sgd+hook --interleave

With ``--other TREE`` each variant also trains with the ``chainer_lars``
of another checkout (imported under another name, as
``compare_inprocess.py`` does), interleaved in the same process, and each
variant's time here over its time there is printed (median of the
per-iteration ratios): two versions compared without the drift between
two processes that ``compare.py`` suffers on a GPU. ``momentum_sgd`` is
the control (the same code in both)::

    python benchmarks/train_loop.py --device 0 --dtype float32,mixed16 \
        --other /tmp/old --iters 45

Each row also gives the host's part: the median time until ``update()``
returns, before the device is synchronised (launches are asynchronous;
the rest is the device finishing the queued work).

``--chunk N`` runs this tree's kernels with ``N`` elements per block
(``chainer_lars.cuda.CHUNK``; the lighter engine doubled 229bc30's 4096),
to tell on a device whether the blocks' size explains a difference::

    python benchmarks/train_loop.py --device 0 --dtype mixed16 \
        --other /tmp/old --chunk 4096 --variants momentum_sgd,lars,lars_pa

With ``--emulate`` the device is ``@cupy:0`` of
:mod:`chainer_lars.testing.emulated_cupy` with every kernel launch a
no-op (``gpu_host.py``'s mode): the GPU path's host code, timed without a
GPU (the emulated arrays' ``shape``, ``dtype`` and ``strides`` are plain
attributes, as CuPy's; ``data``, ``flags`` and ``device`` are Python
properties, slower than CuPy's)::

    python benchmarks/train_loop.py --emulate --other /tmp/old \
        --dtype float32,mixed16 --layers 40 --width 64
"""

import argparse
import contextlib
import json
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
try:
    from chainer_lars import cuda as cuda_kernels
except ImportError:  # a version whose kernels live elsewhere: no counts
    cuda_kernels = None

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import bench_flags  # NOQA: E402


#: name -> make(module): (optimizer, hook), ``module`` a chainer_lars.
VARIANTS = {
    'momentum_sgd': lambda m: (chainer.optimizers.MomentumSGD(lr=0.01),
                               None),
    'momentum_sgd+hook': lambda m: (
        chainer.optimizers.MomentumSGD(lr=0.01),
        m.GradientLARS(weight_decay=5e-4)),
    'momentum_sgd+hook_pa': lambda m: (
        chainer.optimizers.MomentumSGD(lr=0.01),
        m.GradientLARS(weight_decay=5e-4, multi_tensor=False)),
    'lars': lambda m: (m.LARS(lr=1.0, weight_decay=5e-4), None),
    'lars_pa': lambda m: (m.LARS(lr=1.0, weight_decay=5e-4,
                                 multi_tensor=False), None),
}
#: The suffix of a variant's name when it trains with the other tree.
OTHER = ' (other)'


def import_other(tree):
    """The ``chainer_lars`` of ``tree``, imported as ``chainer_lars_other``
    (``compare_inprocess.py``'s renamed copy)."""
    if not os.path.isfile(os.path.join(tree, 'chainer_lars', '__init__.py')):
        raise ValueError('--other: no {}'.format(
            os.path.join(tree, 'chainer_lars', '__init__.py')))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import compare_inprocess
    return compare_inprocess._import_renamed(tree, 'chainer_lars_other')


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
def _counting_tables(kernel_modules=(cuda_kernels,)):
    """Counts the tables built and repointed while in the context
    (``counts['counted']`` is false where no module of
    ``kernel_modules``, the ``chainer_lars.cuda`` of each version, has a
    ``Table``: then nothing is counted)."""
    tables = [getattr(m, 'Table', None) for m in kernel_modules]
    tables = [table for table in tables if table is not None]
    counts = {'built': 0, 'repointed': 0, 'counted': bool(tables)}
    saved = []
    for table in tables:
        for name, key in (('__init__', 'built'), ('repoint', 'repointed')):
            method = vars(table).get(name)
            if method is None:  # a version without repoint
                continue

            def counting(self, *args, _method=method, _key=key, **kwargs):
                counts[_key] += 1
                return _method(self, *args, **kwargs)
            saved.append((table, name, method))
            setattr(table, name, counting)
    try:
        yield counts
    finally:
        for table, name, method in saved:
            setattr(table, name, method)


class _Loop(object):

    """One variant's model and optimizer, stepped one iteration at a time
    on the data it is given."""

    def __init__(self, name, device, dtype, args, module=chainer_lars):
        self.mixed16 = dtype == 'mixed16'
        self.param_dtype = (numpy.float16 if self.mixed16
                            else numpy.dtype(dtype))
        with chainer.using_config('dtype', self.param_dtype):
            self.model = MLP(args.layers, args.width)
        self.model.to_device(device)
        self.opt, hook = VARIANTS[name](module)
        self.opt.setup(self.model)
        if self.mixed16:
            self.opt.use_fp32_update()
        if hook is not None:
            self.opt.add_hook(hook)
        xp = device.xp
        self.sync = ((lambda: None) if xp is numpy
                     else device.device.synchronize)
        self.times, self.host, self.built, self.repointed = [], [], 0, 0
        self.arrays = sum(1 for _ in self.model.params())
        # Emulated: new gradient arrays of these values instead of a
        # backward (which the emulator does not run).
        rng = numpy.random.RandomState(1)
        self.grads = [(rng.standard_normal(p.shape) * 1e-2).astype(
            self.param_dtype) for p in self.model.params()] if getattr(
                args, 'emulate', False) else None

    def step(self, x, t, counts, timed):
        """Forward, backward (new gradients), then ``update()`` alone
        timed, with the device synchronised before and after (and the
        host's part: until ``update()`` returns)."""
        self.model.cleargrads()
        if self.grads is None:
            loss = F.softmax_cross_entropy(self.model(x), t)
            loss.backward()
        else:
            for param, g in zip(self.model.params(), self.grads):
                param.grad = param.device.send(g)
        self.sync()
        before = dict(counts)
        start = time.perf_counter()
        self.opt.update()
        returned = time.perf_counter()
        self.sync()
        if timed:
            self.times.append(time.perf_counter() - start)
            self.host.append(returned - start)
            self.built += counts['built'] - before['built']
            self.repointed += counts['repointed'] - before['repointed']

    def result(self, counted=True):
        n = len(self.times)
        return {'ms': float(numpy.median(self.times)) * 1e3,
                'host_ms': float(numpy.median(self.host)) * 1e3,
                'times_s': list(self.times), 'host_s': list(self.host),
                'built': self.built / n if counted else None,
                'repointed': self.repointed / n if counted else None,
                'arrays': self.arrays}


def _batch(rng, device, dtype, args):
    xp = device.xp
    x = xp.asarray(rng.standard_normal(
        (args.batch, args.width)).astype(dtype))
    t = xp.asarray(rng.randint(0, 10, args.batch).astype(numpy.int32))
    return x, t


def run_variant(name, device, dtype, args, counts):
    """All ``args.iters`` iterations of one variant; the first five are
    not timed."""
    loop = _Loop(name, device, dtype, args)
    rng = numpy.random.RandomState(0)
    for it in range(args.iters):
        loop.step(*_batch(rng, device, loop.param_dtype, args),
                  counts=counts, timed=it >= 5)
    return loop.result(counts.get('counted', True))


def run_interleaved(names, device, dtype, args, counts, other=None):
    """The variants stepped in turn, each iteration on the same data, in
    an order rotated by one each iteration, so that a machine's drifts
    hit them all; ``{name: result}``. With ``other`` (a chainer_lars),
    each variant also as ``name + OTHER`` with that module."""
    loops = [_Loop(name, device, dtype, args) for name in names]
    if other is not None:
        loops += [_Loop(name, device, dtype, args, other) for name in names]
        names = names + [name + OTHER for name in names]
    rng = numpy.random.RandomState(0)
    for it in range(args.iters):
        x, t = _batch(rng, device, loops[0].param_dtype, args)
        k = it % len(loops)
        for loop in loops[k:] + loops[:k]:
            loop.step(x, t, counts, timed=it >= 5)
    return {name: loop.result(counts.get('counted', True))
            for name, loop in zip(names, loops)}


def median_ratio(result, base, key='times_s'):
    """The median over iterations of ``result``'s update time (``key``
    ``'host_s'``: its host part) over ``base``'s in the same iteration
    (both from :func:`run_interleaved`)."""
    return float(numpy.median(numpy.asarray(result[key])
                              / numpy.asarray(base[key])))


def main(argv=None):
    """Runs the loops that ``argv`` asks for; ``{dtype: {variant: result}}``
    (see :meth:`_Loop.result`)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', '-d',
                        help='a Chainer device specifier (default @numpy; '
                        'with --emulate, @cupy:0, the only one it has)')
    parser.add_argument('--dtype', default='float32',
                        help='float32, mixed16, or both comma-separated '
                        '(run one after the other)')
    parser.add_argument('--variants', default=','.join(VARIANTS),
                        help='comma-separated, of: ' + ', '.join(VARIANTS))
    parser.add_argument('--layers', type=int, default=40)
    parser.add_argument('--width', type=int, default=512)
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--iters', type=int, default=25)
    parser.add_argument('--interleave', action='store_true',
                        help='step the variants in turn, iteration by '
                        'iteration, and print each one\'s time over the '
                        'first variant\'s (median of per-iteration ratios)')
    parser.add_argument('--other', metavar='TREE',
                        help='also train each variant with the chainer_lars '
                        'of TREE (another checkout), interleaved, and print '
                        'the time here over the time there (implies '
                        '--interleave)')
    parser.add_argument('--chunk', type=int, metavar='N',
                        help="this tree's elements per CUDA block "
                        '(chainer_lars.cuda.CHUNK, default 8192; 229bc30 '
                        'had 4096), a multiple of 8 x THREADS (2048): to '
                        'tell the blocks\' size from the rest of a change')
    parser.add_argument('--emulate', action='store_true',
                        help='on the emulated GPU, launches no-ops: the '
                        'host code of the GPU path (the device is @cupy:0)')
    parser.add_argument('--json', metavar='FILE',
                        help='write every variant\'s times and counts here')
    args = parser.parse_args(argv)
    if args.iters <= 5:
        parser.error('--iters must be more than 5 (the first five are not '
                     'timed), got {}'.format(args.iters))
    for flag in ('layers', 'width', 'batch'):
        if getattr(args, flag) < 1:
            parser.error('--{} must be at least 1, got {}'.format(
                flag, getattr(args, flag)))
    names = args.variants.split(',')
    for name in names:
        if name not in VARIANTS:
            parser.error('--variants: unknown {!r}; choose from {}'.format(
                name, ', '.join(VARIANTS)))
    dtypes = args.dtype.split(',')
    for dtype in dtypes:
        if dtype not in ('float32', 'mixed16'):
            parser.error('--dtype: unknown {!r}; choose from float32, '
                         'mixed16, or both comma-separated'.format(dtype))
    step = 8 * getattr(cuda_kernels, 'THREADS', 0)
    if args.chunk is not None and (not step or args.chunk <= 0
                                   or args.chunk % step):
        parser.error('--chunk must be a positive multiple of {}, got {}'
                     .format(step, args.chunk) if step else
                     '--chunk: this tree has no chainer_lars.cuda')
    if args.emulate:
        if args.device not in (None, '0', '@cupy:0'):
            parser.error('--device {}: --emulate has only @cupy:0'.format(
                args.device))
        args.device = '@cupy:0'
    else:
        args.device = args.device or '@numpy'
        bench_flags.device(parser, args.device)
    other = None
    if args.other is not None:
        try:
            other = import_other(args.other)
        except ValueError as e:
            parser.error(str(e))
        args.interleave = True
    bench_flags.output_file(parser, '--json', args.json)
    context = contextlib.nullcontext()
    if args.emulate:
        from chainer_lars.testing import emulated_cupy
        context = emulated_cupy.installed(execute=False, check=False)
    results = {}
    chunk, modules = (getattr(cuda_kernels, name, None)
                      for name in ('CHUNK', '_modules'))
    if args.chunk is not None:  # read when a group is prepared; modules
        # compiled with another (in this process) set aside meanwhile
        cuda_kernels.CHUNK, cuda_kernels._modules = args.chunk, {}
    try:
        with context:
            device = chainer.get_device(args.device)
            for dtype in dtypes:
                results[dtype] = _run_dtype(names, device, dtype, args,
                                            other)
    finally:
        if args.chunk is not None:
            cuda_kernels.CHUNK, cuda_kernels._modules = chunk, modules
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'train_loop': [
                {'device': str(device), 'emulated': args.emulate,
                 'dtype': dtype,
                 'layers': args.layers, 'width': args.width,
                 'batch': args.batch, 'interleaved': args.interleave,
                 'other': args.other, 'chunk': args.chunk,
                 'variants': results[dtype]} for dtype in dtypes]},
                f, indent=1)
    return results


def _run_dtype(names, device, dtype, args, other=None):
    print('{}{} {}, MLP of {} layers of {}, batch {}, median of {} '
          'updates{}{}'.format(
              device, ' (emulated, launches no-ops)' if args.emulate else '',
              dtype, args.layers, args.width, args.batch, args.iters - 5,
              ', variants interleaved' if args.interleave else '',
              '' if other is None else ', each variant also with the '
              'chainer_lars of {} (rows marked{})'.format(args.other, OTHER)))
    print('{:32} {:>6} {:>10} {:>8} {:>14} {:>17}'.format(
        'variant', 'arrays', 'update ms', 'host ms', 'tables built',
        'tables repointed'))
    modules = [cuda_kernels] + ([] if other is None else [
        getattr(other, 'cuda', None)])
    with _counting_tables(modules) as counts:
        if args.interleave:
            results = run_interleaved(names, device, dtype, args, counts,
                                      other)
        else:
            results = {}
            for name in names:
                results[name] = run_variant(name, device, dtype, args,
                                            counts)
                _print_row(name, results[name])
    if args.interleave:
        for name in results:
            _print_row(name, results[name])
        for name in names[1:] if other is None else ():
            print('{} / {}: {:.3f} (median of per-iteration ratios)'.format(
                name, names[0], median_ratio(results[name],
                                             results[names[0]])))
        for name in names if other is not None else ():
            print('{}: here / other {:.3f}, host part {:.3f} (medians of '
                  'per-iteration ratios)'.format(name, *(median_ratio(
                      results[name], results[name + OTHER], key)
                      for key in ('times_s', 'host_s'))))
    return results


def _print_row(name, r):
    counted = ['{:>14.2f}'.format(r['built']), '{:>17.2f}'.format(
        r['repointed'])] if r['built'] is not None else ['{:>14}'.format(
            '-'), '{:>17}'.format('-')]
    print('{:32} {:>6} {:>10.3f} {:>8.3f} {} {}'.format(
        name, r['arrays'], r['ms'], r['host_ms'], *counted), flush=True)


if __name__ == '__main__':
    main()
