#!/usr/bin/env python
"""Runs train_mnist.py over batch sizes and optimizers; writes the table.

Each configuration runs ``train_mnist.py`` on its defaults (only the batch
size, the optimizer and the seed change) in
``<out>/b<batchsize>-<optimizer>-s<seed>``; a run whose log already covers
all epochs is not run again, so an interrupted sweep continues where it
stopped. The test accuracy after the last epoch (the mean over the seeds,
and their range when there are several) goes into ``<out>/results.md`` and
``<out>/results.rst``, with the commands that produced it (each with
its run's ``-o``, so that each runs as written from the repository root,
wherever results.py ran), and the test accuracy along the runs into
``<out>/accuracy.png``.

    python examples/mnist/results.py --seeds 0 1 2

``--flags`` adds train_mnist.py flags to every run (``--flags="--lr
0.7071"``), into an ``--out`` of its own: the flags and ``--epoch`` are
recorded in ``<out>/flags``, and an ``--out`` whose runs were made with
other flags or another ``--epoch`` is refused (a run of 2 epochs would
pass for one of 1).

``--check`` runs nothing and writes nothing: it builds the table from the
runs already in ``<out>`` and checks that ``examples/mnist/README.md``
(unless files are named) holds it, cell for cell. It prints a diff and
exits with 1 where a file's table of the same header differs or is
missing, and with 2 when a run is missing:

    python examples/mnist/results.py --seeds 0 1 2 --check
"""

import argparse
import contextlib
import difflib
import io
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings

if not __package__:  # run as a file: examples/README.md
    import _examples_path  # NOQA
from examples import folders  # NOQA: E402 (after the path is set)
from examples import logs  # NOQA: E402


HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
# The root as the folder the commands shown run from is compared with it.
_REAL_REPOSITORY = os.path.realpath(REPOSITORY)
# The files that --check reads when none is named. (The front page,
# README.rst, quotes the study, whose JSONs are committed, not this
# table, whose runs are not.)
READMES = (os.path.join(HERE, 'README.md'),)
OPTIMIZERS = ('momentum', 'momentum-lars', 'lars')
# A marker and a colour each. The two LARS variants compute the same
# update, and their points coincide: the optimizers' points are drawn
# DODGE epochs apart, side by side around each epoch, so that all show.
STYLES = {'momentum': {'marker': 'o', 'color': 'tab:blue'},
          'momentum-lars': {'marker': 's', 'color': 'tab:orange'},
          'lars': {'marker': 'D', 'color': 'tab:green'}}
DODGE = 0.15
# The zoomed panels show accuracies from this (%) up.
ZOOM_FLOOR = 90.0
# The width (inches) of each batch size's column of accuracy.png, and of
# the whole figure at least: the legend's row and the title's lines need
# it with one column.
COLUMN_WIDTH = 4.0
MIN_WIDTH = 6.4


# How a run is shown: as the READMEs run the trainers, as a module from the
# repository root (examples/README.md). So the commands shown run from the
# root, wherever results.py runs: ``shown_out`` gives their -o from there,
# and ``shown_line`` a ``cd`` to it where results.py runs elsewhere.
TRAINER = ['python', '-m', 'examples.mnist.train_mnist']


def command(batchsize, optimizer, seed, args):
    cmd = TRAINER + ['--batchsize', str(batchsize), '--optimizer', optimizer,
                     '--epoch', str(args.epoch)]
    if seed != 0:
        cmd += ['--seed', str(seed)]
    if args.device != '-1':
        cmd += ['--device', args.device]
    return cmd + args.flags


def shown_command(batchsize, optimizer, seed, args):
    """``command`` with the run's folder: the trainer's default --out,
    ./result, takes one run only, and the next command pasted after it
    would be refused."""
    return command(batchsize, optimizer, seed, args) + [
        '-o', shown_out(os.path.join(args.out,
                                     run_name(batchsize, optimizer, seed)))]


def shown_out(path):
    """``path`` from the repository root, where the commands shown run:
    relative to the root under it, absolute elsewhere."""
    relative = os.path.relpath(os.path.realpath(path), _REAL_REPOSITORY)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return os.path.abspath(path)
    return relative


def shown_line(cmd):
    """``cmd`` (from ``shown_command``) as a line to paste here: run from
    the repository root, in a subshell where results.py runs elsewhere."""
    line = shlex.join(cmd)
    if os.path.realpath(os.getcwd()) != _REAL_REPOSITORY:
        line = '(cd {} && {})'.format(shlex.quote(REPOSITORY), line)
    return line


