#!/usr/bin/env python
"""Steps to a validation target against batch size: tuned Nesterov vs LARS.

For each batch size and optimizer (a cell), the same quasi-random search
(``points``: a Halton sequence in bases 2, 3, 5 and 7, shifted modulo 1 by
a seeded random vector) over the peak learning rate (log scale, a decade
either side of ``center_lr``), one minus the momentum (log scale, 0.01 to
0.32), the warm-up (up to 40 % of the run) and the label smoothing (0 to
0.2), with the same epoch budget for both optimizers. The
last 10,000 training images are the validation set (``--validation``);
search trials never evaluate the test set. Each trial records when the
validation accuracy first reached the target (98 %: 9,800 correct images
of 10,000, counted, not a float compared), its best validation
accuracy, its curve and its command, in
``<out>/<optimizer>-b<B>-t<trial>.json``.
At the batch sizes of ``--refine`` (8192 and 16384) a second round of as
many trials follows, at the next points of the same sequence, with the
rate over half a decade either side of the rate of the cell's best trial
of round one (the other dimensions as before). Each complete cell's best
trial (of both rounds) (fewest steps to the target; if none
reached it, the best validation accuracy) is then rerun with seeds 1, 2
and 3, which evaluate the test set once, after the last epoch
(``<optimizer>-b<B>-best-s<seed>.json``). Then the budget sweep: the 3
best trials of each cell of 8192 and 16384 at 2 and 4 times their
epochs, the warm-up stretched with the run
(``<optimizer>-b<B>-t<trial>-x<budget>.json``, with ``budget_of``,
``budget`` and ``epochs``). Trials are run round by round
(trial 0 of every cell, then trial 1, ...), so that every cell has
results early; what is done (its JSON exists) is skipped, so an
interrupted study continues where it stopped; a folder whose JSONs were
made with other settings (flags, epochs, target, validation, model) is
refused before anything runs. ``--model mlp-bn`` runs
the study of the MLP with BatchNorm into ``<out>/mlp-bn/``.

    python examples/mnist/study.py

``--check`` runs nothing: it builds the tables from the JSONs and checks
that ``examples/mnist/README.md`` holds them, that each JSON is what
the study would write now (a search trial's flags are its point's, a
rerun is of its cell's best trial, a run of the budget sweep is of one
of its cell's best, stretched) and that each JSON's steps to the target
are its curve's; it exits with 1 where not. Beside the
search, the trainer runs on its defaults at each batch size, measured the
same way (``defaults-b<B>.json``): a third table compares them with the
tuned trials; with the reruns' seeds (``defaults-b<B>-s<seed>.json``) they
are a ``defaults`` row of the rerun table.
``--reproduce FILE`` reruns the trial of one JSON in a temporary folder
and prints what changed, then ``same``, ``within tolerance`` (what
another CPU is expected to change: ``TOLERANCE_*``) or ``differs``
(exit 1). ``--plot`` draws the figure
from the JSONs.
"""

import argparse
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time

import numpy

if not __package__:  # run as a file: examples/README.md
    import _examples_path  # NOQA
from examples import data  # NOQA: E402 (after the path is set)
from examples import folders  # NOQA: E402
from examples import recipe  # NOQA: E402
from examples.mnist import results  # NOQA: E402


HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'study')
README = os.path.join(HERE, 'README.md')

# lars runs with Nesterov momentum, so that the trust ratio is the only
# difference from nesterov (examples/recipe.py).
OPTIMIZERS = {'nesterov': ['--optimizer', 'nesterov'],
              'lars': ['--optimizer', 'lars', '--nesterov'],
              # LAMB against its baseline, Adam: the rate is their alpha,
              # the momentum their beta1.
              'adam': ['--optimizer', 'adam'],
              'lamb': ['--optimizer', 'lamb']}
# The study of examples/mnist/README.md's first tables; adam and lamb have
# their own (--optimizers adam,lamb --out examples/mnist/study/adam-lamb).
DEFAULT_OPTIMIZERS = ['nesterov', 'lars']
BATCHSIZES = [512, 2048, 8192, 16384]
# The epoch budget of every trial of a batch size, whatever the optimizer.
EPOCHS = {512: 6, 2048: 8, 8192: 14, 16384: 24}
TRIALS = 8  # per round
# The batch sizes with a second round: where round one put 5 of the 8
# nesterov trials in divergence and none of them at the target.
REFINED = [8192, 16384]
SEEDS = [1, 2, 3]
TARGET = 0.98
VALIDATION = 10000
# The search: Halton points shifted by RandomState(SEARCH_SEED).
SEARCH_SEED = 0
PRIMES = (2, 3, 5, 7)
TRUST_COEFFICIENT = 0.02  # the trainers' default

TRAINER = ['python', '-m', 'examples.mnist.train_mnist']
# The trainer's --model; the JSONs of a model other than the first go to
# a folder of its own under --out's default (``model_out``).
MODELS = ('mlp', 'mlp-bn')

# The budget sweep: the best BUDGET_CONFIGS trials of each cell of
# BUDGET_BATCHSIZES run again at these multiples of the epoch budget, the
# warm-up stretched with the run (``budget_flags``); 1x is the trial.
# Half the budget asks whether a shorter schedule takes fewer steps.
BUDGETS = [0.5, 2, 4]
BUDGET_BATCHSIZES = [8192, 16384]
BUDGET_CONFIGS = 3

# The same pre-tuning for every optimizer (``--pretune``), at one batch
# size, on the validation split, the same runs for each: a pilot of rates
# half a decade apart around the optimizer's square-root rule
# (``center_lr * 10 ** (k / 2)``), momentum 0.9, warm-up 20 % of the run,
# no label smoothing, finds its working rate (the best validation
# accuracy); then the settings the search holds fixed, weight decay and
# decay power, crossed at that rate. JSONs in ``<out>/pretune/``.
PRETUNE_BATCHSIZE = 8192
PILOT = [-3, -2, -1, 0, 1, 2, 3]
WEIGHT_DECAYS = [0.0, 1e-5, 1e-4, 5e-4]
DECAY_POWERS = [1.0, 2.0]
PRETUNE = 'pretune'
# The search again with the pre-tuning's settings (``--pretuned``): each
# optimizer's rate range centred on its own working rate (scaled with the
# square root of the batch size from the pre-tuning's), its best weight
# decay and decay power, and warm-up up to half the run for both; JSONs
# in ``<out>/pretuned/``.
PRETUNED = 'pretuned'
WARMUP_CAP = 0.4  # of the run, in the search
PRETUNED_WARMUP_CAP = 0.5

# The fair experiment (``--fair BUDGET``): one protocol for both
# optimizers of a pair (``PAIRS``), at FAIR_BATCHSIZE, with BUDGET times
# the search's epochs, into ``<out>/fair-x<BUDGET>/``. A pilot of the
# rate (``PILOT``, ``pilot_flags``) finds each optimizer's working rate;
# the search is FAIR_TRIALS trials a round, two rounds, at the Halton
# points of FAIR_PRIMES: the rate (FAIR_SPAN decades either side of the
# working rate in round one, half that around round one's best in round
# two), the warm-up (up to FAIR_WARMUP_CAP of the run) and the label
# smoothing (0 to 0.2); and at the corners of FAIR_CORNERS (each once a
# round): the decay power (DECAY_POWERS) and, for adam and lamb, beta2
# (FAIR_BETA2S) and eps (FAIR_EPSS). The momentum (beta1) is held
# at the pilot's, FAIR_MOMENTUM, for both: the rate searched is then the
# effective rate lr / (1 - momentum) the pilot measured. The best trial
# (fewest steps to the target) is rerun with ``--seeds``, and with
# ``--more-seeds`` too where the two arms' ranges of steps overlap.
PAIRS = (('nesterov', 'lars'), ('adam', 'lamb'))
FAIR = 'fair'
FAIR_BATCHSIZE = 8192
FAIR_TRIALS = 8
FAIR_SPAN = 0.5
FAIR_WARMUP_CAP = 0.5
FAIR_MOMENTUM = 0.9
FAIR_BETA2S = [0.99, 0.999]
FAIR_EPSS = [1e-8, 1e-6]
# The continuous dimensions: the rate, the warm-up, the smoothing.
FAIR_PRIMES = (2, 3, 5)
# The discrete ones, crossed: (decay power, beta2, eps).
FAIR_CORNERS = [(p, b, e) for e in FAIR_EPSS for b in FAIR_BETA2S
                for p in DECAY_POWERS]
MORE_SEEDS = [4, 5]
# The target-sensitivity table: the steps to these targets below the
# study's, read off the reruns' curves.
SENSITIVITY = [-0.01, -0.005, 0.0]

# What --reproduce calls "within tolerance": the change expected on
# another CPU, whose BLAS sums the matrix products in another order
# (README.md, "Repeating a trial"): the step to the target within two
# evaluation intervals, the accuracies within 0.2 point.
TOLERANCE_INTERVALS = 2
TOLERANCE_POINTS = 0.2
# Besides the search: the trainer on its defaults (--optimizer lars, its
# rate rule, no other flag) at each batch size, measured the same way.
DEFAULTS = 'defaults'


def halton(index, base):
    """The ``index``-th element of the van der Corput sequence in ``base``."""
    value, fraction = 0.0, 1.0
    while index:
        fraction /= base
        index, digit = divmod(index, base)
        value += digit * fraction
    return value


def points(n, seed=SEARCH_SEED, primes=PRIMES):
    """``n`` points of the unit hypercube, one per trial: Halton points 1 to
    ``n`` in bases ``primes`` (2, 3, 5, 7), shifted modulo 1 by a random
    vector drawn from ``seed`` (a Cranley-Patterson rotation). More bases
    add dimensions and leave the first ones as they were (the shift's
    first values are the same draws)."""
    shift = numpy.random.RandomState(seed).uniform(size=len(primes))
    return [[(halton(i, p) + s) % 1.0 for p, s in zip(primes, shift)]
            for i in range(1, n + 1)]


def _round(value):
    return float('{:.4g}'.format(value))


def center_lr(optimizer, batchsize):
    """The middle of the learning-rate search: each optimizer's rate at
    batch 256 (``recipe``'s rules), scaled with the square root of the
    batch size, as the lars rule does; linear scaling (nesterov's rule)
    would put the rates that train at batch 16384 at the range's edge."""
    return recipe.default_lr(optimizer, recipe.REFERENCE_BATCHSIZE,
                             TRUST_COEFFICIENT) * math.sqrt(
        batchsize / recipe.REFERENCE_BATCHSIZE)


def hyperparameters(optimizer, batchsize, epochs, u, around=None,
                    settings=None):
    """The flags of the trial at the point ``u`` of the unit hypercube.

    The dimensions in order of their expected weight, since the first bases
    of the Halton sequence spread their first points best: the rate (base
    2), the momentum (3), the warm-up (5), the label smoothing (7). The
    rate spans a decade either side of ``center_lr``, or, in round two,
    half a decade either side of ``around`` (round one's best rate).
    ``settings`` (``--pretuned``: ``pretuned_settings``) centre the rate on
    the optimizer's working rate, set its weight decay and decay power,
    and let the warm-up reach half the run.
    """
    own = (settings or {}).get(optimizer)
    centre = center_lr(optimizer, batchsize) if own is None else (
        own['lr'] * math.sqrt(batchsize / own['batchsize']))
    if around is None:
        lr = centre * 10 ** (-1 + 2 * u[0])
    else:
        lr = around * 10 ** (-0.5 + u[0])
    cap = WARMUP_CAP if own is None else PRETUNED_WARMUP_CAP
    flags = {'lr': _round(lr),
             'momentum': _round(1 - 10 ** (-2 + 1.5 * u[1])),
             'warmup_epochs': _round(cap * epochs * u[2]),
             'label_smoothing': _round(0.2 * u[3])}
    if own is not None:
        flags.update(weight_decay=own['weight_decay'],
                     decay_power=own['decay_power'])
    return flags


def trials_of(batchsize, trials, refine):
    """The trials of a cell: one round, two at the batch sizes refined."""
    return trials * (2 if batchsize in refine else 1)


def search_flags(optimizer, batchsize, epochs, trial, trials, records,
                 settings=None):
    """The flags of search trial ``trial`` of a cell of ``trials`` trials
    a round; a trial of round two centres its rate on the best of round
    one's ``records`` (None while round one is not complete)."""
    u = points(trial + 1)[trial]
    if trial < trials:
        return hyperparameters(optimizer, batchsize, epochs, u,
                               settings=settings)
    first = [r for r in records if r['trial'] < trials]
    if len(first) < trials:
        return None
    return hyperparameters(optimizer, batchsize, epochs, u,
                           around=best(first)['flags']['lr'],
                           settings=settings)


def corner(trial, trials):
    """The corner of the fair experiment's discrete factorial (decay power
    x beta2 x eps, 8 corners) of search trial ``trial`` of ``trials`` a
    round: each round runs the corners in an order drawn from
    ``RandomState(SEARCH_SEED + round)``, so that a round of 8 holds each
    corner once (each decay power in 4 trials, each beta2 and eps in 4),
    in an order unrelated to the Halton points of the other dimensions."""
    round_, index = divmod(trial, trials)
    order = numpy.random.RandomState(SEARCH_SEED + round_).permutation(
        len(FAIR_CORNERS))
    return FAIR_CORNERS[order[index % len(order)]]


def fair_hyperparameters(optimizer, epochs, u, at, centre, span):
    """The flags of a trial of the fair experiment at the point ``u`` of
    ``FAIR_PRIMES``' dimensions, in order of their expected weight: the
    rate, log-uniform over ``span`` decades either side of ``centre``; the
    warm-up, up to ``FAIR_WARMUP_CAP`` of the run; the label smoothing, 0
    to 0.2; and at the corner ``at`` (``corner``) the decay power and, for
    adam and lamb, beta2 and eps. The momentum (beta1) is
    ``FAIR_MOMENTUM``, the pilot's, for every optimizer."""
    power, beta2, eps = at
    flags = {'lr': _round(centre * 10 ** (span * (2 * u[0] - 1))),
             'momentum': FAIR_MOMENTUM,
             'warmup_epochs': _round(FAIR_WARMUP_CAP * epochs * u[1]),
             'decay_power': power,
             'label_smoothing': _round(0.2 * u[2])}
    if optimizer in recipe.ADAM_LIKE:
        flags.update(beta2=beta2, eps=eps)
    return flags


