"""Helpers for the example tests: tiny datasets and the example scripts."""

import importlib.util
import os

import numpy


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def example_path(task, script):
    """The path of ``examples/<task>/<script>``."""
    return os.path.join(REPOSITORY, 'examples', task, script)


def load_example(task, script):
    """Imports an example script as a module (``main(argv)`` runs it)."""
    path = example_path(task, script)
    spec = importlib.util.spec_from_file_location(
        'example_' + os.path.splitext(script)[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_tiny_mnist(root, n_train=64, n_test=32, seed=0):
    """Writes an MNIST cache in the layout ``get_mnist()`` reads."""
    rng = numpy.random.RandomState(seed)
    directory = os.path.join(root, 'pfnet', 'chainer', 'mnist')
    os.makedirs(directory, exist_ok=True)
    for name, n in (('train', n_train), ('test', n_test)):
        numpy.savez_compressed(
            os.path.join(directory, name + '.npz'),
            x=rng.randint(0, 256, (n, 784)).astype(numpy.uint8),
            y=rng.randint(0, 10, n).astype(numpy.uint8))


def write_tiny_cifar(root, n_class=10, n_train=32, n_test=16, seed=0):
    """Writes a CIFAR cache in the layout ``get_cifar10/100()`` reads."""
    rng = numpy.random.RandomState(seed)
    directory = os.path.join(root, 'pfnet', 'chainer', 'cifar')
    os.makedirs(directory, exist_ok=True)
    numpy.savez_compressed(
        os.path.join(directory, 'cifar-{}.npz'.format(n_class)),
        train_x=rng.randint(0, 256, (n_train, 3072)).astype(numpy.uint8),
        train_y=rng.randint(0, n_class, n_train).astype(numpy.uint8),
        test_x=rng.randint(0, 256, (n_test, 3072)).astype(numpy.uint8),
        test_y=rng.randint(0, n_class, n_test).astype(numpy.uint8))