def read_log(out):
    """The log of the run in ``out``, its keys as the trainers name them
    now (``examples/logs.py``: older logs name the test set
    ``validation/main/...``), or None."""
    try:
        return logs.read(os.path.join(out, 'log'))
    except (OSError, ValueError):
        return None


def run_name(batchsize, optimizer, seed):
    return 'b{}-{}-s{}'.format(batchsize, optimizer, seed)


def done(log, args):
    """Whether the run of ``log`` is over: all epochs, or diverged (the
    trainer stops a run at the end of the epoch its loss stops being
    finite in)."""
    return bool(log) and (log[-1]['epoch'] >= args.epoch or diverged(log))


def run_process(argv, stdout):
    """Runs ``argv`` with its output (stdout and stderr) into the file
    ``stdout``; its exit status (study.py runs its trainers here too)."""
    process = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT)
    try:
        return process.wait()
    finally:
        # Stopped (Ctrl-C, or SIGTERM once ``stop_on_sigterm`` made it an
        # exit): the run does not go on without us.
        if process.poll() is None:
            process.kill()
            process.wait()


def stop_on_sigterm():
    """Makes SIGTERM stop this process as Ctrl-C does, through
    ``run_process``' cleanup: its trainer with it. (SIGTERM's own action
    ends the process at once, and the trainer ran on, writing into the
    run's folder.)"""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


#: The lines of a failed trainer's output that ``trainer_failed`` shows.
TAIL = 20


def trainer_failed(code, path):
    """Exits with the end of the output (``path``) of a trainer that
    failed with status ``code``: the reason is there, not in a
    traceback of this script."""
    try:
        with open(path, errors='replace') as f:
            tail = f.read().splitlines()[-TAIL:]
    except OSError as e:
        tail = ['(cannot be read: {})'.format(e)]
    sys.exit('The trainer failed (status {}); the end of its output, in '
             '{}:\n{}'.format(code, path, '\n'.join(
                 '    ' + line for line in tail)))


def run(batchsize, optimizer, seed, args):
    """Runs one configuration unless its log is complete; returns the log."""
    name = run_name(batchsize, optimizer, seed)
    out = os.path.join(args.out, name)
    log = read_log(out)
    if done(log, args) and not args.rerun:
        return log
    cmd = command(batchsize, optimizer, seed, args)
    print('$ ' + shown_line(shown_command(batchsize, optimizer, seed, args)),
          flush=True)
    extra = ['--out', out, '--overwrite']  # a run cut short is redone
    if args.dataset_root is not None:
        extra += ['--dataset-root', args.dataset_root]
    start = time.time()
    trainer = ([sys.executable, os.path.join(HERE, 'train_mnist.py')]
               + cmd[len(TRAINER):] + extra)
    with open(os.path.join(args.out, name + '.stdout'), 'w') as stdout:
        code = run_process(trainer, stdout)
    log = read_log(out)
    # A diverged run stops with status 1, its log written.
    if code == 1 and log and diverged(log):
        print('  diverged: stopped after epoch {} ({:.0f} s)'.format(
            log[-1]['epoch'], time.time() - start), flush=True)
    elif code:
        trainer_failed(code, stdout.name)
    else:
        print('  done in {:.0f} s'.format(time.time() - start), flush=True)
    for name in os.listdir(out):
        if name.startswith('snapshot_iter_') and not args.keep_snapshots:
            os.remove(os.path.join(out, name))
    return read_log(out)


def cell(runs):
    """The mean test accuracy (%) of the runs (their logs), and its
    range."""
    accuracies = [100 * log[-1]['test/main/accuracy'] for log in runs]
    text = '{:.2f}'.format(sum(accuracies) / len(accuracies))
    if len(accuracies) > 1:
        text += ' ({:.2f}-{:.2f})'.format(min(accuracies), max(accuracies))
    return text


def table(results, args):
    """The header and the rows of the table, as lists of cells."""
    header = ['batch size'] + list(args.optimizers)
    rows = []
    for batchsize in args.batchsizes:
        row = [str(batchsize)]
        for optimizer in args.optimizers:
            row.append(cell([results[batchsize, optimizer, seed]
                             for seed in args.seeds]))
        rows.append(row)
    return header, rows


