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

# The docstrings' "Attributes:" as fields of their class, so that they do
# not describe the attributes a second time beside autodoc's members.
napoleon_use_ivar = True
napoleon_numpy_docstring = False
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
