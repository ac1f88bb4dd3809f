"""What the example trainers share: the LARS recipe and the trainer glue.

Every trainer imports it as ``examples.common``, so the trainers run as
modules from the repository root (``python -m examples.mnist.train_mnist``;
see README.md in this folder). Its parts:

* the LARS recipe: the optimizers, the rule for the peak learning rate, the
  schedule and the trust-ratio observation, the lines this project is
  about;
* training: Chainer's trainer, assembled from the recipe and the reports,
  in one process or, with ChainerMN, in many;
* the command line: the flags every trainer has and their checks, which
  stop with a usage error before any work starts;
* the data: MNIST and CIFAR through Chainer's loaders, standardized, the
  CIFAR augmentation, and an iterator whose shuffling resumes exactly;
* the reports: an evaluator that weights each batch by its size, the log,
  the plots and the snapshots.
"""

import argparse
import math
import os
import re
import sys

import numpy

import chainer
from chainer.backends import cuda
from chainer import training
from chainer.training import extensions

import chainer_lars


# -- The LARS recipe -------------------------------------------------------

# Parameters matched by these regular expressions (biases, BatchNorm's beta
# and gamma) get neither weight decay nor layer adaptation, as in the
# large-batch recipes.
EXCLUDE = ('/b$', '/beta$', '/gamma$')

# The learning-rate rules (see --help and examples/mnist/README.md).
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


def make_optimizer(args, model, comm=None):
    """Sets up the optimizer chosen by --optimizer on the model.

    Returns the optimizer and the object whose ``observe()`` gives the trust
    ratios (``None`` for the baseline). With a ChainerMN communicator
    ``comm`` the optimizer is multi-node: it averages the gradients over
    the processes before the actual optimizer, its hooks and its update
    rules see them, so LARS takes the norms of the global batch's gradient.
    """
    if args.optimizer == 'lars':
        actual = lars = chainer_lars.LARS(
            lr=args.lr, momentum=args.momentum,
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE)
    else:
        actual = chainer.optimizers.MomentumSGD(
            lr=args.lr, momentum=args.momentum)
        lars = None
    if comm is None:
        optimizer = actual
    else:
        # Imported here: the single-process trainers run without MPI.
        import chainermn
        optimizer = chainermn.create_multi_node_optimizer(actual, comm)
    optimizer.setup(model)
    if args.optimizer == 'momentum-lars':
        lars = chainer_lars.GradientLARS(
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE)
        optimizer.add_hook(lars)
    elif args.optimizer == 'momentum':
        # The baseline: weight decay on the weights only, through
        # per-parameter hooks since Chainer's WeightDecay has no exclusion
        # list.
        for path, param in model.namedparams():
            if not any(re.search(pattern, path) for pattern in EXCLUDE):
                param.update_rule.add_hook(
                    chainer.optimizer_hooks.WeightDecay(args.weight_decay))
    return optimizer, lars


def schedule(args, iterations_per_epoch):
    """The recipe's schedule: linear warm-up, then polynomial decay to 0."""
    iterations = math.ceil(args.epoch * iterations_per_epoch)
    warmup = min(round(args.warmup_epochs * iterations_per_epoch), iterations)
    return chainer_lars.WarmupPolynomialShift(
        'lr', warmup_count=warmup, max_count=iterations, init=args.lr,
        power=args.decay_power)


