"""The trainers with --dtype float16 and mixed16, end to end on conftest.py's
tiny datasets: they train, log and draw the loss scale, resume exactly, and
refuse a resume in another precision or with another loss scale.
"""

import argparse
import importlib
import os
import re
import time

import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

from examples import recipe

from tests import mpi_util
from tests import test_examples
from tests.test_examples import usage_error


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
def cifar():
    return importlib.import_module('examples.cifar.train_cifar')


@pytest.fixture(scope='module')
def chainermn_example():
    return importlib.import_module('examples.chainermn.mnist.train_mnist')


def check_precision(out, dtypes):
    """The last snapshot's arrays have the dtypes ``dtypes`` gives
    (suffix -> dtype); the log has the loss scale and the skipped updates,
    and the plot of them is drawn."""
    log = test_examples.read_log(out)
    for entry in log:
        assert entry['loss_scale'] > 0 and entry['skipped_updates'] >= 0
    assert os.path.isfile(os.path.join(out, 'loss_scale.png'))
    name = max((n for n in os.listdir(out) if n.startswith('snapshot_')),
               key=lambda n: int(n.rsplit('_', 1)[1]))
    with numpy.load(os.path.join(out, name)) as npz:
        for suffix, dtype in dtypes.items():
            keys = [k for k in npz.files
                    if k.startswith('updater/model:main/') and
                    k.endswith(suffix)]
            assert keys, suffix
            for key in keys:
                assert npz[key].dtype == dtype, key
        # The float32 master copies are saved: by LARS, or by
        # LossScaleState for Chainer's MomentumSGD.
        assert any(k.endswith('/fp32_param') for k in npz.files)
        assert ('updater/optimizer:main/loss_scale' in npz.files
                or 'extensions/LossScaleState/loss_scale' in npz.files)
    return log


@pytest.mark.parametrize('dtype,optimizer,scale', [
    ('mixed16', 'lars', None),
    ('mixed16', 'momentum-lars', None),
    ('float16', 'lars', '128'),
    ('float16', 'momentum-lars', '128'),
    ('mixed16', 'momentum', None),
    ('mixed16', 'lamb', None),
    ('float16', 'lamb', '128'),
    ('mixed16', 'adam', None),
])
def test_mnist_in_16_bits_runs_and_resumes_exactly(
        mnist, dataset_root, tmp_path, dtype, optimizer, scale):
    args = ['--dataset-root', dataset_root, '--optimizer', optimizer,
            '--batchsize', '32', '--unit', '32', '--warmup-epochs', '1',
            '--dtype', dtype] + (['--loss-scale', scale] if scale else [])
    lars_key = None if optimizer in ('momentum', 'adam') else (
        'lars/ratio/predictor/l1/W')
    test_examples.check_run_and_resume(mnist.main, args, tmp_path, 64 // 32,
                                       lars_key)
    log = check_precision(str(tmp_path / 'first'),
                          {'/W': numpy.float16, '/b': numpy.float16})
    if scale:
        assert [e['loss_scale'] for e in log] == [128.0] * 4
    else:
        # Dynamic: doubled after each update (2 an epoch), none skipped.
        assert [e['loss_scale'] for e in log] == [1.0, 4.0, 16.0, 64.0]
    assert [e['skipped_updates'] for e in log] == [0] * 4


