#!/usr/bin/env python
"""LARS and LAMB against their byte floors, and the hook in mixed16.

Issue 46's speed targets, measured in one run and printed as ratios with
'met' or 'missed' (never asserted: timings are for reading):

1. The GPU time of one fused update of ``chainer_lars.LARS`` and
   ``chainer_lars.LAMB`` (``cupyx.profiler.benchmark`` of ``update()``,
   gradients in place), on ResNet-50's and BERT-large's arrays
   (``shape_sets.py``), in float32 and mixed16 (float16 parameters with
   float32 masters, ``use_fp32_update()``), over its byte floor at the
   bandwidth of a device-to-device copy timed in the same run: at most
   **1.5**. The floors are ``paper_model.floor_bytes``: LARS 28 bytes a
   parameter in float32 and 26 in mixed16, LAMB 40 in both.
2. The host time of the same calls over their GPU time: at most
   **0.9**, the device still at work for a tenth of the update or more
   after ``update()`` has returned: the GPU, not the host, sets the pace.
   ``cupyx.profiler.benchmark`` records its start event before the host
   clock starts and its end event after the host clock stops, so the GPU
   time spans the host time: the ratio is at most 1 whatever the update,
   and about 1 for one the host cannot launch faster than the device runs
   it (host-bound), which a bound of 1 would call met.
3. In a training loop (``train_loop.py``: an MLP of 40 layers, 80
   arrays, new gradients from backward at every iteration), in mixed16,
   ``MomentumSGD`` with ``chainer_lars.GradientLARS`` over ``MomentumSGD``
   alone, the two interleaved iteration by iteration: at most **1.15**.

Usage::

    python benchmarks/gpu_floor.py --device 0 --json floor.json
    python benchmarks/gpu_floor.py --device @numpy --sets tiny   # smoke

On a CPU there is no GPU time: the wall time stands in for it and the
host target is not judged. The exit status is 1 when a case failed to
run, not when a target is missed.
"""

import argparse
import json
import os
import sys

import numpy

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import bench_flags  # NOQA: E402
import gpu_peers  # NOQA: E402
import paper_model  # NOQA: E402
import shape_sets  # NOQA: E402

METHODS = ('lars', 'lamb')
FLOOR_TARGET = 1.5
#: Host time over GPU time, at most: below 1 by a margin, since the GPU
#: time spans the host time (see the module's docstring).
HOST_TARGET = 0.9
LOOP_TARGET = 1.15
LOOP_VARIANTS = ('momentum_sgd', 'momentum_sgd+hook')


def _benchmark(fn, device, n_repeat, n_warmup):
    """``(host s, GPU s or None, wall s)``: medians of ``n_repeat`` calls.
    On a GPU ``cupyx.profiler.benchmark``'s (its wall is the GPU time: it
    synchronises on the end event), on the CPU perf_counter's."""
    if device.xp is numpy:
        timer, _ = gpu_peers.chainer_timer(device)
        t = gpu_peers.time_updates(fn, lambda: None, timer, n_repeat,
                                   n_warmup)
        return t['host_s'], None, t['wall_s']
    from cupyx import profiler
    perf = profiler.benchmark(fn, n_repeat=n_repeat, n_warmup=n_warmup)
    host = float(numpy.median(perf.cpu_times))
    gpu = float(numpy.median(perf.gpu_times[0]))
    return host, gpu, gpu


def copy_bandwidth(device, nbytes, n_repeat=20):
    """Bytes read plus written per second of a device-to-device copy of
    ``nbytes`` (``gpu_peers.chainer_copy``)."""
    copy, copied = gpu_peers.chainer_copy(device, nbytes)
    _, gpu, wall = _benchmark(copy, device, n_repeat, 3)
    return {'bytes': copied, 'seconds': wall, 'bandwidth': 2.0 * copied
            / wall}


def _optimizer(method):
    chainer_lars = gpu_peers._import_chainer_lars()
    if method == 'lars':
        return chainer_lars.LARS(lr=gpu_peers.LR, momentum=gpu_peers.MOMENTUM,
                                 weight_decay=gpu_peers.WEIGHT_DECAY)
    return chainer_lars.LAMB(alpha=gpu_peers.LAMB_LR,
                             weight_decay_rate=gpu_peers.LAMB_WEIGHT_DECAY)


