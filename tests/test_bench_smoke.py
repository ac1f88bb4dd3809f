"""Smoke test of benchmarks/bench_lars.py: its CPU path on the MLP set.

Checks the structure of the table and the JSON only; timings on a shared
machine prove nothing, so nothing here compares them.
"""

import importlib.metadata
import importlib.util
import json
import os
import re

import pytest

from tests import REPO_ROOT
from tests import benchmark


_PATH = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'benchmarks', 'bench_lars.py')


@pytest.fixture(scope='module')
def bench():
    return benchmark('bench_lars')


def test_main_writes_table_and_json(bench, tmp_path, capsys):
    out = tmp_path / 'bench.json'
    bench.main(['--device', '@numpy', '--models', 'mlp',
                '--dtypes', 'float32,float16,mixed16',
                '--weight-decays', '5e-4,0',
                '--reps', '2', '--warmup', '1', '--json', str(out)])
    printed = capsys.readouterr().out
    assert 'clock: wall' in printed and 'frac = floor / variant' in printed
    assert 'mlp float32 0.0005' in printed
    assert 'failed' not in printed

    result = json.loads(out.read_text())
    assert result['machine']['device'] == '@numpy'
    # What the README quotes of a run: Numba's version and the run's time.
    assert result['machine']['numba'] == importlib.metadata.version('numba')
    assert result['machine']['run_seconds'] > 0
    assert result['command'].startswith('bench_lars.py --device @numpy')
    cases = result['cases']
    assert [(c['dtype'], c['weight_decay']) for c in cases] == [
        ('float32', 5e-4), ('float32', 0.0),
        ('float16', 5e-4), ('float16', 0.0),
        ('mixed16', 5e-4), ('mixed16', 0.0)]
    for c in cases:
        assert c['model'] == 'mlp'
        assert c['n_arrays'] == 6
        assert c['n_params'] == 784 * 1000 + 1000 * 1000 + 1000 * 10 + 2010
        assert c['errors'] == {}
        # mixed16: the optimizers' variants (the hooks alone would rescale
        # float16 gradients that their rules rescale on the masters), and
        # LARS in float32 beside them.
        assert set(c['median_s']) == (
            set(bench.VARIANTS) - {'lars_float32'}
            if c['dtype'] != 'mixed16' else
            {'floor', 'momentum_sgd', 'momentum_sgd+chainer',
             'momentum_sgd+hook', 'momentum_sgd+hook_pa', 'lars', 'lars_pa',
             'lars_float32'})
        assert set(c['floor_fraction']) == set(c['median_s'])
        assert all(v > 0 for v in c['median_s'].values())
        assert all(v > 0 for v in c['floor_fraction'].values())
        assert c['floor_fraction']['floor'] == 1.0
        assert set(c['speedups']) == {
            s for s, fast, slow in bench.SPEEDUPS
            if fast in c['median_s'] and slow in c['median_s']}
        assert len(c['speedups']) == (3 if c['dtype'] == 'mixed16' else 5)
        assert c['reps'] == 2 and c['clock'] == 'wall'
        assert all(len(t) == 2 for t in c['times_s'].values())
        assert all(len(t) == 2 for t in c['cpu_times_s'].values())


def test_speed_up_columns_are_labelled_slower_over_faster(bench, capsys):
    # Each head names the slower variant first, as the ratio is computed.
    label = {'chainer_hook': 'ch', 'hook': 'hook', 'hook_pa': 'pa',
             'momentum_sgd': 'sgd', 'momentum_sgd+chainer': 'sgd+ch',
             'momentum_sgd+hook': 'sgd+ours', 'lars': 'LARS',
             'lars_pa': 'pa'}
    heads = ['{}/{}'.format(label[slow], label[fast])
             for _, fast, slow in bench.SPEEDUPS]
    assert heads == ['ch/hook', 'sgd+ch/sgd+ours', 'sgd/LARS', 'pa/hook',
                     'pa/LARS']
    header = bench.format_tables({'cases': []}).splitlines()[1]
    assert header.endswith('| ' + ' '.join(heads))


def test_models_build_without_running(bench):
    link = bench.build_model('cifar_resnet20', 'float16')
    params = list(link.params())
    assert all(p.dtype.name == 'float16' for p in params)
    # ResNet-20: 0.27 M parameters (He et al. 2016, Table 6).
    assert 260000 < sum(p.size for p in params) < 280000
    with pytest.raises(ValueError, match='unknown model'):
        bench.build_model('vgg', 'float32')


def test_run_checks_its_arguments_first(bench):
    with pytest.raises(ValueError, match='unknown model'):
        bench.run(models=('mlp', 'vgg'))
    with pytest.raises(ValueError, match='floating point'):
        bench.run(models=('mlp',), dtypes=('int32',))
    with pytest.raises(ValueError, match='clock'):
        bench.run(models=('mlp',), clock='tsc')


def test_linear_cost_sets_and_their_time_per_element(bench):
    assert [p.size for p in bench.build_model('one_32m', 'float32').params()
            ] == [32 * 2 ** 20]
    many = list(bench.build_model('many_1k', 'float16').params())
    assert [p.size for p in many] == [1024] * 1000
    result = bench.run(models=('many_1k',), dtypes=('float32',),
                       weight_decays=(0.0,), reps=1, warmup=0)
    case, = result['cases']
    assert case['errors'] == {} and case['targets'] == []
    assert 'ns/e' in bench.format_tables(result)


