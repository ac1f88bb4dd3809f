"""End-to-end: the ChainerMN example on 2 ranks, on tiny generated data.

Runs the real script under ``mpiexec -n 2`` for two short epochs on
conftest.py's tiny MNIST (64 training images, so 32 a rank) and CIFAR (32,
so 16 a rank), checks the log and the snapshots rank 0 writes, then resumes
from the first snapshot on 2 ranks.

"""

import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import time

import numpy
import pytest

import chainer

from tests import mpi_util


pytestmark = [pytest.mark.mpi, pytest.mark.example]

MODULE = 'examples.chainermn.mnist.train_mnist'
BATCH_PER_RANK = 8
RANKS = 2
ITERS_PER_EPOCH = 64 // RANKS // BATCH_PER_RANK


def example_args(out, *extra):
    """The example's flags for a short run on the tiny data, into
    ``out``, then ``extra`` (a later flag wins); a small MLP for MNIST
    (--unit is refused for CIFAR's ResNet)."""
    dataset = extra[extra.index('--dataset') + 1] if (
        '--dataset' in extra) else 'mnist'
    return ['--communicator', 'naive', '--device', '-1', '--epoch', '2',
            '--batchsize', str(BATCH_PER_RANK), '--warmup-epochs', '0.5',
            '--noplot', '--out', str(out)] + (
                ['--unit', '16'] if dataset == 'mnist' else []) + list(extra)


# A download, if the loader tries one, fails at once and never leaves
# the machine: the proxy is a closed local port.
PROXIES = dict({name: 'http://127.0.0.1:9' for name in (
    'http_proxy', 'https_proxy', 'HTTP_PROXY', 'HTTPS_PROXY')},
    no_proxy='', NO_PROXY='')


def run_example(out, *extra, ranks=RANKS):
    return mpi_util.run_mpi(ranks, ['-m', MODULE] + example_args(out, *extra),
                            timeout=240, env=PROXIES)


def read_log(out):
    with open(str(out / 'log')) as f:
        return json.load(f)


