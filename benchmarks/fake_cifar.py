"""Writes a generated CIFAR cache of the sizes given, for timing the CIFAR
trainer on the CPU without the real data (examples/cifar/README.md).

    python benchmarks/fake_cifar.py ROOT --train 256 --test 64

makes ``ROOT/pfnet/chainer/cifar/cifar-10.npz`` (``--classes 100``:
``cifar-100.npz``) in the layout of Chainer's download cache, random
uint8 images and labels, which ``--dataset-root ROOT`` then reads. It
refuses to replace a file that is there.
"""

import argparse
import os

import numpy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('root', help='the dataset root to write into')
    parser.add_argument('--train', type=int, default=256,
                        help='training images (default: %(default)s)')
    parser.add_argument('--test', type=int, default=64,
                        help='test images (default: %(default)s)')
    parser.add_argument('--classes', type=int, choices=(10, 100),
                        default=10, help='CIFAR-10 or -100 (default: 10)')
    args = parser.parse_args(argv)
    for name in ('train', 'test'):
        if getattr(args, name) < 1:
            parser.error('--{} {}: give at least 1 image'.format(
                name, getattr(args, name)))
    folder = os.path.join(args.root, 'pfnet', 'chainer', 'cifar')
    path = os.path.join(folder, 'cifar-{}.npz'.format(args.classes))
    if os.path.exists(path):
        parser.error('{} is there already: give another root'.format(path))
    os.makedirs(folder, exist_ok=True)
    rng = numpy.random.RandomState(0)
    arrays = {}
    for name in ('train', 'test'):
        n = getattr(args, name)
        arrays[name + '_x'] = rng.randint(0, 256, (n, 3072)).astype(
            numpy.uint8)
        arrays[name + '_y'] = (numpy.arange(n) % args.classes).astype(
            numpy.uint8)
    numpy.savez_compressed(path, **arrays)
    print(path)


if __name__ == '__main__':
    main()
