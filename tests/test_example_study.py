"""The validation split, the nesterov baseline, label smoothing and the
study tool (examples/mnist/study.py), on conftest.py's tiny MNIST (64
training and 32 test images).
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess

import numpy
import pytest

import chainer
import chainer.links as L

from examples import cli
from examples import data
from examples import recipe
from tests import conftest
from tests import mpi_util


pytestmark = pytest.mark.example


@pytest.fixture(scope='module')
def mnist():
    return importlib.import_module('examples.mnist.train_mnist')


@pytest.fixture(scope='module')
def study():
    return importlib.import_module('examples.mnist.study')


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
                                                tmp_path):
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
])
def test_bad_new_flags_are_usage_errors(mnist, tmp_path, capsys, flags,
                                        message):
    with pytest.raises(SystemExit) as exc:
        mnist.main(flags + ['--dataset-root', str(tmp_path),
                            '--out', str(tmp_path / 'out')])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / 'out').exists()


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
    try:
        assert study.main(argv) == 0
    finally:
        chainer.dataset.set_dataset_root(previous)
    return argparse.Namespace(argv=argv, out=out, runs=runs, root=root,
                              folder=folder)


def read_json(path):
    with open(str(path)) as f:
        return json.load(f)


def records(out):
    return {name[:-len('.json')]: read_json(os.path.join(str(out), name))
            for name in sorted(os.listdir(str(out)))}


def test_study_writes_one_json_per_trial_and_rerun(tiny_study):
    found = records(tiny_study.out)
    assert sorted(found) == sorted([
        'nesterov-b16-t0', 'nesterov-b16-t1', 'lars-b16-t0', 'lars-b16-t1',
        'nesterov-b16-best-s1', 'lars-b16-best-s1', 'defaults-b16'])
    # The trainer on its defaults, measured as the search trials are.
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

        record = read_json(path)
        record['best_validation'] += 0.01
        changed = tmp_path / 'changed.json'
        changed.write_text(json.dumps(record))
        assert study.main(argv + [str(changed)]) == 1
        assert 'best_validation: recorded {}'.format(
            record['best_validation']) in capsys.readouterr().out
    finally:
        chainer.dataset.set_dataset_root(previous)


def test_figure_from_partial_results(study, tiny_study, tmp_path):
    out = tmp_path / 'json'
    shutil.copytree(str(tiny_study.out), str(out))
    os.remove(str(out / 'nesterov-b16-t1.json'))
    figure = tmp_path / 'partial.png'
    assert study.main(['--out', str(out), '--batchsizes', '16', '--trials',
                       '2', '--seeds', '1', '--plot-only', '--figure',
                       str(figure)]) == 0
    assert figure.stat().st_size > 0


def test_round_two_centres_the_rate_on_round_one(study, tiny_study,
                                                 tmp_path, capsys):
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
            with pytest.raises(subprocess.CalledProcessError):
                study.run_command(cmd + ['--momentum', '2'],
                                  str(tmp_path / 'bad'), tiny_study.root,
                                  '-1', stdout)
    finally:
        chainer.dataset.set_dataset_root(previous)
    record = study.measure(log, 16, 48, 0.3)
    assert record['diverged'] is True
    assert record['final_loss'] is None
    assert record['steps_to_target'] is None
    json.dumps(record, allow_nan=False)
    for name, record in records(tiny_study.out).items():
        assert record['diverged'] is False, name


def test_the_committed_study_is_complete_and_in_the_readme(study, capsys):
    """The JSONs under examples/mnist/study/ hold every trial of every
    cell, the three seeded reruns of each cell's best and a run of the
    defaults per batch size; examples/mnist/README.md holds their tables
    (study.py --check)."""
    out = os.path.join(os.path.dirname(study.__file__), 'study')
    search, reruns = study.load(out)
    for batchsize in study.BATCHSIZES:
        for optimizer in study.DEFAULT_OPTIMIZERS:
            cell = batchsize, optimizer
            n = study.trials_of(batchsize, study.TRIALS, study.REFINED)
            assert sorted(r['trial'] for r in search[cell]) == list(
                range(n)), cell
            assert sorted(r['seed'] for r in reruns[cell]) == (
                study.SEEDS), cell
    assert sorted(study.load_defaults(out)) == study.BATCHSIZES
    assert study.main(['--check']) == 0, capsys.readouterr().out