def test_targets_are_judged_from_the_ratios(bench):
    basis = {'lars': [1.0, 1.0], 'momentum_sgd': [2.0, 1.0],
             'momentum_sgd+hook': [2.4, 1.3], 'floor': [1.0, 1.0],
             'hook': [1.0, 1.2]}
    median = {k: 1.0 for k in basis}
    got = bench._targets('cifar_resnet20', 'float32', basis, median, {})
    assert [(t['value'], t['pass']) for t in got] == [
        (0.75, False), (1.25, True)]
    got = bench._targets('resnet50', 'float32', basis, median,
                         {'hook': 0.95})
    assert [(t['value'], t['pass']) for t in got] == [
        (0.95, True), (0.75, True)]
    lines = bench.summary({'clock': 'cpu', 'cases': [
        {'model': 'resnet50', 'dtype': 'float32', 'weight_decay': 0.0,
         'targets': got}]})
    assert lines[0].strip() == 'targets (cpu clock):'
    assert lines[1].endswith('PASS') and 'resnet50 float32 wd=0' in lines[1]
    mixed = dict(basis, lars=[1.25, 1.0], lars_float32=[1.0, 1.0],
                 momentum_sgd=[3.0, 2.0])
    got = bench._targets('resnet50', 'mixed16', mixed,
                         {k: 1.0 for k in mixed}, {})
    assert [(t['name'], round(t['value'], 3), t['pass']) for t in got] == [
        ('LARS / MomentumSGD, both mixed16', 0.458, True),
        ('LARS mixed16 / LARS float32', 1.125, True)]


_TINY = ['--models', 'mlp', '--dtypes', 'float32', '--weight-decays', '0',
         '--reps', '1', '--warmup', '0']


def test_a_failed_target_exits_1_after_writing_everything(
        bench, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, 'TARGETS', (
        ('mlp', 'float32', 'floor / LARS', 'ratio', 'floor', 'lars', 0.0),))
    out = tmp_path / 'bench.json'
    with pytest.raises(SystemExit) as e:
        bench.main(_TINY + ['--json', str(out)])
    assert e.value.code == 1
    printed = capsys.readouterr().out
    assert re.search(r'target floor / LARS: \d+\.\d{3} <= 0  FAIL', printed)
    assert 'FAILED (1): mlp float32 wd=0: target floor / LARS: ' in printed
    case, = json.loads(out.read_text())['cases']
    assert case['targets'][0]['pass'] is False


def test_a_target_whose_variant_raised_fails(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, 'TARGETS', (
        ('mlp', 'float32', 'LARS / MomentumSGD', 'ratio', 'lars',
         'momentum_sgd', 100.0),))
    make = bench._make_variants

    def broken(case, weight_decay):
        variants = make(case, weight_decay)

        def lars():
            raise MemoryError('no room')
        variants['lars'] = lars
        return variants
    monkeypatch.setattr(bench, '_make_variants', broken)
    with pytest.raises(SystemExit) as e:
        bench.main(_TINY)
    assert e.value.code == 1
    printed = capsys.readouterr().out
    assert ('    target LARS / MomentumSGD: <= 100  FAIL (lars failed)'
            in printed)
    assert ('  mlp float32 wd=0: LARS / MomentumSGD = <= 100  FAIL (lars '
            'failed)') in printed
    assert '    lars failed: MemoryError: no room' in printed


def test_a_case_that_raised_fails_its_targets(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, 'TARGETS', (
        ('mlp', 'float32', 'LARS / MomentumSGD', 'ratio', 'lars',
         'momentum_sgd', 100.0),))

    def run_case(*args, **kwargs):
        raise MemoryError('no room')
    monkeypatch.setattr(bench, 'run_case', run_case)
    with pytest.raises(SystemExit) as e:
        bench.main(_TINY)
    assert e.value.code == 1
    printed = capsys.readouterr().out
    assert 'mlp float32 0                  case failed: MemoryError' in printed
    assert 'LARS / MomentumSGD = <= 100  FAIL (lars, momentum_sgd failed)' \
        in printed


def test_gpu_host_mode_counts_launches_and_judges_ratios(bench, tmp_path,
                                                         capsys):
    from chainer_lars.testing import cuda_emulator
    # A missing compiler fails here, not as a failed case of the benchmark.
    cuda_emulator.compiler()  # EmulatorError: 'no C++ compiler found ...'
    out = tmp_path / 'host.json'
    try:
        bench.main(['--gpu-host', '--reps', '3', '--json', str(out)])
    except SystemExit as e:  # a target failed: timings prove nothing here
        assert e.code == 1
    printed = capsys.readouterr().out
    assert 'GPU host code (emulated launches are no-ops)' in printed
    result, = json.loads(out.read_text())['gpu_host']
    assert result['model'] == 'cifar_resnet20' and result['reps'] == 3
    n = result['n_arrays']
    launches = {k: v['launches'] for k, v in result['variants'].items()}
    # A constant number of launches for the multi-tensor paths.
    assert launches == {
        'momentum_sgd (CPU)': 0, 'lars (GPU host)': 2,
        'lars per array (GPU host)': 2 * n, 'hook (GPU host)': 2,
        'momentum_sgd (GPU host)': n}
    for v in result['variants'].values():
        assert v['us'] > 0 and v['us_per_array'] * n == pytest.approx(v['us'])
    assert result['variants']['momentum_sgd (CPU)'][
        'per_array_vs_baseline'] == 1.0
    for t in result['targets']:
        assert t['pass'] == (t['value'] <= 0.25)
        assert ('PASS' if t['pass'] else 'FAIL') in printed


