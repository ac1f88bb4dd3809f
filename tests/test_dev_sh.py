"""dev.sh's commands, with a stub venv, mpiexec and tox.

A copy of dev.sh runs in a fake checkout whose ``.venv/bin/python`` records
how it was started (its directory, its arguments, the dataset root) instead
of training, and whose install stamp says the packages are in, so nothing
is installed. ``mpiexec`` and ``mpicc`` are stubs on ``PATH`` likewise.
"""

import configparser
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from tests import REPO_ROOT


pytestmark = pytest.mark.skipif(shutil.which('bash') is None,
                                reason='dev.sh needs bash')

PACKAGING = ('setup.cfg', 'pyproject.toml', 'constraints.txt')

# Records a call as JSON lines: the working directory, the arguments and
# CHAINER_DATASET_ROOT; a `python -c` (dev.sh's check that the venv works)
# goes to the real Python.
RECORDER = """#!/bin/sh
if [ "$1" = -c ]; then exec {python} "$@"; fi
{python} -c 'import json, os, sys
print(json.dumps({{"name": sys.argv[1], "cwd": os.getcwd(),
                  "argv": sys.argv[2:],
                  "root": os.environ.get("CHAINER_DATASET_ROOT"),
                  "path": os.environ.get("PYTHONPATH"),
                  "terminal": os.environ.get("CHAINER_LARS_TERMINAL")}}))' \\
    "$0" "$@" >> {record}
"""

MPIEXEC = """#!/bin/sh
if [ "$1" = --version ]; then echo 'mpiexec (OpenRTE) 4.1.4'; exit 0; fi
exec {recorder} "$@"
"""


def write_script(path, text):
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path):
    return make_checkout(tmp_path)


def make_checkout(tmp_path):
    """A fake checkout: dev.sh, the packaging files, the example scripts
    (empty), a stub venv with everything "installed", stubs for mpiexec
    and mpicc, and a caller's directory elsewhere."""
    repo = tmp_path / 'work' / 'repo'
    for name in ('examples/mnist', 'examples/chainermn/mnist', '.venv/bin'):
        (repo / name).mkdir(parents=True)
    for name in ('dev.sh',) + PACKAGING:
        shutil.copy(os.path.join(REPO_ROOT, name),
                    str(repo / name))
    (repo / 'examples/mnist/train_mnist.py').write_text('')
    (repo / 'examples/chainermn/mnist/train_mnist.py').write_text('')
    record = tmp_path / 'record'
    recorder = RECORDER.format(python=sys.executable, record=record)
    write_script(str(repo / '.venv/bin/python'), recorder)
    stamp = subprocess.run(
        'cat setup.cfg pyproject.toml constraints.txt | cksum', shell=True,
        cwd=str(repo), check=True, stdout=subprocess.PIPE,
        universal_newlines=True).stdout
    (repo / '.venv/.installed').write_text(stamp + 'examples,mpi\n')
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    write_script(str(bin_dir / 'mpiexec-recorder'), recorder)
    write_script(str(bin_dir / 'mpiexec'), MPIEXEC.format(
        recorder=bin_dir / 'mpiexec-recorder'))
    write_script(str(bin_dir / 'mpicc'), '#!/bin/sh\nexit 0\n')
    # dev.sh looks for a Python of 3.9 to 3.11 by name.
    version = 'python{}.{}'.format(*sys.version_info[:2])
    os.symlink(sys.executable, str(bin_dir / version))
    caller = tmp_path / 'caller'
    caller.mkdir()
    return {'repo': repo, 'record': record, 'bin': bin_dir, 'caller': caller}


def dev_sh(checkout, *args, env=None):
    environment = dict(os.environ)
    environment.pop('CHAINER_DATASET_ROOT', None)
    environment['PATH'] = '{}{}{}'.format(checkout['bin'], os.pathsep,
                                          environment['PATH'])
    environment.update(env or {})
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh')] + list(args),
        cwd=str(checkout['caller']), env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True)
    assert result.returncode == 0, result.stderr
    if not checkout['record'].exists():
        return [], result
    with open(str(checkout['record'])) as f:
        return [json.loads(line) for line in f], result


ARGS = ['-o', 'out', '--resume', 'out/snapshot_iter_8',
        '--dataset-root', 'data', '-b', '100']


