"""A pytest plugin that writes how far the session is, for ``dev.sh test``.

tox runs its envs in parallel with their output held back until each ends;
where ``CHAINER_LARS_PROGRESS`` names a folder, this plugin writes one line
into ``<folder>/<tox env>``: ``collecting``, then ``<done> <total>
<failed> <start> <test>`` as the tests run (at most once a second, and at
the end; ``<start>``, the time since the epoch, and ``<test>``, the node
id, are the test running now), then ``finished <exit status> <total>
<failed>``. ``dev.sh`` reads the files and prints a heartbeat, which names
a test that has run longer than a heartbeat's interval. Without the
variable it does nothing.
"""

import os
import threading
import time


class Progress(object):

    def __init__(self, path):
        self.path = path
        self.total = self.done = self.failed = 0
        self.running = None  # (start, node id)
        self.written = 0.0
        self._lock = threading.Lock()
        self._timer = None

    def _write(self, line):
        self.written = time.monotonic()
        temporary = self.path + '.tmp'
        with open(temporary, 'w') as f:
            f.write(line + '\n')
        os.replace(temporary, self.path)  # a reader never sees half a line

    def write(self, line):
        """Writes ``line`` now (the session's start and end)."""
        with self._lock:
            self._write(line)

    def _state(self):
        line = '{} {} {}'.format(self.done, self.total, self.failed)
        if self.running is not None:
            line += ' {:.3f} {}'.format(*self.running)
        return line

    def update(self):
        """Writes the state at most once a second (thousands of fast
        tests): now, or a second after the last write, by a timer, so that
        the test that starts a long run of its own is still named."""
        with self._lock:
            wait = 1 - (time.monotonic() - self.written)
            if wait <= 0:
                self._write(self._state())
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._flush)
                self._timer.daemon = True
                self._timer.start()

    def _flush(self):
        with self._lock:
            if self._timer is not None:  # not cancelled by the end
                self._timer = None
                self._write(self._state())

    def pytest_sessionstart(self, session):
        self.write('collecting')

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        self.write('0 {} 0'.format(self.total))

    def pytest_runtest_logstart(self, nodeid, location):
        self.running = (time.time(), nodeid)
        self.update()

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        if report.when == 'teardown':
            self.done += 1
            self.running = None
            self.update()

    def pytest_sessionfinish(self, session, exitstatus):
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._write('finished {} {} {}'.format(
                int(exitstatus), self.total, self.failed))


def register(config):
    """Registers the plugin where CHAINER_LARS_PROGRESS names a folder.

    The variable is taken out of the environment: the pytest sessions
    that tests start in subprocesses must not write over this one's file.
    """
    folder = os.environ.pop('CHAINER_LARS_PROGRESS', None)
    if folder and os.path.isdir(folder):
        name = os.environ.get('TOX_ENV_NAME') or 'pytest'
        config.pluginmanager.register(
            Progress(os.path.join(folder, name)), 'chainer_lars_progress')