def test_batchnorm_stays_float32_in_mixed16():
    """The recipe on a convolution with BatchNorm, as in the CIFAR ResNet
    (whose float16 backward takes NumPy half a minute a batch): float16
    weights with float32 master copies, float32 BatchNorm parameters
    updated as they are, for each optimizer."""
    x = numpy.random.RandomState(0).randn(8, 3, 6, 6)
    t = numpy.arange(8, dtype=numpy.int32) % 2
    for optimizer in ('lars', 'momentum-lars', 'momentum'):
        with chainer.using_config('dtype', chainer.mixed16):
            model = L.Classifier(chainer.Sequential(
                L.Convolution2D(3, 4, 3), L.BatchNormalization(4), F.relu,
                L.Linear(64, 2)))
            args = argparse.Namespace(
                optimizer=optimizer, nesterov=False, lr=0.1,
                momentum=0.9, weight_decay=1e-4, trust_coefficient=0.02,
                dtype='mixed16', loss_scale=None)
            opt, _ = recipe.make_optimizer(args, model)
            for _ in range(3):
                opt.update(model, x.astype(numpy.float16), t)
        params = dict(model.namedparams())
        for path, param in params.items():
            float16 = path.endswith(('/W', '/b'))
            assert param.dtype == (numpy.float16 if float16
                                   else numpy.float32), path
            master = param.update_rule._fp32_param
            assert (master is not None) == float16, path
            assert numpy.isfinite(param.array).all(), path
        assert opt._loss_scale == 8.0 and opt._loss_scaling_is_dynamic
        # BatchNorm's parameters moved.
        gamma, = [p for path, p in params.items() if path.endswith('gamma')]
        assert (gamma.array != 1).any()


@pytest.fixture
def mixed16_snapshot(mnist, dataset_root, tmp_path_factory):
    args = ['-b', '32', '-u', '8', '--noplot', '--warmup-epochs', '1', '-e',
            '2', '--dtype', 'mixed16']
    out = tmp_path_factory.mktemp('run')
    mnist.main(args + ['--out', str(out), '--snapshots', '2'])
    return str(out / 'snapshot_iter_2'), args


@pytest.mark.parametrize('flags,message', [
    (['--dtype', 'float32'], 'the precision (chainer.config.dtype, --dtype) '
     'mixed16, this run has float32'),
    (['--dtype', 'float16'], 'mixed16, this run has float16'),
    (['--loss-scale', '128'],
     'written with --loss-scale dynamic, this run has 128.0'),
])
def test_resume_refuses_another_precision(
        mnist, mixed16_snapshot, tmp_path, capsys, flags, message):
    snapshot, args = mixed16_snapshot
    out = tmp_path / 'resumed'
    err = usage_error(mnist.main, args + flags + [
        '--resume', snapshot, '--out', str(out)], capsys)
    assert len(err.splitlines()) == 1, err
    assert message in err and 'start a new run' in err, err
    assert not out.exists()


def test_float32_snapshot_of_the_previous_version_resumes(
        mnist, dataset_root, tmp_path, capsys):
    """A snapshot that records no --loss-scale (the version before it) is
    one of a float32 run without loss scaling; refused in mixed16 by the
    precision, not as another trainer's."""
    args = ['-b', '32', '-u', '8', '--noplot', '--warmup-epochs', '1', '-e',
            '2']
    first = tmp_path / 'first'
    mnist.main(args + ['--out', str(first), '--snapshots', '2'])
    key = 'extensions/RunSettings/loss_scale'
    with numpy.load(str(first / 'snapshot_iter_2')) as npz:
        assert str(npz[key]) == 'none'
        arrays = {k: npz[k] for k in npz.files if k != key}
    old = str(tmp_path / 'old.npz')
    numpy.savez_compressed(old, **arrays)
    resumed = tmp_path / 'resumed'
    mnist.main(args + ['--out', str(resumed), '--resume', old])
    assert (test_examples.without_time(test_examples.read_log(resumed))
            == test_examples.without_time(test_examples.read_log(first)))
    err = usage_error(mnist.main, args + ['--resume', old, '--dtype',
                                          'mixed16'], capsys)
    assert 'float32, this run has mixed16' in err