def fair_flags(optimizer, epochs, trial, trials, records, working_lr):
    """The flags of trial ``trial`` of the fair experiment's search of
    ``trials`` trials a round: round one's rate centred on the pilot's
    ``working_lr``, round two's on the rate of round one's best trial
    (None while round one is not complete), at half the span."""
    u = points(trial + 1, primes=FAIR_PRIMES)[trial]
    at = corner(trial, trials)
    if trial < trials:
        return fair_hyperparameters(optimizer, epochs, u, at, working_lr,
                                    FAIR_SPAN)
    first = [r for r in records if r['trial'] < trials]
    if len(first) < trials:
        return None
    return fair_hyperparameters(optimizer, epochs, u, at,
                                best(first)['flags']['lr'], FAIR_SPAN / 2)


def partner(optimizer):
    """The other arm of ``optimizer``'s pair (``PAIRS``), or None."""
    for pair in PAIRS:
        if optimizer in pair:
            return pair[1 - pair.index(optimizer)]
    return None


def _steps_key(r):
    """Steps to the target as a number to rank, a miss after any reach."""
    steps = r['steps_to_target']
    return math.inf if steps is None else steps


def ranges_overlap(a, b):
    """Whether the ranges of steps to the target of two sets of reruns
    overlap, a rerun that missed the target counting as more steps than
    any that reached it (two arms that both missed on every seed
    overlap)."""
    a, b = [_steps_key(r) for r in a], [_steps_key(r) for r in b]
    return min(a) <= max(b) and min(b) <= max(a)


def wanted_seeds(reruns, batchsize, optimizer, seeds, more):
    """The seeds of a cell's reruns in the fair experiment: ``seeds``,
    and ``more`` too once both arms of its pair have run ``seeds`` and
    their ranges of steps overlap."""
    other = partner(optimizer)
    done = [[r for r in reruns.get((batchsize, o), []) if r['seed'] in seeds]
            for o in (optimizer, other)]
    if other is None or any(len(d) < len(seeds) for d in done):
        return list(seeds)
    return list(seeds) + (list(more) if ranges_overlap(*done) else [])


def rank_test(a, b):
    """The two-sided exact p-value of the rank-sum (Mann-Whitney) test of
    two samples: over every split of the pooled values into groups of
    ``len(a)`` and ``len(b)``, the fraction whose first group's rank sum
    lies at least as far from its mean as ``a``'s. Tied values share
    their mean rank. With 3 values a side the smallest p is 0.1 (1 split
    in 20, either way); with 5, 2/252 = 0.0079."""
    pooled = sorted(a + b)
    rank = {}
    for value in set(pooled):
        at = [i + 1 for i, v in enumerate(pooled) if v == value]
        rank[value] = sum(at) / len(at)
    ranks = [rank[v] for v in a + b]
    n = len(a)
    centre = n * (len(ranks) + 1) / 2
    observed = abs(sum(ranks[:n]) - centre)
    splits = list(itertools.combinations(ranks, n))
    return sum(abs(sum(split) - centre) >= observed - 1e-9
               for split in splits) / len(splits)


def eval_every(batchsize, n_train):
    """About four evaluations of the validation set per epoch."""
    return max(1, round(n_train / (4 * batchsize)))


def command(optimizer, batchsize, epochs, flags, seed, validation, n_train,
            test, model=MODELS[0]):
    cmd = TRAINER + ['--batchsize', str(batchsize)] + OPTIMIZERS.get(
        optimizer, [])
    if model != MODELS[0]:
        cmd += ['--model', model]
    cmd += ['--epoch', str(epochs), '--validation', str(validation),
            '--eval-every', str(eval_every(batchsize, n_train)),
            '--test', test]
    for name, value in flags.items():
        cmd += ['--' + name.replace('_', '-'), '{:g}'.format(value)]
    return cmd + ['--seed', str(seed), '--snapshots', '0', '--noplot']


