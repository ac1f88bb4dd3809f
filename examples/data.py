"""The data: MNIST and CIFAR through Chainer's loaders, standardized.

Also the CIFAR augmentation, and an iterator whose shuffling resumes
exactly.
"""

import hashlib
import http.client
import os
import socket
import sys
import zipfile
import zlib

import numpy

import chainer
from chainer.dataset import download
from chainer.datasets import _mnist_helper


def load_mnist():
    """MNIST through Chainer's loader, or exit with what is missing or
    cannot be read.

    The images are standardized: shifted and scaled by the mean and the
    standard deviation of all the training pixels (about 0.13 and 0.31),
    the usual preprocessing for MNIST. The model then starts well
    conditioned, which large batches, with few updates, need most.
    """
    directory = _cache('mnist')
    paths = [os.path.join(directory, name)
             for name in ('train.npz', 'test.npz')]
    train, test = _load('MNIST', get_mnist, 'mnist', 'files',
                        {path: [('x', 'y')] for path in paths}, 784)
    x, t = _examples('MNIST', paths[0], train, 10)
    test = _examples('MNIST', paths[1], test, 10)
    return _standardized(x, t, test, x.mean(dtype=numpy.float64),
                         x.std(dtype=numpy.float64))


#: MNIST's files of each of Chainer's cache files, with their MD5 sums, and
#: mirrors that serve them (PyTorch's and TensorFlow's): Chainer downloads
#: them from yann.lecun.com, which refuses (HTTP 403) since 2024.
MNIST_FILES = {
    'train.npz': (('train-images-idx3-ubyte.gz',
                   'f68b3c2dcbeaaa9fbdd348bbdeb94873'),
                  ('train-labels-idx1-ubyte.gz',
                   'd53e105ee54ea40749a09fcbcd1e9432')),
    'test.npz': (('t10k-images-idx3-ubyte.gz',
                  '9fb629c4189551a2d022fa330f9573f3'),
                 ('t10k-labels-idx1-ubyte.gz',
                  'ec29112dd5afa0611ce80d1b7f02629c'))}
MNIST_MIRRORS = ('https://ossci-datasets.s3.amazonaws.com/mnist/',
                 'https://storage.googleapis.com/cvdf-datasets/mnist/')
#: What a download that fails raises (``IncompleteRead``: a response cut
#: short is an ``http.client`` error, not an ``OSError``).
FAILED = (OSError, RuntimeError, http.client.HTTPException)
#: Seconds a download may wait for a server (Chainer's own sets no limit:
#: a server that never answers would hold the trainer forever).
TIMEOUT = 60


def get_mnist():
    """Chainer's ``get_mnist()``; where its download fails, the cache files
    made (by Chainer's code) from a mirror's copies of the four files,
    each checked against its MD5 sum, and read by ``get_mnist()``."""
    try:
        return chainer.datasets.get_mnist()
    except FAILED as e:
        directory = _cache('mnist')
        if all(os.path.lexists(os.path.join(directory, name))
               for name in MNIST_FILES):
            raise  # the cache is there: not a download that failed
        errors = ['yann.lecun.com (Chainer\'s source): {}'.format(e)]
    for mirror in MNIST_MIRRORS:
        try:
            for name, files in MNIST_FILES.items():
                if os.path.lexists(os.path.join(directory, name)):
                    continue  # one made already: read by get_mnist()
                urls = [mirror + f for f, _ in files]
                for url, (_, md5) in zip(urls, files):
                    _verified(download.cached_download(url), md5, url)
                download.cache_or_load_file(  # (Chainer's made the folder)
                    os.path.join(directory, name),
                    lambda path: _mnist_helper.make_npz(path, urls),
                    numpy.load)
            return chainer.datasets.get_mnist()
        except FAILED as e:
            errors.append('{}: {}'.format(mirror, e))
    raise RuntimeError('; '.join(errors))


