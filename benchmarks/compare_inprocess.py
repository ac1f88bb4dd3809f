#!/usr/bin/env python
"""The per-array costs of two versions, timed in one process.

``compare.py`` runs each version in its own process; on a shared machine
small per-array costs (the float16 NumPy path, the per-rule paths) drift
more between two processes than the versions differ. This script imports
the other tree's package under another name (a copy in a temporary folder,
its imports renamed, removed when the process ends) beside this tree's,
and times, over the arrays of ResNet-20 (conv ``W``, BN ``gamma`` and
``beta``) or of ``many_1k`` (1,000 arrays of 1,024 elements), in float16
or ``--dtype`` (``mixed16``: float16 parameters with float32 master
copies, ``use_fp32_update()``), the hook's per-array path (``--face
hook``: ``hook(rule, param)`` for each array), the hook as the optimizer
calls it (``--face hook_mt``: ``hook(optimizer)``, all arrays at once),
``LARS.update()`` (``--face lars``) or
``LARS(multi_tensor=False).update()`` (``--face lars_pa``, the rules' own
path), for each version in turn (each going first in every other round),
many times, gradients restored before each pass. It prints each version's
minimum and median per pass and their ratios.

Usage (a worktree of the older version beside this one)::

    git worktree add /tmp/old b8e13bc
    python benchmarks/compare_inprocess.py /tmp/old --weight-decay 0
    python benchmarks/compare_inprocess.py /tmp/old --face lars_pa \
        --model many_1k --dtype float32
"""

import argparse
import atexit
import math
import os
import re
import shutil
import sys
import tempfile
import timeit
import warnings

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ResNet-20's conv shapes, each with a BN gamma and beta, and the
# classifier; many_1k: 1,000 arrays of 1,024 elements (as bench_lars.py).
SHAPES = {
    'cifar_resnet20': [(16, 3, 3, 3)] + [(16, 16, 3, 3)] * 6
    + [(32, 16, 3, 3)] + [(32, 32, 3, 3)] * 5 + [(64, 32, 3, 3)]
    + [(64, 64, 3, 3)] * 5 + [(10, 64)],
    'many_1k': [(1024,)] * 1000,
}


def _import_renamed(tree, name):
    """The package of ``tree`` imported as ``name``, from a copy that is
    removed when this process ends (it may import more of it until then)."""
    folder = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    target = os.path.join(folder, name)
    shutil.copytree(os.path.join(tree, 'chainer_lars'), target,
                    ignore=shutil.ignore_patterns('__pycache__'))
    for base, _, files in os.walk(target):
        for f in files:
            if f.endswith('.py'):
                path = os.path.join(base, f)
                with open(path) as src:
                    text = re.sub(r'\bchainer_lars\b', name, src.read())
                with open(path, 'w') as out:
                    out.write(text)
    sys.path.insert(0, folder)
    return __import__(name)


def _pass(module, model, weight_decay, face, dtype):
    import chainer
    import numpy
    numpy.random.seed(0)
    mixed16 = dtype == 'mixed16'
    dtype = 'float16' if mixed16 else dtype
    link = chainer.Link()
    with link.init_scope():
        for i, shape in enumerate(SHAPES[model]):
            sizes = (('W', shape), ('gamma', shape[:1]), ('beta', shape[:1]))
            for name, size in sizes[:1 if model == 'many_1k' else 3]:
                array = (numpy.zeros(size) if name == 'beta'
                         else numpy.random.randn(*size))
                param = chainer.Parameter(array.astype(dtype))
                param.grad = (numpy.random.randn(*size) * 1e-2).astype(dtype)
                setattr(link, '{}{}'.format(name, i), param)
    if face in ('lars', 'lars_pa'):
        opt = module.LARS(lr=1e-4, weight_decay=weight_decay,
                          multi_tensor=face == 'lars')
        if mixed16:
            opt.use_fp32_update()
        opt.setup(link)
        grads = [(p, p.grad.copy()) for p in link.params()]

        def lars_pass():
            for param, grad in grads:
                param.grad[...] = grad
            opt.update()
        return lars_pass, len(grads)
    opt = chainer.optimizers.MomentumSGD(0.1)
    if mixed16:
        opt.use_fp32_update()
    opt.setup(link)
    if face == 'hook_mt':  # as the optimizer calls it: all arrays at once
        hook = module.GradientLARS(weight_decay=weight_decay)
        opt.add_hook(hook)
        grads = [(p, p.grad.copy()) for p in link.params()]

        def hook_pass():
            for param, grad in grads:
                param.grad[...] = grad
            hook(opt)
        return hook_pass, len(grads)
    hook = module.GradientLARS(weight_decay=weight_decay, multi_tensor=False)
    items = [(p.update_rule, p, p.grad.copy()) for p in link.params()]

    def one_pass():
        for rule, param, grad in items:
            param.grad[...] = grad
            hook(rule, param)
    return one_pass, len(items)


#: What ``--dtype`` takes.
DTYPES = ('float16', 'float32', 'float64', 'mixed16')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('old', help='the tree of the other version')
    parser.add_argument('--model', choices=sorted(SHAPES),
                        default='cifar_resnet20')
    parser.add_argument('--weight-decay', type=float, default=0.0)
    parser.add_argument('--face', choices=('hook', 'hook_mt', 'lars',
                                           'lars_pa'),
                        default='hook', help="the hook's per-array path, "
                        'the hook on all arrays (hook(optimizer)), '
                        'LARS.update(), or its per-rule path')
    parser.add_argument('--dtype', choices=DTYPES, default='float16')
    parser.add_argument('--rounds', type=int, default=15)
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.old, 'chainer_lars')):
        parser.error('old: {} has no chainer_lars folder'.format(args.old))
    if args.rounds < 1:
        parser.error('--rounds must be at least 1, got {}'.format(
            args.rounds))
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        parser.error('--weight-decay must be finite and at least 0, got '
                     '{}'.format(args.weight_decay))
    warnings.simplefilter('ignore', DeprecationWarning)
    sys.path.insert(0, HERE)
    import chainer_lars
    old = _import_renamed(args.old, 'chainer_lars_old')
    passes, arrays = {}, 0
    for name, module in (('old', old), ('new', chainer_lars)):
        passes[name], arrays = _pass(module, args.model, args.weight_decay,
                                     args.face, args.dtype)
    times = {name: [] for name in passes}
    for r in range(args.rounds):
        for name in ('old', 'new')[::1 if r % 2 else -1]:
            one_pass = passes[name]
            times[name].append(min(timeit.repeat(
                one_pass, number=20, repeat=3)) / 20 * 1e3)
    print('{} over {} in {} ({} arrays), weight_decay={}, {} rounds'.format(
        {'hook': 'hook(rule, param)', 'hook_mt': 'hook(optimizer)',
         'lars': 'LARS.update()',
         'lars_pa': 'LARS(multi_tensor=False).update()'}[args.face],
        args.model, args.dtype, arrays, args.weight_decay, args.rounds))
    stats = {}
    for name, values in times.items():
        values.sort()
        stats[name] = (values[0], values[len(values) // 2])
        print('{}: min {:.3f} ms, median {:.3f} ms per pass'.format(
            name, *stats[name]))
    print('new/old: min {:.3f}, median {:.3f}'.format(
        stats['new'][0] / stats['old'][0], stats['new'][1] / stats['old'][1]))


if __name__ == '__main__':
    main()