@pytest.mark.parametrize('optimizer', ['lars', 'momentum-lars'])
def test_example_trains_logs_and_resumes(optimizer, dataset_root, tmp_path):
    out = tmp_path / 'result'
    result = run_example(out, '--optimizer', optimizer, '--snapshots', '2')
    assert result.returncode == 0
    assert 'Number of processes: {}'.format(RANKS) in result.stdout
    # Rank 0 alone prints the report (its header once).
    assert result.stdout.count('test/main/accuracy') == 1
    assert 'warning: this run' not in result.stderr  # 8 iterations
    assert '# Minibatch-size: {} per process, {} global'.format(
        BATCH_PER_RANK, BATCH_PER_RANK * RANKS) in result.stdout

    log = read_log(out)
    # An entry before training (the evaluation of the initial weights),
    # then one per epoch.
    assert [e['epoch'] for e in log] == [0, 1, 2]
    assert [e['iteration'] for e in log] == [
        0, ITERS_PER_EPOCH, 2 * ITERS_PER_EPOCH]
    for entry in log[1:]:
        for key in ('main/loss', 'main/accuracy', 'test/main/loss',
                    'test/main/accuracy', 'lr',
                    'lars/ratio/predictor/l1/W', 'lars/g_norm/predictor/l3/W'):
            assert math.isfinite(entry[key]), (key, entry)
    # The peak rate follows the global batch (the single-process rule);
    # warm-up, then decay towards 0.
    peak = 0.005 * math.sqrt(BATCH_PER_RANK * RANKS / 256) / 0.02
    assert '# optimizer: {}, lr {:g},'.format(optimizer, peak) in (
        result.stdout)
    assert 0 < log[-1]['lr'] < log[1]['lr'] <= peak

    # One snapshot per epoch, by rank 0 alone.
    snapshots = ['snapshot_iter_{}'.format(ITERS_PER_EPOCH),
                 'snapshot_iter_{}'.format(2 * ITERS_PER_EPOCH)]
    assert sorted(p.name for p in out.iterdir()
                  if p.name.startswith('snapshot_')) == sorted(snapshots)
    with numpy.load(str(out / snapshots[-1])) as snapshot:
        assert snapshot['updater/iteration'] == 2 * ITERS_PER_EPOCH
        weights = snapshot['updater/model:main/predictor/l1/W']
        assert weights.shape == (16, 784)
        assert numpy.isfinite(weights).all()
        assert snapshot['extensions/RunSettings/processes'] == RANKS
        if optimizer == 'lars':
            # The momentum buffer of the LARS rule is saved.
            assert snapshot[
                'updater/optimizer:main/predictor/l1/W/v'].shape == (16, 784)

    if optimizer != 'lars':
        return
    # Every rank reads rank 0's snapshot and training continues from it.
    resumed = tmp_path / 'resumed'
    result = run_example(resumed, '--optimizer', optimizer,
                         '--resume', str(out / snapshots[0]))
    assert result.returncode == 0
    assert [e['iteration'] for e in read_log(resumed)] == [
        0, ITERS_PER_EPOCH, 2 * ITERS_PER_EPOCH]
    # Only the latest snapshot is kept by default.
    assert [p.name for p in resumed.iterdir()
            if p.name.startswith('snapshot_')] == snapshots[-1:]

    # Another number of processes is another global batch, and so another
    # schedule: every rank finds it, and rank 0 says it, once.
    result = run_example(tmp_path / 'three', '--optimizer', optimizer,
                         '--resume', str(out / snapshots[0]), ranks=3)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if 'error:' in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('train_mnist.py: error: --resume ')
    assert 'the number of processes {}, this run has 3'.format(RANKS) in (
        lines[0])
    assert not (tmp_path / 'three').exists()

    # Another optimizer or seed: refused on every rank, in one line said
    # by rank 0, naming the flag and both values.
    for flags, message in (
            (['--optimizer', 'momentum-lars'],
             'written with --optimizer lars, this run has momentum-lars'),
            (['--optimizer', optimizer, '--seed', '3'],
             'written with --seed 0, this run has 3')):
        result = run_example(tmp_path / 'other', *flags,
                             '--resume', str(out / snapshots[0]))
        assert result.returncode == 2
        lines = [line for line in result.stderr.splitlines()
                 if 'error: --resume' in line]
        assert len(lines) == 1 and message in lines[0], result.stderr
        assert 'Traceback' not in result.stderr
        assert not (tmp_path / 'other').exists()

    # A snapshot without a momentum buffer (another version's): refused on
    # every rank, naming the entry (once), before any training.
    with numpy.load(str(out / snapshots[0])) as npz:
        arrays = {key: npz[key] for key in npz.files}
    entry, = [k for k in arrays if k.endswith('predictor/l1/W/v')]
    del arrays[entry]
    numpy.savez_compressed(str(tmp_path / 'damaged.npz'), **arrays)
    result = run_example(tmp_path / 'other', '--optimizer', optimizer,
                         '--resume', str(tmp_path / 'damaged.npz'))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines()
             if 'error: --resume' in line]
    assert len(lines) == 1 and entry in lines[0], result.stderr
    assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('ranks,flags,message', [
    (RANKS, ['--batchsize', '33'], '--batchsize 33 on 2 processes is a global '
     'batch of 66, larger than the training set (64 examples)'),
    # 2 training images in 3 shards, padded to one each: a global batch
    # of 3 trained on 2 images (and a duplicate) before.
    (3, ['--batchsize', '1', '--validation', '62'], '--batchsize 1 on 3 '
     'processes is a global batch of 3, larger than the training set (2 '
     'examples, the rest held out by --validation 62)'),
])
def test_global_batch_larger_than_the_training_set_is_a_usage_error(
        dataset_root, tmp_path, ranks, flags, message):
    result = run_example(tmp_path / 'out', *flags, ranks=ranks)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if 'error:' in line]
    assert lines == ['train_mnist.py: error: ' + message], result.stderr
    assert not (tmp_path / 'out').exists()


