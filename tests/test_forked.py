"""tests/forked.py, the isolated group's fresh processes: each case runs as
``python -c`` would, apart from the others, and a crash is a status."""

from tests import forked


def test_output_status_and_errors_come_back_as_from_python_c():
    assert forked.run('print("out"); import sys; print("err", '
                      'file=sys.stderr)') == (0, 'out\n', 'err\n')
    assert forked.run('import sys; sys.exit(3)')[0] == 3
    assert forked.run('raise SystemExit("bye")')[:1] == (1,)
    rc, out, err = forked.run('print("before"); 1 / 0')
    assert (rc, out) == (1, 'before\n')
    assert 'ZeroDivisionError' in err and 'Traceback' in err


def test_a_crash_is_a_negative_status_and_the_next_case_runs():
    rc, _, _ = forked.run('import ctypes; ctypes.string_at(0)')
    assert rc == -11
    assert forked.run('print(__name__)') == (0, '__main__\n', '')


def test_each_case_starts_from_the_servers_state_not_the_last_cases():
    forked.run('import chainer_lars; chainer_lars.leftover = 1; x = 2')
    assert forked.run(
        'import chainer_lars; print(hasattr(chainer_lars, "leftover"), '
        '"x" in globals())')[1] == 'False False\n'


def test_a_case_past_its_timeout_is_stopped():
    assert forked.run('import time; time.sleep(30)', timeout=1)[0] == -14


def test_the_server_runs_no_thread_to_fork_with():
    """fork copies only the calling thread: the server (the case's parent)
    has no other whose locks a case could inherit held."""
    rc, out, _ = forked.run('import os; print(len(os.listdir('
                            '"/proc/{}/task".format(os.getppid()))))')
    assert (rc, out) == (0, '1\n')
