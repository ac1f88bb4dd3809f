"""The command line every trainer has, and its checks.

The flags, their ranges, the device and the paths are checked before any
work starts, and a mistake stops the run with a usage error; a snapshot
given to ``--resume`` is checked against the run's flags
(``check_resume``), which the snapshot records (``RunSettings``).
"""

import argparse
import contextlib
import io
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
import zipfile
import zlib

import numpy

import chainer
from chainer.backends import cuda
from chainer import training
from chainer.training import extensions

from examples import folders
from examples import logs
from examples import recipe


def dtype_help(small_model):
    """The help of --dtype; ``small_model`` names the flags of a small
    model of the trainer, for a functional try of 16 bits on the CPU."""
    return ('The precision, as chainer.config.dtype: float32; float16 '
            '(float16 arrays throughout); mixed16 (float16 arrays, '
            'BatchNorm parameters and statistics in float32). In 16 bits '
            'the loss is scaled and the update made on float32 master '
            "copies (default: CHAINER_DTYPE's, float32 if unset). On the "
            "CPU, 16 bits are for a functional try: NumPy's float16 has "
            'no fast matrix product, and an update takes some 100 times '
            "as long as in float32 (this example's defaults: hours); use "
            'a GPU, or a small model ({})'.format(small_model))


HELP = {
    'batchsize': 'Number of images in each mini-batch',
    'epoch': 'Number of sweeps over the dataset to train',
    'device': "The device, as chainer.get_device takes it: @numpy (or a "
              'negative integer) for the CPU, @cupy:0 (or 0) for the first '
              'GPU',
    'out': 'Directory to output the result; a new run refuses one that '
           "holds another run's log or snapshots (see --overwrite), a "
           "resumed run one that holds a run other than its snapshot's, "
           'or its run gone on past the snapshot with a later snapshot '
           'there (a log gone on alone is not refused: a run killed after '
           'its latest snapshot goes on there) (default: result; with '
           '--resume, the folder of its snapshot, where the run goes on)',
    'overwrite': "Start a new run in an --out that holds another run's: "
                 'its log, snapshots and plots are removed after the new '
                 "run's first update (a run that stops before keeps them)",
    'resume': 'Resume the training from a snapshot, with the same flags '
              'but --out, --snapshots, --device, --dataset-root and '
              '--progress',
    'snapshots': 'Number of snapshots to keep in --out, the latest ones (one '
                 'is written each epoch); 0 writes none',
    'lr': "Peak learning rate, Adam's and LAMB's alpha (default: from the "
          'batch size, see below)',
    'warmup_epochs': 'Epochs of linear learning-rate warm-up',
    'decay_power': 'After the warm-up, the learning rate decays to 0 as the '
                   'fraction of the run left to this power',
    'momentum': "Momentum; Adam's and LAMB's beta1",
    'beta2': "Adam's and LAMB's beta2 (default: the optimizer's, 0.999)",
    'eps': "Adam's and LAMB's eps (default: the optimizer's, 1e-08 for "
           'Adam and 1e-06 for LAMB)',
    'weight_decay': "Weight decay (Adam's and LAMB's weight_decay_rate), "
                    'not applied to biases and BatchNorm parameters',
    'trust_coefficient': 'LARS trust coefficient, for lars and momentum-lars '
                         '(default: {:g})'.format(recipe.TRUST_COEFFICIENT),
    'seed': 'Seed of the weights, the shuffling and the data augmentation',
    'dtype': dtype_help('MNIST: -u 50'),
    'loss_scale': 'A static loss scale, for --dtype float16 and mixed16, '
                  'from {:.4g} to {:g}: the loss is scaled in float16, and '
                  "these are its normal numbers (default: Chainer's dynamic "
                  'loss scaling, which starts at 1)'.format(
                      numpy.finfo(numpy.float16).tiny,
                      numpy.finfo(numpy.float16).max),
    'label_smoothing': 'Label smoothing of the loss: the target puts 1 - '
                       'EPS on the label and EPS over all the classes; 0 '
                       'is off',
    'validation': 'Hold out the last N training images as a validation '
                  'set, evaluated as val/main/accuracy and val/main/loss; '
                  '0 is none',
    'eval_every': 'Evaluate the validation set (--validation, which it '
                  'needs) every K iterations too, and log then (default: '
                  'at the end of each epoch only)',
    'dataset_root': "Chainer's dataset root, the folder that holds "
                    'pfnet/chainer/<dataset> (default: '
                    'CHAINER_DATASET_ROOT, or ~/.chainer/dataset)',
}


def lr_rule(batch='the batch size B'):
    """The help text of the learning-rate rule, for a parser's epilog."""
    return (
        'Learning rate: when --lr is not given, the peak rate follows {}: '
        'lr = {} * B / {} for momentum and nesterov (linear scaling), and '
        'lr * trust_coefficient = {} * sqrt(B / {}) for lars and '
        'momentum-lars (the step of each layer relative to its weight '
        'norm, scaled with the square root of the batch size); alpha = {} '
        '* sqrt(B / {}) for adam and {} * sqrt(B / {}) for lamb (its '
        'relative step). The rate rises linearly for --warmup-epochs, then '
        'decays to 0 as the fraction of the run left to the power '
        '--decay-power.'.format(
            batch, recipe.MOMENTUM_LR_PER_256, recipe.REFERENCE_BATCHSIZE,
            recipe.LARS_STEP_PER_256, recipe.REFERENCE_BATCHSIZE,
            recipe.ADAM_ALPHA_PER_256, recipe.REFERENCE_BATCHSIZE,
            recipe.LAMB_STEP_PER_256, recipe.REFERENCE_BATCHSIZE))


class _SilentParser(argparse.ArgumentParser):

    """A parser that prints nothing at once: for the processes of a
    ChainerMN trainer but rank 0, which says its usage errors once (and
    --help); they end as :func:`rank_0_says` ends them."""

    def print_usage(self, file=None):
        pass

    def print_help(self, file=None):
        pass

    def exit(self, status=0, message=None):
        rank_0_says(message or '', status)


#: How long a rank other than 0 waits before it ends on a problem that
#: every rank finds alike before MPI is up (rank_0_says).
GRACE = 30.0


def rank_0_says(text, status):
    """Ends this process with ``status`` on a problem that every process
    of a ChainerMN trainer finds alike before MPI is up (the flags, no
    mpi4py): rank 0, or a process no launcher started, writes ``text`` at
    once. Another rank waits ``GRACE`` seconds first: one that ended
    first, non-zero, would make mpiexec stop the job, rank 0 too, perhaps
    before it said the problem (its imports may take longer). Rank 0
    ends, and mpiexec stops the ranks still waiting; one still running
    after the wait (rank 0 did not find the problem: another machine's
    environment) writes ``text`` itself, naming its rank and machine."""
    rank = launcher_rank()
    if rank and status:
        time.sleep(GRACE)
        text = _naming_rank(text, rank)
    elif rank:
        text = ''  # --help: said by rank 0
    sys.stderr.write(text)
    sys.stderr.flush()
    sys.exit(status)