def floor_case(shape_set, precision, method, device, bandwidth, n_repeat,
               n_warmup, seed=0):
    """One fused update of ``method`` on ``shape_set`` against its floor."""
    link, grads = gpu_peers.chainer_link(shape_set['shapes'], precision,
                                         device, seed)
    for (_, param), grad in zip(sorted(link.namedparams()), grads):
        param.grad = grad
    opt = _optimizer(method)
    if precision == 'mixed16':
        opt.use_fp32_update()
    opt.setup(link)
    host, gpu, wall = _benchmark(opt.update, device, n_repeat, n_warmup)
    floor = paper_model.floor_seconds(method, precision,
                                      shape_set['n_params'], bandwidth)
    device_time = gpu if gpu is not None else wall
    return {'set': shape_set['name'], 'precision': precision,
            'method': method, 'n_params': shape_set['n_params'],
            'n_arrays': shape_set['n_arrays'],
            'floor_bytes': paper_model.floor_bytes(method, precision),
            'floor_s': floor, 'host_s': host, 'gpu_s': gpu, 'wall_s': wall,
            'x_floor': device_time / floor,
            'host_over_gpu': None if gpu is None else host / gpu}


def loop_ratio(device, iters, layers=40, width=512, batch=256):
    """The hook's cost in a mixed16 training loop (``train_loop.py``)."""
    import train_loop
    args = argparse.Namespace(layers=layers, width=width, batch=batch,
                              iters=iters)
    with train_loop._counting_tables() as counts:
        results = train_loop.run_interleaved(LOOP_VARIANTS, device,
                                             'mixed16', args, counts)
    base, hooked = (results[name] for name in LOOP_VARIANTS)
    return {'layers': layers, 'width': width, 'batch': batch,
            'updates': len(base['times_s']),
            'ms': {name: results[name]['ms'] for name in LOOP_VARIANTS},
            'ratio': train_loop.median_ratio(hooked, base)}


def targets(result):
    """``(what, value, bound)`` for every target the result can judge."""
    out = []
    for c in result['cases']:
        if 'error' in c:
            continue
        name = '{} {} {}'.format(c['set'], c['precision'], c['method'])
        out.append((name + ': GPU time / byte floor', c['x_floor'],
                    FLOOR_TARGET))
        if c['host_over_gpu'] is not None:
            out.append((name + ': host time / GPU time', c['host_over_gpu'],
                        HOST_TARGET))
    loop = result.get('loop')
    if loop and 'error' not in loop:
        out.append(('train loop mixed16: (MomentumSGD + hook) / '
                    'MomentumSGD', loop['ratio'], LOOP_TARGET))
    return out


def format_result(result):
    """The result as lines of text: the copy, the cases, the loop, then
    every target with 'met' or 'missed'."""
    copy = result['copy']
    lines = ['device {}, git {}; device copy of {:.0f} MiB: {:.3f} TB/s '
             '(bytes read + written); {} repeats per case'.format(
                 result['device'], result['git'], copy['bytes'] / 2 ** 20,
                 copy['bandwidth'] / 1e12, result['repeat']),
             '{:<11} {:<8} {:<5} {:>10} {:>6} {:>9} {:>9} {:>9} {:>8} '
             '{:>9}'.format('set', 'dtype', 'rule', 'params', 'B/par',
                            'floor ms', 'GPU ms', 'host ms', 'x floor',
                            'host/GPU')]
    for c in result['cases']:
        head = '{:<11} {:<8} {:<5}'.format(c['set'], c['precision'],
                                           c['method'])
        if 'error' in c:
            lines.append('{} failed: {}'.format(head, c['error']))
            continue
        lines.append('{} {:>10,} {:>6} {:>9.3f} {:>9} {:>9.3f} {:>8.2f} '
                     '{:>9}'.format(
                         head, c['n_params'], c['floor_bytes'],
                         c['floor_s'] * 1e3, '-' if c['gpu_s'] is None
                         else '{:.3f}'.format(c['gpu_s'] * 1e3),
                         c['host_s'] * 1e3, c['x_floor'],
                         '-' if c['host_over_gpu'] is None
                         else '{:.2f}'.format(c['host_over_gpu'])))
    loop = result.get('loop')
    if loop is not None:
        if 'error' in loop:
            lines.append('train loop failed: ' + loop['error'])
        else:
            lines.append(
                'train loop, mixed16, MLP of {} layers of {}, batch {}, '
                'median of {} interleaved updates: {}'.format(
                    loop['layers'], loop['width'], loop['batch'],
                    loop['updates'], ', '.join(
                        '{} {:.3f} ms'.format(k, v)
                        for k, v in loop['ms'].items())))
    judged = targets(result)
    met = sum(value <= bound for _, value, bound in judged)
    lines.append('targets: {} of {} met'.format(met, len(judged)))
    for what, value, bound in judged:
        lines.append('  {} = {:.3f} <= {:g}  {}'.format(
            what, value, bound, 'met' if value <= bound else 'missed'))
    return lines