def test_resnet_with_per_process_or_all_reduced_batchnorm(dataset_root,
                                                          tmp_path):
    """The CIFAR ResNet, its BatchNorm statistics per process or global.

    Both runs start from the same weights and batches; the first forward
    pass already normalizes rank 0's 8 images by their own statistics in
    one run and by those of all 16 in the other, so their training
    losses differ. Either way the log's test loss and accuracy are those
    of the model in the snapshot (per process, the running statistics
    averaged over the processes before each evaluation: each process's
    own gave another loss).
    """
    from examples import data
    from examples.cifar import train_cifar
    _, test = data.load_cifar('cifar10')
    x, t = chainer.dataset.concat_examples(test)
    training_losses, losses = {}, {}
    for batchnorm in ('per-process', 'all-reduced'):
        out = tmp_path / batchnorm
        result = run_example(out, '--dataset', 'cifar10', '--depth', '8',
                             '--epoch', '1', '--batchnorm', batchnorm)
        assert result.returncode == 0
        assert 'ResNet-8, BatchNorm statistics {}'.format(batchnorm) in (
            result.stdout)
        entry = read_log(out)[-1]
        for key in ('main/loss', 'test/main/accuracy',
                    'lars/ratio/predictor/res3/0/conv1/W'):
            assert math.isfinite(entry[key]), key
        training_losses[batchnorm] = entry['main/loss']
        losses[batchnorm] = entry['test/main/loss']
        snapshot = 'snapshot_iter_{}'.format(32 // RANKS // BATCH_PER_RANK)
        model = chainer.links.Classifier(train_cifar.ResNet(8, 10))
        with numpy.load(str(out / snapshot)) as arrays:
            chainer.serializers.NpzDeserializer(
                arrays, path='updater/model:main/').load(model)
        assert numpy.isfinite(model.predictor.bn1.avg_var).all()
        with chainer.using_config('train', False), \
                chainer.no_backprop_mode():
            loss = float(model(x, t).array)
        assert entry['test/main/loss'] == pytest.approx(loss, rel=1e-5)
        assert entry['test/main/accuracy'] == pytest.approx(
            float(model.accuracy.array), abs=1e-6)
    assert training_losses['per-process'] != pytest.approx(
        training_losses['all-reduced'], rel=1e-4)
    # ChainerMN's BatchNorm starts its running variance at 0 where
    # Chainer's starts at 1: the test loss after an epoch read 400 (and
    # 2e16 before the first update) against 3 per process.
    assert losses['all-reduced'] < 3 * losses['per-process'], losses


def test_a_run_of_one_iteration_is_said_to_train_nothing(dataset_root,
                                                         tmp_path):
    """ChainerMN's first update() copies rank 0's parameters and takes no
    step: a run of one iteration trains nothing, and logs no trust ratios
    (the single-process trainer's does), which rank 0 says, once."""
    out = tmp_path / 'out'
    # 32 training images a rank, a batch of 32: one iteration.
    result = run_example(out, '--epoch', '1', '--batchsize', '32')
    assert result.returncode == 0, result.stderr
    entry = read_log(out)[-1]
    assert entry['iteration'] == 1
    assert not [key for key in entry if key.startswith('lars/')], entry
    lines = [line for line in result.stderr.splitlines()
             if 'warning: this run' in line]
    assert lines == [
        "train_mnist.py: warning: this run has 1 iteration, which "
        "ChainerMN spends copying rank 0's parameters to every process "
        '(the first update of a start or a --resume takes no step): it '
        'trains nothing and logs no trust ratios; give a larger --epoch '
        'or a smaller --batchsize'], result.stderr


def test_a_snapshot_before_any_step_is_said_not_to_resume(dataset_root,
                                                          tmp_path):
    """One iteration an epoch: snapshot_iter_1 is written after ChainerMN's
    first update, which takes no step, so it holds no optimizer state.
    Rank 0 says so at the start, and --resume refuses it in one line that
    says why (LARS's own refusal spoke of SGD)."""
    out = tmp_path / 'out'
    # 32 training images a rank, a batch of 32: one iteration an epoch.
    result = run_example(out, '--epoch', '3', '--batchsize', '32',
                         '--snapshots', '3')
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines()
            if 'warning: one iteration an epoch' in line] == [
        "train_mnist.py: warning: one iteration an epoch, which ChainerMN "
        "spends in epoch 1 copying rank 0's parameters to every process "
        '(its first update takes no step): snapshot_iter_1 holds no '
        'optimizer state, and --resume refuses it (resume a later '
        'snapshot); give a smaller --batchsize for more iterations an '
        'epoch'], result.stderr
    snapshot = str(out / 'snapshot_iter_1')
    result = run_example(tmp_path / 'resumed', '--epoch', '3', '--batchsize',
                         '32', '--snapshots', '3', '--resume', snapshot)
    assert result.returncode == 2, result.stderr
    assert ('train_mnist.py: error: --resume {}: the snapshot was written at '
            "iteration 1, after ChainerMN's first update, which only copies "
            "rank 0's parameters and takes no step: it holds no optimizer "
            'state to resume ('.format(snapshot)) in result.stderr, \
        result.stderr
    assert 'resume a later snapshot, or start a new run' in result.stderr