def parser(description, defaults, epilog=None, helps=None, silent=False):
    """The parser of the flags every trainer has.

    ``defaults`` gives those of ``batchsize``, ``epoch`` and
    ``warmup_epochs``; ``helps`` replaces the help of the flags it names
    (``HELP``'s keys); a ``silent`` parser prints neither its usage
    errors nor --help (``_SilentParser``). The trainer adds its own flags
    to the parser it returns.
    """
    given = helps or {}
    helps = dict(HELP, **given)
    parser = (_SilentParser if silent else argparse.ArgumentParser)(
        description=description, epilog=epilog or lr_rule())

    def add(name, *flags, **kwargs):
        text = helps[name]
        if 'default' in kwargs and '(default' not in text:
            text += ' (default: %(default)s)'
        parser.add_argument('--' + name.replace('_', '-'), *flags,
                            help=text, **kwargs)

    add('batchsize', '-b', type=int, default=defaults['batchsize'])
    add('epoch', '-e', type=int, default=defaults['epoch'])
    add('device', '-d', type=str, default='-1')
    # None: resolved by parse_args (default_out), once --resume is known.
    add('out', '-o')
    add('overwrite', action='store_true')
    add('resume', '-r', type=str)
    add('snapshots', type=int, default=1)
    parser.add_argument('--optimizer',
                        choices=('lars', 'momentum-lars', 'momentum',
                                 'nesterov', 'lamb', 'adam'),
                        default='lars',
                        help='lars: chainer_lars.LARS; momentum-lars: '
                        'MomentumSGD with the chainer_lars.GradientLARS '
                        'hook; momentum: MomentumSGD with WeightDecay (the '
                        'baseline); nesterov: chainer_lars.LARS with '
                        'Nesterov momentum and no layer adaptation (lars '
                        '--nesterov without the trust ratio); lamb: '
                        "chainer_lars.LAMB; adam: Chainer's Adam with its "
                        'decoupled weight decay (the baseline of lamb). '
                        'Default: %(default)s')
    parser.add_argument('--nesterov', action='store_true',
                        help='Nesterov momentum for --optimizer lars')
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
    # None: the optimizer's own default (Chainer's Adam's, LAMB's).
    add('beta2', type=float)
    add('eps', type=float)
    add('weight_decay', type=float, default=1e-4)
    # None: recipe.TRUST_COEFFICIENT, once --optimizer is known to use it.
    add('trust_coefficient', type=float)
    add('seed', type=int, default=0)
    add('dtype', choices=tuple(DTYPES))
    add('loss_scale', type=float)
    add('label_smoothing', metavar='EPS', type=float, default=0.0)
    add('validation', metavar='N', type=int, default=0)
    add('eval_every', metavar='K', type=int)
    parser.add_argument('--test', choices=('each-epoch', 'end', 'never'),
                        default='each-epoch',
                        help='When to evaluate the test set (reported as '
                        'test/main/accuracy): at the end of each '
                        'epoch, after the last one only, or never (tuning '
                        'on --validation). Default: %(default)s')
    add('dataset_root')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Draw no plots (loss.png, accuracy.png, lr.png, '
                        'trust_ratio.png, loss_scale.png)')
    parser.add_argument('--progress', choices=('auto', 'bar', 'lines', 'none'),
                        default='auto',
                        help="How the run's progress between reports is "
                        "shown: Chainer's progress bar (bar), a plain line "
                        'every 30 s (lines, for a log file: the bar writes '
                        'terminal escape codes) or not at all (none); auto: '
                        'the bar when the output is a terminal (as '
                        'CHAINER_LARS_TERMINAL=1 or 0 says, where set), '
                        'else lines. '
                        'Default: %(default)s')
    return parser


def parse_args(parser, argv=None, positive=(), distributed=False,
               paths=True):
    """Parses the flags, or stops with a usage error naming the first bad one.

    Checks the ranges (the flags in ``positive`` must be positive integers
    too), the device, and the paths (``path_problem``), so that a mistake
    stops the run before it loads any data; then points Chainer's dataset
    root at --dataset-root. In one process it also sets the default --lr
    (``recipe.default_lr``) and checks the snapshot of --resume
    (``check_resume``); both follow from the global batch, which a
    ChainerMN trainer (``distributed``) knows once its communicator is up,
    so it does them itself, and it checks --out and --dataset-root on
    rank 0 alone (``check_rank0_paths``), and warns of float16 on the
    CPU (``warn_of_slow_precision``) there. Under an MPI launcher a
    ChainerMN trainer checks what may differ from machine to machine,
    whether it can use --device and read --resume, once MPI is up
    (``check_machine``, in ``stop_together``), so that every process that
    finds a problem says it. ``paths=False`` leaves --out
    and --dataset-root unchecked, for a caller that checks flags which
    another program completes with paths of its own (``results.py``).
    """
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = default_out(args)
    check_ranges(parser, args, positive)
    check_precision(parser, args)
    if args.nesterov and args.optimizer != 'lars':
        parser.error('--nesterov is for --optimizer lars, got --optimizer '
                     '{} ({})'.format(args.optimizer, (
                         'always Nesterov: leave --nesterov out'
                         if args.optimizer == 'nesterov'
                         else 'it has no Nesterov momentum')))
    for names, optimizers in ((('beta2', 'eps'), recipe.ADAM_LIKE),
                              (('trust_coefficient',), recipe.LARS_LIKE)):
        for name in names:
            if (getattr(args, name) is not None
                    and args.optimizer not in optimizers):
                parser.error('--{} is for --optimizer {}, got --optimizer '
                             '{}'.format(name.replace('_', '-'),
                                         ' and '.join(optimizers),
                                         args.optimizer))
    if (args.eval_every is not None and not args.validation
            and args.resume is None):
        # Without a validation set it would only log more often. (A
        # snapshot of a run before this refusal may record it: a resume
        # gives it again, as check_resume asks.)
        parser.error('--eval-every {} evaluates the validation set, and '
                     'this run has none: give --validation N too'.format(
                         args.eval_every))
    if args.trust_coefficient is None:
        # Set for every optimizer: a snapshot records it (run_settings),
        # those of the others the default, as before they refused it.
        args.trust_coefficient = recipe.TRUST_COEFFICIENT
    if args.epoch is not None and parser.warmup_default is not None:
        resolve_warmup(parser.error, args, parser.warmup_default)
    # A ChainerMN trainer under an MPI launcher: check_machine, later.
    each_machine = not (distributed and launcher_rank() is not None)
    check_device(parser, args.device, machine=each_machine)
    terminal = os.environ.get(TERMINAL_VARIABLE)
    if terminal not in (None, '', '0', '1'):
        parser.error('{}={!r}: 1 (the output is a terminal: --progress auto '
                     'draws the bar) or 0 (it is not: plain lines), or '
                     'unset'.format(TERMINAL_VARIABLE, terminal))
    if args.resume is not None and args.overwrite:
        parser.error('--overwrite starts a new run and --resume continues '
                     'one: give one of them')
    problem = resume_problem(args) if each_machine else None
    if problem is not None:
        parser.error(problem)
    if not distributed and paths:
        problem = path_problem(args)
        if problem is not None:
            parser.error(problem)
    if args.dataset_root is not None:
        chainer.dataset.set_dataset_root(args.dataset_root)
    if not distributed:
        args.lr = derived_lr(parser.error, args, args.batchsize)
        check_resume(args)
        # Once the flags are good: a usage error is the only line.
        warn_of_slow_precision(args)
    else:
        # The global batch is at least --batchsize, and the rate grows
        # with it: what fails here fails for every number of processes.
        derived_lr(parser.error, args, args.batchsize)
    return args