def observe_trust_ratios(trainer, lars, model, iterations_per_epoch):
    """Reports the trust ratio and norms of each weight; returns ratio keys.

    About ten observations per epoch: each one brings the norms from the
    GPU once. Biases and BatchNorm parameters are not adapted, so only the
    weights (``/W``) are reported.
    """
    if lars is None:
        return []
    observer = chainer_lars.TrustRatioObserver(lars, pattern='/W$')
    trainer.extend(observer, trigger=(
        max(1, int(iterations_per_epoch) // 10), 'iteration'))
    return [observer.key('ratio', path) for path, _ in model.namedparams()
            if path.endswith('/W')]


# -- Training ---------------------------------------------------------------

def train(args, device, optimizer, lars, train_iter, test, comm=None):
    """Trains ``optimizer.target`` by Chainer's trainer, with the recipe.

    ``optimizer`` and ``lars`` are ``make_optimizer``'s. The trainer runs
    ``train_iter`` for --epoch epochs under the recipe's schedule, evaluates
    on ``test`` at each epoch, and reports, plots and snapshots
    (``report``). With a ChainerMN communicator ``comm``, the evaluation and
    the training loss and accuracy are averaged over the processes, and
    rank 0 alone reports and writes.
    """
    model = optimizer.target
    n_train = len(train_iter.dataset)
    if comm is None:
        check_batchsize(args, n_train, 'the training set')
    else:
        check_batchsize(args, n_train,
                        "each process's shard of the training set")
    updater = training.updaters.StandardUpdater(
        train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # Every process counts the same iterations: ChainerMN's shards are of
    # equal length.
    iterations_per_epoch = n_train / args.batchsize
    trainer.extend(schedule(args, iterations_per_epoch))
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize,
                                                 repeat=False, shuffle=False)
    evaluator = Evaluator(test_iter, model, device=device)
    if comm is not None:
        import chainermn
        evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
        # Rank 0 reports the training loss and accuracy of the global
        # batch, not of its shard.
        averaged = ('main/loss', 'main/accuracy')
        trainer.extend(_unwrap_variables(averaged))
        for key in averaged:
            trainer.extend(
                chainermn.extensions.ObservationAggregator(comm, key))
    trainer.extend(evaluator, call_before_training=True)

    # The parameters, and so the trust ratios, are the same in every
    # process: report and save on rank 0 only.
    if comm is None or comm.rank == 0:
        ratio_keys = observe_trust_ratios(trainer, lars, model,
                                          iterations_per_epoch)
        report(trainer, args, ratio_keys,
               **({} if comm is None else {'processes': comm.size}))

    if args.resume is not None:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


def _unwrap_variables(keys):
    """Replaces the reported Variables of ``keys`` by their arrays.

    ChainerMN 7.8.1's ObservationAggregator moves a Variable to the device
    ``'native'``, a ChainerX device, and so fails where Chainer is built
    without ChainerX (the pip wheel); it takes plain arrays as they are.
    Runs just before the aggregators.
    """
    @training.make_extension(
        trigger=(1, 'iteration'), priority=training.PRIORITY_EDITOR + 1)
    def unwrap(trainer):
        for key in keys:
            value = trainer.observation.get(key)
            if isinstance(value, chainer.Variable):
                trainer.observation[key] = value.array
    return unwrap


# -- The command line ------------------------------------------------------

HELP = {
    'batchsize': 'Number of images in each mini-batch',
    'epoch': 'Number of sweeps over the dataset to train',
    'device': 'Device specifier. Either ChainerX device specifier or an '
              'integer. If non-negative integer, CuPy arrays with specified '
              'device id are used. If negative integer, NumPy arrays are '
              'used',
    'out': 'Directory to output the result',
    'resume': 'Resume the training from snapshot, with the same --epoch, '
              '--batchsize, --lr, --warmup-epochs and --decay-power',
    'snapshots': 'Number of snapshots to keep in --out, the latest ones (one '
                 'is written each epoch); 0 writes none',
    'lr': 'Peak learning rate (default: from the batch size, see below)',
    'warmup_epochs': 'Epochs of linear learning-rate warm-up',
    'decay_power': 'After the warm-up, the learning rate decays to 0 as the '
                   'fraction of the run left to this power',
    'momentum': 'Momentum',
    'weight_decay': 'Weight decay, not applied to biases and BatchNorm '
                    'parameters',
    'trust_coefficient': 'LARS trust coefficient, for lars and momentum-lars',
    'seed': 'Seed of the weights, the shuffling and the data augmentation',
    'dataset_root': "Chainer's dataset root, the folder that holds "
                    'pfnet/chainer/<dataset> (default: '
                    'CHAINER_DATASET_ROOT, or ~/.chainer/dataset)',
}


def lr_rule(batch='the batch size B'):
    """The help text of the learning-rate rule, for a parser's epilog."""
    return (
        'Learning rate: when --lr is not given, the peak rate follows {}: '
        'lr = {} * B / {} for momentum (linear scaling), and '
        'lr * trust_coefficient = {} * sqrt(B / {}) for lars and '
        'momentum-lars (the step of each layer relative to its weight '
        'norm, scaled with the square root of the batch size). The rate '
        'rises linearly for --warmup-epochs, then decays to 0 as the '
        'fraction of the run left to the power --decay-power.'.format(
            batch, MOMENTUM_LR_PER_256, REFERENCE_BATCHSIZE,
            LARS_STEP_PER_256, REFERENCE_BATCHSIZE))


def parser(description, defaults, epilog=None, helps=None):
    """The parser of the flags every trainer has.

    ``defaults`` gives those of ``batchsize``, ``epoch`` and
    ``warmup_epochs``; ``helps`` replaces the help of the flags it names
    (``HELP``'s keys). The trainer adds its own flags to the parser it
    returns.
    """
    helps = dict(HELP, **(helps or {}))
    parser = argparse.ArgumentParser(description=description,
                                     epilog=epilog or lr_rule())

    def add(name, *flags, **kwargs):
        text = helps[name]
        if 'default' in kwargs and '(default' not in text:
            text += ' (default: %(default)s)'
        parser.add_argument('--' + name.replace('_', '-'), *flags,
                            help=text, **kwargs)

    add('batchsize', '-b', type=int, default=defaults['batchsize'])
    add('epoch', '-e', type=int, default=defaults['epoch'])
    add('device', '-d', type=str, default='-1')
    add('out', '-o', default='result')
    add('resume', '-r', type=str)
    add('snapshots', type=int, default=1)
    parser.add_argument('--optimizer',
                        choices=('lars', 'momentum-lars', 'momentum'),
                        default='lars',
                        help='lars: chainer_lars.LARS; momentum-lars: '
                        'MomentumSGD with the chainer_lars.GradientLARS '
                        'hook; momentum: MomentumSGD with WeightDecay (the '
                        'baseline). Default: %(default)s')
    add('lr', type=float)
    add('warmup_epochs', type=float, default=defaults['warmup_epochs'])
    add('decay_power', type=float, default=2.0)
    add('momentum', type=float, default=0.9)
    add('weight_decay', type=float, default=1e-4)
    add('trust_coefficient', type=float, default=0.02)
    add('seed', type=int, default=0)
    add('dataset_root')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Disable PlotReport extension')
    return parser


def parse_args(parser, argv=None, positive=(), distributed=False):
    """Parses the flags, or stops with a usage error naming the first bad one.

    Checks the ranges (the flags in ``positive`` must be positive too),
    the device, and that the snapshot to resume from exists, so that a
    mistake stops the run before it loads any data; then points Chainer's
    dataset root at --dataset-root. In one process it also sets the
    default --lr (``default_lr``) and checks the snapshot's schedule
    (``check_resume``); both follow from the global batch, which a
    ChainerMN trainer (``distributed``) knows once its communicator is up,
    so it does them itself.
    """
    args = parser.parse_args(argv)
    for names, valid, what in (
            (('batchsize', 'epoch', 'lr', 'decay_power', 'trust_coefficient')
             + tuple(positive), lambda v: 0 < v < math.inf,
             'positive and finite'),
            (('warmup_epochs', 'momentum', 'weight_decay', 'snapshots'),
             lambda v: 0 <= v < math.inf, 'finite and at least 0')):
        for name in names:
            value = getattr(args, name)
            if value is not None and not valid(value):
                parser.error('--{} must be {}, got {}'.format(
                    name.replace('_', '-'), what, value))
    check_device(parser, args.device)
    if args.resume is not None and not os.path.isfile(args.resume):
        parser.error('--resume {}: no such file'.format(args.resume))
    if args.dataset_root is not None:
        chainer.dataset.set_dataset_root(args.dataset_root)
    if not distributed:
        if args.lr is None:
            args.lr = default_lr(args.optimizer, args.batchsize,
                                 args.trust_coefficient)
        check_resume(args)
    return args


def check_device(parser, spec):
    """The device ``spec`` names, or a usage error saying why it cannot be.

    ``chainer.get_device`` accepts a GPU that the machine does not have,
    and the first use of it fails with a CUDA error; so the GPUs are
    counted here.
    """
    hint = ' (-1 or @numpy: the CPU; 0 or @cupy:0: the first GPU)'
    try:
        device = chainer.get_device(spec)
    except (ValueError, RuntimeError) as e:
        parser.error('--device {}: {}{}'.format(
            spec, ' '.join(str(e).split()), hint))
    if device.xp is cuda.cupy:
        try:
            count = cuda.cupy.cuda.runtime.getDeviceCount()
        except cuda.cupy.cuda.runtime.CUDARuntimeError as e:
            parser.error('--device {}: no usable GPU ({}){}'.format(
                spec, e, hint))
        if device.device.id >= count:
            parser.error('--device {}: no such GPU, this machine has {}{}'
                         .format(spec, count, hint))
    return device


def print_banner(args, *lines):
    """Prints the settings of the run: ``lines``, then the schedule's."""
    for line in lines:
        print(line)
    print('# epoch: {}'.format(args.epoch))
    print('# optimizer: {}, lr {:g}, trust coefficient {:g}, weight decay '
          '{:g}, warm-up {:g} epochs'.format(
              args.optimizer, args.lr, args.trust_coefficient,
              args.weight_decay, args.warmup_epochs))
    print('')
    sys.stdout.flush()


def usage_error(message):
    """Stops as a parser does on a bad flag, where the parser is not at hand.

    For what is known only once the data is loaded; the exit status is 2,
    argparse's.
    """
    sys.stderr.write('{}: error: {}\n'.format(
        os.path.basename(sys.argv[0]), message))
    sys.exit(2)


def check_batchsize(args, n_train, what):
    """Stops if a mini-batch would hold more than all the training data."""
    if args.batchsize > n_train:
        usage_error('--batchsize {} is larger than {} ({} examples)'.format(
            args.batchsize, what, n_train))


# The flags that set the learning-rate schedule; a snapshot records them,
# and --resume refuses a run that changes one (see check_resume).
SCHEDULE_FLAGS = ('epoch', 'batchsize', 'lr', 'warmup_epochs', 'decay_power')


def check_resume(args, **settings):
    """Stops unless the snapshot of --resume continues this run's schedule.

    The schedule (warm-up, then decay to 0 at the last epoch) is computed
    from ``SCHEDULE_FLAGS``, and the snapshot holds only how far it has
    gone; resumed with another ``--epoch``, the rate would jump to another
    curve (from about 0 at the end of a run back to the middle of a longer
    one). ``settings`` are further values the schedule depends on (the
    number of processes, for ChainerMN); a snapshot records them all
    (``RunSettings``). They are compared first: the default --lr follows
    from the number of processes.
    """
    if args.resume is None:
        return
    settings = dict(settings, **run_settings(args))
    try:
        with numpy.load(args.resume) as snapshot:
            saved = {name: snapshot.get(RunSettings.prefix + name)
                     for name in settings}
    except (OSError, ValueError) as e:
        usage_error('--resume {}: not a snapshot ({})'.format(args.resume, e))
    for name, value in settings.items():
        if saved[name] is None:
            usage_error('--resume {}: not a snapshot of these examples, or '
                        'one written before they recorded their settings '
                        '(it has no {})'.format(args.resume, name))
        if saved[name] != value:
            flag = ('the number of processes' if name == 'processes'
                    else '--' + name.replace('_', '-'))
            usage_error(
                '--resume {}: the snapshot was written with {} {}, this run '
                'has {}. The learning-rate schedule follows from --epoch, '
                '--batchsize, --lr, --warmup-epochs and --decay-power (and, '
                'with ChainerMN, the number of processes), so a resumed run '
                'keeps them; to train longer, start a new run.'.format(
                    args.resume, flag, saved[name].item(), value))


def run_settings(args):
    return {name: getattr(args, name) for name in SCHEDULE_FLAGS}


class RunSettings(training.Extension):

    """Records in snapshots the settings that ``check_resume`` compares.

    It does nothing during the run; it is there to be serialized.
    """

    prefix = 'extensions/RunSettings/'
    trigger = 1, 'epoch'

    def __init__(self, settings):
        self._settings = settings

    def __call__(self, trainer):
        pass

    def serialize(self, serializer):
        for name, value in self._settings.items():
            self._settings[name] = serializer(name, value)


# -- The data --------------------------------------------------------------

def load_mnist():
    """MNIST through Chainer's loader, or exit with what is missing.

    The images are standardized: shifted and scaled by the mean and the
    standard deviation of all the training pixels (about 0.13 and 0.31),
    the usual preprocessing for MNIST. The model then starts well
    conditioned, which large batches, with few updates, need most.
    """
    try:
        train, test = chainer.datasets.get_mnist()
    except (OSError, RuntimeError) as e:
        directory = _cache('mnist')
        _missing('MNIST', e, 'files', [os.path.join(directory, 'train.npz'),
                                       os.path.join(directory, 'test.npz')])
    x, t = chainer.dataset.concat_examples(train)
    return _standardized(x, t, test, x.mean(dtype=numpy.float64),
                         x.std(dtype=numpy.float64))


def load_cifar(name):
    """CIFAR-10 or -100 through Chainer's loader, or exit with what is missing.

    The images are standardized per channel by the means and the standard
    deviations of the training images, the usual preprocessing for CIFAR;
    the padding of the random crops is then the mean colour.
    """
    loader = {'cifar10': chainer.datasets.get_cifar10,
              'cifar100': chainer.datasets.get_cifar100}[name]
    try:
        train, test = loader()
    except (OSError, RuntimeError) as e:
        _missing(name.upper(), e, 'file', [os.path.join(
            _cache('cifar'), name.replace('cifar', 'cifar-') + '.npz')])
    x, t = chainer.dataset.concat_examples(train)
    return _standardized(
        x, t, test, x.mean(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None],
        x.std(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None])


def _cache(name):
    return chainer.dataset.get_dataset_directory(
        os.path.join('pfnet', 'chainer', name), create_directory=False)


def _missing(name, error, files, paths):
    sys.exit(
        'Error: {} is not cached and could not be downloaded ({}).\n'
        'Chainer reads it from the cache {}\n'
        '{}\n'
        'under the dataset root {}.\n'
        'Point --dataset-root or the CHAINER_DATASET_ROOT environment '
        'variable at a folder that holds {}.'.format(
            name, error, files, '\n'.join('    ' + p for p in paths),
            chainer.dataset.get_dataset_root(),
            'them' if len(paths) > 1 else 'it'))


def _standardized(x, t, test, mean, std):
    """The training set ``(x, t)`` and ``test``, standardized.

    ``mean`` and ``std`` are float64: a NumPy scalar (MNIST) leaves the
    arithmetic in float32, an array (CIFAR's per channel) makes it float64.
    """
    def standardize(x):
        return ((x - mean) / std).astype(numpy.float32)

    test_x, test_t = chainer.dataset.concat_examples(test)
    return (chainer.datasets.TupleDataset(standardize(x), t),
            chainer.datasets.TupleDataset(standardize(test_x), test_t))


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
    ``--resume`` sees the same batches as an uninterrupted one. A data
    augmentation that draws from the same state (``Augment``) resumes
    exactly too.
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


# -- The reports -----------------------------------------------------------

class Evaluator(extensions.Evaluator):

    """Chainer's Evaluator, with each batch weighted by its size.

    Chainer's Evaluator takes the plain mean of the values reported for each
    batch, so that a short last batch counts as much as a full one: with
    10,000 test images in batches of 8192, the last 1808 images would make
    half of the result. This one weights what the model reports for a batch
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


def end_of_epoch(trainer):
    """The plots' trigger, stateless so that --resume continues them exactly.

    PlotReport's default IntervalTrigger is not saved in snapshots, and a
    resumed one fires at once, adding a point in the middle of an epoch.
    """
    return trainer.updater.is_new_epoch


def report(trainer, args, ratio_keys, **settings):
    """Adds the snapshots, the log, the plots and the printed report.

    ``ratio_keys`` are the trust ratios to draw (``observe_trust_ratios``);
    ``settings`` go into the snapshots with the flags ``check_resume``
    compares.
    """
    if args.snapshots:
        trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
        trainer.extend(keep_latest_snapshots(args.snapshots))
    trainer.extend(RunSettings(dict(run_settings(args), **settings)))
    trainer.extend(extensions.observe_lr(), trigger=(1, 'iteration'),
                   call_before_training=True)
    trainer.extend(extensions.LogReport(), call_before_training=True)

    if args.plot and extensions.PlotReport.available():
        # Draw into files without a display.
        import matplotlib
        matplotlib.use('Agg')
        trainer.extend(extensions.PlotReport(
            ['main/loss', 'validation/main/loss'], 'epoch',
            filename='loss.png', trigger=end_of_epoch,
            postprocess=_axes('loss (softmax cross entropy, log scale)',
                              log=True)),
            call_before_training=True)
        trainer.extend(extensions.PlotReport(
            ['main/accuracy', 'validation/main/accuracy'], 'epoch',
            filename='accuracy.png', trigger=end_of_epoch,
            postprocess=_axes('accuracy')),
            call_before_training=True)
        trainer.extend(IterationPlot('lr', 'lr.png', 'learning rate'))
        if ratio_keys:
            trainer.extend(TrustRatioHeatmap(ratio_keys), trigger=end_of_epoch)

    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/accuracy', 'validation/main/accuracy', 'lr',
         'elapsed_time']), call_before_training=True)
    trainer.extend(extensions.ProgressBar(update_interval=10))


def keep_latest_snapshots(n):
    """Removes all but the ``n`` latest snapshots in the output directory.

    Chainer's own ``snapshot(n_retains=n)`` orders the files by their
    modification times alone, which are equal for files written within one
    clock tick, and then by name, where ``snapshot_iter_10`` comes before
    ``snapshot_iter_9``; here the iteration breaks ties. Runs after the
    snapshot (priority -100) of each epoch.
    """
    @training.make_extension(trigger=(1, 'epoch'), priority=-200)
    def remove_older_snapshots(trainer):
        found = []
        for name in os.listdir(trainer.out):
            match = re.match(r'snapshot_iter_(\d+)$', name)
            if match:
                path = os.path.join(trainer.out, name)
                found.append((os.stat(path).st_mtime, int(match.group(1)),
                              path))
        for _, _, path in sorted(found)[:-n]:
            os.remove(path)
    return remove_older_snapshots


def _axes(ylabel, log=False):
    """A PlotReport postprocess that labels the y axis (and makes it log)."""
    def postprocess(figure, axes, summary):
        axes.set_ylabel(ylabel)
        if log:
            axes.set_yscale('log')
    return postprocess


class IterationPlot(training.Extension):

    """Draws a reported value at every iteration, against the epoch.

    PlotReport and LogReport draw means over an interval, which for the
    learning rate hide the warm-up and the peak. This one keeps the value
    of every iteration (saved in snapshots, so that a resumed run draws
    the whole run) and draws them at the end of each epoch.

    Args:
        key (str): The reported value, e.g. ``'lr'`` from ``observe_lr``
            (which reports the rate the last update used).
        filename (str): The picture, in the trainer's output directory.
        ylabel (str): The label of the y axis.
    """

    def __init__(self, key, filename, ylabel):
        self._key = key
        self._filename = filename
        self._ylabel = ylabel
        # (epoch, value) after each update
        self._points = []

    def __call__(self, trainer):
        self._points.append((trainer.updater.epoch_detail,
                             float(trainer.observation[self._key])))
        if not trainer.updater.is_new_epoch:
            return
        import matplotlib.pyplot as plt
        figure, axes = plt.subplots()
        epochs, values = zip(*self._points)
        axes.plot(epochs, values)
        axes.set_xlabel('epoch')
        axes.set_ylabel(self._ylabel)
        axes.set_xlim(0, None)
        axes.set_ylim(0, None)
        axes.grid(alpha=0.3)
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            serializer('points', numpy.array(
                self._points, dtype=numpy.float64).reshape(-1, 2))
        else:
            self._points = [tuple(p) for p in serializer('points', None)]


class TrustRatioHeatmap(training.Extension):

    """Draws the trust ratio of every layer at every epoch as a heat map.

    One row a layer, in the model's order, one column an epoch, the colour
    the epoch's mean ratio on a log scale: lines, one a layer, cannot be
    told apart beyond ten or so. It reads the LogReport's log, which
    snapshots hold, so it keeps no state of its own.

    Args:
        keys (list of str): The reported ratios, from
            ``observe_trust_ratios``.
        filename (str): The picture, in the trainer's output directory.
    """

    # After the LogReport has added the epoch.
    priority = training.PRIORITY_READER - 1

    def __init__(self, keys, filename='trust_ratio.png'):
        self._keys = keys
        self._filename = filename

    def __call__(self, trainer):
        import matplotlib.colors
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        log = [entry for entry in trainer.get_extension('LogReport').log
               if self._keys[0] in entry]
        ratios = numpy.array([[entry.get(key, numpy.nan) for entry in log]
                              for key in self._keys])
        ratios = numpy.ma.masked_where(~(ratios > 0), ratios)
        low, high = ratios.min(), ratios.max()
        if not high > low:  # one value: LogNorm needs a range
            low, high = low / 2, high * 2
        rows = len(self._keys)
        figure, axes = plt.subplots(figsize=(7, 1.5 + 0.17 * rows))
        image = axes.imshow(
            ratios, aspect='auto', interpolation='nearest',
            norm=matplotlib.colors.LogNorm(low, high),
            extent=(log[0]['epoch'] - 0.5, log[-1]['epoch'] + 0.5,
                    rows - 0.5, -0.5))
        prefix = os.path.commonprefix(self._keys)
        prefix = prefix[:prefix.rfind('/') + 1]
        axes.set_yticks(range(rows))
        axes.set_yticklabels([key[len(prefix):] for key in self._keys],
                             fontsize=min(9, max(4, 400 // rows)))
        axes.xaxis.set_major_locator(
            matplotlib.ticker.MaxNLocator(integer=True))
        axes.set_xlabel('epoch')
        axes.set_title('trust ratio of each layer ({}...), epoch means'
                       .format(prefix), fontsize=9)
        figure.colorbar(image, ax=axes, label='trust ratio (log scale)')
        figure.tight_layout()
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)
