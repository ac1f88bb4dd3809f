"""The trainers' pictures: the axes of Chainer's PlotReport, and two plots
of our own (the learning rate of every update, the trust ratios as a heat
map).

``examples/plotting.py`` holds what ``study.py`` shares with them
without importing Chainer.
"""

import math
import os
import textwrap

import numpy

import chainer
from chainer import training

from examples import plotting
from examples import recipe


# The legends' names of the reported values.
LABELS = {'main/loss': 'train', 'test/main/loss': 'test',
          'val/main/loss': 'validation', 'main/accuracy': 'train',
          'test/main/accuracy': 'test', 'val/main/accuracy': 'validation'}


def run_title(args, processes=None):
    """The plots' title: the optimizer, the batch, the peak rate, the dtype.

    ``processes``: ChainerMN's, whose --batchsize is each process's.
    """
    batch = 'batch {}'.format(args.batchsize)
    if processes is not None:
        batch = 'batch {} ({} x {} processes)'.format(
            args.batchsize * processes, args.batchsize, processes)
    dtype = chainer.config.dtype  # mixed16 is float16 to NumPy
    return '{}, {}, peak {} {:g}, {}'.format(
        args.optimizer, batch,
        'alpha' if args.optimizer in recipe.ADAM_LIKE else 'lr', args.lr,
        'mixed16' if dtype is chainer.mixed16 else numpy.dtype(dtype).name)


def epoch_axes(ylabel, log=False, percent=False, title=None,
               divergence=None):
    """A PlotReport postprocess: labels, legend, title, and where a run
    diverged (``EpochPlot``, which leaves the legend to it).

    It names the curves train, test and validation in a legend under the
    axes (``legend_below``), labels the y axis (log:
    on a log scale; percent: the fractions drawn in %, from 0 to 100, with a
    zoom on the values above 90 % in an inset, ``zoom_inset``), puts whole
    epochs on the x axis, and titles the plot ``title``. From where the run
    diverged (the ``training.Divergence`` extension ``divergence`` found the
    loss not finite, or a value drawn is not finite), the values are no
    model's: they are not drawn, and a red band marks the epochs, so that a
    run that blew up does not read as one that stopped, nor as a curve.
    """
    def postprocess(figure, axes, summary):
        import matplotlib.ticker
        axes.set_ylabel(ylabel)
        lines = axes.get_lines()
        points = [(numpy.asarray(line.get_xdata(), dtype=numpy.float64),
                   numpy.asarray(line.get_ydata(), dtype=numpy.float64))
                  for line in lines]
        first = None  # the first epoch whose values are no model's
        if divergence is not None and divergence.found is not None:
            first = divergence.found[1]
        for x, y in points:
            bad = ~numpy.isfinite(y)
            if bad.any():
                first = min(x[bad].min(), math.inf if first is None
                            else first)
        finite = []
        for line, (x, y) in zip(lines, points):
            line.set_label(LABELS.get(line.get_label(), line.get_label()))
            if percent:
                y = 100 * y
            if first is not None:
                y = numpy.where(x >= first, numpy.nan, y)
            line.set_ydata(y)
            finite.extend(y[numpy.isfinite(y)])
        if log:
            axes.set_yscale('log')
            plotting.plain_log_ticks(axes.yaxis)
        # The range of the values drawn, which those not drawn would
        # stretch.
        if percent:
            axes.set_ylim(0, 100)
        elif finite and log:
            axes.set_ylim(min(finite) / 2, max(finite) * 2)
        elif finite:
            low, high = min(finite), max(finite)
            pad = 0.1 * (high - low) or 0.05
            axes.set_ylim(low - pad, high + pad)
        # Every epoch of the run, those not drawn too.
        epochs = numpy.concatenate([x for x, _ in points] + [[0]])
        low, high = epochs.min(), epochs.max()
        pad = 0.05 * (high - low) or 0.5
        axes.set_xlim(low - pad, high + pad)
        axes.xaxis.set_major_locator(
            matplotlib.ticker.MaxNLocator(integer=True))
        if percent:
            zoom_inset(axes, lines, (low - pad, high + pad))
        band = None
        if first is not None:
            band = mark_divergence(axes, first, high + pad,
                                   'loss not finite, not drawn')
        title_axes(axes, title, diverged=first is not None)
        legend_below(axes, band)
    return postprocess


