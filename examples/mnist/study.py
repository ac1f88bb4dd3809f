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
validation accuracy first reached the target (98 %), its best validation
accuracy and its command, in ``<out>/<optimizer>-b<B>-t<trial>.json``.
At the batch sizes of ``--refine`` (8192 and 16384) a second round of as
many trials follows, at the next points of the same sequence, with the
rate over half a decade either side of the rate of the cell's best trial
of round one (the other dimensions as before). Each complete cell's best
trial (of both rounds) (fewest steps to the target; if none
reached it, the best validation accuracy) is then rerun with seeds 1, 2
and 3, which evaluate the test set once, after the last epoch
(``<optimizer>-b<B>-best-s<seed>.json``). Trials are run round by round
(trial 0 of every cell, then trial 1, ...), so that every cell has
results early; what is done (its JSON exists) is skipped, so an
interrupted study continues where it stopped.

    python examples/mnist/study.py

``--check`` runs nothing: it builds the tables from the JSONs and checks
that ``examples/mnist/README.md`` holds them, and that each JSON is what
the study would write now (a search trial's flags are its point's, a
rerun is of its cell's best trial); it exits with 1 where not. Beside the
search, the trainer runs on its defaults at each batch size, measured the
same way (``defaults-b<B>.json``): a third table compares them with the
tuned trials.
``--reproduce FILE`` reruns the trial of one JSON in a temporary folder
and prints ``same`` or what differs (exit 1). ``--plot`` draws the figure
from the JSONs.
"""

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import numpy

if not __package__:  # run as a file: examples/README.md
    import _examples_path  # NOQA
from examples import recipe  # NOQA: E402 (after the path is set)
from examples.mnist import results  # NOQA: E402


HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'study')
README = os.path.join(HERE, 'README.md')
FIGURE = os.path.join(HERE, 'study.png')

# lars runs with Nesterov momentum, so that the trust ratio is the only
# difference from nesterov (examples/recipe.py).
OPTIMIZERS = {'nesterov': ['--optimizer', 'nesterov'],
              'lars': ['--optimizer', 'lars', '--nesterov'],
              # LAMB against its baseline, Adam: the rate is their alpha,
              # the momentum their beta1.
              'adam': ['--optimizer', 'adam'],
              'lamb': ['--optimizer', 'lamb']}
# The study of examples/mnist/README.md's first tables; adam and lamb have
# their own (--optimizers adam,lamb --out examples/mnist/study-lamb).
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


def points(n, seed=SEARCH_SEED):
    """``n`` points of the unit hypercube, one per trial: Halton points 1 to
    ``n`` in bases 2, 3, 5, 7, shifted modulo 1 by a random vector drawn
    from ``seed`` (a Cranley-Patterson rotation)."""
    shift = numpy.random.RandomState(seed).uniform(size=len(PRIMES))
    return [[(halton(i, p) + s) % 1.0 for p, s in zip(PRIMES, shift)]
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


def hyperparameters(optimizer, batchsize, epochs, u, around=None):
    """The flags of the trial at the point ``u`` of the unit hypercube.

    The dimensions in order of their expected weight, since the first bases
    of the Halton sequence spread their first points best: the rate (base
    2), the momentum (3), the warm-up (5), the label smoothing (7). The
    rate spans a decade either side of ``center_lr``, or, in round two,
    half a decade either side of ``around`` (round one's best rate).
    """
    if around is None:
        lr = center_lr(optimizer, batchsize) * 10 ** (-1 + 2 * u[0])
    else:
        lr = around * 10 ** (-0.5 + u[0])
    return {'lr': _round(lr),
            'momentum': _round(1 - 10 ** (-2 + 1.5 * u[1])),
            'warmup_epochs': _round(0.4 * epochs * u[2]),
            'label_smoothing': _round(0.2 * u[3])}


def trials_of(batchsize, trials, refine):
    """The trials of a cell: one round, two at the batch sizes refined."""
    return trials * (2 if batchsize in refine else 1)


def search_flags(optimizer, batchsize, epochs, trial, trials, records):
    """The flags of search trial ``trial`` of a cell of ``trials`` trials
    a round; a trial of round two centres its rate on the best of round
    one's ``records`` (None while round one is not complete)."""
    u = points(trial + 1)[trial]
    if trial < trials:
        return hyperparameters(optimizer, batchsize, epochs, u)
    first = [r for r in records if r['trial'] < trials]
    if len(first) < trials:
        return None
    return hyperparameters(optimizer, batchsize, epochs, u,
                           around=best(first)['flags']['lr'])


def eval_every(batchsize, n_train):
    """About four evaluations of the validation set per epoch."""
    return max(1, round(n_train / (4 * batchsize)))


def command(optimizer, batchsize, epochs, flags, seed, validation, n_train,
            test):
    cmd = TRAINER + ['--batchsize', str(batchsize)] + OPTIMIZERS.get(
        optimizer, [])
    cmd += ['--epoch', str(epochs), '--validation', str(validation),
            '--eval-every', str(eval_every(batchsize, n_train)),
            '--test', test]
    for name, value in flags.items():
        cmd += ['--' + name.replace('_', '-'), '{:g}'.format(value)]
    return cmd + ['--seed', str(seed), '--snapshots', '0', '--noplot']


def measure(log, batchsize, n_train, target):
    """Steps and epochs to ``target``, best validation, test accuracy."""
    steps = best = None
    curve = []
    for entry in log:
        accuracy = entry.get('val/main/accuracy')
        if accuracy is None:
            continue
        curve.append([entry['iteration'], round(accuracy, 4)])
        if not math.isnan(accuracy) and (best is None or accuracy > best):
            best = accuracy
        if steps is None and accuracy >= target:
            steps = entry['iteration']
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
    extra = ['--out', out]
    if dataset_root is not None:
        extra += ['--dataset-root', dataset_root]
    if device != '-1':
        extra += ['--device', device]
    full = ([sys.executable, os.path.join(HERE, 'train_mnist.py')]
            + cmd[len(TRAINER):] + extra)
    process = subprocess.Popen(full, stdout=stdout, stderr=subprocess.STDOUT)
    try:
        code = process.wait()
    finally:
        # Stopped (SIGTERM, Ctrl-C): the run does not go on without us.
        if process.poll() is None:
            process.kill()
            process.wait()
    log = results.read_log(out)
    # A diverged run stops with status 1, its log written: a result (the
    # target never reached), not a failure of the study.
    if code == 1 and log and results.diverged(log):
        return log
    if code:
        raise subprocess.CalledProcessError(code, full)
    return log


def trial_name(optimizer, batchsize, trial=None, seed=None):
    if optimizer == DEFAULTS:
        return '{}-b{}'.format(DEFAULTS, batchsize)
    if seed is None:
        return '{}-b{}-t{}'.format(optimizer, batchsize, trial)
    return '{}-b{}-best-s{}'.format(optimizer, batchsize, seed)


def run_trial(args, optimizer, batchsize, trial, flags, seed, test):
    """Runs one trial unless its JSON exists; returns its record."""
    name = trial_name(optimizer, batchsize,
                      trial, None if test == 'never' else seed)
    path = os.path.join(args.out, name + '.json')
    if os.path.exists(path):
        record = read(path)
        if record['trial'] == trial and record['flags'] == flags:
            return record
        # A rerun of a trial that is no longer its cell's best (the search
        # grew): made again of the best.
        print('  {}: a rerun of trial {}, the best is now trial {}: run '
              'again'.format(name, record['trial'], trial), flush=True)
    epochs = args.epochs or EPOCHS[batchsize]
    cmd = command(optimizer, batchsize, epochs, flags, seed,
                  args.validation, args.n_train, test)
    text = shlex.join(cmd)
    print('$ ' + text, flush=True)
    out = os.path.join(args.runs, name)
    os.makedirs(out, exist_ok=True)
    start = time.time()
    with open(os.path.join(args.runs, name + '.stdout'), 'w') as stdout:
        log = run_command(cmd, out, args.dataset_root, args.device, stdout)
    record = {'optimizer': optimizer, 'batchsize': batchsize,
              'trial': trial, 'seed': seed, 'flags': flags,
              'command': text, 'target': args.target, 'epochs': epochs,
              'validation': args.validation}
    record.update(measure(log, batchsize, args.n_train, args.target))
    if test == 'never':
        record['test_accuracy'] = None
    record['seconds'] = round(time.time() - start)
    write(path, record)
    print('  {} s: steps to {:g} %: {}, best validation {:.4f}'.format(
        record['seconds'], 100 * args.target, record['steps_to_target'],
        record['best_validation'] or 0), flush=True)
    return record


def read(path):
    with open(path) as f:
        return json.load(f)


def write(path, record):
    """Writes the JSON whole or not at all (an interrupted study)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
        json.dump(record, f, indent=1, sort_keys=True, allow_nan=False)
        f.write('\n')
    os.replace(path + '.tmp', path)


def best(trials):
    """The best trial: the fewest steps to the target; if none reached it,
    the best validation accuracy (ties: the lower trial number)."""
    def key(r):
        steps = r['steps_to_target']
        return (steps is None, steps or 0, -(r['best_validation'] or 0),
                r['trial'])
    return min(trials, key=key)


def load(out):
    """The records in ``out``: ``(search, reruns)`` by (batch, optimizer)."""
    search, reruns = {}, {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if not name.endswith('.json') or name.startswith(DEFAULTS + '-'):
            continue
        record = read(os.path.join(out, name))
        cell = record['batchsize'], record['optimizer']
        if '-best-' in name:
            reruns.setdefault(cell, []).append(record)
        else:
            search.setdefault(cell, []).append(record)
    for records in list(search.values()) + list(reruns.values()):
        records.sort(key=lambda r: (r['trial'], r['seed']))
    return search, reruns


def load_defaults(out):
    """The runs of the trainer's defaults in ``out``, by batch size."""
    found = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.startswith(DEFAULTS + '-') and name.endswith('.json'):
            record = read(os.path.join(out, name))
            found[record['batchsize']] = record
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
                                 search.get((batchsize, optimizer), []))
            run_trial(args, optimizer, batchsize, trial, flags, 0, 'never')
            redraw(args)
    # The trainer's defaults are lars's: measured beside lars only.
    for batchsize in args.batchsizes if 'lars' in args.optimizers else ():
        run_trial(args, DEFAULTS, batchsize, None, {}, 0, 'never')
        redraw(args)
    for seed in args.seeds:
        for batchsize, optimizer in cells:
            search, _ = load(args.out)
            chosen = best(search[batchsize, optimizer])
            run_trial(args, optimizer, batchsize, chosen['trial'],
                      chosen['flags'], seed, 'end')
            redraw(args)


def redraw(args):
    """Redraws the figure; a failure is printed, the study goes on."""
    if args.plot:
        try:
            plot(args)
        except Exception as e:  # the figure must not stop the study
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


def tables(search, reruns, trials=TRIALS, seeds=len(SEEDS), refine=REFINED,
           defaults=None):
    """The search table, the rerun table and, where runs of the trainer's
    defaults exist, their table: (header, rows) each."""
    order = list(OPTIMIZERS)
    cells = sorted(set(search) | set(reruns), key=lambda c: (
        c[0], order.index(c[1]) if c[1] in order else len(order), c[1]))
    head = ['batch size', 'optimizer', 'epochs', 'trials', 'reached',
            'best trial', 'steps to target', 'epochs to target',
            'best validation, any trial (%)', 'lr', 'momentum', 'warm-up',
            'smoothing']
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
                     '{:.2f}'.format(top['epochs_to_target'])
                     if reached else '-',
                     _percent(max(r['best_validation'] or 0
                                  for r in records)),
                     '{:g}'.format(flags['lr']),
                     '{:g}'.format(flags['momentum']),
                     '{:g}'.format(flags['warmup_epochs']),
                     '{:g}'.format(flags['label_smoothing'])])
    rerun_head = ['batch size', 'optimizer', 'trial', 'seeds',
                  'steps to target', 'best validation (%)', 'test (%)']
    rerun_rows = []
    for cell in cells:
        records = reruns.get(cell, [])
        if not records:
            continue
        rerun_rows.append([
            str(cell[0]), cell[1], str(records[0]['trial']),
            '{}/{}'.format(len(records), seeds),
            _spread([r['steps_to_target'] for r in records],
                    lambda v: '{:.0f}'.format(v)),
            _spread([r['best_validation'] for r in records], _percent),
            _spread([r['test_accuracy'] for r in records], _percent)])
    found = [(head, rows), (rerun_head, rerun_rows)]
    if defaults:
        found.append(defaults_table(search, defaults))
    return found


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
            '-' if r['epochs_to_target'] is None else '{:.2f}'.format(
                r['epochs_to_target']),
            _percent(r['best_validation']),
            '-' if top is None or top['steps_to_target'] is None
            else str(top['steps_to_target'])])
    return head, rows