def markdown_table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '|'.join('---:' for _ in header) + '|']
    return lines + ['| ' + ' | '.join(row) + ' |' for row in rows]


def rst_table(header, rows):
    widths = [max(len(r[i]) for r in [header] + rows)
              for i in range(len(header))]

    def rst_row(row):
        return '  '.join(c.rjust(w) for c, w in zip(row, widths))

    rule = '  '.join('=' * w for w in widths)
    return ([rule, rst_row(header), rule] + [rst_row(row) for row in rows]
            + [rule])


def tables(results, args):
    """The results as a Markdown table and an RST table, with commands."""
    header, rows = table(results, args)
    caption = 'Test accuracy (%) of the MNIST MLP after {} epoch{}, '.format(
        args.epoch, '' if args.epoch == 1 else 's')
    if args.flags:
        caption += 'each optimizer with {} (otherwise on its defaults)'.format(
            shlex.join(args.flags))
    else:
        caption += 'each optimizer on its defaults'
    if len(args.seeds) > 1:
        caption += ('; the mean over seeds {} (range in '
                    'parentheses)'.format(', '.join(map(str, args.seeds))))
    caption += '.'
    commands = [shlex.join(shown_command(b, o, s, args))
                for b in args.batchsizes for o in args.optimizers
                for s in args.seeds]

    md = [caption, ''] + markdown_table(header, rows)
    md += ['', 'Commands (from the repository root, with '
           '`CHAINER_DATASET_ROOT` pointing at the MNIST cache):', '', '```']
    md += commands + ['```', '']

    rst = [caption, ''] + rst_table(header, rows)
    rst += ['', 'Commands (from the repository root, with '
            '``CHAINER_DATASET_ROOT`` pointing at the MNIST cache)::', '']
    rst += ['    ' + c for c in commands] + ['']
    return '\n'.join(md), '\n'.join(rst)


_MD_SEPARATOR = re.compile(r'^:?-+:?$')
_RST_RULE = re.compile(r'^\s*=+(\s+=+)*\s*$')


def markdown_tables(lines):
    """The Markdown tables in ``lines``: ``(first, last, cells)`` each.

    ``cells`` holds the header and the rows, the separator left out;
    ``lines[first:last]`` is the whole table.
    """
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith('|'):
            i += 1
            continue
        first = i
        while i < len(lines) and lines[i].lstrip().startswith('|'):
            i += 1
        cells = [[c.strip() for c in line.strip().strip('|').split('|')]
                 for line in lines[first:i]]
        cells = [row for row in cells
                 if not all(_MD_SEPARATOR.match(c) for c in row)]
        yield first, i, cells


def rst_tables(lines):
    """The RST simple tables with a header in ``lines``, as above.

    Columns are cut where the rule above the header puts them.
    """
    i = 0
    while i + 2 < len(lines):
        if not (_RST_RULE.match(lines[i]) and _RST_RULE.match(lines[i + 2])
                and lines[i].strip()):
            i += 1
            continue
        starts = [m.start() for m in re.finditer('=+', lines[i])]

        def cut(line):
            bounds = starts[1:] + [None]
            return [line[a:b].strip() for a, b in zip(starts, bounds)]

        first, j = i, i + 3
        while j < len(lines) and not _RST_RULE.match(lines[j]):
            j += 1
        if j == len(lines):
            return
        yield first, j + 1, [cut(line) for line in
                             [lines[i + 1]] + lines[i + 3:j]]
        i = j + 1


def check_file(path, header, rows, spans=None):
    """Whether ``path`` holds the table; ``(ok, message)``.

    The file's tables (RST simple tables in ``.rst`` files, Markdown
    tables otherwise) whose header is ``header`` (and with ``spans``, a
    list of ``(first, last)``, that start in those lines) are compared
    cell by cell with ``rows``; the message of a mismatch is a diff
    against the first.
    """
    with open(path) as f:
        lines = f.read().splitlines()
    if path.endswith('.rst'):
        found, expected = rst_tables(lines), rst_table(header, rows)
    else:
        found, expected = markdown_tables(lines), markdown_table(header, rows)
    candidates = [(a, b, cells) for a, b, cells in found
                  if cells and cells[0] == header and any(
                      first <= a < last
                      for first, last in spans or [(0, len(lines))])]
    for _, _, cells in candidates:
        if cells == [header] + rows:
            return True, '{}: the table matches'.format(path)
    if not candidates:
        return False, '\n'.join(
            ['{}: no table with the header {}{}; expected:'.format(
                path, ' | '.join(header), '' if spans is None else
                ' in its lines ({})'.format(', '.join(
                    '{} to {}'.format(a + 1, b) for a, b in spans
                    if b > a) or 'none'))] + expected)
    first, last, _ = candidates[0]
    diff = difflib.unified_diff(
        lines[first:last], expected, lineterm='',
        fromfile='{} (line {})'.format(path, first + 1),
        tofile='results.py')
    return False, '\n'.join(['{}: the table differs'.format(path)]
                            + list(diff))