def target_count(target, n):
    """The fewest correct images of ``n`` that reach ``target``: the
    ceiling of ``target * n``, exact for a target of up to 9 decimals."""
    return -(-round(target * 10 ** 9) * n // 10 ** 9)


def count(accuracy, n):
    """The correct images of ``n`` behind an accuracy, a mean over them
    (exact for a float within half an image of it)."""
    return round(accuracy * n)


def first_at_target(curve, n, target):
    """The first iteration of ``curve`` (``[iteration, accuracy]`` pairs
    on ``n`` validation images) at which ``target_count`` images or more
    were correct, or None. Integer counts: an accuracy of 9,800 images in
    10,000 reaches 98 % however its float rounds."""
    need = target_count(target, n)
    for iteration, accuracy in curve:
        if (accuracy is not None and not math.isnan(accuracy)
                and count(accuracy, n) >= need):
            return iteration
    return None


def measure(log, batchsize, n_train, target, validation):
    """Steps and epochs to ``target`` (``first_at_target`` of the curve
    on ``validation`` images), best validation, test accuracy."""
    best = None
    curve = []
    for entry in log:
        accuracy = entry.get('val/main/accuracy')
        if accuracy is None:
            continue
        # 4 decimals: exact for 10,000 images or fewer.
        curve.append([entry['iteration'], round(accuracy, 4)])
        if not math.isnan(accuracy) and (best is None or accuracy > best):
            best = accuracy
    steps = first_at_target(curve, validation, target)
    test = log[-1].get('test/main/accuracy')
    loss = log[-1].get('main/loss')
    gone = results.diverged(log)
    return {'steps_to_target': steps,
            'epochs_to_target': (None if steps is None else
                                 round(steps * batchsize / n_train, 3)),
            'best_validation': best,
            'test_accuracy': test,
            # JSON has no NaN: a diverged run's loss is null, and says so.
            'final_loss': None if gone else loss,
            'diverged': gone,
            'curve': curve}


def run_command(cmd, out, dataset_root, device, stdout):
    """Runs a recorded trainer command with --out, --dataset-root, --device.
    """
    extra = ['--out', out, '--overwrite']  # a run cut short is redone
    if dataset_root is not None:
        extra += ['--dataset-root', dataset_root]
    if device != '-1':
        extra += ['--device', device]
    full = ([sys.executable, os.path.join(HERE, 'train_mnist.py')]
            + cmd[len(TRAINER):] + extra)
    code = results.run_process(full, stdout)
    log = results.read_log(out)
    # A diverged run stops with status 1, its log written: a result (the
    # target never reached), not a failure of the study.
    if code == 1 and log and results.diverged(log):
        return log
    if code:
        results.trainer_failed(code, stdout.name)
    return log


def model_out(model):
    """The default folder of a model's JSONs."""
    return OUT if model == MODELS[0] else os.path.join(OUT, model)


def trial_name(optimizer, batchsize, trial=None, seed=None, budget=None,
               stage=None):
    if stage is not None:  # a run of the pre-tuning
        return '{}-b{}-{}{}'.format(optimizer, batchsize, stage, trial)
    if optimizer == DEFAULTS:  # seed 0, and the seeded reruns
        return '{}-b{}{}'.format(DEFAULTS, batchsize,
                                 '' if seed is None else '-s{}'.format(seed))
    if budget is not None:
        return '{}-b{}-t{}-x{:g}'.format(optimizer, batchsize, trial, budget)
    if seed is None:
        return '{}-b{}-t{}'.format(optimizer, batchsize, trial)
    return '{}-b{}-best-s{}'.format(optimizer, batchsize, seed)


def epochs_of(args, batchsize):
    """The epoch budget of a trial at ``batchsize``: ``--epochs`` or
    ``EPOCHS``, times ``--fair``'s budget (main checks that it is a whole
    number)."""
    return int((args.epochs or EPOCHS[batchsize]) * (args.fair or 1))


def _cpu():
    """The CPU's model name (Linux's /proc/cpuinfo), else Python's."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _openblas():
    """What the OpenBLAS NumPy loaded says of itself: its configuration,
    the kernel it picked for this CPU and its threads; {} where NumPy
    runs on another BLAS, or on a system without /proc/self/maps."""
    import ctypes
    try:
        with open('/proc/self/maps') as f:
            paths = {line.split()[-1] for line in f if 'openblas' in line}
    except OSError:
        return {}
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for suffix in ('64_', ''):
            config = getattr(lib, 'openblas_get_config' + suffix, None)
            if config is None:
                continue
            found = {}
            for key, name, kind in (
                    ('blas_config', 'openblas_get_config', ctypes.c_char_p),
                    ('blas_kernel', 'openblas_get_corename',
                     ctypes.c_char_p),
                    ('blas_threads', 'openblas_get_num_threads',
                     ctypes.c_int)):
                function = getattr(lib, name + suffix, None)
                if function is not None:
                    function.restype = kind
                    value = function()
                    found[key] = (value.decode().strip()
                                  if isinstance(value, bytes) else value)
            return found
    return {}


def machine():
    """What a trial ran on, as its JSON records it: the CPU, the cores,
    Python, NumPy, Chainer, the BLAS NumPy was built with and, for
    OpenBLAS, the kernel and threads it runs with here (the trainer runs
    in this process's environment, ``OPENBLAS_NUM_THREADS`` included)."""
    import chainer
    found = {'cpu': _cpu(), 'cores': os.cpu_count(),
             'python': platform.python_version(),
             'numpy': numpy.__version__, 'chainer': chainer.__version__}
    try:
        blas = numpy.__config__.CONFIG['Build Dependencies']['blas']
        found['blas'] = '{} {}'.format(blas['name'], blas['version'])
    except (AttributeError, KeyError, TypeError):
        found['blas'] = 'unknown'
    found.update(_openblas())
    return found


def _machine_line(found):
    """A JSON's ``machine`` on one line."""
    return ', '.join('{} {}'.format(k, found[k]) for k in sorted(found)
                     if k != 'blas_config')


#: The entries of a JSON's ``machine`` that --check requires.
MACHINE_KEYS = ('cpu', 'python', 'numpy', 'blas')


def run_trial(args, optimizer, batchsize, trial, flags, seed, test,
              budget=None, stage=None):
    """Runs one trial unless its JSON exists; returns its record. With
    ``budget``, the run of search trial ``trial`` at ``budget`` times its
    epochs (``flags`` stretched by ``budget_flags``); with ``stage``
    (``pilot`` or ``grid``), run ``trial`` of that stage of the
    pre-tuning, in ``<out>/pretune/``."""
    name = trial_name(optimizer, batchsize, trial,
                      None if test == 'never' else seed, budget, stage)
    out = args.out if stage is None else os.path.join(args.out, PRETUNE)
    path = os.path.join(out, name + '.json')
    if os.path.exists(path):
        record = read(path)
        if record['trial'] == trial and record['flags'] == flags:
            return record
        # Only a rerun of a trial that is no longer its cell's best (the
        # search grew), or a budget run of a trial that left the cell's
        # best, is made again; any other JSON of other flags is of
        # another study (main refuses them before anything runs:
        # ``other_settings``).
        if budget is None and (stage is not None or test == 'never'):
            raise SystemExit('{}: made with the flags {}, this study runs '
                             '{}; give another --out'.format(
                                 path, record['flags'], flags))
        print('  {}: a {} of trial {}, the best is now trial {}: run '
              'again'.format(name, 'rerun' if budget is None
                             else 'budget run', record['trial'], trial),
              flush=True)
    epochs = epochs_of(args, batchsize)
    if budget is not None:
        epochs = int(epochs * budget)  # a whole number: main checks it
    cmd = command(optimizer, batchsize, epochs, flags, seed,
                  args.validation, args.n_train, test, args.model)
    text = shlex.join(cmd)
    print('$ ' + text, flush=True)
    args.runs_made = getattr(args, 'runs_made', 0) + 1  # (redraw, main)
    out = os.path.join(args.runs, name)
    os.makedirs(out, exist_ok=True)
    start = time.time()
    with open(os.path.join(args.runs, name + '.stdout'), 'w') as stdout:
        log = run_command(cmd, out, args.dataset_root, args.device, stdout)
    record = {'optimizer': optimizer, 'batchsize': batchsize,
              'trial': trial, 'seed': seed, 'flags': flags,
              'command': text, 'target': args.target, 'epochs': epochs,
              'validation': args.validation, 'model': args.model,
              'n_train': args.n_train}
    if budget is not None:
        record['budget'] = budget
        record['budget_of'] = trial_name(optimizer, batchsize, trial)
    if stage is not None:
        record['stage'] = stage
    if args.fair is not None:
        record['fair'] = args.fair
    record['machine'] = args.machine
    record.update(measure(log, batchsize, args.n_train, args.target,
                          args.validation))
    if test == 'never':
        record['test_accuracy'] = None
    record['seconds'] = round(time.time() - start)
    write(path, record)
    print('  {} s: steps to {:g} %: {}, best validation {:.4f}'.format(
        record['seconds'], 100 * args.target, record['steps_to_target'],
        record['best_validation'] or 0), flush=True)
    return record


_NUMBER = (int, float)
#: The entries of a result JSON, and their types (None: null allowed).
RECORD_KEYS = {'optimizer': (str,), 'batchsize': (int,),
               'trial': (int, None), 'seed': (int,), 'flags': (dict,),
               'command': (str,), 'target': _NUMBER, 'epochs': (int,),
               'validation': (int,), 'steps_to_target': (int, None),
               'epochs_to_target': _NUMBER + (None,),
               'best_validation': _NUMBER + (None,),
               'test_accuracy': _NUMBER + (None,), 'diverged': (bool,),
               'curve': (list,)}
#: Those of some JSONs only: the budget sweep's, the pre-tuning's, ...
OPTIONAL_KEYS = {'budget': _NUMBER, 'budget_of': (str,), 'stage': (str,),
                 'model': (str,), 'fair': _NUMBER, 'machine': (dict,),
                 'n_train': (int,)}


def _of_type(value, kinds):
    if value is None:
        return None in kinds
    if isinstance(value, bool):  # JSON's true and false are no numbers
        return bool in kinds
    return isinstance(value, tuple(k for k in kinds if k is not None))


def record_problem(record):
    """What makes ``record`` (a result JSON, read) no result of the study,
    or None: not an object, an entry missing or of the wrong type, a
    curve that is not of ``[iteration, accuracy]`` pairs."""
    if not isinstance(record, dict):
        return 'not a JSON object but a {}'.format(type(record).__name__)
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        return 'no {}'.format(', '.join(missing))
    for key, kinds in list(RECORD_KEYS.items()) + list(
            OPTIONAL_KEYS.items()):
        if key in record and not _of_type(record[key], kinds):
            return '{} is {}, not {}'.format(key, json.dumps(record[key]), (
                ' or '.join('null' if k is None else k.__name__
                            for k in kinds)))
    for point in record['curve']:
        if not (isinstance(point, list) and len(point) == 2
                and _of_type(point[0], (int,))
                and _of_type(point[1], _NUMBER + (None,))):
            return 'curve holds {}, not an [iteration, accuracy] ' \
                'pair'.format(json.dumps(point))
    return None


#: What ``read`` advises for a JSON of the study's folder.
RUN_AGAIN = 'remove it, and the study runs it again'


def read(path, advice=RUN_AGAIN):
    """The result JSON ``path``; exits naming it, with ``advice``, where
    it cannot be read or is not a result (``record_problem``): a file cut
    short, edited by hand, or of something else."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit('{}: cannot be read as JSON ({}); {}'.format(
            path, e, advice))
    problem = record_problem(record)
    if problem is not None:
        raise SystemExit('{}: not a result of the study: {}; {}'.format(
            path, problem, advice))
    return record


def write(path, record):
    """Writes the JSON whole or not at all (an interrupted study)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
        json.dump(record, f, indent=1, sort_keys=True, allow_nan=False)
        f.write('\n')
    os.replace(path + '.tmp', path)


def _rank(r):
    steps = r['steps_to_target']
    return (steps is None, steps or 0, -(r['best_validation'] or 0),
            r['trial'])


def ranked(trials):
    """The trials, best first: the fewest steps to the target; then, among
    those that never reached it, the best validation accuracy (ties: the
    lower trial number)."""
    return sorted(trials, key=_rank)


def best(trials):
    """The best trial (``ranked``'s first)."""
    return min(trials, key=_rank)


def _records(out):
    """``(name, record)`` of each JSON in ``out``."""
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.endswith('.json'):
            yield name[:-len('.json')], read(os.path.join(out, name))


def no_study(out):
    """Why ``out`` holds no study to read, or None: no folder, or a folder
    without a JSON of one (in it or in its ``pretune/``)."""
    problem = folders.folder_problem(out, create=False)
    if problem is not None:
        return problem
    for folder in (out, os.path.join(out, PRETUNE)):
        if os.path.isdir(folder) and any(
                name.endswith('.json') for name in os.listdir(folder)):
            return None
    return 'no JSON of a study in it'


def load(out):
    """The records in ``out``: ``(search, reruns)`` by (batch, optimizer);
    the budget sweep's are ``load_budgets``'."""
    search, reruns = {}, {}
    for name, record in _records(out):
        if name.startswith(DEFAULTS + '-') or 'budget_of' in record:
            continue
        cell = record['batchsize'], record['optimizer']
        if '-best-' in name:
            reruns.setdefault(cell, []).append(record)
        else:
            search.setdefault(cell, []).append(record)
    for records in list(search.values()) + list(reruns.values()):
        records.sort(key=lambda r: (r['trial'], r['seed']))
    return search, reruns


def load_budgets(out):
    """The budget sweep's records in ``out``, by (batch, optimizer)."""
    found = {}
    for _, record in _records(out):
        if 'budget_of' in record:
            found.setdefault((record['batchsize'], record['optimizer']),
                             []).append(record)
    for records in found.values():
        records.sort(key=lambda r: (r['trial'], r['budget']))
    return found


def pilot_flags(optimizer, batchsize, epochs, k):
    """The flags of pilot run ``k`` of the pre-tuning."""
    return {'lr': _round(center_lr(optimizer, batchsize) * 10 ** (k / 2)),
            'momentum': 0.9, 'warmup_epochs': _round(0.2 * epochs),
            'label_smoothing': 0.0}


def grid_runs():
    """The runs of a pre-tuning grid."""
    return len(WEIGHT_DECAYS) * len(DECAY_POWERS)


def grid_flags(working, index):
    """The flags of grid run ``index`` of the pre-tuning: the working
    rate's pilot flags with a weight decay and a decay power."""
    decay, power = divmod(index, len(DECAY_POWERS))
    return dict(working, weight_decay=WEIGHT_DECAYS[decay],
                decay_power=DECAY_POWERS[power])


def working(pilot):
    """The pilot run of the best validation accuracy (ties: the lower
    rate): its flags are the working rate's."""
    return max(pilot, key=lambda r: (r['best_validation'] or 0,
                                     -r['flags']['lr']))


def load_pretune(out):
    """The pre-tuning's records, by (batch size, optimizer, stage)."""
    found = {}
    for _, record in _records(os.path.join(out, PRETUNE)):
        found.setdefault((record['batchsize'], record['optimizer'],
                          record['stage']), []).append(record)
    for records in found.values():
        records.sort(key=lambda r: r['trial'])
    return found


def pretuned_settings(out, batchsize, optimizers):
    """Each optimizer's settings from its complete pre-tuning in
    ``<out>/pretune/`` at ``batchsize``: the working rate, and the weight
    decay and decay power of the grid's best run."""
    found, settings = load_pretune(out), {}
    runs = grid_runs()
    for optimizer in optimizers:
        pilot = found.get((batchsize, optimizer, 'pilot'), [])
        grid = found.get((batchsize, optimizer, 'grid'), [])
        if len(pilot) < len(PILOT) or len(grid) < runs:
            raise SystemExit(
                '--pretuned: the pre-tuning of {} at batch size {} has {} '
                'of its {} runs in {}: run --pretune first'.format(
                    optimizer, batchsize, len(pilot) + len(grid),
                    len(PILOT) + runs, os.path.join(out, PRETUNE)))
        top = best(grid)['flags']
        settings[optimizer] = {
            'lr': working(pilot)['flags']['lr'], 'batchsize': batchsize,
            'weight_decay': top['weight_decay'],
            'decay_power': top['decay_power']}
    return settings


def pretune(args):
    """The pre-tuning at ``--pretune-batchsize``: the pilots of every
    optimizer, then their grids, each run in turn for every optimizer."""
    batchsize = args.pretune_batchsize
    epochs = args.epochs or EPOCHS[batchsize]
    for k in PILOT:
        for optimizer in args.optimizers:
            run_trial(args, optimizer, batchsize, k,
                      pilot_flags(optimizer, batchsize, epochs, k), 0,
                      'never', stage='pilot')
    for index in range(grid_runs()):
        for optimizer in args.optimizers:
            pilot = load_pretune(args.out)[batchsize, optimizer, 'pilot']
            run_trial(args, optimizer, batchsize, index,
                      grid_flags(working(pilot)['flags'], index), 0,
                      'never', stage='grid')


def pretune_tables(found, grid_runs_of=None):
    """The pre-tuning's runs, and per optimizer its working rate and the
    best weight decay and decay power at it. ``grid_runs_of`` is the
    number of grid runs (``grid_runs()``; 0 for the fair experiment's
    pilot alone)."""
    if grid_runs_of is None:
        grid_runs_of = grid_runs()
    cells = sorted({(b, o) for b, o, _ in found}, key=_cell_order)
    head = ['batch size', 'optimizer', 'stage', 'run', 'lr',
            'weight decay', 'decay power', 'steps to target',
            'best validation (%)']
    rows, summary = [], []
    for b, o in cells:
        for stage in ('pilot', 'grid'):
            for r in found.get((b, o, stage), []):
                f = r['flags']
                rows.append([str(b), o, stage, str(r['trial']),
                             '{:g}'.format(f['lr']),
                             '{:g}'.format(f.get('weight_decay', 1e-4)),
                             '{:g}'.format(f.get('decay_power', 2)),
                             _steps(r), _percent(r['best_validation'])])
        pilot, grid = found.get((b, o, 'pilot')), found.get((b, o, 'grid'))
        if not pilot or len(pilot) < len(PILOT):
            continue
        if not grid_runs_of:  # the pilot's working rate and its run
            top = working(pilot)
            summary.append([str(b), o, '{}/{}'.format(len(pilot),
                                                      len(PILOT)),
                            '{:g}'.format(top['flags']['lr']), _steps(top),
                            _percent(top['best_validation'])])
            continue
        top = best(grid) if grid else None
        summary.append([
            str(b), o, '{}/{}'.format(len(pilot) + len(grid or ()),
                                      len(PILOT) + grid_runs_of),
            '{:g}'.format(working(pilot)['flags']['lr']),
            '-' if top is None else '{:g}'.format(
                top['flags']['weight_decay']),
            '-' if top is None else '{:g}'.format(
                top['flags']['decay_power']),
            '-' if top is None else _steps(top),
            '-' if top is None else _percent(top['best_validation'])])
    summary_head = ['batch size', 'optimizer', 'runs', 'working rate',
                    'best weight decay', 'best decay power',
                    'steps to target', 'best validation (%)']
    if not grid_runs_of:
        summary_head = summary_head[:4] + summary_head[6:]
    return [(head, rows), (summary_head, summary)]


def inconsistent_pretune(found):
    """Pre-tuning records the study would not have written now: a pilot
    whose flags are not its point's, a grid run not at its optimizer's
    working rate."""
    problems = []
    for (b, o, stage), records in sorted(found.items()):
        pilot = found.get((b, o, 'pilot'), [])
        for r in records:
            name = trial_name(o, b, r['trial'], stage=stage)
            if stage == 'pilot':
                want = pilot_flags(o, b, r['epochs'], r['trial'])
            elif len(pilot) == len(PILOT):
                want = grid_flags(working(pilot)['flags'], r['trial'])
            else:
                want = r['flags']  # checked once its pilot is complete
            if r['flags'] != want:
                problems.append('{}: flags {}, the pre-tuning gives {}'
                                .format(name, r['flags'], want))
    return problems


def budget_flags(flags, budget):
    """A trial's flags for ``budget`` times its epochs: the warm-up
    stretched with the run (the decay, to 0 at the end of the run,
    stretches by itself); the same fraction of the run."""
    return dict(flags, warmup_epochs=_round(flags['warmup_epochs'] * budget))


def load_defaults(out, reruns=False):
    """The runs of the trainer's defaults in ``out``: the search's (seed
    0, ``--test never``) by batch size; with ``reruns``, the seeded
    reruns' by batch size, in a list ordered by seed."""
    found = {}
    for name, record in _records(out):
        if name.startswith(DEFAULTS + '-') and ('-s' in name) == reruns:
            if reruns:
                found.setdefault(record['batchsize'], []).append(record)
            else:
                found[record['batchsize']] = record
    for records in found.values() if reruns else ():
        records.sort(key=lambda r: r['seed'])
    return found


def study(args):
    cells = [(b, o) for b in args.batchsizes for o in args.optimizers]
    for trial in range(2 * args.trials):
        for batchsize, optimizer in cells:
            if trial >= trials_of(batchsize, args.trials, args.refine):
                continue
            search, _ = load(args.out)
            flags = search_flags(optimizer, batchsize,
                                 args.epochs or EPOCHS[batchsize], trial,
                                 args.trials,
                                 search.get((batchsize, optimizer), []),
                                 args.settings)
            run_trial(args, optimizer, batchsize, trial, flags, 0, 'never')
            redraw(args)
    # The trainer's defaults are lars's: measured beside lars only.
    # (Not again with --pretuned: the defaults take no pre-tuned setting.)
    for batchsize in (args.batchsizes if 'lars' in args.optimizers
                      and args.settings is None else ()):
        run_trial(args, DEFAULTS, batchsize, None, {}, 0, 'never')
        redraw(args)
    for seed in args.seeds:
        for batchsize, optimizer in cells:
            search, _ = load(args.out)
            chosen = best(search[batchsize, optimizer])
            run_trial(args, optimizer, batchsize, chosen['trial'],
                      chosen['flags'], seed, 'end')
            redraw(args)
        # The defaults with the same seeds: what a new user gets.
        for batchsize in (args.batchsizes if 'lars' in args.optimizers
                          and args.settings is None else ()):
            run_trial(args, DEFAULTS, batchsize, None, {}, seed, 'end')
    sweep(args)
    redraw(args)  # the defaults' reruns, where the sweep ran nothing


def fair_rates(out, batchsize, optimizers):
    """The working rate of each optimizer whose pilot at ``batchsize`` in
    ``<out>/pretune/`` is complete."""
    found, rates = load_pretune(out), {}
    for optimizer in optimizers:
        pilot = found.get((batchsize, optimizer, 'pilot'), [])
        if len(pilot) >= len(PILOT):
            rates[optimizer] = working(pilot)['flags']['lr']
    return rates


def fair(args):
    """The fair experiment (``--fair``), at each batch size: the pilots,
    then the search round by round (trial 0 of each optimizer, then trial
    1, ...), then the reruns of each optimizer's best trial with
    ``--seeds``, and with ``--more-seeds`` where the arms' ranges overlap
    (``wanted_seeds``)."""
    for batchsize in args.batchsizes:
        epochs = epochs_of(args, batchsize)
        for k in PILOT:
            for optimizer in args.optimizers:
                run_trial(args, optimizer, batchsize, k,
                          pilot_flags(optimizer, batchsize, epochs, k), 0,
                          'never', stage='pilot')
                redraw(args)
        rates = fair_rates(args.out, batchsize, args.optimizers)
        for trial in range(2 * args.trials):
            for optimizer in args.optimizers:
                search, _ = load(args.out)
                flags = fair_flags(optimizer, epochs, trial, args.trials,
                                   search.get((batchsize, optimizer), []),
                                   rates[optimizer])
                run_trial(args, optimizer, batchsize, trial, flags, 0,
                          'never')
                redraw(args)
        for seed in args.seeds + args.more_seeds:
            for optimizer in args.optimizers:
                search, reruns = load(args.out)
                if seed not in wanted_seeds(reruns, batchsize, optimizer,
                                            args.seeds, args.more_seeds):
                    continue
                chosen = best(search[batchsize, optimizer])
                run_trial(args, optimizer, batchsize, chosen['trial'],
                          chosen['flags'], seed, 'end')
                redraw(args)


def sweep(args):
    """The budget sweep: the best ``--budget-configs`` trials of each cell
    of ``--budget-batchsizes`` (complete cells only), each at the budgets
    of ``--budgets``; the best trials first, each at every budget and
    batch size before the next; the shorter budgets first."""
    batchsizes = [b for b in args.budget_batchsizes if b in args.batchsizes]
    for rank in range(args.budget_configs):
        for budget in args.budgets:
            for batchsize in batchsizes:
                for optimizer in args.optimizers:
                    search, _ = load(args.out)
                    records = search.get((batchsize, optimizer), [])
                    n = trials_of(batchsize, args.trials, args.refine)
                    if len(records) < n or rank >= len(records):
                        continue
                    top = ranked(records)[rank]
                    run_trial(args, optimizer, batchsize, top['trial'],
                              budget_flags(top['flags'], budget), 0,
                              'never', budget)
                    redraw(args)


def redraw(args):
    """Redraws the figure where a run was made since it was last drawn (a
    study whose runs all have their JSON draws it once); a failure is
    printed, the study goes on."""
    made = getattr(args, 'runs_made', 0)
    if args.plot and made != getattr(args, 'drawn_after', -1):
        args.drawn_after = made
        try:
            plot(args)
        except Exception as e:  # the figure must not stop the study
            import matplotlib.pyplot as plt
            plt.close('all')  # else each failure leaves its figure open
            print('  the figure failed: {!r}'.format(e), flush=True)


# -- The tables ------------------------------------------------------------

def _percent(value):
    return '-' if value is None else '{:.2f}'.format(100 * value)


def _spread(values, form):
    values = [v for v in values if v is not None]
    if not values:
        return '-'
    text = form(sum(values) / len(values))
    if len(values) > 1:
        text += ' ({}-{})'.format(form(min(values)), form(max(values)))
    return text


def _cell_order(cell):
    """Cells by batch size, then in the order of ``OPTIMIZERS`` (others,
    such as the defaults, after them)."""
    batchsize, optimizer = cell
    order = list(OPTIMIZERS)
    return (batchsize, order.index(optimizer) if optimizer in order
            else len(order), optimizer)


#: The search table's columns of the flags that ``tables``' ``extra``
#: may add (the fair experiment's).
EXTRA_COLUMNS = {'decay_power': 'decay power', 'beta2': 'beta2',
                 'eps': 'eps'}


def tables(search, reruns, trials=TRIALS, seeds=len(SEEDS), refine=REFINED,
           defaults=None, budgets=None, budget_list=BUDGETS,
           budget_configs=BUDGET_CONFIGS,
           budget_batchsizes=BUDGET_BATCHSIZES, default_reruns=None,
           wanted=None, extra=()):
    """The search table, the rerun table (with a ``defaults`` row per batch
    size where ``default_reruns`` has the defaults' seeded reruns), the
    table of what the search covered, the target-sensitivity table, the
    table of each pair's comparison and, where runs of the trainer's
    defaults exist, their table, and where budget runs exist, the budget
    sweep's two tables: (header, rows) each. ``wanted`` gives the seeds a
    cell's reruns are to have where not ``seeds`` (the fair experiment's
    five); ``extra``, flags to show in the search table besides the
    rate, momentum, warm-up and smoothing (``EXTRA_COLUMNS``)."""
    cells = sorted(set(search) | set(reruns), key=_cell_order)
    head = ['batch size', 'optimizer', 'epochs', 'trials', 'reached',
            'best trial', 'steps to target', 'epochs to target',
            'best validation, any trial (%)', 'lr', 'momentum', 'warm-up',
            'smoothing'] + [EXTRA_COLUMNS[name] for name in extra]
    rows = []
    for cell in cells:
        records = search.get(cell, [])
        if not records:
            continue
        top = best(records)
        reached = [r for r in records if r['steps_to_target'] is not None]
        flags = top['flags']
        rows.append([str(cell[0]), cell[1], str(top['epochs']),
                     '{}/{}'.format(len(records),
                                    trials_of(cell[0], trials, refine)),
                     str(len(reached)), str(top['trial']),
                     str(top['steps_to_target'] if reached else '-'),
                     _epochs(top) if reached else '-',
                     _percent(max(r['best_validation'] or 0
                                  for r in records)),
                     '{:g}'.format(flags['lr']),
                     '{:g}'.format(flags['momentum']),
                     '{:g}'.format(flags['warmup_epochs']),
                     '{:g}'.format(flags['label_smoothing'])]
                    + ['-' if name not in flags else '{:g}'.format(
                        flags[name]) for name in extra])
    rerun_head = ['batch size', 'optimizer', 'trial', 'seeds', 'reached',
                  'steps to target', 'steps, each seed',
                  'at (% of the steps run)',
                  'best validation (%)', 'test (%)']
    rerun_rows = []
    reruns = dict(reruns)
    reruns.update(((b, DEFAULTS), records) for b, records in (
        default_reruns or {}).items())
    for cell in sorted(reruns, key=_cell_order):
        records = reruns[cell]
        rerun_rows.append([
            str(cell[0]), cell[1], '-' if cell[1] == DEFAULTS
            else str(records[0]['trial']),
            '{}/{}'.format(len(records), (wanted or {}).get(cell, seeds)),
            # The steps are those of the seeds that reached the target.
            str(sum(r['steps_to_target'] is not None for r in records)),
            _spread([r['steps_to_target'] for r in records],
                    lambda v: '{:.0f}'.format(v)),
            # The mean of 3 rounds to a whole step: each seed's, to read
            # a goal such as "40 or fewer" off.
            ', '.join(_steps(r) for r in sorted(records,
                                                key=lambda r: r['seed'])),
            _spread([_fraction_run(r) for r in records],
                    lambda v: '{:.0f}'.format(100 * v)),
            _spread([r['best_validation'] for r in records], _percent),
            _spread([r['test_accuracy'] for r in records], _percent)])
    found = [(head, rows), (rerun_head, rerun_rows),
             space_table(search, cells, trials)]
    # Of the reruns, where there are any (and pairs among them).
    found += [table for table in (sensitivity_table(reruns),
                                  pair_table(reruns)) if table[1]]
    if defaults:
        found.append(defaults_table(search, defaults))
    if budgets:
        found.extend(budget_tables(search, budgets, budget_list,
                                   budget_configs, budget_batchsizes))
    return found


def sensitivity_table(reruns):
    """Steps to the targets of ``SENSITIVITY`` (below the study's, and
    the study's), read off the curves of every cell's reruns: how many
    reached each, and the mean (range) of their steps."""
    head, rows = ['batch size', 'optimizer', 'seeds'], []
    targets = None
    for cell in sorted(reruns, key=_cell_order):
        records = reruns[cell]
        if targets is None:
            targets = [round(records[0]['target'] + d, 9)
                       for d in SENSITIVITY]
            for t in targets:
                head += ['reached {:g} %'.format(100 * t),
                         'steps to {:g} %'.format(100 * t)]
        row = [str(cell[0]), cell[1], str(len(records))]
        for t in targets:
            steps = [first_at_target(r['curve'], r['validation'], t)
                     for r in records]
            row += [str(sum(v is not None for v in steps)),
                    _spread(steps, lambda v: '{:.0f}'.format(v))]
        rows.append(row)
    return head, rows


def pair_table(reruns):
    """Each pair of ``PAIRS`` whose two arms have reruns at a batch size:
    the seeds and the reruns that reached the target of each arm, whether
    the arms' ranges of steps to the target overlap (``ranges_overlap``)
    and the two-sided exact p-values of the rank-sum test (``rank_test``)
    of the steps (a miss ranked after any reach) and of the best
    validation accuracy."""
    head = ['batch size', 'optimizers', 'seeds', 'reached',
            'ranges of steps overlap', 'p, steps to target',
            'p, best validation']
    rows = []
    for batchsize in sorted({b for b, _ in reruns}):
        for a, b in PAIRS:
            if (batchsize, a) not in reruns or (batchsize, b) not in reruns:
                continue
            ra, rb = reruns[batchsize, a], reruns[batchsize, b]
            rows.append([
                str(batchsize), '{} / {}'.format(a, b),
                '{} / {}'.format(len(ra), len(rb)),
                '{} / {}'.format(*(sum(r['steps_to_target'] is not None
                                       for r in x) for x in (ra, rb))),
                'yes' if ranges_overlap(ra, rb) else 'no',
                '{:.2g}'.format(rank_test([_steps_key(r) for r in ra],
                                          [_steps_key(r) for r in rb])),
                '{:.2g}'.format(rank_test(
                    [-(r['best_validation'] or 0) for r in ra],
                    [-(r['best_validation'] or 0) for r in rb]))])
    return head, rows


def steps_run(r):
    """The updates the run made: its last evaluation's (the trainer
    evaluates at the end of the run); fewer for a run that diverged."""
    return r['curve'][-1][0] if r['curve'] else 0


def _fraction_run(r):
    """Where in its run a trial reached the target, or None."""
    if r['steps_to_target'] is None:
        return None
    return r['steps_to_target'] / steps_run(r)


def _range(values, form):
    values = [v for v in values if v is not None]
    if not values:
        return '-'
    low, high = form(min(values)), form(max(values))
    return low if low == high else '{}-{}'.format(low, high)


def space_table(search, cells, trials=TRIALS):
    """What each round of each cell's search covered: how many trials
    diverged and reached the target, the ranges of the rate, of the
    effective rate lr / (1 - momentum) and of the warm-up (% of the run),
    the updates of a run, and where in it the trials reached the target
    (% of the run)."""
    head = ['batch size', 'optimizer', 'trials', 'diverged', 'reached',
            'lr', 'lr / (1 - momentum)', 'warm-up (% of the run)',
            'steps run', 'reached at (% of the steps run)']
    rows = []
    for cell in cells:
        records = search.get(cell, [])
        for first in range(0, max([r['trial'] for r in records] + [-1]) + 1,
                           trials):
            part = [r for r in records if first <= r['trial'] < first
                    + trials]
            if not part:
                continue
            flags = [r['flags'] for r in part]
            whole = [r for r in part if not r['diverged']]
            rows.append([
                str(cell[0]), cell[1],
                '{}-{}'.format(first, first + trials - 1),
                str(sum(bool(r['diverged']) for r in part)),
                str(sum(r['steps_to_target'] is not None for r in part)),
                _range([f['lr'] for f in flags], '{:.3g}'.format),
                _range([f['lr'] / (1 - f['momentum']) for f in flags],
                       '{:.3g}'.format),
                _range([100 * f['warmup_epochs'] / r['epochs']
                        for f, r in zip(flags, part)], '{:.0f}'.format),
                _range([steps_run(r) for r in whole], str),
                _range([_fraction_run(r) for r in part],
                       lambda v: '{:.0f}'.format(100 * v))])
    return head, rows


def _steps(r):
    return '-' if r['steps_to_target'] is None else str(r['steps_to_target'])


#: MNIST's training images: the JSONs without ``n_train`` held
#: ``validation`` of them out.
MNIST_TRAINING = 60000


def _epochs(r):
    """A record's epochs to the target, two decimals, from its steps (its
    ``epochs_to_target`` is rounded to three: 17.6947 read 17.695, then
    17.70)."""
    if r['steps_to_target'] is None:
        return '-'
    n = r.get('n_train', MNIST_TRAINING - r['validation'])
    return '{:.2f}'.format(r['steps_to_target'] * r['batchsize'] / n)


def budget_tables(search, budgets, budget_list=BUDGETS,
                  budget_configs=BUDGET_CONFIGS,
                  budget_batchsizes=BUDGET_BATCHSIZES):
    """The budget sweep: each trial swept, its steps to the target and best
    validation accuracy at each budget (1x: the search trial itself); and
    per cell the fewest steps to the target over every budget. Every cell
    of ``budget_batchsizes`` with trials is shown, its runs still to be
    made as "to run"."""
    multiples = sorted(set([1] + list(budget_list)))
    cells = set(budgets) | {c for c in search if c[0] in budget_batchsizes}
    cells = sorted(cells, key=_cell_order)
    head = (['batch size', 'optimizer', 'trial', 'epochs at 1x']
            + ['steps at {:g}x'.format(m) for m in multiples]
            + ['best validation at {:g}x (%)'.format(m) for m in multiples])
    rows, summary = [], []
    for cell in cells:
        runs = {(r['trial'], r['budget']): r
                for r in budgets.get(cell, [])}
        swept = ranked(search.get(cell, []))[:budget_configs]
        done = []
        for top in swept:
            at = [top if m == 1 else runs.get((top['trial'], m))
                  for m in multiples]
            done += [r for r in at if r is not None]
            rows.append([str(cell[0]), cell[1], str(top['trial']),
                         str(top['epochs'])]
                        + ['to run' if r is None else _steps(r) for r in at]
                        + ['to run' if r is None else
                           _percent(r['best_validation']) for r in at])
        if not done:
            continue
        fastest = min(done, key=lambda r: (
            r['steps_to_target'] is None, r['steps_to_target'] or 0,
            r.get('budget', 1), r['trial']))
        reached = fastest['steps_to_target'] is not None
        summary.append([
            str(cell[0]), cell[1],
            '{}/{}'.format(len(done), len(swept) * len(multiples)),
            str(sum(r['steps_to_target'] is not None for r in done)),
            _steps(fastest),
            '{:g}x'.format(fastest.get('budget', 1)) if reached else '-',
            str(fastest['trial']) if reached else '-',
            str(fastest['epochs']) if reached else '-',
            _percent(max(r['best_validation'] or 0 for r in done))])
    summary_head = ['batch size', 'optimizer', 'runs', 'reached',
                    'fewest steps to target, any budget', 'budget',
                    'trial', 'epochs', 'best validation, any run (%)']
    return [(head, rows), (summary_head, summary)]


def defaults_table(search, defaults):
    """The trainer's defaults beside the best lars trial of the search."""
    head = ['batch size', 'epochs', 'lr', 'steps to target',
            'epochs to target', 'best validation (%)',
            'best lars trial: steps to target']
    rows = []
    for batchsize, r in sorted(defaults.items()):
        records = search.get((batchsize, 'lars'))
        top = best(records) if records else None
        rows.append([
            str(batchsize), str(r['epochs']), '{:.4g}'.format(
                recipe.default_lr('lars', batchsize, TRUST_COEFFICIENT)),
            '-' if r['steps_to_target'] is None else str(
                r['steps_to_target']),
            _epochs(r),
            _percent(r['best_validation']),
            '-' if top is None or top['steps_to_target'] is None
            else str(top['steps_to_target'])])
    return head, rows


def inconsistent(search, reruns, trials, refine=REFINED, settings=None,
                 rates=None):
    """What in the records the study would not have written now: a search
    trial's flags that are not those of its point of the search (the
    search was changed after it ran), a rerun of another trial than its
    cell's best. ``rates``: the fair experiment's working rates by
    (batch size, optimizer), whose search is ``fair_flags``'."""
    problems = []
    for (batchsize, optimizer), records in sorted(search.items()):
        n = trials_of(batchsize, trials, refine)
        for r in records:
            if r['trial'] >= n:
                problems.append('{}: trial {} of a search of {}'.format(
                    trial_name(optimizer, batchsize, r['trial']),
                    r['trial'], n))
                continue
            if rates is None:
                want = search_flags(optimizer, batchsize, r['epochs'],
                                    r['trial'], trials, records, settings)
            elif (batchsize, optimizer) not in rates:
                problems.append('{}: a search trial before its pilot is '
                                'complete'.format(trial_name(
                                    optimizer, batchsize, r['trial'])))
                continue
            else:
                want = fair_flags(optimizer, r['epochs'], r['trial'],
                                  trials, records,
                                  rates[batchsize, optimizer])
            if r['flags'] != want:
                problems.append('{}: flags {}, the search gives {}'.format(
                    trial_name(optimizer, batchsize, r['trial']),
                    r['flags'], want))
    for cell, records in sorted(reruns.items()):
        chosen = best(search.get(cell, [])) if search.get(cell) else None
        for r in records:
            if (chosen is None or r['trial'] != chosen['trial']
                    or r['flags'] != chosen['flags']):
                problems.append('{}: a rerun of trial {}, the best is {}'
                                .format(trial_name(cell[1], cell[0],
                                                   seed=r['seed']),
                                        r['trial'], chosen and
                                        chosen['trial']))
    return problems


def inconsistent_budgets(search, budgets, trials, refine=REFINED,
                         budget_configs=BUDGET_CONFIGS):
    """What in the budget sweep's records the study would not have written
    now: a run of a trial that is not among its cell's best, or whose
    flags or epochs are not its trial's stretched by its budget."""
    problems = []
    for cell, records in sorted(budgets.items()):
        swept = ranked(search.get(cell, []))[:budget_configs]
        by_trial = {r['trial']: r for r in swept}
        for r in records:
            name = trial_name(cell[1], cell[0], r['trial'],
                              budget=r['budget'])
            base = by_trial.get(r['trial'])
            if base is None:
                problems.append('{}: trial {} is not among the {} best of '
                                'its cell ({})'.format(
                                    name, r['trial'], budget_configs,
                                    ', '.join(str(t['trial'])
                                              for t in swept)))
                continue
            want = budget_flags(base['flags'], r['budget'])
            if r['flags'] != want:
                problems.append('{}: flags {}, the trial stretched gives {}'
                                .format(name, r['flags'], want))
            if r['epochs'] != base['epochs'] * r['budget']:
                problems.append('{}: {} epochs, {} times trial {}\'s {}'
                                .format(name, r['epochs'], r['budget'],
                                        r['trial'], base['epochs']))
            if r['budget_of'] != trial_name(cell[1], cell[0], r['trial']):
                problems.append('{}: budget_of {}'.format(name,
                                                          r['budget_of']))
    return problems


def fair_problems(args, search, reruns):
    """What in the fair experiment's records (``--fair``) the study would
    not have written now, besides ``inconsistent``'s: a record without
    its machine, a run of another epoch budget or another ``--fair``, a
    pilot of another budget, a rerun of a seed its cell does not want
    (``wanted_seeds``)."""
    problems = []
    pilots = [(trial_name(o, b, r['trial'], stage=stage), r)
              for (b, o, stage), found in load_pretune(args.out).items()
              for r in found]
    for name, r in list(_records(args.out)) + pilots:
        missing = [k for k in MACHINE_KEYS
                   if k not in (r.get('machine') or {})]
        if missing:
            problems.append('{}: its machine does not record {}'.format(
                name, ', '.join(missing)))
        if r.get('fair') != args.fair:
            problems.append('{}: a run of --fair {}, not {:g}'.format(
                name, r.get('fair'), args.fair))
        if r['epochs'] != epochs_of(args, r['batchsize']):
            problems.append('{}: {} epochs, the budget is {}'.format(
                name, r['epochs'], epochs_of(args, r['batchsize'])))
        if 'stage' in r and r['stage'] != 'pilot':
            problems.append('{}: a {} run; the fair experiment has a pilot '
                            'only'.format(name, r['stage']))
    for (b, o), records in sorted(reruns.items()):
        want = wanted_seeds(reruns, b, o, args.seeds, args.more_seeds)
        for r in records:
            if r['seed'] not in want:
                problems.append('{}: seed {}, the reruns of this cell are '
                                'of seeds {}'.format(
                                    trial_name(o, b, seed=r['seed']),
                                    r['seed'], want))
    return problems


def fair_wanted(args, reruns):
    """The seeds each rerun cell of the fair experiment is to have."""
    return {(b, o): len(wanted_seeds(reruns, b, o, args.seeds,
                                     args.more_seeds))
            for b, o in reruns}


def other_model(out, model):
    """Each JSON of ``out`` of another model than ``model`` (the JSONs
    that predate --model are of the first, ``mlp``)."""
    return ['{}: a run of --model {}, not {}'.format(
        name, r.get('model', MODELS[0]), model)
        for name, r in _records(out) if r.get('model', MODELS[0]) != model]


def off_the_curve(out):
    """Each JSON of ``out`` whose steps_to_target is not the first point
    of its own curve at the target (``first_at_target``)."""
    problems = []
    for name, r in _records(out):
        want = first_at_target(r['curve'], r['validation'], r['target'])
        if r['steps_to_target'] != want:
            problems.append('{}: steps_to_target {}, its curve first '
                            'reaches {:g} % at {}'.format(
                                name, r['steps_to_target'],
                                100 * r['target'], want))
    return problems


def _paths(out):
    """``(path, record)`` of each JSON of ``out`` and its ``pretune/``."""
    for folder in (out, os.path.join(out, PRETUNE)):
        for name, record in _records(folder):
            yield os.path.join(folder, name + '.json'), record


def all_fair_rates(args, search):
    """The fair experiment's working rates by (batch size, optimizer), for
    ``inconsistent``; None outside it."""
    if args.fair is None:
        return None
    return {(b, o): lr for b in {b for b, _ in search}
            for o, lr in fair_rates(args.out, b, list(OPTIMIZERS)).items()}


def other_settings(args, given):
    """Each JSON of ``--out`` made with other settings than this
    invocation's, as ``path: what differs``: the model, the target, the
    validation split and the epochs, those of ``given`` only (the flags
    named on the command line; all of them where the study runs), and
    the flags of the search trials, the pilot and the grid (``inconsistent``
    without the reruns, which the study makes again of a new best). A
    study that took them as its own would skip their runs, or replace
    them, and its tables would mix two studies."""
    problems, names = [], {}
    for path, r in _paths(args.out):
        names[os.path.basename(path)[:-len('.json')]] = path
        made, asked = [], []
        want = {'model': args.model, 'target': args.target,
                'validation': args.validation}
        if args.epochs is not None or r['batchsize'] in EPOCHS:
            want['epochs'] = int(epochs_of(args, r['batchsize'])
                                 * r.get('budget', 1))
        for key, value in sorted(want.items()):
            was = r.get(key, MODELS[0] if key == 'model' else None)
            if key in given and was != value:
                made.append('--{} {}'.format(key, was))
                asked.append('--{} {}'.format(key, value))
        if made:
            problems.append('{}: made with {}, not {}'.format(
                path, ' '.join(made), ' '.join(asked)))
    if problems or 'flags' not in given:
        return problems
    search, _ = load(args.out)
    rates = all_fair_rates(args, search)
    for problem in (inconsistent(search, {}, args.trials, args.refine,
                                 args.settings, rates)
                    + inconsistent_pretune(load_pretune(args.out))):
        name, what = problem.split(': ', 1)
        problems.append('{}: {} (with --trials {} and --refine {})'.format(
            names.get(name, name), what, args.trials,
            ','.join(map(str, args.refine))))
    return problems


def other_seeds(args):
    """Each rerun of ``--out`` of a seed that ``--seeds`` (and, in the fair
    experiment, ``--more-seeds``) does not name: the tables would count
    it against the seeds named ("3/1")."""
    seeds = set(args.seeds) | (set(args.more_seeds) if args.fair is not None
                               else set())
    return ['{}: a rerun with seed {}, not one of --seeds {}'.format(
        path, r['seed'], ','.join(map(str, args.seeds)))
        for path, r in _paths(args.out)
        if r['seed'] and r['seed'] not in seeds]


def other_rounds(args):
    """What in ``--out`` says it was made with another ``--refine``,
    ``--budgets`` or ``--budget-configs``: reruns of a cell whose search
    is one complete round where ``--refine`` gives it two (the study
    reruns a cell's best once its search is complete), a budget run of
    another budget or of a trial outside the best ``--budget-configs``.
    The figure and the tables drawn with them would misreport the
    folder's study (``--model mlp-bn --plot-only`` without its flags)."""
    search, reruns = load(args.out)
    problems = []
    for (b, o), found in sorted(reruns.items()):
        trials = [r['trial'] for r in search.get((b, o), [])]
        # Round one complete, round two never begun, and the reruns made:
        # a search of one round.
        if (b in args.refine and max(trials + [-1]) == args.trials - 1
                and len(trials) == args.trials):
            problems.append('{}: reruns of a search of one round of {} '
                            'trial{}, --refine {} gives it two'.format(
                                os.path.join(args.out, trial_name(
                                    o, b, seed=found[0]['seed']) + '.json'),
                                args.trials, '' if args.trials == 1 else 's',
                                ','.join(map(str, args.refine))))
    budgets = load_budgets(args.out)
    problems += ['{}: a run at {:g}x, not one of --budgets {}'.format(
        os.path.join(args.out, trial_name(o, b, r['trial'],
                                          budget=r['budget']) + '.json'),
        r['budget'], ','.join('{:g}'.format(x) for x in args.budgets))
        for (b, o), found in sorted(budgets.items()) for r in found
        if r['budget'] not in args.budgets]
    for problem in inconsistent_budgets(search, budgets, args.trials,
                                        args.refine, args.budget_configs):
        name, what = problem.split(': ', 1)
        problems.append('{}: {}'.format(
            os.path.join(args.out, name + '.json'), what))
    return problems


def all_tables(args, search, reruns, budgets, only=False):
    """Every table of ``--out``, as ``--tables`` prints them and
    ``--check`` expects them: the study's and, where it has run, the
    pre-tuning's; ``only``: those of ``--batchsizes`` only."""
    pre = load_pretune(args.out)
    defaults, default_reruns = (load_defaults(args.out),
                                load_defaults(args.out, reruns=True))
    if only:  # each keyed by the batch size, or a tuple that begins with it
        search, reruns, budgets, pre, defaults, default_reruns = (
            {k: v for k, v in found.items()
             if (k[0] if isinstance(k, tuple) else k) in args.batchsizes}
            for found in (search, reruns, budgets, pre, defaults,
                          default_reruns))
    if args.fair is not None:
        extra = ['decay_power'] + (['beta2', 'eps'] if any(
            o in recipe.ADAM_LIKE for _, o in search) else [])
        return tables(search, reruns, args.trials, len(args.seeds),
                      args.refine, wanted=fair_wanted(args, reruns),
                      extra=extra) + (pretune_tables(pre, 0) if pre else [])
    return tables(search, reruns, args.trials, len(args.seeds), args.refine,
                  defaults, budgets, args.budgets,
                  args.budget_configs, args.budget_batchsizes,
                  default_reruns) + (
        pretune_tables(pre) if pre else [])


def check(args):
    search, reruns = load(args.out)
    budgets = load_budgets(args.out)
    status = 0
    rates = all_fair_rates(args, search)
    for problem in (inconsistent(search, reruns, args.trials, args.refine,
                                 args.settings, rates)
                    + (fair_problems(args, search, reruns)
                       if args.fair is not None else [])
                    + inconsistent_budgets(search, budgets, args.trials,
                                           args.refine, args.budget_configs)
                    + off_the_curve(args.out)
                    + inconsistent_pretune(load_pretune(args.out))
                    + other_model(args.out, args.model)):
        print(problem)
        status = 1
    for name, r in _records(args.out):
        if not name.startswith(DEFAULTS + '-'):
            continue
        want = TRAINER + ['--batchsize', str(r['batchsize'])] + (
            ['--model', args.model] if args.model != MODELS[0] else []) + [
            '--epoch', str(r['epochs']), '--validation',
            str(r['validation'])]
        if not r['command'].startswith(shlex.join(want) + ' ') or r['flags']:
            print('{}: not a run of the trainer\'s defaults: {}'.format(
                name, r['command']))
            status = 1
    for path in args.check or [README]:
        spans = section(path, args)
        if isinstance(spans, str):
            print(spans)
            status = 1
            continue
        for header, rows in all_tables(args, search, reruns, budgets):
            ok, message = results.check_file(path, header, rows, spans)
            print(message)
            status = status or (0 if ok else 1)
    return status


#: The line before a study's tables in a README that holds several
#: studies: ``<!-- study.py <its flags> --tables -->`` (the main study's:
#: no flag, or its tables before the first such line).
MARKER = '<!-- study.py '


def section(path, args):
    """The spans of lines ``[(first, last)]`` of ``path`` that may hold
    this study's tables: after each marker line that names its flag
    (``--pretuned``, ``--model M``, ``--optimizers ...``; the main study:
    none of these, and the lines before the first marker) up to the next
    marker; ``None`` in a file without markers (the whole file); a
    message where the study has no marker."""
    with open(path) as f:
        lines = f.read().splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    if not marks:
        return None
    flag = ('--fair {:g}'.format(args.fair) if args.fair is not None
            else '--pretuned' if args.settings is not None
            else '--model ' + args.model if args.model != MODELS[0]
            else '--optimizers ' + ','.join(args.optimizers)
            if list(args.optimizers) != list(DEFAULT_OPTIMIZERS) else None)
    named = ['--fair', '--pretuned', '--model', '--optimizers']
    spans = [(0, marks[0])] if flag is None else []
    for i, end in zip(marks, marks[1:] + [len(lines)]):
        words = lines[i].replace('-->', ' ') + ' '
        # The fair experiment's lines name --model too.
        if (' {} '.format(flag) in words and (
                args.fair is not None or ' --fair ' not in words)
                if flag is not None
                else not any(' {} '.format(n) in words for n in named)):
            spans.append((i, end))
    return spans or '{}: no line "{}... {} ... --tables -->" before its ' \
        'tables'.format(path, MARKER, flag)


def reproduce(args):
    """Reruns the command of ``args.reproduce``; 0 when the numbers match."""
    # The user's file, not one of a folder the study fills.
    record = read(args.reproduce, '--reproduce takes a JSON that the study '
                  'wrote, such as examples/mnist/study/lars-b512-t0.json')
    cmd = shlex.split(record['command'])
    n_train = n_training_images(record['validation'])
    # Kept where the trainer fails: its output, named in the message.
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, 'stdout'), 'w') as stdout:
        log = run_command(cmd, os.path.join(folder, 'run'),
                          args.dataset_root, args.device, stdout)
    shutil.rmtree(folder)
    again = measure(log, record['batchsize'], n_train, record['target'],
                    record['validation'])
    if record['test_accuracy'] is None:
        again['test_accuracy'] = None
    verdict, different = compare(record, again, _eval_every(cmd),
                                 n_test_images())
    if 'machine' in record:  # what --reproduce compares across
        print('recorded on: {}\nrun now on:  {}'.format(
            _machine_line(record['machine']), _machine_line(machine())))
    print('\n'.join(different + [verdict]))
    return 1 if verdict.startswith('differs') else 0


