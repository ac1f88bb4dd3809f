"""Every script of the repository compiles on this Python.

The tests that run the scripts (the ``integration`` group of conftest.py)
run in one tox env only; this one runs in every env, so that a script
using syntax that one of the supported Pythons lacks fails there too.
"""

import os

import pytest

from tests import REPO_ROOT


FOLDERS = ('examples', 'benchmarks', 'docs')


def _scripts():
    for folder in FOLDERS:
        top = os.path.join(REPO_ROOT, folder)
        for path, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith(('_', '.')))
            for name in sorted(files):
                if name.endswith('.py'):
                    yield os.path.relpath(os.path.join(path, name), REPO_ROOT)


SCRIPTS = list(_scripts())


def test_the_scripts_are_found():
    assert 'examples/mnist/train_mnist.py' in SCRIPTS
    assert 'benchmarks/bench_lars.py' in SCRIPTS


@pytest.mark.parametrize('script', SCRIPTS)
def test_script_compiles(script):
    with open(os.path.join(REPO_ROOT, script), 'rb') as f:
        compile(f.read(), script, 'exec', dont_inherit=True)
