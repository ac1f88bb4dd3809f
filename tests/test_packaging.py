"""The package's papers: the licence in the wheel, one version everywhere.

The wheel is built offline from a copy of the files it is made of, with
the environment's setuptools (no build isolation, no index), so that the
test neither downloads anything nor leaves a build folder in the checkout.
"""

import os
import re
import runpy
import shutil
import subprocess
import sys
import zipfile

import pytest

import chainer_lars
from tests import REPO_ROOT


# What setup.cfg and pyproject.toml build the wheel from.
SOURCES = ('setup.cfg', 'pyproject.toml', 'README.rst', 'LICENSE',
           'chainer_lars', 'chainer_lars_compat.py')


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    source = tmp_path_factory.mktemp('source')
    for name in SOURCES:
        path = os.path.join(REPO_ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, str(source / name),
                            ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copy(path, str(source / name))
    out = tmp_path_factory.mktemp('wheel')
    # The build runs in this environment (no isolation), whose setuptools
    # the constraints already hold; pip 26 refuses a build constraint
    # (tox sets PIP_BUILD_CONSTRAINT) together with --no-build-isolation.
    env = {k: v for k, v in os.environ.items()
           if k != 'PIP_BUILD_CONSTRAINT'}
    result = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps',
         '--no-build-isolation', '--no-index', '-q', '-w', str(out),
         str(source)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        universal_newlines=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = os.listdir(str(out))
    assert len(wheels) == 1, wheels
    return str(out / wheels[0])


def test_wheel_ships_the_license(wheel):
    with zipfile.ZipFile(wheel) as z:
        # dist-info/LICENSE (setuptools < 71) or dist-info/licenses/LICENSE
        names = [name for name in z.namelist()
                 if re.fullmatch(r'[^/]+\.dist-info/(licenses/)?LICENSE',
                                 name)]
        assert len(names) == 1, z.namelist()
        shipped = z.read(names[0]).decode()
    with open(os.path.join(REPO_ROOT, 'LICENSE')) as f:
        assert shipped == f.read()
    assert shipped.startswith('MIT License')


def test_wheel_ships_the_compat_module_beside_the_package(wheel):
    # Top level, outside chainer_lars: imported before Chainer, which
    # chainer_lars imports.
    with zipfile.ZipFile(wheel) as z:
        shipped = z.read('chainer_lars_compat.py').decode()
        metadata = z.read('chainer_lars-{}.dist-info/METADATA'.format(
            chainer_lars.__version__)).decode()
    with open(os.path.join(REPO_ROOT, 'chainer_lars_compat.py')) as f:
        assert shipped == f.read()
    # numpy 2 and setuptools 81+ allowed on Python 3.12+ only
    assert 'Requires-Python: <3.14,>=3.9' in metadata
    assert 'Requires-Dist: numpy<2; python_version < "3.12"' in metadata
    assert ('Requires-Dist: setuptools<74; python_version < "3.12"'
            in metadata)


def test_wheel_has_the_packages_version(wheel):
    version = chainer_lars.__version__
    assert os.path.basename(wheel).startswith(
        'chainer_lars-{}-'.format(version))
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read('chainer_lars-{}.dist-info/METADATA'.format(
            version)).decode()
    assert 'Version: {}\n'.format(version) in metadata
    assert 'License: MIT\n' in metadata


def test_changelog_names_the_version():
    with open(os.path.join(REPO_ROOT, 'CHANGELOG.rst')) as f:
        titles = re.findall(r'^(.+)\n-+\n', f.read(), flags=re.M)
    # What main holds is a development version of the next release; the
    # versions below it are released ones.
    version = chainer_lars.__version__
    assert titles[0] == 'Unreleased ({})'.format(version)
    assert re.fullmatch(r'\d+\.\d+\.\d+\.dev\d+', version)
    assert version.split('.dev')[0] not in titles[1:]
    assert all(re.fullmatch(r'\d+\.\d+\.\d+', t) for t in titles[1:])


def test_docs_read_the_same_version(monkeypatch):
    monkeypatch.setattr(sys, 'path', list(sys.path))  # conf.py adds to it
    conf = runpy.run_path(os.path.join(REPO_ROOT, 'docs', 'conf.py'))
    assert conf['release'] == chainer_lars.__version__
