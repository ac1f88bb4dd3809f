#!/usr/bin/env python
"""Large-batch MNIST with LARS: an MLP trained by Chainer's trainer.

The model and the trainer follow Chainer's own MNIST example; the optimizer
follows the large-batch recipe: LARS, momentum 0.9, linear warm-up then a
polynomial decay of power 2, and biases excluded from weight decay and from
layer adaptation. Run it as a file, from the repository root or from its own
folder, or as a module from the root:

    python examples/mnist/train_mnist.py --help
    python train_mnist.py --help           # in examples/mnist
    python -m examples.mnist.train_mnist --help
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


DEFAULTS = dict(batchsize=8192, epoch=10, warmup_epochs=0.5)


class MLP(chainer.Chain):

    def __init__(self, n_in, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            # Sizes given, not inferred, so that the weights are drawn at
            # once, on the host, from --seed, whatever the device.
            self.l1 = L.Linear(n_in, n_units)  # n_in -> n_units
            self.l2 = L.Linear(n_units, n_units)  # n_units -> n_units
            self.l3 = L.Linear(n_units, n_out)  # n_units -> n_out

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


class MLPBN(chainer.Chain):
    """The MLP with batch normalization after each hidden layer's linear
    map, before the ReLU; those maps have no bias (BatchNorm's ``beta``
    takes its place)."""

    def __init__(self, n_in, n_units, n_out):
        super(MLPBN, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_units, nobias=True)
            self.bn1 = L.BatchNormalization(n_units)
            self.l2 = L.Linear(n_units, n_units, nobias=True)
            self.bn2 = L.BatchNormalization(n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        h1 = F.relu(self.bn1(self.l1(x)))
        h2 = F.relu(self.bn2(self.l2(h1)))
        return self.l3(h2)


# --model: the MLP of Chainer's example, or the same with BatchNorm.
MODELS = {'mlp': MLP, 'mlp-bn': MLPBN}


def too_large(args, device):
    """The usage error of a --unit whose model does not fit in the memory
    of ``device`` (the host's, where the weights are drawn, first)."""
    weights = 784 * args.unit + args.unit ** 2 + args.unit * 10
    dtype = numpy.dtype(chainer.get_dtype())
    return ('--unit {}: the model does not fit in memory (on {}): its '
            '{:.3g} weights take {:.3g} GB in {}; give a smaller '
            '--unit'.format(args.unit, device, weights,
                            weights * dtype.itemsize / 1e9, dtype.name))


def parse_args(argv=None, paths=True):
    parser = cli.parser('chainer-lars example: large-batch MNIST',
                        DEFAULTS)
    parser.add_argument('--unit', '-u', type=int, default=1000,
                        help='Number of units (default: %(default)s)')
    parser.add_argument('--model', choices=tuple(MODELS), default='mlp',
                        help='mlp: 784-unit-unit-10 with ReLU, as in '
                        "Chainer's example; mlp-bn: the same with "
                        'BatchNormalization after each hidden layer '
                        '(default: %(default)s)')
    args = cli.parse_args(parser, argv, positive=['unit'], paths=paths)
    if args.model == 'mlp-bn':
        cli.check_batch_norm_batchsize(parser, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    # Chainer's links make their arrays in chainer.config.dtype.
    with chainer.using_config('dtype', cli.DTYPES[args.dtype]):
        run(args)


def run(args):
    device = chainer.get_device(args.device)
    cli.print_banner(args, 'Device: {}'.format(device),
                     '# Minibatch-size: {}'.format(args.batchsize))

    train, test = data.load_mnist()
    train, validation = data.hold_out(args, train)

    numpy.random.seed(args.seed)  # the initial weights
    try:
        model = L.Classifier(MODELS[args.model](784, args.unit, 10),
                             lossfun=recipe.loss_function(args))
        model.to_device(device)
    except MemoryError:  # NumPy's and CuPy's out-of-memory errors
        cli.usage_error(too_large(args, device))
    device.use()
    optimizer, lars = recipe.make_optimizer(args, model)

    train_iter = data.ShuffledIterator(train, args.batchsize,
                                       numpy.random.RandomState(args.seed))
    training.train(args, device, optimizer, lars, train_iter, test,
                   validation=validation)


if __name__ == '__main__':
    with training.quiet_interrupt():
        main()
