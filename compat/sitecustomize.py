"""Imports chainer_lars_compat in every Python started with this folder on
PYTHONPATH (``PYTHONPATH=<checkout>/compat``), subprocesses included, so
that Chainer 7.8.1 imports on Python 3.12+ with numpy 2. Python imports
one ``sitecustomize`` only: this one takes the place of any other on the
path after it.
"""

import importlib.util
import os
import sys

# The checkout's module, beside this folder, even where another version
# of chainer-lars is installed; else the installed one.
_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'chainer_lars_compat.py')
if 'chainer_lars_compat' not in sys.modules and os.path.isfile(_path):
    _spec = importlib.util.spec_from_file_location('chainer_lars_compat',
                                                   _path)
    _module = importlib.util.module_from_spec(_spec)
    sys.modules['chainer_lars_compat'] = _module
    _spec.loader.exec_module(_module)
else:
    import chainer_lars_compat  # noqa: F401
