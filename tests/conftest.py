"""Test set-up: the gpu and mpi markers, and a tiny offline dataset root.

* ``@pytest.mark.gpu`` tests skip unless CuPy imports and sees a CUDA device.
* Five groups of tests need not run in every tox env: where an
  environment variable names envs (a comma-separated list), only those
  run the group and the others deselect it, saying so at the end of
  their output (``dev.sh test`` sets all five; ``GROUPS`` below says
  what each holds and why). A test is in a group by its module
  (``MODULES``), by the group's marker, or, for ``emulated``, by a
  parameter ``'emulated'`` (a device) or the fixture ``emulated_gpu``;
  every other test, the library's own, runs in every env, so a new test
  module of the library runs everywhere without being listed:

  - ``emulated``: the CUDA kernels compiled by NVRTC or run on the CPU
    emulation, the same C++ in every Python; in
    ``CHAINER_LARS_EMULATED_IN``.
  - ``examples``: the example trainers (MNIST, CIFAR, ChainerMN, the
    16-bit runs, the study) run end to end in subprocesses, and
    ``test_snippets.py``, which trains the docs' snippets on the real
    MNIST; in ``CHAINER_LARS_EXAMPLES_IN``.
  - ``integration``: the other scripts and tools run end to end in
    subprocesses (the benchmark, ``results.py``, ``dev.sh``, the
    wheel's build, the MPI ranks); in ``CHAINER_LARS_INTEGRATION_IN``.
    ``test_syntax.py`` still compiles every script in every env.
  - ``isolated``: the library's cases that each run in a process of
    their own (``tests/forked.py``: arrays changed in place, read-only
    and foreign memory, the fuzz test): they depend on numpy's arrays,
    not on the Python; in ``CHAINER_LARS_ISOLATED_IN``.
  - ``docs``: the docstrings' checks, which need Sphinx; in
    ``CHAINER_LARS_DOCS_IN`` (``dev.sh test``: ``docs``). Where Sphinx
    is missing outside tox, they skip and say that ``tox -e docs`` runs
    them.

* ``@pytest.mark.mpi`` tests skip unless ``mpiexec`` is on ``PATH`` and
  mpi4py imports; with ``CHAINER_LARS_REQUIRE_MPI=1`` (set by CI) they fail
  instead (``tests/mpi_util.py``, which also runs the ranks).
* The tests of the compiled CPU loops skip where the library runs without
  Numba (``cpu._jit()`` falls back to the NumPy passes); with
  ``CHAINER_LARS_REQUIRE_NUMBA=1`` (set by CI) they fail instead
  (``tests/numba_util.py``).
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
* After collection, what is alive is frozen out of the garbage collector
  (``gc.freeze()``): full collections then skip it.
* hypothesis keeps its caches in a temporary folder, removed at the end
  (``HYPOTHESIS_STORAGE_DIRECTORY``, which subprocesses inherit), not in
  ``.hypothesis/`` of the checkout.

"""

import atexit
import functools
import gc
import os
import shutil
import tempfile

import numpy
import pytest

import chainer
from chainer.backends import cuda

from tests import mpi_util
from tests import progress


if 'HYPOTHESIS_STORAGE_DIRECTORY' not in os.environ:  # read at first use
    os.environ['HYPOTHESIS_STORAGE_DIRECTORY'] = tempfile.mkdtemp(
        prefix='chainer-lars-hypothesis-')
    atexit.register(shutil.rmtree, os.environ['HYPOTHESIS_STORAGE_DIRECTORY'],
                    True)


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


#: The groups of tests that run only in the tox envs a variable names:
#: the marker -> the variable, and why those envs are enough (printed
#: where the group is deselected).
GROUPS = {
    'emulated': (
        'CHAINER_LARS_EMULATED_IN',
        'they compile the CUDA kernels (NVRTC) or run them on the CPU '
        'emulation, the same C++ whatever the Python'),
    'examples': (
        'CHAINER_LARS_EXAMPLES_IN',
        'they run the example trainers end to end in subprocesses, or train '
        "the docs' snippets on the real MNIST, the same scripts whatever the "
        'env; test_syntax.py compiles them in every env'),
    'integration': (
        'CHAINER_LARS_INTEGRATION_IN',
        'they run tools end to end in subprocesses (benchmark, results.py, '
        'dev.sh, wheel build, MPI ranks); test_syntax.py compiles the '
        'scripts in every env'),
    'isolated': (
        'CHAINER_LARS_ISOLATED_IN',
        'each case runs in a process of its own, on memory that numpy lays '
        'out: they differ by numpy, not by Python'),
    'docs': (
        'CHAINER_LARS_DOCS_IN',
        'they check the docstrings with Sphinx, which the docs env has'),
}

#: The modules whose tests are all in a group.
MODULES = {
    'test_gpu.py': 'emulated',
    'test_cuda_emulator.py': 'emulated',
    'test_cuda_source.py': 'emulated',
    'test_examples.py': 'examples',
    'test_example_chainermn.py': 'examples',
    'test_example_mixed_precision.py': 'examples',
    'test_example_study.py': 'examples',
    'test_example_forms.py': 'examples',
    'test_chainermn.py': 'integration',
    'test_bench_smoke.py': 'integration',
    'test_gpu_bench.py': 'integration',
    'test_results_check.py': 'integration',
    'test_dev_sh.py': 'integration',
    'test_packaging.py': 'integration',
    'test_mpi_util.py': 'integration',
    'test_snippets.py': 'examples',
    'test_in_place.py': 'isolated',
    'test_safety.py': 'isolated',
    'test_fuzz.py': 'isolated',
    'test_docs.py': 'docs',
}


def group_of(item):
    """The group of the test ``item``, or None (the library's tests)."""
    callspec = getattr(item, 'callspec', None)
    if (item.get_closest_marker('emulated') is not None
            or 'emulated_gpu' in getattr(item, 'fixturenames', ())
            or callspec is not None and 'emulated' in [
                value for value in callspec.params.values()
                if isinstance(value, str)]):
        return 'emulated'
    for group in GROUPS:
        if item.get_closest_marker(group) is not None:
            return group
    return MODULES.get(os.path.basename(str(item.fspath)))


def envs_of(group):
    """The tox envs that run ``group``, or None for every env."""
    names = os.environ.get(GROUPS[group][0]) or ''
    return [name for name in names.split(',') if name] or None


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
    kept, dropped = [], {}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(group)
            envs = envs_of(group)
            if envs is not None and here is not None and here not in envs:
                dropped.setdefault(group, []).append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(
            items=[item for group in dropped.values() for item in group])
        items[:] = kept
    config._chainer_lars_groups = [
        (group, len(dropped[group])) for group in GROUPS if group in dropped]


def pytest_terminal_summary(terminalreporter, config):
    """Says which tests this env deselected, where they run, and why."""
    for group, count in getattr(config, '_chainer_lars_groups', []):
        variable, why = GROUPS[group]
        terminalreporter.write_line(
            '{}: {} {} tests deselected, run in {} only ({}): {}'.format(
                os.environ.get('TOX_ENV_NAME'), count, group,
                ' and '.join(envs_of(group)), variable, why))


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


def pytest_collection_finish(session):
    # What imports and collection made (Chainer, CuPy, NumPy, the test
    # items: hundreds of thousands of objects) lives until the end:
    # leaving it out of the garbage collector's full passes, which every
    # test's allocations set off, makes the emulated GPU tests a fifth
    # faster. What a test makes is collected as before.
    gc.freeze()
