"""The validation split, the nesterov baseline, label smoothing and the
study tool (examples/mnist/study.py), on conftest.py's tiny MNIST (64
training and 32 test images).
"""

import argparse
import functools
import importlib
import json
import math
import os
import re
import shlex
import shutil

import numpy
import pytest

import chainer
import chainer.links as L

from examples import cli
from examples import data
from examples import recipe
from tests import conftest
from tests import forked
from tests import mpi_util
from tests import tick_labels


pytestmark = pytest.mark.example


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """Runs each test in an empty folder: the trainers' default --out,
    result, is the current folder's, and a new run refuses one holding
    another run (the Quick start's, in a checkout)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope='module')
def mnist():
    return importlib.import_module('examples.mnist.train_mnist')


@pytest.fixture(scope='module')
def study():
    return importlib.import_module('examples.mnist.study')


@pytest.fixture
def forked_trainers(study, monkeypatch):
    """The study's trainers in forked processes (tests/forked.py,
    ``script``); test_reproduce_reruns_a_trial and the run_command tests
    keep the real subprocess."""
    monkeypatch.setattr(study.results, 'run_process', forked.script)


def read_log(out):
    with open(os.path.join(str(out), 'log')) as f:
        return json.load(f)


def without_time(log):
    return [{k: v for k, v in entry.items() if k != 'elapsed_time'}
            for entry in log]


# -- Label smoothing -------------------------------------------------------

@pytest.mark.parametrize('eps', [0.0, 0.1, 0.35])
def test_label_smoothing_matches_a_float64_reference(eps):
    rng = numpy.random.RandomState(3)
    y = rng.randn(7, 10).astype(numpy.float32) * 3
    t = rng.randint(0, 10, 7).astype(numpy.int32)
    q = numpy.full((7, 10), eps / 10)
    q[numpy.arange(7), t] += 1 - eps
    y64 = y.astype(numpy.float64)
    shifted = y64 - y64.max(axis=1, keepdims=True)
    log_p = shifted - numpy.log(numpy.exp(shifted).sum(axis=1,
                                                       keepdims=True))
    want_loss = -(q * log_p).sum(axis=1).mean()
    want_grad = (numpy.exp(log_p) - q) / 7

    args = argparse.Namespace(label_smoothing=eps)
    x = chainer.Variable(y)
    loss = recipe.loss_function(args)(x, t)
    loss.backward()
    numpy.testing.assert_allclose(loss.array, want_loss, rtol=1e-6)
    numpy.testing.assert_allclose(x.grad, want_grad, rtol=1e-5, atol=1e-7)


# -- The nesterov baseline -------------------------------------------------

class Tiny(chainer.Chain):

    def __init__(self):
        super(Tiny, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)


def optimizer_args(optimizer, nesterov=False):
    return argparse.Namespace(
        optimizer=optimizer, nesterov=nesterov, lr=0.3, momentum=0.8,
        weight_decay=0.05, trust_coefficient=0.02, dtype='float32',
        loss_scale=None)


@pytest.mark.parametrize('optimizer', ['nesterov', 'lars'])
def test_nesterov_and_lars_nesterov_differ_only_by_the_trust_ratio(
        optimizer):
    """Two Nesterov steps against a float64 reference: the bias without
    weight decay, the weight with it; lars scales the weight's step by
    the trust ratio, nesterov by 1."""
    numpy.random.seed(0)
    model = Tiny()
    args = optimizer_args(optimizer, nesterov=True)
    opt, lars = recipe.make_optimizer(args, model)
    assert (lars is None) == (optimizer == 'nesterov')
    rng = numpy.random.RandomState(1)
    grads = [{'W': rng.randn(4, 3), 'b': rng.randn(4)} for _ in range(2)]
    want = {name: getattr(model.l1, name).array.astype(numpy.float64)
            for name in ('W', 'b')}
    velocity = {name: numpy.zeros_like(value)
                for name, value in want.items()}
    for step in grads:
        for name in ('W', 'b'):
            param = getattr(model.l1, name)
            param.grad = step[name].astype(numpy.float32)
            w, g = want[name], step[name]
            ratio = 1.0
            if name == 'W':
                if optimizer == 'lars':
                    w_norm = numpy.linalg.norm(w)
                    ratio = (args.trust_coefficient * w_norm
                             / (numpy.linalg.norm(g)
                                + args.weight_decay * w_norm))
                g = g + args.weight_decay * w
            velocity[name] = (args.momentum * velocity[name]
                              + args.lr * ratio * g)
            want[name] = w - (args.lr * ratio * g
                              + args.momentum * velocity[name])
        opt.update()
        for name in ('W', 'b'):
            numpy.testing.assert_allclose(
                getattr(model.l1, name).array, want[name], rtol=1e-5,
                atol=1e-6, err_msg=name)


def test_nesterov_takes_the_linear_rule_of_momentum():
    for batchsize in (128, 512, 16384):
        assert recipe.default_lr('nesterov', batchsize, 0.02) == (
            pytest.approx(0.1 * batchsize / 256))


# -- The validation split --------------------------------------------------

def test_hold_out_takes_the_last_n_images(dataset_root):
    train, _ = data.load_mnist()
    rest, validation = data.hold_out(argparse.Namespace(validation=20),
                                     train)
    assert len(rest) == 44 and len(validation) == 20
    x, t = chainer.dataset.concat_examples(train)
    vx, vt = chainer.dataset.concat_examples(validation)
    rx, rt = chainer.dataset.concat_examples(rest)
    numpy.testing.assert_array_equal(vx, x[44:])
    numpy.testing.assert_array_equal(vt, t[44:])
    numpy.testing.assert_array_equal(rx, x[:44])
    assert data.hold_out(argparse.Namespace(validation=0), train) == (
        train, None)


def test_mnist_validation_eval_every_and_resume(mnist, dataset_root,
                                                tmp_path, capsys):
    """--validation 16: 48 training images, 3 iterations an epoch; the
    validation set at every iteration, the test set never; the last
    accuracy is the model's on the last 16 training images; a resumed run
    logs the same."""
    args = ['--dataset-root', dataset_root, '--optimizer', 'nesterov',
            '--batchsize', '16', '--unit', '16', '--epoch', '3',
            '--validation', '16', '--eval-every', '1', '--test', 'never',
            '--label-smoothing', '0.1', '--noplot']
    first = tmp_path / 'first'
    mnist.main(args + ['--out', str(first), '--snapshots', '3'])
    log = read_log(first)
    assert [e['iteration'] for e in log] == list(range(10))
    # Lines of the same epoch, told apart by their iteration.
    header = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith('epoch')]
    assert header and header[0].split()[:2] == ['epoch', 'iteration']
    assert all('val/main/accuracy' in e for e in log)
    assert not any('test/main/accuracy' in e for e in log)

    # The final weights, evaluated here on the held-out images.
    numpy.random.seed(0)
    model = L.Classifier(mnist.MLP(784, 16, 10))
    chainer.serializers.load_npz(str(first / 'snapshot_iter_9'), model,
                                 path='updater/model:main/')
    train, _ = data.load_mnist()
    x, t = chainer.dataset.concat_examples(train[48:])
    with chainer.using_config('train', False):
        accuracy = (model.predictor(x).array.argmax(axis=1) == t).mean()
    assert log[-1]['val/main/accuracy'] == pytest.approx(accuracy)

    with numpy.load(str(first / 'snapshot_iter_3')) as snapshot:
        recorded = {key.split('/')[-1]: snapshot[key].item()
                    for key in snapshot.files if 'RunSettings' in key}
    assert recorded['validation'] == 16
    assert recorded['eval_every'] == 1
    assert recorded['label_smoothing'] == 0.1
    assert recorded['test'] == 'never'
    assert recorded['examples'] == 48

    resumed = tmp_path / 'resumed'
    mnist.main(args + ['--out', str(resumed),
                       '--resume', str(first / 'snapshot_iter_3')])
    assert without_time(read_log(resumed)) == without_time(log)


def test_resume_refuses_another_validation_split(mnist, dataset_root,
                                                 tmp_path, capsys):
    args = ['--dataset-root', dataset_root, '--batchsize', '16', '--unit',
            '16', '--epoch', '1', '--validation', '16', '--noplot']
    mnist.main(args + ['--out', str(tmp_path / 'a')])
    capsys.readouterr()
    argv = (args[:-3] + ['--validation', '8', '--noplot', '--out',
                         str(tmp_path / 'b'), '--resume',
                         str(tmp_path / 'a' / 'snapshot_iter_3')])
    with pytest.raises(SystemExit):
        mnist.main(argv)
    assert 'written with --validation 16, this run has 8' in (
        capsys.readouterr().err)


def test_test_at_the_end_only(mnist, dataset_root, tmp_path):
    out = tmp_path / 'out'
    mnist.main(['--dataset-root', dataset_root, '--batchsize', '16',
                '--unit', '16', '--epoch', '2', '--validation', '16',
                '--test', 'end', '--noplot', '--snapshots', '0',
                '--out', str(out)])
    log = read_log(out)
    assert [e['epoch'] for e in log] == [0, 1, 2]
    assert ['test/main/accuracy' in e for e in log] == [
        False, False, True]
    assert all('val/main/accuracy' in e for e in log)


def test_cifar_validation(dataset_root, tmp_path):
    cifar = importlib.import_module('examples.cifar.train_cifar')
    out = tmp_path / 'out'
    cifar.main(['--dataset-root', dataset_root, '--batchsize', '8',
                '--depth', '8', '--epoch', '1', '--validation', '16',
                '--optimizer', 'nesterov', '--label-smoothing', '0.1',
                '--noplot', '--snapshots', '0', '--out', str(out)])
    log = read_log(out)
    assert log[-1]['iteration'] == 2  # 16 of the 32 images left
    assert 0 <= log[-1]['val/main/accuracy'] <= 1
    assert 'test/main/accuracy' in log[-1]


@pytest.mark.mpi
def test_chainermn_validation(dataset_root, tmp_path):
    out = tmp_path / 'out'
    result = mpi_util.run_mpi(2, [
        '-m', 'examples.chainermn.mnist.train_mnist', '--communicator',
        'naive', '--device', '-1', '--epoch', '1', '--batchsize', '8',
        '--unit', '16', '--validation', '16', '--eval-every', '1',
        '--optimizer', 'nesterov', '--noplot', '--out', str(out)],
        timeout=240)
    assert result.returncode == 0, result.stderr
    log = read_log(out)
    # 48 training images, 24 a rank, 3 iterations of 8.
    assert [e['iteration'] for e in log] == [0, 1, 2, 3]
    assert all('val/main/accuracy' in e for e in log)


@pytest.mark.parametrize('flags,message', [
    (['--optimizer', 'momentum', '--nesterov'],
     '--nesterov is for --optimizer lars'),
    (['--label-smoothing', '1'],
     '--label-smoothing must be at least 0 and less than 1, got 1.0'),
    (['--validation', '-1'], '--validation must be an integer, at least 0'),
    (['--eval-every', '0'], '--eval-every must be a positive integer'),
    (['--eval-every', '2'], '--eval-every 2 evaluates the validation set, '
     'and this run has none: give --validation N too'),
    (['--eval-every', '2', '--validation', '0'], '--eval-every 2 evaluates'),
])
def test_bad_new_flags_are_usage_errors(mnist, tmp_path, capsys, flags,
                                        message):
    with pytest.raises(SystemExit) as exc:
        mnist.main(flags + ['--dataset-root', str(tmp_path),
                            '--out', str(tmp_path / 'out')])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('flag', ['--out', '--runs', '--dataset-root'])
def test_study_refuses_an_empty_path(study, tmp_path, capsys, flag):
    # As the trainers refuse one: '' read as the current folder.
    with pytest.raises(SystemExit) as exc:
        study.main([flag, ''])
    assert exc.value.code == 2
    assert ("{} '': an empty path names no folder (. is the current "
            'one)').format(flag) in capsys.readouterr().err
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize('flag', ['--out', '--runs'])
def test_a_run_refuses_an_out_or_runs_that_is_a_file(study, tmp_path,
                                                     capsys, monkeypatch,
                                                     flag):
    """--runs FILE ended in a FileExistsError traceback; --out FILE
    trained a whole trial, then failed in write() with a traceback."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    (tmp_path / 'file').write_text('mine')
    argv = {'--out': str(tmp_path / 'json'), '--runs': str(tmp_path / 'runs'),
            '--figure': str(tmp_path / 'f.png')}
    argv[flag] = str(tmp_path / 'file')
    for extra in ([], ['--fair', '2']):
        with pytest.raises(SystemExit) as exc:
            study.main([a for item in argv.items() for a in item] + extra)
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            'error: {} {}: not a folder'.format(flag, tmp_path / 'file'))
        assert sorted(p.name for p in tmp_path.iterdir()) == ['file']
        assert (tmp_path / 'file').read_text() == 'mine'


@pytest.mark.parametrize('figure, problem', [
    ('file/f.png', '{}: not a folder'),
    ('folder', 'a folder, not a file'),
    ('f', 'no format in its name: end its name in .png'),
    ('f.pngg', 'no format .pngg: end its name in .png')])
