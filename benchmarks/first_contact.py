"""What a new user sees first: test accuracy after a short run on MNIST.

Chainer's MNIST MLP (784-1000-1000-10, ReLU) and a small BatchNorm CNN,
raw pixels from ``chainer.datasets.get_mnist()``, batch 128, a fixed number
of updates (300 by default) from seed 0, accuracy on the 10,000 test
images, for the set-ups a user tries first: plain ``MomentumSGD``, the hook
on ``MomentumSGD``, ``LARS`` on its defaults, ``Adam()`` and ``LAMB()``.
``tests/test_snippets.py``
trains the documentation's own snippets with the same functions::

    python benchmarks/first_contact.py
    python benchmarks/first_contact.py --sweep   # LARS's lr around its default

MNIST is read where the trainers read it: ``--dataset-root DIR``, else
Chainer's dataset root (``CHAINER_DATASET_ROOT``, else Chainer's cache,
``~/.chainer/dataset``), where Chainer downloads it the first time if the
network allows.
"""

import argparse
import os
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, ROOT)

# Before Chainer, as the trainers do (examples/__init__.py): on Python
# 3.12+ with numpy 2, chainer_lars_compat; CuPy's NCCL warning filtered.
import examples  # NOQA: E402,F401

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402

import chainer_lars  # NOQA: E402
from examples import data  # NOQA: E402


class MnistMissing(OSError):
    """MNIST is not in the dataset root and cannot be downloaded there."""


def load_mnist(root=None):
    """``(x_train, t_train, x_test, t_test)``: Chainer's MNIST as arrays,
    pixels in [0, 1], images flat (784).

    Read where the trainers read it: the dataset root ``root``, else
    Chainer's (``CHAINER_DATASET_ROOT``, else ``~/.chainer/dataset``),
    downloaded there the first time where the network allows (as the
    trainers do: ``examples.data.get_mnist``, mirrors included);
    ``MnistMissing`` says where it looked where it cannot be had.
    """
    previous = chainer.dataset.get_dataset_root()
    if root is not None:
        chainer.dataset.set_dataset_root(root)
    try:
        where = chainer.dataset.get_dataset_root()
        train, test = data.read_cached(data.get_mnist, 'mnist')
    except data.FAILED as e:
        raise MnistMissing(
            'no MNIST in the dataset root {} (pfnet/chainer/mnist/'
            'train.npz, test.npz), and it cannot be downloaded there ({}); '
            'set CHAINER_DATASET_ROOT (or --dataset-root) to a folder that '
            'holds it, or run where the network reaches Chainer\'s source '
            'or a mirror'.format(where, ' '.join(str(e).split())))
    finally:
        chainer.dataset.set_dataset_root(previous)
    return tuple(a for split in (train, test)
                 for a in chainer.dataset.concat_examples(split))


