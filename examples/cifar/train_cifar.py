#!/usr/bin/env python
"""Large-batch CIFAR-10/100 with LARS: a ResNet trained by Chainer's trainer.

The model is the ResNet of He et al. for CIFAR (depth 6n + 2, BatchNorm after
every convolution), but for its shortcuts: where a stage halves the size and
doubles the channels, the shortcut is a 1x1 convolution and BatchNorm (He
et al.'s option B), not their CIFAR models' identity padded with zeros
(option A). The trainer follows Chainer's own examples; the optimizer
follows the large-batch recipe: LARS, momentum 0.9, linear warm-up then a
polynomial decay of power 2, and biases and BatchNorm parameters excluded from
weight decay and from layer adaptation. Run it as a file, from the repository
root or from its own folder, or as a module from the root:

    python examples/cifar/train_cifar.py --help
    python train_cifar.py --help           # in examples/cifar
    python -m examples.cifar.train_cifar --help
"""

import numpy

# This package before Chainer: it filters CuPy's warning that NCCL is
# missing, which Chainer's import sets off (examples/__init__.py).
if not __package__:  # run as a file: examples/README.md
    import _examples_path  # NOQA
import examples  # NOQA

import chainer
import chainer.functions as F
import chainer.links as L

from examples import cli
from examples import data
from examples import recipe
from examples import training


DEFAULTS = dict(batchsize=4096, epoch=100, warmup_epochs=5)


class BasicBlock(chainer.Chain):

    def __init__(self, in_channels, out_channels, stride, batchnorm):
        super(BasicBlock, self).__init__()
        initialW = chainer.initializers.HeNormal()
        with self.init_scope():
            self.conv1 = L.Convolution2D(in_channels, out_channels, 3, stride,
                                         1, initialW=initialW, nobias=True)
            self.bn1 = batchnorm(out_channels)
            self.conv2 = L.Convolution2D(out_channels, out_channels, 3, 1, 1,
                                         initialW=initialW, nobias=True)
            self.bn2 = batchnorm(out_channels)
            if stride != 1 or in_channels != out_channels:
                self.conv_skip = L.Convolution2D(
                    in_channels, out_channels, 1, stride, 0,
                    initialW=initialW, nobias=True)
                self.bn_skip = batchnorm(out_channels)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        if hasattr(self, 'conv_skip'):
            x = self.bn_skip(self.conv_skip(x))
        return F.relu(h + x)


class ResNet(chainer.Chain):

    """ResNet for 32x32 images: 3 stages of n blocks, 16, 32, 64 channels.

    ``batchnorm(size)`` makes each BatchNorm layer: ChainerMN passes one
    that makes ``MultiNodeBatchNormalization``.
    """

    def __init__(self, depth, n_class, batchnorm=L.BatchNormalization):
        super(ResNet, self).__init__()
        if not depth_ok(depth):
            raise ValueError('depth must be 6n + 2, 8 to {}, got {}'.format(
                MAX_DEPTH, depth))
        n = (depth - 2) // 6
        with self.init_scope():
            self.conv1 = L.Convolution2D(
                3, 16, 3, 1, 1, initialW=chainer.initializers.HeNormal(),
                nobias=True)
            self.bn1 = batchnorm(16)
            self.res2 = self._stage(16, 16, 1, n, batchnorm)
            self.res3 = self._stage(16, 32, 2, n, batchnorm)
            self.res4 = self._stage(32, 64, 2, n, batchnorm)
            self.fc = L.Linear(64, n_class)

    @staticmethod
    def _stage(in_channels, out_channels, stride, n, batchnorm):
        return chainer.Sequential(
            BasicBlock(in_channels, out_channels, stride, batchnorm),
            *[BasicBlock(out_channels, out_channels, 1, batchnorm)
              for _ in range(n - 1)])

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.res4(self.res3(self.res2(h)))
        return self.fc(F.average(h, axis=(2, 3)))


#: He et al.'s deepest CIFAR ResNet: a deeper one (--depth 10**9 would
#: build 500 million layers) runs out of memory before its first update.
MAX_DEPTH = 1202


def depth_ok(depth):
    """Whether ``depth`` is a CIFAR ResNet's: 6n + 2, 8 to MAX_DEPTH."""
    return (depth - 2) % 6 == 0 and 8 <= depth <= MAX_DEPTH


def check_depth(parser, depth):
    if not depth_ok(depth):
        parser.error('--depth must be 6n + 2 (8, 14, 20, ..., {}: He et '
                     "al.'s deepest), got {}".format(MAX_DEPTH, depth))


def parse_args(argv=None):
    parser = cli.parser('chainer-lars example: large-batch CIFAR',
                        DEFAULTS,
                        helps={'dtype': cli.dtype_help('CIFAR: --depth 8')})
    parser.add_argument('--dataset', choices=('cifar10', 'cifar100'),
                        default='cifar10',
                        help='The dataset to use (default: %(default)s)')
    parser.add_argument('--depth', type=int, default=20,
                        help='ResNet depth, 6n + 2: 20, 32, 44, 56, 110, '
                        'up to 1202 (default: %(default)s)')
    args = cli.parse_args(parser, argv)
    # Its BatchNorm layers follow convolutions: a batch of one image is
    # normalised over its pixels (cli.check_batch_norm_batchsize).
    check_depth(parser, args.depth)
    return args


def main(argv=None):
    args = parse_args(argv)
    # Chainer's links make their arrays in chainer.config.dtype; a closed
    # standard output (| true) stops no run, even before the training.
    with chainer.using_config('dtype', cli.DTYPES[args.dtype]), \
            training.closed_output_ignored(args.out):
        run(args)


def run(args):
    device = chainer.get_device(args.device)
    cli.print_banner(args, 'Device: {}'.format(device),
                     '# Minibatch-size: {}'.format(args.batchsize),
                     '# dataset: {}, ResNet-{}'.format(args.dataset,
                                                       args.depth))

    train, test = data.load_cifar(args.dataset)
    train, validation = data.hold_out(args, train)
    n_class = 10 if args.dataset == 'cifar10' else 100

    numpy.random.seed(args.seed)  # the initial weights
    model = L.Classifier(ResNet(args.depth, n_class),
                         lossfun=recipe.loss_function(args))
    model.to_device(device)
    device.use()
    optimizer, lars = recipe.make_optimizer(args, model)

    # The augmentation draws from the iterator's random state, which
    # snapshots hold.
    random_state = numpy.random.RandomState(args.seed)
    train = chainer.datasets.TransformDataset(train,
                                              data.Augment(random_state))
    train_iter = data.ShuffledIterator(train, args.batchsize, random_state)
    training.train(args, device, optimizer, lars, train_iter, test,
                   validation=validation)


if __name__ == '__main__':
    with training.quiet_interrupt():
        main()