#: --out's default for a new run.
DEFAULT_OUT = 'result'


def default_out(args):
    """--out when not given: ``DEFAULT_OUT``, or for a resumed run the
    folder of its snapshot, so that the run goes on beside its log (in
    ``DEFAULT_OUT`` it would start a second copy of the run elsewhere)."""
    if args.resume is None:
        return DEFAULT_OUT
    return os.path.dirname(args.resume) or os.curdir


def resume_problem(args):
    """What is wrong with --resume before it is read, or None."""
    if args.resume is not None and not os.path.isfile(args.resume):
        return '--resume {}: {}'.format(folders.shown(args.resume), (
            'not a file' if os.path.exists(args.resume) else 'no such file'))
    return None


def check_machine(args):
    """Stops with a usage error where this machine cannot run the flags:
    use --device (CuPy, its GPUs) or read --resume (a snapshot that each
    process reads: on a shared disk, or copied to every machine). What
    ``parse_args`` leaves to a ChainerMN trainer under an MPI launcher,
    which calls it in every process (``stop_together``)."""
    problem = device_problem(args.device) or resume_problem(args)
    if problem is not None:
        usage_error(problem)


def derived_lr(error, args, batch):
    """--lr, or the recipe's rate for a (global) ``batch``, checked as the
    flags are: a usage error (``error``) names the flags it comes from."""
    if args.lr is not None:
        return args.lr
    try:
        lr = recipe.default_lr(args.optimizer, batch, args.trust_coefficient)
    except OverflowError:  # a batch size beyond a float
        lr = math.inf
    if not FLOAT32.tiny <= lr <= FLOAT32.max:
        flags = '--batchsize {}'.format(args.batchsize)
        if args.optimizer in recipe.LARS_LIKE:
            flags = '--trust-coefficient {} with {}'.format(
                args.trust_coefficient, flags)
        error('{} gives a learning rate (--lr) of {:.4g}, which must be '
              '{}; give --lr, or change those flags'.format(
                  flags, lr, IN_FLOAT32))
    return lr


#: The schedule counts iterations in floats: exactly up to 2 ** 53.
MAX_ITERATIONS = 2 ** 53


def check_iterations(args, n_train):
    """Stops unless the run's iterations (from --epoch, --batchsize and
    the number of training examples) can be counted by the schedule."""
    iterations = recipe.iterations(args, n_train)
    if iterations > MAX_ITERATIONS:
        usage_error('--epoch {} with --batchsize {} and {} training examples '
                    'makes {} iterations, more than the {} the schedule '
                    'counts exactly; give a smaller --epoch'.format(
                        args.epoch, args.batchsize, n_train, iterations,
                        MAX_ITERATIONS))


# The optimizers' hyperparameters are float32 in the update, whatever
# --dtype (16 bits update float32 master copies): a value beyond float32's
# largest number would be inf there, one below its smallest normal number
# would lose its digits, then be 0.
FLOAT32 = numpy.finfo(numpy.float32)
IN_FLOAT32 = ('from {:.4g} to {:.4g} (the normal numbers of float32, in '
              'which the optimizer computes)'.format(
                  FLOAT32.tiny, FLOAT32.max))

