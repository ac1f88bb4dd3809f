"""The fixtures and markers of conftest.py do what they promise."""

import subprocess
import sys

import numpy
import pytest

import chainer


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
