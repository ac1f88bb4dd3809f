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

import sys

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


# The optimizers' state arrays of the size of each parameter: LARS's,
# MomentumSGD's and the nesterov baseline's momentum; Adam's and LAMB's
# two moments. In float32, whatever --dtype (on the masters in 16 bits).
STATES = {'adam': 2, 'lamb': 2}

# The temporaries an update makes on the CPU, in arrays of the size of the
# largest parameter (l2's W) in float32: Chainer's Adam's formula in NumPy
# (4.1 to 4.4 measured), MomentumSGD's and Chainer's WeightDecay hook's
# (1.1 to 1.2); LARS's and LAMB's compiled loops update in place.
TEMPORARIES = {'adam': 5, 'momentum': 1.5, 'momentum-lars': 1.5}

# chainer_lars's optimizers compile Numba's loops at their first update on
# the CPU, per --dtype's size: 0.15 GB measured in float32, 0.2 GB in 16
# bits (0.09 GB where Numba's cache holds them already); Chainer's Adam
# and MomentumSGD, in NumPy, need none.
COMPILED = {4: 15 * 10 ** 7, 2: 2 * 10 ** 8}
CHAINER_LARS = ('lars', 'momentum-lars', 'lamb', 'nesterov')

# The arrays of batch x unit the model keeps from the forward pass for the
# backward pass (each hidden layer's ReLU output, and with BatchNorm its
# input), and those alive during the backward pass: the kept ones and
# about as many again in flight (the gradients, ReLU's masks, BatchNorm's
# temporaries; measured, with the input batch: 4.4 and 8.4). In mixed16
# BatchNorm computes in float32, its gamma's dtype: 11.1 arrays of 16
# bits alive, without the input batch (``MIXED16_BN``).
ACTIVATIONS = {'mlp': (2, 5), 'mlp-bn': (4, 9)}
MIXED16_BN = (4, 12)


def footprint(args):
    """The weights of the model of ``args`` (--unit, --model) and the
    bytes a run of it needs at least, estimated on the upper side: the
    largest of (1) the weights as they are drawn, each array in float64
    first, on the host, whatever the device, and (2) the training: the
    weights and their gradients in --dtype, in 16 bits float32 master
    copies too, the optimizer's state in float32 (``STATES``),
    chainer_lars's compiled update (``COMPILED``), and the larger of the
    backward pass's activations (``ACTIVATIONS``, with the input batch)
    and the update's temporaries (``TEMPORARIES``; in 16 bits, a float32
    gradient and a new 16-bit copy of the largest parameter too) beside
    the activations kept for it. Not counted: the interpreter, the
    modules and the data set (about 0.36 GB resident once MNIST is
    loaded, 0.9 GB at the peak of loading it)."""
    unit = args.unit
    # l1, l2, l3 and, per hidden layer, a bias (mlp) or BatchNorm's four
    # arrays (mlp-bn): an upper bound of both.
    weights = (784 + unit + 10 + 8) * unit + 10
    largest = unit * unit  # l2's W
    dtype = numpy.dtype(chainer.get_dtype(cli.DTYPES[args.dtype],
                                          map_mixed16=numpy.float16))
    size = dtype.itemsize
    drawn = weights * size + largest * 8  # l2's, the largest, in float64
    half = size < 4
    held = (2 * size * weights + (4 * weights if half else 0)
            + 4 * STATES.get(args.optimizer, 1) * weights
            + (COMPILED[size] if args.optimizer in CHAINER_LARS else 0))
    # (ChainerMN's trainer has no --model: its model is the MLP.)
    model = getattr(args, 'model', 'mlp')
    kept, alive = (args.batchsize * (784 + n * unit) * size for n in (
        MIXED16_BN if model == 'mlp-bn' and args.dtype == 'mixed16'
        else ACTIVATIONS[model]))
    update = kept + 4 * largest * (TEMPORARIES.get(args.optimizer, 0)
                                   + (1.5 if half else 0))
    return weights, max(drawn, held + max(alive, update)), dtype, drawn


def available_memory():
    """The host's memory available to a new process, in bytes (Linux's
    MemAvailable), or None where unknown."""
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def too_large(args, device=None, available=None, drawn_only=False):
    """The usage error of a --unit whose model does not fit in memory: the
    host's, ``available`` bytes (where known), or the address space, or
    ``device``'s, which refused it (None: not yet known); ``drawn_only``:
    the host's part of a device's run, drawing the weights."""
    weights, needed, dtype, drawn = footprint(args)
    if available is None:
        where = ('what {} could allocate'.format(device)
                 if device is not None else 'the address space, {:.3g} GB'
                 .format(sys.maxsize / 1e9))
    else:
        where = '{:.3g} GB available on the host (MemAvailable)'.format(
            available / 1e9)
    return ('--unit {}: the model does not fit in memory: its {:.3g} '
            'weights in {} need about {:.3g} GB to be {}, beyond {}; give '
            'a smaller --unit'.format(
                args.unit, weights, dtype.name,
                (drawn if drawn_only else needed) / 1e9,
                'drawn on the host (the device trains them)' if drawn_only
                else 'drawn and trained (weights, gradients, optimizer '
                'state, activations, the compiled update)', where))


def check_unit(parser, args):
    """Refuses a --unit whose model would not fit in the host's memory
    (``footprint`` against ``available_memory``; where that is unknown,
    against the address space), before anything is allocated: a size
    beyond the address space failed in NumPy with a traceback, one beyond
    the memory got the process killed without a word. (On a GPU the
    trained model's size is checked as it is moved there: ``run``.)"""
    available = available_memory()
    limit = sys.maxsize if available is None else available
    _, needed, _, drawn = footprint(args)
    try:
        host = chainer.get_device(args.device).xp is numpy
    except Exception:  # a GPU this machine lacks (ChainerMN: checked later)
        host = False
    # On a device the host draws the weights; the device trains them.
    if (needed if host else drawn) > limit:
        parser.error(too_large(args, available=available,
                               drawn_only=not host))


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
    if paths:  # (not where another program runs the command: results.py)
        check_unit(parser, args)
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