def test_a_figure_that_cannot_be_written_is_refused(study, tmp_path, capsys,
                                                    monkeypatch, figure,
                                                    problem):
    """--plot-only --figure /missing/dir/x.png ended in a traceback
    from savefig; a run drew its figure after its first trial, and printed
    that it failed after every trial."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    (tmp_path / 'file').write_text('mine')
    (tmp_path / 'folder').mkdir()
    path = str(tmp_path / figure)
    for task in (['--plot-only'], ['--out', str(tmp_path / 'json'),
                                   '--runs', str(tmp_path / 'runs')]):
        with pytest.raises(SystemExit) as exc:
            study.main(['--figure', path] + task)
        assert exc.value.code == 2
        assert 'error: --figure {}: {}'.format(path, problem.format(
            tmp_path / 'file')) in capsys.readouterr().err, problem
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            'file', 'folder']
    # A folder that can be made is made, the figure written whole.
    path = tmp_path / 'new' / 'folder' / 'study.png'
    assert study.main(['--plot-only', '--figure', str(path)]) == 0
    assert os.listdir(str(path.parent)) == ['study.png']
    assert 'the figure: {}'.format(path) in capsys.readouterr().out


def test_the_help_of_reproduce_and_figure(study, capsys):
    """--reproduce's help left out 'within tolerance' (exit 0), and
    --figure's the -pretuned and -fair-x suffixes and where the figure of
    another --out goes."""
    with pytest.raises(SystemExit):
        study.main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert ('print what changed, then same, within tolerance (what another '
            'CPU is expected to change) or differs (exit 1)') in text
    assert ('with -pretuned or -fair-x<BUDGET> before .png for --pretuned '
            'or --fair; in examples/mnist/ for the default --out, else in '
            '--out)') in text


@pytest.mark.parametrize('flags, name', [
    ([], 'study.png'), (['--model', 'mlp-bn'], 'study-mlp-bn.png'),
    (['--pretuned'], 'study-pretuned.png'),
    (['--model', 'mlp-bn', '--fair', '2'], 'study-mlp-bn-fair-x2.png'),
    (['--fair', '0.5'], 'study-fair-x0.5.png')])
def test_the_default_figure_s_name(study, flags, name):
    args = argparse.Namespace(model='mlp', pretuned=False, fair=None)
    for flag, value in zip(flags[::2], flags[1::2] + [True]):
        setattr(args, flag[2:], float(value) if flag == '--fair' else value)
    assert study.figure_name(args) == name


def test_the_default_figure_of_another_out_goes_into_it(study, tmp_path,
                                                        monkeypatch, capsys):
    """--figure defaulted to examples/mnist/study.png (or
    study-<model>.png) whatever --out was: a study of another folder,
    and its --plot-only, drew over the committed figure, silently."""
    here = tmp_path / 'here'  # where the committed figures are
    monkeypatch.setattr(study, 'HERE', str(here))
    copy = tmp_path / 'copy'
    shutil.copytree(os.path.join(study.OUT, 'adam-lamb'), str(copy))
    flags = ['--optimizers', 'adam,lamb', '--batchsizes', '8192,16384',
             '--refine', '0', '--budget-configs', '0', '--plot-only']
    assert study.main(flags + ['--out', str(copy)]) == 0
    assert 'the figure: {}\n'.format(copy / 'study.png') in (
        capsys.readouterr().out)
    assert not here.exists()
    # The committed folder's figure, by default, is the committed one.
    assert study.main(['--model', 'mlp-bn', '--batchsizes', '8192,16384,512',
                       '--refine', '0', '--budget-configs', '1',
                       '--budgets', '2,4', '--plot-only']) == 0
    assert 'the figure: {}\n'.format(here / 'study-mlp-bn.png') in (
        capsys.readouterr().out)


@pytest.mark.parametrize('task', ['--tables', '--check', '--plot-only'])
@pytest.mark.parametrize('out, problem', [
    ('nowhere', 'no such folder'), ('file', 'not a folder'),
    ('empty', 'no JSON of a study in it')])
def test_reading_tasks_refuse_an_out_without_a_study(study, tmp_path, capsys,
                                                     task, out, problem):
    """A mistyped --out printed empty tables (--check: a diff of them)
    with status 0, and --plot-only drew an empty figure, without a word
    that the folder holds no study."""
    (tmp_path / 'file').write_text('mine')
    (tmp_path / 'empty').mkdir()
    readme = tmp_path / 'README.md'
    readme.write_text('# Study\n')
    figure = tmp_path / 'study.png'
    path = str(tmp_path / out)
    argv = ['--out', path, '--figure', str(figure), task] + (
        [str(readme)] if task == '--check' else [])
    with pytest.raises(SystemExit) as exc:
        study.main(argv)
    assert exc.value.code == 2
    printed = capsys.readouterr()
    assert printed.err.splitlines()[-1].endswith(
        'error: --out {}: {}; {} reads the JSONs of a study there'.format(
            path, problem, task)), printed.err
    assert printed.out == ''
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'README.md', 'empty', 'file']
    assert (tmp_path / 'file').read_text() == 'mine'
    # --fair reads a folder of --out's: the message names both.
    if out == 'empty':
        with pytest.raises(SystemExit):
            study.main(['--fair', '2'] + argv)
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            '--out {} ({}): no such folder; {} reads the JSONs of a study '
            'there'.format(path, os.path.join(path, 'fair-x2'), task))


def test_validation_as_large_as_the_training_set(mnist, dataset_root,
                                                 tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        mnist.main(['--dataset-root', dataset_root, '--validation', '64',
                    '--out', str(tmp_path / 'out')])
    assert exc.value.code == 2
    assert ('--validation 64 leaves no training images: the training set '
            'has 64') in capsys.readouterr().err


def test_run_settings_record_the_new_flags(mnist):
    args = mnist.parse_args(['--optimizer', 'lars', '--nesterov',
                             '--validation', '100', '--eval-every', '5',
                             '--label-smoothing', '0.1', '--test', 'end'])
    recorded = cli.run_settings(args)
    assert {k: recorded[k] for k in ('nesterov', 'validation', 'eval_every',
                                     'label_smoothing', 'test')} == {
        'nesterov': True, 'validation': 100, 'eval_every': 5,
        'label_smoothing': 0.1, 'test': 'end'}


# -- The study tool --------------------------------------------------------

def test_halton_points(study):
    assert [study.halton(i, 2) for i in range(1, 5)] == [0.5, 0.25, 0.75,
                                                         0.125]
    assert study.halton(5, 3) == pytest.approx(7 / 9)  # 12 in base 3
    shift = numpy.random.RandomState(0).uniform(size=4)
    point = study.points(3)[2]
    want = [(h + s) % 1 for h, s in zip(
        [0.75, 1 / 9, 3 / 5, 3 / 7], shift)]
    assert point == pytest.approx(want)


def test_the_search_is_the_same_for_both_optimizers(study):
    for u in study.points(8):
        flags = {o: study.hyperparameters(o, 2048, 8, u)
                 for o in ('nesterov', 'lars')}
        for name in ('momentum', 'warmup_epochs', 'label_smoothing'):
            assert flags['nesterov'][name] == flags['lars'][name]
        assert 0.68 <= flags['nesterov']['momentum'] <= 0.99
        assert 0 <= flags['nesterov']['warmup_epochs'] <= 3.2
        assert 0 <= flags['nesterov']['label_smoothing'] <= 0.2
        # A decade either side of square-root scaling from batch 256.
        for optimizer, at_256 in (('nesterov', 0.1),
                                  ('lars', 0.005 / 0.02)):
            ratio = flags[optimizer]['lr'] / (at_256 * (2048 / 256) ** 0.5)
            assert 0.0999 <= ratio <= 10.01


SCHEMA = {'optimizer': str, 'batchsize': int, 'trial': int, 'seed': int,
          'flags': dict, 'command': str, 'best_validation': float,
          'target': float}


@pytest.fixture(scope='module')
def tiny_study(study, tmp_path_factory):
    """A study of one batch size, 2 trials a cell and 1 seeded rerun."""
    folder = tmp_path_factory.mktemp('study')
    root = str(folder / 'datasets')
    conftest._write_mnist(root)
    out, runs = folder / 'json', folder / 'runs'
    argv = ['--dataset-root', root, '--batchsizes', '16', '--trials', '2',
            '--seeds', '1', '--epochs', '2', '--validation', '16',
            '--target', '0.3', '--out', str(out), '--runs', str(runs),
            '--figure', str(folder / 'study.png')]
    previous = chainer.dataset.get_dataset_root()
    real, study.results.run_process = study.results.run_process, forked.script
    try:
        assert study.main(argv) == 0
    finally:
        study.results.run_process = real
        chainer.dataset.set_dataset_root(previous)
    return argparse.Namespace(argv=argv, out=out, runs=runs, root=root,
                              folder=folder)


def read_json(path):
    with open(str(path)) as f:
        return json.load(f)


def records(out):
    return {name[:-len('.json')]: read_json(os.path.join(str(out), name))
            for name in sorted(os.listdir(str(out)))
            if name.endswith('.json')}


def test_study_writes_one_json_per_trial_and_rerun(tiny_study):
    found = records(tiny_study.out)
    assert sorted(found) == sorted([
        'nesterov-b16-t0', 'nesterov-b16-t1', 'lars-b16-t0', 'lars-b16-t1',
        'nesterov-b16-best-s1', 'lars-b16-best-s1', 'defaults-b16',
        'defaults-b16-s1'])
    # The trainer on its defaults, measured as the search trials are, and
    # rerun with the seeds of the best trials' reruns.
    rerun = found.pop('defaults-b16-s1')
    assert rerun['flags'] == {} and rerun['seed'] == 1
    assert '--seed 1' in rerun['command'] and '--test end' in (
        rerun['command'])
    assert rerun['test_accuracy'] == read_log(
        tiny_study.runs / 'defaults-b16-s1')[-1]['test/main/accuracy']
    defaults = found.pop('defaults-b16')
    assert defaults['flags'] == {} and defaults['test_accuracy'] is None
    assert defaults['command'].startswith(
        'python -m examples.mnist.train_mnist --batchsize 16 --epoch 2 '
        '--validation 16 --eval-every ')
    assert '--optimizer' not in defaults['command']
    assert '--lr' not in defaults['command']
    log = read_log(tiny_study.runs / 'defaults-b16')
    assert defaults['best_validation'] == max(
        e['val/main/accuracy'] for e in log)
    for name, record in found.items():
        for key, kind in SCHEMA.items():
            assert isinstance(record[key], kind), (name, key)
        log = read_log(tiny_study.runs / name)
        # steps_to_target from the trainer's own log.
        reached = [e['iteration'] for e in log
                   if e.get('val/main/accuracy', 0) >= 0.3]
        assert record['steps_to_target'] == (reached[0] if reached
                                             else None)
        if reached:
            assert record['epochs_to_target'] == pytest.approx(
                reached[0] * 16 / 48, abs=1e-3)
        else:
            assert record['epochs_to_target'] is None
        assert record['best_validation'] == max(
            e['val/main/accuracy'] for e in log)
        assert record['target'] == 0.3
        assert '--validation 16' in record['command']
        if '-best-' in name:
            assert record['seed'] == 1
            assert record['test_accuracy'] == (
                log[-1]['test/main/accuracy'])
            assert '--test end' in record['command']
            search = [found['{}-b16-t{}'.format(record['optimizer'], t)]
                      for t in (0, 1)]
            chosen = found['{}-b16-t{}'.format(record['optimizer'],
                                               record['trial'])]
            assert record['flags'] == chosen['flags']
            assert chosen is min(search, key=lambda r: (
                r['steps_to_target'] is None, r['steps_to_target'] or 0,
                -r['best_validation']))
        else:
            assert record['seed'] == 0
            assert record['test_accuracy'] is None
            assert '--test never' in record['command']
            assert not any('test/main/accuracy' in e for e in log)
    assert (tiny_study.folder / 'study.png').exists()


def test_study_skips_what_is_done(study, tiny_study, capsys):
    before = {p.name: p.stat().st_mtime_ns
              for p in tiny_study.out.iterdir()}
    previous = chainer.dataset.get_dataset_root()
    try:
        assert study.main(tiny_study.argv + ['--noplot']) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    assert '$ ' not in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns
            for p in tiny_study.out.iterdir()} == before
    # With the figure: drawn once (it was drawn after each skipped run,
    # and nothing said that nothing ran).
    try:
        assert study.main(tiny_study.argv) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    out = capsys.readouterr().out
    assert out.count('  the figure: ') == 1, out
    assert out.endswith('nothing to run: every run of these settings has '
                        'its JSON in {} (--tables prints the tables)\n'
                        .format(tiny_study.out)), out


def test_study_draws_the_defaults_reruns_where_the_sweep_runs_nothing(
        study, tiny_study, tmp_path, monkeypatch, capsys):
    # The figure shows the defaults' seeded reruns; the loop that makes
    # them drew nothing after them, and a study without a budget sweep
    # ended with a figure without them.
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    os.remove(str(out / 'defaults-b16-s1.json'))
    argv = list(tiny_study.argv)
    argv[argv.index('--out') + 1] = str(out)
    argv[argv.index('--runs') + 1] = str(tmp_path / 'runs')
    argv[argv.index('--figure') + 1] = str(tmp_path / 'study.png')
    monkeypatch.setattr(study.results, 'run_process', forked.script)
    previous = chainer.dataset.get_dataset_root()
    try:
        assert study.main(argv + ['--budget-configs', '0']) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    printed = capsys.readouterr().out
    assert printed.count('$ ') == 1, printed
    assert printed.rindex('  the figure: ') > printed.index('$ '), printed
    assert 'nothing to run' not in printed


def test_check_compares_the_readme_with_the_jsons(study, tiny_study,
                                                  tmp_path, capsys):
    assert study.main(['--out', str(tiny_study.out), '--trials', '2',
                       '--seeds', '1', '--tables']) == 0
    printed = capsys.readouterr().out
    found = records(tiny_study.out)
    best = min(found['lars-b16-t0'], found['lars-b16-t1'],
               key=lambda r: (r['steps_to_target'] is None,
                              r['steps_to_target'] or 0,
                              -r['best_validation']))
    row = [line for line in printed.splitlines()
           if line.startswith('| 16 | lars | 2 | 2/2 |')]
    assert len(row) == 1
    assert '| {} |'.format(best['trial']) in row[0]
    # The defaults' seeded reruns: a row of the rerun table, after lars's.
    rerun = found['defaults-b16-s1']
    rows = [line for line in printed.splitlines()
            if line.startswith('| 16 | ') and '| 1/1 |' in line]
    assert [r.split(' | ')[1] for r in rows] == [
        'nesterov', 'lars', 'defaults'], rows
    assert rows[2].startswith('| 16 | defaults | - | 1/1 | {} | '.format(
        int(rerun['steps_to_target'] is not None))), rows
    readme = tmp_path / 'README.md'
    readme.write_text('# Study\n\n' + printed)
    argv = ['--out', str(tiny_study.out), '--trials', '2', '--seeds', '1',
            '--check', str(readme)]
    assert study.main(argv) == 0
    assert 'the table matches' in capsys.readouterr().out

    readme.write_text('# Study\n\n' + printed.replace(' 1/1 ', ' 2/1 ', 1))
    assert study.main(argv) == 1
    assert '-| 16 | nesterov | ' in capsys.readouterr().out

    # A trial whose flags are not its point's, and a rerun of another trial
    # than the best.
    readme.write_text('# Study\n\n' + printed)
    changed = tmp_path / 'changed'
    shutil.copytree(str(tiny_study.out), str(changed))
    record = read_json(changed / 'nesterov-b16-t0.json')
    record['flags']['momentum'] = 0.5
    (changed / 'nesterov-b16-t0.json').write_text(json.dumps(record))
    record = read_json(changed / 'lars-b16-best-s1.json')
    record['trial'] = 1 - record['trial']
    (changed / 'lars-b16-best-s1.json').write_text(json.dumps(record))
    assert study.main(argv[:1] + [str(changed)] + argv[2:]) == 1
    printed_check = capsys.readouterr().out
    assert "nesterov-b16-t0: flags {" in printed_check
    assert "'momentum': 0.5" in printed_check
    assert 'lars-b16-best-s1: a rerun of trial {}, the best is {}'.format(
        record['trial'], 1 - record['trial']) in printed_check

    # A JSON not in the README's tables.
    readme.write_text('# Study\n\n' + printed)
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    os.remove(str(out / 'lars-b16-best-s1.json'))
    argv[1] = str(out)
    assert study.main(argv) == 1


def test_reproduce_reruns_a_trial(study, tiny_study, tmp_path, capsys):
    argv = ['--dataset-root', tiny_study.root, '--reproduce']
    previous = chainer.dataset.get_dataset_root()
    try:
        path = str(tiny_study.out / 'lars-b16-best-s1.json')
        assert study.main(argv + [path]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1] == 'same'

        # Counts of correct images are compared: 2 more of the 16
        # validation images is a change, and beyond any tolerance.
        record = read_json(path)
        record['best_validation'] += 2 / 16
        changed = tmp_path / 'changed.json'
        changed.write_text(json.dumps(record))
        assert study.main(argv + [str(changed)]) == 1
        printed = capsys.readouterr().out
        assert 'best_validation: recorded {}'.format(
            record['best_validation']) in printed
        assert printed.strip().splitlines()[-1].startswith('differs: ')
    finally:
        chainer.dataset.set_dataset_root(previous)


def record_of(steps, best, test=None):
    return {'steps_to_target': steps, 'best_validation': best,
            'test_accuracy': test, 'validation': 10000}


@pytest.mark.parametrize('again,verdict', [
    # A float a rounding away from 9,800 of 10,000 is 9,800 images.
    (record_of(54, 0.97999996, 0.9838), 'same'),
    # One evaluation interval (2 steps) and 4 images: another CPU.
    (record_of(52, 0.9804, 0.9838), 'within tolerance'),
    # Two intervals and 20 images of 10,000 (0.2 point): the edge.
    (record_of(58, 0.9780, 0.9858), 'within tolerance'),
    (record_of(59, 0.9800, 0.9838), 'differs'),  # 5 steps > 2 intervals
    (record_of(54, 0.9779, 0.9838), 'differs'),  # 21 images
    (record_of(None, 0.9799, 0.9838), 'differs'),  # the target missed
    (record_of(54, 0.9800, None), 'differs'),
])
def test_reproduce_compares_counts_with_a_tolerance(study, again, verdict):
    record = record_of(54, 0.98, 0.9838)
    found, different = study.compare(record, again, 2, 10000)
    assert found.split(':')[0] == verdict
    assert bool(different) == (verdict != 'same')
    if verdict != 'same':
        # The tolerance is named, as README.md states it.
        assert found.endswith(
            'steps to the target within 2 evaluation intervals (4 steps), '
            'accuracies within 0.2 point')


def test_first_at_target_counts_images(study):
    curve = [[0, 0.1], [2, 0.9799], [4, 0.98], [6, 0.9801]]
    assert study.first_at_target(curve, 10000, 0.98) == 4
    # The float of 9,800 images a rounding under 0.98 still counts.
    assert study.first_at_target([[3, 0.97999996]], 10000, 0.98) == 3
    assert study.first_at_target([[3, 0.9799]], 10000, 0.98) is None
    assert study.first_at_target([[1, 5 / 16]], 16, 0.3) == 1
    assert study.first_at_target([[1, 4 / 16]], 16, 0.3) is None
    assert study.target_count(0.98, 10000) == 9800
    assert study.target_count(0.3, 16) == 5


def test_figure_from_partial_results(study, tiny_study, tmp_path):
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    os.remove(str(out / 'nesterov-b16-t1.json'))
    figure = tmp_path / 'partial.png'
    assert study.main(['--out', str(out), '--batchsizes', '16', '--trials',
                       '2', '--seeds', '1', '--plot-only', '--figure',
                       str(figure)]) == 0
    assert figure.stat().st_size > 0


def test_figure_draws_the_defaults_mean_over_seeds(study, tiny_study,
                                                   tmp_path):
    """The defaults' line, like the optimizers', is the mean of the seeded
    reruns where all have run, and the one run of seed 0 until then."""
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    once = read_json(out / 'defaults-b16.json')
    again = read_json(out / 'defaults-b16-s1.json')
    again['best_validation'] = once['best_validation'] - 0.25
    again['steps_to_target'] = 3
    seed2 = dict(again, seed=2, best_validation=once['best_validation'],
                 steps_to_target=6)
    (out / 'defaults-b16-s1.json').write_text(json.dumps(again))
    assert study.defaults_points(str(out), [16], 1) == (
        [(16, 3, again['best_validation'])], 1)
    # Seed 2 not yet run: seed 0's run.
    assert study.defaults_points(str(out), [16], 2) == (
        [(16, once['steps_to_target'], once['best_validation'])], 0)
    (out / 'defaults-b16-s2.json').write_text(json.dumps(seed2))
    assert study.defaults_points(str(out), [16], 2) == ([(
        16, 4.5, pytest.approx(once['best_validation'] - 0.125))], 1)
    # A seed that missed the target: no mean of the steps.
    seed2['steps_to_target'] = None
    (out / 'defaults-b16-s2.json').write_text(json.dumps(seed2))
    assert study.defaults_points(str(out), [16], 2)[0][0][1] is None
    assert study.defaults_points(str(out), [32], 2) == ([], 0)


def test_round_two_centres_the_rate_on_round_one(study, tiny_study,
                                                 tmp_path, capsys,
                                                 forked_trainers):
    """--refine: a second round at the next points of the sequence, the
    rate half a decade either side of round one's best; the reruns follow
    the best of both rounds."""
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    argv = list(tiny_study.argv)
    argv[argv.index('--out') + 1] = str(out)
    argv[argv.index('--runs') + 1] = str(tmp_path / 'runs')
    argv += ['--refine', '16', '--noplot']
    previous = chainer.dataset.get_dataset_root()
    try:
        assert study.main(argv) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    capsys.readouterr()
    found = records(out)
    u = study.points(4)
    for optimizer in ('nesterov', 'lars'):
        first = [found['{}-b16-t{}'.format(optimizer, t)] for t in (0, 1)]
        around = study.best(first)['flags']['lr']
        for t in (2, 3):
            record = found['{}-b16-t{}'.format(optimizer, t)]
            assert record['flags']['lr'] == pytest.approx(
                around * 10 ** (-0.5 + u[t][0]), rel=1e-3)
            assert record['flags']['momentum'] == study.hyperparameters(
                optimizer, 16, 2, u[t])['momentum']
        chosen = study.best(first + [
            found['{}-b16-t{}'.format(optimizer, t)] for t in (2, 3)])
        rerun = found['{}-b16-best-s1'.format(optimizer)]
        assert rerun['trial'] == chosen['trial']
        assert rerun['flags'] == chosen['flags']
    # The tables count the two rounds; --check finds nothing to say.
    assert study.main(['--out', str(out), '--trials', '2', '--seeds', '1',
                       '--refine', '16', '--tables']) == 0
    printed = capsys.readouterr().out
    assert '| 16 | lars | 2 | 4/4 |' in printed
    readme = tmp_path / 'README.md'
    readme.write_text('# Study\n\n' + printed)
    check = ['--out', str(out), '--trials', '2', '--seeds', '1',
             '--refine', '16', '--check', str(readme)]
    assert study.main(check) == 0
    # A round-two trial centred elsewhere is found.
    record = read_json(out / 'nesterov-b16-t3.json')
    record['flags']['lr'] *= 2
    (out / 'nesterov-b16-t3.json').write_text(json.dumps(record))
    assert study.main(check) == 1
    assert 'nesterov-b16-t3: flags {' in capsys.readouterr().out
    # Without --refine, round two's trials are not of this search.
    assert study.main(check[:-4] + ['--refine', '0', '--check',
                                    str(readme)]) == 1
    assert 'trial 2 of a search of 2' in capsys.readouterr().out
    # A run of the defaults with a flag of its own is not of the defaults.
    os.remove(str(out / 'nesterov-b16-t3.json'))
    record = read_json(out / 'defaults-b16.json')
    record['command'] = record['command'].replace(
        '--batchsize 16', '--batchsize 16 --lr 0.5')
    (out / 'defaults-b16.json').write_text(json.dumps(record))
    assert study.main(check) == 1
    assert "defaults-b16: not a run of the trainer's defaults" in (
        capsys.readouterr().out)


def test_check_finds_each_study_s_tables_in_its_own_section(
        study, tiny_study, tmp_path, capsys):
    """In a README of several studies, a study's tables count only after
    the ``<!-- study.py ... -->`` line that names its flag (the main
    study's: before the first such line, or after one with no flag): the
    tables of one study written over another's fail the check."""
    argv = ['--out', str(tiny_study.out), '--trials', '2', '--seeds', '1']
    assert study.main(argv + ['--tables']) == 0
    printed = capsys.readouterr().out
    readme = tmp_path / 'README.md'
    check = argv + ['--check', str(readme)]
    bn = '<!-- study.py --model mlp-bn --tables -->\n\n'
    for text, status in [
            (printed, 0),  # no markers: the whole file
            (printed + '\n' + bn, 0),
            (bn + printed, 1),  # under the BatchNorm model's marker
            (bn + '<!-- study.py --batchsizes 16 --tables -->\n\n'
             + printed, 0)]:
        readme.write_text(text)
        assert study.main(check) == status, text
        out = capsys.readouterr().out
        if status:
            assert 'no table with the header batch size | optimizer | ' \
                'epochs | trials | reached' in out
            assert ' in its lines (none); expected' in out
    # The BatchNorm model's tables need their marker.
    readme.write_text(printed + '\n' + bn.replace('mlp-bn', 'cnn'))
    assert study.main(check[:-2] + ['--model', 'mlp-bn'] + check[-2:]) == 1
    assert 'no line "<!-- study.py ... --model mlp-bn ... --tables -->"' \
        in capsys.readouterr().out


def test_a_diverged_trial_is_a_result(study, tiny_study, tmp_path):
    """A trial whose loss stops being finite (the trainer stops with
    status 1, its log written) is recorded as never reaching the target,
    in plain JSON; any other failure of the trainer stops the study."""
    cmd = study.TRAINER + ['--batchsize', '16', '--optimizer', 'nesterov',
                           '--lr', '1e8', '--epoch', '2', '--validation',
                           '16', '--eval-every', '1', '--test', 'never',
                           '--snapshots', '0', '--noplot']
    previous = chainer.dataset.get_dataset_root()
    try:
        with open(str(tmp_path / 'stdout'), 'w') as stdout:
            log = study.run_command(cmd, str(tmp_path / 'run'),
                                    tiny_study.root, '-1', stdout)
            with pytest.raises(SystemExit) as exc:
                study.run_command(cmd + ['--momentum', '2'],
                                  str(tmp_path / 'bad'), tiny_study.root,
                                  '-1', stdout)
    finally:
        chainer.dataset.set_dataset_root(previous)
    # Its reason, from the end of the trainer's output, and the file.
    assert str(tmp_path / 'stdout') in exc.value.code
    assert '--momentum' in exc.value.code.split('\n', 1)[1]
    record = study.measure(log, 16, 48, 0.3, 16)
    assert record['diverged'] is True
    assert record['final_loss'] is None
    assert record['steps_to_target'] is None
    json.dumps(record, allow_nan=False)
    for name, record in records(tiny_study.out).items():
        assert record['diverged'] is False, name


def assert_complete(study, search, reruns, batchsizes, optimizers,
                    refine=()):
    """Every trial of each cell (two rounds at the ``refine`` batch sizes)
    and the seeded reruns of its best."""
    for batchsize in batchsizes:
        for optimizer in optimizers:
            cell = batchsize, optimizer
            n = study.trials_of(batchsize, study.TRIALS, refine)
            assert sorted(r['trial'] for r in search[cell]) == list(
                range(n)), cell
            assert sorted(r['seed'] for r in reruns[cell]) == (
                study.SEEDS), cell


def test_the_committed_study_is_complete_and_in_the_readme(study, capsys):
    """The JSONs under examples/mnist/study/ hold every trial of every
    cell, the three seeded reruns of each cell's best and the trainer's
    defaults per batch size, once and with the same seeds;
    examples/mnist/README.md holds their tables (study.py --check)."""
    out = os.path.join(os.path.dirname(study.__file__), 'study')
    search, reruns = study.load(out)
    assert_complete(study, search, reruns, study.BATCHSIZES,
                    study.DEFAULT_OPTIMIZERS, study.REFINED)
    assert sorted(study.load_defaults(out)) == study.BATCHSIZES
    assert {b: [r['seed'] for r in records] for b, records in
            study.load_defaults(out, reruns=True).items()} == {
                b: study.SEEDS for b in study.BATCHSIZES}
    assert study.main(['--check']) == 0, capsys.readouterr().out


def test_the_committed_lamb_study_is_complete_and_in_the_readme(
        study, capsys):
    """LAMB against Adam (examples/mnist/study/adam-lamb/): the 8 trials
    of each cell at 8192 and 16384 and the three seeded reruns of each
    cell's best; examples/mnist/README.md holds their tables."""
    flags = ['--optimizers', 'adam,lamb', '--batchsizes', '8192,16384',
             '--refine', '0', '--budget-configs', '0', '--out',
             os.path.join(os.path.dirname(study.__file__), 'study',
                          'adam-lamb')]
    search, reruns = study.load(flags[-1])
    assert_complete(study, search, reruns, (8192, 16384), ('adam', 'lamb'))
    assert len(search) == len(reruns) == 4
    assert study.main(flags + ['--check']) == 0, capsys.readouterr().out


def test_the_committed_batchnorm_study_is_complete_and_in_the_readme(
        study, capsys):
    """The MLP with BatchNorm (examples/mnist/study/mlp-bn/): at 512, 8192
    and 16384 the 8 trials of each cell, the three seeded reruns of each
    cell's best, and the trainer's defaults once and with the same seeds;
    at 8192 and 16384 the budget sweep of each cell's best trial at 2x and
    4x; every JSON is of that model and what the study would write, and
    examples/mnist/README.md holds their tables."""
    flags = ['--model', 'mlp-bn', '--batchsizes', '8192,16384,512',
             '--refine', '0', '--budget-configs', '1', '--budgets', '2,4']
    out = os.path.join(os.path.dirname(study.__file__), 'study', 'mlp-bn')
    search, reruns = study.load(out)
    sizes = [512, 8192, 16384]
    assert_complete(study, search, reruns, sizes, study.DEFAULT_OPTIMIZERS)
    assert sorted(study.load_defaults(out)) == sizes
    assert {b: [r['seed'] for r in records] for b, records in
            study.load_defaults(out, reruns=True).items()} == {
                b: study.SEEDS for b in sizes}
    budgets = study.load_budgets(out)
    assert sorted(budgets) == sorted((b, o) for b in (8192, 16384)
                                     for o in study.DEFAULT_OPTIMIZERS)
    for cell, records in budgets.items():
        top = study.best(search[cell])['trial']
        assert sorted((r['trial'], r['budget']) for r in records) == [
            (top, 2), (top, 4)], cell
    assert study.main(flags + ['--check']) == 0, capsys.readouterr().out


def test_the_committed_pretuned_search_is_in_the_readme(study, capsys):
    """The search with each optimizer's pre-tuned settings
    (examples/mnist/study/pretuned/): at 8192 and 16384 the 8 trials of
    each cell and the three seeded reruns of each cell's best, their flags
    those of the committed pre-tuning; examples/mnist/README.md holds its
    tables."""
    flags = ['--pretuned', '--batchsizes', '8192,16384', '--refine', '0',
             '--budget-configs', '0']
    search, reruns = study.load(os.path.join(study.OUT, study.PRETUNED))
    assert_complete(study, search, reruns, (8192, 16384),
                    study.DEFAULT_OPTIMIZERS)
    assert len(search) == len(reruns) == 4
    assert study.main(flags + ['--check']) == 0, capsys.readouterr().out


# -- The same pre-tuning for both ------------------------------------------

def test_pretune_runs_a_pilot_then_the_grid_at_the_working_rate(
        study, tiny_study, tmp_path, monkeypatch, capsys, forked_trainers):
    """--pretune: for each optimizer the same pilot (rates around its own
    rule, momentum 0.9, warm-up 20 %, no smoothing), then weight decay and
    decay power at its working rate; the tables and --check cover it."""
    monkeypatch.setattr(study, 'PILOT', [-1, 1])
    monkeypatch.setattr(study, 'WEIGHT_DECAYS', [0.0, 1e-4])
    monkeypatch.setattr(study, 'DECAY_POWERS', [1.0])
    out = tmp_path / 'json'
    argv = ['--dataset-root', tiny_study.root, '--epochs', '2',
            '--validation', '16', '--target', '0.3', '--out', str(out),
            '--runs', str(tmp_path / 'runs'), '--noplot']
    previous = chainer.dataset.get_dataset_root()
    try:
        assert study.main(argv + ['--pretune', '--pretune-batchsize',
                                  '16']) == 0
        capsys.readouterr()
        assert study.main(argv + ['--pretune', '--pretune-batchsize',
                                  '16']) == 0  # again: nothing to run
    finally:
        chainer.dataset.set_dataset_root(previous)
    assert capsys.readouterr().out == (
        'nothing to run: every run of these settings has its JSON in {} '
        '(--tables prints the tables)\n'.format(out / 'pretune'))
    found = records(out / 'pretune')
    assert sorted(found) == sorted(
        '{}-b16-{}'.format(o, run) for o in ('nesterov', 'lars')
        for run in ('pilot-1', 'pilot1', 'grid0', 'grid1'))
    assert not (out / 'nesterov-b16-t0.json').exists()  # no search
    for o in ('nesterov', 'lars'):
        pilot = [found['{}-b16-pilot{}'.format(o, k)] for k in (-1, 1)]
        centre = study.center_lr(o, 16)
        for k, r in zip((-1, 1), pilot):
            assert r['stage'] == 'pilot' and r['trial'] == k
            assert r['flags'] == {
                'lr': study._round(centre * 10 ** (k / 2)),
                'momentum': 0.9, 'warmup_epochs': 0.4,
                'label_smoothing': 0.0}
        rate = max(pilot, key=lambda r: (r['best_validation'],
                                         -r['flags']['lr']))['flags']['lr']
        for index, decay in enumerate((0.0, 1e-4)):
            r = found['{}-b16-grid{}'.format(o, index)]
            assert r['stage'] == 'grid'
            assert r['flags']['lr'] == rate
            assert (r['flags']['weight_decay'],
                    r['flags']['decay_power']) == (decay, 1.0)
            assert '--weight-decay {:g} --decay-power 1 '.format(
                decay) in r['command']
    tables = [h for h, _ in study.pretune_tables(
        study.load_pretune(str(out)))]
    assert tables[0][:4] == ['batch size', 'optimizer', 'stage', 'run']
    assert tables[1][3] == 'working rate'
    # --check finds the tables in a README that holds them, and a grid
    # run away from the working rate.
    readme = tmp_path / 'README.md'
    capsys.readouterr()
    assert study.main(['--out', str(out), '--tables']) == 0
    readme.write_text(capsys.readouterr().out)
    check = ['--out', str(out), '--check', str(readme)]
    assert study.main(check) == 0, capsys.readouterr().out
    # --pretuned: the search again with each optimizer's own settings.
    pretuned = argv + ['--pretuned', '--pretune-batchsize', '16',
                       '--batchsizes', '16', '--trials', '2', '--seeds', '1',
                       '--refine', '0', '--budget-configs', '0']
    try:
        assert study.main(pretuned) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    settings = study.pretuned_settings(str(out), 16, ['nesterov', 'lars'])
    found = records(out / 'pretuned')
    assert sorted(found) == sorted(
        '{}-b16-{}'.format(o, run) for o in ('nesterov', 'lars')
        for run in ('t0', 't1', 'best-s1'))
    for o in ('nesterov', 'lars'):
        own = settings[o]
        grid = [r for r in records(out / 'pretune').values()
                if r['optimizer'] == o and r['stage'] == 'grid']
        top = study.best(grid)['flags']
        assert (own['weight_decay'], own['decay_power']) == (
            top['weight_decay'], top['decay_power'])
        for trial in (0, 1):
            flags = found['{}-b16-t{}'.format(o, trial)]['flags']
            u = study.points(trial + 1)[trial]
            assert flags['lr'] == study._round(
                own['lr'] * 10 ** (-1 + 2 * u[0]))
            assert flags['warmup_epochs'] == study._round(0.5 * 2 * u[2])
            assert (flags['weight_decay'], flags['decay_power']) == (
                own['weight_decay'], own['decay_power'])
    capsys.readouterr()
    assert study.main(pretuned[:-2] + ['--tables']) == 0
    readme.write_text(capsys.readouterr().out)
    assert study.main(pretuned[:-2] + ['--check', str(readme)]) == 0, (
        capsys.readouterr().out)
    # A run of the pre-tuning changed: its grid run is no longer at the
    # working rate.
    grid = out / 'pretune' / 'lars-b16-grid0.json'
    record = read_json(grid)
    record['flags']['lr'] *= 2
    grid.write_text(json.dumps(record))
    capsys.readouterr()
    assert study.main(check) == 1
    assert 'lars-b16-grid0: flags' in capsys.readouterr().out
    # --pretuned before the pre-tuning is complete.
    (out / 'pretune' / 'lars-b16-grid1.json').unlink()
    with pytest.raises(SystemExit, match='pre-tuning of lars at batch size '
                       '16 has 3 of its 4 runs'):
        study.main(pretuned)


# -- The model with BatchNorm ---------------------------------------------

def test_mlp_bn_trains_records_its_model_and_resumes(mnist, dataset_root,
                                                     tmp_path, capsys):
    """--model mlp-bn: BatchNormalization after each hidden layer (the
    hidden linear maps without bias), trained and evaluated on the tiny
    data; the snapshot records the model, a resumed run logs the same, and
    resuming it as the plain MLP is refused."""
    args = ['--dataset-root', dataset_root, '--model', 'mlp-bn',
            '--batchsize', '16', '--unit', '8', '--epoch', '2',
            '--validation', '16', '--eval-every', '1', '--test', 'end',
            '--noplot']
    first = tmp_path / 'first'
    mnist.main(args + ['--out', str(first), '--snapshots', '2'])
    log = read_log(first)
    assert [e['iteration'] for e in log] == list(range(7))
    assert 0 <= log[-1]['test/main/accuracy'] <= 1
    with numpy.load(str(first / 'snapshot_iter_6')) as snapshot:
        keys = snapshot.files
        recorded = {key.split('/')[-1]: snapshot[key].item()
                    for key in keys if 'RunSettings' in key}
    assert recorded['model'] == 'mlp-bn'
    names = {key.split('updater/model:main/predictor/')[-1] for key in keys
             if key.startswith('updater/model:main/predictor/')}
    assert {'bn1/gamma', 'bn1/beta', 'bn1/avg_mean', 'bn2/avg_var',
            'l1/W', 'l3/b'} <= names
    assert 'l1/b' not in names and 'l2/b' not in names

    # The evaluation uses the running statistics: the last validation
    # accuracy is the model's on the held-out images in test mode.
    numpy.random.seed(0)
    model = L.Classifier(mnist.MLPBN(784, 8, 10))
    chainer.serializers.load_npz(str(first / 'snapshot_iter_6'), model,
                                 path='updater/model:main/')
    train, _ = data.load_mnist()
    x, t = chainer.dataset.concat_examples(train[48:])
    with chainer.using_config('train', False):
        accuracy = (model.predictor(x).array.argmax(axis=1) == t).mean()
    assert log[-1]['val/main/accuracy'] == pytest.approx(accuracy)

    resumed = tmp_path / 'resumed'
    mnist.main(args + ['--out', str(resumed),
                       '--resume', str(first / 'snapshot_iter_3')])
    assert without_time(read_log(resumed)) == without_time(log)
    capsys.readouterr()
    plain = list(args)
    plain[plain.index('mlp-bn')] = 'mlp'
    with pytest.raises(SystemExit):
        mnist.main(plain + ['--out', str(tmp_path / 'plain'), '--resume',
                            str(first / 'snapshot_iter_3')])
    assert 'written with --model mlp-bn, this run has mlp' in (
        capsys.readouterr().err)


def test_the_default_model_is_the_plain_mlp(mnist):
    assert mnist.parse_args([]).model == 'mlp'
    numpy.random.seed(0)
    plain = mnist.MODELS['mlp'](784, 8, 10)
    assert plain.__class__ is mnist.MLP
    assert not any('bn' in name for name, _ in plain.namedparams())


def test_study_commands_name_the_model(study):
    plain = study.command('lars', 512, 6, {}, 0, 10000, 50000, 'never')
    assert '--model' not in plain  # the committed trials' commands
    bn = study.command('lars', 512, 6, {}, 0, 10000, 50000, 'never',
                       'mlp-bn')
    assert bn[bn.index('--model') + 1] == 'mlp-bn'
    assert study.model_out('mlp') == study.OUT
    assert study.model_out('mlp-bn') == os.path.join(study.OUT, 'mlp-bn')


# -- The budget sweep ------------------------------------------------------

def test_budget_sweep_stretches_the_best_trials(study, tiny_study,
                                                tmp_path, capsys,
                                                forked_trainers):
    """--budgets 2 --budget-configs 1: the best trial of each cell again
    at twice its epochs, its warm-up twice as long (the same fraction of
    the run); the JSON records budget_of, budget and epochs; the tables
    give the fewest steps over the budgets, and --check finds a run of a
    trial that is not among the best."""
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    argv = list(tiny_study.argv)
    argv[argv.index('--out') + 1] = str(out)
    argv[argv.index('--runs') + 1] = str(tmp_path / 'runs')
    sweep = ['--budgets', '2', '--budget-batchsizes', '16',
             '--budget-configs', '1']
    previous = chainer.dataset.get_dataset_root()
    try:
        assert study.main(argv + sweep + ['--figure',
                                          str(tmp_path / 'f.png')]) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    capsys.readouterr()
    found = records(out)
    for optimizer in ('nesterov', 'lars'):
        top = study.best([found['{}-b16-t{}'.format(optimizer, t)]
                          for t in (0, 1)])
        name = '{}-b16-t{}-x2'.format(optimizer, top['trial'])
        run = found[name]
        assert run['budget'] == 2 and run['epochs'] == 4
        assert run['budget_of'] == '{}-b16-t{}'.format(optimizer,
                                                       top['trial'])
        assert run['flags']['warmup_epochs'] == pytest.approx(
            2 * top['flags']['warmup_epochs'], rel=1e-3)
        assert {k: v for k, v in run['flags'].items()
                if k != 'warmup_epochs'} == {
            k: v for k, v in top['flags'].items() if k != 'warmup_epochs'}
        assert '--epoch 4 ' in run['command']
        log = read_log(tmp_path / 'runs' / name)
        assert log[-1]['epoch'] == 4
        assert run['steps_to_target'] == study.first_at_target(
            run['curve'], 16, 0.3)
    assert (tmp_path / 'f.png').stat().st_size > 0
    # The sweep's runs are not search trials: the search tables and the
    # reruns are unchanged.
    search, reruns = study.load(str(out))
    assert sorted(r['trial'] for r in search[16, 'lars']) == [0, 1]
    tables = ['--out', str(out), '--trials', '2', '--seeds', '1'] + sweep
    assert study.main(tables + ['--tables']) == 0
    printed = capsys.readouterr().out
    runs = [found['lars-b16-t{}'.format(t)] for t in (0, 1)]
    top = study.best(runs)
    stretched = found['lars-b16-t{}-x2'.format(top['trial'])]
    fastest = min([r for r in (top, stretched)
                   if r['steps_to_target'] is not None],
                  key=lambda r: r['steps_to_target'], default=None)
    row = [line for line in printed.splitlines()
           if line.startswith('| 16 | lars | 2/2 |')]
    assert len(row) == 1
    if fastest is None:
        assert row[0].startswith('| 16 | lars | 2/2 | 0 | - | - |')
    else:
        want = '| {} | {:g}x |'.format(fastest['steps_to_target'],
                                       fastest.get('budget', 1))
        assert want in row[0]
    readme = tmp_path / 'README.md'
    readme.write_text('# Study\n\n' + printed)
    check = tables + ['--check', str(readme)]
    assert study.main(check) == 0
    capsys.readouterr()
    # A run of another trial than the best, and a curve that disagrees
    # with its steps_to_target, are found.
    other = 1 - top['trial']
    record = dict(stretched, trial=other,
                  budget_of='lars-b16-t{}'.format(other))
    (out / 'lars-b16-t{}-x2.json'.format(other)).write_text(
        json.dumps(record))
    record = read_json(out / 'nesterov-b16-t0.json')
    record['steps_to_target'] = 10 ** 6
    (out / 'nesterov-b16-t0.json').write_text(json.dumps(record))
    assert study.main(check) == 1
    printed = capsys.readouterr().out
    assert 'lars-b16-t{}-x2: trial {} is not among the 1 best'.format(
        other, other) in printed
    assert 'nesterov-b16-t0: steps_to_target 1000000, its curve first ' \
        'reaches 30 % at' in printed


def test_a_study_of_the_model_with_batchnorm(study, tiny_study, tmp_path,
                                             capsys, forked_trainers):
    """--model mlp-bn: the same protocol, every command with --model
    mlp-bn, every JSON recording it; --check of those JSONs passes with
    --model mlp-bn and names the model without it."""
    out = tmp_path / 'bn'
    argv = list(tiny_study.argv)
    argv[argv.index('--out') + 1] = str(out)
    argv[argv.index('--runs') + 1] = str(tmp_path / 'runs')
    argv[argv.index('--figure') + 1] = str(tmp_path / 'bn.png')
    previous = chainer.dataset.get_dataset_root()
    try:
        assert study.main(argv + ['--model', 'mlp-bn']) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    found = records(out)
    assert sorted(found) == sorted(records(tiny_study.out))
    for name, record in found.items():
        assert record['model'] == 'mlp-bn', name
        assert ' --model mlp-bn ' in record['command'], name
    log = read_log(tmp_path / 'runs' / 'lars-b16-t0')
    assert log[-1]['epoch'] == 2
    assert (tmp_path / 'bn.png').stat().st_size > 0
    capsys.readouterr()
    tables = ['--out', str(out), '--trials', '2', '--seeds', '1']
    assert study.main(tables + ['--model', 'mlp-bn', '--tables']) == 0
    readme = tmp_path / 'README.md'
    readme.write_text('# Study\n\n' + capsys.readouterr().out)
    check = tables + ['--check', str(readme)]
    assert study.main(check + ['--model', 'mlp-bn']) == 0
    capsys.readouterr()
    assert study.main(check) == 1
    assert 'lars-b16-t0: a run of --model mlp-bn, not mlp' in (
        capsys.readouterr().out)


# -- The fair experiment (--fair) -----------------------------------------

def test_each_round_of_the_fair_search_holds_every_corner_once(study):
    """The discrete factors (decay power x beta2 x eps) as a full
    factorial per round of 8, each round in its own seeded order."""
    assert len(study.FAIR_CORNERS) == 8
    rounds = [[study.corner(t, 8) for t in range(r * 8, r * 8 + 8)]
              for r in (0, 1)]
    for corners in rounds:
        assert sorted(corners) == sorted(study.FAIR_CORNERS)
        for i, values in enumerate((study.DECAY_POWERS, study.FAIR_BETA2S,
                                    study.FAIR_EPSS)):
            assert sorted(c[i] for c in corners) == sorted(values * 4)
    assert rounds[0] != rounds[1]


def test_the_fair_search_is_the_same_for_both_arms(study):
    """Both arms of a pair get the same points, their rates the same
    multiples of their own working rates; momentum 0.9; warm-up up to
    half the run; beta2 and eps for adam and lamb only."""
    rates = {'nesterov': 0.18, 'lars': 1.4, 'adam': 0.005, 'lamb': 0.05}
    for trial in range(8):
        flags = {o: study.fair_flags(o, 28, trial, 8, [], lr)
                 for o, lr in rates.items()}
        for a, b in study.PAIRS:
            assert (flags[a]['lr'] / rates[a]) == pytest.approx(
                flags[b]['lr'] / rates[b], rel=1e-3)
            assert {k: v for k, v in flags[a].items() if k != 'lr'} == {
                k: v for k, v in flags[b].items() if k != 'lr'}
        for o, f in flags.items():
            assert 10 ** -0.5 * 0.999 <= f['lr'] / rates[o] <= (
                10 ** 0.5 * 1.001)
            assert f['momentum'] == 0.9
            assert 0 <= f['warmup_epochs'] <= 14
            assert 0 <= f['label_smoothing'] <= 0.2
            assert f['decay_power'] in (1.0, 2.0)
            assert ('beta2' in f) == ('eps' in f) == (o in ('adam', 'lamb'))
            power, beta2, eps = study.corner(trial, 8)
            assert f['decay_power'] == power
            if 'beta2' in f:
                assert (f['beta2'], f['eps']) == (beta2, eps)
    # The two arms' rate coordinates span the range: the lowest and the
    # highest of 8 points lie in its outer quarters.
    ratios = sorted(study.fair_flags('lars', 28, t, 8, [], 1.0)['lr']
                    for t in range(8))
    assert ratios[0] < 10 ** -0.25 and ratios[-1] > 10 ** 0.25


def fake_record(trial, lr, steps, best=0.99, seed=0):
    return {'trial': trial, 'seed': seed, 'flags': {'lr': lr},
            'steps_to_target': steps, 'best_validation': best}


def test_fair_round_two_centres_on_round_one_s_best(study):
    first = [fake_record(t, study.fair_flags('lars', 28, t, 8, [], 1.4)['lr'],
                         steps) for t, steps in enumerate(
        [60, None, 52, 70, None, 58, 64, 66])]
    # Not before round one is complete.
    assert study.fair_flags('lars', 28, 8, 8, first[:7], 1.4) is None
    centre = first[2]['flags']['lr']  # the fewest steps
    u = study.points(16, primes=study.FAIR_PRIMES)
    for trial in range(8, 16):
        flags = study.fair_flags('lars', 28, trial, 8, first, 1.4)
        assert flags['lr'] == pytest.approx(
            centre * 10 ** (0.25 * (2 * u[trial][0] - 1)), rel=1e-3)
        assert 10 ** -0.25 * 0.999 <= flags['lr'] / centre <= (
            10 ** 0.25 * 1.001)
        assert flags['warmup_epochs'] == study._round(
            0.5 * 28 * u[trial][1])


@pytest.mark.parametrize('a, b, p', [
    ([1, 2, 3], [4, 5, 6], 0.1),  # 2 splits of 20 as extreme
    ([1, 2, 4], [3, 5, 6], 0.2),  # rank sums 6, 7, 14, 15 of 20 splits
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], 2 / 252),
    ([7, 7, 7], [7, 7, 7], 1.0),
    # One reach (50 steps) in three against none: the misses tie.
    ([50, math.inf, math.inf], [math.inf] * 3, 1.0),
    ([40, 41, 42], [math.inf] * 3, 0.1),
])
def test_rank_test_is_the_exact_two_sided_rank_sum_test(study, a, b, p):
    assert study.rank_test(a, b) == pytest.approx(p)
    assert study.rank_test(b, a) == pytest.approx(p)