class MLP(chainer.Chain):

    """The MLP of Chainer's MNIST example."""

    def __init__(self, n_units=1000, n_out=10):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(784, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        h = F.relu(self.l1(x))
        return self.l3(F.relu(self.l2(h)))


class CNN(chainer.Chain):

    """Two 3x3 convolutions with BatchNorm, each followed by 2x2 pooling,
    then a linear layer."""

    def __init__(self, n_out=10):
        super(CNN, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(1, 16, 3, pad=1, nobias=True)
            self.bn1 = L.BatchNormalization(16)
            self.conv2 = L.Convolution2D(16, 32, 3, pad=1, nobias=True)
            self.bn2 = L.BatchNormalization(32)
            self.fc = L.Linear(32 * 7 * 7, n_out)

    def forward(self, x):
        h = x.reshape(-1, 1, 28, 28)
        h = F.max_pooling_2d(F.relu(self.bn1(self.conv1(h))), 2)
        h = F.max_pooling_2d(F.relu(self.bn2(self.conv2(h))), 2)
        return self.fc(h)


MODELS = {'mlp': MLP, 'cnn': CNN}


def make_model(name, seed=0):
    """An ``L.Classifier`` around the named model, initialised from
    ``seed``."""
    numpy.random.seed(seed)
    return L.Classifier(MODELS[name]())


def train(model, optimizer, data, updates=300, batchsize=128, seed=0):
    """Runs ``updates`` updates of ``optimizer`` (set up on ``model``, an
    ``L.Classifier``) on shuffled batches of the training split, and returns
    the accuracy (%) on the test split, or NaN where the loss became
    non-finite."""
    x_train, t_train, x_test, t_test = data
    rng = numpy.random.RandomState(seed)
    order = numpy.empty(0, dtype=numpy.int64)
    for _ in range(updates):
        if len(order) < batchsize:
            order = numpy.concatenate([order, rng.permutation(len(x_train))])
        batch, order = order[:batchsize], order[batchsize:]
        optimizer.update(model, x_train[batch], t_train[batch])
        if not numpy.isfinite(float(model.loss.array)):
            return float('nan')
    correct = 0
    with chainer.no_backprop_mode(), chainer.using_config('train', False):
        for i in range(0, len(x_test), 1000):
            y = model.predictor(x_test[i:i + 1000])
            correct += int((y.array.argmax(axis=1) == t_test[i:i + 1000])
                           .sum())
    return 100.0 * correct / len(x_test)


def _hooked(lr=None, **hook_kw):
    def make(model):
        sgd = (chainer.optimizers.MomentumSGD() if lr is None
               else chainer.optimizers.MomentumSGD(lr=lr))
        sgd.setup(model)
        sgd.add_hook(chainer_lars.GradientLARS(**hook_kw))
        return sgd
    return make


def _plain(make_optimizer):
    def make(model):
        optimizer = make_optimizer()
        optimizer.setup(model)
        return optimizer
    return make


#: The set-ups a user tries first: name -> a function of the model that
#: returns the optimizer set up on it.
FIRST = [
    ('MomentumSGD(lr=0.1)',
     _plain(lambda: chainer.optimizers.MomentumSGD(lr=0.1))),
    ('MomentumSGD(lr=0.1) + GradientLARS(weight_decay=5e-4)',
     _hooked(0.1, weight_decay=5e-4)),
    ('MomentumSGD() + GradientLARS()', _hooked()),
    ('MomentumSGD(lr=0.002) + GradientLARS(weight_decay=5e-4)',
     _hooked(0.002, weight_decay=5e-4)),
    ('LARS()', _plain(chainer_lars.LARS)),
    ('LARS(lr=1e-3, trust_coefficient=1e-3)',
     _plain(lambda: chainer_lars.LARS(lr=1e-3, trust_coefficient=1e-3))),
    ('Adam()', _plain(chainer.optimizers.Adam)),
    ('LAMB()', _plain(chainer_lars.LAMB)),
]


def _sweep():
    rows = []
    for lr in (0.5, 1.0, 2.0, 5.0, 10.0):
        rows.append(('LARS(lr={})'.format(lr), _plain(
            lambda lr=lr: chainer_lars.LARS(lr=lr))))
    for lr in (0.002, 0.005, 0.01, 0.02):
        rows.append(('MomentumSGD(lr={}) + GradientLARS(weight_decay=5e-4)'
                     .format(lr), _hooked(lr, weight_decay=5e-4)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--dataset-root', default=None,
                        help="Chainer's dataset root, the folder holding "
                        'pfnet/chainer/mnist (default: CHAINER_DATASET_ROOT, '
                        'else ~/.chainer/dataset, where Chainer downloads '
                        'MNIST the first time)')
    parser.add_argument('--models', default='mlp,cnn',
                        help='comma-separated, of: {} (default: '
                        '%(default)s)'.format(', '.join(MODELS)))
    parser.add_argument('--updates', type=int, default=300)
    parser.add_argument('--batchsize', type=int, default=128)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--sweep', action='store_true',
                        help="LARS's lr and the hook's MomentumSGD lr "
                        'around the defaults instead of the first set-ups')
    args = parser.parse_args(argv)
    models = args.models.split(',')
    for name in models:
        if name not in MODELS:
            parser.error('--models: unknown {!r}; choose from {}'.format(
                name, ', '.join(MODELS)))
    for flag in ('updates', 'batchsize'):
        if getattr(args, flag) < 1:
            parser.error('--{} must be at least 1, got {}'.format(
                flag, getattr(args, flag)))
    if not 0 <= args.seed < 2 ** 32:  # NumPy's RandomState takes these
        parser.error('--seed must be from 0 to 2**32 - 1, got {}'.format(
            args.seed))
    if args.dataset_root is not None and not os.path.isdir(
            args.dataset_root):
        parser.error('--dataset-root {}: no such folder'.format(
            args.dataset_root))
    try:
        mnist = load_mnist(args.dataset_root)
    except MnistMissing as e:
        parser.exit(1, 'first_contact.py: {}\n'.format(e))
    print('{} updates of batch {}, seed {}, accuracy (%) on the 10,000 '
          'test images; chainer-lars {}'.format(
              args.updates, args.batchsize, args.seed,
              chainer_lars.__version__))
    for model_name in models:
        for name, make in (_sweep() if args.sweep else FIRST):
            model = make_model(model_name, args.seed)
            start = time.time()
            accuracy = train(model, make(model), mnist, args.updates,
                             args.batchsize, args.seed)
            print('{:4} {:60} {:6.2f}  ({:.0f} s)'.format(
                model_name, name, accuracy, time.time() - start), flush=True)


if __name__ == '__main__':
    main()