def tolerance(eval_every):
    """``TOLERANCE_*`` in words, for a run evaluated every ``eval_every``
    iterations."""
    return ('steps to the target within {} evaluation intervals ({} '
            'steps), accuracies within {:g} point'.format(
                TOLERANCE_INTERVALS, TOLERANCE_INTERVALS * eval_every,
                TOLERANCE_POINTS))


def compare(record, again, eval_every, n_test):
    """``(verdict, differences)`` between a record and its rerun: the
    verdict is ``same`` (every count of correct images and the step to
    the target equal), ``within tolerance: ...`` (``tolerance``, what
    another CPU is expected to change) or ``differs: ...``."""
    different, within = [], True
    steps, now = record['steps_to_target'], again['steps_to_target']
    if steps != now:
        different.append('steps_to_target: recorded {}, now {}'.format(
            steps, now))
        within = (steps is not None and now is not None and abs(
            steps - now) <= TOLERANCE_INTERVALS * eval_every)
    for key, n in (('best_validation', record['validation']),
                   ('test_accuracy', n_test)):
        was, value = record[key], again[key]
        if (was is None) != (value is None):
            different.append('{}: recorded {}, now {}'.format(key, was,
                                                              value))
            within = False
        elif was is not None and count(was, n) != count(value, n):
            different.append('{}: recorded {}, now {} ({} and {} correct of '
                             '{})'.format(key, was, value, count(was, n),
                                          count(value, n), n))
            within = within and (abs(count(was, n) - count(value, n))
                                 <= TOLERANCE_POINTS / 100 * n)
    if not different:
        return 'same', different
    return ('{}: {}'.format('within tolerance' if within else 'differs',
                            tolerance(eval_every))), different


