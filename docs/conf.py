"""Sphinx configuration of the chainer-lars docs (``bash dev.sh docs``)."""

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
]

exclude_patterns = ['_build']
# Literal blocks are shell commands and formulas; the examples (testcode)
# are highlighted as Python all the same.
highlight_language = 'none'

# The docstrings' "Attributes:" as fields of their class, so that they do
# not describe the attributes a second time beside autodoc's members.
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


def _short_attribute_names(app, what, name, obj, options, lines):
    # The docstrings name attributes as Chainer's do, "~Class.attr (type):",
    # which a field list would print with the tilde: keep "attr" alone.
    for i, line in enumerate(lines):
        lines[i] = re.sub(r'^(\s*:(?:ivar|vartype) )~?[\w.]*\.(\w+):',
                          r'\1\2:', line)


def setup(app):
    # After napoleon's handler has turned "Attributes:" into fields.
    app.connect('autodoc-process-docstring', _short_attribute_names,
                priority=600)
