"""The data: MNIST and CIFAR through Chainer's loaders, standardized.

Also the CIFAR augmentation, and an iterator whose shuffling resumes
exactly.
"""

import os
import sys

import numpy

import chainer


def load_mnist():
    """MNIST through Chainer's loader, or exit with what is missing.

    The images are standardized: shifted and scaled by the mean and the
    standard deviation of all the training pixels (about 0.13 and 0.31),
    the usual preprocessing for MNIST. The model then starts well
    conditioned, which large batches, with few updates, need most.
    """
    directory = _cache('mnist')
    train, test = _load('MNIST', chainer.datasets.get_mnist, 'mnist', 'files',
                        [os.path.join(directory, 'train.npz'),
                         os.path.join(directory, 'test.npz')])
    x, t = chainer.dataset.concat_examples(train)
    return _standardized(x, t, test, x.mean(dtype=numpy.float64),
                         x.std(dtype=numpy.float64))


def load_cifar(name):
    """CIFAR-10 or -100 through Chainer's loader, or exit with what is missing.

    The images are standardized per channel by the means and the standard
    deviations of the training images, the usual preprocessing for CIFAR;
    the padding of the random crops is then the mean colour.
    """
    loader = {'cifar10': chainer.datasets.get_cifar10,
              'cifar100': chainer.datasets.get_cifar100}[name]
    train, test = _load(name.upper(), loader, 'cifar', 'file', [
        os.path.join(_cache('cifar'), name.replace('cifar', 'cifar-')
                     + '.npz')])
    x, t = chainer.dataset.concat_examples(train)
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


def _load(name, loader, folder, files, paths):
    """``loader()``, or exit with what is missing, the dataset root as it was
    (``read_cached``)."""
    try:
        return read_cached(loader, folder)
    except (OSError, RuntimeError) as e:
        _missing(name, e, files, paths)


def read_cached(loader, folder):
    """``loader()`` (Chainer's, of the dataset cached in ``folder``), the
    dataset root as it was if it fails.

    With the cache files there, Chainer's loader only reads them. Without
    them it makes the cache's folders and its download lock under the
    dataset root, then downloads; if that fails, what it made is removed
    again, so that a failed lookup in a shared root leaves no trace (and
    one in a read-only root fails before it writes), and the error
    (``OSError`` or ``RuntimeError``) is raised.
    """
    root = chainer.dataset.get_dataset_root()
    made = [root] + [os.path.join(root, *parts) for parts in (
        ('pfnet',), ('pfnet', 'chainer'), ('pfnet', 'chainer', folder),
        ('_dl_cache',), ('_dl_cache', '_dl_lock'), ('_create_lock',))]
    made = [path for path in made if not os.path.lexists(path)]
    try:
        return loader()
    except (OSError, RuntimeError):
        for path in reversed(made):
            try:
                if os.path.isdir(path):
                    os.rmdir(path)  # only if empty
                elif os.path.lexists(path):
                    os.remove(path)
            except OSError:
                pass
        raise


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


def _standardized(x, t, test, mean, std):
    """The training set ``(x, t)`` and ``test``, standardized.

    ``mean`` and ``std`` are float64: a NumPy scalar (MNIST) leaves the
    arithmetic in float32, an array (CIFAR's per channel) makes it float64.
    """
    # In chainer.config.dtype's precision (float16 for mixed16), that of the
    # first layer's weights: Chainer's links do not cast their inputs.
    def standardize(x):
        return ((x - mean) / std).astype(chainer.get_dtype())

    test_x, test_t = chainer.dataset.concat_examples(test)
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