def run(sets, precisions, methods, device_spec, n_repeat=50, n_warmup=5,
        copy_mib=None, loop_iters=35, loop_size=(40, 512, 256), seed=0,
        log=print):
    import chainer
    device = chainer.get_device(device_spec)
    device.use()
    if copy_mib is None:
        copy_mib = 64 if device.xp is numpy else 1024
    _, free = gpu_peers.chainer_timer(device)
    copy = copy_bandwidth(device, int(copy_mib * 2 ** 20))
    free()
    result = {'device': str(device), 'git': gpu_peers._git_commit(),
              'repeat': n_repeat, 'warmup': n_warmup, 'copy': copy,
              'cases': []}
    for line in format_result(result)[:2]:
        log(line)
    for name in sets:
        shape_set = shape_sets.get(name)
        for precision in precisions:
            for method in methods:
                try:
                    case = floor_case(shape_set, precision, method, device,
                                      copy['bandwidth'], n_repeat, n_warmup,
                                      seed)
                except Exception as e:  # report it, go on with the others
                    case = {'set': name, 'precision': precision,
                            'method': method,
                            'error': '{}: {}'.format(type(e).__name__, e)}
                free()
                result['cases'].append(case)
                log(format_result(dict(result, cases=[case]))[2])
    if loop_iters:
        try:
            result['loop'] = loop_ratio(device, loop_iters, *loop_size)
        except Exception as e:
            result['loop'] = {'error': '{}: {}'.format(type(e).__name__, e)}
    return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', '-d', default='0',
                        help='a Chainer device: 0, @cupy:0, or @numpy '
                        '(default %(default)s)')
    parser.add_argument('--sets', default='resnet50,bert_large',
                        help='comma-separated, of: {} (default: '
                        '%(default)s)'.format(', '.join(shape_sets.SETS)))
    parser.add_argument('--precisions', default='float32,mixed16',
                        help='comma-separated, of: float32, mixed16')
    parser.add_argument('--methods', default=','.join(METHODS),
                        help='comma-separated, of: lars, lamb')
    parser.add_argument('--repeat', type=int, default=50,
                        help='timed calls per case (default %(default)s)')
    parser.add_argument('--warmup', type=int, default=5,
                        help='untimed calls first (default %(default)s)')
    parser.add_argument('--copy-mib', type=float, default=None,
                        help='size of the timed copy (default 1024 on a '
                        'GPU, 64 on the CPU)')
    parser.add_argument('--loop-iters', type=int, default=35,
                        help='iterations of the training loop, the first '
                        'five untimed; 0 leaves it out (default '
                        '%(default)s)')
    parser.add_argument('--loop-size', default='40,512,256',
                        help='layers, width and batch of the loop\'s MLP '
                        '(default %(default)s)')
    parser.add_argument('--json', help='also write the result here')
    args = parser.parse_args(argv)
    try:
        args.loop_size = tuple(int(v) for v in args.loop_size.split(','))
    except ValueError:
        args.loop_size = ()
    if len(args.loop_size) != 3 or min(args.loop_size) < 1:
        parser.error('--loop-size: three positive integers, LAYERS,WIDTH,'
                     'BATCH')
    for flag, allowed in (('sets', shape_sets.SETS),
                          ('precisions', gpu_peers.PRECISIONS),
                          ('methods', METHODS)):
        values = [v for v in getattr(args, flag).split(',') if v]
        for v in values:
            if v not in allowed:
                parser.error('--{}: unknown {!r}; choose from {}'.format(
                    flag, v, ', '.join(allowed)))
        if not values:
            parser.error('--{} names none'.format(flag))
        setattr(args, flag, values)
    try:
        gpu_peers.parse_device(args.device)
    except ValueError as e:
        parser.error('--device: {}'.format(e))
    if args.repeat < 1 or args.warmup < 0:
        parser.error('--repeat must be >= 1 and --warmup >= 0')
    if args.loop_iters and args.loop_iters <= 5:
        parser.error('--loop-iters must be 0 or more than 5, got {}'.format(
            args.loop_iters))
    if args.copy_mib is not None and not args.copy_mib > 0:
        parser.error('--copy-mib must be positive')
    bench_flags.device(parser, args.device)  # a GPU that is there
    bench_flags.output_file(parser, '--json', args.json)
    return args


def main(argv=None):
    args = parse_args(argv)
    result = run(args.sets, args.precisions, args.methods, args.device,
                 args.repeat, args.warmup, args.copy_mib, args.loop_iters,
                 args.loop_size)
    for line in format_result(result):
        print(line)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1, sort_keys=True)
    failed = any('error' in c for c in result['cases']) or 'error' in (
        result.get('loop') or {})
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
