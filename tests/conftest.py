"""Test set-up: the gpu and mpi markers, and a tiny offline dataset root.

* ``@pytest.mark.gpu`` tests skip unless CuPy imports and sees a CUDA device.
* Two groups of tests run the same code whatever the Python, so where an
  environment variable names a tox env, only that env runs them and the
  others deselect them, saying so at the end of their output (``dev.sh
  test`` sets both; ``ONE_ENV`` below lists the modules):

  - ``emulated``: ``test_gpu.py`` and ``test_cuda_emulator.py`` run the CUDA
    kernels on the CPU emulation, the same C++ in every Python; in
    ``CHAINER_LARS_EMULATED_IN`` (``dev.sh test``: the newest Python's env).
  - ``integration``: the tests that run scripts and tools end to end in
    subprocesses (the examples, the benchmark, ``results.py``, ``dev.sh``,
    the wheel's build, the MPI ranks); in ``CHAINER_LARS_INTEGRATION_IN``
    (``dev.sh test``: the oldest Python's env, the one a script is likeliest
    to break on), and ``test_snippets.py``, which trains the docs' snippets
    on the real MNIST for a minute or two. ``test_syntax.py`` still
    compiles every script in every env.

  The library's own tests run in every env.
* ``@pytest.mark.mpi`` tests skip unless ``mpiexec`` is on ``PATH`` and
  mpi4py imports; with ``CHAINER_LARS_REQUIRE_MPI=1`` (set by CI) they fail
  instead (``tests/mpi_util.py``, which also runs the ranks).
* Where ``CHAINER_LARS_PROGRESS`` names a folder (``dev.sh test`` sets it),
  the session writes how far it is into a file there
  (``tests/progress.py``).
* With ``CHAINER_LARS_NO_MEMORY_POOL=1`` (``benchmarks/gpu_check.sh`` sets it
  under compute-sanitizer), CuPy allocates every array with its own
  ``cudaMalloc`` instead of from its pool, so that the sanitizer knows each
  array's bounds (in the pool, a write past an array's end lands in memory
  the process owns and goes unseen).
* The ``dataset_root`` fixture makes a tiny MNIST, CIFAR-10 and CIFAR-100
  for Chainer's own loaders.

"""

import functools
import os

import numpy
import pytest

import chainer
from chainer.backends import cuda

from tests import mpi_util
from tests import progress


# The sizes of the tiny datasets: (train, test) examples.
MNIST_SIZES = (64, 32)
CIFAR_SIZES = (32, 16)


@functools.lru_cache()
def _why_no_cuda():
    # cuda.available only says that CuPy imports, which it does on a
    # machine without a GPU too.
    if not cuda.available:
        return 'CuPy does not import (not installed, or no CUDA libraries)'
    try:
        count = cuda.cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver: CuPy raises one of several types
        return 'no CUDA device: {}'.format(e)
    return None if count else 'no CUDA device'


#: The groups of tests that run in one tox env only: the marker -> the
#: environment variable naming that env, the modules, and why one env is
#: enough (printed where they are deselected).
ONE_ENV = {
    'emulated': (
        'CHAINER_LARS_EMULATED_IN',
        ('test_gpu.py', 'test_cuda_emulator.py'),
        'they run the CUDA kernels on the CPU emulation, the same C++ '
        'whatever the Python'),
    'integration': (
        'CHAINER_LARS_INTEGRATION_IN',
        ('test_examples.py', 'test_example_chainermn.py',
         'test_example_mixed_precision.py', 'test_example_study.py',
         'test_example_forms.py', 'test_chainermn.py', 'test_bench_smoke.py',
         'test_gpu_bench.py',
         'test_results_check.py', 'test_dev_sh.py', 'test_packaging.py',
         'test_mpi_util.py', 'test_snippets.py'),
        'they run scripts and tools end to end in subprocesses (examples, '
        'benchmark, results.py, dev.sh, wheel build, MPI ranks) or train '
        "on the real MNIST (the docs' snippets); test_syntax.py compiles "
        'the scripts in every env'),
}


def pytest_configure(config):
    # dev.sh test's heartbeat (tests/progress.py)
    progress.register(config)
    if os.environ.get('CHAINER_LARS_NO_MEMORY_POOL') == '1':
        if not cuda.available:
            raise pytest.UsageError(
                'CHAINER_LARS_NO_MEMORY_POOL=1 needs CuPy, which does not '
                'import here')
        cuda.cupy.cuda.set_allocator(None)
        cuda.cupy.cuda.set_pinned_memory_allocator(None)