def test_more_seeds_where_the_arms_ranges_overlap(study):
    def reruns(steps_a, steps_b, pair=('nesterov', 'lars')):
        return {(8192, o): [fake_record(3, 1.0, s, seed=i + 1)
                            for i, s in enumerate(steps)]
                for o, steps in zip(pair, (steps_a, steps_b))}
    more = [4, 5]
    for a, b, overlap in [
            ([None] * 3, [44, 46, 43], False),  # 0/3 against 3/3
            ([50, 52, 54], [44, 46, 48], False),
            ([50, 52, 54], [44, 46, 50], True),  # 50 in both
            ([44, None, 50], [46, 47, 48], True),  # a miss: beyond any
            ([None] * 3, [None] * 3, True)]:
        found = reruns(a, b)
        assert study.ranges_overlap(found[8192, 'nesterov'],
                                    found[8192, 'lars']) == overlap
        for o in ('nesterov', 'lars'):
            assert study.wanted_seeds(found, 8192, o, [1, 2, 3], more) == (
                [1, 2, 3, 4, 5] if overlap else [1, 2, 3])
    # Not before both arms have their three seeds; not without a pair.
    found = reruns([50, 52], [50, 52, 54])
    assert study.wanted_seeds(found, 8192, 'lars', [1, 2, 3], more) == [
        1, 2, 3]
    assert study.wanted_seeds({(8192, 'defaults'): []}, 8192, 'defaults',
                              [1, 2, 3], more) == [1, 2, 3]
    assert study.partner('lamb') == 'adam' and study.partner('x') is None


