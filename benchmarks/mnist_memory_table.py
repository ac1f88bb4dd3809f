"""The peaks of benchmarks/mnist_memory.py against footprint()'s estimates.

    python benchmarks/mnist_memory_table.py A.json [B.json ...]

Run from the repository whose footprint() is to be compared; "before" is
the estimate of 30f87bd (copied below).
"""
import argparse
import json
import os
import sys

import numpy

import chainer

sys.path.insert(0, os.getcwd())  # the repository run from
from examples import cli  # NOQA
from examples.mnist import train_mnist as mnist  # NOQA


def footprint_before(args):  # 30f87bd's, verbatim but for STATES
    unit = args.unit
    weights = (784 + unit + 10 + 8) * unit + 10
    dtype = numpy.dtype(chainer.get_dtype(cli.DTYPES[args.dtype],
                                          map_mixed16=numpy.float16))
    size = dtype.itemsize
    drawn = weights * size + unit * unit * 8
    masters = 2 * 4 * weights if size < 4 else 0
    trained = (2 * size * weights + masters
               + 4 * {'adam': 2, 'lamb': 2}.get(args.optimizer, 1) * weights
               + 4 * args.batchsize * unit * size)
    return weights, max(drawn, trained), dtype, drawn


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="The peaks of mnist_memory.py's JSON files beside "
        "footprint()'s estimates, this checkout's and 30f87bd's.")
    parser.add_argument('json', nargs='+',
                        help='files written by mnist_memory.py')
    rows = []
    for path in parser.parse_args(argv).json:
        try:
            with open(path) as f:
                loaded = json.load(f)
        except (OSError, ValueError) as e:
            parser.error('{}: {}'.format(path, e))
        if not isinstance(loaded, list) or not all(
                isinstance(row, dict) for row in loaded):
            parser.error('{}: not a list of runs, as mnist_memory.py '
                         'writes'.format(path))
        rows += loaded
    print('{:>5} {:6} {:7} {:13} {:>5} {:>2} | {:>7} {:>7} | {:>7} {:>5} '
          '| {:>7} {:>5}'.format(
              'unit', 'model', 'dtype', 'optimizer', 'batch', 'up',
              'drawn', 'peak', 'before', 'ratio', 'after', 'ratio'))
    worst = {'before': [9, 0], 'after': [9, 0]}
    for r in rows:
        args = mnist.parse_args(
            ['-u', str(r['unit']), '--model', r['model'], '--dtype',
             r['dtype'], '--optimizer', r['optimizer'], '-b',
             str(r['batchsize'])], paths=False)
        peak = max(r['drawn'], r['trained'])
        before = footprint_before(args)[1]
        after = mnist.footprint(args)[1]
        for name, value in (('before', before), ('after', after)):
            ratio = value / peak
            worst[name] = [min(worst[name][0], ratio),
                           max(worst[name][1], ratio)]
        print('{:>5} {:6} {:7} {:13} {:>5} {:>2} | {:7.0f} {:7.0f} | '
              '{:7.0f} {:5.2f} | {:7.0f} {:5.2f}'.format(
                  r['unit'], r['model'], r['dtype'], r['optimizer'],
                  r['batchsize'], r['updates'], r['drawn'] / 1e6,
                  peak / 1e6, before / 1e6, before / peak, after / 1e6,
                  after / peak) + ('  ' + r['note'] if 'note' in r else ''))
    for name, (low, high) in worst.items():
        print('# {}: estimate / measured peak from {:.2f} to {:.2f}'.format(
            name, low, high))


if __name__ == '__main__':
    main()