def test_paper_model_of_resnet50_and_its_fractions(tmp_path, capsys):
    paper = benchmark('paper_model')
    n, arrays = 25557096, 162
    hook = paper.model('hook', n, arrays, 'float32')
    # Norms read w and g, the rescale reads both and writes g: 20 N bytes.
    assert hook == {'bytes': 20 * n, 'launches': 2,
                    'seconds': 20 * n / 4.8e12}
    assert paper.model('lars', n, arrays, 'float16')['bytes'] == 14 * n
    assert paper.model('lars_pa', n, arrays, 'float32')['launches'] == 324
    assert paper.model('momentum_sgd+hook', n, arrays,
                       'float32')['launches'] == 164
    table = paper.model_table(n, arrays, 4.8e12)
    assert '| `lars` | 28 N = 716 / 358 MB | 2 | 0.149 / 0.075 ms |' in table

    result = {'cases': [
        {'model': 'resnet50', 'dtype': 'float32', 'weight_decay': 5e-4,
         'n_params': n, 'n_arrays': arrays,
         'median_s': {'lars': 2 * 28 * n / 4.8e12, 'chainer_hook': 1.0}},
        {'model': 'resnet50', 'dtype': 'float32', 'weight_decay': 0.0,
         'n_params': n, 'n_arrays': arrays, 'median_s': {'lars': 1.0}}]}
    rows = paper.fractions(result, 4.8e12)
    # Only modelled variants, only with weight decay on.
    assert [(r[0], r[1]) for r in rows] == [('resnet50 float32', 'lars')]
    assert rows[0][4] == pytest.approx(0.5)
    path = tmp_path / 'bench.json'
    path.write_text(json.dumps(result))
    assert paper.main([str(path)]) == 0
    assert '0.500' in capsys.readouterr().out
    path.write_text('{"gpu_host": []}')
    with pytest.raises(SystemExit):
        paper.main([str(path)])
    assert 'no "cases"' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        paper.main([str(path), '--bandwidth', '0'])


def test_byte_floors_count_each_pass_by_hand():
    paper = benchmark('paper_model')
    # LARS: the norms read w and g; the step reads w, g, v, writes w, v.
    assert paper.floor_bytes('lars', 'float32') == 4 * (2 + 3 + 2) == 28
    # mixed16: g is float16 (2 bytes), the master w and v float32, and the
    # step also writes the float16 weight: 4 + 2, then 2 + 4 + 4, 4 + 4 + 2.
    assert paper.floor_bytes('lars', 'mixed16') == 6 + 10 + 10 == 26
    # LAMB: the first pass reads w, g, m, v and writes m, v; the second
    # reads w, m, v (to remake the update) and writes w.
    assert paper.floor_bytes('lamb', 'float32') == 4 * (4 + 2 + 3 + 1) == 40
    assert paper.floor_bytes('lamb', 'mixed16') == (
        (4 + 2 + 4 + 4) + (4 + 4) + (4 + 4 + 4) + (4 + 2)) == 40
    assert paper.floor_bytes('momentum_sgd', 'float32') == 20
    assert paper.floor_bytes('momentum_sgd', 'mixed16') == 2 + 4 * 4 + 2
    assert paper.floor_bytes('adam', 'float32') == 28
    assert paper.floor_bytes('adam', 'mixed16') == 2 + 4 * 6 + 2
    for method in paper.FLOOR_PASSES:
        assert paper.floor_bytes(method, 'float16') * 2 == paper.floor_bytes(
            method, 'float32')
        assert paper.floor_bytes(method, 'float64') == 2 * paper.floor_bytes(
            method, 'float32')
    assert paper.floor_seconds('lars', 'float32', 10 ** 6, 4e12) == (
        pytest.approx(28e6 / 4e12))


def test_byte_floors_agree_with_the_paper_model():
    # Where the older model counts the same passes, the floors match it.
    paper = benchmark('paper_model')
    for variant in ('lars', 'hook', 'momentum_sgd'):
        reads, writes = paper.PASSES[variant]
        for dtype, size in paper.ITEMSIZE.items():
            assert paper.floor_bytes(variant, dtype) == (
                (reads + writes) * size)
    assert paper.floor_bytes('lars', 'mixed16') == paper.MIXED16['lars'][0]


