"""The trainers' pictures: the axes of Chainer's PlotReport, and two plots
of our own (the learning rate of every update, the trust ratios as a heat
map).

``examples/plotting.py`` holds what ``results.py`` shares with them
without importing Chainer.
"""

import math
import os

import numpy

import chainer
from chainer import training

from examples import plotting


# The legends' names of the reported values.
LABELS = {'main/loss': 'train', 'validation/main/loss': 'test',
          'main/accuracy': 'train', 'validation/main/accuracy': 'test'}


def epoch_axes(ylabel, log=False):
    """A PlotReport postprocess: labels, and the epochs a run diverged.

    It names the curves train and test, labels the y axis (log: on a log
    scale), and marks the epochs whose value is not finite, which
    PlotReport draws as nothing: a cross at the top of the plot for each
    such epoch, and a line at the first, "diverged", so that a run that
    blew up does not read as one that stopped.
    """
    def postprocess(figure, axes, summary):
        axes.set_ylabel(ylabel)
        if log:
            axes.set_yscale('log')
            plotting.plain_log_ticks(axes.yaxis)
        first = None
        finite = []
        for line in axes.get_lines():
            line.set_label(LABELS.get(line.get_label(), line.get_label()))
            x = numpy.asarray(line.get_xdata(), dtype=numpy.float64)
            y = numpy.asarray(line.get_ydata(), dtype=numpy.float64)
            bad = ~numpy.isfinite(y)
            finite.extend(y[~bad])
            if bad.any():
                axes.plot(x[bad], numpy.full(int(bad.sum()), 0.95), 'x',
                          color=line.get_color(), markersize=9,
                          transform=axes.get_xaxis_transform(),
                          label='_nolegend_')
                first = x[bad].min() if first is None else min(
                    first, x[bad].min())
        if first is not None:
            axes.axvline(first, color='red', linestyle=':',
                         label='diverged: not finite from epoch {:g} (x)'
                         .format(first))
            # The finite values' range, which the crosses would stretch.
            if finite and log:
                axes.set_ylim(min(finite) / 2, max(finite) * 2)
            elif finite:
                low, high = min(finite), max(finite)
                pad = 0.1 * (high - low) or 0.05
                axes.set_ylim(low - pad, high + pad)
    return postprocess


class IterationPlot(training.Extension):

    """Draws a reported value at every iteration, against the epoch.

    PlotReport and LogReport draw means over an interval, which for the
    learning rate hide the warm-up and the peak. This one keeps the value
    of every iteration (saved in snapshots, so that a resumed run draws
    the whole run) and draws them at the end of each epoch.

    Args:
        key (str): The reported value, e.g. ``'lr'`` from ``observe_lr``
            (which reports the rate the last update used).
        filename (str): The picture, in the trainer's output directory.
        ylabel (str): The label of the y axis.
    """

    def __init__(self, key, filename, ylabel):
        self._key = key
        self._filename = filename
        self._ylabel = ylabel
        # (epoch, value) after each update
        self._points = []

    def __call__(self, trainer):
        self._points.append((trainer.updater.epoch_detail,
                             float(trainer.observation[self._key])))
        if not trainer.updater.is_new_epoch:
            return
        import matplotlib.pyplot as plt
        figure, axes = plt.subplots()
        epochs, values = zip(*self._points)
        axes.plot(epochs, values)
        axes.set_xlabel('epoch')
        axes.set_ylabel(self._ylabel)
        axes.set_xlim(0, None)
        axes.set_ylim(0, None)
        axes.grid(alpha=0.3)
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            serializer('points', numpy.array(
                self._points, dtype=numpy.float64).reshape(-1, 2))
        else:
            self._points = [tuple(p) for p in serializer('points', None)]