def test_mnist_runs_in_the_callers_directory(checkout):
    """Relative -o, --resume and --dataset-root are the caller's."""
    calls, _ = dev_sh(checkout, 'mnist', *ARGS)
    assert len(calls) == 1
    call = calls[0]
    assert call['cwd'] == str(checkout['caller'])
    assert call['name'] == str(checkout['repo'] / '.venv/bin/python')
    assert call['argv'] == [
        str(checkout['repo'] / 'examples/mnist/train_mnist.py')] + ARGS
    # The trainers find the examples package themselves (examples/README.md):
    # the caller's PYTHONPATH is left as it is, on every rank alike.
    assert call['path'] == os.environ.get('PYTHONPATH')


def test_mnist_dataset_root(checkout, tmp_path):
    # None next to the checkout: Chainer's own default stays.
    calls, _ = dev_sh(checkout, 'mnist')
    assert calls[-1]['root'] is None
    # The copy next to the checkout, by its absolute path.
    shared = tmp_path / 'work' / 'shared' / 'datasets'
    (shared / 'pfnet/chainer/mnist').mkdir(parents=True)
    (shared / 'pfnet/chainer/mnist/train.npz').write_text('')
    calls, _ = dev_sh(checkout, 'mnist')
    assert calls[-1]['root'] == str(shared)
    # The caller's, relative to the caller's directory.
    calls, _ = dev_sh(checkout, 'mnist',
                      env={'CHAINER_DATASET_ROOT': 'mine'})
    assert calls[-1]['root'] == 'mine'
    assert calls[-1]['cwd'] == str(checkout['caller'])


def test_mnist_installs_nothing_when_the_stamp_matches(checkout):
    # The stamp lists more extras than mnist needs: nothing to install.
    _, result = dev_sh(checkout, 'mnist')
    assert 'installing' not in result.stderr
    assert (checkout['repo'] / '.venv/.installed').read_text().endswith(
        'examples,mpi\n')


@pytest.mark.parametrize('args,n', [([], 2), (['-n', '3'], 3),
                                    (['-n', '1000'], 1000)])
def test_chainermn_runs_mpiexec_with_the_venvs_python(checkout, args, n):
    calls, _ = dev_sh(checkout, 'chainermn', *(args + ARGS))
    assert len(calls) == 1
    call = calls[0]
    assert call['name'].endswith('mpiexec-recorder')
    assert call['cwd'] == str(checkout['caller'])
    argv = call['argv']
    assert argv[:2] == ['-n', str(n)]
    tail = [str(checkout['repo'] / '.venv/bin/python'),
            str(checkout['repo'] / 'examples/chainermn/mnist/train_mnist.py')
            ] + ARGS
    assert argv[-len(tail):] == tail
    flags = argv[2:-len(tail)]
    assert call['path'] == os.environ.get('PYTHONPATH')
    assert ('--allow-run-as-root' in flags) == (os.geteuid() == 0)
    assert ('--oversubscribe' in flags) == (
        n > len(os.sched_getaffinity(0)))


@pytest.mark.parametrize('terminal', [False, True])
def test_chainermn_tells_the_ranks_whether_its_output_is_a_terminal(
        checkout, terminal):
    """Open MPI gives every rank a pseudo-terminal: dev.sh says what its
    own output is, for the trainer's --progress auto (the bar on a
    terminal, plain lines in a file), and leaves the arguments alone."""
    if not terminal:
        calls, _ = dev_sh(checkout, 'chainermn', *ARGS)
    else:
        pty = pytest.importorskip('pty')
        main, child = pty.openpty()
        try:
            environment = dict(os.environ)
            environment['PATH'] = '{}{}{}'.format(
                checkout['bin'], os.pathsep, environment['PATH'])
            result = subprocess.run(
                ['bash', str(checkout['repo'] / 'dev.sh'), 'chainermn']
                + ARGS, cwd=str(checkout['caller']), env=environment,
                stdout=child, stderr=subprocess.PIPE,
                universal_newlines=True)
        finally:
            os.close(child)
            os.close(main)
        assert result.returncode == 0, result.stderr
        with open(str(checkout['record'])) as f:
            calls = [json.loads(line) for line in f]
    assert len(calls) == 1
    assert calls[0]['terminal'] == ('1' if terminal else '0')
    assert calls[0]['argv'][-len(ARGS):] == ARGS
    assert '--progress' not in calls[0]['argv']