def test_readme_counts_mixed16_lars_bytes_as_the_model_does(bench):
    # The norms read the master and the float16 gradient (the kernel's S
    # and G in mixed16), not the float16 weight too (which made 28 N).
    paper = benchmark('paper_model')
    with open(os.path.join(os.path.dirname(_PATH), 'README.md')) as f:
        text = ' '.join(f.read().split())
    start = text.index('In mixed16 (float16 weights and gradients')
    sentence = text[start:text.index('ms;', start)]
    parts = [int(n) for n in re.findall(r'\((\d+) N\)', sentence)]
    assert parts == [6, 10, 10] and '26 N' in sentence
    assert sum(parts) == paper.floor_bytes('lars', 'mixed16')
    # The targets' kinds are the ones TARGETS' comment describes.
    assert {t[3] for t in bench.TARGETS} == {'ratio', 'floor', 'below'}


@pytest.mark.parametrize('method,precision,message', [
    ('sgd', 'float32', "no byte floor for 'sgd'"),
    ('lars', 'bfloat16', "no byte floor in 'bfloat16'"),
    ('hook', 'mixed16', 'no byte floor of its own in mixed16'),
])
def test_byte_floor_refuses_what_it_does_not_model(method, precision,
                                                   message):
    paper = benchmark('paper_model')
    with pytest.raises(ValueError, match=message):
        paper.floor_bytes(method, precision)


def test_paper_model_prints_the_floor_table():
    paper = benchmark('paper_model')
    table = paper.floor_table(10 ** 6, 1e12)
    assert table[2] == '| `lars` | 28 / 26 | 0.028 ms / 0.026 ms |'
    assert '| `hook` | 20 / - | 0.020 ms / - |' in table
    assert len(table) == 2 + len(paper.FLOOR_PASSES)


@pytest.mark.parametrize('argv,message', [
    (['--dtypes', 'int8'], '--dtypes int8: not a floating-point dtype'),
    (['--dtypes', 'float32,nosuch'], '--dtypes nosuch: not a NumPy dtype'),
    (['--models', 'mlp', 'vgg'], '--models vgg: unknown model'),
    (['--weight-decays', '-1'], '--weight-decays -1: must be finite'),
    (['--device', 'foo'], '--device foo: '),
    pytest.param(['--device', '@cupy:0'],
                 '--device @cupy:0: CuPy cannot be used (',
                 marks=pytest.mark.skipif(
                     __import__('chainer').backends.cuda.available,
                     reason='CuPy can use CUDA here')),
])
def test_bad_flags_are_usage_errors(bench, capsys, argv, message):
    """One line naming the flag, not a traceback from inside run()."""
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert 'error: ' + message in line
    # Chainer's CuPy message ran "...#installation).libcublas...".
    assert ').' not in line


def test_list_flags_take_spaces_or_commas(bench):
    spaced = bench.parse_args(['--models', 'mlp', 'many_1k', '--dtypes',
                               'float32', 'float16', '--weight-decays',
                               '5e-4', '0'])
    commas = bench.parse_args(['--models', 'mlp,many_1k', '--dtypes',
                               'float32,float16', '--weight-decays',
                               '5e-4,0'])
    assert vars(spaced) == vars(commas)
    assert spaced.models == ('mlp', 'many_1k')
    assert spaced.weight_decays == (5e-4, 0.0)


_FAKE_BENCH = '''
import json, sys
out = sys.argv[sys.argv.index('--json') + 1]
ms, ok = {ms!r}, {ok!r}
json.dump({{'cases': [{{
    'model': 'mlp', 'dtype': 'float32', 'weight_decay': 0.0005,
    'median_s': {{'lars': ms * 1e-3, 'floor': 1e-3}},
    'floor_fraction': {{'lars': 1.0 / ms, 'floor': 1.0}},
    'targets': [{{'name': 'lars <= 2 x floor', 'pass': ok}}]}}]}},
    open(out, 'w'))
sys.exit(0 if ok else 1)
'''


def _fake_tree(root, ms, ok):
    (root / 'benchmarks').mkdir(parents=True)
    (root / 'benchmarks' / 'bench_lars.py').write_text(
        _FAKE_BENCH.format(ms=ms, ok=ok))
    return str(root)


@pytest.mark.parametrize('new_ok', [True, False])
def test_compare_prints_ratios_and_both_versions_targets(tmp_path, capsys,
                                                         new_ok):
    compare = benchmark('compare')
    old = _fake_tree(tmp_path / 'old', 2.0, True)
    new = _fake_tree(tmp_path / 'new', 1.0, new_ok)
    import sys
    argv = sys.argv
    sys.argv = ['compare.py', old, new, '--rounds', '2', '--', '--x']
    try:
        status = compare.main()
    finally:
        sys.argv = argv
    printed = capsys.readouterr().out
    row = [line.split() for line in printed.splitlines()
           if line.startswith('mlp')]
    assert row == [
        ['mlp', 'float32', 'wd=0.0005', 'lars', '2.000', '1.000', '0.500',
         '0.500'],
        ['mlp', 'float32', 'wd=0.0005', 'floor', '1.000', '1.000', '1.000',
         '1.000']]
    assert 'targets of old: 1 of 1 PASS in every round' in printed
    if new_ok:
        assert status == 0
        assert 'targets of new: 1 of 1 PASS in every round' in printed
    else:
        assert status == 1
        assert ('targets of new: 0 of 1 PASS in every round\n'
                '  FAIL in a round: mlp float32 wd=0.0005: lars <= 2 x floor'
                in printed)