# The ranges of the numeric flags: (flags, test, what the message says).
# The trainers' own flags (--unit) are added by parse_args's ``positive``;
# --warmup-epochs is compared with --epoch once both are known
# (resolve_warmup).
RANGES = (
    (('batchsize', 'epoch'), lambda v: v > 0, 'a positive integer'),
    (('lr', 'decay_power', 'trust_coefficient', 'loss_scale', 'eps'),
     lambda v: 0 < v < math.inf, 'positive and finite'),
    (('warmup_epochs', 'weight_decay'), lambda v: 0 <= v < math.inf,
     'finite and at least 0'),
    (('momentum', 'label_smoothing', 'beta2'), lambda v: 0 <= v < 1,
     'at least 0 and less than 1'),
    (('lr', 'trust_coefficient', 'eps'),
     lambda v: FLOAT32.tiny <= v <= FLOAT32.max, IN_FLOAT32),
    (('weight_decay',),
     lambda v: v == 0 or FLOAT32.tiny <= v <= FLOAT32.max,
     '0, or ' + IN_FLOAT32),
    (('validation',), lambda v: v >= 0, 'an integer, at least 0'),
    (('eval_every',), lambda v: v > 0, 'a positive integer'),
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


# --dtype's values: Chainer's ImageNet example's.
DTYPES = {'float32': numpy.float32, 'float16': numpy.float16,
          'mixed16': chainer.mixed16}


def slow_precision(args):
    """Whether the run computes in float16 on the CPU, where NumPy's
    float16 has no BLAS: matrix products in a plain loop, about 100 times
    slower than float32's (an update of the MNIST defaults takes
    minutes)."""
    return (args.dtype in ('float16', 'mixed16')
            and chainer.get_device(args.device).xp is numpy)


def warn_of_slow_precision(args):
    """Says at start-up, in one line, what 16 bits on the CPU cost and
    what to do instead."""
    if slow_precision(args):
        say('warning: --dtype {} on the CPU is slow: NumPy has no fast '
            'float16 matrix product, so an update takes some 100 times as '
            'long as in float32 (with the defaults of these examples, '
            'minutes each, hours in all); use a GPU (--device 0), or a '
            'small model for a functional try{}'
            .format(args.dtype, small_model(args)))


def small_model(args):
    """The flags of the trainer's small model, as the warning of 16 bits
    on the CPU suggests them: --unit's for MNIST, --depth's for CIFAR,
    where the run's model is larger."""
    if getattr(args, 'dataset', 'mnist').startswith('cifar'):
        return ' (--depth 8)' if args.depth > 8 else ''
    return ' (-u 50)' if vars(args).get('unit', 0) > 50 else ''


def check_precision(parser, args):
    """Sets --dtype from chainer.config.dtype if not given; refuses a
    --loss-scale in float32, which has nothing to scale, and one that
    float16, in which the loss is scaled, cannot hold."""
    if args.dtype is None:
        dtype = chainer.config.dtype
        args.dtype = ('mixed16' if dtype is chainer.mixed16
                      else numpy.dtype(dtype).name)
        if args.dtype not in DTYPES:
            parser.error('--dtype: chainer.config.dtype (CHAINER_DTYPE) is '
                         '{}; give --dtype float32, float16 or mixed16'
                         .format(args.dtype))
    if args.loss_scale is not None and args.dtype == 'float32':
        parser.error('--loss-scale {:g}: loss scaling is for --dtype '
                     'float16 and mixed16, not float32'.format(
                         args.loss_scale))
    # The gradient of the loss starts as the scale, in float16: above its
    # largest number the scale is inf (every gradient NaN), below its
    # smallest normal one it loses its digits, then rounds to 0 (no
    # update at all).
    half = numpy.finfo(numpy.float16)
    if args.loss_scale is not None and not (
            half.tiny <= args.loss_scale <= half.max):
        parser.error('--loss-scale {:g}: --dtype {} scales the loss in '
                     'float16, which holds {:.4g} to {:g} (its normal '
                     'numbers); give a scale in that range, or leave '
                     '--loss-scale out for dynamic loss scaling'.format(
                         args.loss_scale, args.dtype, half.tiny, half.max))


def resolve_warmup(error, args, default):
    """Sets --warmup-epochs if not given; refuses one longer than the run.

    A warm-up longer than --epoch would still be rising at the last
    update: given, it is an error (``error``, the parser's); the trainer's
    ``default``, when longer than a short run, becomes the whole run, and
    ``args.warmup_note`` says so for the banner; ``args.warmup_given``
    says whether it was given, for ``check_resume``'s messages.
    """
    args.warmup_note = None
    args.warmup_given = args.warmup_epochs is not None
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
    here leaves nothing behind), with nothing under a run file's name
    that is not a file (``not_files``; a plot's only where it plots), and
    hold no other run (unless
    --overwrite): none for a new run, none but the run of its snapshot
    for a resumed one; --dataset-root must be an existing folder. The
    snapshot of --resume is checked by ``check_resume``.
    """
    problem = folders.folder_problem(args.out, create=True)
    if problem is not None:
        return '--out {}: {}'.format(folders.shown(args.out), problem)
    blocking = [n for n in not_files(args.out)  # no plot with --noplot
                if getattr(args, 'plot', True) or n not in PLOTS]
    if blocking:
        one = len(blocking) == 1
        return ("--out {}: holds {}, named like a run's {} but not {}: a "
                'run cannot write over {}, and --overwrite removes files '
                'only; move {} away, or give another --out'.format(
                    args.out, ', '.join(blocking),
                    'file' if one else 'files', 'a file' if one else 'files',
                    'it' if one else 'them', 'it' if one else 'them'))
    found = [] if args.overwrite else run_files(args.out)
    what = ', '.join(n for n in found if not n.endswith('.png'))
    if found and args.resume is None:
        latest = snapshots_in(args.out)
        # --resume would refuse these: nothing is left to train, or the
        # weights are those of a run that stopped when it diverged.
        for ended, how in ((_finished, 'finished'), (_diverged, 'diverged')):
            if latest and ended(latest[-1]):
                return ('--out {}: holds a {} run ({}); give another '
                        '--out, or --overwrite to remove it and start '
                        'over'.format(args.out, how, what))
        how = ('continue it with --resume {}, '.format(latest[-1])
               if latest else '')
        return ('--out {}: holds another run ({}); {}give another --out, '
                'or --overwrite to remove it and start over'.format(
                    args.out, what, how))
    if found:
        # A resumed run writes on in the folder of its snapshot, however
        # the two are spelled (a link, a relative path), or in one it was
        # resumed into before; in another it would overwrite the run there.
        folder = os.path.dirname(args.resume) or os.curdir
        if not (_same_folder(folder, args.out)
                or _continues(args.out, args.resume)):
            return ('--out {}: holds another run ({}), not the one that '
                    '--resume {} continues; give --out {} (the folder of '
                    'that snapshot), or an --out that holds no run'.format(
                        args.out, what, args.resume, folder))
        # The run there went on past the snapshot: the resumed run would
        # write over its log, its plots and its later snapshots.
        later = _later_snapshots(args.out, args.resume)
        if later:
            # Its latest snapshot continues it, unless --resume would
            # refuse that one too: the user would go round in a circle.
            end = _end(later[-1])
            go_on = ('continue it from its latest snapshot, --resume {}, '
                     'or '.format(later[-1]) if end is None else '')
            return ('--out {}: holds the run of --resume {} gone on past '
                    'that snapshot ({}{}), which a run resumed there would '
                    'write over (its log, plots and snapshots); {}give '
                    'another --out to go on from {} in a folder of its '
                    'own{}'.format(
                        args.out, args.resume,
                        ', '.join(os.path.basename(p) for p in later),
                        '' if end is None else ', ' + end, go_on,
                        args.resume,
                        ' (or start a new run with a smaller --lr)'
                        if end == 'diverged' else ''))
    if args.dataset_root is not None:
        problem = folders.folder_problem(args.dataset_root, create=False)
        if problem is not None:
            return '--dataset-root {}: {}'.format(
                folders.shown(args.dataset_root), problem)
    return None


def check_batch_norm_batchsize(parser, args):
    """Stops where a model with BatchNormalization after a fully connected
    layer gets batches of one: it normalises each feature over the batch
    alone, and one sample gives 0. Not for BatchNormalization after a
    convolution (the ResNets'), which normalises each channel over the
    batch, the height and the width: one image has many pixels."""
    if args.batchsize < 2:
        parser.error(
            '--batchsize {}: the model normalises each feature over the '
            'batch (BatchNormalization after a fully connected layer), and '
            'a batch of one sample gives zeros: give at least 2'.format(
                args.batchsize))


def _same_folder(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _later_snapshots(out, snapshot):
    """The paths of the snapshots in ``out`` of later iterations than
    ``snapshot`` (``snapshots_in``'s); none where ``snapshot`` cannot be
    read (``check_resume`` says what is wrong with it)."""
    try:
        iteration = _whole_number(snapshot, 'updater/iteration')
    except (OSError, ValueError, KeyError, EOFError, TypeError,
            zipfile.BadZipFile, zlib.error):
        return []
    if iteration is None:
        return []
    return [path for path in snapshots_in(out)
            if snapshot_iteration(os.path.basename(path)) > iteration]


def _end(path):
    """Why the snapshot ``path`` does not continue its run, as the
    refusal of ``--resume path`` would say: ``'finished'``,
    ``'diverged'``, ``'damaged'`` (``_damage``: cut short, empty or
    unreadable), or None where it does."""
    if _damage(path) is not None:
        return 'damaged'
    if _finished(path):
        return 'finished'
    if _diverged(path) is not None:
        return 'diverged'
    return None


def _continues(out, snapshot):
    """Whether the log in ``out`` begins with the log that ``snapshot``
    holds: the run there was resumed from it, or from a later snapshot of
    the same run. Not where either cannot be read (``check_resume`` says
    what is wrong with the snapshot)."""
    try:
        saved = _saved_log(snapshot)
        written = logs.read(os.path.join(out, 'log'))
        return bool(saved) and written[:len(saved)] == saved
    except (OSError, ValueError, KeyError, EOFError, AttributeError,
            TypeError, zipfile.BadZipFile, zlib.error):
        return False


#: The plots a run draws in --out (examples/training.py, plots.py).
PLOTS = ('loss.png', 'accuracy.png', 'lr.png', 'trust_ratio.png',
         'loss_scale.png')


def _named_like_run_files(out):
    """The names in ``out`` that a run writes (its log, its snapshots by
    iteration, its plots), whatever they are there."""
    try:
        names = set(os.listdir(out))
    except OSError:
        return []
    snapshots = sorted((i, n) for i, n in (
        (snapshot_iteration(n), n) for n in names) if i is not None)
    return ((['log'] if 'log' in names else [])
            + [name for _, name in snapshots]
            + [n for n in PLOTS if n in names])


def snapshot_iteration(name):
    """The iteration of a snapshot's file name, ``snapshot_iter_N``: N, or
    None for another name."""
    match = re.match(r'snapshot_iter_(\d+)$', name)
    return None if match is None else int(match.group(1))


def not_files(out):
    """The names in ``out`` that a run writes a file under but that are
    not files (folders): Chainer's writer would move the run's file into
    such a folder, and ``OldRun`` moves files only."""
    return [n for n in _named_like_run_files(out)
            if not os.path.isfile(os.path.join(out, n))]


def snapshots_in(out):
    """The paths of the ``snapshot_iter_N`` files in ``out``, by
    iteration."""
    return [os.path.join(out, n) for n in _named_like_run_files(out)
            if n.startswith('snapshot_iter_')
            and os.path.isfile(os.path.join(out, n))]


def run_files(out):
    """The names of a run's files in ``out`` (its log, snapshots and
    plots), or [] where it holds no run (none, or plots alone)."""
    found = [n for n in _named_like_run_files(out)
             if os.path.isfile(os.path.join(out, n))]
    if 'log' not in found and not any(
            n.startswith('snapshot_iter_') for n in found):
        return []
    return found


class OldRun(object):

    """--overwrite: the run in ``out`` (``run_files``, or plots alone),
    so that the new one leaves no snapshot or plot of the old one beside
    its own. It is moved into a hidden folder in ``out`` (``set_aside``),
    removed once the new run has made its first update (``remove``), or
    put back, in place of what the new run wrote, if it stopped before
    (``restore``): an error, Ctrl-C or SIGTERM before then loses nothing.
    ``remove`` and ``restore`` act once, whichever thread calls them
    (``training.Interruption``'s watcher restores for a run stuck in a
    long computation)."""

    def __init__(self, out):
        self._out, self._aside = out, None
        self._names = run_files(out) or [
            n for n in PLOTS if os.path.isfile(os.path.join(out, n))]
        self._lock = threading.Lock()

    def set_aside(self):
        if self._names:
            self._aside = tempfile.mkdtemp(prefix='.overwritten-',
                                           dir=self._out)
            self._move(self._out, self._aside, self._names)

    def remove(self):
        with self._lock:
            if self._aside is not None:  # once
                shutil.rmtree(self._aside, ignore_errors=True)
                self._aside = None

    def restore(self):
        with self._lock:
            if self._aside is not None:
                for name in _named_like_run_files(self._out):
                    if os.path.isfile(os.path.join(self._out, name)):
                        os.remove(os.path.join(self._out, name))
                self._move(self._aside, self._out, self._names)
                os.rmdir(self._aside)
                self._aside = None

    @staticmethod
    def _move(source, target, names):
        for name in names:
            os.replace(os.path.join(source, name), os.path.join(target, name))


def check_rank0_paths(args, comm):
    """``path_problem`` on rank 0, for a ChainerMN trainer; every rank stops.

    Only rank 0 writes --out and reads --dataset-root; the other ranks
    take its verdict, so that they stop with it rather than wait for it
    in the first collective (in ``stop_together``: said once).
    """
    problem = (path_problem(args) or '') if comm.rank == 0 else None
    # bcast_obj refuses to send None.
    problem = comm.bcast_obj(problem, root=0)
    if problem:
        usage_error(problem)


#: The variables in which MPI launchers give each process its rank before
#: MPI starts: Open MPI's, PMIx's, and PMI's (MPICH's Hydra, Intel MPI).
RANK_VARIABLES = ('OMPI_COMM_WORLD_RANK', 'PMIX_RANK', 'PMI_RANK')


def launcher_rank():
    """This process's rank as its MPI launcher gives it, or None where no
    launcher started it."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, '')
        if value.isdigit():
            return int(value)
    return None


def stop_together(comm, check):
    """``check()`` in every process of ``comm``; where one stops, all do.

    For a ChainerMN trainer (``comm``: its communicator, or mpi4py's):
    every process calls it at the same point with its own ``check``,
    which may stop it with a usage error (``SystemExit``, the message on
    stderr) or fail with any exception. Then every process learns every
    verdict (MPI's all-gather), so that none waits in a later collective
    for one that stopped. A problem every process found alike (one of
    the flags, the number of processes, rank 0's verdict that all took)
    is said once, by rank 0; otherwise each process that found one says
    it, naming its rank and machine (a file missing on one machine), and
    the others stop silently, all with the status of the first. Returns
    what ``check`` returned. With ``comm`` None (one process), just
    ``check()``.
    """
    if comm is None:
        return check()
    comm = getattr(comm, 'mpi_comm', comm)
    said = io.StringIO()
    result, stopped, status = None, False, 0
    try:
        with contextlib.redirect_stderr(said):
            result = check()
    except SystemExit as e:
        stopped = True
        status = e.code
        if not isinstance(status, int):
            if status is not None:
                said.write('{}\n'.format(status))
            status = 0 if status is None else 1
    except Exception:
        stopped, status = True, 1
        said.write(traceback.format_exc())
    text = said.getvalue()
    verdicts = comm.allgather((stopped, status, text))
    stops = [(s, t) for stop, s, t in verdicts if stop]
    if not stops:
        sys.stderr.write(text)  # warnings
        return result
    if len(stops) == len(verdicts) and len(set(stops)) == 1:
        if comm.rank == 0:
            sys.stderr.write(text)
    elif stopped:
        sys.stderr.write(_naming_rank(text, comm.rank, comm.size))
    sys.stderr.flush()
    sys.exit(status if stopped else stops[0][0])


def _naming_rank(text, rank, size=None):
    """``text``'s lines, each naming this process's rank (of ``size``) and
    machine."""
    prog = os.path.basename(sys.argv[0]) + ': '
    where = 'rank {}{} (on {})'.format(
        rank, '' if size is None else ' of {}'.format(size),
        socket.gethostname())
    return ''.join(
        '{}{}: {}'.format(prog, where, line[len(prog):])
        if line.startswith(prog) else '{}: {}'.format(where, line)
        for line in text.splitlines(True))


def check_device(parser, spec, machine=True):
    """A usage error (the parser's) where ``device_problem`` finds one."""
    problem = device_problem(spec, machine)
    if problem is not None:
        parser.error(problem)


def device_problem(spec, machine=True):
    """Why the device ``spec`` cannot be used, in one line, or None.

    ``chainer.get_device`` accepts a GPU that the machine does not have,
    and the first use of it fails with a CUDA error; so the GPUs are
    counted here. ``machine=False``: only whether ``spec`` names a
    device, not whether this machine can use it (CuPy, its GPUs).
    """
    hint = ' (-1 or @numpy: the CPU; 0 or @cupy:0: the first GPU)'
    try:
        device = chainer.get_device(spec)
    except ValueError as e:  # no device at all
        return '--device {}: {}{}'.format(spec, device_error(e), hint)
    except RuntimeError as e:  # CuPy (or ChainerX) cannot be used here
        return '--device {}: {}{}'.format(spec, device_error(e), hint) if (
            machine) else None
    if machine and device.xp is cuda.cupy:
        try:
            count = cuda.cupy.cuda.runtime.getDeviceCount()
        except cuda.cupy.cuda.runtime.CUDARuntimeError as e:
            return '--device {}: no usable GPU ({}){}'.format(spec, e, hint)
        if device.device.id >= count:
            return '--device {}: no such GPU, this machine has {}{}'.format(
                spec, count, hint)
    return None


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


def print_banner(args, *lines, batch=None):
    """Prints the settings of the run: ``lines``, then the schedule's,
    where the rate comes from, and what the reported names mean.

    ``batch`` is the global batch (ChainerMN's), --batchsize by default.
    """
    batch = args.batchsize if batch is None else batch
    for line in lines:
        print(line)
    print('# out: {}'.format(args.out))
    print('# epoch: {}'.format(args.epoch))
    # Only the LARS optimizers have a trust coefficient.
    trust = ('' if args.optimizer not in ('lars', 'momentum-lars') else
             ', trust coefficient {:g}'.format(args.trust_coefficient))
    warmup = '{:g} epochs'.format(args.warmup_epochs)
    if getattr(args, 'warmup_note', None):
        warmup += ' ({})'.format(args.warmup_note)
    print('# optimizer: {}, {} {:g}{}, weight decay {:g}, warm-up {}'.format(
        args.optimizer, 'alpha' if args.optimizer in recipe.ADAM_LIKE
        else 'lr', args.lr, trust, args.weight_decay, warmup))
    note = lr_note(args, batch)
    if note:
        print('#   ' + note)
    scaling = ''
    if args.dtype != 'float32':
        scaling = ', loss scale {}'.format(
            'dynamic' if args.loss_scale is None
            else '{:g} (static)'.format(args.loss_scale))
    print('# dtype: {}{}'.format(args.dtype, scaling))
    names = ['main/...: the training batches']
    if args.test != 'never':
        names.append('test/main/...: the test set')
    if args.validation:
        names.append('val/main/...: the validation set, the last {} '
                     'training images (--validation)'.format(
                         args.validation))
    print('# reported: ' + '; '.join(names))
    print('')
    sys.stdout.flush()


def lr_note(args, batch):
    """Where the rate comes from, when the recipe set it (no --lr): a
    user who knows ``LARS()``'s defaults reads why these differ."""
    if not math.isclose(args.lr, recipe.default_lr(
            args.optimizer, batch, args.trust_coefficient)):
        return None
    scale = '{} / {}'.format(batch, recipe.REFERENCE_BATCHSIZE)
    if args.optimizer in ('momentum', 'nesterov'):
        return ('lr from the batch size, linear scaling: {:g} * {} = {:g} '
                '(--lr sets it)'.format(recipe.MOMENTUM_LR_PER_256, scale,
                                        args.lr))
    if args.optimizer in recipe.ADAM_LIKE:
        return ('alpha from the batch size: {:g} * sqrt({}) = {:.3g} (--lr '
                'sets it)'.format(
                    recipe.ADAM_ALPHA_PER_256 if args.optimizer == 'adam'
                    else recipe.LAMB_STEP_PER_256, scale, args.lr))
    # The library's starting points: LARS()'s defaults, and the hook's docs.
    start = ("LARS()'s defaults, lr=2.0 and trust_coefficient=1e-3, make"
             if args.optimizer == 'lars' else "MomentumSGD(lr=0.002) and "
             "GradientLARS()'s default trust_coefficient=1 make")
    return ("lr from the batch size, the large-batch recipe's rule: lr * "
            'trust coefficient = {:g} * sqrt({}) = {:.3g} (--lr sets it);\n'
            '#   {} a step of 0.002, a start for small batches'.format(
                recipe.LARS_STEP_PER_256, scale,
                args.lr * args.trust_coefficient, start))


def say(message):
    """Prints one line to the console (stderr) at once, named by the
    script, as the usage errors are."""
    sys.stdout.flush()  # after the progress bar's lines so far
    sys.stderr.write('{}: {}\n'.format(
        os.path.basename(sys.argv[0]), message))
    sys.stderr.flush()


def usage_error(message):
    """Stops as a parser does on a bad flag, where the parser is not at hand.

    For what is known only once the data is loaded; the exit status is 2,
    argparse's.
    """
    sys.stderr.write('{}: error: {}\n'.format(
        os.path.basename(sys.argv[0]), message))
    sys.exit(2)


def check_batchsize(args, n_train, processes=None):
    """Stops if a mini-batch would hold more than all the ``n_train``
    training examples; with ChainerMN's ``processes``, the global batch,
    --batchsize times their number (the shards are of one length, where
    need be sharing an example with their neighbour: checked against a
    shard, 2 examples would train a global batch of 3)."""
    batch = args.batchsize * (processes or 1)
    is_ = 'is' if processes is None else (
        'on {} processes is a global batch of {},'.format(processes, batch))
    if batch > n_train:
        held = getattr(args, 'validation', 0)
        usage_error('--batchsize {} {} larger than the training set ({} '
                    'example{}{})'.format(
                        args.batchsize, is_, n_train, 's' * (n_train != 1),
                        ', the rest held out by --validation {}'.format(held)
                        if held else ''))


#: Whether the output is a terminal, where a launcher knows better than
#: ``isatty`` (``dev.sh chainermn``: Open MPI gives each rank a pty).
TERMINAL_VARIABLE = 'CHAINER_LARS_TERMINAL'

# The flags that may change on --resume: they do not change what the run
# computes (where it writes, how many snapshots it keeps, the device,
# where the data is read from, how its progress shows, ChainerMN's
# communicator, for the trainer that has it).
CHANGEABLE = ('out', 'snapshots', 'device', 'dataset_root', 'progress',
              'communicator')

# A snapshot records every flag but these (``run_settings``): the
# changeable ones, the snapshot that --resume names, and --overwrite, a
# new run's (refused with --resume).
FREE_FLAGS = CHANGEABLE + ('resume', 'overwrite')

# What parse_args adds to the flags (resolve_warmup), for the banner and
# the messages, and a trainer's ``unused``, the flags its run's model does
# not use (the ChainerMN trainer's --unit with a ResNet, --depth and
# --batchnorm with the MLP): no flags, not recorded.
DERIVED = ('warmup_note', 'warmup_given', 'unused')

# What a snapshot records besides the flags, as a message names it.
SETTINGS = {
    'processes': 'the number of processes',
    'examples': 'the number of training examples',
    'dtype': 'the precision (chainer.config.dtype, --dtype)',
}

# The settings that older snapshots do not record, with the value their
# runs had (for the trainers that have them: --model is MNIST's).
ADDED = {'loss_scale': 'none', 'model': 'mlp'}

# The flags of every trainer that have no value unless given (the
# optimizer's own beta2 and eps; no evaluation between epochs): a snapshot
# records them only where given, so that one without a record of them was
# written without them, not by another trainer.
UNSET_UNLESS_GIVEN = ('beta2', 'eps', 'eval_every')


def run_settings(args, **settings):
    """What defines the run, as a snapshot records it.

    Every flag (--dtype, the precision, among them) but ``FREE_FLAGS``
    and those the run's model does not use (``args.unused``, where a
    trainer sets it), and ``settings``: the number of processes for
    ChainerMN, the number of training examples (each process's, for
    ChainerMN) once the data is loaded.
    """
    unused = tuple(getattr(args, 'unused', ()))
    recorded = {name: value for name, value in vars(args).items()
                if name not in FREE_FLAGS + DERIVED + unused
                and value is not None}
    # --loss-scale's default: dynamic scaling in float16 and mixed16.
    recorded.setdefault('loss_scale', 'none' if args.dtype == 'float32'
                        else 'dynamic')
    recorded.update(settings)
    return recorded


def _name(name):
    return SETTINGS.get(name) or '--' + name.replace('_', '-')


def _changeable(args):
    """The flags of ``args``'s trainer that a resumed run may change, as a
    message lists them."""
    names = [_name(n) for n in CHANGEABLE if n in vars(args)]
    return '{} and {}'.format(', '.join(names[:-1]), names[-1])


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
    for name, value in ADDED.items():
        if name in settings:
            saved.setdefault(name, value)
    for name in UNSET_UNLESS_GIVEN:
        saved.setdefault(name, None)
        settings.setdefault(name, None)
    if settings.get('optimizer') not in recipe.LARS_LIKE:
        # Unused there: runs before its refusal recorded any value given.
        saved.pop('trust_coefficient', None)
        settings.pop('trust_coefficient', None)
    for name in getattr(args, 'unused', ()):
        # Not this run's model's: runs before their refusal recorded their
        # defaults, or a value given and ignored.
        saved.pop(name, None)
    if 'dataset' in settings and saved.get(
            'dataset', settings['dataset']) != settings['dataset']:
        # Another dataset's model records other flags (the ChainerMN
        # trainer's): compare what both record, --dataset first (its
        # defaults differ: --epoch).
        settings = dict({'dataset': settings['dataset']}, **{
            n: v for n, v in settings.items() if n in saved})
        saved = {n: saved[n] for n in settings}
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
                            _difference(name, saved[name], settings[name],
                                        _given_note(args, name,
                                                    saved[name])),
                            _changeable(args)))
    done = _epochs_done(args.resume)
    if done is not None and done >= args.epoch:
        usage_error('--resume {}: the run is finished: the snapshot was '
                    'written at the end of epoch {} of --epoch {}, so there '
                    'is nothing left to train; to train longer, start a new '
                    'run with a larger --epoch'.format(
                        args.resume, done, args.epoch))
    diverged = _diverged(args.resume)
    if diverged is not None:
        usage_error('--resume {}: the run had diverged (its training loss '
                    'was {} in the log\'s line at iteration {}) and stopped '
                    'there: resume from a snapshot written before with '
                    'another --out (in the folder of this one, it would '
                    'write over the run that diverged), or start a new run '
                    '(a smaller --lr)'.format(args.resume, *diverged))


