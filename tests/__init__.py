"""The tests of chainer-lars; ``REPO_ROOT`` is the repository they test."""

import os


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pythonpath(*first):
    """``PYTHONPATH`` for a child process: ``first`` (by default the
    repository), then what this process has, which keeps ``compat`` (the
    numpy 2 envs' Chainer) in the child."""
    paths = list(first or (REPO_ROOT,))
    paths += [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
              if p]
    return os.pathsep.join(paths)
