"""Fresh processes for tests, without paying for the imports each time:
the isolated group's cases, the planted-bug runs of the emulated GPU, and
(``script``) the trainers of the study's and results table's tests.

``run(code)`` runs ``code`` as ``python -c code`` would, in a process of
its own, and returns ``(returncode, stdout, stderr)``: a crash (a signal)
gives a negative status, as ``subprocess`` reports it, and fails only that
case. The process is forked from a server that this module starts once per
pytest session. The server has imported NumPy, Chainer, chainer_lars and
the tests' references and has run one update of each face, so that Numba
has loaded the compiled loops; it has made no array the case sees and runs
no thread, so each case starts from the same state: no earlier case's
arrays, plans or tables, and a memory layout of its own. Started as a new
interpreter, each case paid about 2 s of imports and loading; forked, it
pays milliseconds.

The server runs with ``PYTHONPATH=tests.pythonpath()`` (so ``compat`` in
the numpy 2 envs), ``PYTHONWARNINGS=ignore`` and the repository as its
folder; a case that needs another environment uses ``subprocess``.
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile

from tests import REPO_ROOT
from tests import pythonpath


# The server: reads one JSON request a line ({"code", "timeout"}), forks a
# child that runs the code with its output in two files, and answers one
# JSON line ({"returncode", "stdout", "stderr"}).
_SERVER = r'''
import atexit, json, os, signal, sys, tempfile, traceback
import numpy, chainer, chainer.links
import chainer_lars
from tests import lamb_reference, lars_reference


def warm():
    """One update of each face and dtype: Numba loads its compiled loops
    here once, not in every case."""
    for dtype, masters in ((numpy.float32, False), (numpy.float16, False),
                           (numpy.float16, True)):
        for make in (lambda: chainer_lars.LARS(),
                     lambda: chainer_lars.LARS(multi_tensor=False),
                     lambda: chainer_lars.LAMB(),
                     lambda: chainer.optimizers.MomentumSGD()):
            link = chainer.links.Linear(3, 2)
            link.to_device('@numpy')
            for p in link.params():
                p.array = p.array.astype(dtype)
            optimizer = make()
            optimizer.setup(link)
            if masters:
                optimizer.use_fp32_update()
            if isinstance(optimizer, chainer.optimizers.MomentumSGD):
                optimizer.add_hook(chainer_lars.GradientLARS())
            for p in link.params():
                p.grad = numpy.ones_like(p.array)
            optimizer.update()


def child(code, timeout, out, err):
    signal.alarm(timeout)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.argv = ['-c']
    status = 0
    try:
        exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (e.code is not None)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


warm()
requests = sys.stdin
answers = os.fdopen(os.dup(1), 'w')
for line in requests:
    request = json.loads(line)
    files = [tempfile.TemporaryFile() for _ in range(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        requests.close()
        child(request['code'], request['timeout'],
              *(f.fileno() for f in files))
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read().decode('utf-8', 'replace'))
        f.close()
    returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                  else os.WEXITSTATUS(status))
    answers.write(json.dumps({'returncode': returncode, 'stdout': texts[0],
                              'stderr': texts[1]}) + '\n')
    answers.flush()
'''

_server = None


def _start():
    env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONWARNINGS='ignore')
    log = tempfile.TemporaryFile()  # what the server itself says
    process = subprocess.Popen(
        [sys.executable, '-c', _SERVER], env=env, cwd=REPO_ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
        universal_newlines=True)
    process.log = log
    atexit.register(_stop, process)
    return process


def _stop(process):
    process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    process.stdout.close()
    process.log.close()


def run(code, timeout=300):
    """``(returncode, stdout, stderr)`` of ``code`` run as ``python -c``
    in a process forked from the server; a case that runs past
    ``timeout`` seconds is stopped by SIGALRM (status -14)."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = _start()
    try:
        _server.stdin.write(json.dumps({'code': code,
                                        'timeout': int(timeout)}) + '\n')
        _server.stdin.flush()
        answer = _server.stdout.readline()
    except BrokenPipeError:
        answer = ''
    if not answer:
        # The server itself ended: its status and last words; the next
        # case starts a fresh one.
        server, _server = _server, None
        server.wait()
        server.log.seek(0)
        error = server.log.read().decode('utf-8', 'replace')[-4000:]
        raise RuntimeError('the fork server of tests/forked.py ended with '
                           'status {}:\n{}'.format(server.returncode, error))
    answer = json.loads(answer)
    return answer['returncode'], answer['stdout'], answer['stderr']


def script(argv, stdout):
    """``examples.mnist.results.run_process`` (the trainers' launch of the
    results table and of the study) for the tests that run many trainers:
    ``argv`` (``[python, script, args...]``) run as that command would, in
    a forked process, which skips about 1.5 s of CPU a new interpreter
    spends before training; its output (stdout, then stderr) into the text
    file ``stdout``, its exit status back."""
    code = ('import runpy, os, sys; sys.argv = {!r}; '
            'sys.path[0] = os.path.dirname(sys.argv[0]); '
            "runpy.run_path(sys.argv[0], run_name='__main__')").format(
                list(argv[1:]))
    returncode, out, err = run(code, timeout=600)
    stdout.write(out + err)
    return returncode