def mark_divergence(axes, first, right, what):
    """Marks the epochs of ``axes`` from ``first``, where the run diverged,
    to ``right``: a red band labelled "diverged at epoch ``first``:
    ``what``" and a dotted line. Returns the band."""
    band = axes.axvspan(first, right, color='red', alpha=0.15, linewidth=0,
                        label='diverged at epoch {:g}: {}'.format(
                            round(first, 2), what))
    axes.axvline(first, color='red', linestyle=':')
    return band


def title_axes(axes, title, diverged=False):
    """Titles ``axes`` ``title`` (``run_title``, or None), "(diverged)"
    added where the run diverged."""
    if diverged:
        title = '{} (diverged)'.format(title) if title else 'diverged'
    if title:
        axes.set_title(title, fontsize=10)


def legend_below(axes, band=None):
    """The legend of ``axes`` in one row under its x axis, without a frame,
    the entry of ``band`` (``mark_divergence``'s) on two lines.

    Beside the axes (PlotReport's place) it took up to 40 % of the
    picture's width; inside, it would cover a curve, the zoom or the red
    band. Under the x axis's label, measured as drawn, it keeps its place
    when the axes are resized after (``tight_layout``).
    """
    import matplotlib.transforms
    handles, labels = axes.get_legend_handles_labels()
    labels = [label.replace(': ', ':\n', 1) if handle is band else label
              for handle, label in zip(handles, labels)]
    figure = axes.figure
    renderer = figure.canvas.get_renderer()
    drop = (axes.get_window_extent(renderer).y0
            - axes.xaxis.get_tightbbox(renderer).y0) / figure.dpi
    return axes.legend(
        handles, labels, loc='upper center', ncol=len(handles),
        frameon=False, borderaxespad=0.2, bbox_to_anchor=(0.5, 0),
        bbox_transform=axes.transAxes + matplotlib.transforms.
        ScaledTranslation(0, -drop, figure.dpi_scale_trans))


def zoom_inset(axes, lines, xlim, floor=90.0):
    """Draws ``lines`` (accuracies in %) again in an inset of ``axes``,
    zoomed on where they end above ``floor``: on 0 to 100 %, 98.0 and
    98.2 look the same. From the lowest of their last values (in whole
    points, at least ``floor``) to the highest value, in the lower right
    corner, which rising curves leave empty; none where no line ends
    above ``floor``, nor where the zoom would hold the values of fewer
    than two epochs (a one-epoch run): there is no curve to zoom on, and
    the inset would only hide the plot."""
    import matplotlib.ticker
    ends = []
    for line in lines:
        y = numpy.asarray(line.get_ydata(), dtype=numpy.float64)
        y = y[numpy.isfinite(y)]
        if len(y):
            ends.append(y[-1])
    if not ends or max(ends) < floor:
        return None
    low = max(floor, math.floor(min(ends)) - 1)
    high = min(100.0, math.floor(max(ends)) + 1)
    # The epochs from the first value in the zoom on.
    zoomed = {x for line in lines for x, y in zip(
        numpy.asarray(line.get_xdata(), dtype=numpy.float64),
        numpy.asarray(line.get_ydata(), dtype=numpy.float64))
        if y >= low}
    if len(zoomed) < 2:
        return None
    first = min(zoomed)
    inset = axes.inset_axes((0.42, 0.1, 0.55, 0.5))
    for line in lines:
        inset.plot(line.get_xdata(), line.get_ydata(),
                   color=line.get_color(), marker=line.get_marker(),
                   markersize=3, linewidth=1)
    inset.set_xlim(max(xlim[0], first - 0.3), xlim[1])
    inset.xaxis.set_major_locator(
        matplotlib.ticker.MaxNLocator(integer=True))
    inset.set_ylim(low, high)
    inset.tick_params(labelsize=7)
    inset.grid(alpha=0.3)
    inset.set_title('zoom: {:g} to {:g} %'.format(low, high), fontsize=8)
    return inset


#: Up to this many points, ``IterationPlot`` and ``LossScalePlot`` mark
#: each one: a line through one point is drawn as nothing (the CIFAR
#: example's one update on fake data left lr.png an empty frame), and a
#: few updates are steps, not a curve. Beyond, the markers (4 points wide,
#: a fiftieth of the axes' 360 points apart at 50) would merge into a
#: thick line.
MARKED_POINTS = 50