def test_resnet_trains_on_one_image_a_process(dataset_root, tmp_path):
    """Per-process BatchNorm after each convolution normalises a process's
    one image over its pixels: no zeros (the trainer refused the run)."""
    out = tmp_path / 'out'
    # 32 training images, 30 held out: one image a rank, one iteration.
    result = run_example(out, '--dataset', 'cifar10', '--depth', '8',
                         '--epoch', '1', '--batchsize', '1',
                         '--validation', '30', '--test', 'never')
    assert result.returncode == 0, result.stderr
    # Chainer's warning, for a batch it normalises to zeros.
    assert 'zero tensor' not in result.stderr, result.stderr
    entry = read_log(out)[-1]
    assert entry['iteration'] == 1
    for key in ('main/loss', 'val/main/loss'):
        assert math.isfinite(entry[key]), key


@pytest.mark.parametrize('dataset,recorded', [
    ('mnist', {'depth': 8, 'batchnorm': 'all-reduced'}),
    ('cifar10', {'unit': 16}),
])
def test_a_snapshot_that_recorded_the_other_dataset_s_flags_resumes(
        dataset_root, tmp_path, dataset, recorded):
    """Runs before the refusal of the other dataset's flags recorded them
    (their defaults, or a value given and ignored): a resume does not
    compare them, and refused a run for a difference it never had."""
    out = tmp_path / 'first'
    flags = ['--dataset', dataset, '--epoch', '2', '--snapshots', '2']
    if dataset != 'mnist':
        flags += ['--depth', '8']
    result = run_example(out, *flags)
    assert result.returncode == 0, result.stderr
    snapshot = str(out / 'snapshot_iter_{}'.format(
        (64 if dataset == 'mnist' else 32) // RANKS // BATCH_PER_RANK))
    from tests.test_examples import _rerecord
    _rerecord(snapshot, **recorded)
    resumed = tmp_path / 'resumed'
    result = run_example(resumed, *flags + ['--resume', snapshot])
    assert result.returncode == 0, result.stderr
    assert read_log(resumed)[-1]['epoch'] == 2


def test_only_rank_0_makes_out(dataset_root, tmp_path):
    """Rank 0 alone writes --out: the other ranks, each in a folder of its
    own here as on another machine, make none (Chainer's trainer made an
    empty one), and leave no temporary folder; they resume from a
    snapshot as before."""
    first, second, scratch = (tmp_path / name for name in (
        'first', 'second', 'tmp'))
    for folder in (first, second, scratch):
        folder.mkdir()

    def run(*flags):
        process = mpi_util.start_mpi(
            [(1, first), (1, second)], ['-m', MODULE] + example_args(*flags),
            env=dict(PROXIES, PYTHONWARNINGS='ignore', TMPDIR=str(scratch)))
        stdout, stderr = process.communicate(timeout=240)
        assert process.returncode == 0, stderr
    run('result', '--snapshots', '2')
    snapshot = first / 'result' / 'snapshot_iter_{}'.format(ITERS_PER_EPOCH)
    assert snapshot.is_file()
    run('resumed', '--resume', str(snapshot))
    assert read_log(first / 'resumed')[-1]['epoch'] == 2
    assert list(second.iterdir()) == []
    assert list(scratch.iterdir()) == []


def test_the_test_set_is_evaluated_whole_on_any_number_of_processes(
        dataset_root, tmp_path):
    """On 3 processes, which do not divide the 32 test images, the log's
    test loss and accuracy are the model's on the whole test set, each
    image counted once (ChainerMN's evaluator averaged 3 shards of 11,
    one image counted twice)."""
    from examples import data
    from examples.mnist import train_mnist
    out = tmp_path / 'out'
    result = run_example(out, '--epoch', '1', ranks=3)
    assert result.returncode == 0
    entry = read_log(out)[-1]
    model = chainer.links.Classifier(train_mnist.MLP(784, 16, 10))
    snapshot, = [p for p in out.iterdir() if p.name.startswith('snapshot_')]
    with numpy.load(str(snapshot)) as npz:
        chainer.serializers.NpzDeserializer(
            npz, path='updater/model:main/').load(model)
    _, test = data.load_mnist()
    x, t = chainer.dataset.concat_examples(test)
    with chainer.using_config('train', False), chainer.no_backprop_mode():
        loss = float(model(x, t).array)
    assert entry['test/main/loss'] == pytest.approx(loss, rel=1e-5)
    assert entry['test/main/accuracy'] == pytest.approx(
        float(model.accuracy.array), abs=1e-6)


@pytest.mark.parametrize('flag,path,message', [
    ('--out', 'file', 'not a folder'),
    ('--dataset-root', 'nowhere', 'no such folder'),
])
def test_bad_paths_stop_every_rank_at_once(dataset_root, tmp_path, flag,
                                           path, message):
    """Rank 0 checks the paths it alone uses; every rank stops with it,
    and rank 0 says why, once.

    Before any data is loaded or any collective waits for rank 0.
    """
    (tmp_path / 'file').write_text('mine')
    path = str(tmp_path / path)
    out = tmp_path / 'out'
    result = run_example(out, flag, path) if flag != '--out' else (
        run_example(path))
    assert result.returncode == 2
    line, = [line for line in result.stderr.splitlines() if 'error:' in line]
    assert line == 'train_mnist.py: error: {} {}: {}'.format(
        flag, path, message), result.stderr
    assert 'Traceback' not in result.stderr
    assert not out.exists()
    assert (tmp_path / 'file').read_text() == 'mine'


@pytest.mark.parametrize('flag,value,message', [
    ('--validation', '64', '--validation 64 leaves no training images: the '
     'training set has 64'),
    ('--dataset-root', 'empty', 'MNIST is not cached'),
])
def test_what_rank0_finds_in_the_data_stops_every_rank(
        dataset_root, tmp_path, flag, value, message):
    """Rank 0 alone reads the dataset and holds out --validation; where it
    stops, it says why once and every rank exits with its status."""
    if value == 'empty':
        (tmp_path / 'empty').mkdir()
        value = str(tmp_path / 'empty')
    out = tmp_path / 'out'
    result = run_example(out, flag, value)
    assert result.returncode == (2 if flag == '--validation' else 1)
    assert result.stderr.count(message) == 1, result.stderr
    assert 'Traceback' not in result.stderr
    assert not out.exists()


def test_a_model_too_large_for_memory_is_a_usage_error(
        dataset_root, tmp_path):
    """Every rank stops, and rank 0 says why in one line naming --unit,
    not NumPy's traceback (10 ** 12 units: beyond any address space),
    from its estimated size, as the flags are checked."""
    out = tmp_path / 'result'
    result = run_example(out, '--unit', str(10 ** 12))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines()
             if 'error: --unit' in line]
    assert len(lines) == 1, result.stderr
    assert ('--unit 1000000000000: the model does not fit in memory: its '
            '1e+24 weights in float32 need about 1.2e+16 GB to be drawn and '
            'trained') in lines[0]
    assert 'Traceback' not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize('flags,message', [
    (['--gpu', '0'], 'error: unrecognized arguments: --gpu 0'),
    (['--communicator', 'flat'], "error: --communicator flat: only 'naive' "
     'runs on the CPU'),
    (['--batchsize', '0'], 'error: --batchsize must be a positive integer, '
     'got 0'),
    (['--help'], None),
    pytest.param(['--device', '0'], 'error: --device 0: ',
                 marks=pytest.mark.skipif(
                     chainer.backends.cuda.available,
                     reason='CuPy can use CUDA here')),
])
def test_what_every_rank_finds_alike_is_said_once(dataset_root, tmp_path,
                                                  flags, message):
    """A mistake in the flags (or a device that no machine has) is every
    process's: rank 0 says it, once, and every rank stops with its
    status (2; --help: 0, its text once)."""
    out = tmp_path / 'out'
    result = run_example(out, *flags, ranks=3)
    if message is None:
        assert result.returncode == 0
        assert result.stdout.count('usage: ') == 1, result.stdout
        assert result.stdout.count('--batchnorm {per-process,all-reduced}'
                                   ) == 2, result.stdout  # usage and help
        return
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if 'error:' in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('train_mnist.py: ' + message), result.stderr
    assert result.stderr.count('usage: ') == (
        0 if flags[0] == '--device' else 1), result.stderr
    assert 'Traceback' not in result.stderr
    assert not out.exists()


def test_what_one_machine_finds_is_said_by_its_ranks(dataset_root,
                                                     tmp_path):
    """A snapshot that one machine has and another lacks (a relative path
    in each rank's own folder, here): the rank that finds it missing says
    so, naming itself, and every rank stops rather than wait for it."""
    first, second = tmp_path / 'first', tmp_path / 'second'
    first.mkdir()
    second.mkdir()
    (first / 'snapshot_iter_4').write_text('a snapshot')
    process = mpi_util.start_mpi(
        [(1, first), (1, second)],
        ['-m', MODULE] + example_args(tmp_path / 'out', '--resume',
                                      'snapshot_iter_4'),
        env=dict(PROXIES, PYTHONWARNINGS='ignore'))
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 2, stderr
    lines = [line for line in stderr.splitlines() if 'error:' in line]
    assert lines == ['train_mnist.py: rank 1 of 2 (on {}): error: --resume '
                     'snapshot_iter_4: no such file'.format(
                         socket.gethostname())], stderr
    assert not (tmp_path / 'out').exists()


def test_a_validation_set_smaller_than_the_processes_is_a_usage_error(
        dataset_root, tmp_path):
    """Each process evaluates its share of the validation set: with fewer
    images than processes one share is empty, on which Chainer's iterator
    divides by zero (and the others waited in a collective)."""
    out = tmp_path / 'out'
    result = run_example(out, '--validation', '1')
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if 'error:' in line]
    assert lines == ['train_mnist.py: error: --validation 1: fewer images '
                     'than the 2 processes, each of which evaluates its '
                     'share of them: give at least 2'], result.stderr
    assert 'Traceback' not in result.stderr
    assert not out.exists()