def test_mnist_leaves_the_terminal_to_the_trainer(checkout):
    # One process writes to dev.sh's own output: isatty is right.
    calls, _ = dev_sh(checkout, 'mnist', env={'CHAINER_LARS_TERMINAL': ''})
    assert calls[0]['terminal'] == ''


@pytest.mark.parametrize('args', [['-n'], ['-n', '0'], ['-n', 'two']])
def test_chainermn_refuses_a_bad_number_of_processes(checkout, args):
    environment = dict(os.environ)
    environment['PATH'] = '{}{}{}'.format(checkout['bin'], os.pathsep,
                                          environment['PATH'])
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh'), 'chainermn'] + args,
        cwd=str(checkout['caller']), env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True)
    assert result.returncode == 1
    assert '-n' in result.stderr
    assert not checkout['record'].exists()


@pytest.mark.parametrize('args,extras', [([], 'examples,mpi'),
                                         (['mpi'], 'examples,mpi'),
                                         (['test,mpi'], 'examples,mpi,test'),
                                         (['nvrtc'], 'examples,mpi,nvrtc')])
def test_venv_installs_only_what_is_missing(checkout, args, extras):
    calls, result = dev_sh(checkout, 'venv', *args)
    installs = [call for call in calls if call['argv'][:2] == ['-m', 'pip']]
    if extras == 'examples,mpi':
        assert not installs
    else:
        assert len(installs) == 1
        assert installs[0]['argv'][-1] == '{}[{}]'.format(checkout['repo'],
                                                          extras)
    assert 'source {}/.venv/bin/activate'.format(
        checkout['repo']) in result.stderr
    assert (checkout['repo'] / '.venv/.installed').read_text().endswith(
        extras + '\n')


def test_docs_installs_sphinx_and_builds_in_the_repository(checkout):
    calls, result = dev_sh(checkout, 'docs', '-W')
    assert [call['argv'] for call in calls] == [
        ['-m', 'pip', 'install', '-q', '-e',
         '{}[docs,examples,mpi]'.format(checkout['repo'])],
        ['-m', 'sphinx', '-b', 'html', '-W', 'docs', 'docs/_build/html']]
    assert calls[-1]['cwd'] == str(checkout['repo'])
    assert 'docs/_build/html/index.html' in result.stderr


def test_venv_refuses_an_unknown_extra(checkout):
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh'), 'venv', 'tests'],
        cwd=str(checkout['caller']), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    assert result.returncode == 1
    assert "unknown extra 'tests'" in result.stderr


def test_venv_keeps_a_venv_it_did_not_make(checkout):
    """A .venv of the user's (Python 3.12, say) was removed without a word
    and made anew with 3.11: dev.sh refuses, and leaves it as it was."""
    venv = checkout['repo'] / '.venv'  # .installed: dev.sh's install in it
    write_script(str(venv / 'bin/python'), '#!/bin/sh\nexit 1\n')
    (venv / 'mine').write_text('kept')
    environment = dict(os.environ, PATH='{}{}{}'.format(
        checkout['bin'], os.pathsep, os.environ['PATH']))
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh'), 'venv'],
        cwd=str(checkout['caller']), env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    assert result.returncode == 1
    assert ('dev.sh: error: {} is there, not a Python 3.9-3.11 venv that '
            'dev.sh made'.format(venv)) in result.stderr, result.stderr
    assert 'creating' not in result.stderr
    assert (venv / 'mine').read_text() == 'kept'


@pytest.mark.parametrize('extra, says', [
    ('cuda13', "the extra 'cuda13' needs Python 3.12+ and numpy 2"),
    ('test,cuda13', "the extra 'cuda13' needs Python 3.12+ and numpy 2")])
def test_venv_says_why_cuda13_is_not_for_it(checkout, extra, says):
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh'), 'venv', extra],
        cwd=str(checkout['caller']), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    assert result.returncode == 1
    assert says in result.stderr


@pytest.mark.parametrize('flag', ['--help', '-h', 'help'])
def test_help_is_the_header_on_stdout(checkout, flag):
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh'), flag],
        cwd=str(checkout['caller']), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    assert (result.returncode, result.stderr) == (0, '')
    assert result.stdout.startswith(
        'The commands a developer needs, on a fresh Debian machine')
    assert '  bash dev.sh test [TOX ARGS...]       the whole test suite' in (
        result.stdout)
    assert 'set -euo' not in result.stdout and '#' not in result.stdout


