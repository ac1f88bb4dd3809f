#!/usr/bin/env python
"""A paper model of a GPU update: bytes moved, launches, time at a bandwidth.

For each variant of ``bench_lars.py``, how many bytes one update must move
(passes over memory times the parameters' size) and how many kernels it
launches; divided by the memory bandwidth, the least time it can take.
Launch costs are not in the time.

Without a result file it prints the model of ResNet-50 (as
``bench_lars.py`` builds it) in float32 and float16, the table of
``benchmarks/README.md``, and the byte floors of LARS, LAMB, the hook,
``MomentumSGD`` and ``Adam`` (:func:`floor_bytes`, which
``gpu_floor.py`` and ``gpu_peers.py`` divide measured times by)::

    python benchmarks/paper_model.py [--bandwidth 4.8e12]

Given the JSON of a ``bench_lars.py`` run on a GPU, it prints what was
measured beside the model, and the fraction of the model reached
(``model time / measured time``: 1.0 is at the bandwidth limit), for every
case with weight decay on; ``benchmarks/gpu_check.sh`` does this::

    python benchmarks/paper_model.py OUT/bench_gpu.json
"""

import argparse
import json
import sys

#: H200 HBM3e, bytes per second (NVIDIA's figure).
H200_BANDWIDTH = 4.8e12

#: variant -> (arrays read, arrays written) per element of the parameter
#: set in one update, all passes together.
PASSES = {
    # read w, g (norms); read w, g, write g (rescale)
    'floor': (4, 1),
    'hook': (4, 1),
    'hook_pa': (4, 1),
    # read g, w, v; write w, v
    'momentum_sgd': (3, 2),
    'momentum_sgd+hook': (7, 3),
    'momentum_sgd+hook_pa': (7, 3),
    # read w, g (norms); read w, g, v, write w, v (step)
    'lars': (5, 2),
    'lars_pa': (5, 2),
}
#: variant -> launches per update, as pairs: ``'dtype', k`` is k per dtype
#: (one dtype here), ``'array', k`` k per array.
LAUNCHES = {
    'floor': ('array', 3),
    'hook': ('dtype', 2),
    'hook_pa': ('array', 2),
    'momentum_sgd': ('array', 1),
    'momentum_sgd+hook': ('array', 1, 'dtype', 2),
    'momentum_sgd+hook_pa': ('array', 3),
    'lars': ('dtype', 2),
    'lars_pa': ('array', 2),
}
ITEMSIZE = {'float32': 4, 'float16': 2, 'float64': 8}
#: mixed16 (float16 weights and gradients, float32 masters and momentum):
#: variant -> (bytes per parameter, launches as in LAUNCHES). ``lars``:
#: norms read w32, g16; the step reads g16, w32, v32 and writes w32, v32
#: and w16. ``momentum_sgd`` (Chainer's fp32 update of each rule): g16 up
#: to a new g32, g32 divided in place, the step, w32 down to a new w16.
MIXED16 = {'lars': (6 + 20, ('dtype', 2)),
           'momentum_sgd': (6 + 8 + 20 + 6, ('array', 4))}

