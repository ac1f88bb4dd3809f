"""Sphinx configuration of the chainer-lars docs (``bash dev.sh docs``)."""

import inspect
import os
import re
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# autodoc imports chainer_lars: this checkout's, installed or not.
sys.path.insert(0, ROOT)


def _version():
    # The one version, chainer_lars.__version__, read from the file rather
    # than imported, so that the number needs no Chainer.
    with open(os.path.join(ROOT, 'chainer_lars', '__init__.py')) as f:
        return re.search(r"^__version__ = '([^']+)'$", f.read(),
                         flags=re.M).group(1)


project = 'chainer-lars'
author = 'chainer-lars developers'
copyright = author
release = _version()
version = '.'.join(release.split('.')[:2])

extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx.ext.mathjax',
    'sphinx.ext.doctest',
    # MathJax copied into the build (the docs extra installs it): the
    # formulas render offline.
    'sphinx-mathjax-offline',
]

exclude_patterns = ['_build']
# Literal blocks are shell commands and formulas; the examples (testcode)
# are highlighted as Python all the same.
highlight_language = 'none'

# The docstrings' "Attributes:" as "Variables" fields of their class, as
# Chainer's docs render them (checked below).
napoleon_use_ivar = True
napoleon_numpy_docstring = False
# The public names and the methods each page lists: the modules behind
# them are internal and change.
autodoc_member_order = 'bysource'
autodoc_typehints = 'none'

# The doctest builder runs every example of the pages on the CPU.
doctest_global_setup = '''
import numpy
numpy.random.seed(0)
'''

html_theme = 'alabaster'
html_theme_options = {
    'description': 'LARS for Chainer',
    'fixed_sidebar': True,
}
html_static_path = []


_FIELD = re.compile(r'^\s*:(ivar|vartype) ([^:]*):(.*)$')


def attribute_field_problems(lines):
    """What is wrong with the ``Attributes:`` fields of a docstring after
    napoleon: Chainer's docs render each entry ``name (type): meaning`` as
    "name (type) - meaning"; several names in one entry, or a name without
    its type, render garbled ("~A.x, (y,)", "z (x, y, ...,) - As above")."""
    problems, names, typed = [], [], set()
    for line in lines:
        match = _FIELD.match(line)
        if match is None:
            continue
        kind, name, text = match.groups()
        if not re.fullmatch(r'\w+', name):
            problems.append('{!r} is not one attribute name: give each '
                            'attribute an entry "name (type): meaning"'
                            .format(name))
        elif kind == 'vartype':
            typed.add(name)
        else:
            names.append(name)
            if not text.strip():
                problems.append('{} has no description'.format(name))
    problems += ['{} has no type: write "{} (type): meaning"'.format(n, n)
                 for n in names if n not in typed]
    return problems


def _check_attribute_fields(app, what, name, obj, options, lines):
    for problem in attribute_field_problems(lines):
        # Imported here: tests read this file's version without Sphinx.
        from sphinx.util import logging
        logging.getLogger(__name__).warning(
            'Attributes of %s: %s', name, problem)


def real_signature(cls):
    """The signature of ``cls`` as a user calls it: without the
    ``**unexpected`` that only turns misnamed arguments (``lr=`` for
    LAMB's ``alpha``) into errors that say the right name."""
    signature = inspect.signature(cls)
    return str(signature.replace(parameters=[
        p for p in signature.parameters.values()
        if not (p.kind is p.VAR_KEYWORD and p.name == 'unexpected')]))


def _check_class_signature(app, what, name, obj, options, signature,
                           return_annotation):
    # A page that spells the signature out (to hide **unexpected) must
    # keep it equal to the code's.
    if what == 'class' and signature is not None:
        real = real_signature(obj)
        if signature != real:
            from sphinx.util import logging
            logging.getLogger(__name__).warning(
                'the page shows %s%s; give its real signature, %s',
                name, signature, real)


def setup(app):
    # After napoleon's handler has turned "Attributes:" into fields; a
    # warning fails the -W build.
    app.connect('autodoc-process-docstring', _check_attribute_fields,
                priority=600)
    app.connect('autodoc-process-signature', _check_class_signature)
