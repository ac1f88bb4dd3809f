"""The trainers run in the three ways examples/README.md lists.

As a file from the repository root (``python examples/mnist/train_mnist.py``),
as a file from the trainer's own folder (``python train_mnist.py``), and as
a module from the root (``python -m examples.mnist.train_mnist``), each
with nothing on ``PYTHONPATH``: the trainers find the ``examples`` package (and
this checkout's ``chainer_lars``) by themselves.
"""

import json
import os
import subprocess
import sys

import pytest

from tests import mpi_util
from tests import REPO_ROOT


pytestmark = pytest.mark.example

TRAINERS = ['examples/mnist/train_mnist.py', 'examples/cifar/train_cifar.py',
            'examples/chainermn/mnist/train_mnist.py']


def run(args, cwd):
    env = dict(os.environ)
    env.pop('PYTHONPATH', None)
    return subprocess.run(
        [sys.executable] + args, cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=120)


def form(script, how):
    """The command line and its folder for one way to run ``script``."""
    if how == 'file from the root':
        return [script], REPO_ROOT
    if how == 'file from its folder':
        folder, name = os.path.split(script)
        return [name], os.path.join(REPO_ROOT, folder)
    return ['-m', script[:-len('.py')].replace('/', '.')], REPO_ROOT


@pytest.mark.parametrize('how', ['file from the root', 'file from its folder',
                                 'module'])
@pytest.mark.parametrize('script', TRAINERS)
def test_help(script, how):
    args, cwd = form(script, how)
    result = run(args + ['--help'], cwd)
    assert result.returncode == 0, result.stderr
    assert '--batchsize' in result.stdout
    # CuPy without NCCL warned in 8 lines at every start, --help too
    # (chainer.training imports cupy.cuda.nccl): filtered, that one only.
    assert 'nccl' not in result.stderr.lower(), result.stderr


def test_only_the_nccl_warning_is_filtered():
    """examples/__init__.py filters CuPy's warning by its message: any
    other warning, a UserWarning too, still shows."""
    import warnings
    import examples  # NOQA: its filter
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('default')  # what a fresh process has
        import importlib
        importlib.reload(examples)
        warnings.warn('\nnccl library could not be loaded.\n\nReason: '
                      'ImportError', UserWarning)
        warnings.warn('another warning', UserWarning)
        warnings.warn('nccl library could not be loaded.', RuntimeWarning)
    assert [str(w.message) for w in caught] == [
        'another warning', 'nccl library could not be loaded.']


@pytest.mark.parametrize('script', TRAINERS)
def test_help_says_lr_is_alpha_for_adam_and_lamb(script):
    # Every trainer offers adam and lamb, whose rate is alpha.
    result = run([script, '--help'], REPO_ROOT)
    assert result.returncode == 0, result.stderr
    text = ' '.join(result.stdout.split())
    assert "--lr LR Peak learning rate, Adam's and LAMB's alpha" in text
    assert '{lars,momentum-lars,momentum,nesterov,lamb,adam}' in text


def test_bootstrap_links_lead_to_one_file():
    """Each trainer's folder has the bootstrap as a link to the one file."""
    real = os.path.join(REPO_ROOT, 'examples', '_examples_path.py')
    for script in TRAINERS:
        link = os.path.join(REPO_ROOT, os.path.dirname(script),
                            '_examples_path.py')
        assert os.path.islink(link), link
        assert os.path.realpath(link) == os.path.realpath(real)


def test_mnist_one_epoch_from_its_folder(dataset_root, tmp_path):
    out = str(tmp_path / 'out')
    args, cwd = form(TRAINERS[0], 'file from its folder')
    result = run(args + ['-b', '32', '-e', '1', '-u', '8', '--noplot',
                         '-o', out], cwd)
    assert result.returncode == 0, result.stderr
    with open(os.path.join(out, 'log')) as f:
        log = json.load(f)
    assert [entry['epoch'] for entry in log] == [0, 1]


@pytest.mark.parametrize('how', ['file from the root', 'file from its folder'])
def test_results_imports_the_trainer_as_a_file(tmp_path, how):
    """results.py --flags checks them with train_mnist.py's own parser."""
    args, cwd = form('examples/mnist/results.py', how)
    result = run(args + ['--flags=--lr -1', '--out', str(tmp_path / 'r')],
                 cwd)
    assert result.returncode == 2, result.stderr
    assert 'train_mnist.py refuses them' in result.stderr


@pytest.mark.mpi
def test_chainermn_one_epoch_from_its_folder_on_2_ranks(dataset_root,
                                                        tmp_path):
    """Every rank finds the examples package by itself: no PYTHONPATH to pass
    on, as mpiexec would have to on other machines."""
    out = tmp_path / 'out'
    args, cwd = form(TRAINERS[2], 'file from its folder')
    result = mpi_util.run_mpi(
        2, args + ['--communicator', 'naive', '--device', '-1',
                   '--epoch', '1', '--batchsize', '8', '--unit', '16',
                   '--noplot', '--out', str(out)],
        timeout=240, env={'PYTHONPATH': ''}, cwd=cwd)
    assert result.returncode == 0
    with open(str(out / 'log')) as f:
        assert [entry['epoch'] for entry in json.load(f)] == [0, 1]