def _verified(path, md5, url):
    """Raises ``RuntimeError`` (the download removed) unless the file
    ``path`` has the MD5 sum ``md5``."""
    with open(path, 'rb') as f:
        digest = hashlib.md5(f.read()).hexdigest()
    if digest != md5:
        os.remove(path)
        raise RuntimeError('{} has MD5 {}, not {}'.format(url, digest, md5))


def load_cifar(name):
    """CIFAR-10 or -100 through Chainer's loader, or exit with what is
    missing or cannot be read.

    The images are standardized per channel by the means and the standard
    deviations of the training images, the usual preprocessing for CIFAR;
    the padding of the random crops is then the mean colour.
    """
    loader = {'cifar10': chainer.datasets.get_cifar10,
              'cifar100': chainer.datasets.get_cifar100}[name]
    path = os.path.join(_cache('cifar'), name.replace('cifar', 'cifar-')
                        + '.npz')
    train, test = _load(name.upper(), loader, 'cifar', 'file', {
        path: [('train_x', 'train_y'), ('test_x', 'test_y')]}, 3 * 32 * 32)
    classes = 10 if name == 'cifar10' else 100
    x, t = _examples(name.upper(), path, train, classes,
                     split='training split (train_x, train_y)')
    test = _examples(name.upper(), path, test, classes,
                     split='test split (test_x, test_y)')
    return _standardized(
        x, t, test, x.mean(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None],
        x.std(axis=(0, 2, 3), dtype=numpy.float64)[:, None, None])


def hold_out(args, train):
    """``(train, validation)``: the last --validation images held out.

    The split is fixed, the last ``N`` examples of the training set in the
    loader's order, so that every run and every optimizer tunes on the
    same images; without --validation ``validation`` is None.
    """
    n = args.validation
    if not n:
        return train, None
    if n >= len(train):
        # Imported here: cli needs nothing from this module.
        from examples import cli
        cli.usage_error('--validation {} leaves no training images: the '
                        'training set has {}'.format(n, len(train)))
    return (chainer.datasets.SubDataset(train, 0, len(train) - n),
            chainer.datasets.SubDataset(train, len(train) - n, len(train)))


def _cache(name):
    return chainer.dataset.get_dataset_directory(
        os.path.join('pfnet', 'chainer', name), create_directory=False)


# What a cache file that is cut short (a download or a copy that did not
# finish) or is not Chainer's raises as it is read.
DAMAGED = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
           zlib.error)


def _load(name, loader, folder, files, entries, size):
    """``loader()``, or exit with what is missing, the dataset root as it was
    (``read_cached``), or with the cache file that cannot be read.

    ``entries`` maps the paths of the cache files to the ``(images,
    labels)`` names of the arrays each one holds, images of ``size``
    values. Their names and shapes are checked first, which reads only the
    archive's directory and the arrays' headers; the whole file only where
    the loader fails.
    """
    for path, pairs in entries.items():
        if os.path.lexists(path):
            _check_cache(name, path, pairs, size)
    try:
        return read_cached(loader, folder)
    except (RuntimeError, http.client.HTTPException) + DAMAGED as e:
        # Without its frames, which hold the NPZ file Chainer's loader
        # leaves open: freed now, it is closed now.
        error = e.with_traceback(None)
    for path, pairs in entries.items():
        if os.path.lexists(path):
            _check_cache(name, path, pairs, size, whole=True)
    if all(os.path.lexists(path) for path in entries):
        _damaged(name, list(entries), ' '.join(str(error).split()))
    _missing(name, error, files, list(entries))


# The headers of the .npy versions that numpy.savez writes.
_HEADERS = {(1, 0): numpy.lib.format.read_array_header_1_0,
            (2, 0): numpy.lib.format.read_array_header_2_0}