def curve_record(optimizer, seed, accuracies, target=0.98):
    """A rerun whose validation curve is ``accuracies`` at steps 2, 4,
    ...; its steps to the target from the curve."""
    curve = [[2 * (i + 1), a] for i, a in enumerate(accuracies)]
    return {'optimizer': optimizer, 'batchsize': 8192, 'trial': 1,
            'seed': seed, 'target': target, 'validation': 10000,
            'curve': curve, 'best_validation': max(accuracies),
            'steps_to_target': next((s for s, a in curve
                                     if a >= target), None)}


def test_the_target_sensitivity_table_reads_the_curves(study):
    reruns = {(8192, 'nesterov'): [
        curve_record('nesterov', 1, [0.96, 0.9701, 0.975, 0.9799]),
        curve_record('nesterov', 2, [0.95, 0.968, 0.9749, 0.976])],
        (8192, 'lars'): [
        curve_record('lars', 1, [0.97, 0.98, 0.985, 0.985]),
        curve_record('lars', 2, [0.975, 0.979, 0.981, 0.981])]}
    head, rows = study.sensitivity_table(reruns)
    assert head == ['batch size', 'optimizer', 'seeds', 'reached 97 %',
                    'steps to 97 %', 'reached 97.5 %', 'steps to 97.5 %',
                    'reached 98 %', 'steps to 98 %']
    assert rows == [
        ['8192', 'nesterov', '2', '2', '5 (4-6)', '2', '7 (6-8)', '0', '-'],
        ['8192', 'lars', '2', '2', '2 (2-2)', '2', '3 (2-4)', '2',
         '5 (4-6)']]
    head, rows = study.pair_table(reruns)
    assert rows == [['8192', 'nesterov / lars', '2 / 2', '0 / 2', 'no',
                     '0.33', '0.33']]


