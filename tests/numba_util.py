"""For the tests that need the compiled CPU loops (Numba).

Numba is a requirement of the package, but ``chainer_lars.cpu._jit()``
falls back to the NumPy passes where it does not import (silently), where
its kernels fail to load (with a warning), or with ``CHAINER_LARS_NUMBA=0``;
the tests of the compiled loops then skip. With
``CHAINER_LARS_REQUIRE_NUMBA=1`` (set by ``.ci/run``: every tox env installs
Numba) they fail instead, as ``CHAINER_LARS_REQUIRE_MPI`` and
``CHAINER_LARS_REQUIRE_NVRTC`` do for theirs.

"""

import os

import pytest


def numba_required():
    """Whether missing compiled loops must fail the tests, not skip them."""
    return os.environ.get('CHAINER_LARS_REQUIRE_NUMBA', '') == '1'


def require_numba(in_use=True):
    """Returns :mod:`chainer_lars._numba`, or skips the calling test (fails
    it where Numba is required): where Numba does not import, and, with
    ``in_use``, where the library runs without it (``cpu.backend()`` is
    ``'numpy'``). ``in_use=False``: for a test that installs the module
    itself."""
    from chainer_lars import cpu
    try:
        from chainer_lars import _numba
    except ImportError as e:
        reason = 'Numba does not import ({}: {})'.format(type(e).__name__, e)
    else:
        if not in_use or cpu.backend() == 'numba':
            return _numba
        reason = ('the library runs the NumPy passes ({})'.format(
            'CHAINER_LARS_NUMBA=0'
            if os.environ.get('CHAINER_LARS_NUMBA', '1') == '0'
            else "Numba's kernels failed to load"))
    if numba_required():
        pytest.fail('CHAINER_LARS_REQUIRE_NUMBA=1 but ' + reason,
                    pytrace=False)
    pytest.skip(reason)