#: The byte floors: per update rule, its passes over memory in the fewest
#: any implementation needs, each as (arrays read, arrays written) per
#: element. ``w`` is the weight the arithmetic reads and writes (the
#: float32 master in mixed16), ``g`` the gradient, ``v`` and ``m`` the
#: states. LARS: the norms of ``w`` and ``g`` must be known before the
#: step, so two passes. LAMB: the norm of the update ``r`` (from the new
#: ``m`` and ``v``) must be known before ``w`` moves; the first pass
#: writes ``m`` and ``v``, the second reads them back to remake ``r`` (a
#: pass that wrote ``r`` instead would move as many bytes; one that wrote
#: ``m`` and ``v`` only in the second pass would read ``g`` twice, 4 bytes
#: more). The hook: the norms, then ``g`` rescaled in place. Caches are
#: not counted: a kernel that keeps an array in L2 between its passes can
#: beat the floor on small arrays.
FLOOR_PASSES = {
    'lars': ((('w', 'g'), ()), (('w', 'g', 'v'), ('w', 'v'))),
    'lamb': ((('w', 'g', 'm', 'v'), ('m', 'v')),
             (('w', 'm', 'v'), ('w',))),
    'momentum_sgd': ((('w', 'g', 'v'), ('w', 'v')),),
    'adam': ((('w', 'g', 'm', 'v'), ('w', 'm', 'v')),),
    'hook': ((('w', 'g'), ()), (('w', 'g'), ('g',))),
}
#: Precisions of the floors: the bytes of each array kind. mixed16:
#: float16 weights and gradients with float32 masters and states
#: (``use_fp32_update()``); a pass that writes the master also writes
#: the float16 weight (``W16``).
FLOOR_PRECISIONS = {
    'float32': {'w': 4, 'g': 4, 'v': 4, 'm': 4},
    'float16': {'w': 2, 'g': 2, 'v': 2, 'm': 2},
    'float64': {'w': 8, 'g': 8, 'v': 8, 'm': 8},
    'mixed16': {'w': 4, 'g': 2, 'v': 4, 'm': 4},
}
W16 = 2


def floor_bytes(method, precision):
    """The fewest bytes per parameter one update of ``method`` (a key of
    :data:`FLOOR_PASSES`) moves in ``precision`` (a key of
    :data:`FLOOR_PRECISIONS`)."""
    if method not in FLOOR_PASSES:
        raise ValueError('no byte floor for {!r}; choose from {}'.format(
            method, ', '.join(FLOOR_PASSES)))
    if precision not in FLOOR_PRECISIONS:
        raise ValueError('no byte floor in {!r}; choose from {}'.format(
            precision, ', '.join(FLOOR_PRECISIONS)))
    if method == 'hook' and precision == 'mixed16':
        # In mixed16 the hook rescales the master's gradient that
        # Chainer's fp32 update makes anew in each rule: no pass of its own.
        raise ValueError('the hook has no byte floor of its own in mixed16')
    size = FLOOR_PRECISIONS[precision]
    total = 0
    for reads, writes in FLOOR_PASSES[method]:
        total += sum(size[a] for a in reads + writes)
        if precision == 'mixed16' and 'w' in writes:
            total += W16
    return total


def floor_seconds(method, precision, n_params, bandwidth):
    """The least time of one update of ``n_params`` parameters at
    ``bandwidth`` bytes per second (bytes read plus bytes written)."""
    return floor_bytes(method, precision) * n_params / bandwidth


def model(variant, n_params, n_arrays, dtype, bandwidth=H200_BANDWIDTH):
    """``{'bytes', 'launches', 'seconds'}`` of one update of ``variant``."""
    if dtype == 'mixed16':
        per_param, spec = MIXED16[variant]
        nbytes = per_param * n_params
    else:
        reads, writes = PASSES[variant]
        nbytes = (reads + writes) * n_params * ITEMSIZE[dtype]
        spec = LAUNCHES[variant]
    launches = 0
    for kind, k in zip(spec[::2], spec[1::2]):
        launches += k * (n_arrays if kind == 'array' else 1)
    return {'bytes': nbytes, 'launches': launches,
            'seconds': nbytes / bandwidth}


def resnet50_size():
    """(parameters, arrays) of ResNet-50 as ``bench_lars.py`` builds it."""
    import numpy
    import bench_lars
    link = bench_lars.build_model('resnet50', numpy.float32)
    params = list(link.params())
    return sum(p.size for p in params), len(params)


def model_table(n_params, n_arrays, bandwidth):
    """The README's table: Markdown lines."""
    lines = ['| variant | bytes moved, fp32 / fp16 | launches | time at '
             '{:g} TB/s, fp32 / fp16 |'.format(bandwidth / 1e12),
             '|---|---|---|---|']
    for variant in PASSES:
        if variant == 'floor':
            continue
        m32 = model(variant, n_params, n_arrays, 'float32', bandwidth)
        m16 = model(variant, n_params, n_arrays, 'float16', bandwidth)
        reads, writes = PASSES[variant]
        lines.append('| `{}` | {} N = {:.0f} / {:.0f} MB | {} | {:.3f} / '
                     '{:.3f} ms |'.format(
                         variant, 4 * (reads + writes), m32['bytes'] / 1e6,
                         m16['bytes'] / 1e6, m32['launches'],
                         m32['seconds'] * 1e3, m16['seconds'] * 1e3))
    return lines