@pytest.mark.parametrize('args, first', [
    (['bogus'], "dev.sh: error: unknown command 'bogus'"),
    ([], 'dev.sh: usage: bash dev.sh mnist')])
def test_an_unknown_command_is_named_before_the_usage(checkout, args, first):
    result = subprocess.run(
        ['bash', str(checkout['repo'] / 'dev.sh')] + args,
        cwd=str(checkout['caller']), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    assert (result.returncode, result.stdout) == (2, '')
    assert result.stderr.splitlines()[0].startswith(first)
    assert 'bash dev.sh --help' in result.stderr


def test_mnist_help_runs_for_real(tmp_path):
    """dev.sh mnist --help runs the real trainer, from another directory
    and with nothing on PYTHONPATH: as a file, it must find the examples
    package (and, in this checkout without an install, chainer_lars) in
    the repository by itself."""
    repo = tmp_path / 'repo'
    (repo / '.venv/bin').mkdir(parents=True)
    for name in ('dev.sh',) + PACKAGING:
        shutil.copy(os.path.join(REPO_ROOT, name), str(repo / name))
    for name in ('examples', 'chainer_lars'):
        os.symlink(os.path.join(REPO_ROOT, name), str(repo / name))
    # A wrapper, not a link: a linked venv Python loses its site-packages.
    write_script(str(repo / '.venv/bin/python'),
                 '#!/bin/sh\nexec {} "$@"\n'.format(sys.executable))
    stamp = subprocess.run(
        'cat setup.cfg pyproject.toml constraints.txt | cksum', shell=True,
        cwd=str(repo), check=True, stdout=subprocess.PIPE,
        universal_newlines=True).stdout
    (repo / '.venv/.installed').write_text(stamp + 'examples\n')
    environment = dict(os.environ)
    environment.pop('PYTHONPATH', None)
    result = subprocess.run(
        ['bash', str(repo / 'dev.sh'), 'mnist', '--help'],
        cwd=str(tmp_path), env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    assert result.returncode == 0, result.stderr
    assert '--batchsize' in result.stdout


#: A module of each group of conftest.GROUPS, and the variable that names
#: the envs that run it.
GROUP_MODULES = {
    'docs': ('test_docs.py', 'CHAINER_LARS_DOCS_IN'),
    'emulated': ('test_cuda_emulator.py', 'CHAINER_LARS_EMULATED_IN'),
    'examples': ('test_example_forms.py', 'CHAINER_LARS_EXAMPLES_IN'),
    'integration': ('test_results_check.py', 'CHAINER_LARS_INTEGRATION_IN'),
    'isolated': ('test_safety.py', 'CHAINER_LARS_ISOLATED_IN'),
}
OWN = {'isolated': 'test_a_resized_weight'}


#: The envs of each group as dev.sh test sets them with Pythons 3.9 to 3.12
#: (docs, emulated, examples, integration, isolated).
DEV_SH_GROUPS = ('docs', 'py311-cpu', 'py39-cpu', 'py311-cpu',
                 'py39-cpu,py312-numpy2')


@pytest.mark.parametrize('only, here, kept', [
    # As dev.sh test sets them (in the order of sorted(GROUP_MODULES)).
    (DEV_SH_GROUPS, 'py310-cpu', (False, False, False, False, False)),
    (DEV_SH_GROUPS, 'py311-cpu', (False, True, False, True, False)),
    (DEV_SH_GROUPS, 'py39-cpu', (False, False, True, False, True)),
    (DEV_SH_GROUPS, 'py312-numpy2', (False, False, False, False, True)),
    (('',) * 5, 'py310-cpu', (True,) * 5),
    ((None,) * 5, 'py310-cpu', (True,) * 5),
])
def test_groups_run_in_the_envs_dev_sh_names(only, here, kept):
    """Each group is deselected outside its envs, which the output says
    (what, where it runs, why); the library's tests stay everywhere."""
    env = {k: v for k, v in os.environ.items()
           if k not in [variable for _, variable in GROUP_MODULES.values()]
           + ['TOX_ENV_NAME']}
    env['TOX_ENV_NAME'] = here
    groups = sorted(GROUP_MODULES)
    for group, value in zip(groups, only):
        if value is not None:
            env[GROUP_MODULES[group][1]] = value
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '--collect-only', '-q',
         '-p', 'no:cacheprovider', 'tests/test_layout.py'] + [
             'tests/' + GROUP_MODULES[group][0] for group in groups],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True, timeout=300)
    assert result.returncode == 0, result.stdout
    assert 'test_layout.py::' in result.stdout
    for group, value, stays in zip(groups, only, kept):
        module, variable = GROUP_MODULES[group]
        # A test of the group's own (one of test_safety.py's runs on the
        # emulated device, so follows that group).
        assert ('tests/{}::{}'.format(module, OWN.get(group, ''))
                in result.stdout) == stays
        said = '{}: '.format(here) in result.stdout and (
            ' {} tests deselected, run in {} only ({}): '.format(
                group, ' and '.join((value or '').split(',')), variable)
            in result.stdout)
        assert said != stays, result.stdout
    assert ('deselected' in result.stdout) != all(kept)