def _eval_every(cmd):
    """The evaluation interval of a recorded command (1 if not given)."""
    if '--eval-every' in cmd:
        return int(cmd[cmd.index('--eval-every') + 1])
    return 1


def n_training_images(validation):
    """The training images left once ``validation`` are held out; exits
    as the trainer does (``data.load_mnist``) where MNIST is missing."""
    return len(data.load_mnist()[0]) - validation


def n_test_images():
    return len(data.load_mnist()[1])


# -- The figure ------------------------------------------------------------

STYLES = {'nesterov': {'color': 'tab:blue', 'marker': 'o'},
          'lars': {'color': 'tab:green', 'marker': 's'},
          'adam': {'color': 'tab:orange', 'marker': 'o'},
          'lamb': {'color': 'tab:purple', 'marker': 's'}}
# How far apart (in doublings of the batch size) the figure draws the
# series of one batch size: the optimizers, the defaults, the sweep.
DODGE = 0.15
# The marker of the steps of each seed of a cell that reached the target
# where some did not: their mean is not the cell's.
PARTLY = '*'
# The least factor from the bottom to the top of the step axis: points a
# few per cent apart filled a narrower axis and looked far apart
# (study-pretuned.png: 57.33 and 58 steps, an axis of 57.3 to 58). A
# factor 2 either side of the points, so the perfect-scaling line runs
# one doubling of the batch size down from them.
STEP_SPAN = 4
# The figure names each optimizer by what sets it apart.
LABELS = {'nesterov': 'Nesterov (no trust ratio)',
          'lars': 'LARS (Nesterov momentum)',
          'adam': 'Adam (no trust ratio)',
          'lamb': 'LAMB (Adam with trust ratio)'}