def fake_training(cmd, out, dataset_root, device, stdout):
    """A stand-in for the trainer (``study.run_command``): a log whose
    validation accuracy rises linearly to a ceiling that falls with the
    rate's distance from twice the optimizer's rule, in a number of steps
    of the optimizer's own, one more on odd seeds: lars faster than
    nesterov (their reruns do not overlap), adam and lamb alike (theirs
    do)."""
    def flag(name, kind=float):
        return kind(cmd[cmd.index(name) + 1])
    optimizer, batchsize = flag('--optimizer', str), flag('--batchsize', int)
    distance = math.log10(flag('--lr') / (2 * recipe.default_lr(
        optimizer, batchsize, 0.02) if optimizer != 'nesterov' else
        2 * 0.1 * (batchsize / 256) ** 0.5))
    ceiling = 0.99 - 0.02 * distance ** 2
    ramp = {'nesterov': 10, 'lars': 6}.get(optimizer, 8) + flag(
        '--seed', int) % 2
    log = [{'iteration': i, 'epoch': i // 4, 'main/loss': 0.1,
            'val/main/accuracy': round(ceiling * min(1, i / ramp), 4)}
           for i in range(1, 4 * flag('--epoch', int) + 1)]
    if flag('--test', str) == 'end':
        log[-1]['test/main/accuracy'] = 0.97
    return log