def _diverged(path):
    """``(loss, iteration)`` of the first line of the log in the snapshot
    ``path`` whose training loss is not finite (``training.Divergence``
    stopped the run there), or None."""
    try:
        log = _saved_log(path)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
            zlib.error):  # no log, or unread: not known to have diverged
        return None
    return next(((entry['main/loss'], entry['iteration']) for entry in log
                 if not math.isfinite(entry.get('main/loss', 0.0))), None)


def _saved_log(path):
    """The log the snapshot ``path`` holds (LogReport's), ``upgraded``."""
    with open(path, 'rb') as f, numpy.load(f) as npz:
        return logs.upgraded(json.loads(
            str(npz['extensions/LogReport/_log'])))


def _epochs_done(path):
    """The epochs the run of the snapshot ``path`` had done, or None.

    The trainer stops once its iterator has done --epoch epochs: a snapshot
    at that point resumes into a run that stops before its first update.
    """
    return _whole_number(path, 'updater/iterator:main/epoch')


def _whole_number(path, key):
    """The entry ``key`` of the snapshot ``path``, as an int, or None."""
    # Opened here: numpy.load leaves a file it opened open where the
    # archive is cut short.
    with open(path, 'rb') as f, numpy.load(f) as snapshot:
        return int(snapshot[key]) if key in snapshot.files else None


