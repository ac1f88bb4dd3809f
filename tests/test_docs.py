"""The API reference reads like Chainer's: the docstrings' ``Attributes:``
render as one field per attribute, and no public docstring is a
maintainer's note. (The docs' build, ``tox -e docs``, fails on the same
check through ``docs/conf.py``.)"""

import importlib.util
import inspect
import os
import textwrap

import pytest

import chainer_lars
from tests import REPO_ROOT


@pytest.fixture(scope='module')
def conf():
    # Here, not at import: a module-level skip is reported by every run that
    # collects this file, ``-m gpu`` (which selects none of it) too.
    pytest.importorskip('sphinx.ext.napoleon')
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