def _check_cache(name, path, pairs, size, whole=False):
    """Exits unless the cache file ``path`` is an NPZ archive holding, for
    each ``(images, labels)`` of ``pairs``, as many labels as images of
    ``size`` values; ``whole``: and every byte of it can be read."""
    try:
        with zipfile.ZipFile(path) as archive:
            shapes = {}
            for key in sum(pairs, ()):
                if key + '.npy' not in archive.namelist():
                    raise KeyError('it holds no array {}'.format(key))
                with archive.open(key + '.npy') as f:
                    version = numpy.lib.format.read_magic(f)
                    if version not in _HEADERS:
                        raise ValueError('{} is a .npy of version {}.{}'
                                         .format(key, *version))
                    shapes[key] = _HEADERS[version](f)[0]
            if whole:
                damaged = archive.testzip()
                if damaged is not None:
                    raise ValueError('{} fails its checksum'.format(damaged))
                with numpy.load(path) as npz:
                    for key in shapes:
                        npz[key]
        for images, labels in pairs:
            n = shapes[images][:1]
            values = int(numpy.prod(shapes[images][1:]))
            if values != size:
                raise ValueError('{} has shape {}: images of {} values, '
                                 "{}'s have {}".format(
                                     images, shapes[images], values, name,
                                     size))
            if shapes[labels] != n:
                raise ValueError('{} has shape {}, {} {}: not one label '
                                 'per image'.format(labels, shapes[labels],
                                                    images, shapes[images]))
        return
    except DAMAGED as e:
        problem = ((e.args[0] if isinstance(e, KeyError) and e.args
                    else e.strerror if isinstance(e, OSError) and e.strerror
                    else str(e)) or type(e).__name__)
        # Not read at all (a folder, no permission): no sign of damage.
        damaged = not isinstance(e, OSError)
    _damaged(name, [path], ' '.join(problem.split()), damaged)


def _examples(name, path, dataset, classes, split=None):
    """``(x, t)``, the arrays of ``dataset`` read from the cache file
    ``path``, or exit if it is empty or a label is not one of ``classes``:
    the trainer would fail in its first update. ``split`` names the
    arrays of ``dataset`` where the file holds more than one split
    (CIFAR's)."""
    if not len(dataset):
        _damaged(name, [path], '{} holds no images'.format(
            'it' if split is None else 'its ' + split))
    x, t = chainer.dataset.concat_examples(dataset)
    if t.min() < 0 or t.max() >= classes:
        _damaged(name, [path], 'its labels run from {} to {}, {} has {} '
                 'classes'.format(t.min(), t.max(), name, classes))
    return x, t


def read_cached(loader, folder):
    """``loader()`` (Chainer's, of the dataset cached in ``folder``), the
    dataset root as it was if it fails.

    With the cache files there, Chainer's loader only reads them. Without
    them it makes the cache's folders and its download lock under the
    dataset root, then downloads; if that fails, what it made is removed
    again, so that a failed lookup in a shared root leaves no trace (and
    one in a read-only root fails before it writes), and the error
    (one of ``FAILED``) is raised. Each download waits at most ``TIMEOUT``
    seconds for its server (unless a socket timeout is set already).
    """
    root = chainer.dataset.get_dataset_root()
    made = [root] + [os.path.join(root, *parts) for parts in (
        ('pfnet',), ('pfnet', 'chainer'), ('pfnet', 'chainer', folder),
        ('_dl_cache',), ('_dl_cache', '_dl_lock'), ('_create_lock',))]
    made = [path for path in made if not os.path.lexists(path)]
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(TIMEOUT if previous is None else previous)
    try:
        return loader()
    except FAILED:
        for path in reversed(made):
            try:
                if os.path.isdir(path):
                    os.rmdir(path)  # only if empty
                elif os.path.lexists(path):
                    os.remove(path)
            except OSError:
                pass
        raise
    finally:
        socket.setdefaulttimeout(previous)


