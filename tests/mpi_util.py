"""Helpers for tests that run ranks under ``mpiexec``.

The tests drive the ranks as a subprocess, so that a plain ``pytest`` run
exercises them. Tests marked ``mpi`` are skipped where ``mpiexec`` or
``mpi4py`` is missing (conftest.py calls ``require_mpi``), unless
``CHAINER_LARS_REQUIRE_MPI=1`` (set by CI, which installs both): there a
missing MPI is a failure, not a silent skip.

"""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests import REPO_ROOT


def mpi_required():
    """Whether a missing MPI must fail the tests instead of skipping them."""
    return os.environ.get('CHAINER_LARS_REQUIRE_MPI', '') == '1'


def mpi_unavailable_reason():
    """Why MPI tests cannot run here, or ``None`` if they can."""
    if shutil.which('mpiexec') is None:
        return 'mpiexec is not on PATH (install Open MPI)'
    try:
        import mpi4py  # NOQA
    except ImportError as e:
        return 'mpi4py cannot be imported ({})'.format(e)
    return None


def require_mpi():
    """Skips the calling test without MPI (fails if MPI is required)."""
    reason = mpi_unavailable_reason()
    if reason is None:
        return
    if mpi_required():
        pytest.fail('CHAINER_LARS_REQUIRE_MPI=1 but ' + reason)
    pytest.skip(reason)


def mpiexec_command(n, args):
    """The ``mpiexec`` command line that runs ``python args...`` on n ranks.

    ``--oversubscribe`` is added when there are more ranks than cores, and
    ``--allow-run-as-root`` when running as root (containers, CI). Ranks are
    not bound to cores: on a machine shared with other jobs, binding pins
    them to cores that may be busy.

    """
    command = ['mpiexec', '-n', str(n), '--bind-to', 'none']
    if n > (os.cpu_count() or 1):
        command.append('--oversubscribe')
    if hasattr(os, 'geteuid') and os.geteuid() == 0:
        command.append('--allow-run-as-root')
    return command + [sys.executable] + list(args)


def mpi_env(extra=None):
    """The environment for the ranks: the repository on ``PYTHONPATH``."""
    env = dict(os.environ)
    paths = [REPO_ROOT]
    if env.get('PYTHONPATH'):
        paths.append(env['PYTHONPATH'])
    env['PYTHONPATH'] = os.pathsep.join(paths)
    # One BLAS thread per rank: the ranks already share the cores.
    env.setdefault('OMP_NUM_THREADS', '1')
    env.setdefault('OPENBLAS_NUM_THREADS', '1')
    env.setdefault('MKL_NUM_THREADS', '1')
    if extra:
        env.update(extra)
    return env


def run_mpi(n, args, timeout=120, env=None, cwd=None):
    """Runs ``python args...`` on ``n`` ranks and waits for it.

    Args:
        n (int): Number of ranks.
        args (list of str): Arguments to ``python`` (a script and its
            options, or ``-m module ...``).
        timeout (float): Seconds before the whole job is killed and the
            test fails; a hung collective must not hang the suite.
        env (dict): Extra environment variables for the ranks.
        cwd (str): Working directory; the repository root by default.

    Returns:
        subprocess.CompletedProcess: with ``stdout`` and ``stderr`` as text.
        Its output is printed when the return code is not 0, so that pytest
        shows it with the failure.

    """
    process = start_mpi(n, args, env=env, cwd=cwd)
    command = process.args
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop(process)
        _print_output(command, None, stdout, stderr)
        pytest.fail('{} timed out after {} s'.format(
            ' '.join(command), timeout))
    result = subprocess.CompletedProcess(
        command, process.returncode, stdout, stderr)
    if result.returncode != 0:
        _print_output(command, result.returncode, stdout, stderr)
    return result


def start_mpi(n, args, env=None, cwd=None):
    """Starts ``python args...`` on ``n`` ranks (``run_mpi``'s arguments)
    and returns the ``subprocess.Popen`` of ``mpiexec``, its output piped
    as text, in a session of its own, and SIGINT as a terminal's Ctrl-C
    finds it (a test run started in the background of a non-interactive
    shell ignores it, and so would its children). ``n`` may also be a
    list of ``(ranks, folder)``: that many ranks run in each folder
    (``mpiexec``'s ``-wdir``, one ``:``-separated part each)."""
    if isinstance(n, int):
        command = mpiexec_command(n, args)
    else:
        total = sum(ranks for ranks, _ in n)
        command = mpiexec_command(total, [])[:-1]  # without the python
        del command[1:3]  # the -n of each part instead
        for i, (ranks, folder) in enumerate(n):
            command += ([':'] if i else []) + [
                '-n', str(ranks), '-wdir', str(folder), sys.executable] + list(
                    args)
    return subprocess.Popen(
        command, cwd=cwd or REPO_ROOT, env=mpi_env(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stop(process):
    """Stops a hung ``mpiexec`` and its ranks; returns their output.

    The ranks run in process groups of their own, so killing the launcher
    would leave them behind: SIGTERM makes ``mpiexec`` stop them first.
    SIGKILL to the launcher's session (``start_new_session``) is the
    fallback.
    """
    process.terminate()
    try:
        return process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()


def _print_output(command, returncode, stdout, stderr):
    print('$ ' + ' '.join(command))
    print('return code: {}'.format(returncode))
    print('--- stdout ---')
    print(stdout)
    print('--- stderr ---')
    print(stderr)