def inconsistent(search, reruns, trials, refine=REFINED):
    """What in the records the study would not have written now: a search
    trial's flags that are not those of its point of the search (the
    search was changed after it ran), a rerun of another trial than its
    cell's best."""
    problems = []
    for (batchsize, optimizer), records in sorted(search.items()):
        n = trials_of(batchsize, trials, refine)
        for r in records:
            if r['trial'] >= n:
                problems.append('{}: trial {} of a search of {}'.format(
                    trial_name(optimizer, batchsize, r['trial']),
                    r['trial'], n))
                continue
            want = search_flags(optimizer, batchsize, r['epochs'],
                                r['trial'], trials, records)
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


def check(args):
    search, reruns = load(args.out)
    status = 0
    for problem in inconsistent(search, reruns, args.trials, args.refine):
        print(problem)
        status = 1
    for batchsize, r in sorted(load_defaults(args.out).items()):
        want = TRAINER + ['--batchsize', str(batchsize), '--epoch',
                          str(r['epochs']), '--validation',
                          str(r['validation'])]
        if not r['command'].startswith(shlex.join(want) + ' ') or r['flags']:
            print('{}: not a run of the trainer\'s defaults: {}'.format(
                trial_name(DEFAULTS, batchsize), r['command']))
            status = 1
    for path in args.check or [README]:
        for header, rows in tables(search, reruns, args.trials,
                                   len(args.seeds), args.refine,
                                   load_defaults(args.out)):
            ok, message = results.check_file(path, header, rows)
            print(message)
            status = status or (0 if ok else 1)
    return status


