"""The API reference reads like Chainer's: the docstrings' ``Attributes:``
render as one field per attribute, and no public docstring is a
maintainer's note. (The docs' build, ``tox -e docs``, fails on the same
check through ``docs/conf.py``.)"""

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

import chainer_lars
from tests import REPO_ROOT
from tests import conftest


#: Why these tests skip where Sphinx is missing.
WITHOUT_SPHINX = ('Sphinx is not installed here ({}): tox -e docs runs '
                  'these tests (bash dev.sh test runs that env), or '
                  "install the docs extra, pip install -e '.[docs]'")


@pytest.fixture(scope='module')
def conf():
    # Here, not at import: a module-level skip is reported by every run that
    # collects this file, ``-m gpu`` (which selects none of it) too.
    try:
        import sphinx.ext.napoleon  # noqa: F401
    except ImportError as e:
        # In the env that runs them, a missing Sphinx is a failure.
        if os.environ.get('TOX_ENV_NAME') in (conftest.envs_of('docs')
                                              or ()):
            raise
        pytest.skip(WITHOUT_SPHINX.format(e))
    spec = importlib.util.spec_from_file_location(
        'docs_conf', os.path.join(REPO_ROOT, 'docs', 'conf.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields(conf, text):
    from sphinx.ext import napoleon
    from sphinx.ext.napoleon import docstring
    config = napoleon.Config(napoleon_use_ivar=conf.napoleon_use_ivar,
                             napoleon_numpy_docstring=False)
    return str(docstring.GoogleDocstring(text, config)).split('\n')


def _public():
    for name in chainer_lars.__all__:
        obj = getattr(chainer_lars, name)
        if inspect.isclass(obj):
            yield name, obj
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and not attr.startswith('_'):
                    yield '{}.{}'.format(name, attr), member


@pytest.mark.parametrize('text', [
    # The forms of version 0.1.0, garbled in the HTML.
    """
    Attributes:
        ~GradientLARS.threshold, ~GradientLARS.weight_decay,
        ~GradientLARS.clip: As above; settable, checked on assignment.
    """,
    """
    Attributes:
        lr, momentum, weight_decay, eps, nesterov: As
            above; settable (e.g. by a schedule), checked on assignment.
    """,
    """
    Attributes:
        uses_weight_decay, uses_adaptation (bool): As above.
    """,
    """
    Attributes:
        lr: The learning rate, without its type.
    """,
])
def test_garbled_attribute_fields_are_found(conf, text):
    assert conf.attribute_field_problems(
        _fields(conf, textwrap.dedent(text)))


def test_chainer_s_form_passes(conf):
    lines = _fields(conf, textwrap.dedent("""
    Attributes:
        lr (float): The learning rate.
        nesterov (bool): Whether the momentum is Nesterov's.
    """))
    assert ':ivar lr: The learning rate.' in lines
    assert conf.attribute_field_problems(lines) == []


@pytest.mark.parametrize('name, obj', list(_public()))
def test_public_docstrings(conf, name, obj):
    doc = inspect.getdoc(obj) or ''
    assert conf.attribute_field_problems(_fields(conf, doc)) == [], name
    # Maintainers' notes go to comments and docs/design.rst.
    for word in ('FORK', 'private', 'TODO', 'XXX', 'issue '):
        assert word not in doc, (name, word)


@pytest.mark.parametrize('here', [None, 'docs'])
def test_without_sphinx_they_say_which_env_runs_them(tmp_path, here):
    """Elsewhere a skip that names the env that runs them; in that env a
    failure."""
    (tmp_path / 'sphinx').mkdir()
    (tmp_path / 'sphinx' / '__init__.py').write_text(
        "raise ModuleNotFoundError('no Sphinx (simulated)', "
        "name='sphinx')\n")
    env = {name: value for name, value in os.environ.items()
           if name not in ('TOX_ENV_NAME', 'CHAINER_LARS_DOCS_IN',
                           'CHAINER_LARS_PROGRESS')}
    env['PYTHONPATH'] = os.pathsep.join([str(tmp_path), REPO_ROOT])
    if here is not None:
        env.update(TOX_ENV_NAME=here, CHAINER_LARS_DOCS_IN=here)
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-rs', '-p',
         'no:cacheprovider', 'tests/test_docs.py', '-k', 'not without'],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    if here is None:
        assert result.returncode == 0, result.stdout
        skips = [line for line in result.stdout.splitlines()
                 if line.startswith('SKIPPED')]
        assert skips and all(WITHOUT_SPHINX.format(
            'no Sphinx (simulated)') in ' '.join(line.split())
            for line in skips), result.stdout
        assert ' passed' not in result.stdout
    else:
        assert result.returncode == 1, result.stdout
        assert 'ModuleNotFoundError: no Sphinx (simulated)' in result.stdout
