"""Argument checks, and the attribute descriptors that apply them.

Every argument and settable attribute of the package is checked by one of
the functions here, so that a bad value is refused at once, before anything
the user had is changed, with an error that names the argument and the
value. Each check takes the name to report and the value, and returns the
value in canonical form (a Python ``float``, ``bool`` or ``int``).

:class:`CheckedAttribute` and :class:`CheckedHyperparameter` run a check on
every assignment, for the hook's attributes and the optimizer's
hyperparameters alike.
"""

import math
import numbers
import re

import numpy


def _describe(value):
    return '{!r} ({})'.format(value, type(value).__name__)


def real(name, value, minimum=None, exclusive=False, maximum=None,
         maximum_exclusive=True):
    """Checks that ``value`` is a finite real number within bounds.

    Args:
        name (str): The name to report.
        value: The value to check.
        minimum (float or None): The lower bound, if any.
        exclusive (bool): If ``True``, ``value`` must exceed ``minimum``.
        maximum (float or None): The upper bound, if any.
        maximum_exclusive (bool): If ``True``, ``value`` must be below
            ``maximum``.

    Returns:
        float: ``value`` as a Python float.

    Raises:
        TypeError: ``value`` is not a real number (a ``bool`` is not one).
        ValueError: ``value`` is not finite or is out of bounds.

    """
    if (isinstance(value, (bool, numpy.bool_))
            or not isinstance(value, numbers.Real)):
        raise TypeError('{} must be a real number, not {}'.format(
            name, _describe(value)))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError('{} must be finite, got {!r}'.format(name, value))
    if minimum is not None:
        if exclusive and not value > minimum:
            raise ValueError('{} must be greater than {}, got {!r}'.format(
                name, minimum, value))
        if not exclusive and not value >= minimum:
            raise ValueError('{} must be at least {}, got {!r}'.format(
                name, minimum, value))
    if maximum is not None:
        if maximum_exclusive and not value < maximum:
            raise ValueError('{} must be less than {}, got {!r}'.format(
                name, maximum, value))
        if not maximum_exclusive and not value <= maximum:
            raise ValueError('{} must be at most {}, got {!r}'.format(
                name, maximum, value))
    return value


def boolean(name, value):
    """Checks that ``value`` is a ``bool`` or a ``numpy.bool_``.

    Integers are refused: ``clip=1`` is more often a typo for a number
    argument than a way to write ``True``.

    Returns:
        bool: ``value`` as a Python bool.

    Raises:
        TypeError: ``value`` is of another type.

    """
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError('{} must be a bool, not {}'.format(
            name, _describe(value)))
    return bool(value)


def count(name, value):
    """Checks that ``value`` is a non-negative integer.

    Returns:
        int: ``value`` as a Python int.

    Raises:
        TypeError: ``value`` is not an integer (a ``bool`` is not one).
        ValueError: ``value`` is negative.

    """
    if (isinstance(value, (bool, numpy.bool_))
            or not isinstance(value, numbers.Integral)):
        raise TypeError('{} must be an int, not {}'.format(
            name, _describe(value)))
    if value < 0:
        raise ValueError('{} must be at least 0, got {!r}'.format(
            name, value))
    return int(value)


def string(name, value):
    """Checks that ``value`` is a ``str``.

    Raises:
        TypeError: ``value`` is of another type.

    """
    if not isinstance(value, str):
        raise TypeError('{} must be a str, not {}'.format(
            name, _describe(value)))
    return value


def pattern(name, value):
    """Compiles one regular expression on ``str``.

    Parameter paths are ``str``; a ``bytes`` pattern, plain or compiled,
    could never match one (:func:`re.search` would raise at the first
    update), so it is refused here.

    Args:
        name (str): The name to report.
        value (str or re.Pattern): The expression.

    Returns:
        re.Pattern: The compiled expression.

    Raises:
        TypeError: ``value`` is neither a ``str`` nor a compiled ``str``
            pattern.
        ValueError: ``value`` is not a valid regular expression.

    """
    if isinstance(value, re.Pattern):
        if not isinstance(value.pattern, str):
            raise TypeError(
                '{} must be a regular expression on str, not the '
                'compiled {} pattern {!r}'.format(
                    name, type(value.pattern).__name__, value))
        return value
    if not isinstance(value, str):
        raise TypeError(
            '{} must be a regular expression (a str), not {}'.format(
                name, _describe(value)))
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError('{} is not a valid regular expression: {!r}: '
                         '{}'.format(name, value, e)) from None


def patterns(name, values):
    """Compiles a list of regular expressions on ``str``.

    A single ``str`` or compiled pattern is taken as a list of one.

    Returns:
        tuple of re.Pattern: The compiled expressions.

    Raises:
        TypeError: ``values`` is not an iterable of ``str`` or compiled
            ``str`` patterns (``bytes`` is refused, not iterated).
        ValueError: one of them is not a valid regular expression.

    """
    if values is None:
        return ()
    if isinstance(values, (str, re.Pattern)):
        values = (values,)
    if isinstance(values, (bytes, bytearray)):
        # Iterating bytes would give ints, and the error would name 47 for
        # b'/b$'.
        raise TypeError(
            '{} must be a list of regular expressions (str), not '
            '{}'.format(name, _describe(values)))
    try:
        items = tuple(values)
    except TypeError:
        raise TypeError(
            '{} must be a list of regular expressions (str), not '
            '{}'.format(name, _describe(values))) from None
    return tuple(pattern('{} item {}'.format(name, i), item)
                 for i, item in enumerate(items))


class CheckedAttribute(object):

    """An instance attribute whose every assignment is checked.

    The checked value is stored in the instance as ``_<name>``, where the
    class's own code reads it without going through the descriptor.

    Args:
        check (callable): ``check(name, value, **options)``, one of the
            functions of this module; it returns the value to store or
            raises.
        options: Passed to ``check``, e.g. ``minimum=0.0``.

    """

    def __init__(self, check, **options):
        self._check = check
        self._options = options
        self.name = None

    def __set_name__(self, owner, name):
        self.name = name

    def check(self, value):
        """Returns ``value`` as it would be stored, or raises."""
        return self._check(self.name, value, **self._options)

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return getattr(obj, '_' + self.name)

    def __set__(self, obj, value):
        # Checked first: a refused value leaves the old one in place.
        setattr(obj, '_' + self.name, self.check(value))


class CheckedHyperparameter(CheckedAttribute):

    """An optimizer attribute kept in its hyperparameter, checked on set.

    Like :class:`chainer.optimizer.HyperparameterProxy`: the value lives in
    ``optimizer.hyperparam``, where the update rules read it, so that
    Chainer's trainer extensions (``ExponentialShift``, ``LinearShift``,
    :class:`~chainer_lars.WarmupPolynomialShift`, ...) can drive it with
    ``setattr``; but a bad value is refused with an error that names it.

    """

    def __set_name__(self, owner, name):
        super(CheckedHyperparameter, self).__set_name__(owner, name)
        self.__doc__ = 'Alias to ``self.hyperparam.{}``'.format(name)

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return getattr(obj.hyperparam, self.name)

    def __set__(self, obj, value):
        setattr(obj.hyperparam, self.name, self.check(value))


def find_check(obj, attr):
    """The check of ``obj``'s attribute ``attr``, or ``None``.

    Returns:
        callable or None: ``check(value)`` of the
        :class:`CheckedAttribute` that defines ``attr`` on ``obj``'s class,
        or ``None`` when the attribute is not a checked one.

    """
    descriptor = getattr(type(obj), attr, None)
    if isinstance(descriptor, CheckedAttribute):
        return descriptor.check
    return None