def check(args):
    """``--check``: compares the READMEs with the runs; the exit status."""
    results, missing = {}, []
    for batchsize in args.batchsizes:
        for optimizer in args.optimizers:
            for seed in args.seeds:
                log = read_log(os.path.join(
                    args.out, run_name(batchsize, optimizer, seed)))
                if done(log, args):
                    results[batchsize, optimizer, seed] = log
                else:
                    missing.append(shown_command(batchsize, optimizer,
                                                 seed, args))
    if missing:
        print('results.py --check: {} of the runs are not (all) in {}; run '
              'results.py without --check first. Missing:'.format(
                  len(missing), args.out), file=sys.stderr)
        for cmd in missing:
            print('  ' + shown_line(cmd), file=sys.stderr)
        return 2
    header, rows = table(results, args)
    status = 0
    for path in args.check or READMES:
        ok, message = check_file(path, header, rows)
        print(message)
        status = status or (0 if ok else 1)
    return status


def same_as(args):
    """``--same-as``: compares the runs of --out with those of another
    folder, value for value; the exit status."""
    compared, different = 0, []
    for batchsize in args.batchsizes:
        for optimizer in args.optimizers:
            for seed in args.seeds:
                name = run_name(batchsize, optimizer, seed)
                ours = read_log(os.path.join(args.out, name))
                theirs = read_log(os.path.join(args.same_as, name))
                if not (done(ours, args) and done(theirs, args)):
                    continue
                compared += 1
                # Every value of every epoch, but the time it took.
                strip = [[{k: v for k, v in entry.items()
                           if k != 'elapsed_time'} for entry in log]
                         for log in (ours, theirs)]
                if strip[0] != strip[1]:
                    different.append(name)
                print('{} {}'.format(
                    'DIFFERENT' if name in different else 'same     ', name))
    if not compared:
        print('results.py --same-as: no run of these configurations is done '
              'in both {} and {}'.format(args.out, args.same_as),
              file=sys.stderr)
        return 2
    print('{} of {} runs the same, value for value, as in {}'.format(
        compared - len(different), compared, args.same_as))
    return 1 if different else 0


def diverged(log):
    """Whether a run's training loss stopped being finite."""
    return any(not math.isfinite(entry.get('main/loss', 0.0))
               for entry in log)


def accuracy_curve(log):
    """A run's test accuracy (%) by epoch, NaN from the epoch its loss was
    not finite: a diverged model's accuracy is no model's."""
    accuracy, dead = [], False
    for entry in log:
        dead = dead or not math.isfinite(entry.get('main/loss', 0.0))
        accuracy.append(math.nan if dead else
                        100 * entry['test/main/accuracy'])
    return [entry['epoch'] for entry in log], accuracy


def seeds_text(seeds):
    if len(seeds) == 1:
        return 'one run (seed {}), so no range'.format(seeds[0])
    return 'mean of {} seeds ({}); bars: their range'.format(
        len(seeds), ', '.join(map(str, seeds)))


def zoom_range(values):
    """The accuracy (%) range of the zoomed panels, or None: from the
    lowest of ``values`` (the last epoch's means) to the highest accuracy
    drawn, in whole points, within 90 to 100; None where no mean reaches
    90 %."""
    finite = _finite(values)
    if not finite or max(finite) < ZOOM_FLOOR:
        return None
    low = max(ZOOM_FLOOR, math.floor(min(finite)) - 1)
    high = min(100.0, math.floor(max(finite)) + 1)
    return low, high