def test_the_fair_experiment_runs_the_same_protocol_for_every_arm(
        study, tmp_path, monkeypatch, capsys):
    """--fair 2: the pilot, both rounds, the reruns (more seeds where the
    arms overlap), every JSON with its machine; its tables and --check
    under its own README line; --check finds what the protocol would not
    have written. The trainer is ``fake_training``."""
    monkeypatch.setattr(study, 'run_command', fake_training)
    monkeypatch.setattr(study, 'n_training_images', lambda v: 64)
    monkeypatch.setattr(study, 'PILOT', [-1, 0, 1])
    out = tmp_path / 'json'
    argv = ['--model', 'mlp-bn', '--fair', '2', '--batchsizes', '16',
            '--epochs', '2', '--trials', '2', '--seeds', '1,2',
            '--more-seeds', '3', '--validation', '100', '--out', str(out),
            '--runs', str(tmp_path / 'runs'), '--noplot']
    for optimizers in ('nesterov,lars', 'adam,lamb'):
        assert study.main(argv + ['--optimizers', optimizers]) == 0
    folder = out / 'fair-x2'
    found = records(folder)
    pilots = records(folder / 'pretune')
    for o in ('nesterov', 'lars', 'adam', 'lamb'):
        seeds = (1, 2, 3) if o in ('adam', 'lamb') else (1, 2)
        assert sorted(n for n in found if n.startswith(o + '-')) == sorted(
            ['{}-b16-t{}'.format(o, t) for t in range(4)]
            + ['{}-b16-best-s{}'.format(o, s) for s in seeds])
        pilot = [pilots['{}-b16-pilot{}'.format(o, k)] for k in (-1, 0, 1)]
        assert [r['flags'] for r in pilot] == [
            study.pilot_flags(o, 16, 4, k) for k in (-1, 0, 1)]
        rate = study.working(pilot)['flags']['lr']
        trials = [found['{}-b16-t{}'.format(o, t)] for t in range(4)]
        for t, r in enumerate(trials[:2]):
            assert r['flags'] == study.fair_flags(o, 4, t, 2, [], rate)
        centre = study.best(trials[:2])['flags']['lr']
        for r in trials[2:]:
            assert 10 ** -0.25 * 0.999 <= r['flags']['lr'] / centre <= (
                10 ** 0.25 * 1.001)
        chosen = study.best(trials)
        for s in seeds:
            rerun = found['{}-b16-best-s{}'.format(o, s)]
            assert (rerun['trial'], rerun['flags']) == (chosen['trial'],
                                                        chosen['flags'])
        for r in trials + pilot:
            assert r['epochs'] == 4 and r['fair'] == 2
            assert set(study.MACHINE_KEYS) <= set(r['machine'])
            assert ('--beta2' in r['command']) == (
                o in ('adam', 'lamb') and 'stage' not in r)
    # The tables, under the experiment's own line; --check passes.
    tables = ['--model', 'mlp-bn', '--fair', '2', '--batchsizes', '16',
              '--epochs', '2', '--trials', '2', '--seeds', '1,2',
              '--more-seeds', '3', '--out', str(out)]
    capsys.readouterr()
    assert study.main(tables + ['--tables']) == 0
    printed = capsys.readouterr().out
    assert '| 16 | adam / lamb | 3 / 3 | 3 / 3 | yes |' in printed
    assert '| 16 | nesterov / lars | 2 / 2 | 2 / 2 | no | 0.33 |' in printed
    assert '| 16 | lamb | 4 | 4/4 |' in printed
    readme = tmp_path / 'README.md'
    marker = '<!-- study.py --model mlp-bn --fair 2 --tables -->\n\n'
    readme.write_text('# Study\n\n' + marker + printed)
    check = tables + ['--check', str(readme)]
    assert study.main(check) == 0, capsys.readouterr().out
    # Under the BatchNorm study's line alone, not found.
    readme.write_text('<!-- study.py --model mlp-bn --tables -->\n\n'
                      + printed)
    assert study.main(check) == 1
    assert '--fair 2 ... --tables -->' in capsys.readouterr().out
    readme.write_text('# Study\n\n' + marker + printed)
    # What the protocol would not have written: a rerun of a seed the
    # cell does not want, a JSON without its machine, a trial off its
    # point, a run of another budget.
    rerun = found['lars-b16-best-s1']
    (folder / 'lars-b16-best-s3.json').write_text(json.dumps(dict(
        rerun, seed=3)))
    record = dict(found['nesterov-b16-t0'])
    del record['machine']
    (folder / 'nesterov-b16-t0.json').write_text(json.dumps(record))
    record = dict(found['adam-b16-t1'])
    record['flags'] = dict(record['flags'], beta2=0.9)
    (folder / 'adam-b16-t1.json').write_text(json.dumps(record))
    (folder / 'lamb-b16-t0.json').write_text(json.dumps(dict(
        found['lamb-b16-t0'], epochs=2, fair=1)))
    capsys.readouterr()
    assert study.main(check) == 1
    printed = capsys.readouterr().out
    for problem in ('lars-b16-best-s3: seed 3, the reruns of this cell are '
                    'of seeds [1, 2]',
                    'nesterov-b16-t0: its machine does not record cpu',
                    'adam-b16-t1: flags {',
                    'lamb-b16-t0: a run of --fair 1, not 2',
                    'lamb-b16-t0: 2 epochs, the budget is 4'):
        assert problem in printed, problem


def test_the_committed_fair_experiment_is_in_the_readme(study, capsys):
    """The fair experiment (examples/mnist/study/mlp-bn/fair-x<B>/): each
    budget run so far is what --fair would write (the pilot's, the
    search's and the reruns' flags and seeds, the machine in every JSON)
    and in examples/mnist/README.md; a cell with reruns has its whole
    pilot and search."""
    out = os.path.join(os.path.dirname(study.__file__), 'study', 'mlp-bn')
    budgets = [b for b in ('2', '1')
               if os.path.isdir(os.path.join(out, 'fair-x' + b))]
    assert '2' in budgets
    for budget in budgets:
        folder = os.path.join(out, 'fair-x' + budget)
        search, reruns = study.load(folder)
        pilots = study.load_pretune(folder)
        for (b, o), done in reruns.items():
            assert len(pilots[b, o, 'pilot']) == len(study.PILOT)
            assert sorted(r['trial'] for r in search[b, o]) == list(
                range(2 * study.TRIALS))
            assert [r['seed'] for r in done] == study.wanted_seeds(
                reruns, b, o, study.SEEDS, study.MORE_SEEDS)[:len(done)]
        flags = ['--model', 'mlp-bn', '--fair', budget]
        assert study.main(flags + ['--check']) == 0, capsys.readouterr().out


# -- A study folder read, or run again, with other settings ----------------

def committed_copy(study, tmp_path):
    """A copy of the committed study's folder, and a snapshot of it."""
    copy = tmp_path / 'copy'
    shutil.copytree(study.OUT, str(copy))
    return copy, snapshot(copy)


def snapshot(folder):
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob('*')) if p.is_file()}


def no_run(*args, **kwargs):
    raise AssertionError('a trainer ran')


@pytest.mark.parametrize('flags, says', [
    (['--epochs', '10'], 'made with --epochs 24, not --epochs 10'),
    (['--trials', '4'], 'trial 4 of a search of 4'),
    (['--target', '0.97'], 'made with --target 0.98, not --target 0.97'),
    (['--validation', '5000'],
     'made with --validation 10000, not --validation 5000'),
    (['--model', 'mlp-bn'], 'made with --model mlp, not --model mlp-bn'),
    (['--target', '0.97', '--tables'], '--target 0.98, not --target 0.97'),
    (['--validation', '5000', '--plot-only'], '--validation 10000'),
    (['--trials', '4', '--tables'], 'trial 4 of a search of 4'),
    (['--seeds', '1', '--tables'], 'a rerun with seed 2, not one of '
     '--seeds 1'),
    (['--batchsizes', '1000', '--tables'],
     '--batchsizes 1000: no JSON of that batch size')])
def test_a_folder_of_other_settings_is_refused_before_anything_runs(
        study, tmp_path, capsys, monkeypatch, flags, says):
    """Run again with flags that change a trial, the study replaced the
    committed JSONs (or took a 98 % folder as complete at 97 %); --tables
    printed another study's tables. Now it refuses, naming a file, and
    the folder is as it was."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    copy, before = committed_copy(study, tmp_path)
    runs = tmp_path / 'runs'
    with pytest.raises(SystemExit) as exc:
        study.main(['--out', str(copy), '--runs', str(runs), '--noplot',
                    '--figure', str(tmp_path / 'f.png')] + flags)
    assert exc.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert says in line and 'give another --out' in line, line
    if not says.startswith('--batchsizes'):
        assert str(copy) + os.sep in line
    assert snapshot(copy) == before
    assert not runs.exists() and not (tmp_path / 'f.png').exists()


def test_a_search_json_of_other_flags_is_not_replaced(study, tmp_path,
                                                      monkeypatch):
    """Past main's check (a JSON written meanwhile): run_trial refuses
    to replace a search trial; only reruns and budget runs are redone."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    copy, before = committed_copy(study, tmp_path)
    args = argparse.Namespace(out=str(copy))
    path = str(copy / 'nesterov-b512-t0.json')
    flags = dict(read_json(path)['flags'], lr=1.0)
    with pytest.raises(SystemExit) as exc:
        study.run_trial(args, 'nesterov', 512, 0, flags, 0, 'never')
    assert str(exc.value.code).startswith(path + ': made with the flags')
    assert snapshot(copy) == before


def test_tables_of_the_batch_sizes_asked(study, capsys):
    assert study.main(['--batchsizes', '512', '--tables']) == 0
    rows = [line.split('|')[1].strip()
            for line in capsys.readouterr().out.splitlines()
            if line.startswith('| ') and not line.startswith('| batch')]
    assert rows and set(rows) == {'512'}


@pytest.mark.parametrize('flags, says', [
    (['--tables', '--plot-only'], '--tables and --plot-only are 2 tasks'),
    (['--check', '--tables'], '--check and --tables are 2 tasks'),
    (['--pretuned', '--optimizers', 'foo'],
     '--optimizers foo: choose from')])
def test_flags_the_reading_tasks_cannot_honour_are_refused(
        study, tmp_path, capsys, flags, says):
    with pytest.raises(SystemExit) as exc:
        study.main(['--figure', str(tmp_path / 'f.png')] + flags)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / 'f.png').exists()


@pytest.mark.parametrize('text, says', [
    ('{"batchsize": 512', 'cannot be read as JSON'),
    ('[1, 2]', 'not a JSON object but a list'),
    (None, 'no batchsize'),
    (None, 'no curve'),
    (None, 'curve holds [1], not an [iteration, accuracy] pair'),
    (None, 'steps_to_target is "40", not int or null')])