# The example with rank 1's environment changed before Chainer's import,
# as another machine's may be; FAIL_IN_TRAINING makes rank 1 raise where
# training starts, as an error only one process meets would.
RANK_DRIVER = """import os, sys
rank = os.environ.get('OMPI_COMM_WORLD_RANK')
if os.environ.get('RANK{}_DTYPE'.format(rank)):
    os.environ['CHAINER_DTYPE'] = os.environ['RANK{}_DTYPE'.format(rank)]
from examples import training
from examples.chainermn.mnist import train_mnist
train = training.train
def failing(*args, **kwargs):
    if rank == '1' and os.environ.get('FAIL_IN_TRAINING'):
        raise RuntimeError('rank 1 fails alone')
    return train(*args, **kwargs)
training.train = failing
train_mnist.main(sys.argv[1:])
"""


def run_rank_driver(tmp_path, **env):
    """The example through RANK_DRIVER on RANKS ranks, into tmp_path/out,
    with ``env`` (RANK0_DTYPE, RANK1_DTYPE, FAIL_IN_TRAINING)."""
    driver = tmp_path / 'driver.py'
    driver.write_text(RANK_DRIVER)
    return mpi_util.run_mpi(
        RANKS, [str(driver)] + example_args(tmp_path / 'out'), timeout=240,
        env=dict(PROXIES, PYTHONWARNINGS='ignore', **env))


