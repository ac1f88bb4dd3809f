"""The example trainers, run end to end on tiny generated datasets.

The datasets are conftest.py's ``dataset_root``: MNIST of 64 training and 32
test images, CIFAR of 32 and 16.
"""

import argparse
import hashlib
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import types
import warnings

import numpy
import pytest

import chainer

from examples import cli
from examples import data
from examples import plots
from examples import recipe
from examples import training
from tests import forked
from tests import pythonpath
from tests import REPO_ROOT
from tests import benchmark
from tests import tick_labels


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


def read_log(out):
    with open(os.path.join(out, 'log')) as f:
        return json.load(f)


def without_time(log):
    return [{k: v for k, v in entry.items() if k != 'elapsed_time'}
            for entry in log]


def snapshot_arrays(path):
    """The arrays of a snapshot that do not depend on the wall clock."""
    with numpy.load(path) as npz:
        return {key: npz[key] for key in npz.files
                if 'elapsed_time' not in key and 'LogReport/_log' not in key}


def check_run_and_resume(main, args, out_dir, iterations_per_epoch,
                         lars_key):
    """Runs 3 epochs, checks the outputs, then resumes from epoch 1.

    Three epochs, so that the resumed run draws a new order (and new
    augmentations) from the restored random state.
    """
    first = str(out_dir / 'first')
    main(args + ['--epoch', '3', '--out', first, '--snapshots', '3'])

    log = read_log(first)
    assert [entry['epoch'] for entry in log] == [0, 1, 2, 3]
    assert [entry['iteration'] for entry in log] == [
        i * iterations_per_epoch for i in range(4)]
    for key in ('main/loss', 'test/main/loss', 'main/accuracy',
                'test/main/accuracy', 'lr'):
        assert all(math.isfinite(entry[key]) for entry in log[1:]), key
    plots = {'loss.png', 'accuracy.png', 'lr.png'}
    if lars_key is not None:
        assert all(lars_key in entry for entry in log[1:])
        plots.add('trust_ratio.png')
    files = set(os.listdir(first))
    assert plots <= files
    snapshots = ['snapshot_iter_{}'.format(i * iterations_per_epoch)
                 for i in (1, 2, 3)]
    assert set(snapshots) <= files

    # Continue from the snapshot of epoch 1, as if the run had stopped
    # there: the log and every saved array must match the first run.
    resumed = str(out_dir / 'resumed')
    main(args + ['--epoch', '3', '--out', resumed,
                 '--resume', os.path.join(first, snapshots[0])])
    assert without_time(read_log(resumed)) == without_time(log)
    want = snapshot_arrays(os.path.join(first, snapshots[-1]))
    got = snapshot_arrays(os.path.join(resumed, snapshots[-1]))
    assert sorted(got) == sorted(want)
    for key in want:
        numpy.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize('optimizer,lars_key', [
    ('lars', 'lars/ratio/predictor/l1/W'),
    ('momentum-lars', 'lars/ratio/predictor/l1/W'),
    ('momentum', None),
    ('lamb', 'lars/ratio/predictor/l1/W'),
    ('adam', None),
])
def test_mnist_runs_and_resumes_exactly(mnist, dataset_root, tmp_path,
                                        optimizer, lars_key):
    args = ['--dataset-root', dataset_root, '--optimizer', optimizer,
            '--batchsize', '32', '--unit', '32', '--warmup-epochs', '1']
    check_run_and_resume(mnist.main, args, tmp_path, 64 // 32, lars_key)


@pytest.mark.parametrize('dataset,optimizer,lars_key', [
    ('cifar10', 'lars', 'lars/ratio/predictor/res3/0/conv1/W'),
    ('cifar100', 'momentum-lars', 'lars/ratio/predictor/fc/W'),
    ('cifar10', 'momentum', None),
    ('cifar10', 'lamb', 'lars/ratio/predictor/res3/0/conv1/W'),
])
def test_cifar_runs_and_resumes_exactly(cifar, dataset_root, tmp_path,
                                        dataset, optimizer, lars_key):
    args = ['--dataset-root', dataset_root, '--dataset', dataset,
            '--optimizer', optimizer, '--batchsize', '16', '--depth', '8',
            '--warmup-epochs', '1']
    check_run_and_resume(cifar.main, args, tmp_path, 32 // 16, lars_key)


def test_cifar_excludes_batchnorm_and_biases_from_ratios(
        cifar, dataset_root, tmp_path):
    out = str(tmp_path / 'out')
    cifar.main(['--dataset-root', dataset_root, '--batchsize', '16',
                '--depth', '8', '--epoch', '1', '--noplot', '--out', out])
    keys = {key for key in read_log(out)[-1] if key.startswith('lars/')}
    assert keys
    assert all(key.endswith('/W') for key in keys)
    assert not {'loss.png', 'accuracy.png'} & set(os.listdir(out))


def test_evaluator_weights_each_batch_by_its_size():
    """The test accuracy and loss are those of the whole test set.

    10 examples in batches of 4, 4 and 2; the labels agree with the model's
    predictions on examples 0-3, 8 and 9 only, so the accuracy is 0.6, where
    the plain mean of the batches (Chainer's Evaluator) would give 2/3.
    """
    numpy.random.seed(0)
    model = chainer.links.Classifier(
        chainer.links.Linear(5, 3, initialW=numpy.random.randn(3, 5)))
    x = numpy.random.randn(10, 5).astype(numpy.float32)
    with chainer.using_config('train', False):
        y = model.predictor(x)
    t = y.array.argmax(axis=1).astype(numpy.int32)
    t[4:8] = (t[4:8] + 1) % 3
    test = chainer.datasets.TupleDataset(x, t)
    iterator = chainer.iterators.SerialIterator(test, 4, repeat=False,
                                                shuffle=False)
    reporter = chainer.Reporter()  # the trainer's, during evaluation
    reporter.add_observer('main', model)
    with reporter:
        result = training.Evaluator(iterator, model).evaluate()
        plain = chainer.training.extensions.Evaluator(iterator, model)
        plain = plain.evaluate()
    assert result['main/accuracy'] == pytest.approx(0.6, rel=1e-6)
    loss = chainer.functions.softmax_cross_entropy(y, t).array
    assert result['main/loss'] == pytest.approx(float(loss), rel=1e-5)
    assert plain['main/accuracy'] == pytest.approx(2 / 3)


def test_evaluator_s_accuracy_in_float16_is_the_exact_fraction():
    """In float16 each batch's accuracy is a float16 mean, which rounds:
    the log said 0.10460380859375 for 1046 of 10,000 test images. The
    accuracy is counted: k / n exactly, as Python divides."""
    rng = numpy.random.RandomState(0)
    with chainer.using_config('dtype', numpy.float16):
        model = chainer.links.Classifier(chainer.links.Linear(
            5, 3, initialW=rng.randn(3, 5)))
    x = rng.randn(3000, 5).astype(numpy.float16)
    t = rng.randint(0, 3, 3000).astype(numpy.int32)
    with chainer.using_config('train', False):
        predicted = model.predictor(x).array.argmax(axis=1)
    correct = int((predicted == t).sum())
    iterator = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 2048, repeat=False,
        shuffle=False)
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    with reporter:
        result = training.Evaluator(iterator, model).evaluate()
    assert float(result['main/accuracy']) == correct / 3000
    # Not so from float16 means (the test has a case that shows it).
    assert float(numpy.float16(correct / 3000)) != correct / 3000


@pytest.mark.parametrize('dataset', ['mnist', 'cifar10', 'cifar100'])
def test_images_are_standardized_by_the_training_set(dataset_root, dataset):
    """MNIST over all pixels, CIFAR per channel; test images alike."""
    raw = getattr(chainer.datasets, 'get_' + dataset)()
    if dataset == 'mnist':
        got = data.load_mnist()
        axis = None
    else:
        got = data.load_cifar(dataset)
        axis = (0, 2, 3)
    (raw_x, raw_t), (x, t) = [chainer.dataset.concat_examples(pair[0])
                              for pair in (raw, got)]
    assert x.dtype == numpy.float32 and x.shape == raw_x.shape
    numpy.testing.assert_allclose(
        x.mean(axis=axis, dtype=numpy.float64), 0, atol=1e-6)
    numpy.testing.assert_allclose(
        x.std(axis=axis, dtype=numpy.float64), 1, rtol=1e-6)
    mean = raw_x.mean(axis=axis, dtype=numpy.float64, keepdims=True)[0]
    std = raw_x.std(axis=axis, dtype=numpy.float64, keepdims=True)[0]
    for (raw_x, raw_t), (x, t) in [
            [chainer.dataset.concat_examples(pair[i]) for pair in (raw, got)]
            for i in (0, 1)]:
        numpy.testing.assert_allclose(x, (raw_x - mean) / std,
                                      rtol=1e-6, atol=1e-6)
        numpy.testing.assert_array_equal(t, raw_t)


@pytest.mark.parametrize('name', ['mnist', 'cifar'])
def test_decay_power_sets_the_schedule(request, dataset_root, tmp_path,
                                       name):
    """3 epochs of 2 updates, warm-up over the first epoch.

    The rate used by update k (1-based) is v(k - 1), and the log holds the
    mean over each epoch: (v0/2 + v0)/2, then (v0 + 0.75^p v0)/2, then
    (0.5^p + 0.25^p) v0/2.
    """
    example = request.getfixturevalue(name)
    args = ['--dataset-root', dataset_root, '--epoch', '3',
            '--warmup-epochs', '1', '--noplot']
    if name == 'mnist':
        args += ['--batchsize', '32', '--unit', '8']
    else:
        args += ['--batchsize', '16', '--depth', '8']
    for power in (1.0, 2.0, 0.5):
        out = str(tmp_path / str(power))
        example.main(args + ['--decay-power', str(power), '--out', out])
        peak = example.parse_args(args).lr
        lrs = [entry['lr'] for entry in read_log(out)]
        assert lrs[1:] == pytest.approx([
            0.75 * peak, (1 + 0.75 ** power) * peak / 2,
            (0.5 ** power + 0.25 ** power) * peak / 2], rel=1e-12)
    assert example.parse_args([]).decay_power == 2


@pytest.mark.parametrize('optimizer,batchsize,lr', [
    ('momentum', 256, 0.1),
    ('momentum', 8192, 0.1 * 32),
    ('lars', 256, 0.005 / 0.02),
    ('lars', 8192, 0.005 * math.sqrt(32) / 0.02),
    ('momentum-lars', 1024, 0.005 * 2 / 0.02),
    ('adam', 256, 0.001),
    ('adam', 8192, 0.001 * math.sqrt(32)),
    ('lamb', 1024, 0.01 * 2),
])
def test_default_lr_rule(mnist, cifar, optimizer, batchsize, lr):
    for example in (mnist, cifar):
        args = example.parse_args(['--optimizer', optimizer,
                                   '--batchsize', str(batchsize)])
        assert math.isclose(args.lr, lr, rel_tol=1e-12)
        assert example.parse_args(['--lr', '0.5']).lr == 0.5
        # The rule sets lr * trust_coefficient.
        if optimizer in ('lars', 'momentum-lars'):
            args = example.parse_args(['--optimizer', optimizer,
                                       '--batchsize', str(batchsize),
                                       '--trust-coefficient', '0.5'])
            assert math.isclose(args.lr * 0.5, lr * 0.02, rel_tol=1e-12)


@pytest.mark.parametrize('optimizer', ['momentum', 'nesterov', 'lamb',
                                       'adam'])
@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn_example'])
def test_trust_coefficient_is_refused_where_it_has_no_effect(
        request, capsys, name, optimizer):
    """As --beta2 and --eps are: a snapshot records it, and a resume
    would have to repeat a value that changed nothing."""
    err = usage_error(request.getfixturevalue(name).parse_args, [
        '--optimizer', optimizer, '--trust-coefficient', '0.5'], capsys)
    assert err.splitlines()[-1].endswith(
        'error: --trust-coefficient is for --optimizer lars and '
        'momentum-lars, got --optimizer {}'.format(optimizer)), err
    # Left out, the run records the default, as those of before did.
    args = request.getfixturevalue(name).parse_args(['--optimizer',
                                                     optimizer])
    assert args.trust_coefficient == 0.02


def run_script(module, args, root):
    """Runs an example as the READMEs do, from the repository root."""
    env = dict(os.environ)
    env['CHAINER_DATASET_ROOT'] = root
    # A download, if the loader tries one, fails at once and never leaves
    # the machine: the proxy is a closed local port.
    for name in ('http_proxy', 'https_proxy', 'HTTP_PROXY', 'HTTPS_PROXY'):
        env[name] = 'http://127.0.0.1:9'
    env.pop('no_proxy', None)
    env.pop('NO_PROXY', None)
    return subprocess.run(
        [sys.executable, '-m', module] + args, cwd=REPO_ROOT,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)


def test_mnist_script_reads_chainer_dataset_root(dataset_root, tmp_path):
    out = str(tmp_path / 'out')
    result = run_script('examples.mnist.train_mnist',
                        ['-b', '32', '-e', '1', '-u', '8', '--noplot',
                         '-o', out], dataset_root)
    assert result.returncode == 0, result.stderr
    assert read_log(out)[-1]['epoch'] == 1
    # Its output went to a pipe, as to a log file: no terminal codes.
    assert '\x1b' not in result.stdout + result.stderr


def _progress_run(mnist, dataset_root, tmp_path, capsys, flags):
    mnist.main(['-b', '32', '-e', '2', '-u', '8', '--noplot',
                '--dataset-root', dataset_root,
                '--out', str(tmp_path / 'out')] + flags)
    out = capsys.readouterr().out
    return out, [line for line in out.splitlines()
                 if line.startswith('  iteration ')]


def test_progress_is_plain_lines_where_the_output_is_no_terminal(
        mnist, dataset_root, tmp_path, capsys, monkeypatch):
    # A line after every update (30 s apart in a real run).
    monkeypatch.setattr(training.ProgressLines.__init__, '__defaults__',
                        (0.0,))
    out, lines = _progress_run(mnist, dataset_root, tmp_path, capsys, [])
    assert '\x1b' not in out
    # 2 epochs of 2 updates, with the share done and the time left.
    assert [line.split(',')[:2] for line in lines] == [
        ['  iteration 1', ' epoch 0.50 of 2 (25.0%)'],
        ['  iteration 2', ' epoch 1.00 of 2 (50.0%)'],
        ['  iteration 3', ' epoch 1.50 of 2 (75.0%)'],
        ['  iteration 4', ' epoch 2.00 of 2 (100.0%)']]
    assert re.search(r' iterations/s, about \d+ s left$', lines[0])
    assert lines[-1].endswith(' iterations/s')


@pytest.mark.parametrize('flags, tty, bar', [
    ([], True, True),  # auto, on a terminal: Chainer's bar
    (['--progress', 'bar'], False, True),
    (['--progress', 'none'], False, False),
    (['--progress', 'none'], True, False),
])
def test_progress_flag(mnist, dataset_root, tmp_path, capsys, monkeypatch,
                       flags, tty, bar):
    monkeypatch.setattr(training.ProgressLines.__init__, '__defaults__',
                        (0.0,))
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: tty)
    out, lines = _progress_run(mnist, dataset_root, tmp_path, capsys, flags)
    assert ('\x1b[J' in out) == bar
    assert lines == []


def test_progress_bar_s_first_draw_has_a_speed(
        mnist, dataset_root, tmp_path, capsys, monkeypatch):
    """Chainer's bar measured the speed from its own first draw: that
    draw said ``inf iters/sec. Estimated time to finish: 0:00:00.``
    (with the defaults, for a minute); ours measures from the start."""
    bar = training.ProgressBar.__init__

    def every_update(self, **kwargs):
        bar(self, update_interval=1)
    monkeypatch.setattr(training.ProgressBar, '__init__', every_update)
    out, _ = _progress_run(mnist, dataset_root, tmp_path, capsys,
                           ['--progress', 'bar'])
    speeds = re.findall(r'(\S+) iters/sec\. Estimated time to finish: '
                        r'(\S+)\.', out)
    assert len(speeds) == 4, out
    assert all(0 < float(speed) < math.inf for speed, _ in speeds), speeds
    assert speeds[0][1] != '0:00:00', speeds


class ClosedPipe(object):
    """Standard output whose reader ends once it has read the first
    chunk, the banner (``| head -3``): every write or flush after raises
    ``BrokenPipeError``."""

    def __init__(self, closed=False):
        self.text = ''
        self.read = '' if closed else None

    def write(self, text):
        if self.read is not None:
            raise BrokenPipeError(32, 'Broken pipe')
        self.text += text
        return len(text)

    def flush(self):
        if self.read is not None:
            raise BrokenPipeError(32, 'Broken pipe')
        self.read = self.text

    def isatty(self):
        return False


@pytest.mark.parametrize('progress, closed', [
    ('lines', False), ('bar', False), ('lines', True)])
def test_a_closed_output_does_not_stop_the_run(
        mnist, dataset_root, tmp_path, capsys, monkeypatch, progress, closed):
    """``train_mnist.py | head -3``: the report's first write raised
    BrokenPipeError, and the run ended with a traceback. It goes on,
    says so once on stderr, and writes its log and snapshot; with the
    bar too, whose report and bar kept the stream they were made with;
    and where the reader had gone before the banner (``| true``)."""
    monkeypatch.setattr(training.ProgressLines.__init__, '__defaults__',
                        (0.0,))
    pipe = ClosedPipe(closed)
    monkeypatch.setattr(sys, 'stdout', pipe)
    out = tmp_path / 'out'
    mnist.main(['-b', '32', '-e', '3', '-u', '8', '--noplot',
                '--progress', progress,
                '--dataset-root', dataset_root, '--out', str(out)])
    assert [entry['epoch'] for entry in read_log(out)] == [0, 1, 2, 3]
    assert (out / 'snapshot_iter_6').exists()
    err = capsys.readouterr().err
    assert err.count('standard output was closed') == 1, err
    assert 'the training goes on without it' in err and 'Traceback' not in err
    assert pipe.text.startswith('' if closed else 'Device: @numpy\n')


@pytest.mark.parametrize('said, tty, bar', [
    ('0', True, False),  # mpiexec's pty, dev.sh writing to a file: lines
    ('1', False, True),
    ('', True, True),  # empty: isatty decides
])
def test_progress_auto_takes_the_launchers_word_for_the_terminal(
        mnist, dataset_root, tmp_path, capsys, monkeypatch, said, tty, bar):
    """CHAINER_LARS_TERMINAL (set by dev.sh chainermn) over isatty."""
    monkeypatch.setattr(training.ProgressLines.__init__, '__defaults__',
                        (0.0,))
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: tty)
    monkeypatch.setenv('CHAINER_LARS_TERMINAL', said)
    out, lines = _progress_run(mnist, dataset_root, tmp_path, capsys, [])
    assert ('\x1b' in out) == bar
    assert (lines == []) == bar


def test_progress_refuses_a_bad_terminal_variable(mnist, capsys,
                                                  monkeypatch):
    monkeypatch.setenv('CHAINER_LARS_TERMINAL', 'yes')
    err = usage_error(mnist.main, ['-b', '32'], capsys)
    assert "error: CHAINER_LARS_TERMINAL='yes': 1" in err.splitlines()[-1]


@pytest.mark.parametrize('module,args,expected', [
    ('examples.mnist.train_mnist', [],
     [os.path.join('pfnet', 'chainer', 'mnist', 'train.npz'),
      os.path.join('pfnet', 'chainer', 'mnist', 'test.npz')]),
    ('examples.cifar.train_cifar', [],
     [os.path.join('pfnet', 'chainer', 'cifar', 'cifar-10.npz')]),
    ('examples.cifar.train_cifar', ['--dataset', 'cifar100'],
     [os.path.join('pfnet', 'chainer', 'cifar', 'cifar-100.npz')]),
])
@pytest.mark.parametrize('exists', [True, False])
def test_missing_dataset_gives_clear_message(tmp_path, module, args,
                                             expected, exists):
    """And the failed lookup leaves the dataset root as it was.

    Chainer's loader makes the cache's folders and a download lock there
    before it tries the download.
    """
    root = tmp_path / 'empty'
    if exists:
        root.mkdir()
    result = run_script(module, args + ['-o', str(tmp_path / 'out')],
                        str(root))
    assert result.returncode == 1
    assert 'Traceback' not in result.stderr
    assert 'CHAINER_DATASET_ROOT' in result.stderr
    for path in expected:
        assert os.path.join(str(root), path) in result.stderr
    assert root.exists() == exists
    if exists:
        assert not list(root.iterdir())


def _idx_gz(path, magic, array):
    """``array`` (uint8) as an MNIST file: gzip of the IDX format."""
    import gzip
    import struct
    with gzip.open(path, 'wb') as f:
        f.write(struct.pack('>i', magic) + struct.pack('>i', len(array)))
        if array.ndim == 2:
            f.write(struct.pack('>ii', 28, 28))
        f.write(array.tobytes())


@pytest.mark.parametrize('served, first', [
    ('the second mirror', 'unreachable'), ('the second mirror', 'cut short'),
    ('test.npz only', 'unreachable'), ('no mirror', 'cut short')])
def test_mnist_comes_from_a_mirror_where_chainers_source_refuses(
        dataset_root, tmp_path, monkeypatch, served, first):
    """yann.lecun.com answers HTTP 403 (since 2024): the cache files are
    made from a mirror's copies of the four files, checked by MD5 (the
    first mirror unreachable or its response cut short, an http.client
    error, the second serving them; a cache file there is not fetched
    again); where none serves them, the error names every source and
    why, and the dataset root keeps nothing of it."""
    import http.client
    import urllib.error
    from chainer.dataset import download
    folder = os.path.join(dataset_root, 'pfnet', 'chainer', 'mnist')
    expected = data.load_mnist()
    files, sums = {}, {}
    for name, pairs in data.MNIST_FILES.items():
        with numpy.load(os.path.join(folder, name)) as npz:
            for (file, _), (magic, array) in zip(pairs, [
                    (2051, npz['x']), (2049, npz['y'])]):
                files[file] = str(tmp_path / file)
                _idx_gz(files[file], magic, array)
                with open(files[file], 'rb') as f:
                    sums[file] = hashlib.md5(f.read()).hexdigest()
        if served != 'test.npz only' or name == 'test.npz':
            os.remove(os.path.join(folder, name))
    bad = 'wrong bytes' if served == 'no mirror' else None
    monkeypatch.setattr(data, 'MNIST_FILES', {name: tuple(
        (file, sums[file]) for file, _ in pairs)
        for name, pairs in data.MNIST_FILES.items()})
    fetched = []

    def cached_download(url):  # Chainer's, without the network
        assert socket.getdefaulttimeout() == data.TIMEOUT
        fetched.append(url)
        if 'yann.lecun.com' in url:
            raise urllib.error.HTTPError(url, 403, 'Forbidden', {}, None)
        if url.startswith(data.MNIST_MIRRORS[0]):
            raise (urllib.error.URLError('unreachable') if first ==
                   'unreachable' else http.client.IncompleteRead(b'x' * 100))
        cache = os.path.join(dataset_root, '_dl_cache')
        os.makedirs(cache, exist_ok=True)
        path = os.path.join(cache, hashlib.md5(url.encode()).hexdigest())
        with open(files[url.rsplit('/', 1)[1]], 'rb') as f, open(
                path, 'wb') as out:
            out.write(bad.encode() if bad else f.read())
        return path
    monkeypatch.setattr(download, 'cached_download', cached_download)
    if served == 'no mirror':
        with pytest.raises(SystemExit) as exc:
            data.load_mnist()
        message = str(exc.value.code)
        assert message.startswith(
            'Error: MNIST is not cached and could not be downloaded '
            "(yann.lecun.com (Chainer's source): HTTP Error 403: Forbidden; "
            + data.MNIST_MIRRORS[0] + ': IncompleteRead(100 bytes read); '
            + data.MNIST_MIRRORS[1] + ': ' + data.MNIST_MIRRORS[1]
            + 'train-images-idx3-ubyte.gz has MD5 '), message
        assert not os.listdir(folder)  # nothing made of the bad bytes
        return
    got = data.load_mnist()
    assert socket.getdefaulttimeout() is None  # as it was
    for a, b in zip(got, expected):
        for x, y in zip(a._datasets, b._datasets):
            numpy.testing.assert_array_equal(x, y)
    assert sorted(os.listdir(folder)) == ['test.npz', 'train.npz']
    one, two = ([u for u in fetched if u.startswith(m)]
                for m in data.MNIST_MIRRORS)
    wanted = [f for f in files if served != 'test.npz only' or 't10k' in f]
    assert one == [data.MNIST_MIRRORS[0] + wanted[0]]
    assert set(two) == {data.MNIST_MIRRORS[1] + f for f in wanted}