def test_a_test_of_a_group_elsewhere_in_the_library_follows_its_group():
    """A library module's test on the emulated device (a parameter, the
    fixture or the marker) runs with the emulated group; the module's
    other tests everywhere."""
    env = dict(os.environ, TOX_ENV_NAME='py310-cpu',
               CHAINER_LARS_EMULATED_IN='py311-cpu',
               CHAINER_LARS_ISOLATED_IN='py311-cpu')
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '--collect-only', '-q',
         '-p', 'no:cacheprovider', 'tests/test_hook.py',
         'tests/test_in_place.py', 'tests/test_mixed_precision.py'],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert result.returncode == 0, result.stdout
    kept = [line for line in result.stdout.splitlines() if '::' in line]
    assert kept and not [line for line in kept if 'emulated' in line
                         or 'test_in_place.py' in line]
    assert any(line.startswith('tests/test_hook.py::') for line in kept)
    assert re.search(r'py310-cpu: \d+ emulated tests deselected, run in '
                     r'py311-cpu only', result.stdout)


# A tox that runs its envs at once, as `tox p` does: for each, it clears
# the env's log folder (where tox marks a start), runs a real pytest session
# of three slow tests with this repository's conftest (for the py envs), and
# prints tox's line when the env ends; it writes the journal dev.sh reads.
FAKE_TOX = """#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
envs = args[args.index('-e') + 1].split(',')
journal = args[args.index('--result-json') + 1]
with open({record!r}, 'w') as f:
    json.dump({{'envs': envs, 'groups': {{
        k: v for k, v in os.environ.items()
        if k.startswith('CHAINER_LARS_') and k.endswith('_IN')}}}}, f)
runs = {{}}
for env in envs:
    os.makedirs(os.path.join('.tox', env, 'log'), exist_ok=True)
    if env.startswith('py'):
        runs[env] = subprocess.Popen(
            [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
             {tests!r}], env=dict(os.environ, TOX_ENV_NAME=env,
                                  PYTHONPATH={repo!r}),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
results = {{}}
for env in envs:
    code = runs[env].wait() if env in runs else 0
    # As real tox does after pytest (it writes its results), give dev.sh's
    # monitor, which polls once a second, time to see the session end.
    time.sleep(3 if env in runs else 0)
    print('{{}}: {{}} in 4 seconds'.format(env, 'OK' if code == 0
                                          else 'FAIL code 1'), flush=True)
    results[env] = {{'result': {{'success': code == 0, 'duration': 4}},
                     'test': []}}
with open(journal, 'w') as f:
    json.dump({{'testenvs': results}}, f)
sys.exit(1 if any(r.wait() for r in runs.values()) else 0)
"""

# Three tests, the last of which runs longer than the heartbeat's interval
# (1 s here); the first two do not.
SLOW_TESTS = """import os
import time
import pytest


@pytest.mark.parametrize('i', range(3))
def test_slow(i):
    time.sleep(3.5 if i == 2 else 0.3)
    # Taken out, so that a pytest run by a test writes over nothing.
    assert 'CHAINER_LARS_PROGRESS' not in os.environ
"""


