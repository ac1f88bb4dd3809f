"""The MPI gate and the mpiexec runner of tests/mpi_util.py."""

import os

import pytest

from tests import mpi_util
from tests import REPO_ROOT


def test_mpiexec_command_flags():
    command = mpi_util.mpiexec_command(
        (os.cpu_count() or 1) + 1, ['script.py', '--flag'])
    assert command[:3] == ['mpiexec', '-n', str((os.cpu_count() or 1) + 1)]
    assert '--oversubscribe' in command
    assert command[-2:] == ['script.py', '--flag']
    assert ('--allow-run-as-root' in command) == (os.geteuid() == 0)
    assert '--oversubscribe' not in mpi_util.mpiexec_command(1, ['s.py'])


def test_mpi_env_puts_repo_first(monkeypatch):
    monkeypatch.setenv('PYTHONPATH', '/elsewhere')
    env = mpi_util.mpi_env({'EXTRA': '1'})
    assert env['PYTHONPATH'].split(os.pathsep) == [REPO_ROOT, '/elsewhere']
    assert env['EXTRA'] == '1'


@pytest.mark.parametrize('require, outcome', [
    ('', pytest.skip.Exception),
    ('1', pytest.fail.Exception),
])
def test_missing_mpi_skips_unless_required(tmp_path, monkeypatch, require,
                                           outcome):
    # A PATH without mpiexec on it.
    monkeypatch.setenv('PATH', str(tmp_path))
    monkeypatch.setenv('CHAINER_LARS_REQUIRE_MPI', require)
    with pytest.raises(outcome, match='mpiexec is not on PATH'):
        mpi_util.require_mpi()


@pytest.mark.mpi
def test_runs_more_ranks_than_cores():
    n = (os.cpu_count() or 1) + 1
    # Rank 0 prints for all: lines printed by several ranks can interleave.
    code = ('from mpi4py import MPI; c = MPI.COMM_WORLD; '
            'r = c.gather((c.rank, c.allreduce(1))); '
            'c.rank == 0 and print(r)')
    result = mpi_util.run_mpi(n, ['-c', code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([(rank, n) for rank in range(n)])