def point_markers(count):
    """The markers of a series of ``count`` points, as ``plot``'s keyword
    arguments: a dot at each up to ``MARKED_POINTS``, twice as large for a
    lone point, alone in its frame."""
    if count > MARKED_POINTS:
        return {}
    return {'marker': 'o', 'markersize': 8 if count == 1 else 4}


class IterationPlot(training.Extension):

    """Draws a reported value at every iteration, against the epoch.

    PlotReport and LogReport draw means over an interval, which for the
    learning rate hide the warm-up and the peak. This one keeps the value
    of every iteration (saved in snapshots, so that a resumed run draws
    the whole run) and draws them at the end of each epoch.

    From where the run diverged, a red band marks the epochs, as in
    ``epoch_axes``: the values are still drawn (a rate is the schedule's,
    whatever the model), but they are no longer a working run's.

    Args:
        key (str): The reported value, e.g. ``'lr'`` from ``observe_lr``
            (which reports the rate the last update used).
        filename (str): The picture, in the trainer's output directory.
        ylabel (str): The label of the y axis.
        title (str): The title (``run_title``), or None.
        divergence (training.Divergence): The extension that finds where
            the run diverged, or None.
    """

    def __init__(self, key, filename, ylabel, title=None, divergence=None):
        self._key = key
        self._filename = filename
        self._ylabel = ylabel
        self._title = title
        self._divergence = divergence
        # (epoch, value) after each update
        self._points = []

    def __call__(self, trainer):
        self._points.append((trainer.updater.epoch_detail,
                             float(trainer.observation[self._key])))
        if not trainer.updater.is_new_epoch:
            return
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        figure, axes = plt.subplots()
        epochs, values = zip(*self._points)
        axes.plot(epochs, values, **point_markers(len(values)))
        axes.set_xlabel('epoch')
        axes.set_ylabel(self._ylabel)
        axes.set_xlim(0, None)
        axes.set_ylim(0, None)
        axes.xaxis.set_major_locator(
            matplotlib.ticker.MaxNLocator(integer=True))
        found = self._divergence and self._divergence.found
        if found:
            right = axes.get_xlim()[1]
            band = mark_divergence(axes, found[1], right,
                                   'loss not finite from here on')
            axes.set_xlim(0, right)
            legend_below(axes, band)
        title_axes(axes, self._title, diverged=bool(found))
        axes.grid(alpha=0.3)
        figure.tight_layout()  # the label beside ticks like 0.00025
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            serializer('points', numpy.array(
                self._points, dtype=numpy.float64).reshape(-1, 2))
        else:
            self._points = [tuple(p) for p in serializer('points', None)]


#: The trust-ratio heat map's row labels, in points, for any number of
#: rows: the figure grows 0.17 in (12 points) a row, so that a label of
#: this size with its ascenders and descenders fits its row. (It shrank
#: with the rows before, to 4 points for ResNet-110's 112: illegible.)
ROW_LABEL_POINTS = 9
#: The least distance between the centres of two of the heat map's colour
#: bar labels, in label sizes. A label's box is 1.0 to 1.17 sizes high
#: (Matplotlib 3.11's, or the font's ascent and descent), its digits'
#: ink about 0.73: 1.4 leaves 0.23 to 0.4 between two boxes, 0.67 between
#: two labels' digits. (At 1.5, the round 0.03, 0.1, 0.3, 1 and 3 of a
#: default MNIST run's bar, 0.3 % short, gave way to unround labels.)
TICK_LABEL_SPACING = 1.4