@pytest.mark.parametrize('task', ['--tables', '--check', '--plot-only',
                                  '--reproduce', 'run'])
def test_a_bad_json_is_named_not_a_traceback(study, tmp_path, monkeypatch,
                                             text, says, task):
    """A JSON cut short or edited by hand crashed every task with a
    traceback that did not name it."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    out = tmp_path / 'study'
    out.mkdir()
    good = read_json(os.path.join(study.OUT, 'nesterov-b512-t0.json'))
    if text is None:
        bad = dict(good)
        if says.startswith('no '):
            del bad[says[3:]]
        elif says.startswith('curve'):
            bad['curve'] = good['curve'][:2] + [[1]]
        else:
            bad['steps_to_target'] = '40'
        text = json.dumps(bad)
    path = out / 'nesterov-b512-t1.json'
    path.write_text(text)
    with open(str(out / 'nesterov-b512-t0.json'), 'w') as f:
        json.dump(good, f)
    argv = ['--out', str(out), '--runs', str(tmp_path / 'runs'), '--noplot',
            '--figure', str(tmp_path / 'f.png'), '--batchsizes', '512']
    argv += {'run': [], '--reproduce': ['--reproduce', str(path)],
             '--check': ['--check', str(tmp_path / 'none.md')]}.get(
                 task, [task])
    with pytest.raises(SystemExit) as exc:
        study.main(argv)
    # SystemExit(message): status 1, the message on stderr, no traceback.
    message = exc.value.code
    assert isinstance(message, str), message
    assert message.startswith(str(path) + ': ') and says in message, message
    # The file given to --reproduce is the user's: the study would not
    # run it again.
    assert ('--reproduce takes a JSON that the study wrote' in message) == (
        task == '--reproduce'), message
    assert ('remove it, and the study runs it again' in message) == (
        task != '--reproduce'), message


# -- A trainer that fails, data that is missing ------------------------------

def test_a_failed_trainer_shows_its_reason_and_its_output(
        study, tmp_path, dataset_root, capsys):
    """--validation as large as the training set: the trainer says why
    it stops in <runs>/<name>.stdout; the study showed a
    CalledProcessError traceback instead."""
    runs = tmp_path / 'runs'
    argv = ['--dataset-root', dataset_root, '--batchsizes', '16',
            '--optimizers', 'lars', '--trials', '1', '--seeds', '1',
            '--epochs', '2', '--validation', '64', '--noplot',
            '--out', str(tmp_path / 'json'), '--runs', str(runs)]
    with pytest.raises(SystemExit) as exc:
        study.main(argv)
    message = exc.value.code
    assert isinstance(message, str), message
    stdout = str(runs / 'lars-b16-t0.stdout')
    assert 'status 2' in message and stdout in message
    assert 'leaves no training images' in message.split(stdout, 1)[1]
    assert not (tmp_path / 'json').exists()


@pytest.mark.parametrize('task', ['run', '--reproduce'])
def test_missing_mnist_is_the_trainer_s_message(study, tmp_path,
                                                monkeypatch, task):
    """Without MNIST and a network the study ended in a URLError
    traceback (it called get_mnist itself); now as the trainer does."""
    def offline(*args, **kwargs):
        raise OSError('no network')
    monkeypatch.setattr(chainer.datasets, 'get_mnist', offline)
    monkeypatch.setattr(study.results, 'run_process', no_run)
    root = tmp_path / 'empty'
    root.mkdir()
    argv = ['--dataset-root', str(root), '--out', str(tmp_path / 'json'),
            '--runs', str(tmp_path / 'runs'), '--noplot']
    if task == '--reproduce':
        argv += ['--reproduce',
                 os.path.join(study.OUT, 'lars-b512-t0.json')]
    previous = chainer.dataset.get_dataset_root()
    try:
        with pytest.raises(SystemExit) as exc:
            study.main(argv)
    finally:
        chainer.dataset.set_dataset_root(previous)
    assert 'Error: MNIST is not cached' in str(exc.value.code)
    assert str(root) in str(exc.value.code)


def test_epochs_to_target_are_rounded_once(study):
    """17.6947 epochs (54 steps of 16384 on 50,000 images) were recorded
    as 17.695, then shown as 17.70; the tables round the exact value."""
    record = read_json(os.path.join(study.OUT, 'lars-b16384-t4.json'))
    assert record['epochs_to_target'] == 17.695
    head, rows = study.tables({(16384, 'lars'): [record]}, {})[0]
    assert rows[0][head.index('epochs to target')] == '17.69'
    head, rows = study.defaults_table({}, {8192: dict(
        record, batchsize=8192, steps_to_target=43, n_train=50000)})
    assert rows[0][head.index('epochs to target')] == '7.05'


@pytest.mark.parametrize('task', ['--plot-only', '--tables'])
def test_a_study_s_folder_read_without_its_flags_is_refused(study, tmp_path,
                                                            capsys, task):
    """--model mlp-bn --plot-only without the BatchNorm study's --refine
    0 --budget-configs 1 --budgets 2,4 drew its committed figure again,
    from the wrong flags (16 trials at 8192, 3 configurations swept)."""
    figure = tmp_path / 'study-mlp-bn.png'
    with pytest.raises(SystemExit) as exc:
        study.main(['--model', 'mlp-bn', '--figure', str(figure), task])
    assert exc.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert 'reruns of a search of one round of 8 trials' in line, line
    assert not figure.exists()
    assert study.main(['--model', 'mlp-bn', '--batchsizes', '8192,16384,512',
                       '--refine', '0', '--budget-configs', '1', '--budgets',
                       '2,4', '--figure', str(figure), task]) == 0
    assert figure.exists() == (task == '--plot-only')


def test_a_run_without_the_sweep_draws_a_folder_swept_before(
        study, tmp_path, monkeypatch, capsys):
    """The README's first BatchNorm command (--batchsizes 8192 --refine 0
    --budget-configs 0) on the committed folder, which holds the budget
    sweep's runs: the figure failed after every run, max() of an empty
    sequence. The cells of no swept trial are left out of the figure.
    (The study itself is replaced by one drawing, which fails loudly.)"""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    monkeypatch.setattr(study, 'study', study.plot)
    figure = tmp_path / 'f.png'
    assert study.main(['--model', 'mlp-bn', '--batchsizes', '8192',
                       '--refine', '0', '--budget-configs', '0', '--runs',
                       str(tmp_path / 'runs'), '--figure', str(figure)]) == 0
    assert figure.stat().st_size > 0
    out = study.model_out('mlp-bn')
    args = argparse.Namespace(batchsizes=[8192], budget_configs=0,
                              budget_batchsizes=[8192, 16384])
    assert study.load_budgets(out)
    assert study.budget_points(study.load(out)[0], study.load_budgets(out),
                               args) == {}


@pytest.mark.parametrize('trials, seeds, says', [
    ('1', '1', ['tuned by 1 trial on', 'each point: one seeded rerun of the '
                'best']),
    ('2', '1,2', ['tuned by 2 trials on', 'each point: mean of 2 seeded '
                  'reruns of the best'])])
def test_the_figure_s_title_counts_in_words(study, tmp_path, monkeypatch,
                                            trials, seeds, says):
    """It read 'each cell tuned by 1 trials' and 'mean of 1 seeded
    reruns'. (The trainer is ``fake_training``.)"""
    monkeypatch.setattr(study, 'run_command', fake_training)
    monkeypatch.setattr(study, 'n_training_images', lambda v: 64)
    drawn, real = [], study.plot
    monkeypatch.setattr(study, 'plot', lambda args: drawn.append(real(args)))
    argv = ['--batchsizes', '16', '--optimizers', 'nesterov', '--epochs',
            '2', '--trials', trials, '--seeds', seeds, '--validation', '100',
            '--refine', '0', '--budget-configs', '0', '--out',
            str(tmp_path / 'json'), '--runs', str(tmp_path / 'runs'),
            '--noplot']
    assert study.main(argv) == 0
    assert study.main(argv + ['--plot-only', '--figure',
                              str(tmp_path / 'f.png')]) == 0
    title = drawn[-1]._suptitle.get_text()
    for text in says:
        assert text in title, title


@pytest.mark.parametrize('flags, says', [
    (['--seeds', '0'], "--seeds 0: a rerun's seed is 1 or more (seed 0 is "
     "the search trial's own"),
    (['--seeds', '2,0'], '--seeds 0: a rerun'),
    (['--seeds', ','], '--seeds: no seed given'),
    (['--fair', '2', '--more-seeds', '0'], '--more-seeds 0: a rerun'),
    (['--fair', '2', '--budget-configs', '1'],
     '--fair searches two rounds at every batch size and runs no budget '
     'sweep: give it without --budget-configs'),
    (['--fair', '2', '--refine', '0', '--budgets', '2'],
     'give it without --refine and --budgets')])
def test_seed_0_and_flags_fair_would_override_are_refused(
        study, tmp_path, capsys, monkeypatch, flags, says):
    """--seeds 0 was taken: its rerun repeats the search trial.
    --fair set --refine and --budget-configs whatever was given."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    with pytest.raises(SystemExit) as exc:
        study.main(['--out', str(tmp_path / 'json'), '--runs',
                    str(tmp_path / 'runs'), '--noplot'] + flags)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err.splitlines()[-1]
    assert os.listdir(str(tmp_path)) == []


def test_budget_run_messages_name_the_file(study, capsys):
    """--budget-configs 1 on the study that swept 3: each budget run of a
    trial outside the best is named as a file, ``.json`` and all."""
    with pytest.raises(SystemExit):
        study.main(['--budget-configs', '1', '--tables'])
    line = capsys.readouterr().err.splitlines()[-1]
    assert re.search(r'-x[0-9.]+\.json: trial \d+ is not among the 1 best',
                     line), line


def test_a_search_of_one_trial_is_not_of_1_trials(study, tiny_study,
                                                  tmp_path):
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    for name in os.listdir(str(out)):
        if '-t1' in name:
            os.remove(str(out / name))
    args = argparse.Namespace(out=str(out), refine=[16], trials=1,
                              budgets=[], budget_configs=0)
    problems = study.other_rounds(args)
    assert problems and all(
        'reruns of a search of one round of 1 trial, --refine 16 gives it '
        'two' in p for p in problems), problems


# -- The committed figures ---------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'examples', 'mnist', 'README.md')


@pytest.fixture(scope='module')
def readme_figures(study, tmp_path_factory):
    """Each figure a ``python examples/mnist/study.py ... --plot-only``
    command of examples/mnist/README.md draws, by its file's name: the
    figure (drawn into a temporary folder) and the command."""
    with open(README) as f:
        text = ' '.join(f.read().split())
    commands = re.findall(
        r'`python examples/mnist/study\.py ([^`]*--plot-only[^`]*)`', text)
    folder = tmp_path_factory.mktemp('figures')
    found, real = {}, study.plot

    def plot(args):
        from matplotlib.backends import backend_agg
        name = os.path.basename(args.figure)
        args.figure = str(folder / name)
        figure = real(args)
        # Closed, it has no canvas to draw on again.
        backend_agg.FigureCanvasAgg(figure)
        found[name] = figure, flags

    study.plot = plot
    try:
        for flags in commands:
            argv = [os.path.join(ROOT, a)
                    if a.startswith('examples/') else a
                    for a in shlex.split(flags)]
            assert study.main(argv) == 0, flags
    finally:
        study.plot = real
    return found


def test_the_readme_redraws_each_committed_figure(readme_figures):
    """Each committed figure of the study has its --plot-only command in
    the README, with its study's flags, and the command runs."""
    here = os.path.join(ROOT, 'examples', 'mnist')
    committed = {n for n in os.listdir(here)
                 if n.startswith('study') and n.endswith('.png')}
    assert committed and committed <= set(readme_figures), sorted(
        committed - set(readme_figures))


def readme_commands():
    """The argv of each ``python examples/mnist/study.py`` command of
    examples/mnist/README.md's code blocks, and of those it runs "the
    same way" (the BatchNorm study's other batch sizes)."""
    with open(README) as f:
        lines = f.read().replace('\\\n', ' ').splitlines()
    found = [shlex.split(line.split('study.py', 1)[1]) for line in lines
             if line.startswith('    ')
             and 'python examples/mnist/study.py' in line]
    for argv in list(found):
        if argv[:4] == ['--model', 'mlp-bn', '--batchsizes', '8192']:
            found += [argv[:3] + [b] + argv[4:] for b in ('16384', '512')]
    return found


def drawn_from(args):
    """What a figure is drawn from: the flags ``plot`` reads (the fair
    experiment's figure, ``plot_fair``, draws every optimizer's)."""
    names = ['out', 'model', 'fair', 'target', 'trials']
    if args.fair is None:
        names += ['optimizers', 'refine', 'seeds', 'budgets',
                  'budget_batchsizes', 'budget_configs']
    return tuple(repr(getattr(args, name)) for name in names) + (
        repr(sorted(args.batchsizes)),)