def _cut_short(path):
    with open(path, 'rb') as f:
        head = f.read(2000)
    with open(path, 'wb') as f:
        f.write(head)


def _flip_a_byte(path):
    """Damages the middle of the first array's data, which only reading
    it all finds."""
    with open(path, 'r+b') as f:
        f.seek(os.path.getsize(path) // 4)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def _rewritten(path, **changes):
    """Rewrites the NPZ ``path`` with ``changes`` (None: the entry
    removed)."""
    with numpy.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays.update(changes)
    numpy.savez_compressed(path, **{k: v for k, v in arrays.items()
                                    if v is not None})


@pytest.mark.parametrize('name,argv,file,damage,says', [
    ('mnist', ['-u', '8'], 'mnist/train.npz', _cut_short,
     'File is not a zip file'),
    ('mnist', ['-u', '8'], 'mnist/test.npz', _cut_short,
     'File is not a zip file'),
    ('mnist', ['-u', '8'], 'mnist/train.npz',
     lambda p: _rewritten(p, x=None), 'it holds no array x'),
    ('mnist', ['-u', '8'], 'mnist/test.npz',
     lambda p: numpy.savez(p, a=numpy.zeros(3)), 'it holds no array x'),
    ('mnist', ['-u', '8'], 'mnist/train.npz', _flip_a_byte,
     'x.npy fails its checksum'),
    ('mnist', ['-u', '8'], 'mnist/train.npz',
     lambda p: _rewritten(p, x=numpy.zeros((64, 100), numpy.uint8)),
     "x has shape (64, 100): images of 100 values, MNIST's have 784"),
    ('mnist', ['-u', '8'], 'mnist/train.npz',
     lambda p: _rewritten(p, y=numpy.arange(64, dtype=numpy.uint8)),
     'its labels run from 0 to 63, MNIST has 10 classes'),
    ('mnist', ['-u', '8'], 'mnist/train.npz',
     lambda p: _rewritten(p, y=numpy.zeros(3, numpy.uint8)),
     'y has shape (3,), x (64, 784): not one label per image'),
    ('mnist', ['-u', '8'], 'mnist/test.npz',
     lambda p: _rewritten(p, x=numpy.zeros((0, 784), numpy.uint8),
                          y=numpy.zeros(0, numpy.uint8)),
     'it holds no images'),
    ('cifar', [], 'cifar/cifar-10.npz', _cut_short,
     'File is not a zip file'),
    ('cifar', ['--dataset', 'cifar100'], 'cifar/cifar-100.npz',
     lambda p: _rewritten(p, test_y=None), 'it holds no array test_y'),
    # CIFAR's file holds both splits: the empty one is named.
    ('cifar', [], 'cifar/cifar-10.npz',
     lambda p: _rewritten(p, test_x=numpy.zeros((0, 3072), numpy.uint8),
                          test_y=numpy.zeros(0, numpy.uint8)),
     'its test split (test_x, test_y) holds no images'),
])
def test_damaged_dataset_cache_gives_clear_message(
        request, dataset_root, tmp_path, name, argv, file, damage, says):
    """A cache file cut short or not Chainer's: one message naming it,
    why, and what to do; the file is left as it was."""
    path = os.path.join(dataset_root, 'pfnet', 'chainer', *file.split('/'))
    damage(path)
    with open(path, 'rb') as f:
        before = f.read()
    out = tmp_path / 'out'
    with pytest.raises(SystemExit) as exc:
        request.getfixturevalue(name).main(argv + [
            '-b', '16', '-e', '1', '--noplot', '--out', str(out)])
    message = str(exc.value.code)
    dataset = os.path.basename(path).replace('-', '').upper()[:-4]
    assert message.startswith('Error: the {} cache file\n    {}\n'.format(
        'MNIST' if name == 'mnist' else dataset, path)), message
    assert says in message and 'Remove it' in message, message
    assert 'CHAINER_DATASET_ROOT' in message
    with open(path, 'rb') as f:
        assert f.read() == before
    assert not out.exists()


@pytest.mark.parametrize('how, error', [
    ('folder', 'Is a directory'), ('no permission', 'Permission denied')])
def test_a_cache_that_is_no_file_is_not_called_damaged(
        mnist, dataset_root, tmp_path, monkeypatch, how, error):
    """A folder, or (as another user) a file without read permission,
    under the cache's name was never read: no advice to look for damage,
    nothing removed. Root here reads any file, so for the second the
    archive's open fails with EACCES as it would."""
    path = os.path.join(dataset_root, 'pfnet', 'chainer', 'mnist',
                        'train.npz')
    if how == 'folder':
        os.remove(path)
        os.mkdir(path)
    else:
        real = data.zipfile.ZipFile

        def zip_file(file, *args, **kwargs):
            if os.path.abspath(str(file)) == os.path.abspath(path):
                raise PermissionError(13, error, file)
            return real(file, *args, **kwargs)
        monkeypatch.setattr(data.zipfile, 'ZipFile', zip_file)
    with pytest.raises(SystemExit) as exc:
        mnist.main(['-u', '8', '-b', '16', '-e', '1', '--noplot', '--out',
                    str(tmp_path / 'out')])
    message = str(exc.value.code)
    assert ('\n    {}\ncannot be read ({}): not a file this process may '
            'read (a folder, or no permission): check it.\n'
            'Remove it'.format(path, error)) in message, message
    assert 'damaged' not in message
    assert (os.path.isdir if how == 'folder' else os.path.isfile)(path)


def test_mnist_results_table(mnist, dataset_root, tmp_path, monkeypatch):
    results = importlib.import_module('examples.mnist.results')
    # Its trainers forked from tests/forked.py's server (Chainer imported
    # once); the diverged run's test keeps the real subprocess.
    monkeypatch.setattr(results, 'run_process', forked.script)
    out = str(tmp_path / 'results')
    argv = ['--batchsizes', '32', '--optimizers', 'momentum', 'lars',
            '--seeds', '0', '1', '--epoch', '1', '--out', out,
            '--dataset-root', dataset_root]
    results.main(argv)
    with open(os.path.join(out, 'results.md')) as f:
        md = f.read()
    with open(os.path.join(out, 'results.rst')) as f:
        rst = f.read()
    lines = md.splitlines()
    assert lines[2] == '| batch size | momentum | lars |'
    for batchsize, row in zip((32,), lines[4:5]):
        cells = row.strip('|').split('|')
        assert int(cells[0]) == batchsize
        for optimizer, cell in zip(('momentum', 'lars'), cells[1:]):
            runs = [os.path.join(out, 'b{}-{}-s{}'.format(
                batchsize, optimizer, seed)) for seed in (0, 1)]
            accuracies = [100 * read_log(run)[-1]['test/main/accuracy']
                          for run in runs]
            mean, low, high = cell.replace('(', ' ').replace(
                '-', ' ').replace(')', ' ').split()
            assert float(mean) == pytest.approx(
                sum(accuracies) / 2, abs=0.0051)
            assert float(low) == pytest.approx(min(accuracies), abs=0.0051)
            assert float(high) == pytest.approx(max(accuracies), abs=0.0051)
            for run in runs:
                assert not [name for name in os.listdir(run)
                            if name.startswith('snapshot')]
    # Each command with its run's folder: without it, each wrote into the
    # trainer's ./result, and the second command pasted was refused.
    for seed, command in ((0, 'python -m examples.mnist.train_mnist '
                           '--batchsize 32 --optimizer lars --epoch 1'),
                          (1, 'python -m examples.mnist.train_mnist '
                           '--batchsize 32 --optimizer lars --epoch 1 '
                           '--seed 1')):
        folder = os.path.join(out, 'b32-lars-s{}'.format(seed))
        command += ' -o {}\n'.format(shlex.quote(folder))
        assert command in md and command in rst
        assert mnist.parse_args(shlex.split(command)[3:],
                                paths=False).out == folder
    assert os.path.getsize(os.path.join(out, 'accuracy.png')) > 0
    # Done configurations are not run again.
    stamp = os.path.getmtime(os.path.join(out, 'b32-lars-s1', 'log'))
    results.main(argv)
    assert os.path.getmtime(os.path.join(out, 'b32-lars-s1', 'log')) == stamp

    # --same-as: one run again elsewhere gives the same log, but the time.
    again = str(tmp_path / 'again')
    one = ['--batchsizes', '32', '--optimizers', 'lars', '--seeds', '1',
           '--epoch', '1', '--dataset-root', dataset_root]
    results.main(one + ['--out', again])
    assert results.main(argv + ['--same-as', again]) == 0
    log_path = os.path.join(again, 'b32-lars-s1', 'log')
    with open(log_path) as f:
        log = json.load(f)
    log[-1]['elapsed_time'] += 1.0  # not compared
    log[-1]['lr'] *= 1 + 1e-15
    with open(log_path, 'w') as f:
        json.dump(log, f)
    assert results.main(argv + ['--same-as', again]) == 1
    assert results.main(['--batchsizes', '64', '--epoch', '1', '--out', out,
                         '--same-as', again]) == 2
    with pytest.raises(SystemExit):
        results.main(argv + ['--same-as', str(tmp_path / 'none')])


def test_mnist_results_takes_a_diverged_run_as_done(dataset_root,
                                                    tmp_path, capsys):
    """The trainer stops a diverged run with status 1 and its log: the
    sweep goes on, the table has its accuracy, and it is not run again."""
    results = importlib.import_module('examples.mnist.results')
    out = str(tmp_path / 'results')
    argv = ['--batchsizes', '16', '--optimizers', 'momentum', '--epoch',
            '3', '--flags=--lr 1e30 --unit 8', '--out', out,
            '--dataset-root', dataset_root]
    assert results.main(argv) == 0
    log = read_log(os.path.join(out, 'b16-momentum-s0'))
    assert [entry['epoch'] for entry in log] == [0, 1]
    assert not math.isfinite(log[-1]['main/loss'])
    printed = capsys.readouterr().out
    assert '  diverged: stopped after epoch 1 (' in printed
    assert '| 16 | {:.2f} |'.format(
        100 * log[-1]['test/main/accuracy']) in printed
    assert os.path.getsize(os.path.join(out, 'accuracy.png')) > 0
    results.main(argv)
    assert '$ python' not in capsys.readouterr().out
    assert results.main(argv[:-4] + ['--out', out, '--check', os.path.join(
        out, 'results.md')]) == 0


def test_mnist_results_commands_run_from_the_root(tmp_path, monkeypatch,
                                                  capsys):
    """The commands shown run the trainer as a module, from the repository
    root: wherever results.py runs, their -o is the run's folder from
    there, and the line printed here goes there first."""
    results = importlib.import_module('examples.mnist.results')
    monkeypatch.chdir(tmp_path)
    assert results.main(['--batchsizes', '32', '--optimizers', 'lars',
                         '--epoch', '1', '--out', 'mine', '--check']) == 2
    missing = capsys.readouterr().err.splitlines()[-1].strip()
    folder = str(tmp_path / 'mine' / 'b32-lars-s0')
    assert missing == '(cd {} && {})'.format(
        shlex.quote(REPO_ROOT), shlex.join(
            results.TRAINER + ['--batchsize', '32', '--optimizer', 'lars',
                               '--epoch', '1', '-o', folder]))
    # Folders under the root are shown from it (the README's
    # results_mnist/...), from any folder results.py runs in.
    monkeypatch.chdir(os.path.join(REPO_ROOT, 'examples', 'mnist'))
    assert results.shown_out('results_mnist') == os.path.join(
        'examples', 'mnist', 'results_mnist')
    assert results.shown_out(os.path.join(
        REPO_ROOT, 'results_mnist', 'b128-lars-s0')) == os.path.join(
            'results_mnist', 'b128-lars-s0')
    assert results.shown_out(str(tmp_path)) == str(tmp_path)
    args = argparse.Namespace(batchsizes=[32], optimizers=['lars'],
                              seeds=[0], epoch=1, flags=[], device='-1',
                              out='results_mnist')
    md, rst = results.tables(
        {(32, 'lars', 0): [{'epoch': 1, 'test/main/accuracy': 0.5}]}, args)
    line = ('python -m examples.mnist.train_mnist --batchsize 32 '
            '--optimizer lars --epoch 1 -o examples/mnist/results_mnist/'
            'b32-lars-s0')
    assert ('Commands (from the repository root, with '
            '`CHAINER_DATASET_ROOT` pointing at the MNIST cache):\n\n```\n'
            + line + '\n```') in md
    assert ('Commands (from the repository root, with '
            '``CHAINER_DATASET_ROOT`` pointing at the MNIST cache)::\n\n'
            '    ' + line + '\n') in rst


@pytest.mark.parametrize('flags', [
    '--batchsize 64', '--batch=64', '-b64', '--seed 1', '--epoch 2',
    '-o elsewhere', '--dataset-root x', '--lr -1', '--no-such-flag',
    '"--lr 0.5', '--optimizer momentum', '--trust-coefficient 0.05',
    '--test never', '--test=end'])
def test_mnist_results_refuses_bad_flags(dataset_root, tmp_path, capsys,
                                         flags):
    results = importlib.import_module('examples.mnist.results')
    out = tmp_path / 'results'
    with pytest.raises(SystemExit) as e:
        results.main(['--batchsizes', '32', '--epoch', '1', '--out',
                      str(out), '--flags=' + flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert '--flags {!r}'.format(flags) in err
    assert err.count('usage:') == 1  # the trainer's is left out
    if flags == '--lr -1':
        assert ('refuses them with --optimizer momentum --batchsize 32: '
                '--lr must be positive and finite') in err
    if flags == '--trust-coefficient 0.05':
        # Checked as each run gives them: lars takes it, momentum not.
        assert ('refuses them with --optimizer momentum --batchsize 32: '
                '--trust-coefficient is for --optimizer lars and '
                'momentum-lars, got --optimizer momentum') in err
    # Every run trained, then the table failed with a KeyError.
    if flags == '--test never':
        assert err.splitlines()[-1].endswith(
            "--flags '--test never': --test never evaluates the test set "
            'never, and results.py reads its accuracy (test/main/accuracy) '
            'after every epoch, for the table and accuracy.png; leave '
            '--test out')
    if flags == '--test=end':
        assert ('--test end evaluates the test set after the last epoch '
                'only') in err
    assert not out.exists()  # refused before anything ran


def test_mnist_results_checks_flags_without_the_trainers_out(
        dataset_root, tmp_path, monkeypatch):
    """The trainer's default --out, ./result, holds a run: results.py's
    runs never write there, so its --flags are not refused for it."""
    results = importlib.import_module('examples.mnist.results')
    monkeypatch.setattr(results, 'run_process', forked.script)
    _another_run(tmp_path / 'result')
    out = tmp_path / 'results'
    assert results.main(['--batchsizes', '32', '--optimizers', 'lars',
                         '--epoch', '1', '--dataset-root', dataset_root,
                         '--noplot', '--out', str(out),
                         '--flags', '-u 8 --lr 0.5']) == 0
    assert read_log(str(out / 'b32-lars-s0'))[-1]['epoch'] == 1
    assert sorted(p.name for p in (tmp_path / 'result').iterdir()) == [
        'log', 'loss_scale.png', 'notes.txt', 'snapshot_iter_74',
        'snapshot_iter_9']


def test_mnist_results_with_flags(dataset_root, tmp_path, capsys,
                                  monkeypatch):
    results = importlib.import_module('examples.mnist.results')
    monkeypatch.setattr(results, 'run_process', forked.script)
    plain, flagged = str(tmp_path / 'plain'), str(tmp_path / 'flagged')
    argv = ['--batchsizes', '32', '--optimizers', 'lars', '--epoch', '1',
            '--dataset-root', dataset_root, '--noplot']
    assert results.main(argv + ['--out', plain]) == 0
    assert results.main(argv + ['--out', flagged, '--flags',
                                '--lr 0.5  --warmup-epochs 0']) == 0
    with open(os.path.join(flagged, 'results.md')) as f:
        md = f.read()
    assert md.startswith('Test accuracy (%) of the MNIST MLP after 1 '
                         'epoch, each optimizer with --lr 0.5 '
                         '--warmup-epochs 0 (otherwise on its defaults).')
    assert ('python -m examples.mnist.train_mnist --batchsize 32 '
            '--optimizer lars --epoch 1 --lr 0.5 --warmup-epochs 0 -o {}'
            '\n'.format(shlex.quote(os.path.join(flagged, 'b32-lars-s0')))
            ) in md
    with open(os.path.join(flagged, 'b32-lars-s0.stdout')) as f:
        assert 'lars, lr 0.5,' in f.read()
    with open(os.path.join(flagged, 'flags')) as f:
        assert f.read() == '--epoch 1 --lr 0.5 --warmup-epochs 0\n'
    assert read_log(os.path.join(flagged, 'b32-lars-s0')) != read_log(
        os.path.join(plain, 'b32-lars-s0'))
    # The runs of another set of flags are not taken for these.
    capsys.readouterr()
    for out, flags, task in ((plain, '--lr 0.5', []),
                             (flagged, '--lr 0.25', []),
                             (flagged, '', []),
                             (flagged, '', ['--check']),
                             (flagged, '', ['--same-as', plain])):
        with pytest.raises(SystemExit):
            results.main(argv + ['--out', out, '--flags', flags] + task)
        assert '--out {}: its runs were made with'.format(
            out) in capsys.readouterr().err
    # Nor those of another --epoch: a run of 1 epoch is none of 2.
    longer = list(argv)
    longer[longer.index('--epoch') + 1] = '2'
    with pytest.raises(SystemExit):
        results.main(longer + ['--out', plain])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        '--out {}: its runs were made with --epoch 1 ({}), not --epoch 2; '
        'give another --out, or --epoch 1'.format(
            plain, os.path.join(plain, 'flags')))
    # The same flags again: nothing runs.
    log = os.path.join(flagged, 'b32-lars-s0', 'log')
    stamp = os.path.getmtime(log)
    assert results.main(argv + ['--out', flagged, '--flags',
                                '--lr 0.5 --warmup-epochs 0']) == 0
    assert os.path.getmtime(log) == stamp


def test_chainermn_defaults_are_the_single_process_ones(
        mnist, cifar, chainermn_example):
    multi, single = chainermn_example.parse_args([]), mnist.parse_args([])
    for name in ('warmup_epochs', 'decay_power', 'momentum', 'weight_decay',
                 'trust_coefficient', 'unit', 'epoch'):
        assert getattr(multi, name) == getattr(single, name), name
    multi = chainermn_example.parse_args(['--decay-power', '1'])
    assert multi.decay_power == 1
    multi = chainermn_example.parse_args(['--dataset', 'cifar100'])
    single = cifar.parse_args(['--dataset', 'cifar100'])
    for name in ('warmup_epochs', 'epoch', 'depth'):
        assert getattr(multi, name) == getattr(single, name), name


@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn'])
@pytest.mark.parametrize('flag,value,message', [
    ('--batchsize', '0', 'positive'),
    ('--epoch', '-1', 'positive'),
    ('--lr', '0', 'positive'),
    ('--lr', 'nan', 'positive'),
    ('--lr', 'inf', 'positive'),
    ('--decay-power', '0', 'positive'),
    ('--trust-coefficient', '-0.02', 'positive'),
    ('--warmup-epochs', '-1', 'at least 0'),
    ('--momentum', '-0.9', 'at least 0'),
    ('--weight-decay', '-1e-4', 'at least 0'),
    ('--snapshots', '-1', 'at least 0'),
    ('--momentum', '1', 'less than 1'),
    ('--momentum', '1.5', 'less than 1'),
    ('--seed', '-1', 'from 0 to'),
    ('--seed', str(2 ** 32), 'from 0 to'),
    # Finite in float64, but the optimizer computes in float32: inf there.
    ('--eps', '1e39', 'from 1.175e-38 to 3.403e+38 (the normal numbers of '
     'float32, in which the optimizer computes)'),
    ('--lr', '1e39', 'float32'),
    ('--weight-decay', '1e39', '0, or from 1.175e-38'),
    # 0 in float32, or a few digits.
    ('--trust-coefficient', '1e-40', 'float32'),
    ('--lr', '1e-46', 'float32'),
])
def test_flags_out_of_range_are_usage_errors(request, capsys, name, flag,
                                             value, message):
    """A usage error (exit status 2) naming the flag, not a traceback."""
    example = request.getfixturevalue(
        'chainermn_example' if name == 'chainermn' else name)
    with pytest.raises(SystemExit) as exc:
        example.parse_args(['{}={}'.format(flag, value)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert '{} must be'.format(flag) in err and message in err
    assert 'got {}'.format(value) in err or (
        'got {}'.format(float(value)) in err)


@pytest.mark.parametrize('name', ['mnist', 'chainermn_example'])
def test_unit_must_be_positive(request, capsys, name):
    err = usage_error(request.getfixturevalue(name).parse_args,
                      ['--unit', '0'], capsys)
    assert '--unit must be a positive integer, got 0' in err


def test_a_model_too_large_for_memory_is_a_usage_error(
        mnist, dataset_root, tmp_path, capsys, monkeypatch):
    """One line naming --unit, not NumPy's traceback, before the run in
    --out is removed by --overwrite: refused from its estimated size
    when the flags are checked, nothing allocated.

    10 ** 12 units: the first layer's 784 * 10 ** 12 weights are beyond
    any machine's address space.
    """
    monkeypatch.setattr(mnist, 'available_memory', lambda: 16 * 10 ** 9)
    out = tmp_path / 'result'
    out.mkdir()
    (out / 'log').write_text('another run')
    err = usage_error(mnist.main, [
        '-u', str(10 ** 12), '-b', '32', '-e', '1', '--noplot',
        '--dataset-root', dataset_root, '--out', str(out), '--overwrite'],
        capsys)
    assert 'Traceback' not in err
    assert err.splitlines()[-1].endswith(
        'error: --unit 1000000000000: the model does not fit in memory: '
        'its 1e+24 weights in float32 need about 1.2e+16 GB to be drawn '
        'and trained (weights, gradients, optimizer state, activations, '
        'the compiled update), beyond 16 GB available on the host '
        '(MemAvailable); give a smaller --unit'), err
    assert [p.name for p in out.iterdir()] == ['log']


@pytest.mark.parametrize('available', [None, 16 * 10 ** 9])
@pytest.mark.parametrize('unit', [10 ** 16, 10 ** 21])
def test_a_unit_beyond_the_address_space_is_a_usage_error(
        mnist, capsys, monkeypatch, unit, available):
    """Such sizes failed in NumPy with a traceback (``array is too big``,
    ``Maximum allowed dimension exceeded``) rather than a MemoryError;
    where the available memory is unknown, the address space is the
    limit."""
    monkeypatch.setattr(mnist, 'available_memory', lambda: available)
    err = usage_error(mnist.parse_args, ['-u', str(unit)], capsys)
    assert 'Traceback' not in err
    assert err.splitlines()[-1].split(': ', 1)[1].startswith(
        'error: --unit {}: the model does not fit in memory'.format(
            unit)), err
    assert ('the address space' if available is None
            else '16 GB available on the host') in err


@pytest.mark.parametrize('optimizer,dtype,needed', [
    ('lars', 'float32', 0.804), ('lamb', 'float32', 0.85),
    ('lars', 'float16', 0.595)])
def test_a_model_beyond_the_available_memory_is_a_usage_error(
        mnist, capsys, monkeypatch, optimizer, dtype, needed):
    """A model whose arrays each fit but not all together (the process was
    killed by the kernel, without a word): refused from its estimate
    against MemAvailable, here a fake 0.5 GB, nothing allocated.

    3000 units, 8192 a batch: 12 bytes a weight in float32 with one
    state (lars), 16 with two (lamb), 2 + 2 + 4 + 4 in float16; the
    compiled update (0.15 GB, 0.2 in 16 bits); and the activations
    alive in the backward pass, the batch and 5 arrays of 8192 x 3000
    (test_the_footprint_counts_what_a_run_holds)."""
    monkeypatch.setattr(mnist, 'available_memory', lambda: 5 * 10 ** 8)
    err = usage_error(mnist.parse_args, [
        '-u', '3000', '--optimizer', optimizer, '--dtype', dtype], capsys)
    assert err.splitlines()[-1].endswith(
        'error: --unit 3000: the model does not fit in '
        'memory: its 1.14e+07 weights in {} need about {:.3g} GB to be '
        'drawn and trained (weights, gradients, optimizer state, '
        'activations, the compiled update), beyond 0.5 GB available on the '
        'host (MemAvailable); give a smaller --unit'.format(dtype, needed)
    ), err
    # What fits, and where the memory is unknown, is not refused.
    assert mnist.parse_args(['-u', '100']).unit == 100
    monkeypatch.setattr(mnist, 'available_memory', lambda: None)
    assert mnist.parse_args(['-u', '3000']).unit == 3000


@pytest.mark.parametrize('model,kept,alive', [
    ('mlp', 2, 5), ('mlp-bn', 4, 9)])
@pytest.mark.parametrize('optimizer,states,temporaries,compiled', [
    ('lars', 1, 0, True), ('nesterov', 1, 0, True),
    ('momentum-lars', 1, 1.5, True), ('lamb', 2, 0, True),
    ('adam', 2, 5, False), ('momentum', 1, 1.5, False)])
@pytest.mark.parametrize('dtype,size', [
    ('float32', 4), ('mixed16', 2), ('float16', 2)])
@pytest.mark.parametrize('unit,batch', [(8000, 256), (4000, 8192)])
def test_the_footprint_counts_what_a_run_holds(
        mnist, model, kept, alive, optimizer, states, temporaries, compiled,
        dtype, size, unit, batch):
    """``footprint``, written out: the weights (and, in 16 bits, their
    float32 master copies), their gradients, the optimizer's states, the
    compiled update of chainer_lars's optimizers, then the larger of the
    backward pass's activations and the update's temporaries (arrays of
    the largest weight, l2's, in float32; in 16 bits, its float32
    gradient and a new 16-bit copy too) beside the activations kept for
    the backward pass. Measured on MNIST's trainer, one to two updates,
    each was at most this (benchmarks/measured/mnist_memory_estimate.txt);
    the estimate before missed the compiled update, the temporaries,
    BatchNorm's activations and those in flight, up to 2.3 times from
    --unit 2000 up (three times at 1000, more below)."""
    args = mnist.parse_args([
        '-u', str(unit), '-b', str(batch), '--model', model,
        '--optimizer', optimizer, '--dtype', dtype], paths=False)
    weights, needed, got_dtype, drawn = mnist.footprint(args)
    assert weights == (784 + unit + 10 + 8) * unit + 10
    assert got_dtype == numpy.dtype('float{}'.format(8 * size))
    assert drawn == size * weights + 8 * unit * unit
    half = size == 2
    held = ((2 * size + 4 * half + 4 * states) * weights
            + (({4: 0.15, 2: 0.2}[size] * 10 ** 9) if compiled else 0))
    if model == 'mlp-bn' and dtype == 'mixed16':  # BatchNorm in float32
        kept, alive = 4, 12
    activations = [batch * (784 + n * unit) * size for n in (kept, alive)]
    update = activations[0] + 4 * unit * unit * (temporaries + 1.5 * half)
    assert needed == max(drawn, held + max(activations[1], update))
    # At least the weights, their gradients and the states, and a batch's
    # five (mlp) or nine (mlp-bn) arrays of batch x unit.
    assert needed >= (2 * size + 4 * states) * weights + (
        alive * batch * unit * size)
    if model == 'mlp':  # ChainerMN's trainer: the MLP, without --model
        del args.model
        assert mnist.footprint(args)[1] == needed


def test_a_device_run_is_checked_against_the_host_for_its_drawing(
        mnist, capsys, monkeypatch):
    """On a GPU the host draws the weights (in float64 first) and the
    device trains them: the training's estimate against the host's
    memory refused runs that fit."""
    monkeypatch.setattr(mnist, 'available_memory', lambda: 6 * 10 ** 9)
    monkeypatch.setattr(mnist.cli, 'check_device', lambda *a, **k: None)
    real = chainer.get_device
    monkeypatch.setattr(chainer, 'get_device', lambda spec: (
        types.SimpleNamespace(xp=None) if spec == '@cupy:0' else real(spec)))
    args = ['-u', '20000', '--optimizer', 'lamb']
    assert 'beyond 6 GB available' in usage_error(
        mnist.parse_args, args, capsys)
    _, needed, _, drawn = mnist.footprint(mnist.parse_args(
        args + ['-d', '@cupy:0']))
    assert drawn < 6 * 10 ** 9 < needed
    monkeypatch.setattr(mnist, 'available_memory', lambda: 10 ** 9)
    err = usage_error(mnist.parse_args, args + ['-d', '@cupy:0'], capsys)
    assert ('need about {:.3g} GB to be drawn on the host (the device trains '
            'them), beyond 1 GB'.format(drawn / 1e9)) in err, err


def test_available_memory_is_linux_memavailable(mnist):
    available = mnist.available_memory()
    if not os.path.exists('/proc/meminfo'):
        assert available is None
        return
    with open('/proc/meminfo') as f:
        assert available > 0 and 'MemAvailable' in f.read()


@pytest.mark.parametrize('name,argv', [
    ('mnist', ['--epoch', '1', '--warmup-epochs', '5']),
    ('cifar', ['--epoch', '2', '--warmup-epochs', '2.5']),
    ('chainermn_example', ['--epoch', '1', '--warmup-epochs', '5']),
    ('chainermn_example', ['--dataset', 'cifar10', '--epoch', '2',
                           '--warmup-epochs', '3']),
])
def test_warmup_longer_than_the_run_is_refused(request, capsys, name,
                                               argv):
    err = usage_error(request.getfixturevalue(name).parse_args, argv,
                      capsys)
    assert '--warmup-epochs {:g} is longer than the run (--epoch {})'.format(
        float(argv[-1]), argv[argv.index('--epoch') + 1]) in err


def test_default_warmup_longer_than_the_run_is_the_run(
        cifar, chainermn_example, capsys):
    """CIFAR's default warm-up of 5 epochs, on a 2-epoch run: said so."""
    for example, argv in ((cifar, []), (chainermn_example,
                                        ['--dataset', 'cifar10'])):
        args = example.parse_args(argv + ['--epoch', '2'])
        assert args.warmup_epochs == 2
        args.lr = 1.0  # ChainerMN's follows from the number of processes
        cli.print_banner(args)
        assert ('warm-up 2 epochs (the whole run: the default, 5, is '
                'longer)') in capsys.readouterr().out
        assert example.parse_args(argv + ['--epoch', '6']).warmup_epochs == 5
        assert example.parse_args(argv + ['--epoch', '1', '--warmup-epochs',
                                          '1']).warmup_epochs == 1


@pytest.mark.parametrize('epoch,warmup,batch,n_train,expected', [
    (1, 1, 8192, 60000, (8, 8)),  # the whole run: round gave 7 of 8
    (2, 2, 8192, 60000, (15, 15)),
    (10, 0.5, 8192, 60000, (4, 74)),  # the Quick start's, as before
    (1, 0.5, 8192, 60000, (4, 8)),
    (2, 1, 256, 50000, (195, 391)),  # a part of the run: round
    # Exact multiples: the float ceil of 15 * (50000 / 3000) gave 251.
    (15, 15, 3000, 50000, (250, 250)),
    (15, 1, 3000, 50000, (17, 250)),
    (30, 5, 1500, 50000, (167, 1000)),
])
def test_schedule_s_warmup_of_the_whole_run_peaks_at_the_last_update(
        mnist, epoch, warmup, batch, n_train, expected):
    """examples/README.md: a warm-up as long as the run rises to the peak
    at the last update; the run has ceil(epoch * n_train / batch) of them,
    counted exactly (the trainer stops after that many)."""
    args = mnist.parse_args(['-e', str(epoch), '--warmup-epochs',
                             str(warmup), '--lr', '1', '-b', str(batch)])
    shift = recipe.schedule(args, n_train)
    assert (shift._warmup_count, shift._max_count) == expected


@pytest.mark.parametrize('optimizer', ['lars', 'momentum-lars', 'momentum',
                                       'lamb', 'adam'])
def test_banner_names_a_trust_coefficient_only_for_lars(mnist, capsys,
                                                        optimizer):
    cli.print_banner(mnist.parse_args(['--optimizer', optimizer]))
    out = capsys.readouterr().out
    assert ('trust coefficient 0.02' in out) == (
        optimizer in ('lars', 'momentum-lars'))
    # Adam's and LAMB's rate is alpha.
    assert (', alpha ' in out) == (optimizer in ('lamb', 'adam'))


@pytest.mark.parametrize('optimizer', ['lamb', 'adam'])
def test_adam_and_lamb_take_the_recipe_s_flags_and_exclusions(
        mnist, optimizer):
    args = mnist.parse_args(['--optimizer', optimizer, '--lr', '0.03',
                             '--momentum', '0.8', '--weight-decay', '0.01'])
    model = chainer.links.Classifier(mnist.MLP(784, 4, 10))
    opt, observed = recipe.make_optimizer(args, model)
    assert (opt.alpha, opt.beta1, opt.weight_decay_rate) == (0.03, 0.8, 0.01)
    assert (observed is opt) == (optimizer == 'lamb')
    for path, param in model.namedparams():
        rule = param.update_rule
        decayed = not path.endswith('/b')
        if optimizer == 'adam':
            assert rule.hyperparam.weight_decay_rate == 0.01 * decayed
        else:
            assert (rule.uses_weight_decay, rule.uses_adaptation) == (
                decayed, decayed)
    assert recipe.schedule(args, 60000)._attr == 'alpha'


@pytest.mark.parametrize('flags,says', [
    ([], 'lr * trust coefficient = 0.005 * sqrt(8192 / 256) = 0.0283'),
    (['--optimizer', 'momentum-lars', '-b', '1024'],
     'lr * trust coefficient = 0.005 * sqrt(1024 / 256) = 0.01'),
    (['--optimizer', 'momentum'], 'linear scaling: 0.1 * 8192 / 256 = 3.2'),
    (['--lr', '1'], None),
])
def test_banner_says_where_the_rate_comes_from(mnist, capsys, flags, says):
    """The rate the trainer prints is not LARS()'s default: the banner
    says which rule made it, and how LARS()'s defaults (momentum-lars:
    the hook's starting point) compare."""
    cli.print_banner(mnist.parse_args(flags))
    out = capsys.readouterr().out
    if says is None:
        assert 'lr from the batch size' not in out
    else:
        assert says in out
    # Each LARS form's starting point (momentum-lars: the hook's).
    assert ("LARS()'s defaults, lr=2.0 and trust_coefficient=1e-3" in out
            ) == (says is not None and 'trust' in says and not flags)
    assert ("MomentumSGD(lr=0.002) and GradientLARS()'s default "
            'trust_coefficient=1 make a step of 0.002' in out) == (
                'momentum-lars' in flags)


@pytest.mark.parametrize('flags', [[], ['--validation', '100'],
                                   ['--validation', '100', '--test',
                                    'never'], ['--test', 'never']])
def test_banner_names_the_test_and_the_validation_set(mnist, capsys, flags):
    cli.print_banner(mnist.parse_args(flags))
    out = capsys.readouterr().out
    assert ('test/main/...: the test set' in out) == ('never' not in flags)
    assert ('val/main/...: the validation set, the last 100 training '
            'images (--validation)' in out) == ('100' in flags)
    [line] = [line for line in out.splitlines()
              if line.startswith('# reported: ')]
    assert line.startswith('# reported: main/...: the training batches')
    assert not line.endswith(('; ', ';')), line  # it ended "; " alone


def test_test_never_prints_no_test_columns(mnist, dataset_root, tmp_path,
                                           capsys):
    """The console's table has no test/main columns where nothing fills
    them, and the validation's where --validation fills them."""
    mnist.main(['--dataset-root', dataset_root, '-b', '10', '-u', '8', '-e',
                '1', '--validation', '20', '--test', 'never', '--noplot',
                '--progress', 'lines', '--out', str(tmp_path / 'out')])
    out = capsys.readouterr().out
    [head] = [line for line in out.splitlines()
              if line.startswith('epoch ')]
    assert head.split() == ['epoch', 'main/loss', 'main/accuracy',
                            'val/main/accuracy', 'lr', 'elapsed_time']


@pytest.mark.parametrize('optimizer,why', [
    ('nesterov', 'always Nesterov: leave --nesterov out'),
    ('momentum', 'it has no Nesterov momentum'),
    ('momentum-lars', 'it has no Nesterov momentum'),
    ('adam', 'it has no Nesterov momentum'),
])
def test_nesterov_flag_says_why_it_does_not_apply(mnist, capsys, optimizer,
                                                  why):
    err = usage_error(mnist.parse_args, ['--optimizer', optimizer,
                                         '--nesterov'], capsys)
    assert err.splitlines()[-1].endswith(
        'error: --nesterov is for --optimizer lars, got --optimizer {} ({})'
        .format(optimizer, why)), err


@pytest.mark.parametrize('device', ['-1', '@cupy:0'])
def test_chainermn_refuses_an_unknown_communicator_on_any_device(
        chainermn_example, capsys, device):
    """At parsing, before the device is looked at: on a GPU, ChainerMN's
    create_communicator raised a ValueError traceback."""
    err = usage_error(chainermn_example.parse_args, [
        '--device', device, '--communicator', 'bogus'], capsys)
    line = err.splitlines()[-1]
    # argparse's quoting of the choices varies with the Python version.
    assert 'error: argument --communicator: invalid choice: ' in line, err
    assert re.findall(r'\w+', line.split('choose from')[1]) == [
        'naive', 'flat', 'non_cuda_aware', 'pure_nccl'], err
    assert chainermn_example.parse_args([
        '--device', '-1', '--communicator', 'naive']).communicator == 'naive'


@pytest.mark.parametrize('depth', ['21', '2', '-4', '1208', '6000000002'])
def test_cifar_depth_must_be_6n_plus_2(cifar, capsys, depth):
    """Refused at parsing, a huge depth too (it would build its layers
    until memory ran out)."""
    with pytest.raises(SystemExit) as exc:
        cifar.parse_args(['--depth', depth])
    assert exc.value.code == 2
    assert ("--depth must be 6n + 2 (8, 14, 20, ..., 1202: He et al.'s "
            'deepest), got {}'.format(depth)) in capsys.readouterr().err
    with pytest.raises(ValueError, match='^depth must be 6n'):
        cifar.ResNet(int(depth), 10)
    assert cifar.parse_args(['--depth', '1202']).depth == 1202


def test_mlp_has_no_batchnorm_to_all_reduce(chainermn_example, capsys):
    with pytest.raises(SystemExit) as exc:
        chainermn_example.parse_args(['--batchnorm', 'all-reduced'])
    assert exc.value.code == 2
    assert 'the MLP of --dataset mnist has no BatchNorm' in (
        capsys.readouterr().err)


@pytest.mark.parametrize('flags,message', [
    (['--depth', '8'], '--depth 8: the MLP of --dataset mnist has no depth '
     '(--depth is for --dataset cifar10 and cifar100, the ResNet)'),
    (['--dataset', 'mnist', '--batchnorm', 'per-process'],
     '--batchnorm per-process: the MLP of --dataset mnist has no BatchNorm '
     '(--batchnorm is for --dataset cifar10 and cifar100, the ResNet)'),
    (['--dataset', 'cifar10', '--unit', '1000'], '--unit 1000: the ResNet of '
     '--dataset cifar10 has no hidden units to set (--unit is for --dataset '
     'mnist, the MLP)'),
    (['--dataset', 'cifar100', '-u', '16'], '--unit 16: the ResNet of '
     '--dataset cifar100 has no hidden units to set'),
])
def test_chainermn_refuses_a_flag_its_dataset_does_not_use(
        chainermn_example, capsys, flags, message):
    """Ignored, a flag of the other dataset's model was recorded all the
    same: a resume with another value of it was refused for a difference
    that the run never had. The default value given is refused too."""
    err = usage_error(chainermn_example.parse_args, flags, capsys)
    assert err.splitlines()[-1].split(': error: ', 1)[1].startswith(
        message), err


@pytest.mark.parametrize('dataset,unused', [
    ('mnist', ('depth', 'batchnorm')), ('cifar10', ('unit',)),
])
def test_chainermn_records_only_its_dataset_s_flags(
        chainermn_example, dataset, unused):
    args = chainermn_example.parse_args(['--dataset', dataset])
    assert (args.unit, args.depth, args.batchnorm) == (
        1000, 20, 'per-process')
    recorded = cli.run_settings(args)
    assert not set(unused) & set(recorded)
    assert {'unit', 'depth', 'batchnorm'} - set(unused) <= set(recorded)


@pytest.mark.parametrize('written,resumed', [
    (['--dataset', 'cifar10', '--depth', '8'], []),
    ([], ['--dataset', 'cifar10']),
])
def test_chainermn_resume_with_the_other_dataset_names_the_dataset(
        chainermn_example, tmp_path, capsys, written, resumed):
    """A snapshot records its own model's flags only: resumed with the
    other --dataset (forgotten: mnist is the default), it was refused as
    another trainer's for the flag it lacks (--unit, --batchnorm)."""
    args = chainermn_example.parse_args(written)
    snapshot = str(tmp_path / 'snapshot_iter_2')
    with open(snapshot, 'wb') as f:
        numpy.savez(f, **{
            cli.RunSettings.prefix + name: numpy.asarray(value)
            for name, value in cli.run_settings(args, processes=2).items()})
    args = chainermn_example.parse_args(resumed + ['--resume', snapshot])
    with pytest.raises(SystemExit) as exc:
        cli.check_resume(args, processes=2)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert '--resume {}: the snapshot was written with --dataset {}, ' \
        'this run has {}'.format(snapshot, *(
            ('cifar10', 'mnist') if written else ('mnist', 'cifar10'))) in err


def usage_error(main, argv, capsys):
    """The message of the usage error ``main(argv)`` stops with."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize('flags,message', [
    (['--device', 'foo'], '--device foo: '),
    (['--device', '@nosuchmodule:0'], '--device @nosuchmodule:0: '),
    (['--resume', 'nowhere/snapshot_iter_7'],
     '--resume nowhere/snapshot_iter_7: no such file'),
    (['--resume', ''], "--resume '': no such file"),
    pytest.param(['--device', '3'], '--device 3: ', marks=pytest.mark.skipif(
        chainer.backends.cuda.available, reason='CuPy can use CUDA here')),
    pytest.param(['--device', '@cupy:0'], '--device @cupy:0: ',
                 marks=pytest.mark.skipif(chainer.backends.cuda.available,
                                          reason='CuPy can use CUDA here')),
])
@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn_example'])
def test_bad_flags_stop_before_any_work(request, tmp_path, capsys, name,
                                        flags, message):
    """A usage error naming the flag, before the data is loaded.

    The dataset root is empty: loading the data first would stop with the
    missing dataset (exit status 1) instead.
    """
    main = request.getfixturevalue(name).main
    out = tmp_path / 'out'
    err = usage_error(main, flags + ['--dataset-root', str(tmp_path),
                                     '--out', str(out)], capsys)
    assert message in err and 'usage:' in err
    assert 'Traceback' not in err
    assert not out.exists()


@pytest.mark.parametrize('flag,path,message', [
    ('--out', 'file', 'not a folder'),
    ('--out', 'file/x', '{tmp}/file is not a folder'),
    pytest.param('--out', '/proc/x', 'cannot make the folder',
                 marks=pytest.mark.skipif(not os.path.isdir('/proc'),
                                          reason='no /proc')),
    ('--dataset-root', 'nowhere', 'no such folder'),
    ('--dataset-root', 'file', 'not a folder'),
    ('--resume', '.', 'not a file'),
])
@pytest.mark.parametrize('name', ['mnist', 'cifar'])
def test_bad_paths_stop_before_any_work(request, tmp_path, capsys, name,
                                        flag, path, message):
    """One line naming the flag and the problem, before the data loads.

    The dataset root given otherwise is empty: loading the data first
    would stop with the missing dataset (exit status 1) instead.
    """
    (tmp_path / 'file').write_text('mine')
    if not os.path.isabs(path):
        path = str(tmp_path / path)
    argv = ['--out', str(tmp_path / 'out'), '--dataset-root', str(tmp_path)]
    err = usage_error(request.getfixturevalue(name).main,
                      argv + [flag, path], capsys)
    assert 'error: {} {}: {}'.format(flag, path, message.format(
        tmp=tmp_path)) in err.splitlines()[-1], err
    assert 'Traceback' not in err
    assert not (tmp_path / 'out').exists()
    assert (tmp_path / 'file').read_text() == 'mine'
    assert not os.path.exists(os.path.join(tmp_path, 'file', 'x'))


@pytest.mark.parametrize('flag', ['--out', '--dataset-root'])
@pytest.mark.parametrize('snapshots', ['1', '0'])
def test_an_empty_path_is_a_usage_error(mnist, dataset_root, tmp_path,
                                        capsys, flag, snapshots):
    """``-o ''`` passed the checks as the current folder, where the run
    then wrote its log and snapshot before a FileNotFoundError (or, with
    --snapshots 0, replaced the log of the run there without a word)."""
    (tmp_path / 'log').write_text('mine')  # the current folder's run
    argv = ['--out', str(tmp_path / 'out'), '--dataset-root', dataset_root,
            '-b', '32', '-u', '8', '-e', '1', '--noplot', '--snapshots',
            snapshots]
    err = usage_error(mnist.main, argv + [flag, ''], capsys)
    assert err.splitlines()[-1].endswith(
        "error: {} '': an empty path names no folder (. is the current "
        'one)'.format(flag)), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['datasets', 'log']
    assert (tmp_path / 'log').read_text() == 'mine'


def test_mnist_results_refuses_an_empty_out(tmp_path, capsys):
    results = importlib.import_module('examples.mnist.results')
    with pytest.raises(SystemExit) as e:
        results.main(['--batchsizes', '32', '--epoch', '1', '--out', ''])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --out '': an empty path names no folder (. is the current "
        'one)')
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('root, words', [
    ('', "'': an empty path names no folder"),
    ('nowhere', 'nowhere: '),
])
def test_mnist_results_refuses_a_bad_dataset_root_first(tmp_path, capsys,
                                                        root, words):
    # Each run refused it, but after <out>/flags was written and the
    # first run had started.
    results = importlib.import_module('examples.mnist.results')
    out = tmp_path / 'out'
    with pytest.raises(SystemExit) as e:
        results.main(['--batchsizes', '32', '--epoch', '1', '--out',
                      str(out), '--flags=--lr 0.5', '--dataset-root',
                      str(tmp_path / root) if root else root])
    assert e.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert 'error: --dataset-root ' in line and words in line, line
    assert not out.exists()


def test_batch_norm_after_a_linear_layer_refuses_batches_of_one(
        mnist, capsys):
    # Chainer only warned, at every update, that the output is zero.
    err = usage_error(mnist.parse_args, ['--model', 'mlp-bn', '-b', '1'],
                      capsys)
    assert err.splitlines()[-1].endswith(
        'error: --batchsize 1: the model normalises each feature over the '
        'batch (BatchNormalization after a fully connected layer), and a '
        'batch of one sample gives zeros: give at least 2'), err


@pytest.mark.parametrize('name, argv', [
    ('cifar', []),
    ('chainermn_example', ['--dataset', 'cifar10']),
    ('chainermn_example', ['--dataset', 'cifar100']),
])
def test_resnets_take_batches_of_one(request, name, argv):
    """Every BatchNorm of the ResNets follows a convolution: each channel
    is normalised over the batch, height and width, which one image of
    32x32 pixels has many of (the check refused them too)."""
    example = request.getfixturevalue(name)
    assert example.parse_args(argv + ['-b', '1']).batchsize == 1


def test_a_resnet_trains_on_batches_of_one(cifar, dataset_root, tmp_path):
    out = str(tmp_path / 'out')
    with warnings.catch_warnings():
        # Chainer's, for a batch it would normalise to zeros.
        warnings.filterwarnings('error', message='.*zero tensor')
        # 32 training images, 30 held out: 2 updates of one image.
        cifar.main(['--dataset-root', dataset_root, '-b', '1', '--depth',
                    '8', '-e', '1', '--validation', '30', '--test', 'never',
                    '--noplot', '--out', out])
    log = read_log(out)
    assert log[-1]['iteration'] == 2
    for key in ('main/loss', 'val/main/loss',
                'lars/ratio/predictor/res3/0/conv1/W'):
        assert math.isfinite(log[-1][key]), key


def test_the_plain_mlp_takes_batches_of_one(mnist):
    assert mnist.parse_args(['-b', '1']).batchsize == 1


@pytest.mark.skipif(chainer.backends.cuda.available,
                    reason='CuPy can use CUDA here')
def test_gpu_without_cupy_is_one_clear_line(mnist, capsys):
    err = usage_error(mnist.parse_args, ['--device', '@cupy:0'], capsys)
    line = err.splitlines()[-1]
    assert line.startswith(os.path.basename(sys.argv[0]) + ': error: '
                           '--device @cupy:0: CuPy cannot be used (')
    # Chainer's message ran "...#installation).No module named 'cupy'".
    assert ').' not in line and '\n' not in line


@pytest.mark.gpu
def test_device_beyond_the_gpus_is_a_usage_error(mnist, tmp_path, capsys):
    count = chainer.backends.cuda.cupy.cuda.runtime.getDeviceCount()
    err = usage_error(mnist.main, ['--device', str(count), '--dataset-root',
                                   str(tmp_path)], capsys)
    assert '--device {}: no such GPU, this machine has {}'.format(
        count, count) in err


@pytest.mark.parametrize('name,batchsize,n_train', [
    ('mnist', 65, 64), ('cifar', 33, 32)])
def test_batch_larger_than_the_training_set_is_a_usage_error(
        request, dataset_root, tmp_path, capsys, name, batchsize, n_train):
    out = tmp_path / 'out'
    err = usage_error(request.getfixturevalue(name).main,
                      ['-b', str(batchsize), '--out', str(out)], capsys)
    assert '--batchsize {} is larger than the training set ({} examples)' \
        .format(batchsize, n_train) in err
    assert not out.exists()


def test_a_batch_larger_than_what_validation_leaves_says_so(
        cifar, dataset_root, tmp_path, capsys):
    """With --validation 28 of 32 images, "--batchsize 8 is larger than
    the training set (4 examples)" left the user to count: it says where
    the rest went."""
    out = tmp_path / 'out'
    err = usage_error(cifar.main, ['-b', '8', '--validation', '28',
                                   '--out', str(out)], capsys)
    assert ('--batchsize 8 is larger than the training set (4 examples, '
            'the rest held out by --validation 28)') in err, err
    assert not out.exists()
    err = usage_error(cifar.main, ['-b', '2', '--validation', '31',
                                   '--out', str(out)], capsys)
    assert ('--batchsize 2 is larger than the training set (1 example, '
            'the rest held out by --validation 31)') in err, err


@pytest.mark.parametrize('name,flags,says', [
    # MNIST's default warm-up, 0.5, fits a 2-epoch run.
    ('mnist', ['-b', '32', '-u', '8'],
     'written with --warmup-epochs 1.0, this run has 0.5 (not given: the '
     'default; give --warmup-epochs 1.0)'),
    # CIFAR's, 5, is the whole run.
    ('cifar', ['-b', '16', '--depth', '8'],
     'written with --warmup-epochs 1.0, this run has 2 (not given: the '
     'default, the whole run; give --warmup-epochs 1.0)'),
])
def test_resume_without_the_warmup_given_says_the_default_was_taken(
        request, dataset_root, tmp_path, capsys, name, flags, says):
    """'this run has 2', where the user gave no --warmup-epochs, read as
    a value typed: it says the default was taken, and what to give."""
    main = request.getfixturevalue(name).main
    args = flags + ['-e', '2', '--noplot', '--progress', 'none']
    run = tmp_path / 'run'
    main(args + ['--warmup-epochs', '1', '--out', str(run),
                 '--snapshots', '2'])
    capsys.readouterr()
    snapshot = cli.snapshots_in(str(run))[0]
    # Another --out: the run in its own went on past it.
    err = usage_error(main, args + ['--resume', snapshot, '--out',
                                    str(tmp_path / 'resumed')], capsys)
    assert says in err, err


def test_resume_with_the_banner_s_rounded_lr_says_so(
        mnist, mnist_snapshot, tmp_path, capsys):
    """The banner prints the rate to 6 digits (lr 0.0883883); pasted into
    --lr on --resume it was refused with no hint: the refusal says to
    leave --lr out, or give the whole value, with which it resumes."""
    snapshot, args = mnist_snapshot
    cli.print_banner(mnist.parse_args(args + ['--out', str(tmp_path / 'x')]))
    lr = re.search(r', lr (\S+), ', capsys.readouterr().out).group(1)
    exact = 0.005 * math.sqrt(32 / 256) / 0.02
    assert float(lr) != exact
    out = str(tmp_path / 'resumed')
    err = usage_error(mnist.main, args + [
        '--resume', snapshot, '--out', out, '--lr', lr], capsys)
    assert ('this run has {} (the banner rounds the rate to 6 digits: '
            'leave --lr out if the run was started without it, or give '
            '--lr {!r})'.format(float(lr), exact)) in err, err
    mnist.main(args + ['--resume', snapshot, '--out', out,
                       '--lr', repr(exact)])
    assert read_log(out)[-1]['epoch'] == 2


def test_resume_refuses_another_schedule(mnist, dataset_root, tmp_path,
                                         capsys):
    """The snapshot records the flags of the schedule; --resume keeps them.

    With another --epoch the schedule would be another curve: at the end
    of a 2-epoch run the rate is about 0, where a 3-epoch run is still at
    about a third of its peak.
    """
    args = ['-b', '32', '-u', '8', '--noplot', '--warmup-epochs', '1']
    out = tmp_path / 'run'
    mnist.main(args + ['-e', '2', '--out', str(out)])
    snapshot = str(out / 'snapshot_iter_4')
    capsys.readouterr()
    for flags, message in [
            (['-e', '3'], 'written with --epoch 2, this run has 3'),
            (['-e', '2', '--warmup-epochs', '0.5'],
             'written with --warmup-epochs 1.0, this run has 0.5'),
            (['-e', '2', '--lr', '0.5'], 'written with --lr {}'.format(
                0.005 * math.sqrt(32 / 256) / 0.02))]:
        err = usage_error(mnist.main, args + flags + [
            '--resume', snapshot, '--out', str(tmp_path / 'resumed')],
            capsys)
        assert message in err and 'start a new run' in err, err
        assert not (tmp_path / 'resumed').exists()

    (tmp_path / 'text').write_text('not a snapshot')
    numpy.savez(str(tmp_path / 'other.npz'), x=numpy.zeros(1))
    # Cut short, as by a copy that did not finish.
    with open(snapshot, 'rb') as f:
        (tmp_path / 'truncated').write_bytes(
            f.read(os.path.getsize(snapshot) // 2))
    for path, message in [('text', 'not a snapshot, or a damaged one'),
                          ('truncated', 'not a snapshot, or a damaged one'),
                          ('other.npz', 'not a snapshot of these examples')]:
        err = usage_error(mnist.main, ['--resume', str(tmp_path / path)],
                          capsys)
        assert message in err
        assert 'Traceback' not in err and len(err.splitlines()) == 1, err


@pytest.fixture
def mnist_snapshot(mnist, dataset_root, tmp_path_factory):
    """A snapshot of epoch 1 of a 2-epoch MNIST run, and the run's flags."""
    args = ['-b', '32', '-u', '8', '--noplot', '--warmup-epochs', '1', '-e',
            '2', '--optimizer', 'lars']
    out = tmp_path_factory.mktemp('run')
    mnist.main(args + ['--out', str(out), '--snapshots', '2'])
    return str(out / 'snapshot_iter_2'), args


def test_resume_of_another_schedule_s_count_is_a_usage_error(
        mnist, mnist_snapshot, tmp_path, capsys):
    """A snapshot whose schedule counts its warm-up otherwise (before
    0.3.0, a warm-up of the whole run ended an update early): the
    schedule's own refusal ended in a traceback; a usage error says it."""
    snapshot, args = mnist_snapshot
    with numpy.load(snapshot) as npz:
        entries = dict(npz)
    key, = [k for k in entries if k.endswith('/warmup_count')]
    entries[key] = entries[key] - 1
    edited = str(tmp_path / 'edited.npz')
    numpy.savez(edited, **entries)
    err = usage_error(mnist.main, args + [
        '--resume', edited, '--out', str(tmp_path / 'resumed')], capsys)
    last = err.splitlines()[-1]
    assert 'error: --resume {}: the snapshot was written with warmup_count='\
        .format(edited) in last and 'before 0.3.0' in last, err
    assert 'Traceback' not in err


@pytest.mark.parametrize('flags,message', [
    # LARS and MomentumSGD both keep a buffer named v: the snapshot would
    # load into the other optimizer. Named, not the --lr it changes.
    (['--optimizer', 'momentum-lars'],
     'written with --optimizer lars, this run has momentum-lars'),
    (['--optimizer', 'momentum'],
     'written with --optimizer lars, this run has momentum'),
    (['--unit', '16'], 'written with --unit 8, this run has 16'),
    (['--seed', '5'], 'written with --seed 0, this run has 5'),
    (['--momentum', '0.8'], 'written with --momentum 0.9, this run has 0.8'),
    (['--weight-decay', '0'],
     'written with --weight-decay 0.0001, this run has 0.0'),
    (['--trust-coefficient', '0.01'],
     'written with --trust-coefficient 0.02, this run has 0.01'),
    (['--decay-power', '1'],
     'written with --decay-power 2.0, this run has 1.0'),
    # The plots' state is in the snapshot.
    (['--plot'], 'the snapshot was written with --noplot, this run without'),
])
def test_resume_refuses_another_run(mnist, mnist_snapshot, tmp_path,
                                    capsys, flags, message):
    """One usage line naming the flag and both values, before any work."""
    snapshot, args = mnist_snapshot
    if flags == ['--plot']:
        args, flags = [a for a in args if a != '--noplot'], []
    out = tmp_path / 'resumed'
    err = usage_error(mnist.main, args + flags + [
        '--resume', snapshot, '--out', str(out)], capsys)
    assert len(err.splitlines()) == 1, err
    assert message in err and 'start a new run' in err, err
    assert '--lr' not in err.split('. ')[0]
    # The flags this trainer has that may change: no --communicator
    # (ChainerMN's), no --overwrite (refused with --resume).
    assert err.rstrip().endswith(
        'A resumed run is the same run: it keeps every flag but --out, '
        '--snapshots, --device, --dataset-root and --progress; to change '
        'one, start a new run.'), err
    assert not out.exists()


@pytest.mark.parametrize('given,resumed,message', [
    (['--eval-every', '1'], [],
     'written with --eval-every 1, this run without it (not given)'),
    ([], ['--eval-every', '1'],
     'written without --eval-every (not given), this run has 1'),
    (['--optimizer', 'lamb', '--beta2', '0.99'], ['--optimizer', 'lamb'],
     'written with --beta2 0.99, this run without it (not given)'),
    (['--optimizer', 'adam'], ['--optimizer', 'adam', '--eps', '1e-07'],
     'written without --eps (not given), this run has 1e-07'),
])
def test_resume_names_an_optional_flag_given_or_left_out(
        mnist, dataset_root, tmp_path, capsys, given, resumed, message):
    """A flag with no default value, given to one run and not the other,
    was blamed on "another trainer"; the snapshots, which record such a
    flag only where given, resume with the same flags (--eval-every
    needs --validation: 8 of the 64 images, two batches of 28 left)."""
    args = ['-b', '28', '-u', '8', '--validation', '8', '--noplot', '-e',
            '2', '--progress', 'none']
    run = tmp_path / 'run'
    mnist.main(args + given + ['--out', str(run), '--snapshots', '2'])
    snapshot = str(run / 'snapshot_iter_2')
    capsys.readouterr()
    out = tmp_path / 'resumed'
    err = usage_error(mnist.main, args + resumed + [
        '--resume', snapshot, '--out', str(out)], capsys)
    assert len(err.splitlines()) == 1, err
    assert message in err and 'start a new run' in err, err
    assert not out.exists()
    mnist.main(args + given + ['--resume', snapshot, '--out', str(out)])
    assert without_time(read_log(str(out))) == without_time(
        read_log(str(run)))


def _rerecord(snapshot, **settings):
    """Rewrites what ``snapshot`` records of the run's flags."""
    with numpy.load(snapshot) as npz:
        entries = dict(npz)
    for name, value in settings.items():
        entries[cli.RunSettings.prefix + name] = numpy.asarray(value)
    with open(snapshot, 'wb') as f:
        numpy.savez(f, **entries)


def test_snapshots_of_flags_now_refused_still_resume(
        mnist, dataset_root, tmp_path, capsys):
    """Runs before 0.3.0.dev0's refusals took --trust-coefficient with
    adam (recorded, though unused) and --eval-every without --validation:
    their snapshots resume, the first without the flag, the second with
    it given again, as the refusal of its absence says."""
    args = ['-b', '32', '-u', '8', '--noplot', '-e', '2', '--progress',
            'none']
    for extra, recorded, resumed in (
            (['--optimizer', 'adam'], {'trust_coefficient': 0.05}, []),
            ([], {'eval_every': 1}, ['--eval-every', '1'])):
        run = tmp_path / 'run{}'.format(len(extra))
        mnist.main(args + extra + ['--out', str(run), '--snapshots', '2'])
        snapshot = str(run / 'snapshot_iter_2')
        _rerecord(snapshot, **recorded)
        out = str(tmp_path / 'resumed{}'.format(len(extra)))
        if resumed:
            capsys.readouterr()
            err = usage_error(mnist.main, args + extra + [
                '--resume', snapshot, '--out', out], capsys)
            assert ('written with --eval-every 1, this run without it (not '
                    'given)') in err, err
        mnist.main(args + extra + resumed + ['--resume', snapshot,
                                             '--out', out])
        assert read_log(out)[-1]['epoch'] == 2


@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn_example'])
def test_the_flags_a_snapshot_may_not_record_are_known(request, tmp_path,
                                                       name):
    """check_resume reads a flag missing from a snapshot as not given only
    for cli.UNSET_UNLESS_GIVEN: every recorded flag that a run may leave
    unset must be there (--lr is set before anything is recorded)."""
    args = request.getfixturevalue(name).parse_args(
        ['--out', str(tmp_path / 'out')])
    unset = {n for n, value in vars(args).items() if value is None}
    assert unset - set(cli.FREE_FLAGS) - set(cli.run_settings(args)) - {
        'warmup_note', 'lr'} == set(cli.UNSET_UNLESS_GIVEN)


def test_resume_refuses_an_out_holding_another_run(
        mnist, mnist_snapshot, tmp_path, capsys):
    """--resume into the folder of another run replaced its log, plots and
    snapshots by those of the resumed run, without a word."""
    snapshot, args = mnist_snapshot
    other = tmp_path / 'B'
    _another_run(other)
    line = usage_error(mnist.main, args + [
        '--resume', snapshot, '--out', str(other)], capsys).splitlines()[-1]
    assert line.endswith(
        '--out {}: holds another run (log, snapshot_iter_9, '
        'snapshot_iter_74), not the one that --resume {} continues; give '
        '--out {} (the folder of that snapshot), or an --out that holds no '
        'run'.format(other, snapshot, os.path.dirname(snapshot))), line
    assert sorted(p.name for p in other.iterdir()) == [
        'log', 'loss_scale.png', 'notes.txt', 'snapshot_iter_74',
        'snapshot_iter_9']
    assert all(p.read_text() == p.name for p in other.iterdir())


def test_resume_writes_on_in_the_folder_of_its_snapshot(
        mnist, mnist_snapshot, tmp_path):
    """The usual resume, into the run's own folder, named another way (a
    link to it, a relative path): the run goes on there."""
    snapshot, args = mnist_snapshot
    run = os.path.dirname(snapshot)
    log = read_log(run)
    os.remove(os.path.join(run, 'snapshot_iter_4'))
    (tmp_path / 'link').symlink_to(run)
    mnist.main(args + ['--resume', os.path.relpath(snapshot), '--out',
                       str(tmp_path / 'link')])
    assert without_time(read_log(run)) == without_time(log)
    assert sorted(n for n in os.listdir(run) if n.startswith('snap')) == [
        'snapshot_iter_4']


def test_resume_without_out_writes_on_in_the_folder_of_its_snapshot(
        cifar, dataset_root, tmp_path, capsys, monkeypatch):
    """--resume DIR/snapshot_iter_N without --out went on in ./result, the
    new run's default, beside the run in DIR: it goes on in DIR, as the
    banner says."""
    args = ['-b', '16', '--depth', '8', '-e', '2', '--warmup-epochs', '1',
            '--noplot', '--progress', 'none']
    run = tmp_path / 'result_cifar10'
    cifar.main(args + ['-o', str(run), '--snapshots', '2'])
    log = read_log(str(run))
    os.remove(str(run / 'snapshot_iter_4'))
    capsys.readouterr()
    cifar.main(args + ['--resume', str(run / 'snapshot_iter_2'),
                       '--snapshots', '2'])
    assert '# out: {}\n'.format(run) in capsys.readouterr().out
    assert not (tmp_path / 'result').exists()
    assert without_time(read_log(str(run))) == without_time(log)
    assert (run / 'snapshot_iter_4').exists()
    # In the current folder, relative: the folder is '.' (without the
    # later snapshot, which would refuse it).
    os.remove(str(run / 'snapshot_iter_4'))
    monkeypatch.chdir(str(run))
    assert cifar.parse_args(args[:-1] + ['lines', '--resume',
                                         'snapshot_iter_2']).out == '.'
    assert cifar.parse_args([]).out == 'result'


@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn_example'])
def test_out_help_names_both_defaults(request, capsys, name):
    with pytest.raises(SystemExit):
        request.getfixturevalue(name).main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert ('(default: result; with --resume, the folder of its snapshot, '
            'where the run goes on)') in text


@pytest.mark.parametrize('name,more', [
    ('mnist', []), ('cifar', []),
    ('chainermn_example', ['--communicator'])])
def test_resume_help_names_the_flags_that_may_change(request, capsys, name,
                                                     more):
    main = request.getfixturevalue(name).main
    with pytest.raises(SystemExit):
        main(['--help'])
    text = capsys.readouterr().out
    resume = re.search(r'\n  --resume RESUME, -r RESUME\n(.*?)\n  -',
                       text, re.S).group(1)
    changeable = ['--out', '--snapshots', '--device', '--dataset-root',
                  '--progress'] + more
    assert re.findall(r'--[a-z-]+', resume) == changeable
    if more:
        args = request.getfixturevalue(name).parse_args(['--out', 'x'])
        assert cli._changeable(args) == ', '.join(changeable[:-1]) + (
            ' and ' + changeable[-1])


def test_resume_may_change_progress(mnist, mnist_snapshot, tmp_path):
    snapshot, args = mnist_snapshot
    for progress in ('none', 'lines'):
        out = tmp_path / progress
        mnist.main(args + ['--resume', snapshot, '--out', str(out),
                           '--progress', progress])
        assert read_log(str(out))[-1]['epoch'] == 2


def test_resume_writes_on_in_a_folder_it_resumed_into_before(
        mnist, mnist_snapshot, tmp_path):
    """A run resumed into a folder of its own, stopped there before it
    wrote a snapshot (--snapshots 0 here), is continued by the same
    command, the one Ctrl-C prints: that folder's log continues the
    snapshot's, so it holds the same run."""
    snapshot, args = mnist_snapshot
    out = tmp_path / 'resumed'
    command = args + ['--resume', snapshot, '--out', str(out),
                      '--snapshots', '0']
    mnist.main(command)
    mnist.main(command)
    assert without_time(read_log(str(out))) == without_time(
        read_log(os.path.dirname(snapshot)))


def test_resume_of_an_older_snapshot_names_the_test_set_test(
        mnist, dataset_root, tmp_path):
    """A snapshot of the version that named the test set Chainer's way
    (validation/main/...) resumes into a run whose log and plots name it
    test/main/... from the first epoch on."""
    args = ['-b', '32', '-u', '8', '--warmup-epochs', '1', '-e', '2']
    first = tmp_path / 'first'
    mnist.main(args + ['--out', str(first), '--snapshots', '2'])
    old = str(tmp_path / 'old_snapshot')
    with numpy.load(str(first / 'snapshot_iter_2')) as npz:
        arrays = {key: npz[key] for key in npz.files}
    renamed = 0
    for key, value in arrays.items():
        if key.endswith('LogReport/_log') or '/_plot_' in key:
            text = str(value).replace('"test/main/', '"validation/main/')
            renamed += text != str(value)
            arrays[key] = numpy.array(text)
    assert renamed == 3  # the log, the loss plot, the accuracy plot
    with open(old, 'wb') as f:  # a file: savez would add .npz to a name
        numpy.savez(f, **arrays)
    resumed = tmp_path / 'resumed'
    mnist.main(args + ['--out', str(resumed), '--resume', old])
    log = read_log(str(resumed))
    assert [entry['epoch'] for entry in log] == [0, 1, 2]
    assert all('test/main/accuracy' in entry for entry in log)
    assert not any(key.startswith('validation/') for entry in log
                   for key in entry)
    assert without_time(log) == without_time(read_log(str(first)))
    with numpy.load(str(resumed / 'snapshot_iter_4')) as npz:
        plotted = json.loads(str(npz['extensions/PlotReport_1/'
                                     '_plot_accuracy.png']))
    assert sorted(plotted) == ['main/accuracy', 'test/main/accuracy']
    assert len(plotted['test/main/accuracy']) == 3


def test_resume_of_a_finished_run_says_so(mnist, mnist_snapshot,
                                          tmp_path, capsys):
    """The snapshot of the last epoch would resume into a run that stops
    at once: one usage line that says why, before any work."""
    snapshot, args = mnist_snapshot
    last = os.path.join(os.path.dirname(snapshot), 'snapshot_iter_4')
    out = tmp_path / 'resumed'
    err = usage_error(mnist.main, args + [
        '--resume', last, '--out', str(out), '--dataset-root',
        str(tmp_path)], capsys)  # no data there: it stops before loading
    assert len(err.splitlines()) == 1, err
    assert ('the run is finished: the snapshot was written at the end of '
            'epoch 2 of --epoch 2' in err), err
    assert 'larger --epoch' in err
    assert not out.exists()


def test_resume_in_a_folder_whose_run_went_on_is_refused(
        mnist, dataset_root, tmp_path, capsys):
    """--resume of a snapshot whose run went on past it in --out (later
    snapshots there, finished or not) is refused before anything there
    changes: the resumed run would write over its log, plots and later
    snapshots. The latest resumes there; an earlier one into another
    --out."""
    args = ['-b', '32', '-u', '8', '--warmup-epochs', '1', '-e', '3']
    out = tmp_path / 'run'
    mnist.main(args + ['--out', str(out), '--snapshots', '3'])

    def contents():
        return {p.name: p.read_bytes() for p in out.iterdir()}
    before = contents()
    names = sorted((n for n in before if n.startswith('snapshot_iter_')),
                   key=lambda n: int(n.rsplit('_', 1)[1]))
    first, second, last = (str(out / n) for n in names)
    err = usage_error(mnist.main, args + ['--resume', first], capsys)
    assert _went_on(out, first, '{}, {}, finished'.format(*names[1:]),
                    _ELSEWHERE.format(first)) in err, err
    assert contents() == before
    os.remove(last)  # a run stopped after its second epoch
    del before[names[2]]
    err = usage_error(mnist.main, args + ['--resume', first], capsys)
    assert _went_on(out, first, names[1], 'continue it from its latest '
                    'snapshot, --resume {}, or {}'.format(
                        second, _ELSEWHERE.format(first))) in err, err
    assert contents() == before
    branch = tmp_path / 'branch'
    mnist.main(args + ['--resume', first, '--out', str(branch)])
    mnist.main(args + ['--resume', second])
    assert without_time(read_log(str(branch))) == without_time(
        read_log(str(out)))
    assert read_log(str(out))[-1]['epoch'] == 3


#: The refusals' offer of another --out, for the snapshot ``{}``.
_ELSEWHERE = 'give another --out to go on from {} in a folder of its own'


def _went_on(out, snapshot, later, offer):
    """The refusal of ``--resume snapshot`` in ``out``, whose run went on
    past it: ``later``, its later snapshots (and what ends them)."""
    return ('error: --out {}: holds the run of --resume {} gone on past '
            'that snapshot ({}), which a run resumed there would write over '
            '(its log, plots and snapshots); {}\n'.format(
                out, snapshot, later, offer))


def _diverge(snapshot):
    """Makes the snapshot ``snapshot`` one of a run that diverged: the
    training loss of its log's last line not finite."""
    with numpy.load(snapshot) as npz:
        entries = dict(npz)
    key = 'extensions/LogReport/_log'
    log = json.loads(str(entries[key]))
    log[-1]['main/loss'] = float('nan')
    entries[key] = numpy.array(json.dumps(log))
    with open(snapshot, 'wb') as f:
        numpy.savez(f, **entries)


@pytest.mark.parametrize('end', ['diverged', 'cut short', 'empty'])
def test_resume_in_a_folder_whose_run_went_on_offers_no_refused_snapshot(
        mnist, dataset_root, tmp_path, capsys, end):
    """The refusal of --resume in a folder whose run went on past the
    snapshot offers that run's latest snapshot only where --resume would
    take it: not where the run diverged (whose refusal sends the user to
    a snapshot written before) or the snapshot is damaged. It names why,
    and the other --out it offers goes on."""
    args = ['-b', '32', '-u', '8', '--warmup-epochs', '1', '-e', '4',
            '--noplot']
    out = tmp_path / 'run'
    mnist.main(args + ['--out', str(out), '--snapshots', '4'])
    first, second, last, finished = cli.snapshots_in(str(out))
    os.remove(finished)  # a run stopped after its third epoch
    if end == 'diverged':
        _diverge(last)
    else:
        with open(last, 'r+b') as f:
            f.truncate(0 if end == 'empty' else os.path.getsize(last) // 2)
    capsys.readouterr()
    err = usage_error(mnist.main, args + ['--resume', last], capsys)
    assert ('the run had diverged' if end == 'diverged' else
            'not a snapshot, or a damaged one') in err, err
    if end == 'diverged':
        assert ('resume from a snapshot written before with another --out '
                '(in the folder of this one, it would write over the run '
                'that diverged)') in err, err
    for snapshot, later in ((first, 'snapshot_iter_4, snapshot_iter_6'),
                            (second, 'snapshot_iter_6')):
        err = usage_error(mnist.main, args + ['--resume', snapshot], capsys)
        assert _went_on(out, snapshot, '{}, {}'.format(
            later, 'damaged' if end != 'diverged' else end),
            _ELSEWHERE.format(snapshot) + (
                ' (or start a new run with a smaller --lr)'
                if end == 'diverged' else '')) in err, err
    branch = tmp_path / 'branch'
    mnist.main(args + ['--resume', second, '--out', str(branch)])
    assert read_log(str(branch))[-1]['epoch'] == 4


def test_resume_refuses_another_precision_or_dataset(
        mnist, mnist_snapshot, tmp_path, capsys):
    snapshot, args = mnist_snapshot
    out = tmp_path / 'resumed'
    with chainer.using_config('dtype', numpy.float16):
        err = usage_error(mnist.main, args + [
            '--resume', snapshot, '--out', str(out)], capsys)
    assert 'precision (chainer.config.dtype' in err
    assert 'float32, this run has float16' in err
    # Another MNIST: 96 training images.
    root = tmp_path / 'other'
    folder = root / 'pfnet' / 'chainer' / 'mnist'
    folder.mkdir(parents=True)
    for name, n in (('train', 96), ('test', 32)):
        numpy.savez_compressed(
            str(folder / (name + '.npz')),
            x=numpy.arange(n * 784, dtype=numpy.uint8).reshape(n, 784),
            y=numpy.arange(n, dtype=numpy.uint8) % 10)
    err = usage_error(mnist.main, args + [
        '--resume', snapshot, '--out', str(out), '--dataset-root',
        str(root)], capsys)
    assert 'the number of training examples 64, this run has 96' in err
    assert not out.exists()


def test_resume_refuses_old_and_other_snapshots(
        mnist, cifar, mnist_snapshot, dataset_root, tmp_path, capsys):
    """A snapshot of b8e13bc recorded the schedule only: refused, and why.

    A CIFAR snapshot resumed by the MNIST trainer is refused too.
    """
    snapshot, args = mnist_snapshot
    prefix = 'extensions/RunSettings/'
    with numpy.load(snapshot) as npz:
        arrays = {key: npz[key] for key in npz.files
                  if not key.startswith(prefix) or key[len(prefix):] in (
                      'epoch', 'batchsize', 'lr', 'warmup_epochs',
                      'decay_power')}
    old = str(tmp_path / 'old.npz')
    numpy.savez_compressed(old, **arrays)
    err = usage_error(mnist.main, args + ['--resume', old], capsys)
    assert 'a snapshot of an older version of these examples' in err
    assert 'start a new run' in err

    out = tmp_path / 'cifar'
    cifar.main(['-b', '16', '--depth', '8', '-e', '1', '--noplot', '--out',
                str(out)])
    err = usage_error(mnist.main, args + [
        '--resume', str(out / 'snapshot_iter_2')], capsys)
    assert 'it was written by another trainer' in err


def test_a_kill_while_writing_leaves_no_snapshot_cut_short(
        dataset_root, tmp_path):
    """Chainer's writer saves into a temporary folder, then renames.

    The trainer is killed (SIGKILL) halfway through writing the snapshot
    of epoch 2: the snapshot of epoch 1 is whole and resumes, no file
    under a snapshot's name is cut short, and the run resumed in the same
    --out removes the temporary folder left behind.
    """
    driver = tmp_path / 'driver.py'
    driver.write_text(
        'import os, signal, sys\n'
        'import numpy\n'
        'from examples.mnist import train_mnist\n'
        'save = numpy.savez_compressed\n'
        'calls = []\n'
        'def dying(file, *args, **kwargs):\n'
        '    calls.append(1)\n'
        '    if len(calls) == 1:\n'
        '        return save(file, *args, **kwargs)\n'
        '    file.write(b"PK" + bytes(50000))\n'
        '    file.flush()\n'
        '    os.kill(os.getpid(), signal.SIGKILL)\n'
        'numpy.savez_compressed = dying\n'
        'train_mnist.main(sys.argv[1:])\n')
    out = tmp_path / 'out'
    args = ['-b', '32', '-u', '8', '-e', '3', '--noplot', '--snapshots', '3',
            '--warmup-epochs', '1']
    env = dict(os.environ, PYTHONPATH=pythonpath())
    result = subprocess.run(
        [sys.executable, str(driver)] + args + ['--out', str(out)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert result.returncode == -9, result.stderr
    names = os.listdir(str(out))
    assert 'snapshot_iter_2' in names and 'snapshot_iter_4' not in names
    # The half-written file is in Chainer's temporary folder, which the
    # resumed run removes at its first snapshot; a folder of that name
    # that holds anything else stays.
    assert [name for name in names if name.startswith('tmpsnapshot_iter_4')]
    (out / 'tmpsnapshot_iter_9mine').mkdir()
    (out / 'tmpsnapshot_iter_9mine' / 'notes').write_text('mine')
    result = run_script('examples.mnist.train_mnist', args + [
        '--resume', str(out / 'snapshot_iter_2'), '--out', str(out)],
        dataset_root)
    assert result.returncode == 0, result.stderr
    assert read_log(str(out))[-1]['epoch'] == 3
    assert sorted(n for n in os.listdir(str(out)) if 'snapshot' in n) == [
        'snapshot_iter_2', 'snapshot_iter_4', 'snapshot_iter_6',
        'tmpsnapshot_iter_9mine']


# The MNIST trainer, each update slowed down so that a run lasts long
# enough to be interrupted; from its first update on, the update given by
# SLOW_UPDATE instead (a long C call that holds Python's signal handlers
# back), if set.
SLOW_DRIVER = """import hashlib, os, sys, time
from chainer.training import updaters
from examples import training
from examples.mnist import train_mnist
training.Interruption.GRACE = 0.5
update = updaters.StandardUpdater.update_core
def slow(self):
    update(self)
    if os.environ.get('SLOW_UPDATE') and self.iteration > 2:
        hashlib.pbkdf2_hmac('sha256', b'x', b'y', 100000000)
    time.sleep(0.05)
updaters.StandardUpdater.update_core = slow
train_mnist.main(sys.argv[1:])
"""


def interrupt(tmp_path, root, args, wait_for_snapshot=True, env=None,
              signum=signal.SIGINT, driver=SLOW_DRIVER, kill_after=None):
    """Starts the slowed trainer (``driver``), sends it SIGINT (or
    ``signum``) once it has written a snapshot (or after a second), and
    SIGKILL ``kill_after`` seconds later if given and still running, and
    returns its result and the time from the signal to its end."""
    text, driver = driver, tmp_path / 'driver.py'
    driver.write_text(text)
    out = tmp_path / 'out'
    environment = dict(os.environ, PYTHONPATH=pythonpath(),
                       CHAINER_DATASET_ROOT=root, PYTHONWARNINGS='ignore')
    environment.pop('CHAINER_LARS_LAUNCHER', None)
    environment.update(env or {})
    command = [sys.executable, str(driver)] + args + ['--out', str(out)]
    # As a terminal's Ctrl-C finds it: a test run started in the background
    # of a non-interactive shell ignores SIGINT, and its children would too.
    process = subprocess.Popen(
        command, cwd=str(tmp_path), env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while time.time() < deadline and process.poll() is None:
            time.sleep(0.1)
            if not wait_for_snapshot and os.path.exists(str(out / 'log')):
                break
            if wait_for_snapshot and out.exists() and any(
                    n.startswith('snapshot_iter_') for n in os.listdir(
                        str(out))):
                break
        time.sleep(0.3)
        sent = time.time()
        process.send_signal(signum)
        if kill_after is not None:
            try:
                process.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                process.kill()
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return (subprocess.CompletedProcess(command, process.returncode,
                                        stdout, stderr),
            time.time() - sent, environment)


INTERRUPTED = re.compile(r'^driver\.py: interrupted at iteration (\d+) '
                         r'\(epoch ([\d.]+) of 6\); ')


def test_ctrl_c_says_how_to_resume_and_exits_130(dataset_root, tmp_path):
    """Ctrl-C: no traceback, one line that says where the run stopped and
    the command that resumes it from the snapshot this run wrote, status
    130; that command finishes the run."""
    args = ['-b', '32', '-u', '8', '-e', '6', '--noplot', '--warmup-epochs',
            '1', '--snapshots', '2']
    result, _, environment = interrupt(tmp_path, dataset_root, args)
    assert result.returncode == 130, result.stderr
    assert 'Traceback' not in result.stderr
    assert 'Exception ignored' not in result.stderr
    line, = result.stderr.strip().splitlines()
    match = INTERRUPTED.match(line)
    assert match, line
    # 64 training examples, batch 32: the epoch of the updates done.
    assert float(match.group(2)) == int(match.group(1)) / 2, line
    snapshot, command = re.search(
        r'; to continue from (\S+), run: (.*)$', line).groups()
    assert os.path.isfile(str(tmp_path / snapshot))
    assert shlex.split(command) == (
        [shlex.split(command)[0], str(tmp_path / 'driver.py')] + args
        + ['--out', str(tmp_path / 'out'), '--resume', snapshot])
    resumed = subprocess.run(
        shlex.split(command), cwd=str(tmp_path), env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert read_log(str(tmp_path / 'out'))[-1]['epoch'] == 6


def test_sigterm_says_how_to_resume_and_exits_143(dataset_root, tmp_path):
    """SIGTERM (kill, a job scheduler; Open MPI's mpiexec turns Ctrl-C
    into it) is Ctrl-C's line, with status 128 + 15."""
    args = ['-b', '32', '-u', '8', '-e', '6', '--noplot', '--warmup-epochs',
            '1', '--snapshots', '2']
    result, _, _ = interrupt(tmp_path, dataset_root, args,
                             signum=signal.SIGTERM)
    assert result.returncode == 143, result.stderr
    assert 'Traceback' not in result.stderr
    assert 'Exception ignored' not in result.stderr
    line, = result.stderr.strip().splitlines()
    assert INTERRUPTED.match(line), line
    snapshot = re.search(r'; to continue from (\S+), run: ', line).group(1)
    assert os.path.isfile(str(tmp_path / snapshot))


def test_sigterm_during_a_long_update_says_so_at_once(dataset_root,
                                                      tmp_path):
    """A SIGKILL may follow SIGTERM within a second (Open MPI's): the
    watcher says where the run stopped after TERM_GRACE, not GRACE."""
    driver = SLOW_DRIVER.replace('GRACE = 0.5', 'GRACE = 30')
    result, took, _ = interrupt(
        tmp_path, dataset_root, ['-b', '32', '-u', '8', '-e', '6',
                                 '--noplot', '--warmup-epochs', '1'],
        env={'SLOW_UPDATE': '1'}, signum=signal.SIGTERM, driver=driver,
        kill_after=2)
    # Killed (as Open MPI would) after 2 s, having said it.
    assert result.returncode == -signal.SIGKILL, result.stderr
    line, = result.stderr.strip().splitlines()
    assert INTERRUPTED.match(line), line
    assert 'to continue from ' in line


def test_the_watcher_counts_its_graces_from_the_signal(monkeypatch):
    """A SIGTERM that comes long after the run started, while the main
    thread is held in a long call: the watcher says where the run stopped
    TERM_GRACE after the signal and ends the process GRACE after it (it
    counted from its own start, and so ended a run at once)."""
    clock = {'now': 1000.0}
    monkeypatch.setattr(training.time, 'time', lambda: clock['now'])

    def select(readers, writers, errors, timeout=None):
        # The signal comes 100 s in; then time passes only by timeouts.
        clock['now'] += 100.0 if timeout is None else timeout
        return readers if timeout is None else [], [], []
    monkeypatch.setattr(training.select, 'select', select)
    events = []

    class Exit(Exception):
        pass

    def exit_(status):
        events.append(('exit', clock['now'], status))
        raise Exit()
    monkeypatch.setattr(training.os, '_exit', exit_)
    read, write = os.pipe()
    os.write(write, bytes([signal.SIGTERM]))
    watcher = training.Interruption(None, None, say=False)
    watcher._read, watcher._handlers = read, {signal.SIGTERM: None}
    monkeypatch.setattr(watcher, '_stop', lambda: events.append(
        ('said', clock['now'])) or True)
    try:
        with pytest.raises(Exit):
            watcher._watch()
    finally:
        os.close(write)
        os.close(read)
    assert events == [
        ('said', pytest.approx(1100.0 + watcher.TERM_GRACE)),
        ('exit', pytest.approx(1100.0 + watcher.GRACE), 143)]


@pytest.mark.parametrize('name', ['SIGINT', 'SIGTERM'])
def test_a_signal_once_the_run_has_ended_stops_nothing(name):
    """Ctrl-C or SIGTERM once ``trainer.run()`` has ended (Chainer's
    ``Trainer`` sets ``_done`` as its last step), before ``__exit__`` has
    put the handlers back: the run is whole, so no "interrupted" line and
    status 0 (the handler raised, and ``__exit__`` gave a traceback)."""
    status, out, err = forked.run(
        'import os, signal, time\n'
        'from examples import training\n'
        'class Trainer(object):\n'
        '    _done = False\n'
        '    def run(self):\n'
        '        self._done = True\n'
        '        os.kill(os.getpid(), signal.{0})  # handled at once\n'
        '        time.sleep(0.05)\n'
        'for signum in training.Interruption.SIGNALS:\n'
        '    signal.signal(signum, signal.SIG_DFL)\n'
        'trainer = Trainer()\n'
        'with training.Interruption(None, trainer):\n'
        '    trainer.run()\n'
        'assert signal.getsignal(signal.{0}) == signal.SIG_DFL\n'
        'print("ended")\n'.format(name))
    assert (status, out, err) == (0, 'ended\n', '')


@pytest.mark.parametrize('name', ['SIGINT', 'SIGTERM'])
def test_a_signal_dropped_in_a_weakref_callback_still_stops_the_run(name):
    """Python drops an exception raised in a weakref callback (or a
    ``__del__``) and prints "Exception ignored": a signal handled there
    stopped nothing, and the run trained to its end with status 0. It is
    raised again once the update has ended, with the usual line."""
    status, out, err = forked.run(
        'import os, signal, types, weakref\n'
        'import numpy, chainer, chainer.links as L\n'
        'from chainer import training as T\n'
        'from examples import training\n'
        'for signum in training.Interruption.SIGNALS:\n'
        '    signal.signal(signum, signal.SIG_DFL)\n'
        'model = L.Classifier(L.Linear(2, 2))\n'
        'optimizer = chainer.optimizers.SGD().setup(model)\n'
        'data = chainer.datasets.TupleDataset(\n'
        '    numpy.ones((8, 2), numpy.float32), numpy.zeros(8, numpy.int32))\n'
        'updater = T.updaters.StandardUpdater(\n'
        '    chainer.iterators.SerialIterator(data, 4), optimizer)\n'
        'trainer = T.Trainer(updater, (500, "iteration"), out=os.devnull)\n'
        'class Freed(object):\n'
        '    pass\n'
        'def freed(ref):\n'
        '    os.kill(os.getpid(), signal.{0})  # handled in the callback\n'
        'def drop(trainer):\n'
        '    if trainer.updater.iteration == 3:\n'
        '        thing = Freed()\n'
        '        ref = weakref.ref(thing, freed)\n'
        '        del thing\n'
        'trainer.extend(drop, trigger=(1, "iteration"))\n'
        'args = types.SimpleNamespace(epoch=500, out=os.devnull, '
        'snapshots=0, resume=None)\n'
        'with training.Interruption(args, trainer):\n'
        '    trainer.run()\n'.format(name))
    assert status == 128 + getattr(signal, name), (out, err)
    assert 'Exception ignored' not in err and 'Traceback' not in err, err
    assert re.search(r'interrupted at iteration [34] .*no snapshot', err), err


def test_resume_command_replaces_a_resume_of_its_own(monkeypatch):
    monkeypatch.setenv('CHAINER_LARS_LAUNCHER', 'bash dev.sh mnist')
    argv = ['train_mnist.py', '-b', '64', '--resume', 'a/snapshot_iter_1',
            '-ra/b', '--resume=a/c', '-o', 'my result']
    assert training.resume_command('my result/snapshot_iter_8', argv) == (
        "bash dev.sh mnist -b 64 -o 'my result' --resume "
        "'my result/snapshot_iter_8'")


class _Processes(object):

    """A communicator of ``size`` processes, this one ``rank``, whose
    others stop with ``others`` (``(stopped, status, text)``) in
    ``stop_together``."""

    def __init__(self, rank, size, others):
        self.rank, self.size, self._others = rank, size, others

    def allgather(self, verdict):
        verdicts = [self._others] * self.size
        verdicts[self.rank] = verdict
        return verdicts


def test_stop_together_says_once_what_all_find_and_names_the_rest(
        monkeypatch, capsys):
    monkeypatch.setattr(sys, 'argv', ['train_mnist.py'])
    monkeypatch.setattr(training.cli.socket, 'gethostname', lambda: 'n2')
    same = (True, 2, 'train_mnist.py: error: --lr 0: bad\n')

    def bad():
        cli.usage_error('--lr 0: bad')
    for rank, said in ((0, same[2]), (1, '')):
        with pytest.raises(SystemExit) as exc:
            cli.stop_together(_Processes(rank, 3, same), bad)
        assert exc.value.code == 2
        assert capsys.readouterr().err == said
    # Found by this process alone: said, naming it.
    with pytest.raises(SystemExit) as exc:
        cli.stop_together(_Processes(1, 3, (False, 0, '')), bad)
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        'train_mnist.py: rank 1 of 3 (on n2): error: --lr 0: bad\n')
    # Found by another process: silent, its status.
    with pytest.raises(SystemExit) as exc:
        cli.stop_together(_Processes(0, 3, same), lambda: 7)
    assert exc.value.code == 2 and capsys.readouterr().err == ''
    # A failure is a traceback, named, and status 1; none: the result.
    with pytest.raises(SystemExit) as exc:
        cli.stop_together(_Processes(2, 3, (False, 0, '')), lambda: 1 / 0)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith('rank 2 of 3 (on n2): Traceback'), err
    assert 'ZeroDivisionError' in err
    assert cli.stop_together(_Processes(0, 3, (False, 0, '')),
                             lambda: 7) == 7
    assert cli.stop_together(None, lambda: 7) == 7


def test_resume_command_of_chainermn_starts_its_processes(monkeypatch):
    """dev.sh's command names the processes itself; a run that mpiexec
    started directly is given mpiexec -n N."""
    argv = ['train_mnist.py', '-b', '64']
    monkeypatch.setenv('CHAINER_LARS_LAUNCHER', 'bash dev.sh chainermn -n 4')
    assert training.resume_command('r/snapshot_iter_8', argv,
                                   processes=4) == (
        'bash dev.sh chainermn -n 4 -b 64 --resume r/snapshot_iter_8')
    monkeypatch.delenv('CHAINER_LARS_LAUNCHER')
    command = shlex.split(training.resume_command('r/snapshot_iter_8', argv,
                                                  processes=4))
    # Then the script as this process was started (pytest's, here).
    assert command[:3] == ['mpiexec', '-n', '4']
    assert command[-4:] == ['-b', '64', '--resume', 'r/snapshot_iter_8']


def test_quiet_interrupt_is_silent_once_the_training_began(
        monkeypatch, capsys):
    """A second Ctrl-C while the first is said: status 130, no line that
    says the training had not begun (a run before it in the same process
    does not count); under ChainerMN's except hook (which ends every
    process of the job) the interrupt goes on to it."""
    def interrupted():
        with training.quiet_interrupt():
            raise KeyboardInterrupt

    def interrupted_in_training():
        with training.quiet_interrupt():
            with training.Interruption(None, object(), say=False):
                pass  # (a run, whose handlers are put back after it)
            raise KeyboardInterrupt
    monkeypatch.setattr(training.Interruption, 'began', True)  # a last run
    for run, said in [(interrupted, True), (interrupted_in_training, False),
                      (interrupted, True)]:
        with pytest.raises(SystemExit) as exc:
            run()
        assert exc.value.code == 130
        assert ('interrupted before the training began' in (
            capsys.readouterr().err)) == said
    # Another except hook (apport's, Sentry's) does not change that.
    monkeypatch.setattr(sys, 'excepthook', lambda *args: None)
    with pytest.raises(SystemExit):
        interrupted()
    from chainermn import global_except_hook
    monkeypatch.setattr(sys, 'excepthook',
                        global_except_hook._global_except_hook)
    with pytest.raises(KeyboardInterrupt):
        interrupted()


# A trainer run as its command runs it (its __main__ block), whose data
# takes a minute to load, after it says so in a file.
LOADING_DRIVER = """import os, runpy, sys, time
from examples import data
def load(*args):
    open('loading', 'w').close()
    time.sleep(60)
data.load_mnist = data.load_cifar = load
sys.argv[0] = sys.argv.pop(1)
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('script', ['mnist/train_mnist.py',
                                    'cifar/train_cifar.py',
                                    'chainermn/mnist/train_mnist.py'])
def test_ctrl_c_before_the_training_says_so_in_one_line(tmp_path, script):
    """Ctrl-C while the data loads: one line, no traceback, status 130,
    as during the training."""
    (tmp_path / 'driver.py').write_text(LOADING_DRIVER)
    process = subprocess.Popen(
        [sys.executable, 'driver.py', os.path.join(
            REPO_ROOT, 'examples', script), '--out', 'out'],
        cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=pythonpath(),
                 PYTHONWARNINGS='ignore'), universal_newlines=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while not (tmp_path / 'loading').exists() and time.time() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        '{}: interrupted before the training began: run the command '
        'again'.format(os.path.basename(script))]
    assert not (tmp_path / 'out').exists()


def test_ctrl_c_without_a_snapshot_says_there_is_none(
        dataset_root, tmp_path):
    result, _, _ = interrupt(
        tmp_path, dataset_root, ['-b', '32', '-u', '8', '-e', '6',
                                 '--noplot', '--snapshots', '0'],
        wait_for_snapshot=False)
    assert result.returncode == 130, result.stderr
    line, = result.stderr.strip().splitlines()
    assert INTERRUPTED.match(line), line
    assert line.endswith('; no snapshot to resume from (--snapshots 0 '
                         'writes none): run the command again with '
                         '--overwrite to start over'), line


def test_ctrl_c_during_a_long_update_acts_at_once(dataset_root, tmp_path):
    """Python runs its handler of Ctrl-C only between its operations: an
    update that is one long C call (a float16 matrix product on the CPU)
    would hold it back for minutes; the run says where it stopped and
    ends after a short grace (0.5 s here) instead."""
    result, took, _ = interrupt(
        tmp_path, dataset_root, ['-b', '32', '-u', '8', '-e', '6',
                                 '--noplot', '--warmup-epochs', '1'],
        env={'SLOW_UPDATE': '1'})
    assert result.returncode == 130, result.stderr
    line, = result.stderr.strip().splitlines()
    assert INTERRUPTED.match(line), line
    assert 'to continue from ' in line
    # The C call alone takes about a minute.
    assert took < 20


def test_lr_plot_has_every_iteration_and_one_snapshot_is_kept(
        mnist, dataset_root, tmp_path):
    """3 epochs of 2 updates, warm-up over the first epoch.

    The rate of update k (1-based) is v(k - 1): the warm-up gives v(0) =
    peak/2 and v(1) = peak, then v(t) = peak (1 - (t - 2)/4)^2.
    """
    out = tmp_path / 'out'
    mnist.main(['-b', '32', '-u', '8', '-e', '3', '--warmup-epochs', '1',
                '--lr', '0.4', '--out', str(out)])
    assert {'loss.png', 'accuracy.png', 'lr.png', 'trust_ratio.png'} <= set(
        os.listdir(str(out)))
    snapshots = [name for name in os.listdir(str(out))
                 if name.startswith('snapshot_')]
    assert snapshots == ['snapshot_iter_6']
    with numpy.load(str(out / 'snapshot_iter_6')) as snapshot:
        points = snapshot['extensions/IterationPlot/points']
    numpy.testing.assert_allclose(points[:, 0], [0.5, 1, 1.5, 2, 2.5, 3])
    numpy.testing.assert_allclose(
        points[:, 1], [0.2, 0.4, 0.4, 0.4 * 0.75 ** 2, 0.4 * 0.5 ** 2,
                       0.4 * 0.25 ** 2], rtol=1e-12)


def test_no_snapshots(mnist, dataset_root, tmp_path):
    out = tmp_path / 'out'
    mnist.main(['-b', '32', '-u', '8', '-e', '2', '--noplot',
                '--snapshots', '0', '--out', str(out)])
    assert read_log(str(out))[-1]['epoch'] == 2
    assert not [name for name in os.listdir(str(out))
                if name.startswith('snapshot')]


def test_readme_example_needs_no_copy(dataset_root, tmp_path, monkeypatch):
    """The small CNN of examples/README.md, run as it stands there: loaded
    outside any package, as a file is, from a folder with the link to
    examples/_examples_path.py."""
    with open(os.path.join(REPO_ROOT, 'examples', 'README.md')) as f:
        code = f.read().split('```python\n', 1)[1].split('```', 1)[0]
    os.symlink(os.path.join(REPO_ROOT, 'examples', '_examples_path.py'),
               str(tmp_path / '_examples_path.py'))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, '_examples_path', raising=False)
    path = tmp_path / 'train_mnist_cnn.py'
    path.write_text(code)
    spec = importlib.util.spec_from_file_location('train_mnist_cnn', path)
    cnn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cnn)
    out = tmp_path / 'out'
    cnn.main(['-b', '32', '-e', '2', '--out', str(out)])
    log = read_log(str(out))
    assert [entry['iteration'] for entry in log] == [0, 2, 4]
    assert 'lars/ratio/predictor/conv2/W' in log[-1]
    # The flags of the others act on it too: --validation holds images
    # out and evaluates them, --label-smoothing smooths its loss.
    losses = []
    made = recipe.loss_function
    monkeypatch.setattr(recipe, 'loss_function', lambda args: losses.append(
        args.label_smoothing) or made(args))
    cnn.main(['-b', '32', '-e', '2', '--validation', '32',
              '--label-smoothing', '0.1', '--out', str(tmp_path / 'held')])
    log = read_log(str(tmp_path / 'held'))
    assert [entry['iteration'] for entry in log] == [0, 1, 2]
    assert 0 <= log[-1]['val/main/accuracy'] <= 1
    assert losses == [0.1]
    assert {'lr.png', 'trust_ratio.png', 'snapshot_iter_4'} <= set(
        os.listdir(str(out)))


def draw_epochs(values, **kwargs):
    """Draws ``values`` ({key: per-epoch values}) as PlotReport does, then
    ``plots.epoch_axes(**kwargs)``; returns the figure and its axes."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots()
    for key, ys in values.items():
        # None: no value that epoch (the training values of epoch 0)
        axes.plot([x for x, y in enumerate(ys) if y is not None],
                  [y for y in ys if y is not None], marker='x', label=key)
    plots.epoch_axes(kwargs.pop('ylabel', 'y'), **kwargs)(
        figure, axes, None)
    return figure, axes


def drawn(axes):
    """The points each curve draws: {label: [(x, y), ...]}, NaN left out."""
    return {line.get_label(): [
        (float(x), float(y)) for x, y in zip(line.get_xdata(),
                                             line.get_ydata())
        if math.isfinite(y)] for line in axes.get_lines()
        if not line.get_label().startswith('_')}


def test_loss_plot_names_train_and_test_and_marks_divergence():
    """PlotReport draws a NaN epoch as nothing: the plot marks the epochs
    from the first, draws none of their values, and titles it diverged."""
    import matplotlib.pyplot as plt
    figure, axes = draw_epochs(
        {'main/loss': [2.3, 1.5, numpy.nan, numpy.nan],
         'test/main/loss': [2.3, 1e30, numpy.inf, numpy.nan]},
        ylabel='loss', log=True, title='lars, batch 32')
    legend = axes.legend()
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ['train', 'test', 'diverged at epoch 2: loss not '
                      'finite, not drawn']
    assert drawn(axes) == {'train': [(0, 2.3), (1, 1.5)],
                           'test': [(0, 2.3), (1, 1e30)]}
    # The band: from epoch 2 to the right edge.
    band, = axes.patches
    assert band.get_x() == 2
    assert band.get_x() + band.get_width() == axes.get_xlim()[1] > 3
    assert axes.get_title() == 'lars, batch 32 (diverged)'
    low, high = axes.get_ylim()
    assert low <= 1.5 and 1e30 <= high < 1e31
    plt.close(figure)

    figure, axes = draw_epochs({'main/accuracy': [0.1, 0.5, 0.9, 0.95]},
                               title='lars, batch 32')
    assert [line.get_label() for line in axes.get_lines()] == ['train']
    assert not axes.patches and axes.get_title() == 'lars, batch 32'
    plt.close(figure)


def test_log_axis_labels_use_one_form():
    """A loss axis of a decade reads 1, 2, 3, ...; one from 1 to 1e8
    reads 1e+00 ... 1e+08, not 10000 beside 1e+08."""
    import matplotlib.pyplot as plt
    figure, axes = draw_epochs({'main/loss': [2.3, 1.5, 1.2]}, log=True)
    labels = tick_labels(figure, axes.yaxis)
    assert labels and all('e' not in t for t in labels), labels
    plt.close(figure)
    figure, axes = draw_epochs({'main/loss': [2.3, 3e3, 1e8]}, log=True)
    labels = tick_labels(figure, axes.yaxis)
    assert '1e+08' in labels and all(
        re.fullmatch(r'\d(\.\d)?e[+-]\d\d', t) for t in labels), labels
    plt.close(figure)


def test_divergence_drops_numpy_s_warnings_of_a_diverged_update(
        monkeypatch, capsys):
    """A diverged run printed NumPy's ``RuntimeWarning: invalid value
    encountered in subtract`` before its own line: an update's warnings
    are shown where its loss is finite, dropped where it is not and
    after (the diverged model's evaluation)."""
    import warnings
    shown = []
    monkeypatch.setattr(warnings, 'showwarning',
                        lambda message, *args, **kwargs: shown.append(
                            str(message)))

    class Trainer(object):
        observation = {}
        updater = type('Updater', (), {'iteration': 1, 'epoch_detail': 0.5})

    trainer = Trainer()
    divergence = training.Divergence('out')
    with warnings.catch_warnings():
        warnings.simplefilter('always')
        with divergence.held_warnings():
            for loss in (1.0, math.nan, math.nan):
                with numpy.errstate(invalid='warn'):
                    numpy.array([numpy.inf]) - numpy.inf
                warnings.warn('not a RuntimeWarning', UserWarning)
                trainer.observation = {'main/loss': numpy.float32(loss)}
                divergence(trainer)
            numpy.array([numpy.inf]) - numpy.inf  # the evaluation
    # The others at once, the update's once its loss is known.
    assert shown == ['not a RuntimeWarning',
                     'invalid value encountered in subtract'] + [
                         'not a RuntimeWarning'] * 2
    assert divergence.found[2] != divergence.found[2]
    assert 'the run diverged' in capsys.readouterr().err


def test_accuracy_plot_is_in_percent_and_hides_a_diverged_runs_values():
    """A diverged model's accuracy (that of one class) is finite, but no
    model's: from where the Divergence extension found the loss not
    finite, nothing is drawn, and the y axis stays 0-100 %."""
    import matplotlib.pyplot as plt
    accuracy = {'main/accuracy': [None, 0.5, 0.098],
                'test/main/accuracy': [0.1, 0.6, 0.098]}
    divergence = training.Divergence('out')
    figure, axes = draw_epochs(accuracy, percent=True,
                               divergence=divergence)
    assert drawn(axes) == {'train': [(1, 50), (2, 9.8)],
                           'test': [(0, 10), (1, 60), (2, 9.8)]}
    assert axes.get_ylim() == (0, 100) and not axes.patches
    plt.close(figure)
    divergence.found = (3, 1.5, float('nan'))
    figure, axes = draw_epochs(accuracy, percent=True,
                               divergence=divergence, title='t')
    assert drawn(axes) == {'train': [(1, 50)],
                           'test': [(0, 10), (1, 60)]}
    assert axes.get_ylim() == (0, 100)
    assert axes.patches[0].get_x() == 1.5
    assert 'diverged at epoch 1.5' in [
        text.get_text() for text in axes.legend().get_texts()][-1]
    assert axes.get_title() == 't (diverged)'
    plt.close(figure)


def test_plots_draw_the_validation_set_and_name_label_smoothing(
        mnist, dataset_root, tmp_path, monkeypatch):
    """With --validation and --test never the validation curves are what
    a run is tuned on: drawn beside the training ones."""
    import matplotlib.pyplot as plt
    figures = {}
    save = plt.Figure.savefig

    def keep(figure, path, *args, **kwargs):
        axes = figure.axes[0]
        figures[os.path.basename(str(path))] = (drawn(axes),
                                                axes.get_ylabel())
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, 'savefig', keep)
    mnist.main(['-b', '16', '-u', '8', '-e', '2', '--validation', '16',
                '--test', 'never', '--label-smoothing', '0.1',
                '--progress', 'none', '--dataset-root', dataset_root,
                '--out', str(tmp_path / 'out')])
    for name in ('loss.png', 'accuracy.png'):
        curves, label = figures[name]
        assert sorted(curves) == ['train', 'validation'], name
        assert [x for x, _ in curves['validation']] == [0, 1, 2], name
    assert figures['loss.png'][1] == (
        'loss (softmax cross entropy with label smoothing 0.1, log scale)')


@pytest.mark.parametrize('optimizer,ylabel', [
    ('lars', 'learning rate'), ('lamb', 'alpha'), ('adam', 'alpha')])
def test_lr_plot_names_adam_s_and_lamb_s_rate_alpha(
        mnist, dataset_root, tmp_path, monkeypatch, optimizer, ylabel):
    """lr.png's title says "peak alpha" for adam and lamb: its y axis
    said "learning rate"."""
    import matplotlib.pyplot as plt
    labels = {}
    save = plt.Figure.savefig

    def keep(figure, path, *args, **kwargs):
        labels[os.path.basename(str(path))] = (figure.axes[0].get_ylabel(),
                                               figure.axes[0].get_title())
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, 'savefig', keep)
    mnist.main(_tiny(dataset_root, tmp_path / 'out') + [
        '--optimizer', optimizer])
    label, title = labels['lr.png']
    assert label == ylabel
    assert ('peak alpha' in title) == (ylabel == 'alpha')


def test_lr_plot_keeps_its_label_beside_small_rates(mnist, dataset_root,
                                                    tmp_path, monkeypatch):
    """lr.png's y label is inside the picture beside ticks like
    0.00025: it was cut off at the left edge (Adam's --lr 1e-4)."""
    import matplotlib.pyplot as plt
    lefts = {}
    save = plt.Figure.savefig

    def keep(figure, path, *args, **kwargs):
        figure.canvas.draw()
        lefts[os.path.basename(str(path))] = figure.axes[
            0].yaxis.label.get_window_extent().x0
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, 'savefig', keep)
    mnist.main(_tiny(dataset_root, tmp_path / 'out') + [
        '--optimizer', 'adam', '--lr', '0.0001', '--dtype', 'mixed16'])
    assert lefts['lr.png'] >= 0
    assert lefts['loss_scale.png'] >= 0


def test_eval_every_s_plots_draw_the_log_s_values(mnist, dataset_root,
                                                  tmp_path):
    """With --eval-every, the validation points of accuracy.png and
    loss.png are the evaluations at each epoch's end, as the log has them
    (they were the means of the epoch's evaluations), and every line of
    the log has the trust ratios, the line at an epoch's end between two
    evaluations too (observed about ten times an epoch, they left columns
    of trust_ratio.png blank)."""
    out = tmp_path / 'out'
    # 50 training images, 25 iterations an epoch, observed every 2: lines
    # at 4, 8, ..., 24, 25 (the epoch's end), 28, ...
    mnist.main(['-b', '2', '-u', '8', '-e', '2', '--validation', '14',
                '--eval-every', '4', '--progress', 'none', '--dataset-root',
                dataset_root, '--out', str(out)])
    log = read_log(str(out))
    assert [e['iteration'] for e in log] == [0] + list(range(4, 25, 4)) + [
        25] + list(range(28, 50, 4)) + [50]
    assert all('lars/ratio/predictor/l1/W' in entry for entry in log[1:])
    ends = [entry for entry in log if entry['iteration'] in (0, 25, 50)]
    spans = numpy.diff([e['iteration'] for e in log[:8]])  # to 25
    with numpy.load(str(out / 'snapshot_iter_50')) as npz:
        for key, name in (('loss', 'loss.png'),
                          ('accuracy', 'accuracy.png')):
            plotted, = [json.loads(str(npz[k])) for k in npz.files
                        if k.endswith('/_plot_' + name)]
            assert plotted['val/main/' + key] == [
                [e['epoch'], pytest.approx(e['val/main/' + key])]
                for e in ends]
            # The training loss and accuracy: the epoch's mean, as before.
            assert dict(plotted['main/' + key])[1] == pytest.approx(
                numpy.dot([e['main/' + key] for e in log[1:8]], spans) / 25)


@pytest.mark.parametrize('epochs', [1, 3, 30])
def test_epoch_axis_has_whole_epochs(epochs):
    """A one-epoch run reads 0 and 1, not 0, 0.2, ..., 1."""
    import matplotlib.pyplot as plt
    figure, axes = draw_epochs(
        {'test/main/accuracy': numpy.linspace(0.1, 0.9, epochs + 1)},
        percent=True)
    figure.canvas.draw()
    ticks = [t for t in axes.get_xticks()
             if axes.get_xlim()[0] <= t <= axes.get_xlim()[1]]
    assert all(t == int(t) for t in ticks) and ticks[0] == 0
    if epochs <= 3:
        assert ticks == list(range(epochs + 1))
    assert drawn(axes)['test'][-1] == (epochs, pytest.approx(90))
    plt.close(figure)


def _laid_out(figures, monkeypatch):
    """Keeps, for each picture a run saves, the legend's texts, where the
    legend, the axes and the x axis's labels are (in pixels) and the
    saved picture's width."""
    import matplotlib.image
    import matplotlib.pyplot as plt
    save = plt.Figure.savefig

    def keep(figure, path, *args, **kwargs):
        save(figure, path, *args, **kwargs)
        renderer = figure.canvas.get_renderer()
        axes = figure.axes[0]
        legend = axes.get_legend()
        figures[os.path.basename(str(path))] = types.SimpleNamespace(
            texts=legend and [t.get_text() for t in legend.get_texts()],
            boxes=legend and [t.get_window_extent(renderer)
                              for t in legend.get_texts()],
            legend=legend and legend.get_window_extent(renderer),
            axes=axes.get_window_extent(renderer),
            xaxis=axes.xaxis.get_tightbbox(renderer),
            title=axes.get_title(), xlim=axes.get_xlim(),
            band=axes.patches and tuple(
                axes.patches[0].get_x() + numpy.array(
                    [0, axes.patches[0].get_width()])),
            points=[(float(x), float(y)) for line in axes.get_lines()[:1]
                    for x, y in zip(*line.get_data())],
            width=matplotlib.image.imread(str(path)).shape[1])

    monkeypatch.setattr(plt.Figure, 'savefig', keep)


@pytest.mark.parametrize('name,flags,curves', [
    ('mnist', ['-b', '32', '-e', '2'], ['train', 'test']),
    ('mnist', ['-b', '32', '-e', '2', '--optimizer', 'momentum-lars'],
     ['train', 'test']),
    # Diverges at its second update: the band's entry is the widest.
    ('mnist', ['-b', '16', '-e', '4', '--optimizer', 'momentum', '--lr',
               '1e30', '--validation', '16'],
     ['train', 'test', 'validation', 'diverged at epoch 0.67:\nloss not '
      'finite, not drawn']),
    ('mnist', ['-b', '16', '-e', '2', '--validation', '16', '--test',
               'never', '--label-smoothing', '0.1'], ['train', 'validation']),
    ('mnist', ['-b', '2', '-e', '1', '--validation', '14', '--eval-every',
               '4'], ['train', 'test', 'validation']),
    ('cifar', ['-b', '16', '--depth', '8', '-e', '1'], ['train', 'test']),
])
def test_epoch_plots_keep_their_width_with_the_legend_under_the_axes(
        request, dataset_root, tmp_path, monkeypatch, name, flags, curves):
    """loss.png's and accuracy.png's legend is one row under the x axis:
    beside the axes (PlotReport's place) it left them 73 % of the
    picture's width, 50 % for a diverged run's; it covers no data."""
    figures = {}
    _laid_out(figures, monkeypatch)
    argv = flags + ['--progress', 'none', '--dataset-root', dataset_root,
                    '--out', str(tmp_path / 'out')]
    if name == 'mnist':
        argv += ['-u', '8']
    try:
        request.getfixturevalue(name).main(argv)
    except SystemExit as exc:  # the diverged run
        assert exc.code == 1 and 'diverged' in curves[-1]
    for png in ('loss.png', 'accuracy.png'):
        drawn = figures[png]
        assert drawn.texts == curves, png
        assert drawn.legend.y1 <= drawn.xaxis.y0, png  # under the labels
        assert max(box.y0 for box in drawn.boxes) < min(
            box.y1 for box in drawn.boxes), png  # one row
        assert drawn.axes.width >= 0.8 * drawn.width, png


class IterationTrainer(object):
    """What IterationPlot reads of a trainer: the observation, the epoch
    and ``out``."""

    def __init__(self, out):
        self.out = out
        self.observation = {}
        self.updater = types.SimpleNamespace(epoch_detail=0.0,
                                             is_new_epoch=False)

    def update(self, epoch_detail, lr, is_new_epoch):
        self.updater.epoch_detail = epoch_detail
        self.updater.is_new_epoch = is_new_epoch
        self.observation = {'lr': lr}


def test_lr_plot_marks_where_the_run_diverged(tmp_path, monkeypatch):
    """lr.png said nothing of a divergence that loss.png and accuracy.png
    mark: it is titled "(diverged)" and has their red band, its entry in
    a legend under the axes; the rates, the schedule's, are still drawn."""
    figures = {}
    _laid_out(figures, monkeypatch)
    divergence = training.Divergence('out')
    plot = plots.IterationPlot('lr', 'lr.png', 'learning rate',
                               title='momentum, batch 16',
                               divergence=divergence)
    trainer = IterationTrainer(str(tmp_path))
    drawn = []
    for k, lr in enumerate([0.5, 1.0, 0.8, 0.6, 0.4, 0.2], 1):
        if k == 4:  # the loss of update 4 is not finite
            divergence.found = (4, 2.0, math.nan)
        trainer.update(k / 2, lr, is_new_epoch=k % 2 == 0)
        plot(trainer)
        if trainer.updater.is_new_epoch:
            drawn.append(figures.pop('lr.png'))
    before, _, after = drawn
    assert before.texts is None and before.title == 'momentum, batch 16'
    assert after.title == 'momentum, batch 16 (diverged)'
    assert after.texts == ['diverged at epoch 2:\nloss not finite from '
                           'here on']
    assert after.legend.y1 <= after.xaxis.y0  # under the axes
    (band_left, band_right), right = after.band, after.xlim[1]
    assert band_left == 2 and band_right == right >= 3
    assert after.points == [(k / 2, lr) for k, lr in enumerate(
        [0.5, 1.0, 0.8, 0.6, 0.4, 0.2], 1)]


def test_lr_and_loss_scale_plots_show_a_single_update(
        tmp_path, monkeypatch):
    """A run of one update (the CIFAR example on fake data) drew lr.png
    and loss_scale.png as empty frames: a line through one point is
    nothing. A lone point is a dot, each point of a short series too."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.colors
    import matplotlib.image
    import matplotlib.pyplot as plt
    save = plt.Figure.savefig
    around = {}  # the pixels around the point, as saved

    def keep(figure, path, *args, **kwargs):
        save(figure, path, *args, **kwargs)
        line = figure.axes[0].get_lines()[0]
        x, y = line.get_transform().transform(line.get_xydata()[0])
        row, column = int(figure.bbox.height - y), int(x)
        around[os.path.basename(str(path))] = matplotlib.image.imread(
            str(path))[row - 6:row + 7, column - 6:column + 7, :3]

    monkeypatch.setattr(plt.Figure, 'savefig', keep)

    class Scaling(object):
        last_loss_scale, last_skipped, skipped_updates = 2.0 ** 16, False, 0

    trainer = IterationTrainer(str(tmp_path))
    trainer.update(1.0, 0.25, is_new_epoch=True)
    plots.IterationPlot('lr', 'lr.png', 'learning rate')(trainer)
    plots.LossScalePlot(Scaling())(trainer)
    for name in ('lr.png', 'loss_scale.png'):
        # A dot of 8 points at 100 dpi: about 80 pixels of the line's
        # colour.
        dot = (abs(around[name] - matplotlib.colors.to_rgb('C0')).max(
            axis=-1) < 0.05).sum()
        assert dot >= 50, name
    # Up to 50 points a dot each (a default MNIST run's 8 an epoch for
    # 6 epochs); beyond, they would merge into a thick line.
    assert plots.point_markers(2) == plots.point_markers(50) == {
        'marker': 'o', 'markersize': 4}
    assert plots.point_markers(51) == {}


def test_run_title_names_optimizer_batch_rate_and_dtype():
    args = cli.argparse.Namespace(optimizer='lars', batchsize=1024, lr=0.5)
    assert plots.run_title(args) == 'lars, batch 1024, peak lr 0.5, float32'
    with chainer.using_config('dtype', numpy.float16):
        assert plots.run_title(args, processes=4) == (
            'lars, batch 4096 (1024 x 4 processes), peak lr 0.5, float16')
    # float16 parameters with float32 masters: not plain float16.
    with chainer.using_config('dtype', chainer.mixed16):
        assert plots.run_title(args) == (
            'lars, batch 1024, peak lr 0.5, mixed16')
    for name in ('adam', 'lamb'):  # --lr sets alpha, their schedule's
        args.optimizer = name
        assert plots.run_title(args) == (
            '{}, batch 1024, peak alpha 0.5, float32'.format(name))


def test_trust_ratio_heatmap_columns_span_their_epochs(mnist, dataset_root,
                                                       tmp_path,
                                                       monkeypatch):
    """Each column spans the epoch it averages, ticks at whole epochs; the
    title names the run."""
    import matplotlib.pyplot as plt
    figures = []
    save = plt.Figure.savefig

    def keep(figure, path, *args, **kwargs):
        if os.path.basename(str(path)) == 'trust_ratio.png':
            figure.canvas.draw()
            axes = figure.axes[0]
            edges = axes.collections[0].get_coordinates()[0, :, 0]
            figures.append(((edges[0], edges[-1]) + axes.get_xlim(),
                            list(axes.get_xticks()), axes.get_title()))
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, 'savefig', keep)
    mnist.main(['-b', '32', '-u', '8', '-e', '1', '--lr', '0.4', '--out',
                str(tmp_path / 'out')])
    (left, right, low, high), ticks, title = figures[-1]
    assert (left, right) == (low, high) == (0, 1)
    assert [t for t in ticks if left <= t <= right] == [0, 1]
    assert title.startswith('lars, batch 32, peak lr 0.4, float32\n')


def test_a_diverged_run_stops_says_so_and_exits_1(mnist, dataset_root,
                                                  tmp_path, capsys):
    """At once a line; the epoch ends (so that the log and the plots have
    it), the run stops before --epoch, and the status is 1."""
    out = tmp_path / 'out'
    with pytest.raises(SystemExit) as exc:
        # 4 updates an epoch; the loss of the second is not finite.
        mnist.main(['-b', '16', '-u', '8', '-e', '4', '--optimizer',
                    'momentum', '--lr', '1e30', '--out', str(out)])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if 'diverged' in line]
    assert len(said) == 2, err
    assert re.match(r'\S+: the training loss is (nan|inf|-inf) at iteration '
                    r'2 \(epoch 0\.50\): the run diverged', said[0]), err
    assert said[1].endswith('stopped: the run diverged (see above); the log '
                            'and the plots in {} show it'.format(out))
    log = read_log(str(out))
    assert [entry['iteration'] for entry in log] == [0, 4]
    assert not math.isfinite(log[-1]['main/loss'])
    assert {'loss.png', 'accuracy.png', 'lr.png'} <= set(
        os.listdir(str(out)))


def test_a_diverged_run_s_snapshot_is_not_resumed(mnist, dataset_root,
                                                  tmp_path, capsys):
    """Its weights are not finite: resumed, the run drew epochs of a NaN
    model and marked the divergence at another epoch."""
    out = tmp_path / 'out'
    args = ['-b', '16', '-u', '8', '-e', '4', '--optimizer', 'momentum',
            '--lr', '1e30', '--noplot']
    with pytest.raises(SystemExit):
        mnist.main(args + ['--out', str(out)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        mnist.main(args + ['--out', str(tmp_path / 'again'), '--resume',
                           str(out / 'snapshot_iter_4')])
    assert exc.value.code == 2
    error = capsys.readouterr().err.strip()
    assert re.search(r'--resume \S+snapshot_iter_4: the run had diverged '
                     r"\(its training loss was (nan|inf) in the log's line "
                     r'at iteration 4\) and stopped there: resume from a '
                     r'snapshot written before', error), error
    assert not (tmp_path / 'again').exists()
    # Its folder, given again without --resume, is not offered for one.
    with pytest.raises(SystemExit) as exc:
        mnist.main(args + ['--out', str(out)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        '--out {}: holds a diverged run (log, snapshot_iter_4); give '
        'another --out, or --overwrite to remove it and start over'.format(
            out))


def test_trust_ratio_rows_in_the_models_layer_order(cifar):
    model = chainer.links.Classifier(cifar.ResNet(8, 10))
    paths = [path for path in recipe.parameter_paths(model)
             if path.endswith('/W')]
    assert sorted(paths) == sorted(path for path, _ in model.namedparams()
                                   if path.endswith('/W'))
    assert paths == ['/predictor/conv1/W', '/predictor/res2/0/conv1/W',
                     '/predictor/res2/0/conv2/W', '/predictor/res3/0/conv1/W',
                     '/predictor/res3/0/conv2/W',
                     '/predictor/res3/0/conv_skip/W',
                     '/predictor/res4/0/conv1/W', '/predictor/res4/0/conv2/W',
                     '/predictor/res4/0/conv_skip/W', '/predictor/fc/W']


@pytest.mark.parametrize('low,high,ticks', [
    (0.03, 1.3, [0.03, 0.1, 0.3, 1]),
    (0.04, 1.3, [0.05, 0.1, 0.2, 0.5, 1]),
    (1e-4, 10, [1e-4, 1e-3, 1e-2, 0.1, 1, 10]),
    (0.11, 0.3, [0.12, 0.15, 0.2, 0.25, 0.3]),
    # Narrower: multiples of a round step (they were 0.011, 0.0126, ...).
    (0.011, 0.019, [0.012, 0.014, 0.016, 0.018]),
    (0.0101, 0.0109, [0.0102, 0.0104, 0.0106, 0.0108]),
    (0.98, 1.02, [0.98, 0.99, 1, 1.01, 1.02]),
    (0.1001, 0.1002, [0.1001, 0.10012, 0.10014, 0.10016, 0.10018, 0.1002]),
])
def test_trust_ratio_colour_bar_has_round_ticks(low, high, ticks):
    got = plots.ratio_ticks(low, high)
    assert got == pytest.approx(ticks, rel=1e-12)
    # Labelled as they are, each its own (3 digits would say 0.1 six times).
    assert [float(label) for label in plots.tick_labels(got)] == \
        pytest.approx(ticks, rel=1e-12)


def test_unround_ticks_are_labelled_with_three_digits():
    assert plots.tick_labels([0.02506, 0.151323, 0.913761, 5.5177]) == [
        '0.0251', '0.151', '0.914', '5.52']
    # Over decades, as the bar is: 3 digits each (they took 5 when the
    # labels' error was measured against the smallest linear gap).
    assert plots.tick_labels([0.000272, 0.0112020, 0.461345, 19.0]) == [
        '0.000272', '0.0112', '0.461', '19']


@pytest.mark.parametrize('low,high', [(1.0, 1.0000001), (123.4, 123.40001)])
def test_ticks_of_a_range_finer_than_their_rounding_are_distinct(low, high):
    # The round steps' ticks, rounded to 6 digits, were one value 4 times.
    ticks = plots.ratio_ticks(low, high)
    assert len(set(ticks)) == len(ticks) >= 2


@pytest.mark.parametrize('low,high,room,ticks', [
    (0.01, 0.09, 0.0, [0.01, 0.015, 0.02, 0.03, 0.05, 0.07]),
    (0.01, 0.09, 0.13, [0.01, 0.02, 0.05]),  # 0.015 to 0.02 is 0.125
    (0.01, 0.09, 0.5, [0.01, 0.09]),
    (0.011, 0.019, 0.1, [0.011, 0.011 * (19 / 11) ** 0.5, 0.019]),
    (0.011, 0.019, 1.0, [0.011, 0.019]),
    # Where the evenly spaced ones would be 3 or 2, a round pair that has
    # the room (a mixed16 MNIST run's bar was 0.061, 0.117, 0.223, 0.426).
    (0.0613, 0.426, 0.2, [0.1, 0.3]),
    # A default 4-epoch MNIST run's bar: its room at 1.5 label sizes was
    # 0.47847, and the round ticks (0.477 apart) gave way to 5 unround
    # ones; at TICK_LABEL_SPACING's 1.4 they keep it (the room scales with
    # the spacing: read here, so that the constant is pinned).
    (0.02506, 5.5177, 0.47847 / 1.5 * plots.TICK_LABEL_SPACING,
     [0.03, 0.1, 0.3, 1.0, 3.0]),
    # Without it: fewer evenly spaced ones than those 5.
    (0.02506, 5.5177, 0.5, [0.02506 * (5.5177 / 0.02506) ** (i / 3)
                            for i in range(4)]),
])
def test_trust_ratio_colour_bar_s_ticks_keep_their_room(low, high, room,
                                                        ticks):
    """No two ticks closer than ``room`` decades (a label's height on the
    bar): the round ticks that have it, 3 at least, else fewer evenly
    spaced ones than the round set that lacked it, the ends at least."""
    got = plots.ratio_ticks(low, high, room=room)
    assert got == pytest.approx(ticks)
    assert len(got) == 2 or all(math.log10(b / a) >= room
                                for a, b in zip(got, got[1:]))


class LoggedTrainer(object):
    """What TrustRatioHeatmap reads of a trainer: the log and ``out``."""

    def __init__(self, log, out):
        self.out = out
        self._log = type('LogReport', (), {'log': log})()

    def get_extension(self, name):
        assert name == 'LogReport'
        return self._log


@pytest.mark.parametrize('losses', [[1.0, 0.5, math.nan, math.nan],
                                    [math.nan]])
def test_trust_ratio_heatmap_draws_no_diverged_epoch(tmp_path, monkeypatch,
                                                     losses):
    """The epochs whose loss is not finite are not drawn (the observer
    reads 1 where the norms are NaN): a red background says why."""
    import matplotlib.pyplot as plt
    keys = ['lars/ratio/predictor/l1/W', 'lars/ratio/predictor/l2/W']
    log = [{'epoch': e + 1, 'main/loss': loss, keys[0]: 0.1 * (e + 1),
            keys[1]: 1.0 if loss != loss else 0.2}
           for e, loss in enumerate(losses)]
    drawn = []
    monkeypatch.setattr(plt.Figure, 'savefig',
                        lambda figure, path, **kwargs: drawn.append(figure))
    plots.TrustRatioHeatmap(keys, title='lars, batch 8')(
        LoggedTrainer(log, str(tmp_path)))
    figure, = drawn
    axes = figure.axes[0]
    image = numpy.ma.asarray(axes.collections[0].get_array()).reshape(2, -1)
    alive = [i for i, loss in enumerate(losses) if loss == loss]
    assert [i for i in range(len(losses)) if not image.mask[:, i].all()] == (
        alive)
    numpy.testing.assert_allclose(image[:, alive].filled(0),
                                  [[0.1 * (i + 1) for i in alive],
                                   [0.2 for _ in alive]])
    assert axes.get_title().startswith('lars, batch 8 (diverged)\n')
    dead = len(alive) + 1
    assert [t.get_text() for t in axes.texts] == [
        'diverged in epoch {}:\nloss not finite, not drawn'.format(dead)]
    # A colour bar only for values drawn.
    assert len(figure.axes) == (2 if alive else 1)
    plt.close(figure)


def test_trust_ratio_heatmap_places_eval_every_s_columns_by_iteration(
        tmp_path, monkeypatch):
    """With --eval-every the log has a line per evaluation: a column
    each, from the line before to its own, in epochs (not a column an
    epoch from epoch - 1, which drew a 2-epoch run from -1 to 2)."""
    import matplotlib.pyplot as plt
    keys = ['lars/ratio/predictor/l1/W', 'lars/ratio/predictor/l2/W']
    # 13.75 iterations an epoch, --eval-every 4; the line before training
    # has no ratios.
    ends = [0, 4, 8, 12, 14, 16, 20, 24, 28]
    log = [{'epoch': int(i // 13.75), 'iteration': i, 'main/loss': 1.0}
           for i in ends]
    for k, entry in enumerate(log[1:]):
        entry.update({keys[0]: 0.1 * (k + 1), keys[1]: 0.5})
    drawn = []
    monkeypatch.setattr(plt.Figure, 'savefig',
                        lambda figure, path, **kwargs: drawn.append(figure))
    plots.TrustRatioHeatmap(keys, iterations_per_epoch=13.75, every=4)(
        LoggedTrainer(log, str(tmp_path)))
    figure, = drawn
    axes = figure.axes[0]
    mesh = axes.collections[0]
    image = numpy.ma.asarray(mesh.get_array()).reshape(2, -1)
    numpy.testing.assert_allclose(image[0], [0.1 * k for k in range(1, 9)])
    edges = mesh.get_coordinates()[0, :, 0]
    # Epochs end at iterations 14 and 28: drawn at 1 and 2.
    numpy.testing.assert_allclose(
        edges, numpy.array([0, 4, 8, 12, 13.75, 16, 20, 24, 27.5]) / 13.75)
    assert axes.get_xlim()[0] >= 0 and axes.get_xlim()[1] <= 28 / 13.75 + .1
    assert 'one every 4 iterations' in axes.get_xlabel()
    plt.close(figure)


@pytest.mark.parametrize('every', [None, 4])
@pytest.mark.parametrize('epochs', [1, 2, 10])
def test_trust_ratio_heatmap_s_labels_are_inside_the_picture(
        tmp_path, monkeypatch, epochs, every):
    """A short run's figure is narrow (a quarter of an inch a column):
    the x label on one line was cut at both ends ("poch (each column...")
    at 1 and 2 epochs."""
    import matplotlib.pyplot as plt
    keys = ['lars/ratio/predictor/l1/W', 'lars/ratio/predictor/l2/W']
    log = [{'epoch': e + 1, 'iteration': 10 * (e + 1), 'main/loss': 1.0,
            keys[0]: 0.1 * (e + 1), keys[1]: 0.2} for e in range(epochs)]
    figure, renderer = _drawn_heatmap(keys, log, every, tmp_path,
                                      monkeypatch)
    for axes in figure.axes:
        for text in (axes.xaxis.label, axes.yaxis.label, axes.title):
            if text.get_text():
                box = text.get_window_extent(renderer)
                assert 0 <= box.x0 and box.x1 <= figure.bbox.width, (
                    text.get_text())
    plt.close(figure)


def _drawn_heatmap(keys, log, every, tmp_path, monkeypatch, title=None):
    """The trust-ratio heat map of ``log``, drawn: its figure and renderer
    (``plt.close(figure)`` after)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    import matplotlib.pyplot as plt
    drawn = []
    monkeypatch.setattr(plt.Figure, 'savefig',
                        lambda figure, path, **kwargs: drawn.append(figure))
    plots.TrustRatioHeatmap(keys, iterations_per_epoch=10, every=every,
                            title=title)(LoggedTrainer(log, str(tmp_path)))
    figure, = drawn
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return figure, canvas.get_renderer()


def _weight_ratio_keys(cifar, depth):
    """The ratio keys of the weights: the MLP's 3 (``depth`` None) or a
    CIFAR ResNet's of that depth."""
    if depth is None:
        return ['lars/ratio/predictor/l{}/W'.format(i) for i in (1, 2, 3)]
    return ['lars/ratio' + path for path in recipe.parameter_paths(
        chainer.links.Classifier(cifar.ResNet(depth, 10)))
        if path.endswith('/W')]


@pytest.mark.parametrize('depth', [None, 8, 56, 110])
@pytest.mark.parametrize('every', [None, 4])
def test_trust_ratio_heatmap_s_row_labels_are_readable_and_apart(
        cifar, tmp_path, monkeypatch, depth, every):
    """One size for every model's row labels, and no two overlap: the
    figure grows a row's height with each row. The font shrank with the
    rows instead, to 4 points for ResNet-110's 112 (illegible)."""
    import matplotlib.pyplot as plt
    keys = _weight_ratio_keys(cifar, depth)
    log = [{'epoch': e + 1, 'iteration': 10 * (e + 1), 'main/loss': 1.0,
            **{key: 0.01 * (k + 1) * (e + 1) for k, key in enumerate(keys)}}
           for e in range(2)]
    figure, renderer = _drawn_heatmap(keys, log, every, tmp_path,
                                      monkeypatch)
    labels = [t for t in figure.axes[0].get_yticklabels() if t.get_text()]
    assert len(labels) == len(keys)
    assert {t.get_fontsize() for t in labels} == {plots.ROW_LABEL_POINTS}
    assert plots.ROW_LABEL_POINTS >= 7
    boxes = sorted((t.get_window_extent(renderer) for t in labels),
                   key=lambda box: box.y0)
    for below, above in zip(boxes, boxes[1:]):
        assert below.y1 <= above.y0, (below, above)
    assert boxes[0].y0 >= 0 and boxes[-1].y1 <= figure.bbox.height
    plt.close(figure)


@pytest.mark.parametrize('low,high', [(0.01, 0.09), (0.0015, 0.012),
                                      (0.011, 0.019), (1e-4, 1.0),
                                      (0.02506, 5.5177)])
@pytest.mark.parametrize('depth', [None, 8, 110])
def test_trust_ratio_heatmap_s_colour_bar_labels_are_apart(
        cifar, tmp_path, monkeypatch, depth, low, high):
    """The colour bar is as long as the rows: the MLP's 3 rows had 6 labels
    over 0.01 to 0.09 (0.01, 0.015 and 0.02 collided); its ticks have a
    label's room. ResNet-8's and -110's long bars keep theirs, and the
    MLP's the round ones of a default MNIST run (0.025 to 5.5)."""
    import matplotlib.pyplot as plt
    keys = _weight_ratio_keys(cifar, depth)
    cells = 10 * len(keys)
    log = [{'epoch': e + 1, 'iteration': 10 * (e + 1), 'main/loss': 1.0,
            **{key: low * (high / low) ** ((10 * k + e) / (cells - 1))
               for k, key in enumerate(keys)}} for e in range(10)]
    figure, renderer = _drawn_heatmap(
        keys, log, None, tmp_path, monkeypatch,
        title='lars, batch 8192, peak lr 2.82843, float32')
    bar = figure.axes[1]
    labels = [t for t in bar.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3
    boxes = sorted((t.get_window_extent(renderer) for t in labels),
                   key=lambda box: box.y0)
    # At least a fifth of a label's height between two.
    space = 0.2 * labels[0].get_fontsize() * figure.dpi / 72
    for below, above in zip(boxes, boxes[1:]):
        assert above.y0 - below.y1 >= space, [t.get_text() for t in labels]
    if depth is not None:  # as many as before: the bars are long
        assert len(labels) == len(plots.ratio_ticks(low, high))
    elif (low, high) == (0.02506, 5.5177):
        assert [t.get_text() for t in labels] == [
            '0.03', '0.1', '0.3', '1', '3']
    plt.close(figure)


def test_chainermn_without_mpi4py_says_so_in_one_line(
        chainermn_example, dataset_root, tmp_path, monkeypatch, capsys):
    import chainermn

    def create_communicator(name):
        raise ImportError("No module named 'mpi4py': ChainerMN requires "
                          'mpi4py for distributed training. ...')
    monkeypatch.setattr(chainermn, 'create_communicator', create_communicator)
    with pytest.raises(SystemExit) as exc:
        chainermn_example.main(['--dataset-root', dataset_root, '--out',
                                str(tmp_path / 'out')])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    assert err.splitlines()[-1].endswith(
        "ChainerMN cannot start (No module named 'mpi4py'): install Open "
        'MPI and mpi4py, as examples/chainermn/README.md says'), err


@pytest.mark.parametrize('name', ['mnist', 'cifar', 'chainermn_example'])
def test_values_derived_from_flags_are_checked_like_flags(
        request, capsys, name):
    """The learning rate follows from the batch size and the trust
    coefficient: where it overflows, a usage error names the flags."""
    example = request.getfixturevalue(name)
    flags, names = ['--trust-coefficient', '1.2e-38', '-b', '1000000000'], [
        '--trust-coefficient 1.2e-38 with --batchsize 1000000000']
    err = usage_error(example.parse_args, flags + ['-e', '1'], capsys)
    assert 'Traceback' not in err and 'usage:' in err
    line = err.splitlines()[-1]
    assert 'lr' in line and all(n in line for n in names), err
    # Beyond float32's largest number, where the optimizer computes.
    assert ('of 8.235e+38, which must be from 1.175e-38 to 3.403e+38'
            in line), err


def test_more_iterations_than_the_schedule_counts_is_a_usage_error(
        mnist, dataset_root, tmp_path, capsys):
    err = usage_error(mnist.main, ['-b', '32', '-e', str(2 ** 53), '--out',
                                   str(tmp_path / 'out'), '--noplot'],
                      capsys)
    assert '--epoch {} with --batchsize 32 and 64 training examples'.format(
        2 ** 53) in err and 'Traceback' not in err


@pytest.fixture
def cifar_snapshot(cifar, dataset_root, tmp_path_factory):
    """A snapshot of epoch 1 of a 2-epoch CIFAR run, and the run's flags."""
    args = ['-b', '16', '--depth', '8', '--noplot', '-e', '2']
    out = tmp_path_factory.mktemp('run')
    cifar.main(args + ['--out', str(out), '--snapshots', '2'])
    return str(out / 'snapshot_iter_2'), args


@pytest.mark.parametrize('name', ['mnist', 'cifar'])
@pytest.mark.parametrize('damage', ['missing', 'shape'])
def test_resume_refuses_a_snapshot_with_a_missing_or_misshapen_entry(
        request, tmp_path, capsys, name, damage):
    """One line naming the entry, before anything is trained."""
    main = request.getfixturevalue(name).main
    snapshot, args = request.getfixturevalue(name + '_snapshot')
    with numpy.load(snapshot) as npz:
        arrays = {key: npz[key] for key in npz.files}
    # A momentum buffer (loaded into a rule that has none yet) and a weight.
    entry = 'updater/optimizer:main/predictor/l1/W/v' if name == 'mnist' else (
        sorted(k for k in arrays if k.startswith('updater/model:main/')
               and k.endswith('/W'))[0])
    for key in [entry] + [k for k in arrays if k.endswith('/W/v')][:1]:
        damaged = dict(arrays)
        if damage == 'missing':
            del damaged[key]
        else:
            damaged[key] = damaged[key][..., :-1]
        path = str(tmp_path / 'damaged.npz')
        numpy.savez_compressed(path, **damaged)
        out = tmp_path / 'resumed'
        err = usage_error(main, args + ['--resume', path, '--out', str(out)],
                          capsys)
        assert len(err.splitlines()) == 1 and key in err, err
        assert ('the snapshot has no entry ' + key if damage == 'missing'
                else 'the snapshot has the entry {} of shape {}, where this '
                'run has {}'.format(key, damaged[key].shape,
                                    arrays[key].shape)) in err, err
        assert not out.exists()


def test_resume_refuses_a_snapshot_of_no_loss_scale_in_one_line(
        mnist, mnist_snapshot, tmp_path, capsys):
    """The library's refusal of what it loads (here a loss scale of 0) is
    a usage error, as the examples' own checks are; it was a traceback."""
    snapshot, args = mnist_snapshot
    with numpy.load(snapshot) as npz:
        arrays = {key: npz[key] for key in npz.files}
    arrays['updater/optimizer:main/loss_scale'] = numpy.asarray(0.0)
    path = str(tmp_path / 'edited.npz')
    numpy.savez_compressed(path, **arrays)
    out = tmp_path / 'resumed'
    err = usage_error(mnist.main, args + ['--resume', path, '--out', str(out)],
                      capsys)
    assert err.splitlines()[-1].endswith(
        '--resume {}: LARS: the snapshot holds loss_scale = 0.0: not a loss '
        'scaling setting'.format(path)), err
    assert 'Traceback' not in err and not out.exists()


def _optimizer_choices(module, capsys):
    with pytest.raises(SystemExit):
        importlib.import_module(module).parse_args(['--help'])
    usage = capsys.readouterr().out
    return set(re.search(r'--optimizer \{([^}]*)\}', usage).group(1)
               .split(','))


def _readme(path):
    with open(os.path.join(REPO_ROOT, path)) as f:
        return f.read()


NUMBERS = {4: 'four', 5: 'five', 6: 'six', 7: 'seven'}


@pytest.mark.parametrize('module,readme', [
    ('examples.mnist.train_mnist', 'examples/mnist/README.md'),
    ('examples.cifar.train_cifar', 'examples/cifar/README.md'),
])
def test_readme_tables_list_the_optimizers_of_help(capsys, module, readme):
    """The README's `--optimizer` table has a row for each choice of
    --help, and its count says as many."""
    choices = _optimizer_choices(module, capsys)
    text = _readme(readme)
    table = text[text.index('| `--optimizer` | what it is |'):]
    table = table[:table.index('\n\n')]
    rows = set(re.findall(r'^\| `([a-z][a-z-]*)`', table, re.M))
    assert rows == choices
    assert 'one of {} optimizers'.format(NUMBERS[len(choices)]) in ' '.join(
        text.split())


def test_readmes_list_every_optimizer_and_its_flags(capsys):
    """examples/README.md's opening and ChainerMN's option list name the
    choices of --optimizer of every trainer, and the Adam-like flags."""
    for module in ('examples.mnist.train_mnist',
                   'examples.cifar.train_cifar',
                   'examples.chainermn.mnist.train_mnist'):
        choices = _optimizer_choices(module, capsys)
        opening = ' '.join(
            _readme('examples/README.md').split('\n## ')[0].split())
        assert 'the same {} optimizers'.format(
            NUMBERS[len(choices)]) in opening
        for choice in choices:
            assert '`{}`'.format(choice) in opening, choice
    text = ' '.join(_readme('examples/chainermn/README.md').split())
    listed = re.search(r'`--optimizer ([a-z|-]+)`', text).group(1)
    assert set(listed.split('|')) == _optimizer_choices(
        'examples.chainermn.mnist.train_mnist', capsys)
    for flag in ('--beta2', '--eps'):
        assert '`{}`'.format(flag) in text


def test_mnist_readme_quotes_the_mixed16_cost_model():
    """The cost paragraph of examples/mnist/README.md is the output of the
    command it names, ``python benchmarks/paper_model.py``."""
    env = dict(os.environ, PYTHONPATH=pythonpath())
    out = subprocess.run(
        [sys.executable, os.path.join('benchmarks', 'paper_model.py')],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, universal_newlines=True, check=True).stdout
    text = ' '.join(_readme('examples/mnist/README.md').split())
    assert 'By `python benchmarks/paper_model.py`' in text
    lars32 = re.search(r'^\| `lars` \| (\d+) N = (\d+) / \d+ MB \| (\d+) \| '
                       r'([\d.]+) / [\d.]+ ms \|$', out, re.M)
    assert ('`lars` step moves {} bytes a parameter in float32, {} MB, {} '
            'ms, in {} launches'.format(*lars32.group(1, 2, 4, 3))) in text
    mixed = dict((m.group(1), m.group(2, 3, 5, 4)) for m in re.finditer(
        r'^mixed16 `(\w+)`: (\d+) N = (\d+) MB, (\d+) launches, ([\d.]+) ms$',
        out, re.M))
    assert set(mixed) == {'lars', 'momentum_sgd'}
    assert ('{} bytes a parameter, {} MB, {} ms, still {} launches'.format(
        *mixed['lars'])) in text
    assert ('{} bytes a parameter, {} MB, {} ms, in {} launches'.format(
        *mixed['momentum_sgd'])) in text


def _accuracy_axes(curves):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots()
    for x, y in curves:
        axes.plot(x, y, marker='x')
    return figure, axes


@pytest.mark.parametrize('curves, inset', [
    # One epoch: the test set's epochs 0 and 1, the training batches' 1.
    ([([0, 1], [10.3, 93.7]), ([1], [79.2])], False),
    ([([0, 1, 2], [10.3, 95.7, 96.1]), ([1, 2], [79.2, 95.0])], True),
    # Two epochs, the zoom (94 to 97 %) holding the last one's alone.
    ([([0, 1, 2], [10.3, 93.7, 96.1]), ([1, 2], [79.2, 95.0])], False),
    ([([0, 1, 2], [10.3, 53.7, 86.1])], False),  # none above 90 %
])
def test_accuracy_zooms_only_on_two_epochs_or_more(curves, inset):
    """A one-epoch run has one point in the zoom: no inset (it zoomed on
    it with ticks from 0.72 to 1.04, over the plot)."""
    import matplotlib.pyplot as plt
    figure, axes = _accuracy_axes(curves)
    drawn = plots.zoom_inset(axes, axes.get_lines(), (-0.1, 2.1))
    assert (drawn is not None) == inset
    assert len(axes.child_axes) == int(inset)
    plt.close(figure)


def test_loss_scale_plot_has_the_run_s_title(tmp_path, monkeypatch):
    """loss_scale.png is titled as the other plots (examples/README.md)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.figure
    titles = []
    save = matplotlib.figure.Figure.savefig

    def savefig(figure, *args, **kwargs):
        titles.append([a.get_title() for a in figure.axes])
        return save(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, 'savefig', savefig)

    class Scaling(object):
        last_loss_scale, last_skipped, skipped_updates = 2.0, False, 0

    class Updater(object):
        epoch_detail, is_new_epoch = 1.0, True

    class Trainer(object):
        updater, out = Updater(), str(tmp_path)

    title = 'lars, batch 512, peak lr 0.353553, mixed16'
    plots.LossScalePlot(Scaling(), title=title)(Trainer())
    assert titles == [[title]]
    assert (tmp_path / 'loss_scale.png').exists()


def _tiny(dataset_root, out, unit=True):
    return ['-b', '32', '-e', '1', '--progress', 'none',
            '--dataset-root', dataset_root, '--out', str(out)] + (
                ['-u', '8'] if unit else [])


def _another_run(out):
    out.mkdir()
    for name in ('log', 'snapshot_iter_74', 'snapshot_iter_9',
                 'loss_scale.png', 'notes.txt'):
        (out / name).write_text(name)


@pytest.mark.parametrize('name', ['mnist', 'cifar'])
def test_a_new_run_refuses_an_out_holding_another_run(
        request, dataset_root, tmp_path, capsys, name):
    """Running the docs' commands one after another must not delete the
    first run's snapshot nor leave its plots beside the next's."""
    main = request.getfixturevalue(name).main
    out = tmp_path / 'result'
    _another_run(out)
    err = usage_error(main, _tiny(dataset_root, out, name == 'mnist'),
                      capsys)
    line = err.splitlines()[-1]
    assert ('--out {}: holds another run (log, snapshot_iter_9, '
            'snapshot_iter_74); continue it with --resume {}, give another '
            '--out, or --overwrite to remove it and start over'.format(
                out, out / 'snapshot_iter_74')) in line, line
    assert sorted(p.name for p in out.iterdir()) == [
        'log', 'loss_scale.png', 'notes.txt', 'snapshot_iter_74',
        'snapshot_iter_9']


def test_a_new_run_refuses_an_out_holding_a_finished_run(
        cifar, dataset_root, tmp_path, capsys):
    """A finished run's folder was refused with "continue it with
    --resume .../snapshot_iter_4", which --resume then refused: "the run
    is finished ... nothing left to train". It says the run is finished."""
    out = tmp_path / 'result'
    args = ['-b', '16', '--depth', '8', '-e', '2', '--warmup-epochs', '1',
            '--noplot', '--progress', 'none', '--out', str(out)]
    cifar.main(args)
    before = sorted(p.name for p in out.iterdir())
    line = usage_error(cifar.main, args, capsys).splitlines()[-1]
    assert line.endswith(
        '--out {}: holds a finished run (log, snapshot_iter_4); give another '
        '--out, or --overwrite to remove it and start over'.format(out)), line
    assert sorted(p.name for p in out.iterdir()) == before
    # Stopped halfway, it is continued: the snapshot of epoch 1 of 2.
    os.replace(str(out / 'snapshot_iter_4'), str(out / 'snapshot_iter_2'))
    with numpy.load(str(out / 'snapshot_iter_2')) as npz:
        arrays = dict(npz)
    arrays['updater/iterator:main/epoch'] = numpy.asarray(1)
    with open(str(out / 'snapshot_iter_2'), 'wb') as f:
        numpy.savez(f, **arrays)
    line = usage_error(cifar.main, args, capsys).splitlines()[-1]
    assert 'continue it with --resume {}'.format(
        out / 'snapshot_iter_2') in line, line


def test_a_new_run_refuses_an_out_holding_a_log_alone(
        mnist, dataset_root, tmp_path, capsys):
    out = tmp_path / 'result'
    out.mkdir()
    (out / 'log').write_text('[]')
    line = usage_error(mnist.main, _tiny(dataset_root, out),
                       capsys).splitlines()[-1]
    assert line.endswith('--out {}: holds another run (log); give another '
                         '--out, or --overwrite to remove it and start '
                         'over'.format(out)), line


def test_plots_alone_are_no_run(mnist, dataset_root, tmp_path):
    out = tmp_path / 'result'
    out.mkdir()
    (out / 'loss_scale.png').write_text('old')
    mnist.main(_tiny(dataset_root, out) + ['--noplot'])
    assert (out / 'loss_scale.png').read_text() == 'old'  # not its own


def test_overwrite_replaces_the_other_run(mnist, dataset_root, tmp_path):
    out = tmp_path / 'result'
    _another_run(out)
    mnist.main(_tiny(dataset_root, out) + ['--overwrite'])
    names = sorted(p.name for p in out.iterdir())
    # The old run's snapshots and its loss_scale.png (a float32 run draws
    # none) are gone; a file of no run stays.
    assert 'loss_scale.png' not in names and 'snapshot_iter_74' not in names
    assert 'notes.txt' in names and 'accuracy.png' in names
    assert not [n for n in names if n.startswith('.')]  # nothing set aside
    assert [n for n in names if n.startswith('snapshot_')] == [
        'snapshot_iter_{}'.format(len(read_log(str(out))) and
                                  read_log(str(out))[-1]['iteration'])]


@pytest.mark.parametrize('failure', [MemoryError, KeyboardInterrupt])
def test_overwrite_keeps_the_other_run_until_the_first_update(
        mnist, dataset_root, tmp_path, monkeypatch, capsys, failure):
    """A new run that stops before its first update (out of memory on a
    GPU, Ctrl-C) leaves the old run as it was, and nothing of its own."""
    out = tmp_path / 'result'
    _another_run(out)
    before = {p.name: p.read_text() for p in out.iterdir()}

    def first_update(updater):
        raise failure('the first update')
    monkeypatch.setattr(chainer.training.updaters.StandardUpdater,
                        'update_core', first_update)
    with pytest.raises((failure, SystemExit)):
        mnist.main(_tiny(dataset_root, out) + ['--overwrite'])
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    if failure is KeyboardInterrupt:
        assert 'run the command again with --overwrite' in (
            capsys.readouterr().err)


def test_sigterm_keeps_the_overwritten_run_until_the_first_update(
        dataset_root, tmp_path):
    """SIGTERM (kill, a job scheduler, mpiexec's Ctrl-C) during the first
    update of an --overwrite run puts the old run back, as Ctrl-C does."""
    out = tmp_path / 'result'
    _another_run(out)
    before = {p.name: p.read_text() for p in out.iterdir()}
    driver = tmp_path / 'driver.py'
    driver.write_text(
        'import os, signal, sys, time\n'
        'from chainer.training import updaters\n'
        'from examples.mnist import train_mnist\n'
        'def first_update(updater):\n'
        '    os.kill(os.getpid(), signal.SIGTERM)\n'
        '    time.sleep(60)\n'
        'updaters.StandardUpdater.update_core = first_update\n'
        'train_mnist.main(sys.argv[1:])\n')
    environment = dict(os.environ, PYTHONPATH=pythonpath(),
                       PYTHONWARNINGS='ignore')
    result = subprocess.run(
        [sys.executable, str(driver)] + _tiny(dataset_root, out)
        + ['--overwrite'], cwd=str(tmp_path), env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=60)
    assert result.returncode == 143, result.stderr
    line, = result.stderr.strip().splitlines()
    assert line.endswith('run the command again with --overwrite to start '
                         'over'), line
    assert {p.name: p.read_text() for p in out.iterdir()} == before


@pytest.mark.parametrize('names', [['log'], ['snapshot_iter_2'],
                                   ['log', 'accuracy.png']])
@pytest.mark.parametrize('flags', [[], ['--overwrite'], ['--resume']])
def test_a_folder_named_like_a_run_s_file_is_refused(
        mnist, mnist_snapshot, dataset_root, tmp_path, capsys, names,
        flags):
    """A folder under a run file's name is no run's file: --overwrite,
    which removes files, failed on it with IsADirectoryError, and a run
    would have written its log into it (Chainer's writer moves the file
    into a folder of its name). Refused, and nothing removed."""
    snapshot, args = mnist_snapshot
    out = tmp_path / 'result'
    out.mkdir()
    (out / 'snapshot_iter_9').write_text('a run')
    for name in names:
        (out / name).mkdir()
        (out / name / 'mine').write_text('mine')
    if flags == ['--resume']:
        flags = ['--resume', snapshot]
    line = usage_error(mnist.main, args + flags + [
        '--out', str(out), '--dataset-root', dataset_root],
        capsys).splitlines()[-1]
    kept = names
    names = [n for n in names if not n.endswith('.png')]  # --noplot
    one = len(names) == 1
    assert line.endswith(
        "--out {}: holds {}, named like a run's {} but not {}: a run cannot "
        'write over {}, and --overwrite removes files only; move {} away, '
        'or give another --out'.format(
            out, ', '.join(names), 'file' if one else 'files',
            'a file' if one else 'files', 'it' if one else 'them',
            'it' if one else 'them')), line
    assert sorted(p.name for p in out.iterdir()) == sorted(
        kept + ['snapshot_iter_9'])
    for name in kept:
        assert (out / name / 'mine').read_text() == 'mine'


@pytest.mark.parametrize('plot', [True, False])
def test_a_folder_named_like_a_plot_blocks_only_a_run_that_plots(
        mnist, dataset_root, tmp_path, capsys, plot):
    """A folder named like a plot is refused where the run would draw
    that plot into it; with --noplot the run draws none and trains."""
    out = tmp_path / 'result'
    out.mkdir()
    (out / 'loss.png').mkdir()
    (out / 'loss.png' / 'mine').write_text('mine')
    args = ['-b', '32', '-u', '8', '-e', '1', '--out', str(out),
            '--dataset-root', dataset_root] + ([] if plot else ['--noplot'])
    if plot:
        line = usage_error(mnist.main, args, capsys).splitlines()[-1]
        assert line.endswith(
            "--out {}: holds loss.png, named like a run's file but not a "
            'file: a run cannot write over it, and --overwrite removes '
            'files only; move it away, or give another --out'.format(out))
        assert sorted(p.name for p in out.iterdir()) == ['loss.png']
    else:
        mnist.main(args)
        assert (out / 'log').is_file()
    assert (out / 'loss.png' / 'mine').read_text() == 'mine'


def test_overwrite_with_resume_is_refused(mnist, dataset_root, tmp_path,
                                          capsys):
    out = tmp_path / 'result'
    _another_run(out)
    line = usage_error(mnist.main, _tiny(dataset_root, out) + [
        '--overwrite', '--resume', str(out / 'snapshot_iter_74')],
        capsys).splitlines()[-1]
    assert line.endswith('--overwrite starts a new run and --resume '
                         'continues one: give one of them'), line
    assert (out / 'snapshot_iter_74').exists()


@pytest.mark.parametrize('flag', ['--overwrite', '--overw', '--ov'])
def test_resume_command_leaves_overwrite_out(monkeypatch, dataset_root,
                                             tmp_path, flag):
    """Abbreviated too, as argparse takes it."""
    monkeypatch.setenv('CHAINER_LARS_LAUNCHER', 'bash dev.sh mnist')
    argv = ['train_mnist.py', flag, '-b', '64', '--res', 'a/snapshot_iter_1',
            '--resu=a/b', '--out', 'x']
    assert training.resume_command('x/snapshot_iter_8', argv) == (
        'bash dev.sh mnist -b 64 --out x --resume x/snapshot_iter_8')
    args = importlib.import_module('examples.mnist.train_mnist').parse_args(
        argv[1:4] + ['--dataset-root', dataset_root, '-o', str(tmp_path)])
    assert args.overwrite  # what argparse reads


@pytest.mark.parametrize('readme', ['examples/README.md',
                                    'examples/mnist/README.md',
                                    'examples/cifar/README.md',
                                    'examples/chainermn/README.md'])
def test_readmes_leave_the_history_to_history_md(readme):
    """The user's path names no commit: how the numbers came about is in
    examples/HISTORY.md, which has a section for each README."""
    text = _readme(readme)
    commits = [word for word in re.findall(r'\b[0-9a-f]{7,40}\b', text)
               if re.search('[a-f]', word) and re.search('[0-9]', word)]
    assert commits == []
    for phrase in ('older code', 'did before', 'Commits:',
                   'cannot be made again'):
        assert phrase not in text
    assert '\n## {}\n'.format(readme) in _readme('examples/HISTORY.md')


def test_a_silent_rank_ends_late_on_a_usage_error(monkeypatch, capsys):
    """Under mpiexec every rank but 0 parses silently; on a usage error it
    ends only after cli.GRACE seconds, since one that ended first,
    non-zero, made mpiexec stop rank 0 before it said the error (seen
    under load); a rank still running then says it, naming itself (rank
    0 did not find it). --help ends at once, status 0, silently."""
    slept = []
    monkeypatch.setattr(cli.time, 'sleep', slept.append)
    for name in cli.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('OMPI_COMM_WORLD_RANK', '1')
    parser = cli.parser('x', dict(batchsize=8, epoch=1, warmup_epochs=0.5),
                        silent=True)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(['--no-such-flag'])
    assert (stopped.value.code, slept) == (2, [cli.GRACE])
    prog = os.path.basename(sys.argv[0])
    assert capsys.readouterr() == ('', '{}: rank 1 (on {}): error: '
                                   'unrecognized arguments: --no-such-flag\n'
                                   .format(prog, socket.gethostname()))
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(['--help'])
    assert (stopped.value.code, slept) == (0, [cli.GRACE])
    assert capsys.readouterr() == ('', '')


def test_the_generated_cifar_cache_of_the_readme_trains(
        cifar, dataset_root, tmp_path, capsys):
    """examples/cifar/README.md times the trainer on a cache written by
    benchmarks/fake_cifar.py: it is one the trainer reads, of the sizes
    asked, and the tool refuses to write over one. (``dataset_root``
    gives Chainer its root back after the --dataset-root below.)"""
    fake = benchmark('fake_cifar')
    root = str(tmp_path / 'root')
    fake.main([root, '--train', '6', '--test', '3'])
    out = tmp_path / 'out'
    cifar.main(['-d', '-1', '-e', '1', '-b', '4', '--depth', '8',
                '--dataset-root', root, '-o', str(out), '--noplot'])
    assert read_log(str(out))[-1]['iteration'] == 2  # 6 images, batch 4
    for argv, says in (([root], 'is there already'),
                       ([str(tmp_path / 'r2'), '--test', '0'],
                        '--test 0: give at least 1 image')):
        with pytest.raises(SystemExit):
            fake.main(argv)
        assert says in capsys.readouterr().err