def rerun_means(done):
    """The mean steps to the target of seeded runs (None if one missed
    it) and their mean best validation accuracy."""
    reached = [r['steps_to_target'] for r in done]
    return (None if None in reached else sum(reached) / len(reached),
            sum(r['best_validation'] for r in done) / len(done))


def cell_summary(records, done, trials, seeds):
    """What the figure shows of a cell: ``(steps, accuracy, complete,
    label, some)``. Complete (all trials and reruns done): the reruns' mean
    steps (None if a seed missed the target) and mean best validation
    accuracy, and where some seeds but not all reached the target, the
    steps of each that did (``some``; the figure draws them apart, as no
    mean of the cell's steps exists) and how many they are (``label``);
    otherwise the best search trial so far and the fraction of the trials
    done."""
    if len(records) >= trials and len(done) >= seeds:
        steps, accuracy = rerun_means(done)
        some = [r['steps_to_target'] for r in done
                if r['steps_to_target'] is not None]
        if len(some) == len(done):
            some = []
        return steps, accuracy, True, (
            '{}/{} seeds reached it'.format(len(some), len(done))
            if some else None), some
    top = best(records)
    label = ('{}/{} trials'.format(len(records), trials)
             if len(records) < trials else
             '{}/{} reruns'.format(len(done), seeds))
    return (top['steps_to_target'],
            max(r['best_validation'] or 0 for r in records), False, label,
            [])


def budget_points(search, budgets, args):
    """What the figure shows of the budget sweep, by optimizer: ``(batch,
    (batch, fewest steps or None, best validation, budget))`` for each
    batch size swept, over the swept trials at every budget (1x: the
    trials themselves)."""
    found = {}
    if not budgets:
        return found
    cells = set(budgets) | {c for c in search
                            if c[0] in args.budget_batchsizes}
    for batchsize, optimizer in sorted(cells):
        records = budgets.get((batchsize, optimizer), [])
        if batchsize not in args.batchsizes:
            continue
        swept = ranked(search.get((batchsize, optimizer), []))[
            :args.budget_configs]
        if not swept:  # --budget-configs 0 on a folder swept before
            continue
        runs = swept + [r for r in records
                        if r['trial'] in {t['trial'] for t in swept}]
        reached = [r for r in runs if r['steps_to_target'] is not None]
        fastest = min(reached, key=lambda r: (
            r['steps_to_target'], r.get('budget', 1))) if reached else None
        found.setdefault(optimizer, []).append((batchsize, (
            batchsize, fastest and fastest['steps_to_target'],
            max(r['best_validation'] or 0 for r in runs),
            fastest.get('budget', 1) if fastest else None)))
    return found


def defaults_points(out, batchsizes, seeds):
    """What the figure shows of the trainer's defaults: ``(batch, steps,
    accuracy)`` for each batch size run, the mean of its ``seeds`` seeded
    reruns where all have run (steps None if one missed the target), as
    the optimizers' points are, else its one run with seed 0; and how many
    points are such means."""
    once, again = load_defaults(out), load_defaults(out, reruns=True)
    found, means = [], 0
    for batchsize in batchsizes:
        done = again.get(batchsize, [])
        if len(done) >= seeds > 0:
            found.append((batchsize,) + rerun_means(done))
            means += 1
        elif batchsize in once:
            r = once[batchsize]
            found.append((batchsize, r['steps_to_target'],
                          r['best_validation']))
    return found, means


def _mean_of(n, what):
    """'mean of 3 seeded reruns', or 'one seeded rerun'."""
    return 'one ' + what if n == 1 else 'mean of {} {}s'.format(n, what)


