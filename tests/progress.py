"""A pytest plugin that writes how far the session is, for ``dev.sh test``.

tox runs its envs in parallel with their output held back until each ends;
where ``CHAINER_LARS_PROGRESS`` names a folder, this plugin writes one line
into ``<folder>/<tox env>``: ``collecting``, then ``<done> <total>
<failed>`` as the tests run (at most once a second, and at the end), then
``finished <exit status> <total> <failed>``. ``dev.sh`` reads the files
and prints a heartbeat. Without the variable it does nothing.
"""

import os
import time


class Progress(object):

    def __init__(self, path):
        self.path = path
        self.total = self.done = self.failed = 0
        self.written = 0.0

    def write(self, line, now=False):
        # At most once a second: thousands of fast tests.
        if not now and time.monotonic() - self.written < 1:
            return
        self.written = time.monotonic()
        temporary = self.path + '.tmp'
        with open(temporary, 'w') as f:
            f.write(line + '\n')
        os.replace(temporary, self.path)  # a reader never sees half a line

    def pytest_sessionstart(self, session):
        self.write('collecting', now=True)

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        self.write('0 {} 0'.format(self.total), now=True)

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        if report.when == 'teardown':
            self.done += 1
            self.write('{} {} {}'.format(self.done, self.total, self.failed))

    def pytest_sessionfinish(self, session, exitstatus):
        self.write('finished {} {} {}'.format(
            int(exitstatus), self.total, self.failed), now=True)


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
