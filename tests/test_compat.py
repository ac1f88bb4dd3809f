"""chainer_lars_compat: what Chainer 7.8.1 reads at import, put back where
today's stack (Python 3.12+, numpy 2, setuptools 81) removed it, and
nothing where it is there.

Every test runs a fresh interpreter: the module acts once, at import,
before Chainer. The new stack is simulated where this env has the old
one (the names removed, or their modules marked missing in
``sys.modules``), so that each part runs in every env; the py312 env runs
them on the real one too.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import REPO_ROOT


COMPAT = os.path.join(REPO_ROOT, 'compat')

# Marks the modules missing as on the new stack, for the import system
# and importlib.util.find_spec alike; takes numpy.sctypes away.
SIMULATE = textwrap.dedent("""
    import sys
    import numpy
    sctypes = getattr(numpy, 'sctypes', None)
    if sctypes is not None:
        del numpy.sctypes
    for name in ('numpy.distutils', 'numpy.distutils.system_info',
                 'pkg_resources'):
        sys.modules[name] = None
""")


def without_compat():
    """This process's environment without ``compat`` on ``PYTHONPATH``
    (the py312 env sets it): the module must act in the child itself."""
    paths = [path for path in os.environ.get('PYTHONPATH', '').split(
        os.pathsep) if path and os.path.realpath(path) != os.path.realpath(
            COMPAT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    if not paths:
        del env['PYTHONPATH']
    return env


def python(code, env=None, simulate=False):
    """Runs ``code`` in a fresh interpreter of this env, from the root,
    after ``SIMULATE`` if ``simulate``, by default ``without_compat()``;
    returns its stdout, failing with its output on a non-zero status."""
    code = (SIMULATE if simulate else '') + textwrap.dedent(code)
    env = without_compat() if env is None else env
    result = subprocess.run(
        [sys.executable, '-c', code],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _missing_here():
    """What this env lacks, found without the module."""
    return json.loads(python("""
        import importlib.util, json, sys
        import numpy
        missing = []
        if not hasattr(numpy, 'sctypes'):
            missing.append('numpy.sctypes')
        try:
            import numpy.distutils.system_info
        except ImportError:
            missing.append('numpy.distutils.system_info')
        if importlib.util.find_spec('pkg_resources') is None:
            missing.append('pkg_resources')
        print(json.dumps(missing))
    """))


def test_it_restores_what_this_env_lacks_and_only_that():
    out = json.loads(python("""
        import json, sys
        before = set(sys.modules)
        import chainer_lars_compat
        new = sorted(set(sys.modules) - before)
        print(json.dumps([chainer_lars_compat.restored, new]))
    """))
    restored, imported = out
    assert restored == _missing_here()
    if not restored:
        # A no-op: no module imported for a check (pkg_resources is slow,
        # numpy.distutils warns).
        assert not [name for name in imported
                    if name.startswith(('pkg_resources', 'numpy.distutils'))]


def test_on_the_new_stack_chainer_imports_and_lars_trains():
    out = python("""
        import chainer_lars_compat
        print(chainer_lars_compat.restored)
        if sctypes is not None:  # numpy 1: numpy 1.26's own table
            assert numpy.sctypes == sctypes, numpy.sctypes
        assert numpy.longdouble in numpy.sctypes['float']
        import chainer
        import chainer.links as L
        import chainer_lars
        model = L.Linear(3, 2)
        optimizer = chainer_lars.LARS(lr=0.1)
        optimizer.setup(model)
        before = model.W.array.copy()
        x = numpy.ones((4, 3), numpy.float32)
        optimizer.update(lambda: chainer.functions.sum(model(x)))
        assert (model.W.array != before).all()
        # What as_strided, the one reader of numpy.sctypes, does with it
        y = chainer.functions.as_strided(numpy.arange(6.0), (2, 2), (1, 2))
        print(y.shape)
    """, simulate=True)
    assert out.splitlines() == [
        "['numpy.sctypes', 'numpy.distutils.system_info', 'pkg_resources']",
        '(2, 2)']


def test_its_pkg_resources_says_what_is_installed():
    python("""
        import chainer_lars_compat
        import pkg_resources
        assert pkg_resources.require('numpy>=1')[0].version == \\
            numpy.__version__
        assert pkg_resources.get_distribution('numpy').version == \\
            numpy.__version__
        try:
            pkg_resources.require('no-such-distribution>=1')
        except pkg_resources.DistributionNotFound as e:
            assert str(e) == 'no-such-distribution>=1'
        else:
            raise AssertionError('no DistributionNotFound')
        assert issubclass(pkg_resources.VersionConflict, Exception)
    """, simulate=True)


def test_it_is_idempotent():
    python("""
        import chainer_lars_compat
        table = numpy.sctypes
        stub = sys.modules['pkg_resources']
        chainer_lars_compat._restore()
        assert numpy.sctypes is table
        assert sys.modules['pkg_resources'] is stub
        assert len(chainer_lars_compat.restored) == 3
        import importlib
        importlib.reload(chainer_lars_compat)
        assert chainer_lars_compat.restored == []
        assert numpy.sctypes is table
    """, simulate=True)


def test_pythonpath_reaches_subprocesses():
    env = dict(os.environ, PYTHONPATH=COMPAT)
    out = python("""
        import subprocess, sys
        print('chainer_lars_compat' in sys.modules)
        print(subprocess.check_output([sys.executable, '-c',
            'import sys; print(sys.modules["chainer_lars_compat"].__file__)'],
            universal_newlines=True).strip())
    """, env=env)
    # The checkout's module, from a folder other than the current one.
    assert out.splitlines() == [
        'True', os.path.join(REPO_ROOT, 'chainer_lars_compat.py')]


def test_sitecustomize_takes_an_installed_module_where_no_checkout(
        tmp_path):
    # The folder copied away from the checkout, the module elsewhere on
    # the path (as where the wheel installed it).
    folder = tmp_path / 'compat'
    folder.mkdir()
    with open(os.path.join(COMPAT, 'sitecustomize.py')) as f:
        (folder / 'sitecustomize.py').write_text(f.read())
    site = tmp_path / 'site'
    site.mkdir()
    with open(os.path.join(REPO_ROOT, 'chainer_lars_compat.py')) as f:
        (site / 'chainer_lars_compat.py').write_text(f.read())
    env = dict(without_compat(), PYTHONPATH='{}{}{}'.format(
        folder, os.pathsep, site))
    out = python("""
        import sys
        print(sys.modules['chainer_lars_compat'].__file__)
    """, env=env)
    assert out.strip() == str(site / 'chainer_lars_compat.py')


@pytest.mark.parametrize('form', ['script', 'module'])
def test_python_m_runs_a_script_or_module_as_python_would(tmp_path, form):
    (tmp_path / 'job.py').write_text(textwrap.dedent("""
        import json, sys
        print(json.dumps([__name__, sys.argv, sys.path[0],
                          'chainer_lars_compat' in sys.modules]))
    """))
    env = dict(without_compat(), PYTHONPATH=os.pathsep.join(
        [str(tmp_path), REPO_ROOT]))
    args = ([str(tmp_path / 'job.py')] if form == 'script'
            else ['-m', 'job'])
    result = subprocess.run(
        [sys.executable, '-m', 'chainer_lars_compat'] + args + ['-x', 'y'],
        env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert result.returncode == 0, result.stderr
    name, argv, first, loaded = json.loads(result.stdout)
    assert (name, loaded) == ('__main__', True)
    assert argv == [str(tmp_path / 'job.py'), '-x', 'y']
    if form == 'script':
        assert first == str(tmp_path)  # the script's folder, as python's


@pytest.mark.parametrize('args', [[], ['-m'], ['-c', 'print(1)']])
def test_python_m_without_a_script_gives_its_usage(args):
    result = subprocess.run(
        [sys.executable, '-m', 'chainer_lars_compat'] + args, cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(
        'usage: python -m chainer_lars_compat SCRIPT [ARGS...]')


def test_setuptools_pkg_resources_warning_is_filtered_where_it_is_used():
    """setuptools 67 to 80 warn at ``import pkg_resources`` to pin
    setuptools<81, which the constraints do: no noise on every import."""
    code = textwrap.dedent("""
        import importlib.util, warnings
        import chainer_lars_compat
        assert importlib.util.find_spec('pkg_resources') is not None
        warnings.warn('pkg_resources is deprecated as an API. See ... '
                      'pin to Setuptools<81.', UserWarning)
        warnings.warn('another', UserWarning)
    """)
    result = subprocess.run(
        [sys.executable, '-c', code], cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'pkg_resources' not in result.stderr
    assert 'UserWarning: another' in result.stderr


@pytest.mark.parametrize('flag', ['-h', '--help'])
def test_help_asked_for_goes_to_stdout(flag):
    result = subprocess.run(
        [sys.executable, '-m', 'chainer_lars_compat', flag], cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    assert (result.returncode, result.stderr) == (0, '')
    assert result.stdout.startswith(
        'usage: python -m chainer_lars_compat SCRIPT [ARGS...]')


@pytest.mark.parametrize('args, status, line', [
    (['nope.py'], 2, "python: can't open file {!r}: [Errno 2] No such file "
     'or directory'),
    (['-m', 'nope_at_all'], 1, '{}: No module named nope_at_all'),
    (['-m', 'nope_at_all.sub'], 1, '{}: No module named nope_at_all.sub'),
    (['-m', 'pkg'], 1, "{}: No module named pkg.__main__; 'pkg' is a package "
     'and cannot be directly executed'),
])
def test_a_missing_script_or_module_is_one_line_as_python_s(
        tmp_path, args, status, line):
    (tmp_path / 'pkg').mkdir()
    (tmp_path / 'pkg' / '__init__.py').write_text('')
    result = subprocess.run(
        [sys.executable, '-m', 'chainer_lars_compat'] + args,
        cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=REPO_ROOT),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    assert result.returncode == status
    assert result.stderr.strip() == line.format(
        str(tmp_path / 'nope.py') if args == ['nope.py'] else sys.executable)


@pytest.mark.parametrize('script', [
    'examples/mnist/train_mnist.py', 'examples/cifar/train_cifar.py',
    'examples/chainermn/mnist/train_mnist.py', 'benchmarks/first_contact.py'])
def test_the_repositorys_scripts_import_it_themselves(script):
    # Run as python SCRIPT would, on the new stack and without compat on
    # PYTHONPATH: their import of Chainer (--help) works, so the resume
    # command a trainer prints runs there as written.
    out = python("""
        import os, runpy, sys
        sys.argv = [{0!r}, '--help']
        sys.path[0] = os.path.dirname(os.path.abspath({0!r}))
        try:
            runpy.run_path({0!r}, run_name='__main__')
        except SystemExit as e:
            assert e.code in (0, None), e.code
        print('chainer_lars_compat' in sys.modules, 'chainer' in sys.modules)
    """.format(script), simulate=True)
    assert out.splitlines()[-1] == 'True True'