def plot(args):
    """Steps to the target and best validation accuracy against batch size.

    One line per optimizer; a filled marker is a complete cell (the mean
    of its seeded reruns), a hollow one a cell still being searched (its
    best trial so far, labelled with the trials done), a star each seed
    that reached the target in a cell where some did not. The dotted line
    is perfect scaling: the steps halve as the batch doubles, from the
    fewest steps at the smallest batch size drawn down to the fewest steps
    drawn. The series of a batch size are drawn side by side around it
    (``DODGE``), the budget sweep's labels where they cross no line
    (``place_labels``), the legend below the panels. The fair experiment
    has its own figure (``plot_fair``). Returns the figure (closed), which
    the tests read.
    """
    if args.fair is not None:
        return plot_fair(args)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from examples import plotting

    # The lines join the batch sizes in order, whatever order ran them.
    args = argparse.Namespace(**dict(vars(args),
                                     batchsizes=sorted(args.batchsizes)))
    search, reruns = load(args.out)
    swept = budget_points(search, load_budgets(args.out), args)
    runs, seeded = defaults_points(args.out, args.batchsizes,
                                   len(args.seeds))
    # Each series side by side around its batch size, DODGE apart (in
    # doublings of the batch), so that points of equal steps all show:
    # the defaults, the optimizers, the budget sweep of each optimizer
    # (LARS's three, within a few steps of each other, a slot apart).
    slots = ([DEFAULTS] if runs else []) + [
        o for o in args.optimizers
        if any(search.get((b, o)) for b in args.batchsizes)] + [
        ('budget', o) for o in args.optimizers if swept.get(o)]

    def at(slot, batchsize):
        shift = slots.index(slot) - (len(slots) - 1) / 2
        return batchsize * 2 ** (shift * DODGE)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 5.2))
    anchors, labels = [], []
    under_way = partly = False
    for row, optimizer in enumerate(args.optimizers):
        style = STYLES.get(optimizer, {})
        color = style.get('color')
        points = []
        for batchsize in args.batchsizes:
            records = search.get((batchsize, optimizer))
            if records:
                points.append((at(optimizer, batchsize),) + cell_summary(
                    records, reruns.get((batchsize, optimizer), []),
                    trials_of(batchsize, args.trials, args.refine),
                    len(args.seeds)) + (batchsize,))
                under_way = under_way or not points[-1][3]
        label = LABELS.get(optimizer, optimizer)
        for ax, index in ((left, 1), (right, 2)):
            drawn = [(p[0], p[index]) for p in points if p[index] is not None]
            ax.plot([b for b, _ in drawn], [v for _, v in drawn],
                    color=color, marker=style.get('marker'), label=label)
            for p in points:
                if p[index] is None:
                    continue
                ax.plot([p[0]], [p[index]], linestyle='none',
                        marker=style.get('marker'), color=color,
                        markerfacecolor=color if p[3] else 'white')
                if p[4] and (index == 1 or not p[3]):
                    ax.annotate(p[4], xy=(p[0], p[index]), xytext=(5, 3),
                                textcoords='offset points', fontsize=7,
                                color=color)
        for p in points:
            if p[5]:  # a complete cell some of whose seeds reached it
                left.plot([p[0]] * len(p[5]), p[5], linestyle='none',
                          marker=PARTLY, color=color, markersize=9,
                          markerfacecolor='white')
                left.annotate(p[4], xy=(p[0], min(p[5])), xytext=(7, -3),
                              textcoords='offset points', fontsize=7,
                              color=color)
                partly = True
            elif p[1] is None:  # a triangle under the top edge
                left.plot([p[0]], [0.97 - 0.04 * row], linestyle='none',
                          marker='v', color=color, markerfacecolor='white',
                          transform=left.get_xaxis_transform())
            else:  # the batch size, the steps, the x drawn
                anchors.append((p[-1], p[1], p[0]))
    for row, optimizer in enumerate(args.optimizers):
        drawn = [(at(('budget', optimizer), b), p)
                 for b, p in swept.get(optimizer, [])]
        if not drawn:
            continue
        color = STYLES.get(optimizer, {}).get('color')
        for ax, index in ((left, 1), (right, 2)):
            line = [(x, p[index]) for x, p in drawn if p[index] is not None]
            ax.plot([x for x, _ in line], [v for _, v in line], color=color,
                    marker='D', markerfacecolor='white', linestyle='--')
        # Placed once the panels are laid out (``place_labels``).
        labels += [('{}, {:g}x'.format(p[1], p[3]), (x, p[1]), color)
                   for x, p in drawn if p[1] is not None]
        for x, p in drawn:
            if p[1] is None:  # under the top edge, as the search's
                left.plot([x], [0.97 - 0.04 * row], linestyle='none',
                          marker='D', color=color, markerfacecolor='white',
                          transform=left.get_xaxis_transform())
    for ax, index in ((left, 1), (right, 2)):
        drawn = [(at(DEFAULTS, p[0]), p[index]) for p in runs
                 if p[index] is not None]
        if drawn:
            # Under the optimizers' lines, which it may cross.
            ax.plot([b for b, _ in drawn], [v for _, v in drawn],
                    color='gray', marker='x', linestyle='--', zorder=1.5,
                    label="LARS, the trainer's defaults ({})".format(
                        _mean_of(len(args.seeds), 'seed')
                        if seeded == len(runs) else 'one run each'
                        if not seeded else '{}, seed 0 where not yet '
                        'run'.format(_mean_of(len(args.seeds), 'seed'))))
    for b, steps, _ in runs:
        if steps is None:
            left.plot([at(DEFAULTS, b)],
                      [0.97 - 0.04 * len(args.optimizers)],
                      linestyle='none', marker='v', color='gray',
                      markerfacecolor='white',
                      transform=left.get_xaxis_transform())
    if anchors:
        # From the point of the fewest steps at the smallest batch size,
        # shifted as it is drawn.
        smallest, steps, x = min(anchors)
        drawn = [v for line in left.get_lines()
                 if line.get_transform() is left.transData
                 for v in line.get_ydata()]
        # Down to the fewest steps drawn, no further: below them the line
        # alone stretched the log axis (to 5 steps in study.png). Where the
        # points span less than ``STEP_SPAN``, the axis spans that, centred
        # (on the log scale) on them, and the line runs to its bottom.
        low, high = min(drawn), max(drawn)
        if high / low < STEP_SPAN:
            low = math.sqrt(low * high / STEP_SPAN)
            left.set_ylim(low, low * STEP_SPAN)
        end = min(max(args.batchsizes), smallest * steps / low)
        sizes = numpy.array([b for b in args.batchsizes
                             if smallest <= b < end] + [end], dtype=float)
        left.plot(sizes * x / smallest, steps * smallest / sizes,
                  color='gray', linestyle=':', label='perfect scaling')
    else:  # no cell has reached the target yet
        left.set_ylim(1, 1000)
    left.set_yscale('log')
    # Room above the highest point for the triangles of the top edge: the
    # points in the lower 88 % of the (log) axis.
    low, high = left.get_ylim()
    top = max([v for line in left.get_lines() if line.get_transform()
               is left.transData for v in line.get_ydata()] or [high])
    left.set_ylim(low, max(high, low * (top / low) ** (1 / 0.88)))
    # 20, 50, 200: the axis spans two or three decades.
    plotting.plain_log_ticks(left.yaxis, minor=(2, 5))
    left.set_ylabel('steps to {:g} % validation accuracy'.format(
        100 * args.target))
    right.set_ylabel('best validation accuracy (%)')
    right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: '{:g}'.format(round(100 * v, 2))))
    right.axhline(args.target, color='gray', linestyle=':', linewidth=1)
    right.annotate('target', xy=(0.01, args.target),
                   xycoords=('axes fraction', 'data'), xytext=(0, 3),
                   textcoords='offset points', fontsize=8, color='gray')
    for ax in (left, right):
        ax.set_xscale('log', base=2)
        ax.set_xlim(min(args.batchsizes) / 1.5, max(args.batchsizes) * 2)
        ax.set_xticks(args.batchsizes)
        ax.set_xticklabels([str(b) for b in args.batchsizes])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel('batch size')
        ax.grid(True, which='both', alpha=0.4)
    handles, _ = left.get_legend_handles_labels()
    if swept:
        handles.append(matplotlib.lines.Line2D(
            [], [], linestyle='--', marker='D', color='gray',
            markerfacecolor='white', label='budget sweep, {:g}x-{:g}x the '
            'epochs (seed 0):\nfewest steps (left), best validation of any '
            'run (right)'.format(
                min([1] + args.budgets), max([1] + args.budgets))))
    if partly:
        handles.append(matplotlib.lines.Line2D(
            [], [], linestyle='none', marker=PARTLY, color='gray',
            markersize=9, markerfacecolor='white',
            label='k/{} seeds reached it: the steps of each that '
            'did'.format(len(args.seeds))))
    handles.append(matplotlib.lines.Line2D(
        [], [], linestyle='none', marker='v', color='gray',
        markerfacecolor='white', label='none reached it (top edge)'))
    # Below both panels: inside, it covered the points of the lower left.
    legend = left.legend(handles=handles, fontsize=8, ncol=3,
                         loc='lower center', bbox_to_anchor=(0.5, 0.01),
                         bbox_transform=figure.transFigure)
    legend.set_in_layout(False)
    refined = [b for b in args.batchsizes if b in args.refine]
    figure.suptitle('MNIST MLP{}, each cell tuned by {} trial{}{} on 10,000 '
                    'held-out images; {}: {} of the best{}'.format(
                        ' with BatchNorm' if args.model == 'mlp-bn' else '',
                        args.trials, '' if args.trials == 1 else 's',
                        ' ({} at {})'.format(
                            2 * args.trials, ' and '.join(
                                str(b) for b in refined)) if refined else '',
                        'filled' if under_way else 'each point',
                        _mean_of(len(args.seeds), 'seeded rerun'),
                        ', hollow: search under way' if under_way else ''),
                    fontsize=9)
    # The panels above the legend.
    height = legend.get_window_extent(figure.canvas.get_renderer()).height
    figure.tight_layout(rect=(0, height / figure.bbox.height + 0.01, 1, 1))
    place_labels(figure, left, labels)
    save(figure, args.figure)
    plt.close(figure)
    return figure


#: Where ``place_labels`` tries a label, in this order, around its point
#: (offset in points, horizontal and vertical alignment).
LABEL_PLACES = [((0, 7), 'center', 'bottom'), ((7, 0), 'left', 'center'),
                ((0, -7), 'center', 'top'), ((-7, 0), 'right', 'center'),
                ((6, 5), 'left', 'bottom'), ((6, -5), 'left', 'top')]


def place_labels(figure, ax, labels):
    """Annotates ``ax`` with each ``(text, xy, color)`` of ``labels`` at
    the first of ``LABEL_PLACES`` where the text crosses no line, marker
    or label drawn and stays inside the axes (else at the first): the
    budget sweep's labels were struck through by its dashed lines."""
    from matplotlib.path import Path
    from matplotlib.transforms import Bbox
    renderer = figure.canvas.get_renderer()
    lines, boxes = [], []
    for line in ax.get_lines():
        points = line.get_transform().transform(line.get_xydata())
        if line.get_linestyle() not in ('None', '') and len(points) > 1:
            lines.append(Path(points))
        if line.get_marker() not in (None, 'None', ''):
            size = line.get_markersize() * figure.dpi / 72 / 2
            boxes += [Bbox([p - size, p + size]) for p in points]
    boxes += [t.get_window_extent(renderer) for t in ax.texts]
    for text, xy, color in labels:
        def put(place):
            offset, ha, va = place
            return ax.annotate(text, xy=xy, xytext=offset, ha=ha, va=va,
                               textcoords='offset points', fontsize=7,
                               color=color)
        for place in LABEL_PLACES:
            label = put(place)
            box = label.get_window_extent(renderer).padded(1)
            if (ax.bbox.contains(box.x0, box.y0)
                    and ax.bbox.contains(box.x1, box.y1)
                    and not any(path.intersects_bbox(box, filled=False)
                                for path in lines)
                    and not any(box.overlaps(b) for b in boxes)):
                break
            label.remove()
        else:  # nowhere clear: the first place
            label = put(LABEL_PLACES[0])
        boxes.append(label.get_window_extent(renderer))


def plot_fair(args):
    """The fair experiment's figure: for each pair, on top each pilot run
    and search trial's best validation accuracy against its rate relative
    to its optimizer's working rate (the pilot's best), below the
    validation curves of the reruns of each optimizer's best trial, a
    dot where a rerun first reached the target. Returns the figure
    (closed)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    search, reruns = load(args.out)
    pilots = load_pretune(args.out)
    arms = {c[1] for c in search} | {o for _, o, _ in pilots}
    pairs = [p for p in PAIRS if arms & set(p)]
    figure, axes = plt.subplots(2, max(1, len(pairs)), squeeze=False,
                                figsize=(max(8, 5.5 * len(pairs)), 9.5))
    low = 100 * args.target - 4  # the lowest accuracy drawn
    for column, pair in enumerate(pairs):
        top, bottom = axes[0][column], axes[1][column]
        for optimizer in pair:
            style = STYLES.get(optimizer, {})
            color = style.get('color')
            for batchsize in args.batchsizes:
                pilot = pilots.get((batchsize, optimizer, 'pilot'), [])
                if len(pilot) < len(PILOT):
                    continue
                rate = working(pilot)['flags']['lr']
                trials = search.get((batchsize, optimizer), [])
                for records, marker, what in (
                        (pilot, 'x', 'pilot'),
                        ([r for r in trials if r['trial'] < args.trials],
                         'o', 'round one'),
                        ([r for r in trials if r['trial'] >= args.trials],
                         's', 'round two')):
                    x = [r['flags']['lr'] / rate for r in records]
                    y = [100 * (r['best_validation'] or 0)
                         for r in records]
                    top.plot([a for a, b in zip(x, y) if b > low],
                             [b for b in y if b > low], linestyle='none',
                             marker=marker, color=color,
                             markerfacecolor='none')
                    # Below the axis: a triangle on its bottom edge.
                    top.plot([a for a, b in zip(x, y) if b <= low],
                             [low] * sum(b <= low for b in y),
                             linestyle='none', marker='v', color=color,
                             markerfacecolor='none')
                done = reruns.get((batchsize, optimizer), [])
                for i, r in enumerate(done):
                    steps = [p[0] for p in r['curve']]
                    accuracy = [100 * p[1] for p in r['curve']]
                    bottom.plot(steps, accuracy, color=color, linewidth=1,
                                alpha=0.8, label='{}: best trial ({}), '
                                'seeds {}'.format(
                                    LABELS.get(optimizer, optimizer),
                                    r['trial'], ', '.join(
                                        str(d['seed']) for d in done))
                                if i == 0 else None)
                    if r['steps_to_target'] is not None:
                        at = dict(r['curve'])[r['steps_to_target']]
                        bottom.plot([r['steps_to_target']], [100 * at],
                                    marker='o', color=color)
        for ax in (top, bottom):
            ax.axhline(100 * args.target, color='gray', linestyle=':',
                       linewidth=1)
            ax.grid(True, alpha=0.4)
        top.set_xscale('log')
        top.set_ylim(low - 0.2, 100 * args.target + 1.2)
        top.set_xlabel('rate / working rate (the pilot\'s best)')
        top.set_ylabel('best validation accuracy (%)')
        handles = [matplotlib.lines.Line2D(
            [], [], color=STYLES.get(o, {}).get('color'),
            label=LABELS.get(o, o)) for o in pair] + [
            matplotlib.lines.Line2D([], [], linestyle='none', marker=m,
                                    color='gray', markerfacecolor='none',
                                    label=what)
            for m, what in (('x', 'pilot'), ('o', 'search, round one'),
                            ('s', 'search, round two'),
                            ('v', '{:g} % or below'.format(low)))]
        top.legend(handles=handles, fontsize=7, ncol=3, loc='upper center',
                   bbox_to_anchor=(0.5, -0.13))
        bottom.set_ylim(low, 100 * args.target + 1.2)
        bottom.set_xlabel('step')
        bottom.set_ylabel('validation accuracy (%)')
        if bottom.get_legend_handles_labels()[0]:
            # Below the axes, as the top's: inside, the curves rising
            # from below the axis ran under it wherever it stood.
            bottom.legend(fontsize=7, loc='upper center',
                          bbox_to_anchor=(0.5, -0.13))
        top.set_title(' against '.join(LABELS.get(o, o) for o in pair),
                      fontsize=9)
    epochs = sorted({r['epochs'] for rs in list(search.values())
                     + list(pilots.values()) for r in rs})
    figure.suptitle(
        'The fair experiment: MNIST MLP{}, batch {}, {} epochs ({:g}x the '
        "search's);\nthe same pilot, search and reruns for each optimizer"
        .format(' with BatchNorm' if args.model == 'mlp-bn' else '',
                ', '.join(str(b) for b in args.batchsizes),
                ', '.join(str(e) for e in epochs), args.fair), fontsize=9)
    figure.tight_layout()
    save(figure, args.figure)
    plt.close(figure)
    return figure


def figure_name(args):
    """The default figure's name: ``study.png``, ``study-<model>.png``
    for another ``--model``, with ``-pretuned`` or ``-fair-x<BUDGET>``
    before ``.png``."""
    return 'study{}{}{}.png'.format(
        '' if args.model == MODELS[0] else '-' + args.model,
        '-' + PRETUNED if args.pretuned else '',
        '' if args.fair is None else '-{}-x{:g}'.format(FAIR, args.fair))


def save(figure, path):
    """Writes the figure whole or not at all (as ``write`` the JSONs),
    its folder made where missing (``figure_problem`` checked it), and
    says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        # The format from the name, not from that of the partial file.
        figure.savefig(path + '.tmp', format=os.path.splitext(path)[1][1:])
        os.replace(path + '.tmp', path)
    finally:
        if os.path.exists(path + '.tmp'):
            os.remove(path + '.tmp')
    print('  the figure: {}'.format(path), flush=True)


def figure_problem(path):
    """Why the figure cannot be written at ``path``, or None: a folder,
    a name matplotlib takes no format from, a folder that cannot be made
    or written in."""
    from matplotlib.backend_bases import FigureCanvasBase
    if os.path.isdir(path):
        return 'a folder, not a file'
    kind = os.path.splitext(path)[1][1:]
    if kind.lower() not in FigureCanvasBase.get_supported_filetypes():
        return '{}: end its name in .png, .pdf, .svg or another format ' \
            'matplotlib writes'.format(
                'no format .' + kind if kind else 'no format in its name')
    folder = os.path.dirname(os.path.abspath(path))
    problem = folders.folder_problem(folder, create=True)
    return None if problem is None else '{}: {}'.format(folder, problem)


