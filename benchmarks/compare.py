#!/usr/bin/env python
"""Two versions of chainer-lars, benchmarked in one run, alternately.

Runs each tree's own ``benchmarks/bench_lars.py`` (with that tree first on
``PYTHONPATH``) in turn, ``--rounds`` times, passing it the same arguments,
and prints for every case and variant the median time of each version and
the median of the per-round ratios ``new / old``: below 1 is faster.
Alternating the versions (each round the other goes first) lets a shared
machine's slow drifts hit both.
Variants that are not ours (``momentum_sgd``, Chainer's hook, the floor)
show what the noise is. Below the table, the cases and variants that
raised in a round (left out of the table), and each version's targets
(the PASS or FAIL that bench_lars.py prints) over all rounds; the exit
status is 1 when one of the new version's failed in a round, or one of
its cases or variants raised. A version's bench_lars.py that exits 1 (a
target failed) is read all the same: its JSON is there.

With ``--bench train_loop`` it runs the new tree's ``train_loop.py``
instead (an older tree's may not write JSON) with each tree's library
first on ``PYTHONPATH``: the update's time inside a training loop, where
every update brings new gradient arrays; ``momentum_sgd`` is the control
there (Chainer's own update, the same code in both runs).

Usage (a worktree of the previous commit beside this one)::

    git worktree add /tmp/old HEAD~1
    python benchmarks/compare.py /tmp/old . --rounds 3 -- \\
        --models cifar_resnet20,resnet50 --clock cpu
    python benchmarks/compare.py /tmp/old . --rounds 3 -- --gpu-host
    python benchmarks/compare.py /tmp/old . --bench train_loop -- \\
        --device 0 --dtype float32,mixed16
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def _run(tree, args, out, script=None):
    """Runs ``script`` (default: the tree's own bench_lars.py) in ``tree``
    with the tree first on ``PYTHONPATH``; what it wrote in ``out``."""
    tree = os.path.abspath(tree)  # the script runs in it
    script = script or os.path.join(tree, 'benchmarks', 'bench_lars.py')
    # The tree first, before what PYTHONPATH already holds (a Chainer
    # installed apart, the numpy-2 shims of gpu_check.sh).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tree] + [p for p in os.environ.get(
            'PYTHONPATH', '').split(os.pathsep) if p]))
    # bench_lars.py exits 1 when a target fails, having written its JSON:
    # the verdicts are reported below the table, not raised here.
    done = subprocess.run(
        [sys.executable, script, '--json', out] + args, cwd=tree, env=env,
        stdout=subprocess.DEVNULL)
    if done.returncode not in (0, 1) or not os.path.exists(out):
        raise SystemExit('{}: {} exited with {}'.format(
            tree, os.path.basename(script), done.returncode))
    with open(out) as f:
        return json.load(f)


def _case_name(case):
    return '{} {} wd={}'.format(case['model'], case['dtype'],
                                case['weight_decay'])


def _verdicts(result):
    """``{target: passed}`` of one bench_lars.py result."""
    verdicts = {}
    for case in result.get('cases', ()):
        for t in case.get('targets', ()):
            verdicts['{}: {}'.format(_case_name(case), t['name'])] = t['pass']
    for case in result.get('gpu_host', ()):
        for t in case.get('targets', ()):
            verdicts['{}: {}'.format(case['model'], t['name'])] = t['pass']
    return verdicts


def _times(result):
    """``{(case, variant): (seconds, seconds over the floor)}`` of one
    bench_lars.py result (the latter ``None`` in --gpu-host mode) or
    train_loop.py result (``None``: no floor)."""
    times = {}
    for loop in result.get('train_loop', ()):
        for variant, row in loop['variants'].items():
            times['train loop ' + loop['dtype'], variant] = (
                row['ms'] * 1e-3, None)
    for case in result.get('cases', ()):
        name = _case_name(case)
        fractions = case.get('floor_fraction') or {}
        for variant, seconds in case.get('median_s', {}).items():
            # No floor where the floor's own variant failed.
            fraction = fractions.get(variant)
            times[name, variant] = (
                seconds, 1.0 / fraction if fraction else None)
    for case in result.get('gpu_host', ()):
        for variant, row in case['variants'].items():
            times[case['model'], variant] = (row['us'] * 1e-6, None)
    return times


def _failures(result):
    """The cases and variants of one bench_lars.py result that raised,
    as ``case: what failed`` strings."""
    failed = set()
    for case in result.get('cases', ()):
        if 'error' in case:
            failed.add('{}: {}'.format(_case_name(case), case['error']))
        for variant, error in case.get('errors', {}).items():
            failed.add('{} {}: {}'.format(_case_name(case), variant, error))
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('old', help='the tree of the old version')
    parser.add_argument('new', help='the tree of the new version')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--bench', choices=('bench_lars', 'train_loop'),
                        default='bench_lars',
                        help='each tree\'s bench_lars.py (default), or '
                        'the new tree\'s train_loop.py on both')
    argv = sys.argv[1:]
    cut = argv.index('--') if '--' in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    if args.rounds < 1:
        parser.error('--rounds must be at least 1, got {}'.format(
            args.rounds))
    bench_args = argv[cut + 1:]
    for which in ('old', 'new'):
        tree = getattr(args, which)
        if not os.path.isdir(tree):
            parser.error('{} {}: no such folder'.format(which, tree))
        own = os.path.join(tree, 'benchmarks', 'bench_lars.py')
        if args.bench == 'bench_lars' and not os.path.isfile(own):
            parser.error('{} {}: no {}'.format(which, tree, own))
    script = None if args.bench == 'bench_lars' else os.path.join(
        os.path.abspath(args.new), 'benchmarks', 'train_loop.py')
    if script and not os.path.isfile(script):
        parser.error('--bench train_loop: no {}'.format(script))
    runs = {'old': [], 'new': []}
    verdicts = {'old': [], 'new': []}
    failures = {'old': set(), 'new': set()}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            # Alternate which tree goes first, so that neither always
            # runs on a machine the other has just warmed or loaded.
            for which in ('old', 'new')[::1 if k % 2 == 0 else -1]:
                out = os.path.join(tmp, '{}{}.json'.format(which, k))
                result = _run(getattr(args, which), bench_args, out,
                              script)
                runs[which].append(_times(result))
                verdicts[which].append(_verdicts(result))
                failures[which] |= _failures(result)
                print('round {}: {} done'.format(k + 1, which),
                      file=sys.stderr)
    # What every round of both timed (a variant that failed in a round
    # is left out, and named below).
    keys = [key for key in runs['old'][0]
            if all(key in r for r in runs['old'] + runs['new'])]
    print('{:<34} {:<24} {:>10} {:>10} {:>8} {:>8}'.format(
        'case', 'variant', 'old ms', 'new ms', 'new/old', 'norm'))
    for key in keys:
        old = [r[key] for r in runs['old']]
        new = [r[key] for r in runs['new']]
        ratio = statistics.median(n[0] / o[0] for n, o in zip(new, old))
        norm = ('{:>8.3f}'.format(statistics.median(
            n[1] / o[1] for n, o in zip(new, old)))
            if all(t[1] for t in old + new) else '')
        print('{:<34} {:<24} {:>10.3f} {:>10.3f} {:>8.3f} {:>8}'.format(
            key[0], key[1], statistics.median(o[0] for o in old) * 1e3,
            statistics.median(n[0] for n in new) * 1e3, ratio, norm))
    failed = bool(failures['new'])
    for which in ('old', 'new'):
        for what in sorted(failures[which]):
            print('failed in a round of {}: {}'.format(which, what))
    for which in ('old', 'new'):
        names = sorted(set().union(*verdicts[which]))
        if not names:  # train_loop.py, or a run without targets
            continue
        fails = [name for name in names
                 if not all(v.get(name, False) for v in verdicts[which])]
        print('targets of {}: {} of {} PASS in every round{}'.format(
            which, len(names) - len(fails), len(names),
            ''.join('\n  FAIL in a round: ' + name for name in fails)))
        failed |= which == 'new' and bool(fails)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
