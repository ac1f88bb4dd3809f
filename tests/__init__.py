"""The tests of chainer-lars; ``REPO_ROOT`` is the repository they test,
and the helpers more than one module uses."""

import importlib.util
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


def benchmark(name):
    """The module of ``benchmarks/<name>.py``, loaded from its file (the
    benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(
        REPO_ROOT, 'benchmarks', name + '.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tick_labels(figure, axis):
    """The labels ``axis`` shows once ``figure`` is drawn (blank left out)."""
    figure.canvas.draw()
    low, high = axis.get_view_interval()
    return [t.get_text() for t in axis.get_ticklabels(which='both')
            if t.get_text()
            and low <= t.get_position()[axis.axis_name == 'y'] <= high]


def optimizer_of(face, link, multi_tensor=True):
    """``face`` set up on ``link``, with ``multi_tensor``: ``'LARS'``,
    ``'LAMB'`` or ``'hook'`` (GradientLARS on ``MomentumSGD(lr=0.1)``)."""
    import chainer
    import chainer_lars
    if face != 'hook':
        return getattr(chainer_lars, face)(
            multi_tensor=multi_tensor).setup(link)
    opt = chainer.optimizers.MomentumSGD(lr=0.1).setup(link)
    opt.add_hook(chainer_lars.GradientLARS(multi_tensor=multi_tensor))
    return opt