def _seed(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(
            'a rerun\'s seed is 1 or more (seed 0 is the search trial\'s '
            'own: its rerun would repeat the trial)')
    return value


def _budget(text):
    value = float(text)
    if not (0 < value < math.inf) or value == 1:
        raise argparse.ArgumentTypeError(
            'a positive multiple other than 1 (1x is the trial itself)')
    return value


def _multiple(text):
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError('a positive multiple')
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batchsizes', action=results.ListFlag,
                        type=results._integer(1),
                        help='Batch sizes (default: {}; {} with --fair)'
                        .format(BATCHSIZES, [FAIR_BATCHSIZE]))
    parser.add_argument('--optimizers', action=results.ListFlag,
                        default=DEFAULT_OPTIMIZERS,
                        help='From {} (default: %(default)s)'.format(
                            ', '.join(OPTIMIZERS)))
    parser.add_argument('--trials', type=results._integer(1),
                        default=TRIALS, help='Trials per cell and round '
                        '(default: %(default)s)')
    # --refine and the budget sweep's flags: None where not given, which
    # --fair, with its own rounds and no sweep, refuses.
    parser.add_argument('--refine', action=results.ListFlag,
                        type=results._integer(0),
                        help='Batch sizes with a second round, its rates '
                        'around the best of the first; 0 for none (default: '
                        '{}; every batch size with --fair)'.format(REFINED))
    parser.add_argument('--seeds', action=results.ListFlag,
                        type=_seed, default=SEEDS,
                        help='Seeds of the reruns, 1 or more (seed 0 is the '
                        'search\'s) (default: %(default)s)')
    parser.add_argument('--budgets', action=results.ListFlag,
                        type=_budget,
                        help='The budget sweep: multiples of the epoch '
                        'budget to run the best trials at, beside 1x (the '
                        'trials themselves), each a whole number of epochs '
                        'at every batch size swept (default: {})'.format(
                            BUDGETS))
    parser.add_argument('--budget-batchsizes', action=results.ListFlag,
                        type=results._integer(1),
                        help='The batch sizes of the budget sweep (default: '
                        '{})'.format(BUDGET_BATCHSIZES))
    parser.add_argument('--budget-configs', type=results._integer(0),
                        help='How many of the best trials of a cell the '
                        'budget sweep runs; 0 for no sweep (default: {}; '
                        '0 with --fair)'.format(BUDGET_CONFIGS))
    parser.add_argument('--pretune', action='store_true',
                        help='Run only the pre-tuning: for each optimizer, '
                        'a pilot of {} rates around its rule finds its '
                        'working rate, then weight decay ({}) crossed with '
                        'decay power ({}) at it, into <out>/{}/'.format(
                            len(PILOT), ', '.join(
                                '{:g}'.format(w) for w in WEIGHT_DECAYS),
                            ', '.join('{:g}'.format(p)
                                      for p in DECAY_POWERS), PRETUNE))
    parser.add_argument('--pretuned', action='store_true',
                        help='The search (and its reruns) with the '
                        'settings of the pre-tuning: each optimizer\'s '
                        'rate range centred on its working rate, its best '
                        'weight decay and decay power, warm-up up to half '
                        'the run; into <out>/{}/'.format(PRETUNED))
    parser.add_argument('--fair', type=_multiple, metavar='BUDGET',
                        help='The fair experiment, at BUDGET times the '
                        'epochs of the search: for each optimizer a pilot '
                        'of {} rates around its rule, then {} trials in two '
                        'rounds over the rate ({:g} decades either side of '
                        'the working rate, then half that around round '
                        'one\'s best), warm-up up to {:g} %% of the run, '
                        'decay power, label smoothing and, for adam and '
                        'lamb, beta2 and eps, momentum {:g}; the best '
                        'rerun with --seeds, and --more-seeds where the '
                        'two arms\' ranges overlap; into <out>/fair-x'
                        'BUDGET/'.format(len(PILOT), 2 * FAIR_TRIALS,
                                         FAIR_SPAN, 100 * FAIR_WARMUP_CAP,
                                         FAIR_MOMENTUM))
    parser.add_argument('--more-seeds', action=results.ListFlag,
                        type=_seed, default=MORE_SEEDS,
                        help='--fair: the seeds of more reruns where the '
                        'arms\' ranges of steps overlap (default: '
                        '%(default)s)')
    parser.add_argument('--pretune-batchsize', type=results._integer(1),
                        default=PRETUNE_BATCHSIZE,
                        help='The batch size of the pre-tuning (default: '
                        '%(default)s)')
    parser.add_argument('--model', choices=MODELS,
                        help='The trainer\'s --model; the JSONs of mlp-bn '
                        'go to examples/mnist/study/mlp-bn/, its figure to '
                        'study-mlp-bn.png (default: {})'.format(MODELS[0]))
    parser.add_argument('--epochs', type=results._integer(1),
                        help='One epoch budget for every batch size '
                        '(default: {})'.format(', '.join(
                            '{} for {}'.format(e, b)
                            for b, e in EPOCHS.items())))
    parser.add_argument('--validation', type=results._integer(1),
                        help='Training images held out (default: '
                        '{})'.format(VALIDATION))
    parser.add_argument('--target', type=float,
                        help='Validation accuracy target (default: '
                        '{})'.format(TARGET))
    parser.add_argument('--device', '-d', default='-1')
    parser.add_argument('--dataset-root',
                        help='Passed on to train_mnist.py')
    parser.add_argument('--out',
                        help='Folder of the JSONs (default: '
                        'examples/mnist/study, or study/<model> for '
                        'another --model)')
    parser.add_argument('--runs', default='result_study',
                        help='Folder of the runs (default: %(default)s)')
    parser.add_argument('--figure',
                        help='The figure, drawn after each run and by '
                        '--plot-only (default: study.png, study-<model>.png '
                        'for another --model, with -pretuned or '
                        '-fair-x<BUDGET> before .png for --pretuned or '
                        '--fair; in examples/mnist/ for the default --out, '
                        'else in --out)')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Do not redraw the figure after each trial')
    parser.add_argument('--check', nargs='*', metavar='FILE',
                        help='Run nothing: check that each FILE (default: '
                        'examples/mnist/README.md) holds the tables of the '
                        'JSONs in --out; exit 1 where one does not')
    parser.add_argument('--reproduce', metavar='FILE',
                        help='Rerun the trial of a JSON in a temporary '
                        'folder; print what changed, then same, within '
                        'tolerance (what another CPU is expected to '
                        'change) or differs (exit 1)')
    parser.add_argument('--tables', action='store_true',
                        help='Run nothing: print the Markdown tables of the '
                        'JSONs in --out, as --check expects them')
    parser.add_argument('--plot-only', action='store_true',
                        help='Run nothing: draw the figure from the JSONs')
    args = parser.parse_args(argv)
    # The settings of a trial named on the command line: a task that only
    # reads the JSONs refuses a folder made with others (``other_settings``).
    given = {name for name in ('batchsizes', 'model', 'target', 'validation',
                               'epochs') if getattr(args, name) is not None}
    for name, value in (('model', MODELS[0]), ('target', TARGET),
                        ('validation', VALIDATION)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batchsizes is None:
        args.batchsizes = (BATCHSIZES if args.fair is None
                           else [FAIR_BATCHSIZE])
    tasks = [flag for flag, on in (
        ('--check', args.check is not None),
        ('--reproduce', args.reproduce is not None),
        ('--tables', args.tables), ('--plot-only', args.plot_only)) if on]
    if len(tasks) > 1:
        parser.error('{} are {} tasks: give one'.format(
            ' and '.join(tasks), len(tasks)))
    for name in ('out', 'runs', 'dataset_root'):
        if getattr(args, name) == '':  # it would be the current folder
            parser.error("--{} '': {}".format(name.replace('_', '-'),
                                              folders.folder_problem(
                                                  '', create=False)))
    task = ('--check' if args.check is not None else '--tables'
            if args.tables else '--plot-only' if args.plot_only else None)
    # A run writes into --out and --runs: each checked before anything
    # runs (a file named --out failed in write() after a whole trial).
    running = task is None and args.reproduce is None
    # The committed figures are of the committed folders: the figure of
    # another --out goes into it, not over them.
    default_out = args.out is None or os.path.abspath(
        args.out) == os.path.abspath(model_out(args.model))
    if args.out is None:
        args.out = model_out(args.model)
    given_out = args.out
    for flag, path in ((('--out', args.out), ('--runs', args.runs))
                       if running else ()):
        problem = folders.folder_problem(path, create=True)
        if problem is not None:
            parser.error('{} {}: {}'.format(flag, path, problem))
    if args.figure is None:
        args.figure = os.path.join(HERE if default_out else given_out,
                                   figure_name(args))
    for name in ('seeds', 'more_seeds'):
        if not getattr(args, name):  # '--seeds ,'
            parser.error('--{}: no seed given'.format(name.replace('_', '-')))
    sweep = [name for name in ('refine', 'budgets', 'budget_batchsizes',
                               'budget_configs')
             if getattr(args, name) is not None]
    for name, value in (('refine', REFINED), ('budgets', BUDGETS),
                        ('budget_batchsizes', BUDGET_BATCHSIZES),
                        ('budget_configs', BUDGET_CONFIGS)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.fair is not None:
        if args.pretune or args.pretuned:
            parser.error('--fair has a pilot of its own: give it without '
                         '--pretune and --pretuned')
        if sweep:
            # Set below whatever was given: say so rather than ignore it.
            parser.error('--fair searches two rounds at every batch size '
                         'and runs no budget sweep: give it without {}'
                         .format(' and '.join(
                             '--' + n.replace('_', '-') for n in sweep)))
        args.out = os.path.join(args.out, '{}-x{:g}'.format(FAIR, args.fair))
        args.refine = list(args.batchsizes)
        args.budget_configs = 0
    for name in args.optimizers:
        if name not in OPTIMIZERS:
            parser.error('--optimizers {}: choose from {}'.format(
                name, ', '.join(OPTIMIZERS)))
    args.settings = None
    if args.pretuned:
        if args.pretune:
            parser.error('--pretune runs the pre-tuning, --pretuned the '
                         'search after it: give one')
        args.settings = pretuned_settings(
            args.out, args.pretune_batchsize, args.optimizers)
        args.out = os.path.join(args.out, PRETUNED)
    if not 0 < args.target <= 1:
        parser.error('--target must be in (0, 1], got {}'.format(
            args.target))
    # --fair's and --pretuned's folder inside --out.
    problem = running and folders.folder_problem(args.out, create=True)
    if problem:
        parser.error('--out {} ({}): {}'.format(given_out, args.out,
                                                problem))
    problem = (args.plot_only or running and args.plot) and figure_problem(
        args.figure)
    if problem:
        parser.error('--figure {}: {}'.format(args.figure, problem))
    if args.dataset_root is not None:
        import chainer
        chainer.dataset.set_dataset_root(args.dataset_root)
    problem = task and no_study(args.out)
    if problem:
        # Else the tables came out empty (--check: a diff), with status 0,
        # and --plot-only drew an empty figure over the study's.
        parser.error('--out {}: {}; {} reads the JSONs of a study '
                     'there'.format(given_out if given_out == args.out
                                    else '{} ({})'.format(given_out,
                                                          args.out),
                                    problem, task))
    if args.check is not None:
        return check(args)
    if args.reproduce is None:
        # Where the study runs, every setting is this invocation's.
        problems = other_settings(args, given | {'flags'} if task else {
            'model', 'target', 'validation', 'epochs', 'flags'})
        if task:
            problems += other_seeds(args) + other_rounds(args)
            held = {r['batchsize'] for _, r in _paths(args.out)}
            problems += ['--batchsizes {}: no JSON of that batch size'.format(
                b) for b in args.batchsizes
                if 'batchsizes' in given and b not in held]
        if problems:
            parser.error('--out {}: {}{}; give another --out for these '
                         'settings, or those it was made with'.format(
                             args.out, problems[0], ' (and {} more)'.format(
                                 len(problems) - 1) if problems[1:] else ''))
    if args.reproduce is not None:
        if not os.path.isfile(args.reproduce):
            parser.error('--reproduce {}: no such file'.format(
                args.reproduce))
        return reproduce(args)
    if args.tables:
        search, reruns = load(args.out)
        for header, rows in all_tables(args, search, reruns,
                                       load_budgets(args.out),
                                       'batchsizes' in given):
            print('\n'.join(results.markdown_table(header, rows)) + '\n')
        return 0
    if args.plot_only:
        plot(args)
        return 0
    for name in args.batchsizes:
        if args.epochs is None and name not in EPOCHS:
            parser.error('--batchsizes {}: no epoch budget for it; give '
                         '--epochs'.format(name))
        epochs = args.epochs or EPOCHS[name]
        if args.fair is not None and epochs * args.fair != int(
                epochs * args.fair):
            parser.error('--fair {:g}: {:g} times the {} epochs of batch '
                         'size {} is not a whole number of epochs'.format(
                             args.fair, args.fair, epochs, name))
    for name in args.budget_batchsizes if args.budget_configs else ():
        epochs = args.epochs or EPOCHS.get(name)
        for budget in args.budgets if epochs else ():
            if epochs * budget != int(epochs * budget):
                parser.error('--budgets {:g}: {:g} times the {} epochs of '
                             'batch size {} is not a whole number of '
                             'epochs'.format(budget, budget, epochs, name))
    args.n_train = n_training_images(args.validation)
    args.machine = machine()
    os.makedirs(args.runs, exist_ok=True)
    # SIGTERM stops the study as Ctrl-C does, its current run with it.
    results.stop_on_sigterm()
    if args.pretune:
        if args.epochs is None and args.pretune_batchsize not in EPOCHS:
            parser.error('--pretune-batchsize {}: no epoch budget for it; '
                         'give --epochs'.format(args.pretune_batchsize))
        pretune(args)
    elif args.fair is not None:
        fair(args)
    else:
        study(args)
    if not getattr(args, 'runs_made', 0):
        print('nothing to run: every run of these settings has its JSON in '
              '{} (--tables prints the tables)'.format(os.path.join(
                  args.out, PRETUNE) if args.pretune else args.out),
              flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