@pytest.mark.parametrize('rank,here,there,says', [
    (1, 'float16', 'float32', 'CHAINER_DTYPE=float16'),
    # Set on rank 0's machine only: rank 1's is unset, not to blame.
    (0, 'float32', 'float16', 'CHAINER_DTYPE unset here')])
def test_ranks_that_would_train_in_other_dtypes_stop(dataset_root, tmp_path,
                                                     rank, here, there, says):
    """--dtype defaults to CHAINER_DTYPE, which mpiexec passes to another
    machine only when asked (-x): a rank whose dtype is not rank 0's says
    so, naming itself and its variable, and every rank stops (they failed
    in the first update, and the others waited in a collective)."""
    result = run_rank_driver(tmp_path, **{
        'RANK{}_DTYPE'.format(rank): 'float16'})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if 'error:' in line]
    assert lines == ['driver.py: rank 1 of 2 (on {}): error: --dtype: this '
                     'process would train in {} ({}) and rank 0 in {}: give '
                     '--dtype, or pass the variable to every process '
                     '(mpiexec -x CHAINER_DTYPE)'.format(
                         socket.gethostname(), here, says, there)], \
        result.stderr
    assert not (tmp_path / 'out').exists()


def test_an_exception_on_one_rank_ends_the_job(dataset_root, tmp_path):
    """An error only one process meets, past the checks every process
    shares, ends the job with its traceback (ChainerMN's except hook:
    MPI_Abort) rather than leave the others in a collective (run_mpi's
    timeout fails a hang)."""
    result = run_rank_driver(tmp_path, FAIL_IN_TRAINING='1')
    assert result.returncode != 0
    assert 'RuntimeError: rank 1 fails alone' in result.stderr
    assert 'Uncaught exception on rank 1' in result.stderr