@pytest.mark.parametrize('flags,message', [
    (['--loss-scale', '128'], '--loss-scale 128: loss scaling is for '
     '--dtype float16 and mixed16, not float32'),
    (['--dtype', 'mixed16', '--loss-scale', '0'],
     '--loss-scale must be positive and finite, got 0.0'),
    # Beyond float16's largest number: NaN from the first update on.
    (['--dtype', 'float16', '--loss-scale', '70000'],
     '--loss-scale 70000: --dtype float16 scales the loss in float16, which '
     'holds 6.104e-05 to 65504 (its normal numbers)'),
    (['--dtype', 'mixed16', '--loss-scale', '1e6'],
     '--loss-scale 1e+06: --dtype mixed16 scales the loss in float16'),
    # Rounded to 0 in float16: no update at all; a subnormal: few digits.
    (['--dtype', 'float16', '--loss-scale', '1e-30'],
     '--loss-scale 1e-30: --dtype float16'),
    (['--dtype', 'float16', '--loss-scale', '6e-5'],
     '--loss-scale 6e-05: --dtype float16'),
    (['--dtype', 'float64'], "invalid choice: 'float64'"),
])
@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn_example'])
def test_bad_precision_flags_are_usage_errors(request, capsys, tmp_path,
                                              name, flags, message):
    """Before the data is loaded: the dataset root is empty, and a flag
    let through stops the run there instead (a usage error's status is
    2, a missing dataset's 1)."""
    main = request.getfixturevalue(name).main
    err = usage_error(main, flags + ['--out', str(tmp_path / 'out'),
                                     '--dataset-root', str(tmp_path)],
                      capsys)
    assert message in err, err
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('scale', ['6.104e-05', '1', '65504'])
def test_loss_scales_float16_holds_are_taken(mnist, scale):
    args = mnist.parse_args(['--dtype', 'float16', '--loss-scale', scale])
    assert args.loss_scale == float(scale)


@pytest.mark.mpi
def test_chainermn_in_mixed16_restores_the_loss_scale(dataset_root,
                                                      tmp_path):
    """2 ranks, each with its LossScaleState: the resumed run goes on from
    the snapshot's scale (not Chainer's 1)."""
    def run(out, *extra):
        result = mpi_util.run_mpi(2, [
            '-m', 'examples.chainermn.mnist.train_mnist', '--communicator',
            'naive', '--device', '-1', '--epoch', '2', '--batchsize', '8',
            '--unit', '16', '--warmup-epochs', '0.5', '--noplot',
            '--optimizer', 'momentum-lars', '--dtype', 'mixed16',
            '--snapshots', '2', '--out', str(out)] + list(extra),
            timeout=240)
        assert result.returncode == 0, result.stderr
        return test_examples.read_log(str(out))
    # 4 iterations an epoch; the first after a start or a resume only
    # broadcasts rank 0's weights (ChainerMN's optimizer, see its README),
    # the others double the scale.
    log = run(tmp_path / 'first')
    assert [e['loss_scale'] for e in log] == [1.0, 2.0 ** 3, 2.0 ** 7]
    resumed = run(tmp_path / 'resumed', '--resume',
                  str(tmp_path / 'first' / 'snapshot_iter_4'))
    assert [e['loss_scale'] for e in resumed] == [1.0, 2.0 ** 3, 2.0 ** 6]
    assert resumed[:2] == log[:2]
    assert numpy.isfinite(resumed[-1]['main/loss'])


def test_dtype_defaults_to_chainers(mnist, capsys):
    """Without --dtype, chainer.config.dtype's (CHAINER_DTYPE's), as in
    Chainer's ImageNet example; one these trainers do not run is refused."""
    with chainer.using_config('dtype', chainer.mixed16):
        assert mnist.parse_args([]).dtype == 'mixed16'
    assert mnist.parse_args([]).dtype == 'float32'
    with chainer.using_config('dtype', numpy.float64):
        err = usage_error(mnist.parse_args, [], capsys)
    assert ('--dtype: chainer.config.dtype (CHAINER_DTYPE) is float64; '
            'give --dtype float32, float16 or mixed16') in err


WARNING = ('warning: --dtype {} on the CPU is slow: NumPy has no fast '
           'float16 matrix product')


