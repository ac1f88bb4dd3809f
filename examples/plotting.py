"""Plain tick labels for the examples' log-scale plots.

Kept apart from ``plots.py`` so that ``study.py`` uses it without
importing Chainer.
"""

import math


def plain_log_ticks(axis, minor=()):
    """Labels a log-scale ``axis`` (e.g. ``axes.yaxis``) 0.1, 1, 2, 10, ...
    rather than matplotlib's 10^-1, 10^0, 2x10^0; minor ticks are labelled
    where matplotlib's default labels them (a range of a decade or less)
    and, on a longer range, those whose leading digit is in ``minor``
    (``(2, 5)``: 20, 50, 200, 500 between 10, 100 and 1000), which a
    reader needs where the axis spans only a decade or two.
    An axis that reaches past 0.001 or 10000 is labelled 1e-05, 1e+08 in
    all its ticks, not 10000 beside 1e+08.
    """
    import matplotlib.ticker

    class Plain(matplotlib.ticker.LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return plain_number(x, vmin, vmax)

        def __call__(self, x, pos=None):
            text = super().__call__(x, pos)
            if text or not minor or x <= 0:
                return text
            digit = x / 10 ** math.floor(math.log10(x) + 1e-9)
            if not any(math.isclose(digit, d) for d in minor):
                return text
            low, high = self.axis.get_view_interval()
            return plain_number(x, low, high)

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(
        Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def plain_number(x, low, high):
    """``x`` as a tick label of an axis from ``low`` to ``high``: as
    ``'{:g}'`` writes it, or in exponent form where the axis reaches past
    0.001 or 10000 (one form on the whole axis)."""
    if 1e-3 <= min(low, high) and max(low, high) <= 1e4:
        return '{:g}'.format(x)
    text = '{:.0e}'.format(x)
    return text if float(text) == x else '{:.1e}'.format(x)