def _missing(name, error, files, paths):
    sys.exit(
        'Error: {} is not cached and could not be downloaded ({}).\n'
        'Chainer reads it from the cache {}\n'
        '{}\n'
        'under the dataset root {}.\n'
        'Point --dataset-root or the CHAINER_DATASET_ROOT environment '
        'variable at a folder that holds {}.'.format(
            name, error, files, '\n'.join('    ' + p for p in paths),
            chainer.dataset.get_dataset_root(),
            'them' if len(paths) > 1 else 'it'))


def _damaged(name, paths, problem, damaged=True):
    """Exits naming the cache files ``paths`` that Chainer's loader cannot
    read, and why (``problem``): ``damaged`` ones, or ones this process
    cannot open at all."""
    one = len(paths) == 1
    sys.exit(
        'Error: the {} cache {}\n'
        '{}\n'
        'cannot be read ({}): {}.\n'
        'Remove {}, and Chainer downloads {} again at the next run; or '
        'point --dataset-root or the CHAINER_DATASET_ROOT environment '
        'variable at a dataset root that holds a good copy (this one is '
        '{}).'.format(
            name, 'file' if one else 'files',
            '\n'.join('    ' + p for p in paths), problem,
            "{} damaged (a download or a copy cut short) or not Chainer's "
            '{}'.format('it is' if one else 'they are', name) if damaged
            else 'not a file this process may read (a folder, or no '
            'permission): check it', 'it' if one else 'them',
            name, chainer.dataset.get_dataset_root()))


def _standardized(x, t, test, mean, std):
    """The training set ``(x, t)`` and the test set ``test``, ``(x, t)``
    too, standardized.

    ``mean`` and ``std`` are float64: a NumPy scalar (MNIST) leaves the
    arithmetic in float32, an array (CIFAR's per channel) makes it float64.
    """
    # In chainer.config.dtype's precision (float16 for mixed16), that of the
    # first layer's weights: Chainer's links do not cast their inputs.
    def standardize(x):
        return ((x - mean) / std).astype(chainer.get_dtype())

    test_x, test_t = test
    return (chainer.datasets.TupleDataset(standardize(x), t),
            chainer.datasets.TupleDataset(standardize(test_x), test_t))


class Augment(object):

    """Random crop from the image padded by 4 pixels, and random flip.

    It draws from the iterator's random state, so that snapshots hold it.
    """

    def __init__(self, random_state):
        self._random = random_state

    def __call__(self, example):
        x, t = example
        _, height, width = x.shape
        padded = numpy.pad(x, ((0, 0), (4, 4), (4, 4)))
        top, left = self._random.randint(0, 9, size=2)
        x = padded[:, top:top + height, left:left + width]
        if self._random.randint(2):
            x = x[:, :, ::-1]
        return numpy.ascontiguousarray(x), t


class ShuffledIterator(chainer.iterators.SerialIterator):

    """A shuffling SerialIterator whose random state is saved in snapshots.

    SerialIterator draws the order of each epoch from NumPy's global random
    state, which snapshots do not hold; this one draws it from its own
    ``random_state`` and saves that state, so that a run continued with
    ``--resume`` sees the same batches as an uninterrupted one. A data
    augmentation that draws from the same state (``Augment``) resumes
    exactly too.
    """

    def __init__(self, dataset, batch_size, random_state):
        self._random = random_state
        super(ShuffledIterator, self).__init__(
            dataset, batch_size,
            order_sampler=chainer.iterators.ShuffleOrderSampler(
                random_state))

    def serialize(self, serializer):
        super(ShuffledIterator, self).serialize(serializer)
        name, keys, pos, has_gauss, gauss = self._random.get_state()
        keys = serializer('random_keys', keys)
        pos = serializer('random_pos', pos)
        has_gauss = serializer('random_has_gauss', has_gauss)
        gauss = serializer('random_gauss', gauss)
        self._random.set_state((name, keys, pos, has_gauss, gauss))