@pytest.fixture(scope='module')
def dev_sh_test(tmp_path_factory):
    """``dev.sh test`` run once, with the fake tox above running
    SLOW_TESTS in each py env and a heartbeat every second: its output
    (stdout and stderr) and what the fake tox was called with."""
    tmp_path = tmp_path_factory.mktemp('dev_sh_test')
    checkout = make_checkout(tmp_path)
    repo = checkout['repo']
    tests = tmp_path / 'slow_tests'
    tests.mkdir()
    (tests / 'test_slow.py').write_text(SLOW_TESTS)
    # The repository's conftest, as tox's pytest loads it.
    (tests / 'conftest.py').write_text(
        'from tests.conftest import pytest_configure  # NOQA\n')
    bootstrap = repo / '.tox' / '.bootstrap' / 'bin'
    bootstrap.mkdir(parents=True)
    # Its pip installs nothing; the rest goes to this Python.
    write_script(str(bootstrap / 'python'),
                 '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then '
                 'exit 0; fi\nexec {} "$@"\n'.format(sys.executable))
    record = tmp_path / 'tox.json'
    write_script(str(bootstrap / 'tox'), FAKE_TOX.format(
        python=sys.executable, tests=str(tests), repo=REPO_ROOT,
        record=str(record)))
    write_script(str(checkout['bin'] / 'g++'), '#!/bin/sh\nexit 0\n')
    environment = dict(os.environ)
    environment['PATH'] = '{}{}{}'.format(checkout['bin'], os.pathsep,
                                          environment['PATH'])
    for name in ('CHAINER_LARS_TOX_PARALLEL', 'CHAINER_LARS_PROGRESS',
                 'CHAINER_LARS_EMULATED_IN', 'CHAINER_LARS_INTEGRATION_IN',
                 'CHAINER_LARS_EXAMPLES_IN', 'CHAINER_LARS_ISOLATED_IN',
                 'CHAINER_LARS_DOCS_IN'):
        environment.pop(name, None)
    environment['CHAINER_LARS_HEARTBEAT'] = '1'
    result = subprocess.run(
        ['bash', str(repo / 'dev.sh'), 'test'], cwd=str(checkout['caller']),
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        universal_newlines=True, timeout=120)
    assert result.returncode == 0, result.stdout
    with open(str(record)) as f:
        return result.stdout, json.load(f)


def test_test_shows_each_envs_start_and_progress(dev_sh_test):
    """dev.sh test, running the envs in parallel, says when each starts,
    how far its pytest session is at least every CHAINER_LARS_HEARTBEAT
    seconds while tox holds its output back, and the expected duration."""
    output, called = dev_sh_test
    lines = output.splitlines()
    assert any(line.startswith('dev.sh: this takes about ')
               and 'minutes' in line for line in lines), output
    found = [int(match.group(1)) for match in (
        re.match(r'dev\.sh: Python 3\.(\d+): /', line) for line in lines)
        if match]
    full = 'py3{}-cpu'.format(found[0])
    cpu = ['py3{}-cpu'.format(v) for v in found if v < 12]
    stack = ['py3{}-numpy2'.format(v) for v in found if v == 12]
    # The longest first: the newest's, the oldest's, the numpy 2 one; a
    # Python between them is left out, and said so.
    assert called['envs'] == (cpu[:1] + cpu[1:][-1:] + stack
                              + ['docs', 'lint']), called
    for env in cpu[1:-1]:
        assert any(line.startswith('dev.sh: not run: ') and env in line
                   for line in lines), output
    assert called['groups'] == {
        'CHAINER_LARS_EMULATED_IN': full,
        'CHAINER_LARS_INTEGRATION_IN': full,
        'CHAINER_LARS_EXAMPLES_IN': cpu[-1],
        'CHAINER_LARS_ISOLATED_IN': ','.join(cpu[-1:] + stack),
        'CHAINER_LARS_DOCS_IN': 'docs'}
    envs = called['envs']
    assert len(envs) > 2, output
    for env in envs:
        ended = lines.index('{}: OK in 4 seconds'.format(env))
        assert 'dev.sh: {}: started'.format(env) in lines[:ended]
        if env.startswith('py'):
            # Its progress while it ran, before tox's line at its end.
            assert any(re.match(r'dev\.sh: \d+ min \d\d s: .*{} [12]/3 '
                                r'tests \((33|67)%\)'.format(env), line)
                       for line in lines[:ended]), output
            assert 'dev.sh: {}: pytest done: 3 tests, 0 failed'.format(
                env) in lines[:ended]
    # The monitor is gone, and with it the progress folder.
    assert not any(line.startswith('dev.sh: ') and ' min ' in line
                   for line in lines[lines.index('dev.sh: docs: OK in 4 s'):])


