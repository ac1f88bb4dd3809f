"""The GPU measurements' CPU-runnable parts: shape_sets.py, gpu_peers.py,
gpu_floor.py and gpu_check.sh, end to end on tiny shapes and on results
made up here.

Nothing here compares timings (a shared machine proves nothing about
speed): the checks are of the structure, the arithmetic that turns times
into ratios, and the scripts' handling of what is missing.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests import REPO_ROOT
from tests import benchmark
from tests import conftest


BENCHMARKS = os.path.join(REPO_ROOT, 'benchmarks')


def _load(name):
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    return benchmark(name)


@pytest.fixture(scope='module')
def peers():
    return _load('gpu_peers')


@pytest.fixture(scope='module')
def floor():
    return _load('gpu_floor')


# --- shape_sets.py ---------------------------------------------------------

def test_bert_large_has_its_335_m_parameters():
    sets = _load('shape_sets')
    bert = sets.get('bert_large')
    hidden, inter = 1024, 4096
    embeddings = (30522 + 512 + 2) * hidden + 2 * hidden
    layer = (4 * (hidden * hidden + hidden) + 2 * hidden
             + inter * hidden + inter + hidden * inter + hidden + 2 * hidden)
    pooler = hidden * hidden + hidden
    assert bert['n_params'] == embeddings + 24 * layer + pooler == 335141888
    assert bert['n_arrays'] == 5 + 24 * 16 + 2 == len(bert['shapes'])
    # Few large arrays: the word embeddings and the 96 feed-forward and
    # attention matrices hold nearly all of it.
    big = sum(a * b for a, b in (s for s in bert['shapes'] if len(s) == 2))
    assert big / bert['n_params'] > 0.99


def test_resnet50_is_bench_lars_s_set():
    sets = _load('shape_sets')
    resnet = sets.get('resnet50')
    assert (resnet['n_params'], resnet['n_arrays']) == (25557096, 162)
    assert [64, 3, 7, 7] in resnet['shapes']
    json.dumps(resnet)  # what the other framework's process reads
    with pytest.raises(ValueError, match='unknown shape set'):
        sets.get('vgg')


# --- gpu_peers.py ----------------------------------------------------------

@pytest.mark.parametrize('spec,gpu', [
    ('@numpy', None), ('-1', None), ('0', 0), (1, 1), ('@cupy:2', 2)])
def test_devices_as_chainer_writes_them(peers, spec, gpu):
    assert peers.parse_device(spec) == gpu


@pytest.mark.parametrize('spec', ['@intel64', '@cupy:', 'cuda', '-2'])
def test_other_devices_are_refused(peers, spec):
    with pytest.raises(ValueError, match='not @numpy'):
        peers.parse_device(spec)


class _FakeEvent(object):

    def __init__(self, clock):
        self.clock = clock
        self.at = None

    def record(self):
        self.at = self.clock['t']

    def synchronize(self):
        pass


def test_updates_are_timed_on_new_gradients(peers):
    clock = {'t': 0.0}
    calls = []

    def update():
        calls.append('update')
        clock['t'] += 2.0  # the device runs it in 2 ms

    def renew():
        calls.append('renew')

    timer = peers._Timer(lambda: calls.append('sync'),
                         lambda: (_FakeEvent(clock), _FakeEvent(clock)),
                         lambda a, b: b.at - a.at)
    addresses = iter([(1, 2), (1, 2), (3, 4), (5, 6), (5, 6)])
    got = peers.time_updates(update, renew, timer, reps=3, warmup=2,
                             address=lambda: next(addresses))
    # New gradients, the device synchronised, then the update: 5 times.
    assert calls == ['renew', 'sync', 'update'] * 5
    assert got['gpu_s'] == pytest.approx(2e-3) and got['reps'] == 3
    assert 0 < got['host_s'] <= got['wall_s']
    # The addresses changed at 2 of the 4 updates after the first.
    assert got['new_addresses'] == 0.5


def test_a_row_turns_time_into_bytes_per_parameter(peers):
    shape_set = {'name': 's', 'n_params': 10 ** 6, 'n_arrays': 3}
    times = {'wall_s': 3e-3, 'host_s': 1e-3, 'gpu_s': 2e-3, 'reps': 5}
    row = peers._row_result('chainer_lars.LAMB', 'chainer', 'lamb',
                            'float32', shape_set, times, 1e12)
    # 2 ms at 1 TB/s is 2 GB: 2,000 bytes for each of a million parameters,
    # 50 times LAMB's floor of 40.
    assert row['bytes_per_param'] == pytest.approx(2000)
    assert row['floor_bytes'] == 40 and row['x_floor'] == pytest.approx(50)
    cpu = peers._row_result('chainer_lars.LARS', 'chainer', 'lars',
                            'mixed16', shape_set,
                            dict(times, gpu_s=None), 1e12)
    # No GPU time on a CPU: the wall time stands in.
    assert cpu['bytes_per_param'] == pytest.approx(3000)
    assert cpu['x_floor'] == pytest.approx(3000 / 26)


def _made_up_result(peers):
    shape_set = {'name': 'resnet50', 'n_params': 10 ** 6, 'n_arrays': 2,
                 'source': 'made up'}

    def row(label, framework, floor, wall, precision='float32'):
        return peers._row_result(
            label, framework, floor, precision, shape_set,
            {'wall_s': wall, 'host_s': wall / 2, 'gpu_s': wall, 'reps': 2},
            1e12)
    chainer = [row('chainer_lars.LARS', 'chainer', 'lars', 1e-3),
               row('chainer_lars.LARS', 'chainer', 'lars', 2e-3, 'mixed16'),
               row('chainer_lars.LAMB', 'chainer', 'lamb', 3e-3)]
    torch = [row('timm Lars', 'torch', 'lars', 4e-3),
             row('timm Lamb', 'torch', 'lamb', 2e-3),
             row('torch SGD fused', 'torch', 'momentum_sgd', 0.5e-3),
             peers._failed('apex FusedLAMB', 'torch', 'lamb', 'float32',
                           shape_set, 'not available (no apex)',
                           key='unavailable')]
    return {'device': '0', 'git': 'abc', 'python': '3.12.3', 'reps': 2,
            'warmup': 1, 'sets': [shape_set], 'processes': [
                {'framework': 'chainer', 'versions': {'chainer': '7.8.1'},
                 'copy': {'bytes': 2 ** 30, 'bandwidth': 4.1e12},
                 'rows': chainer, 'seconds': 10.0},
                {'framework': 'torch', 'versions': {'torch': '2.11.0'},
                 'copy': {'bytes': 2 ** 30, 'bandwidth': 4.2e12},
                 'rows': torch, 'seconds': 5.0}]}


def test_the_table_and_the_goals(peers):
    result = _made_up_result(peers)
    text = peers.markdown(result)
    lines = text.splitlines()
    assert ('- chainer process (10 s): chainer 7.8.1; device copy of 1024 '
            'MiB: 4.100 TB/s') in lines
    assert '## resnet50: 1,000,000 parameters in 2 arrays' in lines
    assert ('| chainer_lars.LARS | mixed16 | 2.000 | 1.000 | 2.000 | 2000.0 '
            '| 26 | 76.92 |') in lines
    assert ('| apex FusedLAMB | float32 | not available (no apex) | | | | '
            '40 | |') in lines
    # Every table row has the header's eight cells.
    rows = [line for line in lines if line.startswith('| ')]
    assert {row.count('|') for row in rows} == {9}
    assert peers.goals(result) == [
        ('resnet50', 'chainer_lars.LARS', 'timm Lars', 0.25, 1.0),
        ('resnet50', 'chainer_lars.LAMB', 'timm Lamb', 1.5, 1.0),
        ('resnet50', 'chainer_lars.LARS', 'torch SGD fused', 2.0, 1.5),
        ('resnet50', 'chainer_lars.LAMB', 'torch Adam fused', None, 1.5)]
    assert ('- resnet50: chainer_lars.LARS / timm Lars = 0.25 (goal < 1) '
            'met') in lines
    assert ('- resnet50: chainer_lars.LAMB / timm Lamb = 1.50 (goal < 1) '
            'missed') in lines
    assert ('- resnet50: chainer_lars.LARS / torch SGD fused = 2.00 (goal '
            '<= 1.5) missed') in lines
    assert ('- resnet50: chainer_lars.LAMB / torch Adam fused = - (goal '
            '<= 1.5)') in lines


def test_what_counts_as_a_failure(peers):
    result = _made_up_result(peers)
    assert not peers.failed(result)  # apex missing is no failure
    result['processes'][1]['rows'][0]['error'] = 'RuntimeError: x'
    assert not peers.failed(result)  # nor a peer that broke
    result['processes'][0]['rows'][0]['error'] = 'RuntimeError: x'
    assert peers.failed(result)
    result['processes'][0]['rows'][0].pop('error')
    result['processes'][1]['error'] = 'the torch process failed'
    assert peers.failed(result)


def _spec(peers, frameworks_sets=('tiny',)):
    sets = _load('shape_sets')
    return {'gpu': None, 'sets': [sets.get(n) for n in frameworks_sets],
            'reps': 2, 'warmup': 1, 'copy_bytes': 2 ** 16, 'seed': 0}


def test_without_torch_its_rows_say_not_available(peers, monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', None)  # import fails
    out = peers._torch_worker(_spec(peers))
    labels = [label for label, framework, _ in peers.ROWS
              if framework == 'torch']
    assert [r['update'] for r in out['rows']] == labels
    for r in out['rows']:
        assert r['unavailable'].startswith('not available (')
        assert 'error' not in r and 'wall_s' not in r


def test_a_failed_process_is_reported_not_raised(peers, tmp_path):
    sleeper = tmp_path / 'python'
    sleeper.write_text('#!/bin/sh\nexec sleep 30\n')
    sleeper.chmod(0o755)
    got = peers.run_worker('torch', _spec(peers), timeout=0.5,
                           python=str(sleeper))
    assert got['rows'] == [] and 'timed out after 0.5 s' in got['error']
    broken = tmp_path / 'broken'
    broken.write_text('#!/bin/sh\necho "no such module" >&2\nexit 3\n')
    broken.chmod(0o755)
    got = peers.run_worker('chainer', _spec(peers), timeout=30,
                           python=str(broken))
    assert got['error'] == ('the chainer process failed (exit status 3): '
                            'no such module')


def test_peers_end_to_end_on_the_cpu(peers, tmp_path, capsys):
    out, md = tmp_path / 'peers.json', tmp_path / 'peers.md'
    status = peers.main(['--device', '@numpy', '--sets', 'tiny', '--reps',
                         '2', '--warmup', '1', '--copy-mib', '1', '--json',
                         str(out), '--markdown', str(md)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    result = json.loads(out.read_text())
    assert md.read_text() == peers.markdown(result) + '\n'
    chainer, torch = result['processes']
    assert chainer['copy']['bytes'] == 2 ** 20
    rows = chainer['rows']
    assert [(r['update'], r['precision']) for r in rows] == [
        (label, p) for label, framework, _ in peers.ROWS
        if framework == 'chainer' for p in ('float32', 'mixed16')]
    for r in rows:
        assert 'error' not in r, r
        assert r['wall_s'] > 0 and r['gpu_s'] is None and r['reps'] == 2
        assert r['x_floor'] > 0 and 0 <= r['new_addresses'] <= 1
    assert len(torch['rows']) == 9
    try:
        import torch as _  # NOQA
    except ImportError:
        assert all('unavailable' in r for r in torch['rows'])
    else:
        timed = {r['update'] for r in torch['rows'] if 'wall_s' in r}
        assert {'torch SGD for-loop', 'torch SGD foreach',
                'torch Adam foreach'} <= timed
        assert not any('error' in r for r in torch['rows']
                       if r['update'].startswith('timm'))


def test_peers_shares_its_timeout_and_writes_each_process_as_it_ends(
        peers, tmp_path, monkeypatch, capsys):
    # gpu_check.sh gave each of two processes 2/3 of its limit and lost
    # everything when its own limit stopped the second: now the processes
    # share --timeout, and the files hold the first before the second.
    clock = {'t': 0.0}
    monkeypatch.setattr(peers.time, 'monotonic', lambda: clock['t'])
    given = []
    md, out = tmp_path / 'peers.md', tmp_path / 'peers.json'

    def run_worker(framework, spec, timeout, python=None):
        given.append(timeout)
        if framework == 'torch':
            # What a stop from outside would have left: the first process.
            assert 'chainer process' in md.read_text()
            assert ('- not run yet when this was written: torch process'
                    in md.read_text())
            assert json.loads(out.read_text())['pending'] == ['torch']
        clock['t'] += timeout * (0.5 if framework == 'chainer' else 1.0)
        return {'framework': framework, 'versions': {}, 'copy': None,
                'rows': []}
    monkeypatch.setattr(peers, 'run_worker', run_worker)
    peers.main(['--device', '@numpy', '--sets', 'tiny', '--timeout', '90',
                '--json', str(out), '--markdown', str(md)])
    # Half for the first; the second gets what is left, the first's
    # unused time too; together within the limit.
    assert given == [45.0, 67.5] and clock['t'] <= 90
    assert 'not run yet' not in md.read_text()
    assert 'pending' not in json.loads(out.read_text())
    assert peers._SEPARATE in md.read_text().splitlines()


@pytest.mark.parametrize('argv,message', [
    (['--device', '@intel64'], '--device: '),
    (['--sets', 'tiny,vgg'], "--sets: unknown 'vgg'"),
    (['--frameworks', 'jax'], "--frameworks: unknown 'jax'"),
    (['--reps', '0'], '--reps must be >= 1'),
    (['--copy-mib', '0'], '--copy-mib must be positive'),
    # Every row failed on it, in each worker.
    (['--seed', '-1'], '--seed must be from 0 to 2**32 - 1, got -1'),
    # A GPU that is not there, before any worker starts (each worker's
    # traceback and a table of '-' were all it printed).
    (['--device', '@cupy:99', '--sets', 'tiny'], '--device @cupy:99: '),
    pytest.param(['--device', '0'], '--device 0: CuPy cannot be used (',
                 marks=pytest.mark.skipif(
                     __import__('chainer').backends.cuda.available,
                     reason='CuPy can use CUDA here')),
])
def test_peers_refuses_bad_flags(peers, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        peers.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_peers_workers_leave_the_device_to_the_parent(peers):
    # A worker's flags come from the parent, which checked the device.
    args = peers.parse_args(['--worker', 'torch', '--spec', 'spec.json',
                             '--out', 'out.json', '--device', '@cupy:99'])
    assert args.worker == 'torch'


@pytest.mark.parametrize('tool', ['gpu_peers', 'gpu_floor'])
def test_output_folders_are_made_before_the_run(tool, tmp_path, capsys):
    # Not at the end of the run, where a missing folder lost it all.
    module = _load(tool)
    flags = ['--json', '--markdown'] if tool == 'gpu_peers' else ['--json']
    argv = ['--device', '@numpy']
    for k, flag in enumerate(flags):
        argv += [flag, str(tmp_path / 'new{}'.format(k) / 'out')]
    module.parse_args(argv)
    assert sorted(os.listdir(str(tmp_path))) == [
        'new{}'.format(k) for k in range(len(flags))]
    (tmp_path / 'file').write_text('')
    with pytest.raises(SystemExit) as e:
        module.parse_args(['--device', '@numpy', flags[-1],
                           str(tmp_path / 'file' / 'out')])
    assert e.value.code == 2
    assert '{} {}: cannot make its folder'.format(
        flags[-1], tmp_path / 'file' / 'out') in capsys.readouterr().err


# --- train_loop.py's interleaved loop --------------------------------------

def test_train_loop_interleaves_and_prints_the_ratio(capsys):
    train_loop = _load('train_loop')
    results = train_loop.main([
        '--layers', '2', '--width', '4', '--batch', '2', '--iters', '8',
        '--dtype', 'mixed16', '--variants', 'momentum_sgd,momentum_sgd+hook',
        '--interleave'])['mixed16']
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith('median of 3 updates, variants interleaved')
    assert [len(r['times_s']) for r in results.values()] == [3, 3]
    ratio = train_loop.median_ratio(results['momentum_sgd+hook'],
                                    results['momentum_sgd'])
    assert lines[-1] == ('momentum_sgd+hook / momentum_sgd: {:.3f} (median '
                         'of per-iteration ratios)'.format(ratio))


def test_median_ratio_pairs_the_iterations():
    train_loop = _load('train_loop')
    # Paired: 2, 3 and 1.5, whose median is 2; the medians' ratio is 3.
    assert train_loop.median_ratio({'times_s': [2.0, 6.0, 3.0]},
                                   {'times_s': [1.0, 2.0, 2.0]}) == 2.0


def test_train_loop_without_the_table_class_counts_nothing(monkeypatch,
                                                           capsys):
    # The kernels' module may lose Table in a rewrite: the loop still runs.
    train_loop = _load('train_loop')
    monkeypatch.setattr(train_loop, 'cuda_kernels', None)
    results = train_loop.main(['--layers', '2', '--width', '4', '--batch',
                               '2', '--iters', '6', '--variants', 'lars'])
    assert results['float32']['lars']['built'] is None
    assert capsys.readouterr().out.splitlines()[-1].split()[-2:] == [
        '-', '-']


# --- gpu_floor.py ----------------------------------------------------------

def _floor_result(floor):
    case = {'set': 'bert_large', 'precision': 'mixed16', 'method': 'lamb',
            'n_params': 335141888, 'n_arrays': 391, 'floor_bytes': 40,
            'floor_s': 3.2e-3, 'host_s': 1e-3, 'gpu_s': 4e-3,
            'wall_s': 4e-3, 'x_floor': 1.25, 'host_over_gpu': 0.25}
    slow = dict(case, set='resnet50', method='lars', floor_bytes=26,
                x_floor=2.6, host_over_gpu=0.99)
    return {'device': '@cupy:0', 'git': 'abc', 'repeat': 50, 'warmup': 5,
            'copy': {'bytes': 2 ** 30, 'seconds': 5e-4,
                     'bandwidth': 4.12e12},
            'cases': [case, slow, {'set': 'tiny', 'precision': 'float32',
                                   'method': 'lars', 'error': 'OSError: x'}],
            'loop': {'layers': 40, 'width': 512, 'batch': 256,
                     'updates': 30, 'ms': {'momentum_sgd': 9.0,
                                           'momentum_sgd+hook': 9.9},
                     'ratio': 1.1}}


def test_floor_targets_are_judged_from_the_ratios(floor):
    result = _floor_result(floor)
    assert floor.targets(result) == [
        ('bert_large mixed16 lamb: GPU time / byte floor', 1.25, 1.5),
        ('bert_large mixed16 lamb: host time / GPU time', 0.25, 0.9),
        ('resnet50 mixed16 lars: GPU time / byte floor', 2.6, 1.5),
        # The GPU time spans the host time: about 1 is host-bound.
        ('resnet50 mixed16 lars: host time / GPU time', 0.99, 0.9),
        ('train loop mixed16: (MomentumSGD + hook) / MomentumSGD', 1.1,
         1.15)]
    lines = floor.format_result(result)
    assert lines[0] == ('device @cupy:0, git abc; device copy of 1024 MiB: '
                        '4.120 TB/s (bytes read + written); 50 repeats per '
                        'case')
    assert lines[2].split() == [
        'bert_large', 'mixed16', 'lamb', '335,141,888', '40', '3.200',
        '4.000', '1.000', '1.25', '0.25']
    assert lines[4] == 'tiny        float32  lars  failed: OSError: x'
    assert 'targets: 3 of 5 met' in lines
    assert ('  resnet50 mixed16 lars: host time / GPU time = 0.990 <= 0.9  '
            'missed') in lines
    assert ('  train loop mixed16: (MomentumSGD + hook) / MomentumSGD = '
            '1.100 <= 1.15  met') in lines


def test_floor_end_to_end_on_the_cpu(floor, tmp_path, capsys):
    out = tmp_path / 'floor.json'
    status = floor.main(['--device', '@numpy', '--sets', 'tiny', '--repeat',
                         '2', '--warmup', '1', '--copy-mib', '1',
                         '--loop-iters', '7', '--loop-size', '2,4,2',
                         '--json', str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    result = json.loads(out.read_text())
    assert [(c['precision'], c['method']) for c in result['cases']] == [
        ('float32', 'lars'), ('float32', 'lamb'), ('mixed16', 'lars'),
        ('mixed16', 'lamb')]
    for c in result['cases']:
        assert 'error' not in c, c
        # On the CPU the wall time stands in for the GPU's; no host target.
        assert c['gpu_s'] is None and c['host_over_gpu'] is None
        assert c['x_floor'] == pytest.approx(c['wall_s'] / c['floor_s'])
        assert c['floor_s'] == pytest.approx(
            c['floor_bytes'] * 426 / result['copy']['bandwidth'])
    assert result['loop']['updates'] == 2 and result['loop']['ratio'] > 0
    assert 'targets: ' in printed and 'of 5 met' in printed


@pytest.mark.parametrize('argv,message', [
    (['--sets', 'tiny,vgg'], "--sets: unknown 'vgg'"),
    (['--precisions', 'float16'], "--precisions: unknown 'float16'"),
    (['--methods', ''], '--methods names none'),
    (['--loop-iters', '5'], '--loop-iters must be 0 or more than 5'),
    (['--loop-size', '40,512'], '--loop-size: three positive integers'),
    (['--device', 'cuda:0'], '--device: '),
    pytest.param(['--device', '0'], '--device 0: CuPy cannot be used (',
                 marks=pytest.mark.skipif(
                     __import__('chainer').backends.cuda.available,
                     reason='CuPy can use CUDA here')),
])
def test_floor_refuses_bad_flags(floor, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        floor.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


# --- gpu_check.sh ----------------------------------------------------------

CHECK = os.path.join(BENCHMARKS, 'gpu_check.sh')


def _check(args, tmp_path, timeout=300, **env):
    """Runs gpu_check.sh; what it prints, with the environment of a
    run here (this Python, no study, nothing of an outer test run's)."""
    full = dict(os.environ, PYTHON=sys.executable, REPRODUCE='', BEFORE='',
                PYTHONDONTWRITEBYTECODE='1')
    full.pop('CHAINER_LARS_PROGRESS', None)
    full.update(env)
    return subprocess.run(['bash', CHECK] + args, cwd=str(tmp_path),
                          env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


@pytest.mark.parametrize('args,message', [
    ([], 'usage: '),
    (['--bogus', 'out'], 'unknown option --bogus'),
    (['out', '0', 'extra'], 'usage: '),
    (['--archive'], 'usage: '),
    (['--budget', 'ten', 'out'], "--budget takes whole seconds, not 'ten'"),
    (['--budget', '209', 'out'], '--budget 209 is under the 210 s the byte '
     'floors need (10 s, keeping 200 s for the later steps; FLOOR_TIMEOUT=0 '
     'skips them)'),
    # A rehearsal may cut steps, to check the cuts: 60 s at least.
    (['--rehearse', '--budget', '59', 'out'],
     '--budget 59 is under the 60 s the steps need'),
    ([''], 'OUTDIR is empty'),
])
def test_check_usage_errors(tmp_path, args, message):
    done = _check(args, tmp_path)
    assert done.returncode == 2
    assert message in done.stdout
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('env,least', [
    # No byte floors: the other timings keep the side-by-side reserve.
    ({'FLOOR_TIMEOUT': '0'}, 150),
    ({'FLOOR_TIMEOUT': '0', 'PARALLEL_RESERVE': '100'}, 110),
    # No timing at all (BEFORE is empty in _check): the side-by-side steps.
    ({'FLOOR_TIMEOUT': '0', 'PEERS_TIMEOUT': '0', 'BENCH': '0'}, 60),
])
def test_check_budget_least_is_what_the_steps_that_run_need(
        tmp_path, env, least):
    done = _check(['--budget', str(least - 1), 'out'], tmp_path, **env)
    assert done.returncode == 2
    assert '--budget {} is under the {} s'.format(
        least - 1, least) in done.stdout
    assert not (tmp_path / 'out').exists()
    # One second more passes: the next check (OUTDIR) speaks.
    (tmp_path / 'out').write_text('')
    done = _check(['--budget', str(least), 'out'], tmp_path, **env)
    assert done.returncode == 2
    assert 'OUTDIR out is not an empty folder' in done.stdout, done.stdout


@pytest.mark.parametrize('kind', ['file', 'folder with a file'])
def test_check_refuses_an_outdir_that_holds_something(tmp_path, kind):
    if kind == 'file':
        (tmp_path / 'out').write_text('')
    else:
        (tmp_path / 'out').mkdir()
        (tmp_path / 'out' / 'summary.txt').write_text('an earlier check')
    done = _check(['--rehearse', 'out'], tmp_path)
    assert done.returncode == 2
    assert 'OUTDIR out is not an empty folder: give a new one' in done.stdout
    if kind != 'file':
        assert os.listdir(str(tmp_path / 'out')) == ['summary.txt']


def test_check_help_is_its_header(tmp_path):
    done = _check(['--help'], tmp_path)
    assert done.returncode == 0
    assert done.stdout.startswith("The GPU check of chainer-lars: the one "
                                  "script to run when a GPU is lent.")
    assert '--rehearse' in done.stdout and 'set -u' not in done.stdout


@pytest.mark.skipif(conftest._why_no_cuda() is None,
                    reason='a CUDA device is here: it would run the check')
def test_check_without_a_gpu_stops_and_still_archives(tmp_path):
    done = _check(['--archive', 'back/gc.tar.gz', 'out'], tmp_path)
    assert done.returncode == 1, done.stdout
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    assert 'no CUDA device for Chainer here (env.txt)' in summary
    assert 'chainer imports as installed' in summary
    with tarfile.open(str(tmp_path / 'back' / 'gc.tar.gz')) as tar:
        names = set(tar.getnames())
    assert {'out/summary.txt', 'out/env.txt'} <= names
    # Beside the archive, what the lent machine returns first.
    assert (tmp_path / 'back' / 'summary.txt').read_text() == summary


def _fake_chainer(tmp_path, body):
    package = tmp_path / 'fakesite' / 'chainer'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text(body)
    return str(tmp_path / 'fakesite')


def test_check_takes_chainer_through_compat(tmp_path):
    # A Chainer that imports only once compat/ is on the path, as 7.8.1
    # does on numpy 2 with the shims that compat/sitecustomize.py loads.
    site = _fake_chainer(tmp_path, 'import compat_marker  # NOQA\n')
    compat = tmp_path / 'compat'
    compat.mkdir()
    (compat / 'sitecustomize.py').write_text('')
    (compat / 'compat_marker.py').write_text('')
    done = _check(['out'], tmp_path, PYTHONPATH=site, COMPAT=str(compat),
                  WHEELS=str(tmp_path / 'none'))
    assert done.returncode == 1, done.stdout
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    assert 'chainer imports with {} on PYTHONPATH'.format(compat) in summary
    # This stand-in has no chainer.backends: the next step says so.
    assert 'the environment check failed (env.txt)' in summary


def test_check_without_chainer_compat_or_wheel_says_what_is_missing(
        tmp_path):
    site = _fake_chainer(tmp_path, 'raise ImportError("no numpy 2 shims")\n')
    done = _check(['out'], tmp_path, PYTHONPATH=site,
                  COMPAT=str(tmp_path / 'nocompat'),
                  WHEELS=str(tmp_path / 'nowheels'))
    assert done.returncode == 1
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    assert 'no {}/sitecustomize.py'.format(tmp_path / 'nocompat') in summary
    assert ('chainer does not import with PYTHON={} and there is no '
            '{}/chainer-*.whl'.format(sys.executable, tmp_path / 'nowheels')
            ) in summary


def test_check_rehearsal_runs_every_step_on_the_cpu(tmp_path, dataset_root):
    # The library before, here a copy of this one's (its numbers mean
    # nothing in a rehearsal anyway).
    shutil.copytree(os.path.join(REPO_ROOT, 'chainer_lars'),
                    str(tmp_path / 'before' / 'chainer_lars'),
                    ignore=shutil.ignore_patterns('__pycache__', 'testing'))
    (tmp_path / 'before' / 'COMMIT').write_text('229bc30ad1e5f0\n')
    done = _check(['--rehearse', '--archive', 'back/gc.tar.gz', 'out'],
                  tmp_path, timeout=600, MNIST_ROOT=dataset_root,
                  MNIST_ARGS='-b 16 -e 1 -u 8', SANITIZE='',
                  BEFORE=str(tmp_path / 'before'))
    assert done.returncode == 0, done.stdout
    out = tmp_path / 'out'
    summary = (out / 'summary.txt').read_text()
    steps = summary[summary.index('== steps'):].splitlines()[1:-1]
    assert steps == [
        '  study --reproduce: not run: REPRODUCE is empty',
        '  byte floors: passed', '  engine before/after: passed',
        '  peers: passed',
        '  bench_lars.py: passed', '  paper_model.py: passed',
        '  compute-sanitizer: not run: SANITIZE is empty',
        '  gpu tests: passed', '  MNIST mixed16: passed']
    assert summary.splitlines()[-1].endswith(
        'not run: study --reproduce, compute-sanitizer')
    assert 'GPU check REHEARSAL (CPU) passed in ' in summary
    # The gpu tests were collected, and skipped without a device.
    assert ' skipped' in (out / 'pytest_gpu.txt').read_text()
    # The end of the summary: the floors' last table and the peers'.
    assert summary.count('== byte floors (floor.txt)\ndevice @numpy') == 1
    assert 'targets: ' in summary and '## tiny: 426 parameters' in summary
    # The training loop of both versions, both dtypes, in the summary.
    engine = (out / 'engine.txt').read_text()
    assert summary.count(
        '== engine before/after, training loop (engine.txt)\nother: {} '
        '(commit 229bc30ad1e5); here: this tree; momentum_sgd, Chainer\'s '
        'own update, is the control\n{}'.format(tmp_path / 'before',
                                                engine)) == 1
    # Both versions in one process: each variant's ratio, each dtype.
    assert [line.split(':')[0] for line in engine.splitlines()
            if ': here / other ' in line] == ['momentum_sgd', 'lars'] * 2
    assert [line.split(',')[0] for line in engine.splitlines()
            if line.startswith('@numpy')] == ['@numpy float32',
                                              '@numpy mixed16']
    with tarfile.open(str(tmp_path / 'back' / 'gc.tar.gz')) as tar:
        names = set(tar.getnames())
    assert {'out/' + n for n in (
        'summary.txt', 'env.txt', 'floor.txt', 'floor.json', 'engine.txt',
        'engine.json',
        'peers.md', 'peers.json', 'bench_gpu.json', 'paper_model.txt',
        'pytest_gpu.txt', 'mnist_mixed16.txt')} <= names
    assert sorted(os.listdir(str(tmp_path / 'back'))) == [
        'floor.txt', 'gc.tar.gz', 'peers.md', 'summary.txt']


def test_check_cuts_the_timings_that_the_budget_has_no_room_for(tmp_path):
    (tmp_path / 'before' / 'chainer_lars').mkdir(parents=True)
    (tmp_path / 'before' / 'chainer_lars' / '__init__.py').write_text('')
    done = _check(['--rehearse', '--budget', '60', 'out'], tmp_path,
                  SANITIZE='', MNIST_ROOT=str(tmp_path / 'none'),
                  BEFORE=str(tmp_path / 'before'))
    assert done.returncode == 1, done.stdout
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    steps = summary[summary.index('== steps'):].splitlines()[1:-1]
    # Cut for time, bench_lars.py too (it read "not run" and passed).
    assert steps[1:5] == [
        '  byte floors: cut: no time left in the budget',
        '  engine before/after: cut: no time left in the budget',
        '  peers: cut: no time left in the budget',
        '  bench_lars.py: cut: no time left in the budget']
    assert '  gpu tests: passed' in steps
    assert re.search(r'GPU check REHEARSAL \(CPU\) FAILED in \d+ s: byte '
                     r'floors, engine before/after, peers, bench_lars.py$',
                     summary.splitlines()[-1])


def test_check_fails_when_the_paper_model_fails(tmp_path):
    # Its exit status was ignored and the check passed all the same.
    python = tmp_path / 'python'
    python.write_text(
        '#!/bin/sh\n'
        '[ "$1" = benchmarks/paper_model.py ] && exit 3\n'
        'exec "{}" "$@"\n'.format(sys.executable))
    python.chmod(0o755)
    done = _check(['--rehearse', 'out'], tmp_path, PYTHON=str(python),
                  FLOOR_TIMEOUT='0', PEERS_TIMEOUT='0', TEST_TIMEOUT='0',
                  SANITIZE='', MNIST_ROOT=str(tmp_path / 'none'))
    assert done.returncode == 1, done.stdout
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    steps = summary[summary.index('== steps'):].splitlines()[1:-1]
    assert steps[4:6] == ['  bench_lars.py: passed',
                          '  paper_model.py: FAILED (exit status 3)']
    assert re.search(r'FAILED in \d+ s: paper_model.py$',
                     summary.splitlines()[-1])


# Where gpu_check.sh looks for it.
_SANITIZER_HERE = bool(shutil.which('compute-sanitizer') or glob.glob(
    '/usr/local/cuda*/bin/compute-sanitizer') or glob.glob(
    '/opt/nvidia/*/compute-sanitizer'))


@pytest.mark.skipif(_SANITIZER_HERE, reason='compute-sanitizer is here')
@pytest.mark.parametrize('mnist', [False, True])
def test_check_short_of_time_tells_absent_tools_from_cut_steps(
        tmp_path, mnist, request):
    # Under 20 s left for the side-by-side steps, an absent
    # compute-sanitizer or MNIST read as cut for time, failing the check.
    # Bash starts SECONDS at the value it inherits: 35 of a 60 s budget
    # spent leaves 15 s there (the timings are all cut before).
    root = (request.getfixturevalue('dataset_root') if mnist
            else str(tmp_path / 'none'))
    done = _check(['--rehearse', '--budget', '60', 'out'], tmp_path,
                  SECONDS='35', MNIST_ROOT=root)
    assert done.returncode == 1, done.stdout
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    steps = summary[summary.index('== steps'):].splitlines()[1:-1]
    assert steps[-3:] == [
        '  gpu tests: cut: no time left in the budget',
        '  compute-sanitizer: not run: compute-sanitizer not found',
        '  MNIST mixed16: cut: no time left in the budget' if mnist else
        '  MNIST: not run: no MNIST under {}'.format(root)]


@pytest.mark.parametrize('value', ['90s', '-5', '1.5'])
def test_check_refuses_a_limit_that_is_not_whole_seconds(tmp_path, value):
    done = _check(['--rehearse', 'out'], tmp_path, PEERS_TIMEOUT=value)
    assert done.returncode == 2
    assert done.stdout.strip().splitlines() == [
        "{}: PEERS_TIMEOUT takes whole seconds (0 skips its step), not "
        "'{}'".format(CHECK, value)]
    assert not (tmp_path / 'out').exists()


_FAKE_SANITIZER = """#!/bin/sh
# compute-sanitizer's stand-in: --tool TOOL ...; prints what each tool's
# end looks like, or sleeps past its limit (SLOW_TOOL).
[ "$2" = "$SLOW_TOOL" ] && exec sleep 60
echo "========= COMPUTE-SANITIZER"
echo "3 passed, 280 deselected in 0.10s"
case $2 in
    racecheck) echo "========= RACECHECK SUMMARY: 0 hazards displayed" \\
        "(0 errors, 0 warnings)" ;;
    *) echo "========= ERROR SUMMARY: 0 errors" ;;
esac
"""


@pytest.mark.parametrize('slow', ['', 'synccheck'])
def test_check_skips_on_purpose_and_fails_a_sanitizer_cut_for_time(
        tmp_path, slow):
    # The device's command skips the floors and peers with 0: no failure.
    # compute-sanitizer's tools share its time; one cut for it fails the
    # check, and racecheck's hazard count is in its status line.
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'compute-sanitizer').write_text(_FAKE_SANITIZER)
    (bin_dir / 'compute-sanitizer').chmod(0o755)
    done = _check(['--rehearse', 'out'], tmp_path, FLOOR_TIMEOUT='0',
                  PEERS_TIMEOUT='00', BENCH='0', TEST_TIMEOUT='0',
                  SANITIZE_TIMEOUT='20', SLOW_TOOL=slow,
                  MNIST_ROOT=str(tmp_path / 'none'),
                  PATH=os.pathsep.join([str(bin_dir), os.environ['PATH']]))
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    steps = summary[summary.index('== steps'):].splitlines()[1:-1]
    assert steps[:7] == [
        '  study --reproduce: not run: REPRODUCE is empty',
        '  byte floors: not run: skipped (FLOOR_TIMEOUT=0)',
        '  engine before/after: not run: BEFORE is empty',
        '  peers: not run: skipped (PEERS_TIMEOUT=0)',
        '  bench_lars.py: not run: BENCH=0',
        '  gpu tests: not run: skipped (TEST_TIMEOUT=0)',
        '  MNIST: not run: no MNIST under {}'.format(tmp_path / 'none')]
    status = (tmp_path / 'out' / 'sanitize.status').read_text().splitlines()
    assert status[0].startswith('memcheck: passed; 3 passed, 280 '
                                'deselected in 0.10s ========= ERROR '
                                'SUMMARY: 0 errors (exit status 0, limit ')
    assert status[1].startswith(
        'racecheck: passed; 3 passed, 280 deselected in 0.10s ========= '
        'RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings) '
        '(exit status 0, limit ')
    # Limits within the sanitizer's 20 s, each tool's leftover passed on.
    limits = [int(re.search(r'limit (\d+) s\)$', line).group(1))
              for line in status]
    assert limits[0] == 12 and 10 <= limits[1] <= 12 and limits[2] <= 20
    if not slow:
        assert done.returncode == 0, done.stdout
        assert steps[7] == '  compute-sanitizer: passed'
        assert status[2].startswith('synccheck: passed; ')
        return
    assert done.returncode == 1, done.stdout
    assert status[2].startswith('synccheck: cut: not done within its ')
    assert steps[7] == ('  compute-sanitizer: cut: a tool was not done in '
                        'its time (sanitize.status)')
    assert summary.splitlines()[-1].endswith(': compute-sanitizer')