def test_compare_reads_results_with_failed_cases_and_variants(
        tmp_path, capsys, monkeypatch):
    # An old commit's bench may fail a case (no 'median_s') or the floor
    # (no 'floor_fraction'), and exit 1: the comparison goes on.
    compare = benchmark('compare')
    for tree in ('old', 'new'):
        (tmp_path / tree / 'benchmarks').mkdir(parents=True)
        (tmp_path / tree / 'benchmarks' / 'bench_lars.py').write_text(
            'import json, sys\n'
            'out = sys.argv[sys.argv.index("--json") + 1]\n'
            'json.dump({"cases": [\n'
            '  {"model": "mlp", "dtype": "float32", "weight_decay": 0.0,\n'
            '   "error": "MemoryError: x"},\n'
            '  {"model": "mlp", "dtype": "float16", "weight_decay": 0.0,\n'
            '   "median_s": {"lars": 1.0, "momentum_sgd": 2.0},\n'
            '   "floor_fraction": {}, "errors": {"floor": "boom"},\n'
            '   "targets": [{"name": "t", "value": None, "pass": False}]}]},\n'
            '  open(out, "w"))\n'
            'sys.exit(1)\n')
    monkeypatch.setattr('sys.argv', ['compare.py', str(tmp_path / 'old'),
                                     str(tmp_path / 'new'), '--rounds', '1'])
    assert compare.main() == 1
    printed = capsys.readouterr().out
    assert [line.split() for line in printed.splitlines()
            if line.startswith('mlp')] == [
        ['mlp', 'float16', 'wd=0.0', 'lars', '1000.000', '1000.000', '1.000'],
        ['mlp', 'float16', 'wd=0.0', 'momentum_sgd', '2000.000', '2000.000',
         '1.000']]
    assert ('failed in a round of old: mlp float32 wd=0.0: MemoryError: x'
            in printed)
    assert ('failed in a round of new: mlp float16 wd=0.0 floor: boom'
            in printed)
    assert 'targets of old: 0 of 1 PASS in every round' in printed


@pytest.mark.parametrize('trees,message', [
    (['/nonexistent', '{root}'], 'old /nonexistent: no such folder'),
    (['{root}', '{tmp}'], 'new {tmp}: no {tmp}/benchmarks/bench_lars.py'),
])
def test_compare_refuses_a_tree_it_cannot_run(tmp_path, capsys,
                                              monkeypatch, trees, message):
    compare = benchmark('compare')
    root = os.path.dirname(os.path.dirname(_PATH))
    monkeypatch.setattr('sys.argv', ['compare.py'] + [
        t.format(tmp=tmp_path, root=root) for t in trees])
    with pytest.raises(SystemExit) as raised:
        compare.main()
    assert raised.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


def test_compare_runs_a_relative_tree_with_pythonpath_kept(
        tmp_path, monkeypatch):
    # What gpu_check.sh's machine needs: Chainer and the numpy-2 shims on
    # PYTHONPATH stay there, after the tree.
    compare = benchmark('compare')
    (tmp_path / 'old' / 'benchmarks').mkdir(parents=True)
    (tmp_path / 'old' / 'benchmarks' / 'bench_lars.py').write_text(
        'import json, os, sys\n'
        'with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:\n'
        '    json.dump({"pythonpath": os.environ["PYTHONPATH"],\n'
        '               "cwd": os.getcwd()}, f)\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(['/x/shims', '/x/site']))
    result = compare._run('old', [], str(tmp_path / 'out.json'))
    tree = str(tmp_path / 'old')
    assert result == {'pythonpath': os.pathsep.join(
        [tree, '/x/shims', '/x/site']), 'cwd': tree}


_FAKE_LOOP = """
import json, sys
import marker  # the tree's own, first on PYTHONPATH
args = sys.argv[1:]
with open(args[args.index('--json') + 1], 'w') as f:
    json.dump({'train_loop': [{'dtype': 'mixed16', 'variants': {
        'momentum_sgd': {'ms': 3.0}, 'lars': {'ms': marker.MS}}}],
        'args': args}, f)
"""


def test_compare_times_train_loop_with_the_new_trees_script(tmp_path,
                                                            monkeypatch,
                                                            capsys):
    # The old tree has no train_loop.py (or one that writes no JSON): the
    # new tree's runs on both, each with its own library first.
    compare = benchmark('compare')
    for tree, ms in (('old', 2.0), ('new', 0.5)):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / 'marker.py').write_text('MS = {}\n'.format(ms))
    (tmp_path / 'new' / 'benchmarks').mkdir()
    (tmp_path / 'new' / 'benchmarks' / 'train_loop.py').write_text(
        _FAKE_LOOP)
    monkeypatch.setattr('sys.argv', [
        'compare.py', str(tmp_path / 'old'), str(tmp_path / 'new'),
        '--bench', 'train_loop', '--rounds', '2', '--', '--dtype',
        'mixed16'])
    assert compare.main() == 0
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines()
            if line.startswith('train loop')]
    assert rows == [
        ['train', 'loop', 'mixed16', 'momentum_sgd', '3.000', '3.000',
         '1.000'],
        ['train', 'loop', 'mixed16', 'lars', '2.000', '0.500', '0.250']]
    assert 'targets of' not in printed  # train_loop.py has none