# The example, each update slowed down so that a run lasts long enough to
# be interrupted; the first update stalls (for 2 minutes, in Python) where
# STALL_FIRST_UPDATE names a file, which it makes first.
SLOW_DRIVER = """import os, sys, time
from chainer.training import updaters
from examples.chainermn.mnist import train_mnist
update = updaters.StandardUpdater.update_core
def slow(self):
    stall = os.environ.get('STALL_FIRST_UPDATE')
    if stall and self.iteration == 0:
        open(stall, 'w').close()
        time.sleep(120)
    update(self)
    time.sleep(0.05)
updaters.StandardUpdater.update_core = slow
train_mnist.main(sys.argv[1:])
"""


def interrupt(tmp_path, args, ready, env=None):
    """Starts the slowed example on RANKS ranks under mpiexec, sends
    mpiexec SIGINT (a terminal's Ctrl-C) once ``ready()`` holds, and
    returns its result. Open MPI sends each rank SIGTERM, then SIGKILL
    a second later."""
    driver = tmp_path / 'driver.py'
    driver.write_text(SLOW_DRIVER)
    process = mpi_util.start_mpi(
        RANKS, [str(driver)] + args,
        env=dict(PROXIES, PYTHONWARNINGS='ignore', **(env or {})))
    try:
        deadline = time.time() + 120
        while (time.time() < deadline and process.poll() is None
               and not ready()):
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        try:  # Open MPI ends the ranks within seconds; a loaded host, later
            stdout, stderr = process.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                'mpiexec ran on 180 s after SIGINT: {!r}'.format(
                    mpi_util._stop(process)))
    finally:
        if process.poll() is None:
            mpi_util._stop(process)
    # mpiexec's own (Open MPI 4.1's libevent), now and then, as the ranks
    # end while it forwards the signal: "[warn] Epoll MOD(1) on fd 23
    # failed. ... Bad file descriptor". Not the trainer's, which the tests
    # read.
    stderr = ''.join(line for line in stderr.splitlines(True)
                     if not line.startswith('[warn] Epoll '))
    return subprocess.CompletedProcess(process.args, process.returncode,
                                       stdout, stderr)