class TrustRatioHeatmap(training.Extension):

    """Draws the trust ratio of every layer at every epoch as a heat map.

    One row a layer, in the model's order, one column an epoch, the colour
    the epoch's mean ratio on a log scale: lines, one a layer, cannot be
    told apart beyond ten or so. It reads the LogReport's log, which
    snapshots hold, so it keeps no state of its own.

    Args:
        keys (list of str): The reported ratios, from
            ``observe_trust_ratios``.
        filename (str): The picture, in the trainer's output directory.
    """

    # After the LogReport has added the epoch.
    priority = training.PRIORITY_READER - 1

    def __init__(self, keys, filename='trust_ratio.png'):
        self._keys = keys
        self._filename = filename

    def __call__(self, trainer):
        import matplotlib.colors
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        log = [entry for entry in trainer.get_extension('LogReport').log
               if self._keys[0] in entry]
        ratios = numpy.array([[entry.get(key, numpy.nan) for entry in log]
                              for key in self._keys])
        ratios = numpy.ma.masked_where(~(ratios > 0), ratios)
        if not ratios.count():  # a run that diverged from the start
            return
        low, high = ratios.min(), ratios.max()
        if not high > low:  # one value: LogNorm needs a range
            low, high = low / 2, high * 2
        rows = len(self._keys)
        figure, axes = plt.subplots(figsize=(7, 1.5 + 0.17 * rows))
        image = axes.imshow(
            ratios, aspect='auto', interpolation='nearest',
            norm=matplotlib.colors.LogNorm(low, high),
            extent=(log[0]['epoch'] - 0.5, log[-1]['epoch'] + 0.5,
                    rows - 0.5, -0.5))
        prefix = os.path.commonprefix(self._keys)
        prefix = prefix[:prefix.rfind('/') + 1]
        axes.set_yticks(range(rows))
        axes.set_yticklabels([key[len(prefix):] for key in self._keys],
                             fontsize=min(9, max(4, 400 // rows)))
        axes.xaxis.set_major_locator(
            matplotlib.ticker.MaxNLocator(integer=True))
        axes.set_xlabel('epoch')
        axes.set_title('trust ratio of each layer ({}...), epoch means'
                       .format(prefix), fontsize=9)
        bar = figure.colorbar(image, ax=axes, label='trust ratio (log scale)')
        ticks = ratio_ticks(low, high)
        bar.ax.minorticks_off()
        bar.set_ticks(ticks)
        bar.set_ticklabels(['{:.3g}'.format(t) for t in ticks])
        figure.tight_layout()
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)


def ratio_ticks(low, high):
    """Ticks for a log-scale colour bar from ``low`` to ``high``: 4 to 12.

    Round values (1, 2, 5 times a power of ten, or finer steps over a
    narrow range), else evenly spaced ones on the log scale.
    """
    for mantissas in ((1,), (1, 3), (1, 2, 5), (1, 1.5, 2, 3, 5, 7),
                      (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [float('{:.6g}'.format(m * 10.0 ** e))
                 for e in range(math.floor(math.log10(low)) - 1,
                                math.ceil(math.log10(high)) + 1)
                 for m in mantissas]
        ticks = [t for t in ticks
                 if low * (1 - 1e-9) <= t <= high * (1 + 1e-9)]
        if 4 <= len(ticks) <= 12:
            return ticks
    return list(numpy.geomspace(low, high, 5))


class LossScalePlot(training.Extension):

    """Draws the loss scale of every update, and marks the skipped ones.

    ``scaling`` is the run's ``chainer_lars.LossScaleState``. Dynamic
    scaling doubles the scale after each update until a gradient is not
    finite; that update is skipped (a red cross) and the scale halved, and
    from then on it grows by 2 every 1000 updates. The points are saved in
    snapshots, so that a resumed run draws the whole run.

    Args:
        scaling (chainer_lars.LossScaleState): The loss-scaling state.
        filename (str): The picture, in the trainer's output directory.
    """

    def __init__(self, scaling, filename='loss_scale.png'):
        self._scaling = scaling
        self._filename = filename
        # (epoch, scale, skipped) after each update
        self._points = []

    def __call__(self, trainer):
        scaling = self._scaling
        self._points.append((trainer.updater.epoch_detail,
                             scaling.last_loss_scale, scaling.last_skipped))
        if not trainer.updater.is_new_epoch:
            return
        import matplotlib.pyplot as plt
        epochs, scales, skipped = numpy.array(self._points).T
        skipped = skipped.astype(bool)
        figure, axes = plt.subplots()
        axes.plot(epochs, scales, drawstyle='steps-post',
                  label='loss scale of the update')
        axes.plot(epochs[skipped], scales[skipped], 'x', color='red',
                  label='skipped: a gradient not finite ({} in all)'.format(
                      scaling.skipped_updates))
        axes.set_yscale('log', base=2)
        axes.set_xlabel('epoch')
        axes.set_ylabel('loss scale (log scale)')
        axes.set_xlim(0, None)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            serializer('points', numpy.array(
                self._points, dtype=numpy.float64).reshape(-1, 3))
        else:
            self._points = [tuple(p) for p in serializer('points', None)]
