"""Puts the repository on ``sys.path`` for a trainer run as a file.

``python examples/mnist/train_mnist.py`` (from the root) and ``python
train_mnist.py`` (in ``examples/mnist``) put only the script's own folder on
``sys.path``, where ``from examples import cli`` cannot be found. Each
trainer's folder holds a symbolic link to this file, which the trainer
imports when it runs as a file (``__package__`` is then ``None``): the
repository root, the folder above the one that really holds this file,
goes first on ``sys.path``, as the current folder does for ``python -m
examples.mnist.train_mnist``. Either way ``examples`` and ``chainer_lars``
come from this checkout. ``examples/README.md`` says why this way.
"""

import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
