"""LARS under ChainerMN: N ranks on 1/N of a batch equal one process on all.

The ranks run ``tests/mpi_equivalence_worker.py`` under ``mpiexec`` (once per
rank count, for all cases); the assertions are made here, on what it
measured. The model is float64 and the two runs differ only in the order of
the floating-point sums (mean of the ranks' means against the mean of the
whole batch), an error of a few ulps that four updates amplify little:
1e-12 is a thousand times above what is observed (about 1e-16) and far
below any real discrepancy (a rank's own gradient norm differs from the
averaged one by 1e-4 or more, relatively).

"""

import json
import os

import pytest

from tests import mpi_util


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'mpi_equivalence_worker.py')
CASES = ['hook', 'hook_loss_scaled_clip', 'lars', 'lars_nesterov']
RANKS = [2, 3]
TOLERANCE = 1e-12


@pytest.fixture(scope='module')
def equivalence(tmp_path_factory):
    """Runs the worker once per rank count and returns its measurements."""
    measured = {}

    def get(n):
        if n not in measured:
            out = tmp_path_factory.mktemp('mpi{}'.format(n)) / 'result.json'
            result = mpi_util.run_mpi(n, [WORKER, '--out', str(out)],
                                      timeout=180)
            assert result.returncode == 0, (
                'the equivalence worker failed on {} ranks'.format(n))
            measured[n] = json.loads(out.read_text())
        return measured[n]
    return get


@pytest.mark.mpi
@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('n', RANKS)
def test_ranks_equal_one_process(n, case, equivalence):
    measured = equivalence(n)
    assert measured['size'] == n
    found = measured['cases'][case]
    ranks = found['ranks']
    assert len(ranks) == n

    # Every rank applied the same averaged gradient to the same parameters
    # (bitwise so with Open MPI; an MPI whose all-reduce sums in a different
    # order on each rank may differ by rounding).
    assert found['ranks_max_abs_diff'] <= TOLERANCE

    for rank, r in enumerate(ranks):
        where = '{} on rank {} of {}'.format(case, rank, n)
        # The first update only broadcasts rank 0's parameters (each rank
        # built its model from a different seed): no step, no LARS.
        assert r['broadcast_max_abs_diff'] == 0.0, where
        assert r['observed_after_broadcast'] == 0, where
        # The steps are real ones, not a no-op that would match trivially.
        assert r['moved_max_abs'] > 1e-2, where
        assert len(r['param_max_abs_diff']) == measured['steps'], where

        for step, (param_err, norm_err, gap) in enumerate(zip(
                r['param_max_abs_diff'], r['norm_max_rel_diff'],
                r['local_vs_global_min_rel_gap']), 1):
            at = '{}, update {}'.format(where, step)
            assert param_err <= TOLERANCE, at
            # The norms the hook or rule saw are those of the averaged
            # gradient; a rank's own gradient is far from it, so this
            # could not hold had LARS run before the all-reduce.
            assert norm_err <= TOLERANCE, at
            assert gap > 1e3 * TOLERANCE, at