@pytest.mark.parametrize('dtype', ['float16', 'mixed16', 'float32'])
def test_16_bits_on_the_cpu_warn_at_start_up(mnist, dataset_root, tmp_path,
                                             capsys, dtype):
    """A float16 or mixed16 run on the CPU says at once, in one line
    before the banner, what it costs and what to do; and it shows every
    update in the progress bar, and a line while an update runs long."""
    mnist.main(['--dtype', dtype, '-b', '32', '-u', '8', '-e', '1',
                '--noplot', '--out', str(tmp_path / 'out')])
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines()
                if WARNING.format(dtype) in line]
    if dtype == 'float32':
        assert not warnings and 'warning: --dtype' not in err
        return
    assert len(warnings) == 1, err
    # (-u 8: no smaller model to suggest.)
    assert warnings[0].endswith('use a GPU (--device 0), or a small model '
                                'for a functional try')
    assert out.startswith('Device: @numpy')  # the banner after the warning


def test_help_says_what_16_bits_cost_on_the_cpu(mnist, capsys):
    with pytest.raises(SystemExit):
        mnist.parse_args(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert ('On the CPU, 16 bits are for a functional try: NumPy\'s float16 '
            'has no fast matrix product') in text
    assert 'use a GPU, or a small model (MNIST: -u 50)' in text


def test_a_slow_run_shows_it_is_alive(mnist, dataset_root, tmp_path,
                                      capsys, monkeypatch):
    """float16 on the CPU: every update on the progress bar, and a line
    every interval (10 s; 0.2 here) while an update runs longer."""
    from chainer.training import extensions
    from chainer.training import updaters
    from examples import training
    intervals = []
    bar = extensions.ProgressBar.__init__

    def record(self, *args, **kwargs):
        intervals.append(kwargs.get('update_interval'))
        bar(self, *args, **kwargs)

    monkeypatch.setattr(extensions.ProgressBar, '__init__', record)
    monkeypatch.setattr(training.Heartbeat.__init__, '__defaults__', (0.2,))
    update = updaters.StandardUpdater.update_core

    def slow(self):
        update(self)
        if self.iteration == 1:
            time.sleep(0.7)

    monkeypatch.setattr(updaters.StandardUpdater, 'update_core', slow)
    mnist.main(['--dtype', 'float16', '-b', '32', '-u', '8', '-e', '1',
                '--noplot', '--progress', 'bar',
                '--out', str(tmp_path / 'out')])
    assert intervals == [1]
    beats = [line for line in capsys.readouterr().out.splitlines()
             if 'still computing (float16 on the CPU' in line]
    # (after the progress bar's escape codes)
    assert beats and all(re.search(r'  \.\.\. \d+ s since update \d+ of '
                                   'the run', line) for line in beats)


@pytest.mark.parametrize('name,small', [
    ('examples.cifar.train_cifar', 'CIFAR: --depth 8'),
    ('examples.chainermn.mnist.train_mnist',
     'MNIST: -u 50; CIFAR: --depth 8'),
])
def test_help_and_warning_name_the_trainer_s_small_model(
        capsys, name, small):
    """The CIFAR trainer has no -u: its help and warning said
    "(MNIST: -u 50)" and named no small model of its own."""
    trainer = importlib.import_module(name)
    with pytest.raises(SystemExit):
        trainer.parse_args(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert 'use a GPU, or a small model ({})'.format(small) in text
    if 'chainermn' in name:
        return
    from examples import cli
    cli.warn_of_slow_precision(trainer.parse_args(['--dtype', 'float16']))
    assert capsys.readouterr().err.rstrip().endswith(
        'or a small model for a functional try (--depth 8)')
    # A run of the small model already is not told to use it.
    cli.warn_of_slow_precision(trainer.parse_args(['--dtype', 'float16',
                                                   '--depth', '8']))
    assert capsys.readouterr().err.rstrip().endswith('functional try')


@pytest.mark.parametrize('unit,suggested', [(1000, True), (51, True),
                                            (50, False), (20, False)])
def test_the_warning_suggests_a_smaller_mlp_only_to_a_larger_one(
        capsys, unit, suggested):
    from examples import cli
    from examples.mnist import train_mnist
    cli.warn_of_slow_precision(train_mnist.parse_args(
        ['--dtype', 'float16', '-u', str(unit)], paths=False))
    assert capsys.readouterr().err.rstrip().endswith(
        'functional try' + ' (-u 50)' * suggested)
