#!/usr/bin/env python
"""Large-batch CIFAR-10/100 with LARS: a ResNet trained by Chainer's trainer.

The model is the ResNet of He et al. for CIFAR (depth 6n + 2, BatchNorm after
every convolution); the trainer follows Chainer's own examples; the optimizer
follows the large-batch recipe: LARS, momentum 0.9, linear warm-up then a
polynomial decay of power 2, and biases and BatchNorm parameters excluded from
weight decay and from layer adaptation.
"""

import argparse
import math
import os
import re
import sys

import numpy

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions

import chainer_lars


# Parameters matched by these regular expressions (biases, BatchNorm's beta
# and gamma) get neither weight decay nor layer adaptation, as in the
# large-batch recipes.
EXCLUDE = ('/b$', '/beta$', '/gamma$')

# The learning-rate rules (see --help and README.md).
MOMENTUM_LR_PER_256 = 0.1
LARS_STEP_PER_256 = 0.005
REFERENCE_BATCHSIZE = 256


def default_lr(optimizer, batchsize, trust_coefficient):
    """The peak learning rate for a batch size, when --lr is not given.

    MomentumSGD scales linearly with the batch size (Goyal et al., 2017).
    With LARS, each adapted layer moves by ``lr * trust_coefficient`` times
    its weight norm, whatever the scale of its gradient; that product, the
    relative step, is scaled with the square root of the batch size
    (Krizhevsky, 2014; Hoffer et al., 2017), and ``lr`` follows from the
    trust coefficient. ``lr`` itself is the rate of the parameters excluded
    from adaptation (biases, BatchNorm's beta and gamma).
    """
    scale = batchsize / REFERENCE_BATCHSIZE
    if optimizer == 'momentum':
        return MOMENTUM_LR_PER_256 * scale
    return LARS_STEP_PER_256 * math.sqrt(scale) / trust_coefficient


class BasicBlock(chainer.Chain):

    def __init__(self, in_channels, out_channels, stride):
        super(BasicBlock, self).__init__()
        initialW = chainer.initializers.HeNormal()
        with self.init_scope():
            self.conv1 = L.Convolution2D(in_channels, out_channels, 3, stride,
                                         1, initialW=initialW, nobias=True)
            self.bn1 = L.BatchNormalization(out_channels)
            self.conv2 = L.Convolution2D(out_channels, out_channels, 3, 1, 1,
                                         initialW=initialW, nobias=True)
            self.bn2 = L.BatchNormalization(out_channels)
            if stride != 1 or in_channels != out_channels:
                self.conv_skip = L.Convolution2D(
                    in_channels, out_channels, 1, stride, 0,
                    initialW=initialW, nobias=True)
                self.bn_skip = L.BatchNormalization(out_channels)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        if hasattr(self, 'conv_skip'):
            x = self.bn_skip(self.conv_skip(x))
        return F.relu(h + x)


class ResNet(chainer.Chain):

    """ResNet for 32x32 images: 3 stages of n blocks, 16, 32, 64 channels."""

    def __init__(self, depth, n_class):
        super(ResNet, self).__init__()
        if (depth - 2) % 6 or depth < 8:
            raise ValueError('depth must be 6n + 2, got {}'.format(depth))
        n = (depth - 2) // 6
        with self.init_scope():
            self.conv1 = L.Convolution2D(
                3, 16, 3, 1, 1, initialW=chainer.initializers.HeNormal(),
                nobias=True)
            self.bn1 = L.BatchNormalization(16)
            self.res2 = self._stage(16, 16, 1, n)
            self.res3 = self._stage(16, 32, 2, n)
            self.res4 = self._stage(32, 64, 2, n)
            self.fc = L.Linear(64, n_class)

    @staticmethod
    def _stage(in_channels, out_channels, stride, n):
        return chainer.Sequential(
            BasicBlock(in_channels, out_channels, stride),
            *[BasicBlock(out_channels, out_channels, 1)
              for _ in range(n - 1)])

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.res4(self.res3(self.res2(h)))
        return self.fc(F.average(h, axis=(2, 3)))


class Augment(object):

    """Random crop from the image padded by 4 pixels, and random flip.

    It draws from the iterator's random state, so that snapshots hold it.
    """

    def __init__(self, random_state):
        self._random = random_state

    def __call__(self, example):
        x, t = example
        _, height, width = x.shape
        padded = numpy.pad(x, ((0, 0), (4, 4), (4, 4)))
        top, left = self._random.randint(0, 9, size=2)
        x = padded[:, top:top + height, left:left + width]
        if self._random.randint(2):
            x = x[:, :, ::-1]
        return numpy.ascontiguousarray(x), t