class TrustRatioHeatmap(training.Extension):

    """Draws the trust ratio of every layer at every epoch as a heat map.

    One row a layer, in the model's order, one column a line of the log
    (an epoch, or with --eval-every the iterations since the line
    before), spanning the epochs it covers (a one-epoch run is one column
    from 0 to 1), the colour its mean ratio on a log scale: lines, one
    a layer, cannot be told apart beyond ten or so. It reads the
    LogReport's log, which snapshots hold, so it keeps no state of its
    own.

    Args:
        keys (list of str): The reported ratios, from
            ``observe_trust_ratios``.
        filename (str): The picture, in the trainer's output directory.
        title (str): The title (``run_title``), or None.
        iterations_per_epoch (float): Places each line of the log by its
            iteration; None: by its epoch (a log of one line an epoch).
        every (int): --eval-every, which adds lines to the log, or None.
    """

    # After the LogReport has added the epoch.
    priority = training.PRIORITY_READER - 1

    def __init__(self, keys, filename='trust_ratio.png', title=None,
                 iterations_per_epoch=None, every=None):
        self._keys = keys
        self._filename = filename
        self._title = title
        self._per_epoch = iterations_per_epoch
        self._every = every

    def _columns(self, full):
        """The log's lines that hold ratios, and the columns' edges (in
        epochs): a line spans from the line before it to itself; a gap
        between two (a line without ratios) is a column of None."""
        # A line at an epoch's end (its first iteration past the epoch's
        # examples) at the epoch's whole number, the others in between.
        per = self._per_epoch
        ends = [entry['iteration'] / per if per and entry['iteration'] != (
            math.ceil(entry['epoch'] * per - 1e-9)) else entry['epoch']
            for entry in full]
        edges, lines = [], []
        for k, entry in enumerate(full):
            if self._keys[0] not in entry:
                continue
            start = ends[k - 1] if k else 0.0 if per else ends[k] - 1
            if not edges or edges[-1] != start:
                if edges:
                    lines.append(None)  # the gap
                edges.append(start)
            edges.append(ends[k])
            lines.append(entry)
        return lines, edges

    def __call__(self, trainer):
        import matplotlib.colors
        import matplotlib.font_manager
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        log, edges = self._columns(trainer.get_extension('LogReport').log)
        ratios = numpy.array([[(entry or {}).get(key, numpy.nan)
                               for entry in log] for key in self._keys])
        # The epochs whose loss was not finite: their ratios are no model's
        # (the observer reads 1 where the norms are NaN).
        dead = numpy.array([not math.isfinite((entry or {}).get(
            'main/loss', 0.0)) for entry in log], bool)
        ratios = numpy.ma.masked_where(~(ratios > 0) | dead, ratios)
        if not ratios.count() and not dead.any():
            return
        if ratios.count():
            low, high = ratios.min(), ratios.max()
        else:  # diverged in its first epoch: a frame that says so
            low = high = 1.0
        if not high > low:  # one value: LogNorm needs a range
            low, high = low / 2, high * 2
        rows, columns = ratios.shape
        # Wide enough for the labels and the colour bar, and a column of
        # at least a quarter of an inch.
        width = min(9, 5 + 0.25 * columns)
        figure, axes = plt.subplots(figsize=(width, 1.8 + 0.17 * rows))
        image = axes.pcolormesh(
            edges, numpy.arange(rows + 1) - 0.5, ratios,
            norm=matplotlib.colors.LogNorm(low, high))
        axes.set_ylim(rows - 0.5, -0.5)
        prefix = os.path.commonprefix(self._keys)
        prefix = prefix[:prefix.rfind('/') + 1]
        axes.set_yticks(range(rows))
        axes.set_yticklabels([key[len(prefix):] for key in self._keys],
                             fontsize=ROW_LABEL_POINTS)
        axes.xaxis.set_major_locator(
            matplotlib.ticker.MaxNLocator(integer=True))
        label = (
            'epoch (each column: the mean of the ratios observed in that '
            'epoch)' if not self._every else 'epoch (each column: the mean '
            'of the ratios observed since the column before;\none every {} '
            'iterations and at the end of each epoch)'.format(self._every))
        # Centred under the axes, left of the colour bar: a short run's
        # figure is narrower than the label on one line, which was cut
        # at both ends. About 12 characters of 10 points an inch.
        axes.set_xlabel('\n'.join(
            textwrap.fill(part, int(12 * (width - 1.5)))
            for part in label.split('\n')))
        axes.set_title('{}trust ratio of each layer ({}...)'.format(
            self._title + ' (diverged)\n' if self._title and dead.any()
            else self._title + '\n' if self._title else '', prefix),
            fontsize=9)
        if dead.any():
            # Masked cells show the background.
            axes.set_facecolor('#fdd')
            first = edges[int(numpy.argmax(dead))]
            axes.text((first + edges[-1]) / 2, (rows - 1) / 2,
                      'diverged in epoch {}:\nloss not finite, not drawn'
                      .format(math.floor(first) + 1), ha='center',
                      va='center', color='red', fontsize=9)
        bar = None
        if ratios.count():
            bar = figure.colorbar(image, ax=axes,
                                  label='trust ratio (log scale)')
            bar.ax.minorticks_off()
        figure.tight_layout()
        if bar is not None:
            # The bar's length is known once laid out: as short as the
            # MLP's 3 rows, 5 labels of a narrow range collided.
            length = (bar.ax.get_position().height * figure.get_figheight()
                      * 72)
            size = matplotlib.font_manager.FontProperties(
                size=matplotlib.rcParams['ytick.labelsize']
            ).get_size_in_points()
            ticks = ratio_ticks(low, high, room=(
                TICK_LABEL_SPACING * size / length * math.log10(high / low)))
            bar.set_ticks(ticks)
            bar.set_ticklabels(tick_labels(ticks))
            figure.tight_layout()  # the labels' width
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)