def test_compare_refuses_train_loop_without_the_new_trees_script(
        tmp_path, monkeypatch, capsys):
    compare = benchmark('compare')
    monkeypatch.setattr('sys.argv', ['compare.py', str(tmp_path),
                                     str(tmp_path), '--bench', 'train_loop'])
    with pytest.raises(SystemExit) as raised:
        compare.main()
    assert raised.value.code == 2
    assert '--bench train_loop: no {}'.format(
        tmp_path / 'benchmarks' / 'train_loop.py') in capsys.readouterr().err


def test_train_loop_runs_both_dtypes_and_writes_json(tmp_path, capsys):
    train_loop = benchmark('train_loop')
    out = tmp_path / 'loop.json'
    results = train_loop.main([
        '--layers', '2', '--width', '4', '--batch', '2', '--iters', '7',
        '--dtype', 'float32,mixed16', '--variants', 'momentum_sgd,lars',
        '--json', str(out)])
    headers = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith('@numpy')]
    assert headers == ['@numpy {}, MLP of 2 layers of 4, batch 2, median '
                       'of 2 updates'.format(d) for d in ('float32',
                                                          'mixed16')]
    with open(str(out)) as f:
        written = json.load(f)['train_loop']
    assert [loop['dtype'] for loop in written] == ['float32', 'mixed16']
    for loop in written:
        assert loop['device'] == '@numpy' and loop['layers'] == 2
        assert sorted(loop['variants']) == ['lars', 'momentum_sgd']
        for name, row in loop['variants'].items():
            assert row == results[loop['dtype']][name]
            assert len(row['times_s']) == 2 and row['ms'] > 0