class ShuffledIterator(chainer.iterators.SerialIterator):

    """A shuffling SerialIterator whose random state is saved in snapshots.

    SerialIterator draws the order of each epoch from NumPy's global random
    state, which snapshots do not hold; this one draws it from its own
    ``random_state`` and saves that state, so that a run continued with
    ``--resume`` sees the same batches as an uninterrupted one. The data
    augmentation draws from the same state, in the same order.
    """

    def __init__(self, dataset, batch_size, random_state):
        self._random = random_state
        super(ShuffledIterator, self).__init__(
            dataset, batch_size,
            order_sampler=chainer.iterators.ShuffleOrderSampler(
                random_state))

    def serialize(self, serializer):
        super(ShuffledIterator, self).serialize(serializer)
        name, keys, pos, has_gauss, gauss = self._random.get_state()
        keys = serializer('random_keys', keys)
        pos = serializer('random_pos', pos)
        has_gauss = serializer('random_has_gauss', has_gauss)
        gauss = serializer('random_gauss', gauss)
        self._random.set_state((name, keys, pos, has_gauss, gauss))


class Evaluator(extensions.Evaluator):

    """Chainer's Evaluator, with each batch weighted by its size.

    Chainer's Evaluator takes the plain mean of the values reported for each
    batch, so that a short last batch counts as much as a full one: with
    10,000 test images in batches of 4096, the last 1808 images would make
    a third of the result. This one weights what the model reports for a batch
    by the number of its examples, so that ``validation/main/accuracy`` is
    the accuracy on the whole test set.
    """

    def __init__(self, iterator, target, **kwargs):
        super(Evaluator, self).__init__(iterator, target, **kwargs)
        self.eval_func = self._weighted

    def _weighted(self, *in_arrays, **in_dict):
        # Evaluator.evaluate gives each batch a fresh observation.
        observation = chainer.reporter.get_current_reporter().observation
        self._targets['main'](*in_arrays, **in_dict)
        first = in_arrays[0] if in_arrays else next(iter(in_dict.values()))
        for key, value in observation.items():
            observation[key] = (value, len(first))


def make_optimizer(args, model):
    """Sets up the optimizer chosen by --optimizer on the model.

    Returns the optimizer and the object whose ``observe()`` gives the trust
    ratios (``None`` for the baseline).
    """
    if args.optimizer == 'lars':
        optimizer = chainer_lars.LARS(
            lr=args.lr, momentum=args.momentum,
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE)
        optimizer.setup(model)
        return optimizer, optimizer
    optimizer = chainer.optimizers.MomentumSGD(
        lr=args.lr, momentum=args.momentum)
    optimizer.setup(model)
    if args.optimizer == 'momentum-lars':
        hook = chainer_lars.GradientLARS(
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE)
        optimizer.add_hook(hook)
        return optimizer, hook
    # The baseline: weight decay on the weights only, through per-parameter
    # hooks since Chainer's WeightDecay has no exclusion list.
    for path, param in model.namedparams():
        if not any(re.search(pattern, path) for pattern in EXCLUDE):
            param.update_rule.add_hook(
                chainer.optimizer_hooks.WeightDecay(args.weight_decay))
    return optimizer, None


def load_cifar(name):
    """CIFAR through Chainer's loader, or exit with what is missing.

    The images are standardized per channel by the means and the standard
    deviations of the training images, the usual preprocessing for CIFAR;
    the padding of the random crops is then the mean colour.
    """
    loader = {'cifar10': chainer.datasets.get_cifar10,
              'cifar100': chainer.datasets.get_cifar100}[name]
    try:
        train, test = loader()
    except (OSError, RuntimeError) as e:
        cache = os.path.join(
            chainer.dataset.get_dataset_directory(
                os.path.join('pfnet', 'chainer', 'cifar'),
                create_directory=False),
            name.replace('cifar', 'cifar-') + '.npz')
        sys.exit(
            'Error: {} is not cached and could not be downloaded ({}).\n'
            'Chainer reads it from the cache file\n'
            '    {}\n'
            'under the dataset root {}.\n'
            'Point --dataset-root or the CHAINER_DATASET_ROOT environment '
            'variable at a folder that holds it.'.format(
                name.upper(), e, cache, chainer.dataset.get_dataset_root()))
    x, t = chainer.dataset.concat_examples(train)
    mean = x.mean(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None]
    std = x.std(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None]

    def standardize(x):
        return ((x - mean) / std).astype(numpy.float32)

    test_x, test_t = chainer.dataset.concat_examples(test)
    return (chainer.datasets.TupleDataset(standardize(x), t),
            chainer.datasets.TupleDataset(standardize(test_x), test_t))


