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
import zipfile
import zlib

import numpy

import chainer
from chainer.backends import cuda
from chainer import training
from chainer.training import extensions

import chainer_lars

from examples import folders
from examples import plotting


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
    return [observer.key('ratio', path) for path in parameter_paths(model)
            if path.endswith('/W')]


def parameter_paths(link, prefix=''):
    """The paths of the parameters of ``link``, in the order it defines them.

    ``namedparams()`` lists a Chain's children in the order of a set (for
    the CIFAR ResNet, ``fc/W`` second); the attributes of a link are in
    the order its ``__init__`` set them, which is the order of the layers
    in the models here.
    """
    for name, value in vars(link).items():
        if name in link._params:
            yield prefix + '/' + name
        elif (isinstance(link, chainer.Chain) and name in link._children):
            yield from parameter_paths(value, prefix + '/' + name)
    if isinstance(link, chainer.ChainList):
        for i, child in enumerate(link):
            yield from parameter_paths(child, '{}/{}'.format(prefix, i))


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
        settings = {'examples': n_train}
    else:
        check_batchsize(args, n_train,
                        "each process's shard of the training set")
        settings = {'examples': n_train, 'processes': comm.size}
    check_resume(args, **settings)
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
        report(trainer, args, ratio_keys, **settings)

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
    'resume': 'Resume the training from a snapshot, with the same flags '
              'but --out, --snapshots, --device and --dataset-root',
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
    given = helps or {}
    helps = dict(HELP, **given)
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
    # None: the default, or the whole run if that is shorter
    # (resolve_warmup).
    parser.warmup_default = defaults['warmup_epochs']
    if 'warmup_epochs' not in given:
        helps['warmup_epochs'] += (' (default: {:g}, or the whole run if '
                                   'shorter)'.format(
                                       defaults['warmup_epochs']))
    add('warmup_epochs', type=float)
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

    Checks the ranges (the flags in ``positive`` must be positive integers
    too), the device, and the paths (``path_problem``), so that a mistake
    stops the run before it loads any data; then points Chainer's dataset
    root at --dataset-root. In one process it also sets the default --lr
    (``default_lr``) and checks the snapshot of --resume
    (``check_resume``); both follow from the global batch, which a
    ChainerMN trainer (``distributed``) knows once its communicator is up,
    so it does them itself, and it checks --out and --dataset-root on
    rank 0 alone (``check_rank0_paths``).
    """
    args = parser.parse_args(argv)
    check_ranges(parser, args, positive)
    if args.epoch is not None and parser.warmup_default is not None:
        resolve_warmup(parser.error, args, parser.warmup_default)
    check_device(parser, args.device)
    if args.resume is not None and not os.path.isfile(args.resume):
        parser.error('--resume {}: {}'.format(args.resume, (
            'not a file' if os.path.exists(args.resume) else 'no such file')))
    if not distributed:
        problem = path_problem(args)
        if problem is not None:
            parser.error(problem)
    if args.dataset_root is not None:
        chainer.dataset.set_dataset_root(args.dataset_root)
    if not distributed:
        if args.lr is None:
            args.lr = default_lr(args.optimizer, args.batchsize,
                                 args.trust_coefficient)
        check_resume(args)
    return args


# The ranges of the numeric flags: (flags, test, what the message says).
# The trainers' own flags (--unit) are added by parse_args's ``positive``;
# --warmup-epochs is compared with --epoch once both are known
# (resolve_warmup).
RANGES = (
    (('batchsize', 'epoch'), lambda v: v > 0, 'a positive integer'),
    (('lr', 'decay_power', 'trust_coefficient'),
     lambda v: 0 < v < math.inf, 'positive and finite'),
    (('warmup_epochs', 'weight_decay'), lambda v: 0 <= v < math.inf,
     'finite and at least 0'),
    (('momentum',), lambda v: 0 <= v < 1, 'at least 0 and less than 1'),
    (('snapshots',), lambda v: v >= 0, 'an integer, at least 0'),
    # NumPy's RandomState takes seeds below 2 ** 32; ChainerMN's ranks add
    # their rank to it.
    (('seed',), lambda v: 0 <= v < 2 ** 31,
     'an integer from 0 to {}'.format(2 ** 31 - 1)),
)


def check_ranges(parser, args, positive=()):
    """Stops with a usage error at the first numeric flag out of range."""
    ranges = RANGES + ((tuple(positive), lambda v: v > 0,
                        'a positive integer'),)
    for names, valid, what in ranges:
        for name in names:
            value = getattr(args, name, None)
            if value is not None and not valid(value):
                parser.error('--{} must be {}, got {}'.format(
                    name.replace('_', '-'), what, value))


def resolve_warmup(error, args, default):
    """Sets --warmup-epochs if not given; refuses one longer than the run.

    A warm-up longer than --epoch would still be rising at the last
    update: given, it is an error (``error``, the parser's); the trainer's
    ``default``, when longer than a short run, becomes the whole run, and
    ``args.warmup_note`` says so for the banner.
    """
    args.warmup_note = None
    if args.warmup_epochs is None:
        args.warmup_epochs = min(default, args.epoch)
        if default > args.epoch:
            args.warmup_note = ('the whole run: the default, {:g}, is '
                                'longer'.format(default))
    elif args.warmup_epochs > args.epoch:
        error('--warmup-epochs {:g} is longer than the run (--epoch {}): '
              'the rate would still be rising at the last update; give at '
              'most --warmup-epochs {}'.format(
                  args.warmup_epochs, args.epoch, args.epoch))


def path_problem(args):
    """What is wrong with --out or --dataset-root, in one line, or None.

    --out must be a folder that can be made and written (it is made and
    a file written in it, then both removed, so that a run that stops
    here leaves nothing behind); --dataset-root must be an existing
    folder. The snapshot of --resume is checked by ``check_resume``.
    """
    problem = folders.folder_problem(args.out, create=True)
    if problem is not None:
        return '--out {}: {}'.format(args.out, problem)
    if args.dataset_root is not None:
        problem = folders.folder_problem(args.dataset_root, create=False)
        if problem is not None:
            return '--dataset-root {}: {}'.format(args.dataset_root,
                                                  problem)
    return None


def check_rank0_paths(args, comm):
    """``path_problem`` on rank 0, for a ChainerMN trainer; every rank stops.

    Only rank 0 writes --out and reads --dataset-root; the other ranks
    take its verdict, so that they stop with it rather than wait for it
    in the first collective.
    """
    problem = (path_problem(args) or '') if comm.rank == 0 else None
    # bcast_obj refuses to send None.
    problem = comm.bcast_obj(problem, root=0)
    if problem:
        usage_error(problem)


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
        parser.error('--device {}: {}{}'.format(spec, device_error(e), hint))
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


def device_error(error):
    """``chainer.get_device``'s error as one line.

    Without CuPy, Chainer's message runs its two sentences together
    ("...#installation).No module named 'cupy'"): say it in order.
    """
    if not cuda.available and str(error).startswith('CUDA environment'):
        return ('CuPy cannot be used ({}; see https://docs.cupy.dev/en/'
                'stable/install.html)'.format(
                    ' '.join(str(cuda._resolution_error).split())))
    return ' '.join(str(error).split())


def print_banner(args, *lines):
    """Prints the settings of the run: ``lines``, then the schedule's."""
    for line in lines:
        print(line)
    print('# epoch: {}'.format(args.epoch))
    # MomentumSGD has no trust coefficient.
    trust = ('' if args.optimizer == 'momentum' else
             ', trust coefficient {:g}'.format(args.trust_coefficient))
    warmup = '{:g} epochs'.format(args.warmup_epochs)
    if getattr(args, 'warmup_note', None):
        warmup += ' ({})'.format(args.warmup_note)
    print('# optimizer: {}, lr {:g}{}, weight decay {:g}, warm-up {}'.format(
        args.optimizer, args.lr, trust, args.weight_decay, warmup))
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


# The flags that may change on --resume: they do not change what the run
# computes (where it writes, what it resumes from, how many snapshots it
# keeps, the device, where the data is read from, ChainerMN's
# communicator). A snapshot records every other flag (``run_settings``).
FREE_FLAGS = ('out', 'resume', 'snapshots', 'device', 'dataset_root',
              'communicator')

# What a snapshot records besides the flags, as a message names it.
SETTINGS = {
    'processes': 'the number of processes',
    'examples': 'the number of training examples',
    'dtype': "the precision (chainer.config.dtype, CHAINER_DTYPE's)",
}


def run_settings(args, **settings):
    """What defines the run, as a snapshot records it.

    Every flag but ``FREE_FLAGS``, the precision, and ``settings``: the
    number of processes for ChainerMN, the number of training examples
    (each process's, for ChainerMN) once the data is loaded.
    """
    recorded = {name: value for name, value in vars(args).items()
                if name not in FREE_FLAGS and name != 'warmup_note'
                and value is not None}
    recorded['dtype'] = numpy.dtype(chainer.config.dtype).name
    recorded.update(settings)
    return recorded


def _name(name):
    return SETTINGS.get(name) or '--' + name.replace('_', '-')


def _order(name):
    # --lr last: its default follows from --optimizer, --batchsize,
    # --trust-coefficient and the number of processes, so that a change
    # in one of those is named, not the rate it changes.
    return name == 'lr'


def check_resume(args, **settings):
    """Stops unless the snapshot of --resume was written by this same run.

    The snapshot records what defines the run (``run_settings``:
    the optimizer, the model, the data, the precision, the seed, the
    schedule) and holds only how far the run has gone: resumed with
    another --optimizer, the momentum buffers would load into another
    update rule; with another --epoch, the rate would jump to another
    curve (from about 0 at the end of a run back to the middle of a
    longer one). ``settings`` are compared with the recorded values too
    (``processes``, ``examples``). A truncated or damaged file is refused
    like one that is not a snapshot at all, and so is a snapshot of an
    older version of these examples, which recorded only the schedule.
    """
    if args.resume is None:
        return
    settings = run_settings(args, **settings)
    saved = _recorded(args.resume)
    if not saved:
        usage_error('--resume {}: not a snapshot of these examples (it '
                    'records no settings)'.format(args.resume))
    if 'dtype' not in saved:
        usage_error(
            '--resume {}: a snapshot of an older version of these examples, '
            'which recorded the schedule only, not the optimizer, model, '
            'seed and data that define the run; resume it with that '
            'version, or start a new run'.format(args.resume))
    # Another trainer's snapshot first: its values would not compare.
    for name in sorted(set(settings) - set(saved)):
        usage_error('--resume {}: the snapshot records no {}: it was '
                    'written by another trainer'.format(
                        args.resume, _name(name)))
    for name in sorted(set(saved) - set(settings) - {'examples'}):
        usage_error('--resume {}: the snapshot records {} {}, which this '
                    'trainer does not have: it was written by another '
                    'trainer'.format(args.resume, _name(name), saved[name]))
    for name in sorted(settings, key=_order):
        if saved[name] != settings[name]:
            usage_error('--resume {}: {}. A resumed run is the same run: '
                        'it keeps every flag but {}; to change one, start '
                        'a new run.'.format(
                            args.resume,
                            _difference(name, saved[name], settings[name]),
                            ', '.join(_name(n) for n in FREE_FLAGS)))


def _difference(name, saved, value):
    if name == 'plot':  # --noplot: the plots' state is in the snapshot
        return 'the snapshot was written {} --noplot, this run {} it'.format(
            *(('with', 'without') if value else ('without', 'with')))
    return 'the snapshot was written with {} {}, this run has {}'.format(
        _name(name), saved, value)


def _recorded(path):
    """The settings the snapshot ``path`` records, or a usage error.

    The whole file is read and its checksums tested first: a snapshot
    cut short (a copy that did not finish, a full disk) is refused as
    cleanly as a file that is no snapshot at all.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
        if damaged is not None:
            raise ValueError('{} fails its checksum'.format(damaged))
        with numpy.load(path) as snapshot:
            return {name[len(RunSettings.prefix):]: snapshot[name].item()
                    for name in snapshot.files
                    if name.startswith(RunSettings.prefix)}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile,
            zlib.error) as e:
        usage_error('--resume {}: not a snapshot, or a damaged one ({})'
                    .format(path, e))


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
    directory = _cache('mnist')
    train, test = _load('MNIST', chainer.datasets.get_mnist, 'mnist', 'files',
                        [os.path.join(directory, 'train.npz'),
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
    train, test = _load(name.upper(), loader, 'cifar', 'file', [
        os.path.join(_cache('cifar'), name.replace('cifar', 'cifar-')
                     + '.npz')])
    x, t = chainer.dataset.concat_examples(train)
    return _standardized(
        x, t, test, x.mean(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None],
        x.std(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None])


def _cache(name):
    return chainer.dataset.get_dataset_directory(
        os.path.join('pfnet', 'chainer', name), create_directory=False)


def _load(name, loader, folder, files, paths):
    """``loader()``, or exit with what is missing, the dataset root as it was.

    With the cache files there, Chainer's loader only reads them. Without
    them it makes the cache's folders and its download lock under the
    dataset root, then downloads; if that fails, what it made is removed
    again, so that a failed lookup in a shared root leaves no trace (and
    one in a read-only root fails before it writes).
    """
    root = chainer.dataset.get_dataset_root()
    made = [root] + [os.path.join(root, *parts) for parts in (
        ('pfnet',), ('pfnet', 'chainer'), ('pfnet', 'chainer', folder),
        ('_dl_cache',), ('_dl_cache', '_dl_lock'), ('_create_lock',))]
    made = [path for path in made if not os.path.lexists(path)]
    try:
        return loader()
    except (OSError, RuntimeError) as e:
        for path in reversed(made):
            try:
                if os.path.isdir(path):
                    os.rmdir(path)  # only if empty
                elif os.path.lexists(path):
                    os.remove(path)
            except OSError:
                pass
        _missing(name, e, files, paths)


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
    trainer.extend(RunSettings(run_settings(args, **settings)))
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


# The legends' names of the reported values.
LABELS = {'main/loss': 'train', 'validation/main/loss': 'test',
          'main/accuracy': 'train', 'validation/main/accuracy': 'test'}


def _axes(ylabel, log=False):
    """A PlotReport postprocess: labels, and the epochs a run diverged.

    It names the curves train and test, labels the y axis (log: on a log
    scale), and marks the epochs whose value is not finite, which
    PlotReport draws as nothing: a cross at the top of the plot for each
    such epoch, and a line at the first, "diverged", so that a run that
    blew up does not read as one that stopped.
    """
    def postprocess(figure, axes, summary):
        axes.set_ylabel(ylabel)
        if log:
            axes.set_yscale('log')
            plotting.plain_log_ticks(axes.yaxis)
        first = None
        finite = []
        for line in axes.get_lines():
            line.set_label(LABELS.get(line.get_label(), line.get_label()))
            x = numpy.asarray(line.get_xdata(), dtype=numpy.float64)
            y = numpy.asarray(line.get_ydata(), dtype=numpy.float64)
            bad = ~numpy.isfinite(y)
            finite.extend(y[~bad])
            if bad.any():
                axes.plot(x[bad], numpy.full(int(bad.sum()), 0.95), 'x',
                          color=line.get_color(), markersize=9,
                          transform=axes.get_xaxis_transform(),
                          label='_nolegend_')
                first = x[bad].min() if first is None else min(
                    first, x[bad].min())
        if first is not None:
            axes.axvline(first, color='red', linestyle=':',
                         label='diverged: not finite from epoch {:g} (x)'
                         .format(first))
            # The finite values' range, which the crosses would stretch.
            if finite and log:
                axes.set_ylim(min(finite) / 2, max(finite) * 2)
            elif finite:
                low, high = min(finite), max(finite)
                pad = 0.1 * (high - low) or 0.05
                axes.set_ylim(low - pad, high + pad)
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
        if not ratios.count():  # a run that diverged from the start
            return
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
        bar = figure.colorbar(image, ax=axes, label='trust ratio (log scale)')
        ticks = ratio_ticks(low, high)
        bar.ax.minorticks_off()
        bar.set_ticks(ticks)
        bar.set_ticklabels(['{:.3g}'.format(t) for t in ticks])
        figure.tight_layout()
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)


def ratio_ticks(low, high):
    """Ticks for a log-scale colour bar from ``low`` to ``high``: 4 to 12.

    Round values (1, 2, 5 times a power of ten, or finer steps over a
    narrow range), else evenly spaced ones on the log scale.
    """
    for mantissas in ((1,), (1, 3), (1, 2, 5), (1, 1.5, 2, 3, 5, 7),
                      (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [float('{:.6g}'.format(m * 10.0 ** e))
                 for e in range(math.floor(math.log10(low)) - 1,
                                math.ceil(math.log10(high)) + 1)
                 for m in mantissas]
        ticks = [t for t in ticks
                 if low * (1 - 1e-9) <= t <= high * (1 + 1e-9)]
        if 4 <= len(ticks) <= 12:
            return ticks
    return list(numpy.geomspace(low, high, 5))