@pytest.mark.parametrize('dtype', ['float32', 'mixed16'])
def test_compare_inprocess_times_the_hook_on_all_arrays(tmp_path, dtype):
    # This tree against a renamed copy of itself (made under TMPDIR), on
    # the NumPy passes: quick, and the script's own path all the same.
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(_PATH))
    env = dict(os.environ, TMPDIR=str(tmp_path), CHAINER_LARS_NUMBA='0',
               PYTHONPATH=root)
    done = subprocess.run(
        [sys.executable, _PATH.replace('bench_lars', 'compare_inprocess'),
         root, '--face', 'hook_mt', '--dtype', dtype, '--rounds', '1'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[-4] == ('hook(optimizer) over cifar_resnet20 in {} (60 '
                         'arrays), weight_decay=0.0, 1 rounds'.format(dtype))
    assert re.match(r'new/old: min \d+\.\d{3}, median \d+\.\d{3}$',
                    lines[-1])
    # The renamed copy (some MB) is gone with the process.
    assert os.listdir(str(tmp_path)) == []


def test_train_loop_times_every_variant_on_the_cpu(capsys):
    train_loop = benchmark('train_loop')
    train_loop.main(['--layers', '3', '--width', '8', '--batch', '4',
                     '--iters', '6', '--dtype', 'mixed16'])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ('@numpy mixed16, MLP of 3 layers of 8, batch 4, '
                        'median of 1 updates')
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == list(train_loop.VARIANTS)
    for row in rows:
        # 6 arrays; the update, its host part (all of it on the CPU); no
        # pointer table to count (the addresses travel with each update
        # since the lighter engine).
        assert row[1] == '6' and float(row[2]) >= float(row[3]) > 0
        assert row[4:] == ['-', '-']


def test_train_loop_compares_another_tree_in_one_process(tmp_path):
    # This tree against a renamed copy of itself (made under TMPDIR): each
    # variant twice, interleaved, and the ratios of both.
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(_PATH))
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=root)
    out = tmp_path / 'loop.json'
    done = subprocess.run(
        [sys.executable, _PATH.replace('bench_lars', 'train_loop'),
         '--other', root, '--layers', '2', '--width', '4', '--batch', '2',
         '--iters', '7', '--variants', 'momentum_sgd,lars_pa', '--dtype',
         'mixed16', '--json', str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    start = lines.index('@numpy mixed16, MLP of 2 layers of 4, batch 2, '
                        'median of 2 updates, variants interleaved, each '
                        'variant also with the chainer_lars of {} (rows '
                        'marked (other))'.format(root))
    names = ['momentum_sgd', 'lars_pa', 'momentum_sgd (other)',
             'lars_pa (other)']
    rows = lines[start + 2:start + 6]
    assert [row[:32].strip() for row in rows] == names
    for name in names[:2]:
        assert re.match(re.escape(name) + r': here / other \d+\.\d{3}, host '
                        r'part \d+\.\d{3} \(medians of per-iteration '
                        r'ratios\)$', lines[start + 6 + names.index(name)])
    with open(str(out)) as f:
        loop, = json.load(f)['train_loop']
    assert loop['other'] == root and loop['interleaved'] is True
    assert sorted(loop['variants']) == sorted(names)
    for row in loop['variants'].values():
        assert len(row['times_s']) == len(row['host_s']) == 2
    # The renamed copy (some MB) is gone with the process.
    assert os.listdir(str(tmp_path)) == ['loop.json']


def test_train_loop_times_the_gpu_paths_host_code_on_the_emulator(capsys):
    from chainer_lars.testing import emulated_cupy
    train_loop = benchmark('train_loop')
    results = train_loop.main([
        '--emulate', '--layers', '2', '--width', '4', '--batch', '2',
        '--iters', '6', '--variants', 'lars,lars_pa', '--dtype', 'mixed16'])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ('@cupy:0 (emulated, launches no-ops) mixed16, MLP of '
                        '2 layers of 4, batch 2, median of 1 updates')
    assert [line.split()[0] for line in lines[2:]] == ['lars', 'lars_pa']
    assert sorted(results['mixed16']) == ['lars', 'lars_pa']
    from chainer.backends import cuda
    assert cuda.cupy is not emulated_cupy  # uninstalled after the run


def test_train_loop_runs_this_tree_with_another_chunk_and_restores_it(
        capsys):
    from chainer_lars import cuda as cuda_kernels
    before = dict(vars(cuda_kernels))
    compiled = set(cuda_kernels._modules)
    seen = []
    prepare = cuda_kernels._DeviceState.__init__

    def recording(self, group):
        prepare(self, group)
        seen.append((cuda_kernels.CHUNK, self.nblocks))
    cuda_kernels._DeviceState.__init__ = recording
    try:
        train_loop = benchmark('train_loop')
        train_loop.main(['--emulate', '--chunk', '2048', '--layers', '2',
                         '--width', '64', '--batch', '2', '--iters', '6',
                         '--variants', 'lars'])
    finally:
        cuda_kernels._DeviceState.__init__ = prepare
    # The first update's rules one by one (no state yet), then one group
    # of W (64 x 64, 10 x 64) and b (64, 10): 2 + 1 + 1 + 1 blocks of 2048.
    assert seen == [(2048, 2), (2048, 1), (2048, 1), (2048, 1), (2048, 5)]
    assert dict(vars(cuda_kernels)) == dict(before)
    # Nothing compiled with 2048 kept for later groups of this process.
    assert set(cuda_kernels._modules) == compiled


@pytest.mark.parametrize('chunk', ['0', '100', '-2048'])
def test_train_loop_refuses_a_chunk_the_kernels_cannot_take(capsys, chunk):
    train_loop = benchmark('train_loop')
    with pytest.raises(SystemExit) as raised:
        train_loop.main(['--chunk', chunk])
    assert raised.value.code == 2
    assert '--chunk must be a positive multiple of 2048, got {}'.format(
        chunk) in capsys.readouterr().err


def test_train_loop_refuses_another_tree_without_the_package(tmp_path,
                                                             capsys):
    train_loop = benchmark('train_loop')
    with pytest.raises(SystemExit) as raised:
        train_loop.main(['--other', str(tmp_path)])
    assert raised.value.code == 2
    assert '--other: no {}'.format(
        tmp_path / 'chainer_lars' / '__init__.py') in capsys.readouterr().err


_NO_CUDA = pytest.mark.skipif(__import__('chainer').backends.cuda.available,
                              reason='CuPy can use CUDA here')


@pytest.mark.parametrize('argv, message', [
    (['--iters', '5'], '--iters must be more than 5'),
    (['--variants', 'lars,sgd'], "--variants: unknown 'sgd'"),
    (['--dtype', 'float32,float16'], "--dtype: unknown 'float16'"),
    (['--device', 'foo'], '--device foo: '),
    pytest.param(['--device', '0'], '--device 0: CuPy cannot be used (',
                 marks=_NO_CUDA),
    (['--width', '0'], '--width must be at least 1, got 0'),
    (['--batch', '0'], '--batch must be at least 1, got 0'),
    (['--layers', '0'], '--layers must be at least 1, got 0'),
    # It ran on the emulated @cupy:0 and said nothing of device 3.
    (['--emulate', '--device', '3'], '--device 3: --emulate has only '
     '@cupy:0'),
])
def test_train_loop_refuses_bad_flags(capsys, argv, message):
    train_loop = benchmark('train_loop')
    with pytest.raises(SystemExit) as raised:
        train_loop.main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_train_loop_makes_the_json_folder(tmp_path):
    # As the README says of every tool's output file: it was refused.
    out = tmp_path / 'results' / 'loop.json'
    benchmark('train_loop').main(['--layers', '2', '--width', '4',
                                  '--batch', '2', '--iters', '6',
                                  '--variants', 'lars', '--json', str(out)])
    assert [loop['dtype'] for loop in json.loads(out.read_text())[
        'train_loop']] == ['float32']


@pytest.mark.parametrize('name, message', [
    ('file/loop.json', '--json {tmp}/file/loop.json: cannot make its folder '
     '{tmp}/file ('),
    # A folder was taken, the loop run, and the run lost at its end
    # (IsADirectoryError).
    ('folder', '--json {tmp}/folder: is a folder, not a file'),
])
def test_train_loop_refuses_a_json_it_cannot_write_before_the_run(
        tmp_path, capsys, monkeypatch, name, message):
    train_loop = benchmark('train_loop')

    def run(*args):
        raise AssertionError('the loop ran before --json was checked')
    monkeypatch.setattr(train_loop, '_run_dtype', run)
    (tmp_path / 'file').write_text('')
    (tmp_path / 'folder').mkdir()
    with pytest.raises(SystemExit) as raised:
        train_loop.main(['--json', str(tmp_path / name)])
    assert raised.value.code == 2
    assert message.format(tmp=tmp_path) in (
        capsys.readouterr().err.splitlines()[-1])


@pytest.mark.parametrize('argv', [
    ['--json', '{tmp}/results/cpu.json'],
    ['--gpu-host', '--json', '{tmp}/results/gpu_host.json'],
])
def test_bench_makes_the_json_folder_before_the_run(bench, tmp_path, argv):
    # A --json into a folder that does not exist yet (benchmarks/results/
    # once): the run ended in FileNotFoundError after its work.
    args = bench.parse_args([a.format(tmp=tmp_path) for a in argv])
    assert (tmp_path / 'results').is_dir()
    assert not os.path.exists(args.json)


def test_bench_refuses_a_json_it_cannot_write_before_the_run(
        bench, tmp_path, capsys):
    (tmp_path / 'file').write_text('')
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(['--json', str(tmp_path / 'file' / 'cpu.json')])
    assert raised.value.code == 2
    assert '--json {}: cannot make its folder {}'.format(
        tmp_path / 'file' / 'cpu.json', tmp_path / 'file') in (
        capsys.readouterr().err.splitlines()[-1])


@pytest.mark.parametrize('flags', [
    ['--device', '@numpy'], ['--clock', 'cpu'], ['--dtypes', 'float16'],
    ['--weight-decays', '0', '--seed', '1']])
def test_gpu_host_refuses_the_flags_it_would_ignore(bench, capsys, flags):
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(['--gpu-host'] + flags)
    assert raised.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.endswith(
        'error: --gpu-host takes --models, --reps, --warmup and --json '
        'only, not ' + ', '.join(f for f in flags if f.startswith('--')))


@pytest.mark.parametrize('argv, message', [
    (['--dtype', 'foo'], "--dtype: invalid choice: 'foo'"),
    (['--rounds', '0'], '--rounds must be at least 1, got 0'),
    # A traceback from inside the copied package.
    (['--weight-decay', '-1'], '--weight-decay must be finite and at least '
     '0, got -1.0'),
    (['--weight-decay', 'nan'], '--weight-decay must be finite and at least '
     '0, got nan'),
])
def test_compare_inprocess_refuses_bad_flags(capsys, argv, message):
    compare_inprocess = benchmark('compare_inprocess')
    with pytest.raises(SystemExit) as raised:
        compare_inprocess.main([os.path.dirname(os.path.dirname(_PATH))]
                               + argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize('argv, message', [
    (['--models', 'mlp,foo'], "--models: unknown 'foo'; choose from mlp, cnn"),
    (['--batchsize', '0'], '--batchsize must be at least 1, got 0'),
    (['--updates', '0'], '--updates must be at least 1, got 0'),
    # NumPy's traceback, after MNIST was loaded.
    (['--seed', '-1'], '--seed must be from 0 to 2**32 - 1, got -1'),
    (['--seed', str(2 ** 32)], '--seed must be from 0 to 2**32 - 1, got '
     + str(2 ** 32)),
])
def test_first_contact_refuses_bad_flags_before_loading_mnist(
        capsys, monkeypatch, argv, message):
    first_contact = benchmark('first_contact')

    def load_mnist(root=None):
        raise AssertionError('MNIST loaded before the flags were checked')
    monkeypatch.setattr(first_contact, 'load_mnist', load_mnist)
    with pytest.raises(SystemExit) as raised:
        first_contact.main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_train_loop_leaves_the_cuda_module_as_it_was():
    """Where it counts tables (older trees' Table class), it restores
    what it patched."""
    from chainer_lars import cuda as cuda_kernels
    before = dict(vars(cuda_kernels))
    benchmark('train_loop').main(['--layers', '2', '--width', '4',
                                  '--batch', '2', '--iters', '6',
                                  '--variants', 'lars'])
    assert dict(vars(cuda_kernels)) == before


def test_memory_table_reads_runs_and_names_a_file_it_cannot(
        tmp_path, capsys, monkeypatch):
    """mnist_memory_table.py: a table of the runs of mnist_memory.py's
    JSON beside footprint()'s estimate; a file it cannot read, or that
    holds no list of runs, is named in one usage error."""
    monkeypatch.chdir(REPO_ROOT)  # the repository whose footprint() it reads
    table = benchmark('mnist_memory_table')
    runs = tmp_path / 'runs.json'
    runs.write_text(json.dumps([{
        'unit': 100, 'model': 'mlp', 'dtype': 'float32', 'optimizer': 'lars',
        'batchsize': 128, 'updates': 2, 'drawn': 50e6, 'trained': 200e6}]))
    table.main([str(runs)])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:6] == ['100', 'mlp', 'float32', 'lars', '128', '2']
    assert out[-1].startswith('# after: estimate / measured peak from ')
    for text, says in (('{"unit": 1}', 'not a list of runs'),
                       ('[1', 'Expecting'), (None, 'No such file')):
        bad = tmp_path / 'bad.json'
        if text is not None:
            bad.write_text(text)
        elif bad.exists():
            bad.unlink()
        with pytest.raises(SystemExit) as raised:
            table.main([str(bad)])
        assert raised.value.code == 2
        assert says in capsys.readouterr().err