def log_scale(figure, axes, summary):
    axes.set_yscale('log')


def end_of_epoch(trainer):
    """PlotReport's trigger, stateless so that --resume continues it exactly.

    PlotReport's default IntervalTrigger is not saved in snapshots, and a
    resumed one fires at once, adding a point in the middle of an epoch.
    """
    return trainer.updater.is_new_epoch


def check_args(parser, args):
    """Stops with a usage error that names the first flag out of range."""
    for names, valid, what in (
            (('batchsize', 'epoch', 'unit', 'lr', 'decay_power',
              'trust_coefficient'), lambda v: 0 < v < math.inf,
             'positive and finite'),
            (('warmup_epochs', 'momentum', 'weight_decay'),
             lambda v: 0 <= v < math.inf, 'finite and at least 0')):
        for name in names:
            value = getattr(args, name, None)
            if value is not None and not valid(value):
                parser.error('--{} must be {}, got {}'.format(
                    name.replace('_', '-'), what, value))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='chainer-lars example: large-batch CIFAR',
        epilog='Learning rate: when --lr is not given, the peak rate '
        'follows the batch size B: lr = {} * B / {} for momentum '
        '(linear scaling), and lr * trust_coefficient = {} * sqrt(B / {}) '
        'for lars and momentum-lars (the step of each layer relative to its '
        'weight norm, scaled with the square root of the batch size). The '
        'rate rises linearly for --warmup-epochs, then decays to 0 as the '
        'fraction of the run left to the power --decay-power.'.format(
            MOMENTUM_LR_PER_256, REFERENCE_BATCHSIZE, LARS_STEP_PER_256,
            REFERENCE_BATCHSIZE))
    parser.add_argument('--dataset', choices=('cifar10', 'cifar100'),
                        default='cifar10',
                        help='The dataset to use (default: %(default)s)')
    parser.add_argument('--batchsize', '-b', type=int, default=4096,
                        help='Number of images in each mini-batch '
                        '(default: %(default)s)')
    parser.add_argument('--epoch', '-e', type=int, default=100,
                        help='Number of sweeps over the dataset to train '
                        '(default: %(default)s)')
    parser.add_argument('--device', '-d', type=str, default='-1',
                        help='Device specifier. Either ChainerX device '
                        'specifier or an integer. If non-negative integer, '
                        'CuPy arrays with specified device id are used. If '
                        'negative integer, NumPy arrays are used (default: '
                        '%(default)s)')
    parser.add_argument('--out', '-o', default='result',
                        help='Directory to output the result (default: '
                        '%(default)s)')
    parser.add_argument('--resume', '-r', type=str,
                        help='Resume the training from snapshot')
    parser.add_argument('--optimizer',
                        choices=('lars', 'momentum-lars', 'momentum'),
                        default='lars',
                        help='lars: chainer_lars.LARS; momentum-lars: '
                        'MomentumSGD with the chainer_lars.GradientLARS '
                        'hook; momentum: MomentumSGD with WeightDecay (the '
                        'baseline). Default: %(default)s')
    parser.add_argument('--lr', type=float,
                        help='Peak learning rate (default: from the batch '
                        'size, see below)')
    parser.add_argument('--warmup-epochs', type=float, default=5,
                        help='Epochs of linear learning-rate warm-up '
                        '(default: %(default)s)')
    parser.add_argument('--decay-power', type=float, default=2.0,
                        help='After the warm-up, the learning rate decays to '
                        '0 as the fraction of the run left to this power '
                        '(default: %(default)s)')
    parser.add_argument('--momentum', type=float, default=0.9,
                        help='Momentum (default: %(default)s)')
    parser.add_argument('--weight-decay', type=float, default=1e-4,
                        help='Weight decay, not applied to biases and '
                        'BatchNorm parameters (default: %(default)s)')
    parser.add_argument('--trust-coefficient', type=float, default=0.02,
                        help='LARS trust coefficient, for lars and '
                        'momentum-lars (default: %(default)s)')
    parser.add_argument('--depth', type=int, default=20,
                        help='ResNet depth, 6n + 2: 20, 32, 44, 56, 110 '
                        '(default: %(default)s)')
    parser.add_argument('--seed', type=int, default=0,
                        help='Seed of the weights, the shuffling and the '
                        'augmentation (default: %(default)s)')
    parser.add_argument('--dataset-root',
                        help='Folder that holds pfnet/chainer/cifar '
                        "(default: Chainer's dataset root, "
                        'CHAINER_DATASET_ROOT)')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Disable PlotReport extension')
    args = parser.parse_args(argv)
    check_args(parser, args)
    if (args.depth - 2) % 6 or args.depth < 8:
        parser.error('--depth must be 6n + 2 (8, 14, 20, ...), got {}'.format(
            args.depth))
    if args.lr is None:
        args.lr = default_lr(args.optimizer, args.batchsize,
                             args.trust_coefficient)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.dataset_root is not None:
        chainer.dataset.set_dataset_root(args.dataset_root)

    device = chainer.get_device(args.device)
    print('Device: {}'.format(device))
    print('# Minibatch-size: {}'.format(args.batchsize))
    print('# epoch: {}'.format(args.epoch))
    print('# dataset: {}, ResNet-{}'.format(args.dataset, args.depth))
    print('# optimizer: {}, lr {:g}, trust coefficient {:g}, weight decay '
          '{:g}, warm-up {:g} epochs'.format(
              args.optimizer, args.lr, args.trust_coefficient,
              args.weight_decay, args.warmup_epochs))
    print('')

    train, test = load_cifar(args.dataset)
    n_class = 10 if args.dataset == 'cifar10' else 100

    numpy.random.seed(args.seed)  # the initial weights
    model = L.Classifier(ResNet(args.depth, n_class))
    model.to_device(device)
    device.use()
    optimizer, lars = make_optimizer(args, model)

    random_state = numpy.random.RandomState(args.seed)
    train = chainer.datasets.TransformDataset(train, Augment(random_state))
    train_iter = ShuffledIterator(train, args.batchsize, random_state)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize,
                                                 repeat=False, shuffle=False)
    updater = training.updaters.StandardUpdater(
        train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    iterations_per_epoch = len(train) / args.batchsize
    iterations = math.ceil(args.epoch * iterations_per_epoch)
    warmup = min(round(args.warmup_epochs * iterations_per_epoch), iterations)
    trainer.extend(chainer_lars.WarmupPolynomialShift(
        'lr', warmup_count=warmup, max_count=iterations, init=args.lr,
        power=args.decay_power))
    trainer.extend(Evaluator(test_iter, model, device=device),
                   call_before_training=True)
    trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
    trainer.extend(extensions.observe_lr(), trigger=(1, 'iteration'),
                   call_before_training=True)
    trainer.extend(extensions.LogReport(), call_before_training=True)

    ratio_keys = []
    if lars is not None:
        # About ten observations per epoch: each one brings the norms from
        # the GPU once.
        observer = chainer_lars.TrustRatioObserver(lars, pattern='/W$')
        trainer.extend(observer, trigger=(
            max(1, int(iterations_per_epoch) // 10), 'iteration'))
        ratio_keys = [observer.key('ratio', path)
                      for path, _ in model.namedparams()
                      if path.endswith('/W')]

    if args.plot and extensions.PlotReport.available():
        # Draw into files without a display.
        import matplotlib
        matplotlib.use('Agg')
        trainer.extend(extensions.PlotReport(
            ['main/loss', 'validation/main/loss'], 'epoch',
            filename='loss.png', trigger=end_of_epoch),
            call_before_training=True)
        trainer.extend(extensions.PlotReport(
            ['main/accuracy', 'validation/main/accuracy'], 'epoch',
            filename='accuracy.png', trigger=end_of_epoch),
            call_before_training=True)
        trainer.extend(extensions.PlotReport(
            ['lr'], 'epoch', filename='lr.png', trigger=end_of_epoch),
            call_before_training=True)
        if ratio_keys:
            trainer.extend(extensions.PlotReport(
                ratio_keys, 'epoch', filename='trust_ratio.png',
                trigger=end_of_epoch, postprocess=log_scale))

    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/accuracy', 'validation/main/accuracy', 'lr',
         'elapsed_time']), call_before_training=True)
    trainer.extend(extensions.ProgressBar(update_interval=10))

    if args.resume is not None:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


if __name__ == '__main__':
    main()