def reproduce(args):
    """Reruns the command of ``args.reproduce``; 0 when the numbers match."""
    record = read(args.reproduce)
    cmd = shlex.split(record['command'])
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, 'run')
        with open(os.path.join(folder, 'stdout'), 'w') as stdout:
            try:
                log = run_command(cmd, out, args.dataset_root, args.device,
                                  stdout)
            except subprocess.CalledProcessError:
                stdout.close()
                with open(os.path.join(folder, 'stdout')) as f:
                    sys.stderr.write(f.read())
                raise
        n_train = n_training_images(record['validation'])
    again = measure(log, record['batchsize'], n_train, record['target'])
    if record['test_accuracy'] is None:
        again['test_accuracy'] = None
    different = [
        '{}: recorded {}, now {}'.format(key, record[key], again[key])
        for key in ('steps_to_target', 'best_validation', 'test_accuracy')
        if record[key] != again[key]]
    print('\n'.join(different) if different else 'same')
    return 1 if different else 0


def n_training_images(validation):
    """The training images left once ``validation`` are held out."""
    import chainer
    return len(chainer.datasets.get_mnist()[0]) - validation


# -- The figure ------------------------------------------------------------

STYLES = {'nesterov': {'color': 'tab:blue', 'marker': 'o'},
          'lars': {'color': 'tab:green', 'marker': 's'},
          'adam': {'color': 'tab:orange', 'marker': 'o'},
          'lamb': {'color': 'tab:purple', 'marker': 's'}}