def test_the_readme_s_study_commands_run_nothing_on_the_committed_folders(
        study, tmp_path, monkeypatch):
    """The LAMB-against-Adam command lacked --budget-configs 0: on the
    committed folder it began a budget sweep of 36 runs (and --check
    failed after it); the BatchNorm runs of one batch size at a time
    drew study-mlp-bn.png without the others. Run on a copy of the
    committed folders, each command of the README runs no trainer,
    changes no file, and draws a committed figure only from the flags
    of that figure's --plot-only command."""
    monkeypatch.setattr(study.results, 'run_process', no_run)
    monkeypatch.setattr(study, 'n_training_images', lambda n: 60000 - n)
    copy = tmp_path / 'study'
    shutil.copytree(study.OUT, str(copy))
    before = snapshot(copy)
    here = tmp_path / 'here'  # the committed figures' folder
    monkeypatch.setattr(study, 'HERE', str(here))
    monkeypatch.setattr(study, 'OUT', str(copy))
    # Nothing is written: each JSON is read once (the study reads its
    # folder again before every run).
    monkeypatch.setattr(study, 'read', functools.lru_cache(None)(
        study.read))
    drawn = {}

    def record(args):
        if args.plot:
            drawn.setdefault(args.figure, set()).add(drawn_from(args))
    monkeypatch.setattr(study, 'redraw', record)
    monkeypatch.setattr(study, 'plot', record)

    def mapped(argv):
        return [str(copy) + a[len('examples/mnist/study'):]
                if a.startswith('examples/mnist/study/')
                else str(here / a[len('examples/mnist/'):])
                if a.startswith('examples/mnist/') else a for a in argv]
    tasks = ('--tables', '--check', '--reproduce')
    commands = [argv for argv in readme_commands()
                if not set(tasks) & set(argv)]
    assert len(commands) == 12, commands
    for argv in commands:
        assert study.main(mapped(argv)) == 0, argv
    assert snapshot(copy) == before
    runs = dict(drawn)
    drawn.clear()
    with open(README) as f:
        text = ' '.join(f.read().split())
    for flags in re.findall(
            r'`python examples/mnist/study\.py ([^`]*--plot-only[^`]*)`',
            text):
        assert study.main(mapped(shlex.split(flags))) == 0, flags
    committed = {n for n in os.listdir(os.path.join(ROOT, 'examples',
                                                    'mnist'))
                 if n.startswith('study') and n.endswith('.png')}
    for path, how in runs.items():
        if os.path.dirname(path) == str(here) and (
                os.path.basename(path) in committed):
            assert how == drawn[path], path
    assert {os.path.basename(p) for p in runs} >= committed - {
        'study-mlp-bn.png'}


def _legend(axes):
    legend = axes.get_legend()
    return {t.get_text(): h for t, h in zip(legend.get_texts(),
                                            legend.legend_handles)}


def test_cell_summary_of_a_cell_some_of_whose_seeds_reached_it(study):
    records = [{'trial': 0, 'steps_to_target': 40, 'best_validation': 0.98,
                'flags': {}}]
    done = [{'steps_to_target': s, 'best_validation': v}
            for s, v in ((47, 0.982), (None, 0.979), (None, 0.978))]
    steps, accuracy, complete, label, some = study.cell_summary(
        records, done, 1, 3)
    assert (steps, complete, label, some) == (
        None, True, '1/3 seeds reached it', [47])
    assert accuracy == pytest.approx(0.979666, abs=1e-6)
    for r in done:
        r['steps_to_target'] = r['steps_to_target'] or 50
    assert study.cell_summary(records, done, 1, 3)[3:] == (None, [])


def test_a_cell_some_of_whose_seeds_reached_it_has_a_mark_of_its_own(
        study, readme_figures):
    """LAMB at 16384 in study-adam-lamb.png: 1 of its 3 reruns reached
    98 % (47 steps). It was drawn as the triangle whose legend says "none
    reached it", its seed's steps not at all; now that seed's steps have
    a marker of their own, labelled 1/3, with a legend entry that says
    so."""
    figure, _ = readme_figures['study-adam-lamb.png']
    left = figure.axes[0]
    legend = _legend(left)
    partly = legend['k/3 seeds reached it: the steps of each that did']
    marker = partly.get_marker()
    assert marker not in ('v', 'D', 'o', 's', 'x')
    lamb = matplotlib_color(study.STYLES['lamb']['color'])
    # At LAMB's place beside 16384 (``DODGE``): twice its 8192's.
    x = 2 * [line.get_xdata()[0] for line in left.get_lines()
             if line.get_marker() == 's' and len(line.get_xdata()) == 1
             and matplotlib_color(line.get_color()) == lamb][0]
    assert 16384 < x < 16384 * 2 ** study.DODGE
    drawn = [line for line in left.get_lines()
             if line.get_marker() == marker]
    assert [(list(line.get_xdata()), list(line.get_ydata()),
             matplotlib_color(line.get_color())) for line in drawn] == [
        ([x], [47], lamb)]
    # No triangle of "none reached it" at that cell.
    assert not [line for line in left.get_lines()
                if line.get_marker() == 'v'
                and matplotlib_color(line.get_color()) == lamb]
    labels = [(t.get_text(), t.xy) for t in left.texts]
    assert ('1/3 seeds reached it', (x, 47)) in labels
    # The other committed figures have no such cell: no such entry.
    for name in ('study.png', 'study-mlp-bn.png'):
        assert not [t for t in _legend(readme_figures[name][0].axes[0])
                    if 'seeds reached it' in t], name


def matplotlib_color(color):
    import matplotlib.colors
    return matplotlib.colors.to_hex(color)


@pytest.mark.parametrize('name', ['study.png', 'study-mlp-bn.png'])
def test_the_budget_sweep_s_legend_says_what_each_panel_draws(
        readme_figures, name):
    """The hollow diamonds of the right panel are the best validation
    accuracy of any run of the sweep (seed 0), beside the reruns' means;
    the legend called them "fewest steps"."""
    figure, _ = readme_figures[name]
    left, right = figure.axes
    assert [line for line in right.get_lines() if line.get_marker() == 'D']
    labels = [t for t, h in _legend(left).items() if h.get_marker() == 'D']
    assert len(labels) == 1
    assert 'fewest steps (left)' in labels[0], labels
    assert 'best validation of any run (right)' in labels[0], labels
    assert '(seed 0)' in labels[0], labels


@pytest.mark.parametrize('name, labels', [
    ('study.png', ['50', '100', '200']),
    ('study-mlp-bn.png', ['40', '50', '60', '100', '200', '300']),
    ('study-adam-lamb.png', ['50', '60']),
    ('study-pretuned.png', ['50', '60'])])
def test_the_step_axis_is_labelled_where_a_reader_needs_it(
        readme_figures, name, labels):
    """study.png's log-scale step axis read 10 and 100 only; the axis of
    less than a decade keeps matplotlib's labels, plain numbers. (The axes
    reached down to 5 steps, for the perfect-scaling line alone.)
    Matplotlib 3.11 labels more of study.png's minor ticks than 3.9 (60,
    300 and 400 too): the labels named here are those of both."""
    figure, _ = readme_figures[name]
    axis = figure.axes[0].yaxis
    drawn = sorted(tick_labels(figure, axis), key=float)
    assert set(labels) <= set(drawn), drawn
    assert all(re.fullmatch('[1-9][0-9]*', label) for label in drawn), drawn


def _markers(figure, axes):
    """``(series, x, y)`` in pixels of each marker drawn in the data of
    ``axes``, the series its colour and marker (a point is drawn on its
    line and again, filled or hollow, on its own)."""
    figure.canvas.draw()
    return [((matplotlib_color(line.get_color()), line.get_marker()), x, y)
            for line in axes.get_lines()
            if line.get_marker() not in (None, 'None', '')
            and line.get_transform() is axes.transData
            for x, y in line.get_transform().transform(line.get_xydata())]


def _steps_drawn(axes):
    """The steps of each marker drawn in the data of the step axis."""
    return [v for line in axes.get_lines()
            if line.get_marker() not in (None, 'None', '')
            and line.get_transform() is axes.transData
            for v in line.get_ydata()]


@pytest.mark.parametrize('name', ['study.png', 'study-mlp-bn.png',
                                  'study-adam-lamb.png',
                                  'study-pretuned.png'])
def test_the_perfect_scaling_line_stays_among_the_points(study,
                                                         readme_figures,
                                                         name):
    """It ran on to the largest batch size, down to 5 steps in study.png,
    stretching the log axis to 5-600 and squeezing the points into its
    top third. It ends at the fewest steps drawn, or, where the points
    span less than ``STEP_SPAN`` (study-adam-lamb.png,
    study-pretuned.png), at the bottom of the axis, which spans that."""
    figure, _ = readme_figures[name]
    left = figure.axes[0]
    scaling = [line for line in left.get_lines()
               if line.get_label() == 'perfect scaling']
    assert len(scaling) == 1
    points = [y for line, _, y in _markers(figure, left)]
    line = left.transData.transform(scaling[0].get_xydata())
    low, high = left.bbox.y0, left.bbox.y1
    steps = _steps_drawn(left)
    if max(steps) / min(steps) >= study.STEP_SPAN:
        assert min(y for _, y in line) >= min(points) - 0.5
        # The points fill the axis, less the room for the top edge's marks.
        assert (max(points) - min(points)) / (high - low) > 0.7
    else:
        # Within the axis, to its bottom or to the largest batch size
        # (shifted as its first point is from its own).
        assert min(y for _, y in line) >= low - 0.5
        x = scaling[0].get_xdata()
        sizes = left.get_xticks()
        shift = x[0] / min(sizes, key=lambda b: abs(math.log(x[0] / b)))
        assert min(y for _, y in line) <= low + 0.5 or (
            x[-1] == pytest.approx(max(sizes) * shift))


def test_points_a_few_per_cent_apart_look_a_few_per_cent_apart(
        study, readme_figures):
    """study-pretuned.png: LARS's reruns took 58 steps at 8192 and 57.33
    at 16384, and the step axis ran from 57.3 to 58 (ticks 57.3, 57.4,
    ..., 58): a difference of 1 % filled it, drawn as a steep fall, and
    the perfect-scaling line was a stub of 1 %. The axis spans at least
    ``STEP_SPAN``, centred (on the log scale) on the points, and the line
    runs from LARS at 8192 to half its steps at 16384."""
    figure, _ = readme_figures['study-pretuned.png']
    left = figure.axes[0]
    steps = _steps_drawn(left)
    assert 1 < max(steps) / min(steps) < 1.02, steps
    low, high = left.get_ylim()
    assert high / low >= study.STEP_SPAN * (1 - 1e-9)
    assert math.sqrt(low * high) == pytest.approx(
        math.sqrt(min(steps) * max(steps)))
    # The points in the middle fifth of the axis, not at its two ends.
    figure.canvas.draw()
    pixels = [y for _, _, y in _markers(figure, left)]
    bottom, top = left.bbox.y0, left.bbox.y1
    assert 0.4 < (min(pixels) - bottom) / (top - bottom)
    assert (max(pixels) - bottom) / (top - bottom) < 0.6
    line, = [line for line in left.get_lines()
             if line.get_label() == 'perfect scaling']
    x, y = line.get_xdata(), line.get_ydata()
    assert x[-1] / x[0] == pytest.approx(2)
    assert y[0] == pytest.approx(max(steps))
    assert y[-1] == pytest.approx(max(steps) / 2)


@pytest.mark.parametrize('name', ['study.png', 'study-mlp-bn.png',
                                  'study-adam-lamb.png',
                                  'study-pretuned.png'])
def test_no_marker_hides_another(readme_figures, name):
    """At 8192 and 16384 LARS's square, the defaults' cross and the
    budget sweep's diamond were drawn at one x and a few steps apart: the
    defaults could not be read. Each series has its place beside its
    batch size (``DODGE``)."""
    figure, _ = readme_figures[name]
    for axes in figure.axes:
        found = _markers(figure, axes)
        for i, (series, x, y) in enumerate(found):
            for other, u, v in found[i + 1:]:
                if other != series:
                    assert max(abs(x - u), abs(y - v)) > 6, (
                        name, series, other, x, y)


@pytest.mark.parametrize('name', ['study.png', 'study-mlp-bn.png'])
def test_the_budget_labels_cross_no_line(readme_figures, name):
    """'136, 4x' in study-mlp-bn.png was struck through by its dashed
    line, and '126, 2x' in study.png touched it."""
    from matplotlib.path import Path
    figure, _ = readme_figures[name]
    left = figure.axes[0]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    labels = [t for t in left.texts if re.match(r'\d+, [\d.]+x$',
                                                t.get_text())]
    assert labels
    for text in labels:
        box = text.get_window_extent(renderer)
        for line in left.get_lines():
            points = line.get_transform().transform(line.get_xydata())
            if line.get_linestyle() not in ('None', '') and len(points) > 1:
                assert not Path(points).intersects_bbox(box, filled=False), (
                    name, text.get_text(), line.get_label())
        assert left.bbox.contains(box.x0, box.y0)
        assert left.bbox.contains(box.x1, box.y1)


@pytest.mark.parametrize('name', ['study-mlp-bn-fair-x1.png',
                                  'study-mlp-bn-fair-x2.png'])
def test_the_fair_figure_s_legends_cover_no_curve(readme_figures, name):
    """At 2x the reruns' legend, lower right, covered LAMB's curves near
    steps 45-55."""
    figure, _ = readme_figures[name]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    checked = 0
    for axes in figure.axes:
        legend = axes.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for line in axes.get_lines():
            points = line.get_transform().transform(line.get_xydata())
            inside = [p for p in points if axes.bbox.contains(*p)
                      and box.contains(*p)]
            assert not inside, (name, axes.get_title(), line.get_label())
            checked += 1
    assert checked