def test_test_names_a_test_that_runs_long(dev_sh_test):
    """The percentage counts tests, and one test can take minutes: the
    heartbeat names the test running once it has run longer than a
    heartbeat's interval."""
    output, _ = dev_sh_test
    named = [line for line in output.splitlines() if re.match(
        r'dev\.sh: \d+ min \d\d s: .*-cpu 2/3 tests \(67%\), running '
        r'(\S+/)?test_slow\.py::test_slow\[2\] for [1-4] s', line)]
    assert named, output
    # Not while it has run for less than an interval, nor the quick ones.
    assert 'test_slow[2] for 0 s' not in output
    assert 'test_slow[0]' not in output and 'test_slow[1]' not in output


# A tox that writes into the checkout, as a test that leaves Chainer's
# Trainer its default out='result' does, and removes a tracked file.
WRITING_TOX = """#!/bin/sh
mkdir -p result
echo '[{"iteration": 1}]' > result/log
echo 'changed' > notes.txt.orig
rm -f tracked.txt
exit 0
"""


@pytest.mark.skipif(shutil.which('git') is None, reason='no git')
@pytest.mark.parametrize('ci', ['true', None])
def test_test_names_what_the_run_changed_in_the_checkout(checkout, ci):
    """dev.sh test compares the checkout before and after the run: the
    files written (ignored ones such as result/ too) and the tracked ones
    removed are named, and CI fails on them; the files a developer had
    already added or changed, and the tools' caches, do not count."""
    repo = checkout['repo']
    (repo / '.gitignore').write_text('result*/\n.tox/\n.venv/\n')
    (repo / 'tracked.txt').write_text('tracked\n')
    git = ['git', '-c', 'user.name=t', '-c', 'user.email=t@t',
           '-c', 'init.defaultBranch=main']
    for command in (['init', '-q'], ['add', '.'], ['commit', '-qm', 'c']):
        subprocess.run(git + command, cwd=str(repo), check=True)
    # The developer's own: an untracked file, a change to a tracked one,
    # and an earlier run's result/ folder, all older than the run.
    (repo / 'notes.txt').write_text('mine\n')
    (repo / 'setup.cfg').write_text('# edited\n')
    (repo / 'result_old').mkdir()
    (repo / 'result_old' / 'log').write_text('[]')
    past = os.stat(str(repo / 'tracked.txt')).st_mtime - 60
    for path in ('notes.txt', 'setup.cfg', 'result_old/log'):
        os.utime(str(repo / path), (past, past))
    bootstrap = repo / '.tox' / '.bootstrap' / 'bin'
    bootstrap.mkdir(parents=True)
    write_script(str(bootstrap / 'python'),
                 '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then '
                 'exit 0; fi\nexec {} "$@"\n'.format(sys.executable))
    write_script(str(bootstrap / 'tox'), WRITING_TOX)
    write_script(str(checkout['bin'] / 'g++'), '#!/bin/sh\nexit 0\n')
    environment = dict(os.environ)
    environment['PATH'] = '{}{}{}'.format(checkout['bin'], os.pathsep,
                                          environment['PATH'])
    environment['CHAINER_LARS_TOX_PARALLEL'] = '1'
    environment.pop('CI', None)
    if ci is not None:
        environment['CI'] = ci
    result = subprocess.run(
        ['bash', str(repo / 'dev.sh'), 'test'], cwd=str(checkout['caller']),
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    lines = result.stderr.splitlines()
    start = lines.index('dev.sh: the test run changed the checkout (a test '
                        'wrote outside its temporary folder):')
    named = [line.split()[-1] for line in lines[start + 1:]
             if line.startswith('dev.sh:     ')]
    assert named == ['notes.txt.orig', 'result/log', 'tracked.txt'], (
        result.stderr)
    assert result.returncode == (1 if ci else 0), result.stderr
    assert ('error: the checkout must be as it was' in result.stderr) == (
        ci is not None)


def test_tox_lets_no_status_pass():
    """An env whose pytest collects or keeps no test (exit status 5: a
    group sent elsewhere, a marker that selects nothing) fails, as any
    failing command does: no command's status is ignored."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(os.path.join(REPO_ROOT, 'tox.ini'))
    for name in config.sections():
        section = config[name]
        for key in ('ignore_outcome', 'ignore_errors'):
            assert section.get(key, 'false').strip().lower() == 'false', (
                name, key)
        for line in section.get('commands', '').splitlines():
            command = line.split(':', 1)[-1] if re.match(
                r'\s*[\w{},.-]+:\s', line) else line
            assert not command.strip().startswith('-'), (name, line)
            if 'pytest' in command:
                assert '--suppress-no-test-exit-code' not in command
