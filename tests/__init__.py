"""The tests of chainer-lars; ``REPO_ROOT`` is the repository they test."""

import os


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
