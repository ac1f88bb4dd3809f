"""The tests of chainer-lars; ``REPO_ROOT`` is the repository they test,
and the helpers more than one module uses."""

import os


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pythonpath(*first):
    """``PYTHONPATH`` for a child process: ``first`` (by default the
    repository), then what this process has, which keeps ``compat`` (the
    numpy 2 envs' Chainer) in the child."""
    paths = list(first or (REPO_ROOT,))
    paths += [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
              if p]
    return os.pathsep.join(paths)


def tick_labels(figure, axis):
    """The labels ``axis`` shows once ``figure`` is drawn (blank left out)."""
    figure.canvas.draw()
    low, high = axis.get_view_interval()
    return [t.get_text() for t in axis.get_ticklabels(which='both')
            if t.get_text()
            and low <= t.get_position()[axis.axis_name == 'y'] <= high]