def _finished(path):
    """Whether the snapshot ``path`` was written at the end of its run
    (``_epochs_done`` against the --epoch it records); False where it
    cannot be read (``check_resume`` says why, if it is resumed)."""
    try:
        done = _epochs_done(path)
        epochs = _whole_number(path, RunSettings.prefix + 'epoch')
    except (OSError, ValueError, KeyError, EOFError, TypeError,
            zipfile.BadZipFile, zlib.error):
        return False
    return None not in (done, epochs) and done >= epochs


def _given_note(args, name, saved):
    """What a refusal adds where this run's value of ``name`` is not what
    the user typed: the default --warmup-epochs, taken when not given; a
    --lr copied from the banner, which rounds it."""
    if name == 'warmup_epochs' and not getattr(args, 'warmup_given', True):
        return 'not given: the default{}; give --warmup-epochs {}'.format(
            ', the whole run' if args.warmup_note else '', saved)
    if (name == 'lr' and saved is not None and args.lr is not None
            and '{:g}'.format(saved) == '{:g}'.format(args.lr)):
        return ('the banner rounds the rate to 6 digits: leave --lr out if '
                'the run was started without it, or give --lr {!r}'.format(
                    saved))
    return None


def _difference(name, saved, value, note=None):
    if name == 'plot':  # --noplot: the plots' state is in the snapshot
        return 'the snapshot was written {} --noplot, this run {} it'.format(
            *(('with', 'without') if value else ('without', 'with')))
    if saved is None:  # UNSET_UNLESS_GIVEN
        return ('the snapshot was written without {} (not given), this run '
                'has {}'.format(_name(name), value))
    if value is None:
        return ('the snapshot was written with {} {}, this run without it '
                '(not given)'.format(_name(name), saved))
    return 'the snapshot was written with {} {}, this run has {}{}'.format(
        _name(name), saved, value, ' ({})'.format(note) if note else '')