def cell_summary(records, done, trials, seeds):
    """What the figure shows of a cell: ``(steps, accuracy, complete,
    label)``. Complete (all trials and reruns done): the reruns' mean steps
    (None if a seed missed the target) and mean best validation accuracy;
    otherwise the best search trial so far and the fraction of the trials
    done."""
    if len(records) >= trials and len(done) >= seeds:
        reached = [r['steps_to_target'] for r in done]
        steps = None if None in reached else sum(reached) / len(reached)
        accuracy = sum(r['best_validation'] for r in done) / len(done)
        return steps, accuracy, True, None
    top = best(records)
    label = ('{}/{} trials'.format(len(records), trials)
             if len(records) < trials else
             '{}/{} reruns'.format(len(done), seeds))
    return (top['steps_to_target'],
            max(r['best_validation'] or 0 for r in records), False, label)


def plot(args):
    """Steps to the target and best validation accuracy against batch size.

    One line per optimizer; a filled marker is a complete cell (the mean
    of its seeded reruns), a hollow one a cell still being searched (its
    best trial so far, labelled with the trials done). The dotted line is
    perfect scaling: the steps halve as the batch doubles, from the fewest
    steps at the smallest batch size drawn.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from examples import plotting

    search, reruns = load(args.out)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    anchors = []
    under_way = False
    for row, optimizer in enumerate(args.optimizers):
        style = STYLES.get(optimizer, {})
        color = style.get('color')
        points = []
        for batchsize in args.batchsizes:
            records = search.get((batchsize, optimizer))
            if records:
                points.append((batchsize,) + cell_summary(
                    records, reruns.get((batchsize, optimizer), []),
                    trials_of(batchsize, args.trials, args.refine),
                    len(args.seeds)))
                under_way = under_way or not points[-1][3]
        label = {'lars': 'lars (--nesterov)'}.get(optimizer, optimizer)
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
                if p[4]:
                    ax.annotate(p[4], xy=(p[0], p[index]), xytext=(5, 3),
                                textcoords='offset points', fontsize=7,
                                color=color)
        for p in points:
            if p[1] is None:  # a triangle under the top edge
                left.plot([p[0]], [0.97 - 0.04 * row], linestyle='none',
                          marker='v', color=color, markerfacecolor='white',
                          transform=left.get_xaxis_transform())
            else:
                anchors.append((p[0], p[1]))
    defaults = load_defaults(args.out)
    runs = [(b, defaults[b]) for b in args.batchsizes if b in defaults]
    for ax, key in ((left, 'steps_to_target'), (right, 'best_validation')):
        drawn = [(b, r[key]) for b, r in runs if r[key] is not None]
        if drawn:
            # Under the optimizers' lines, which it may cross.
            ax.plot([b for b, _ in drawn], [v for _, v in drawn],
                    color='gray', marker='x', linestyle='--', zorder=1.5,
                    label="lars, the trainer's defaults (one run each)")
    for b, r in runs:
        if r['steps_to_target'] is None:
            left.plot([b], [0.97 - 0.04 * len(args.optimizers)],
                      linestyle='none', marker='v', color='gray',
                      markerfacecolor='white',
                      transform=left.get_xaxis_transform())
    if anchors:
        smallest = min(b for b, _ in anchors)
        steps = min(v for b, v in anchors if b == smallest)
        sizes = numpy.array([b for b in args.batchsizes if b >= smallest],
                            dtype=float)
        left.plot(sizes, steps * smallest / sizes, color='gray',
                  linestyle=':', label='perfect scaling')
    else:  # no cell has reached the target yet
        left.set_ylim(1, 1000)
    left.set_yscale('log')
    plotting.plain_log_ticks(left.yaxis)
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
    handles.append(matplotlib.lines.Line2D(
        [], [], linestyle='none', marker='v', color='gray',
        markerfacecolor='white', label='no trial reached it (top edge)'))
    left.legend(handles=handles, fontsize=8, loc='lower left')
    refined = [b for b in args.batchsizes if b in args.refine]
    figure.suptitle('MNIST MLP, each cell tuned by {} trials{} on 10,000 '
                    'held-out images; {}: mean of {} seeded reruns of '
                    'the best{}'.format(
                        args.trials, ' ({} at {})'.format(
                            2 * args.trials, ' and '.join(
                                str(b) for b in refined)) if refined else '',
                        'filled' if under_way else 'each point',
                        len(args.seeds),
                        ', hollow: search under way' if under_way else ''),
                    fontsize=9)
    figure.tight_layout()
    figure.savefig(args.figure)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batchsizes', action=results.ListFlag,
                        type=results._integer(1), default=BATCHSIZES,
                        help='Batch sizes (default: %(default)s)')
    parser.add_argument('--optimizers', action=results.ListFlag,
                        default=DEFAULT_OPTIMIZERS,
                        help='From {} (default: %(default)s)'.format(
                            ', '.join(OPTIMIZERS)))
    parser.add_argument('--trials', type=results._integer(1),
                        default=TRIALS, help='Trials per cell and round '
                        '(default: %(default)s)')
    parser.add_argument('--refine', action=results.ListFlag,
                        type=results._integer(0), default=REFINED,
                        help='Batch sizes with a second round, its rates '
                        'around the best of the first; 0 for none (default: '
                        '%(default)s)')
    parser.add_argument('--seeds', action=results.ListFlag,
                        type=results._integer(0), default=SEEDS,
                        help='Seeds of the reruns (default: %(default)s)')
    parser.add_argument('--epochs', type=results._integer(1),
                        help='One epoch budget for every batch size '
                        '(default: {})'.format(', '.join(
                            '{} for {}'.format(e, b)
                            for b, e in EPOCHS.items())))
    parser.add_argument('--validation', type=results._integer(1),
                        default=VALIDATION,
                        help='Training images held out (default: '
                        '%(default)s)')
    parser.add_argument('--target', type=float, default=TARGET,
                        help='Validation accuracy target (default: '
                        '%(default)s)')
    parser.add_argument('--device', '-d', default='-1')
    parser.add_argument('--dataset-root',
                        help='Passed on to train_mnist.py')
    parser.add_argument('--out', default=OUT,
                        help='Folder of the JSONs (default: '
                        'examples/mnist/study)')
    parser.add_argument('--runs', default='result_study',
                        help='Folder of the runs (default: %(default)s)')
    parser.add_argument('--figure', default=FIGURE,
                        help='The figure (default: examples/mnist/'
                        'study.png)')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Do not redraw the figure after each trial')
    parser.add_argument('--check', nargs='*', metavar='FILE',
                        help='Run nothing: check that each FILE (default: '
                        'examples/mnist/README.md) holds the tables of the '
                        'JSONs in --out; exit 1 where one does not')
    parser.add_argument('--reproduce', metavar='FILE',
                        help='Rerun the trial of a JSON in a temporary '
                        'folder; print same, or what differs (exit 1)')
    parser.add_argument('--tables', action='store_true',
                        help='Run nothing: print the Markdown tables of the '
                        'JSONs in --out, as --check expects them')
    parser.add_argument('--plot-only', action='store_true',
                        help='Run nothing: draw the figure from the JSONs')
    args = parser.parse_args(argv)
    for name in args.optimizers:
        if name not in OPTIMIZERS:
            parser.error('--optimizers {}: choose from {}'.format(
                name, ', '.join(OPTIMIZERS)))
    if not 0 < args.target <= 1:
        parser.error('--target must be in (0, 1], got {}'.format(
            args.target))
    if args.dataset_root is not None:
        import chainer
        chainer.dataset.set_dataset_root(args.dataset_root)
    if args.check is not None:
        return check(args)
    if args.reproduce is not None:
        if not os.path.isfile(args.reproduce):
            parser.error('--reproduce {}: no such file'.format(
                args.reproduce))
        return reproduce(args)
    if args.tables:
        search, reruns = load(args.out)
        for header, rows in tables(search, reruns, args.trials,
                                   len(args.seeds), args.refine,
                                   load_defaults(args.out)):
            print('\n'.join(results.markdown_table(header, rows)) + '\n')
        return 0
    if args.plot_only:
        plot(args)
        return 0
    for name in args.batchsizes:
        if args.epochs is None and name not in EPOCHS:
            parser.error('--batchsizes {}: no epoch budget for it; give '
                         '--epochs'.format(name))
    args.n_train = n_training_images(args.validation)
    os.makedirs(args.runs, exist_ok=True)
    # SIGTERM stops the study as Ctrl-C does, its current run with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    study(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