# After the -m selection, so that what is counted here is only ours.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    here = os.environ.get('TOX_ENV_NAME')
    groups = {os.path.basename(module): marker
              for marker, (_, modules, _) in ONE_ENV.items()
              for module in modules}
    kept, dropped = [], {}
    for item in items:
        marker = groups.get(os.path.basename(str(item.fspath)))
        if marker is not None:
            item.add_marker(marker)
            only = os.environ.get(ONE_ENV[marker][0]) or None
            if only is not None and here is not None and here != only:
                dropped.setdefault(marker, []).append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(
            items=[item for group in dropped.values() for item in group])
        items[:] = kept
    config._chainer_lars_one_env = [
        (marker, len(dropped[marker])) for marker in ONE_ENV
        if marker in dropped]


def pytest_terminal_summary(terminalreporter, config):
    """Says which tests this env deselected, where they run, and why."""
    for marker, count in getattr(config, '_chainer_lars_one_env', []):
        variable, _, why = ONE_ENV[marker]
        terminalreporter.write_line(
            '{}: {} {} tests deselected, run in {} only ({}): {}'.format(
                os.environ.get('TOX_ENV_NAME'), count, marker,
                os.environ[variable], variable, why))


def pytest_runtest_setup(item):
    if item.get_closest_marker('gpu') is not None:
        reason = _why_no_cuda()
        if reason is not None:
            pytest.skip(reason)
    if item.get_closest_marker('mpi') is not None:
        mpi_util.require_mpi()


def _classification(n_classes, n_features, sizes):
    """Returns learnable ``(x, y)`` uint8 splits of the given sizes.

    Each class has a random prototype image; each example is its class's
    prototype with a tenth of the pixels replaced by noise, so that the
    classes are easily told apart, and the splits share the prototypes.

    """
    rng = numpy.random.RandomState(n_classes)
    prototypes = rng.randint(0, 256, (n_classes, n_features))
    splits = []
    for n in sizes:
        y = rng.permutation(numpy.arange(n) % n_classes)
        noise = rng.randint(0, 256, (n, n_features))
        x = numpy.where(rng.rand(n, n_features) < 0.1, noise, prototypes[y])
        splits.append((x.astype(numpy.uint8), y.astype(numpy.uint8)))
    return splits


def _write_mnist(root):
    folder = os.path.join(root, 'pfnet', 'chainer', 'mnist')
    os.makedirs(folder)
    splits = _classification(10, 784, MNIST_SIZES)
    for name, (x, y) in zip(('train', 'test'), splits):
        numpy.savez_compressed(os.path.join(folder, name + '.npz'), x=x, y=y)


def _write_cifar(root, n_classes):
    folder = os.path.join(root, 'pfnet', 'chainer', 'cifar')
    os.makedirs(folder, exist_ok=True)
    (train_x, train_y), (test_x, test_y) = _classification(
        n_classes, 3072, CIFAR_SIZES)
    numpy.savez_compressed(
        os.path.join(folder, 'cifar-{}.npz'.format(n_classes)),
        train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)


@pytest.fixture
def dataset_root(tmp_path, monkeypatch):
    """A dataset root holding a tiny MNIST, CIFAR-10 and CIFAR-100.

    The files have the layout of Chainer's download cache (``MNIST_SIZES``
    and ``CIFAR_SIZES`` examples), so that ``chainer.datasets.get_mnist()``,
    ``get_cifar10()`` and ``get_cifar100()`` load them without a network.
    For the test's duration Chainer's dataset root points there (the
    examples' ``--dataset-root`` changes it too), and so does
    ``CHAINER_DATASET_ROOT`` for subprocesses such as example scripts.
    Returns the root as a string.

    """
    root = str(tmp_path / 'datasets')
    _write_mnist(root)
    _write_cifar(root, 10)
    _write_cifar(root, 100)
    monkeypatch.setenv('CHAINER_DATASET_ROOT', root)
    previous = chainer.dataset.get_dataset_root()
    chainer.dataset.set_dataset_root(root)
    yield root
    chainer.dataset.set_dataset_root(previous)