def _recorded(path):
    """The settings the snapshot ``path`` records, or a usage error.

    The whole file is read and its checksums tested first: a snapshot
    cut short (a copy that did not finish, a full disk) is refused as
    cleanly as a file that is no snapshot at all.
    """
    damage = _damage(path)
    if damage is not None:
        usage_error('--resume {}: not a snapshot, or a damaged one ({})'
                    .format(path, damage))
    with numpy.load(path) as snapshot:
        return {name[len(RunSettings.prefix):]: snapshot[name].item()
                for name in snapshot.files
                if name.startswith(RunSettings.prefix)}


def _damage(path):
    """What is wrong with the file ``path`` as an NPZ archive (cut short,
    empty, a checksum that fails, unreadable), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
        if damaged is not None:
            return '{} fails its checksum'.format(damaged)
        with open(path, 'rb') as f, numpy.load(f) as snapshot:
            for name in snapshot.files:
                if name.startswith(RunSettings.prefix):
                    snapshot[name].item()
    except (OSError, ValueError, EOFError, zipfile.BadZipFile,
            zlib.error) as e:
        return str(e)
    return None


class _Mismatch(KeyError):
    """An entry of the snapshot that is missing (a ``KeyError``, which
    optional entries catch) or of another shape than this run's array."""


class _CheckedNpz(chainer.serializers.NpzDeserializer):

    """Chainer's NPZ deserializer, raising ``_Mismatch`` with the entry's
    name and what is wrong before it loads anything into that array."""

    def __getitem__(self, key):
        return _CheckedNpz(self.npz, self.path + key.strip('/') + '/',
                           strict=self.strict, ignore_names=self.ignore_names)

    def __call__(self, key, value):
        name = self.path + key.lstrip('/')
        if name not in self.npz.files:
            raise _Mismatch(name, 'no entry {}'.format(name))
        shape = getattr(value, 'shape', None)
        if shape is not None and self.npz[name].shape != shape:
            raise _Mismatch(name, 'the entry {} of shape {}, where this run '
                            'has {}'.format(name, self.npz[name].shape, shape))
        return super(_CheckedNpz, self).__call__(key, value)