def floor_table(n_params, bandwidth):
    """The byte floors (``FLOOR_PASSES``) as Markdown lines: bytes per
    parameter and time for ``n_params`` at ``bandwidth``."""
    lines = ['| update | bytes per parameter, float32 / mixed16 | time at '
             '{:g} TB/s, float32 / mixed16 |'.format(bandwidth / 1e12),
             '|---|---|---|']
    for method in FLOOR_PASSES:
        cells = []
        for precision in ('float32', 'mixed16'):
            try:
                cells.append((floor_bytes(method, precision), floor_seconds(
                    method, precision, n_params, bandwidth)))
            except ValueError:
                cells.append(None)
        lines.append('| `{}` | {} | {} |'.format(method, ' / '.join(
            '-' if c is None else str(c[0]) for c in cells), ' / '.join(
            '-' if c is None else '{:.3f} ms'.format(c[1] * 1e3)
            for c in cells)))
    return lines


def fractions(result, bandwidth):
    """Per measured case with weight decay on: ``(case name, variant,
    model s, measured s, fraction)`` for every modelled variant."""
    rows = []
    for case in result['cases']:
        if not case.get('weight_decay') or 'median_s' not in case:
            continue
        name = '{} {}'.format(case['model'], case['dtype'])
        for variant, measured in case['median_s'].items():
            if not (variant in PASSES and case['dtype'] in ITEMSIZE
                    or variant in MIXED16 and case['dtype'] == 'mixed16'):
                continue
            m = model(variant, case['n_params'], case['n_arrays'],
                      case['dtype'], bandwidth)
            rows.append((name, variant, m['seconds'], measured,
                         m['seconds'] / measured))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('result', nargs='?',
                        help='the JSON of a bench_lars.py run (--json)')
    parser.add_argument('--bandwidth', type=float, default=H200_BANDWIDTH,
                        help='bytes per second (default: an H200, 4.8e12)')
    args = parser.parse_args(argv)
    if args.bandwidth <= 0:
        parser.error('--bandwidth must be positive, got {}'.format(
            args.bandwidth))
    if args.result is None:
        n_params, n_arrays = resnet50_size()
        print('ResNet-50: N = {:,} parameters in {} arrays'.format(
            n_params, n_arrays))
        for line in model_table(n_params, n_arrays, args.bandwidth):
            print(line)
        for variant in MIXED16:
            m = model(variant, n_params, n_arrays, 'mixed16', args.bandwidth)
            print('mixed16 `{}`: {} N = {:.0f} MB, {} launches, {:.3f} '
                  'ms'.format(variant, MIXED16[variant][0], m['bytes'] / 1e6,
                              m['launches'], m['seconds'] * 1e3))
        print()
        for line in floor_table(n_params, args.bandwidth):
            print(line)
        return 0
    try:
        with open(args.result) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        parser.error('cannot read the result {}: {}'.format(args.result, e))
    if 'cases' not in result:
        parser.error('{} is not the JSON of a bench_lars.py run (no '
                     '"cases")'.format(args.result))
    rows = fractions(result, args.bandwidth)
    print('measured against the paper model at {:g} TB/s (fraction = model '
          '/ measured; 1.0 is the bandwidth limit)'.format(
              args.bandwidth / 1e12))
    print('{:<24} {:<22} {:>10} {:>12} {:>9}'.format(
        'case', 'variant', 'model ms', 'measured ms', 'fraction'))
    for name, variant, m, measured, fraction in rows:
        print('{:<24} {:<22} {:>10.3f} {:>12.3f} {:>9.3f}'.format(
            name, variant, m * 1e3, measured * 1e3, fraction))
    if not rows:
        print('(no case with weight decay on in {})'.format(args.result))
    return 0


if __name__ == '__main__':
    sys.exit(main())