def test_ctrl_c_says_once_how_to_resume_and_the_command_resumes(
        dataset_root, tmp_path):
    """Ctrl-C to mpiexec: rank 0 says, in one line and at once (SIGKILL
    follows within a second), where the run stopped and the command that
    continues it, mpiexec's included; pasted, that command finishes the
    run."""
    out = tmp_path / 'out'
    args = example_args(out, '--epoch', '12', '--snapshots', '2')
    result = interrupt(tmp_path, args, ready=lambda: out.exists() and any(
        n.startswith('snapshot_iter_') for n in os.listdir(str(out))))
    assert result.returncode != 0
    assert 'Traceback' not in result.stderr
    line, = result.stderr.strip().splitlines()
    match = re.match(r'^driver\.py: interrupted at iteration (\d+) \(epoch '
                     r'([\d.]+) of 12\); to continue from (\S+), run: (.*)$',
                     line)
    assert match, line
    iteration, epoch, snapshot, command = match.groups()
    assert float(epoch) == int(iteration) / ITERS_PER_EPOCH, line
    assert os.path.isfile(snapshot)
    # Without dev.sh, the command starts the same number of processes.
    assert shlex.split(command) == (
        ['mpiexec', '-n', str(RANKS), shlex.split(command)[3],
         str(tmp_path / 'driver.py')] + args + ['--resume', snapshot])
    # Pasted (Open MPI's variables stand for the flags a root user and a
    # machine of one core would add).
    resumed = subprocess.run(
        shlex.split(command), cwd=str(tmp_path), env=mpi_util.mpi_env(dict(
            PROXIES, PYTHONWARNINGS='ignore', OMPI_ALLOW_RUN_AS_ROOT='1',
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1',
            OMPI_MCA_rmaps_base_oversubscribe='1')),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert read_log(out)[-1]['epoch'] == 12


def test_ctrl_c_before_the_first_update_keeps_the_overwritten_run(
        dataset_root, tmp_path):
    """--overwrite sets the old run aside until the new one's first
    update: Ctrl-C to mpiexec before then puts it back."""
    out = tmp_path / 'out'
    out.mkdir()
    for name in ('log', 'snapshot_iter_74', 'notes.txt'):
        (out / name).write_text(name)
    before = {p.name: p.read_text() for p in out.iterdir()}
    stalled = tmp_path / 'stalled'
    result = interrupt(tmp_path, example_args(out, '--overwrite'),
                       ready=stalled.exists,
                       env={'STALL_FIRST_UPDATE': str(stalled)})
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    line, = result.stderr.strip().splitlines()
    assert line.startswith('driver.py: interrupted at iteration 0 '), line
    assert line.endswith('run the command again with --overwrite to start '
                         'over'), line
    assert {p.name: p.read_text() for p in out.iterdir()} == before


@pytest.mark.parametrize('name', ['pure_nccl', 'non_cuda_aware', 'flat'])
def test_a_communicator_that_needs_nccl_is_refused_without_it(
        monkeypatch, capsys, name):
    """Where CuPy cannot load NCCL, pure_nccl and non_cuda_aware stop with
    one line naming the communicator (ChainerMN's refusal was a traceback
    from every process); flat needs none. No GPU here: the check alone."""
    from examples.chainermn.mnist import train_mnist
    args = train_mnist.parse_args(['--communicator', 'naive'])
    args.communicator = name  # (the CPU takes naive alone)
    monkeypatch.setattr(train_mnist.chainermn_nccl, '_available', False)
    if name == 'flat':
        train_mnist.check_nccl(args)
    else:
        with pytest.raises(SystemExit) as stopped:
            train_mnist.check_nccl(args)
        assert stopped.value.code == 2
        assert '--communicator {}: needs NCCL, which CuPy cannot load'.format(
            name) in capsys.readouterr().err
    monkeypatch.setattr(train_mnist.chainermn_nccl, '_available', True)
    train_mnist.check_nccl(args)


@pytest.mark.parametrize('seen,gpus', [
    ([['a', 'b', 'c']] * 3, [0, 1, 2]),      # each sees every GPU
    ([['a'], ['b'], ['c']], [0, 0, 0]),      # a scheduler's one GPU each
    ([['a'], ['a', 'b']], [0, 1]),           # the first took GPU 0
    ([['b', 'a'], ['a', 'b']], [0, 0]),      # another numbering
    ([['a', 'b'], ['a']], [1, 0]),           # the first gives 'a' up
    ([['a', 'b', 'c'], ['a', 'b'], ['a']], [2, 1, 0]),
])
def test_each_process_of_a_machine_takes_a_gpu_of_its_own(seen, gpus):
    """The GPUs that a machine's processes see are shared out one per
    process in the order of their ranks on it: where a scheduler shows
    each process its own GPU, as GPU 0 (CUDA_VISIBLE_DEVICES), each takes
    that one; where each sees them all, process r takes GPU r (the
    trainer took GPU r in every case, and stopped where r was not
    there). No GPU here: the choice alone, from the UUIDs."""
    from examples.chainermn.mnist import train_mnist
    assert [train_mnist.gpu_of(r, seen) for r in range(len(seen))] == gpus


@pytest.mark.parametrize('seen', [
    [['a'], ['a']],                 # two processes, one GPU
    [['a', 'b'], ['a', 'b'], ['b']],
    [['a'], ['a'], ['a', 'b', 'c']],  # three GPUs, two that sees one
])
def test_more_processes_than_gpus_is_a_usage_error(capsys, seen):
    """Every process stops alike (stop_together says it once)."""
    from examples.chainermn.mnist import train_mnist
    with pytest.raises(SystemExit) as stopped:
        train_mnist.gpu_of(0, seen)
    assert stopped.value.code == 2
    assert '{} processes on this machine, which see {} GPUs in all, ' \
        'cannot each take a GPU of its own: one process per GPU'.format(
            len(seen), len(set().union(*seen))) in capsys.readouterr().err