def ratio_ticks(low, high, room=0.0):
    """Ticks for a log-scale colour bar from ``low`` to ``high``: 4 to 12,
    no two closer than ``room`` decades (a label's room on the bar).

    Round values (1, 2, 5 times a power of ten, or finer mantissas over a
    narrower range, or over a range narrower still multiples of a round
    step, as 0.012, 0.014, ...), else evenly spaced ones on the log scale.
    Where no round set of 4 has the room, the round set of 3 that has it,
    else fewer evenly spaced ones than the round set that lacked it, as
    many as have it, 2 at least (the ends); where that leaves 3 or 2, a
    round pair that has the room instead.
    """
    fewer, pair = [], []
    crowded = 13  # the fewest ticks of a round set without the room
    for ticks in _round_sets(low, high):
        ticks = [t for t in dict.fromkeys(float('{:.6g}'.format(t))
                                          for t in ticks)  # once each
                 if low * (1 - 1e-9) <= t <= high * (1 + 1e-9)]
        if not all(math.log10(b / a) >= room * (1 - 1e-9)
                   for a, b in zip(ticks, ticks[1:])):
            if len(ticks) >= 4:
                crowded = min(crowded, len(ticks))
            continue
        if 4 <= len(ticks) <= 12:
            return ticks
        if len(ticks) == 3:
            fewer = ticks
        elif len(ticks) == 2 and not pair:
            pair = ticks
    if fewer:
        return fewer
    count = min(5, crowded - 1)
    if room > 0:
        count = max(2, min(count, 1 + int(math.log10(high / low) / room)))
    return pair if pair and count <= 3 else list(
        numpy.geomspace(low, high, count))


def _round_sets(low, high):
    """The candidate sets of ``ratio_ticks``, coarsest first, unrounded
    and unclipped: mantissas times the powers of ten, then the multiples
    of round steps at the scale of ``high - low``."""
    for mantissas in ((1,), (1, 3), (1, 2, 5), (1, 1.5, 2, 3, 5, 7),
                      (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        yield [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1,
                                            math.ceil(math.log10(high)) + 1)
               for m in mantissas]
    width = math.floor(math.log10(high - low)) if high > low else 0
    for step in (m * 10.0 ** width for m in (5, 2, 1, 0.5, 0.2, 0.1)):
        yield [k * step for k in range(math.floor(low / step),
                                       math.ceil(high / step) + 1)]


def tick_labels(ticks):
    """The labels of ``ticks`` (above 0, on a log scale): 3 significant
    digits, more where that would label two ticks alike or one more than
    a tenth of the smallest gap between two ticks off."""
    gap = min((math.log10(b / a) for a, b in zip(ticks, ticks[1:])),
              default=math.inf)
    for digits in range(3, 10):
        labels = ['{:.{}g}'.format(t, digits) for t in ticks]
        if len(set(labels)) == len(labels) and all(
                abs(math.log10(float(label) / t)) <= gap / 10
                for label, t in zip(labels, ticks)):
            break
    return labels


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
        title (str): The plot's title (``run_title``), or None.
    """

    def __init__(self, scaling, filename='loss_scale.png', title=None):
        self._scaling = scaling
        self._filename = filename
        self._title = title
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
                  **point_markers(len(scales)),
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
        if self._title:
            axes.set_title(self._title, fontsize=10)
        figure.tight_layout()
        figure.savefig(os.path.join(trainer.out, self._filename))
        plt.close(figure)

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            serializer('points', numpy.array(
                self._points, dtype=numpy.float64).reshape(-1, 3))
        else:
            self._points = [tuple(p) for p in serializer('points', None)]
