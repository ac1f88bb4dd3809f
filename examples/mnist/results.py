#!/usr/bin/env python
"""Runs train_mnist.py over batch sizes and optimizers; writes the table.

Each configuration runs ``train_mnist.py`` on its defaults (only the batch
size, the optimizer and the seed change) in
``<out>/b<batchsize>-<optimizer>-s<seed>``; a run whose log already covers
all epochs is not run again, so an interrupted sweep continues where it
stopped. The test accuracy after the last epoch (the mean over the seeds,
and their range when there are several) goes into ``<out>/results.md`` and
``<out>/results.rst``, with the commands that produced it, and the test
accuracy along the runs into ``<out>/accuracy.png``.

    python examples/mnist/results.py --dataset-root ../shared/datasets \
        --seeds 0 1 2
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
OPTIMIZERS = ('momentum', 'momentum-lars', 'lars')


def command(batchsize, optimizer, seed, args):
    cmd = ['python', 'examples/mnist/train_mnist.py',
           '--batchsize', str(batchsize), '--optimizer', optimizer,
           '--epoch', str(args.epoch)]
    if seed != 0:
        cmd += ['--seed', str(seed)]
    if args.device != '-1':
        cmd += ['--device', args.device]
    return cmd


def read_log(out):
    try:
        with open(os.path.join(out, 'log')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run(batchsize, optimizer, seed, args):
    """Runs one configuration unless its log is complete; returns the log."""
    name = 'b{}-{}-s{}'.format(batchsize, optimizer, seed)
    out = os.path.join(args.out, name)
    log = read_log(out)
    if log and log[-1]['epoch'] >= args.epoch and not args.rerun:
        return log
    cmd = command(batchsize, optimizer, seed, args)
    print('$ ' + ' '.join(cmd), flush=True)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(HERE))]
        + [p for p in [env.get('PYTHONPATH')] if p])
    extra = ['--out', out]
    if args.dataset_root is not None:
        extra += ['--dataset-root', args.dataset_root]
    start = time.time()
    with open(os.path.join(args.out, name + '.stdout'), 'w') as stdout:
        subprocess.check_call(
            [sys.executable, os.path.join(HERE, 'train_mnist.py')]
            + cmd[2:] + extra, env=env, stdout=stdout,
            stderr=subprocess.STDOUT)
    print('  done in {:.0f} s'.format(time.time() - start), flush=True)
    for name in os.listdir(out):
        if name.startswith('snapshot_iter_') and not args.keep_snapshots:
            os.remove(os.path.join(out, name))
    return read_log(out)


def cell(logs):
    """The mean test accuracy (%) of the runs, and its range."""
    accuracies = [100 * log[-1]['validation/main/accuracy'] for log in logs]
    text = '{:.2f}'.format(sum(accuracies) / len(accuracies))
    if len(accuracies) > 1:
        text += ' ({:.2f}-{:.2f})'.format(min(accuracies), max(accuracies))
    return text


def tables(results, args):
    """The results as a Markdown table and an RST table, with commands."""
    header = ['batch size'] + list(args.optimizers)
    rows = []
    for batchsize in args.batchsizes:
        row = [str(batchsize)]
        for optimizer in args.optimizers:
            row.append(cell([results[batchsize, optimizer, seed]
                             for seed in args.seeds]))
        rows.append(row)
    caption = ('Test accuracy (%) of the MNIST MLP after {} epochs, '
               'each optimizer on its defaults'.format(args.epoch))
    if len(args.seeds) > 1:
        caption += ('; the mean over seeds {} (range in '
                    'parentheses)'.format(', '.join(map(str, args.seeds))))
    caption += '.'
    commands = [' '.join(shlex.quote(c) for c in command(b, o, s, args))
                for b in args.batchsizes for o in args.optimizers
                for s in args.seeds]

    md = [caption, '', '| ' + ' | '.join(header) + ' |',
          '|' + '|'.join('---:' for _ in header) + '|']
    md += ['| ' + ' | '.join(row) + ' |' for row in rows]
    md += ['', 'Commands (with `CHAINER_DATASET_ROOT` pointing at the '
           'MNIST cache):', '', '```']
    md += commands + ['```', '']

    widths = [max(len(r[i]) for r in [header] + rows)
              for i in range(len(header))]

    def rst_row(row):
        return '  '.join(c.rjust(w) for c, w in zip(row, widths))

    rule = '  '.join('=' * w for w in widths)
    rst = [caption, '', rule, rst_row(header), rule]
    rst += [rst_row(row) for row in rows]
    rst += [rule, '', 'Commands (with ``CHAINER_DATASET_ROOT`` pointing at '
            'the MNIST cache)::', '']
    rst += ['    ' + c for c in commands] + ['']
    return '\n'.join(md), '\n'.join(rst)


def plot(results, args, path):
    """Test accuracy per epoch, one panel per batch size, seeds averaged."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        1, len(args.batchsizes), sharey=True, squeeze=False,
        figsize=(4 * len(args.batchsizes), 3.5))
    for ax, batchsize in zip(axes[0], args.batchsizes):
        for optimizer in args.optimizers:
            logs = [results[batchsize, optimizer, seed]
                    for seed in args.seeds]
            epochs = [entry['epoch'] for entry in logs[0]]
            mean = [100 * sum(log[i]['validation/main/accuracy']
                              for log in logs) / len(logs)
                    for i in range(len(epochs))]
            ax.plot(epochs, mean, marker='.', label=optimizer)
        ax.set_title('batch {}'.format(batchsize))
        ax.set_xlabel('epoch')
        ax.grid(True)
    axes[0][0].set_ylabel('test accuracy (%)')
    # Diverged runs (10%) would flatten the rest: they fall off the bottom.
    axes[0][0].set_ylim(90, 100)
    axes[0][-1].legend(loc='lower right')
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batchsizes', type=int, nargs='+',
                        default=[128, 8192, 16384])
    parser.add_argument('--optimizers', nargs='+', choices=OPTIMIZERS,
                        default=list(OPTIMIZERS))
    parser.add_argument('--seeds', type=int, nargs='+', default=[0],
                        help='Seeds of the weights and the shuffling; '
                        'each configuration runs once per seed')
    parser.add_argument('--epoch', '-e', type=int, default=10)
    parser.add_argument('--device', '-d', default='-1')
    parser.add_argument('--out', '-o', default='results_mnist',
                        help='Folder of the runs and the tables')
    parser.add_argument('--dataset-root',
                        help='Passed on to train_mnist.py')
    parser.add_argument('--rerun', action='store_true',
                        help='Run again the configurations already done')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Do not draw accuracy.png')
    parser.add_argument('--keep-snapshots', action='store_true',
                        help='Keep the snapshots of each run (by default '
                        'they are deleted once it ends)')
    args = parser.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
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


if __name__ == '__main__':
    main()
