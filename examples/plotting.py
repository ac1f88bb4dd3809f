"""Plain tick labels for the examples' log-scale plots.

Kept apart from ``plots.py`` so that ``study.py`` uses it without
importing Chainer.
"""


def plain_log_ticks(axis):
    """Labels a log-scale ``axis`` (e.g. ``axes.yaxis``) 0.1, 1, 2, 10, ...
    rather than matplotlib's 10^-1, 10^0, 2x10^0; minor ticks are labelled
    where matplotlib's default labels them (a range of a decade or less).
    """
    import matplotlib.ticker

    class Plain(matplotlib.ticker.LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return '{:g}'.format(x)

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(
        Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
