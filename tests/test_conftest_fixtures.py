"""The fixtures and markers of conftest.py do what they promise."""

import os
import shutil
import subprocess
import sys

import numpy
import pytest

import chainer
from chainer.backends import cuda


def test_tiny_mnist_loads_offline(tiny_dataset_root):
    assert chainer.dataset.get_dataset_root() == tiny_dataset_root
    train, test = chainer.datasets.get_mnist()
    assert (len(train), len(test)) == (256, 64)
    x, y = train[0]
    assert x.shape == (784,) and x.dtype == numpy.float32
    assert 0 <= x.min() and x.max() <= 1
    assert y.dtype == numpy.int32
    assert sorted(set(int(y) for _, y in test)) == list(range(10))


@pytest.mark.parametrize('get_cifar, n_classes', [
    (chainer.datasets.get_cifar10, 10),
    (chainer.datasets.get_cifar100, 100),
])
def test_tiny_cifar_loads_offline(tiny_dataset_root, get_cifar, n_classes):
    train, test = get_cifar()
    assert (len(train), len(test)) == (256, 64)
    x, _ = train[0]
    assert x.shape == (3, 32, 32) and x.dtype == numpy.float32
    labels = [int(y) for _, y in train]
    assert min(labels) == 0 and max(labels) == n_classes - 1


def test_tiny_mnist_is_learnable(tiny_dataset_root):
    train, test = chainer.datasets.get_mnist()
    train_x, train_y = train._datasets
    test_x, test_y = test._datasets
    means = numpy.stack([train_x[train_y == c].mean(axis=0)
                         for c in range(10)])
    distances = ((test_x[:, None, :] - means[None]) ** 2).sum(axis=2)
    assert (distances.argmin(axis=1) == test_y).mean() > 0.9


def test_dataset_root_reaches_subprocesses(tiny_dataset_root):
    code = ('import chainer; train, _ = chainer.datasets.get_mnist(); '
            'print(len(train))')
    out = subprocess.run([sys.executable, '-c', code], check=True,
                         capture_output=True, text=True).stdout
    assert out.split() == ['256']


@pytest.mark.mpi
def test_mpiexec_runs_more_ranks_than_cores(mpiexec):
    # Rank 0 prints for all: lines printed by several ranks can interleave.
    code = ('from mpi4py import MPI; c = MPI.COMM_WORLD; '
            'r = c.gather((c.rank, c.allreduce(1))); '
            'c.rank == 0 and print(r)')
    result = mpiexec(3, sys.executable, '-c', code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[(0, 3), (1, 3), (2, 3)]'


@pytest.mark.parametrize('require, returncode, outcome', [
    ('', 0, '1 skipped'),
    ('1', 1, '1 error'),
])
def test_missing_mpi_skips_unless_required(tmp_path, require, returncode,
                                           outcome):
    shutil.copy(os.path.join(os.path.dirname(__file__), 'conftest.py'),
                str(tmp_path))
    (tmp_path / 'pytest.ini').write_text('[pytest]\nmarkers = mpi\n')
    (tmp_path / 'test_inner.py').write_text(
        'import pytest\n\n\n@pytest.mark.mpi\ndef test_mpi():\n    pass\n')
    # A PATH without mpiexec on it.
    env = dict(os.environ, PATH=str(tmp_path),
               CHAINER_LARS_REQUIRE_MPI=require)
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-rA'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert result.returncode == returncode, result.stdout
    assert outcome in result.stdout
    assert 'mpiexec is not on PATH' in result.stdout


@pytest.mark.gpu
def test_gpu_marker_runs_on_a_cuda_device():
    assert cuda.cupy.cuda.runtime.getDeviceCount() > 0
    assert int(cuda.cupy.arange(4).sum()) == 6