def load_snapshot(args, trainer):
    """Loads the snapshot of --resume into ``trainer``, or stops with a
    usage error naming the entry that is missing or of another shape
    (another version's snapshot, or one edited), before any training.

    The momentum buffers that the update rules have not made yet load in
    any shape: they are compared with their parameters after.
    """
    with numpy.load(args.resume) as npz:
        try:
            trainer.serialize(_CheckedNpz(npz))
        except _Mismatch as e:
            _refuse_broadcast_only(args, npz, e.args[1])
            usage_error('--resume {}: the snapshot has {}; it was not '
                        'written by this run of these examples: start a new '
                        'run'.format(args.resume, e.args[1]))
        except ValueError as e:  # the library's checks of what it loads
            _refuse_broadcast_only(args, npz, e)
            prefix = 'WarmupPolynomialShift: '  # the schedule's, of its own
            usage_error('--resume {}: {}{}'.format(
                args.resume, str(e)[len(prefix):] if str(e).startswith(
                    prefix) else str(e),
                ' (before 0.3.0, a warm-up as long as the run ended an update '
                'before it: such a run resumes with the version that began '
                'it)' if 'warmup_count' in str(e) else ''))
    upgrade_reports(trainer)
    optimizer = trainer.updater.get_optimizer('main')
    for path, param in optimizer.target.namedparams():
        rule = param.update_rule
        for name, a in sorted(((rule and rule.state) or {}).items()):
            if getattr(a, 'shape', param.shape) != param.shape:
                usage_error(
                    '--resume {}: the snapshot has the entry updater/'
                    'optimizer:main{}/{} of shape {}, where this run has {}; '
                    'it was not written by this run of these examples: start '
                    'a new run'.format(args.resume, path, name, a.shape,
                                       param.shape))


def _refuse_broadcast_only(args, npz, what):
    """Stops where the ChainerMN snapshot ``npz`` (of --resume), missing
    ``what``, was written at iteration 1: after ChainerMN's first update,
    which takes no step, so the update rules had no state to save (a run
    of one iteration an epoch, ``training.warn_of_no_update``)."""
    if (getattr(args, 'communicator', None) is not None
            and 'updater/iteration' in npz.files
            and int(npz['updater/iteration']) == 1):
        usage_error('--resume {}: the snapshot was written at iteration 1, '
                    "after ChainerMN's first update, which only copies rank "
                    "0's parameters and takes no step: it holds no optimizer "
                    'state to resume ({}); resume a later snapshot, or start '
                    'a new run'.format(args.resume, what))


def upgrade_reports(trainer):
    """Renames the test set's keys of an older version in what a snapshot
    loaded into the log and the plots (``examples/logs.py``), so that a
    resumed run logs and draws the whole run under today's names."""
    # Chainer has no public setter: its attributes, as in 7.8.1.
    for entry in trainer._extensions.values():
        extension = entry.extension
        if isinstance(extension, extensions.LogReport):
            extension._log = logs.upgraded(extension._log)
        elif isinstance(extension, extensions.PlotReport):
            data = {logs.upgraded_key(key): values
                    for key, values in extension._data.items()}
            for key in extension._y_keys:
                data.setdefault(key, [])
            extension._data = data


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
            try:
                self._settings[name] = serializer(name, value)
            except KeyError:  # an older snapshot (check_resume let it in)
                if name not in ADDED:
                    raise