def draw(results, args):
    """Test accuracy per epoch, one column per batch size, seeds averaged.

    The top row draws the whole run, from 0 to 100 %; the row below
    zooms on the last epochs' range above 90 % (``zoom_range``), where
    the optimizers differ by tenths of a point (none where no run reaches
    90 %). The points of the last epoch are the tables' cells. With
    several seeds, a point is their mean and a bar their range (min to
    max); the title says how many seeds each point holds. The two LARS
    variants compute the same update and their points coincide: the
    optimizers' points are drawn side by side around each epoch
    (``DODGE``), each with its own marker, so that all show. A run whose
    loss stopped being finite is not drawn from that epoch: a dotted line
    marks the epoch, and a note in the corner says which optimizer
    diverged (or how many of its seeds did). Returns the figure.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    columns = len(args.batchsizes)
    drawn = {}  # (batchsize, optimizer): (x, mean, low, high)
    finals, notes = [], {}
    for batchsize in args.batchsizes:
        notes[batchsize] = []
        for i, optimizer in enumerate(args.optimizers):
            curves = [accuracy_curve(results[batchsize, optimizer, seed])
                      for seed in args.seeds]
            epochs = max((c[0] for c in curves), key=len)
            values = by_epoch([c[1] for c in curves], len(epochs))
            shift = (i - (len(args.optimizers) - 1) / 2) * DODGE
            drawn[batchsize, optimizer] = (
                [e + shift for e in epochs],
                [_nanmean(column) for column in values],
                [_nanmin(column) for column in values],
                [_nanmax(column) for column in values])
            finals.append(drawn[batchsize, optimizer][1][-1])
            gone = [seed for seed in args.seeds
                    if diverged(results[batchsize, optimizer, seed])]
            if gone:
                first = min(
                    next(entry['epoch'] for entry in
                         results[batchsize, optimizer, seed]
                         if not math.isfinite(entry.get('main/loss', 0.0)))
                    for seed in gone)
                notes[batchsize].append((first, optimizer, (
                    '{}: diverged in epoch {}\n(not drawn from there)'
                    .format(optimizer, first)
                    if len(gone) == len(args.seeds) else
                    '{}: {} of {} seeds diverged\n(from epoch {}; drawn: '
                    'the others)'.format(optimizer, len(gone),
                                         len(args.seeds), first))))
    zoom = zoom_range(finals)
    rows = 1 if zoom is None else 2
    figure, axes = plt.subplots(
        rows, columns, sharex='col', sharey='row', squeeze=False,
        figsize=(max(COLUMN_WIDTH * columns, MIN_WIDTH),
                 3.2 + 3.0 * (rows - 1)),
        gridspec_kw={'height_ratios': (2, 3)[:rows]})
    for column, batchsize in enumerate(args.batchsizes):
        for row in range(rows):
            ax = axes[row][column]
            for optimizer in args.optimizers:
                x, mean, low, high = drawn[batchsize, optimizer]
                style = dict(STYLES.get(optimizer, {}), markersize=4,
                             linewidth=1.2, label=optimizer)
                if len(args.seeds) > 1:
                    ax.errorbar(x, mean, yerr=[
                        [m - v for m, v in zip(mean, low)],
                        [v - m for m, v in zip(mean, high)]],
                        capsize=2, elinewidth=1, **style)
                else:
                    ax.plot(x, mean, **style)
            for first, optimizer, _ in notes[batchsize]:
                ax.axvline(first, linestyle=':', color=STYLES.get(
                    optimizer, {}).get('color', 'gray'))
            ax.xaxis.set_major_locator(
                matplotlib.ticker.MaxNLocator(integer=True))
            ax.grid(True, alpha=0.4)
        top = axes[0][column]
        top.set_title('batch {}'.format(batchsize))
        # In the lower right corner, which the rising curves leave empty.
        for k, (_, optimizer, text) in enumerate(notes[batchsize]):
            top.text(0.97, 0.05 + 0.2 * k, text, transform=top.transAxes,
                     ha='right', va='bottom', fontsize=8,
                     color=STYLES.get(optimizer, {}).get('color', 'gray'))
        axes[-1][column].set_xlabel('epoch')
    axes[0][0].set_ylabel('test accuracy (%)')
    axes[0][0].set_ylim(0, 100)
    if zoom is not None:
        axes[1][0].set_ylabel('test accuracy (%), zoomed')
        axes[1][0].set_ylim(*zoom)
    # Wrapped to the figure's width as it is drawn (unwrapped, a title
    # wider than the figure, with one batch size, lost both ends), the
    # figure taller by the lines that adds, which tight_layout then keeps
    # free of the panels.
    title = figure.suptitle(
        'MNIST MLP, test accuracy after each epoch: {}\nthe last epoch\'s '
        'points are the tables\' cells; the optimizers\' points are drawn '
        'side by side around each epoch'.format(seeds_text(args.seeds)),
        fontsize=10, wrap=True)
    renderer = figure.canvas.get_renderer()
    wrapped = title.get_window_extent(renderer).height
    title.set_wrap(False)
    added = wrapped - title.get_window_extent(renderer).height
    title.set_wrap(True)
    figure.set_figheight(figure.get_figheight() + added / figure.dpi)
    # One legend for all panels, below them, where it hides no curve.
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc='lower center', ncol=len(labels),
                  frameon=False)
    figure.tight_layout(rect=(0, 0.06 if rows == 2 else 0.09, 1, 1))
    return figure


def by_epoch(curves, length):
    """``curves`` (lists; a diverged run's is shorter: padded with NaN) as
    ``length`` columns, one per epoch."""
    return [[c[i] if i < len(c) else math.nan for c in curves]
            for i in range(length)]


def _finite(values):
    return [v for v in values if math.isfinite(v)]


def _nanmean(values):
    values = _finite(values)
    return sum(values) / len(values) if values else math.nan


def _nanmin(values):
    return min(_finite(values), default=math.nan)


def _nanmax(values):
    return max(_finite(values), default=math.nan)


def plot(results, args, path):
    """Draws ``draw``'s figure into ``path``."""
    import matplotlib.pyplot as plt
    figure = draw(results, args)
    figure.savefig(path)
    plt.close(figure)


# The flags results.py gives each run itself; --flags may not repeat them.
OWN_FLAGS = ('--batchsize', '--optimizer', '--seed', '--epoch', '--device',
             '--out', '--dataset-root', '--resume')
OWN_SHORT = ('-b', '-e', '-d', '-o', '-r')


def own_flag(token):
    """The option of results.py's own that ``token`` sets, or None.

    argparse takes an unambiguous prefix of a long option (``--batch``)
    and a short one with its value attached (``-b8192``).
    """
    name = token.split('=', 1)[0]
    if name.startswith('--') and len(name) > 2:
        return next((f for f in OWN_FLAGS if f.startswith(name)), None)
    if name.startswith('-') and name[:2] in OWN_SHORT:
        return name[:2]
    return None


def check_flags(parser, args):
    """Splits --flags and checks them against train_mnist.py's parser.

    Not its paths: the runs' --out and --dataset-root are results.py's
    (the trainer's default --out, ./result, may hold a run of its own).
    """
    try:
        flags = shlex.split(args.flags)
    except ValueError as e:
        parser.error('--flags {!r}: {}'.format(args.flags, e))
    for token in flags:
        if own_flag(token):
            parser.error('--flags {!r}: {} ({}) is set by results.py '
                         'itself; use its own option'.format(
                             args.flags, token, own_flag(token)))
    if flags:
        with warnings.catch_warnings():
            # CuPy's notes on missing libraries (NCCL) as Chainer imports
            # it: the runs' own output keeps them.
            warnings.simplefilter('ignore')
            from examples.mnist import train_mnist
        # As each run gives them: a flag may suit one --optimizer only.
        runs = argparse.Namespace(**dict(vars(args), flags=flags))
        for batchsize in args.batchsizes:
            for optimizer in args.optimizers:
                cmd = command(batchsize, optimizer, args.seeds[0], runs)
                stderr = io.StringIO()
                try:
                    with contextlib.redirect_stderr(stderr):
                        given = train_mnist.parse_args(cmd[len(TRAINER):],
                                                       paths=False)
                except SystemExit:
                    # The trainer's own message, without its usage.
                    message = stderr.getvalue().strip().splitlines()[-1]
                    parser.error(
                        '--flags {!r}: train_mnist.py refuses them with '
                        '--optimizer {} --batchsize {}: {}'.format(
                            args.flags, optimizer, batchsize,
                            message.split('error: ', 1)[-1]))
                # Else every run trains, and the table or the figure then
                # fails on the missing test accuracy.
                if given.test != 'each-epoch':
                    parser.error(
                        '--flags {!r}: --test {} evaluates the test set {}, '
                        'and results.py reads its accuracy '
                        '(test/main/accuracy) after every epoch, for the '
                        'table and accuracy.png; leave --test out'.format(
                            args.flags, given.test, 'never'
                            if given.test == 'never' else
                            'after the last epoch only'))
    return flags


def flags_file(out):
    return os.path.join(out, 'flags')


def recorded_settings(parser, out):
    """The ``--epoch`` and the ``--flags`` (a list) that ``<out>/flags``
    records: ``(epoch, flags)``; ``epoch`` is None in a file written
    before results.py recorded it, both are None without the file."""
    path = flags_file(out)
    try:
        with open(path) as f:
            tokens = shlex.split(f.read())
    except OSError:
        return None, None
    except ValueError as e:
        parser.error('--out {}: {} cannot be read ({}); give another '
                     '--out'.format(out, path, e))
    if tokens[:1] == ['--epoch'] and len(tokens) > 1 and tokens[1].isdigit():
        return int(tokens[1]), tokens[2:]
    return None, tokens


def runs_in(out):
    """The names in ``out`` of the runs' folders and of their output
    (``run_name``, ``<name>.stdout``)."""
    if not os.path.isdir(out):
        return []
    return sorted(name for name in os.listdir(out)
                  if re.match(r'^b\d+-', name))


def longest_run(out):
    """The run of ``out`` with the most epochs in its log: ``(name,
    epochs)``, or None where no run has a log."""
    found = [(log[-1]['epoch'], name) for name, log in (
        (name, read_log(os.path.join(out, name)))
        for name in runs_in(out)) if log]
    return None if not found else max(found)[::-1]


def _shown_flags(flags):
    return ('--flags {!r}'.format(shlex.join(flags)) if flags
            else 'no --flags')


def check_out_flags(parser, args):
    """Refuses an --out whose runs were made with another --epoch or other
    --flags: a run of more epochs would be taken as done, its last
    epoch's accuracy as the cell of these.

    ``<out>/flags`` records both; where it records no --epoch (written
    before results.py did), a run's log with more epochs than --epoch
    shows it.
    """
    path = flags_file(args.out)
    epoch, flags = recorded_settings(parser, args.out)
    if flags is None and args.flags and runs_in(args.out):
        parser.error('--out {}: its runs were made without --flags; '
                     'give another --out for --flags {!r}'.format(
                         args.out, shlex.join(args.flags)))
    made, asked = [], []
    if epoch is not None and epoch != args.epoch:
        made.append('--epoch {}'.format(epoch))
        asked.append('--epoch {}'.format(args.epoch))
    if flags is not None and flags != args.flags:
        made.append(_shown_flags(flags))
        asked.append(_shown_flags(args.flags))
    if made:
        parser.error('--out {}: its runs were made with {} ({}), not {}; '
                     'give another --out, or {}'.format(
                         args.out, ' and '.join(made), path,
                         ' and '.join(asked), ' and '.join(made)))
    longest = longest_run(args.out) if epoch is None else None
    if longest is not None and longest[1] > args.epoch:
        parser.error('--out {}: its run {} has {} epochs, more than --epoch '
                     '{}: its runs were made with another --epoch; give '
                     'another --out, or --epoch {}'.format(
                         args.out, longest[0], longest[1], args.epoch,
                         longest[1]))


def write_flags(args):
    """Records --epoch and --flags in ``<out>/flags`` (``check_out_flags``
    reads them)."""
    with open(flags_file(args.out), 'w') as f:
        f.write(shlex.join(['--epoch', str(args.epoch)] + args.flags)
                + '\n')


class ListFlag(argparse.Action):

    """A flag of one or more values, space- or comma-separated.

    ``--seeds 0 1 2`` and ``--seeds 0,1,2`` are the same, here and in
    ``benchmarks/bench_lars.py``. ``type`` checks each value (an
    ``argparse.ArgumentTypeError`` is a usage error).
    """

    def __init__(self, option_strings, dest, type=str, **kwargs):
        self._kind = type
        super(ListFlag, self).__init__(option_strings, dest, nargs='+',
                                       **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parsed = []
        for value in (v for token in values for v in token.split(',') if v):
            try:
                parsed.append(self._kind(value))
            except (argparse.ArgumentTypeError, TypeError,
                    ValueError) as e:
                parser.error('{} {}: {}'.format(
                    option_string, value,
                    e if isinstance(e, argparse.ArgumentTypeError)
                    else 'not a valid value'))
        setattr(namespace, self.dest, list(parsed))


def _integer(minimum):
    def parse(text):
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(
                'must be an integer, at least {}'.format(minimum))
        return value
    return parse


def _optimizer(name):
    if name not in OPTIMIZERS:
        raise argparse.ArgumentTypeError(
            'choose from ' + ', '.join(OPTIMIZERS))
    return name


BATCHSIZES = [128, 8192, 16384]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog='The list flags take one or more values, space- or '
        'comma-separated: --seeds 0 1 2, or --seeds 0,1,2.')
    parser.add_argument('--batchsizes', action=ListFlag, type=_integer(1),
                        default=BATCHSIZES,
                        help='Batch sizes (default: {})'.format(
                            ' '.join(map(str, BATCHSIZES))))
    parser.add_argument('--optimizers', action=ListFlag, type=_optimizer,
                        default=list(OPTIMIZERS),
                        help='Optimizers, from {} (default: all, in this '
                        'order)'.format(', '.join(OPTIMIZERS)))
    parser.add_argument('--seeds', action=ListFlag, type=_integer(0),
                        default=[0],
                        help='Seeds of the weights and the shuffling; '
                        'each configuration runs once per seed (default: '
                        '0)')
    parser.add_argument('--epoch', '-e', type=_integer(1), default=10,
                        help='Epochs of each run (default: %(default)s)')
    parser.add_argument('--device', '-d', default='-1',
                        help='Passed on to train_mnist.py (default: '
                        '%(default)s)')
    parser.add_argument('--out', '-o', default='results_mnist',
                        help='Folder of the runs and the tables (default: '
                        '%(default)s)')
    parser.add_argument('--dataset-root',
                        help='Passed on to train_mnist.py')
    parser.add_argument('--flags', default='',
                        help='More train_mnist.py flags for every run, as '
                        'one string (e.g. --flags="--lr 0.7071"); they go '
                        'into the commands and the caption. An --out holds '
                        'the runs of one --epoch and one set of flags '
                        '(recorded in <out>/flags)')
    parser.add_argument('--rerun', action='store_true',
                        help='Run again the configurations already done')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Do not draw accuracy.png')
    parser.add_argument('--keep-snapshots', action='store_true',
                        help='Keep the snapshots of each run (by default '
                        'they are deleted once it ends)')
    parser.add_argument('--check', nargs='*', metavar='FILE',
                        help='Run nothing: check that each FILE (default: '
                        'examples/mnist/README.md) has the table of the '
                        'runs in --out; print a diff and exit with 1 where '
                        'one does not')
    parser.add_argument('--same-as', metavar='DIR',
                        help='Run nothing: compare each run done in --out '
                        'and in DIR, every logged value of every epoch but '
                        'elapsed_time; exit with 1 if one differs, 2 if no '
                        'run is done in both')
    args = parser.parse_args(argv)
    # An empty --out, or one that is no folder, before anything reads it.
    if not args.out or (os.path.exists(args.out)
                        and not os.path.isdir(args.out)):
        parser.error('--out {}: {}'.format(
            folders.shown(args.out),
            folders.folder_problem(args.out, create=False)))
    # Each run would refuse it, but after <out>/flags is written.
    problem = args.dataset_root is not None and folders.folder_problem(
        args.dataset_root, create=False)
    if problem:
        parser.error('--dataset-root {}: {}'.format(
            folders.shown(args.dataset_root), problem))
    args.flags = check_flags(parser, args)
    if args.check is not None and args.same_as is not None:
        parser.error('--check and --same-as are two tasks: give one')
    # --check and --same-as read the runs of --out, too.
    check_out_flags(parser, args)
    if args.check is not None:
        return check(args)
    if args.same_as is not None:
        if not os.path.isdir(args.same_as):
            parser.error('--same-as: no folder {}'.format(args.same_as))
        return same_as(args)

    problem = folders.folder_problem(args.out, create=True)
    if problem is not None:
        parser.error('--out {}: {}'.format(args.out, problem))
    os.makedirs(args.out, exist_ok=True)
    write_flags(args)
    stop_on_sigterm()
    results = {}
    for batchsize in args.batchsizes:
        for optimizer in args.optimizers:
            for seed in args.seeds:
                results[batchsize, optimizer, seed] = run(
                    batchsize, optimizer, seed, args)
    md, rst = tables(results, args)
    for name, text in (('results.md', md), ('results.rst', rst)):
        with open(os.path.join(args.out, name), 'w') as f:
            f.write(text)
    if args.plot:
        plot(results, args, os.path.join(args.out, 'accuracy.png'))
    print(md)
    return 0


if __name__ == '__main__':
    sys.exit(main())
