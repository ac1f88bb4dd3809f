"""End-to-end: the ChainerMN MNIST example on 2 ranks, on tiny generated data.

Runs the real script under ``mpiexec -n 2`` for two short epochs on a tiny
MNIST cache written here, checks the log and the snapshots rank 0 writes,
then resumes from the first snapshot on 2 ranks.

"""

import json
import math
import os

import numpy
import pytest

from tests import mpi_util


SCRIPT = os.path.join(mpi_util.REPO_ROOT, 'examples', 'chainermn', 'mnist',
                      'train_mnist.py')
N_TRAIN, N_TEST = 120, 40
BATCH_PER_RANK = 10
RANKS = 2
ITERS_PER_EPOCH = N_TRAIN // RANKS // BATCH_PER_RANK


def write_tiny_mnist(root, seed=0):
    """Writes the cache ``chainer.datasets.get_mnist()`` reads, in little.

    Each digit class lights its own band of pixels, so the data can be
    learnt, but nothing here depends on how well.

    """
    rng = numpy.random.RandomState(seed)
    directory = os.path.join(str(root), 'pfnet', 'chainer', 'mnist')
    os.makedirs(directory)
    for name, n in (('train', N_TRAIN), ('test', N_TEST)):
        y = (numpy.arange(n) % 10).astype(numpy.uint8)
        x = rng.randint(0, 64, size=(n, 784)).astype(numpy.uint8)
        for label in range(10):
            x[y == label, label * 78:(label + 1) * 78] = 255
        numpy.savez_compressed(os.path.join(directory, name + '.npz'),
                               x=x, y=y)


def run_example(dataset_root, out, *extra):
    args = [SCRIPT, '--communicator', 'naive', '--device', '-1',
            '--epoch', '2', '--batchsize', str(BATCH_PER_RANK),
            '--unit', '16', '--warmup-epochs', '0.5', '--noplot',
            '--out', str(out)] + list(extra)
    return mpi_util.run_mpi(
        RANKS, args, timeout=240,
        env={'CHAINER_DATASET_ROOT': str(dataset_root)})


@pytest.mark.mpi
@pytest.mark.example
@pytest.mark.parametrize('optimizer', ['lars', 'momentum-lars'])
def test_example_trains_logs_and_resumes(optimizer, tmp_path):
    mpi_util.require_mpi()
    write_tiny_mnist(tmp_path / 'data')

    out = tmp_path / 'result'
    result = run_example(tmp_path / 'data', out, '--optimizer', optimizer)
    assert result.returncode == 0
    assert 'Number of processes: {}'.format(RANKS) in result.stdout
    # Rank 0 alone prints the report (its header once).
    assert result.stdout.count('validation/main/accuracy') == 1
    assert '# Minibatch-size: {} per process, {} global'.format(
        BATCH_PER_RANK, BATCH_PER_RANK * RANKS) in result.stdout

    with open(str(out / 'log')) as f:
        log = json.load(f)
    # An entry before training (the evaluation of the initial weights),
    # then one per epoch.
    assert [e['epoch'] for e in log] == [0, 1, 2]
    assert [e['iteration'] for e in log] == [
        0, ITERS_PER_EPOCH, 2 * ITERS_PER_EPOCH]
    for entry in log[1:]:
        for key in ('main/loss', 'main/accuracy', 'validation/main/loss',
                    'validation/main/accuracy', 'lr',
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
        if optimizer == 'lars':
            # The momentum buffer of the LARS rule is saved.
            assert snapshot[
                'updater/optimizer:main/predictor/l1/W/v'].shape == (16, 784)

    if optimizer != 'lars':
        return
    # Every rank reads rank 0's snapshot and training continues from it.
    resumed = tmp_path / 'resumed'
    result = run_example(tmp_path / 'data', resumed, '--optimizer', optimizer,
                         '--resume', str(out / snapshots[0]))
    assert result.returncode == 0
    with open(str(resumed / 'log')) as f:
        log = json.load(f)
    assert [e['iteration'] for e in log] == [
        0, ITERS_PER_EPOCH, 2 * ITERS_PER_EPOCH]
    assert (resumed / snapshots[-1]).exists()
