"""Lets Chainer 7.8.1 import on Python 3.12 and 3.13 with numpy 2.

Chainer 7.8.1 reads, when it is imported, three names that today's stack
no longer has: ``numpy.sctypes`` (removed in numpy 2.0),
``numpy.distutils.system_info`` (gone on Python 3.12, with numpy 2) and
``pkg_resources`` (gone from setuptools 81). Importing this module, before
Chainer, puts back those that are missing, and only those: where a name is
there it is left alone, so on Python 3.9 to 3.11 with ``numpy<2`` it
changes nothing. It is opt-in, in one of three ways:

* ``import chainer_lars_compat`` before ``import chainer``, in a script;
* ``python -m chainer_lars_compat SCRIPT [ARGS...]`` (or ``-m MODULE``),
  which imports it and runs the script as ``python SCRIPT`` would, in
  this process (and its forks) only: a worker that ``multiprocessing``
  starts with ``spawn`` or ``forkserver`` runs the script again without
  it, so there import it in the script, or use the next form;
* ``PYTHONPATH=<checkout>/compat``, whose ``sitecustomize.py`` imports it
  in every Python process started with that variable, subprocesses (MPI
  ranks, test workers) included.

What it puts back is what Chainer's import uses of them, no more
(``chainer.testing``'s ``with_requires`` needs setuptools' own
``pkg_resources``, so ``setuptools<81``):

* ``numpy.sctypes``: numpy 1.26's table of the scalar types by kind
  (Chainer's ``as_strided`` reads its ``'int'`` and ``'float'`` rows);
* ``numpy.distutils.system_info.get_info``, which returns ``{}``: Chainer
  calls it on macOS only, to warn of Accelerate's BLAS, so that warning
  is not given;
* ``pkg_resources.require``, ``get_distribution``,
  ``DistributionNotFound`` and ``VersionConflict``, from
  :mod:`importlib.metadata`: Chainer uses them to warn of two CuPy
  packages installed at once. ``require`` says whether a distribution is
  installed and does not compare versions, so Chainer's warning that a
  ``cupy`` package is newer than it was tested with is not given.

Where setuptools' own ``pkg_resources`` is there, its warning at import
("pkg_resources is deprecated ... pin to Setuptools<81") is filtered out:
the advice is followed already.
"""

import importlib.metadata
import importlib.util
import os
import re
import sys
import types
import warnings

__all__ = ['restored']

#: The names this module put back, in this process (empty where nothing
#: was missing).
restored = []


def _restore_sctypes():
    try:
        import numpy
    except ImportError:
        return  # nothing to restore (and no Chainer to import)
    if hasattr(numpy, 'sctypes'):
        return
    float_types = [numpy.float16, numpy.float32, numpy.float64]
    complex_types = [numpy.complex64, numpy.complex128]
    # numpy 1.26 listed the extended types where they differ (not on
    # Windows, where long double is double).
    if numpy.dtype(numpy.longdouble) != numpy.dtype(numpy.float64):
        float_types.append(numpy.longdouble)
        complex_types.append(numpy.clongdouble)
    numpy.sctypes = {
        'int': [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        'uint': [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        'float': float_types,
        'complex': complex_types,
        'others': [bool, object, bytes, str, numpy.void],
    }
    restored.append('numpy.sctypes')


def _found(name):
    """Whether the module ``name`` can be imported, found without
    importing it (its parent package aside)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def _restore_numpy_distutils():
    # Found without importing it where it can work (its import warns),
    # tried where it may not (numpy 1.26 has it on Python 3.12, where its
    # import raises).
    if not _found('numpy'):
        return
    if _found('numpy.distutils'):
        if sys.version_info < (3, 12):
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', DeprecationWarning)
                import numpy.distutils.system_info  # noqa: F401
            return
        except ImportError:
            pass
    package = types.ModuleType('numpy.distutils')
    package.__doc__ = ('chainer_lars_compat: a stand-in for what Chainer '
                       '7.8.1 reads of numpy.distutils (system_info).')
    package.__path__ = []
    system_info = types.ModuleType('numpy.distutils.system_info')
    system_info.get_info = lambda name, notfound_action=0: {}
    package.system_info = system_info
    sys.modules['numpy.distutils'] = package
    sys.modules['numpy.distutils.system_info'] = system_info
    restored.append('numpy.distutils.system_info')


def _restore_pkg_resources():
    if _found('pkg_resources'):
        # Not imported (that is slow); Chainer's import of it would warn
        # (setuptools 67 to 80) to pin setuptools<81, done already.
        warnings.filterwarnings('ignore', category=UserWarning,
                                message=r'(?s).*pkg_resources is deprecated')
        return
    module = types.ModuleType('pkg_resources')
    module.__doc__ = ('chainer_lars_compat: a stand-in for what Chainer '
                      '7.8.1 reads of pkg_resources (setuptools < 81).')

    class DistributionNotFound(Exception):
        pass

    class VersionConflict(Exception):
        pass

    def get_distribution(requirement):
        name = re.match(r'\s*([A-Za-z0-9._-]+)', requirement).group(1)
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise DistributionNotFound(requirement) from None
        return types.SimpleNamespace(project_name=name, version=version)

    def require(requirement):
        return [get_distribution(requirement)]

    module.DistributionNotFound = DistributionNotFound
    module.VersionConflict = VersionConflict
    module.get_distribution = get_distribution
    module.require = require
    sys.modules['pkg_resources'] = module
    restored.append('pkg_resources')


def _restore():
    _restore_sctypes()
    _restore_numpy_distutils()
    _restore_pkg_resources()


def main(argv=None):
    """``python -m chainer_lars_compat SCRIPT|-m MODULE [ARGS...]``."""
    import importlib.util
    import runpy
    argv = list(sys.argv[1:] if argv is None else argv)
    asked = argv[:1] in (['-h'], ['--help'])
    if asked or not argv or argv == ['-m'] or (
            argv[0].startswith('-') and argv[0] != '-m'):
        # Asked for: on stdout, status 0; else a usage error, as python's.
        print('usage: python -m chainer_lars_compat SCRIPT [ARGS...]\n'
              '       python -m chainer_lars_compat -m MODULE [ARGS...]\n'
              'Runs SCRIPT (or MODULE) as python would, with what Chainer '
              '7.8.1 needs at import on Python 3.12+ and numpy 2 put back.',
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    if argv[0] == '-m':
        name, package = argv[1], None
        try:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                package, name = name, name + '.__main__'  # as python runs it
                spec = importlib.util.find_spec(name)
        except ImportError:  # a package of the name's is missing
            spec = None
        if spec is None:  # python's line and status
            print('{}: No module named {}{}'.format(
                sys.executable, name, '' if package is None else
                "; '{}' is a package and cannot be directly executed".format(
                    package)), file=sys.stderr)
            return 1
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    else:
        if not os.path.exists(argv[0]):  # python's line and status
            print("python: can't open file {!r}: [Errno 2] No such file or "
                  'directory'.format(os.path.abspath(argv[0])),
                  file=sys.stderr)
            return 2
        sys.argv = argv
        # As python SCRIPT: the script's folder first on the path.
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name='__main__')
    return 0


if __name__ == '__main__':
    # Under its own name, so that a later import finds it done.
    import chainer_lars_compat
    sys.exit(chainer_lars_compat.main())
_restore()
