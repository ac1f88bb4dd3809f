"""Argument checks, and the attribute descriptors that apply them: each check
takes the name to report and the value, and returns the value in canonical form
(``float``, ``bool`` or ``int``) or raises an error that names both, before
anything the user had is changed."""

import math
import numbers
import re

import numpy


def _describe(value):
    return '{!r} ({})'.format(value, type(value).__name__)


def _typed(name, value, types, what):
    """``value`` if one of ``types`` (a ``bool`` only where they name it),
    else the ``TypeError`` that ``name`` must be ``what``."""
    if not isinstance(value, types) or (
            isinstance(value, (bool, numpy.bool_)) and bool not in types):
        raise TypeError('{} must be {}, not {}'.format(
            name, what, _describe(value)))
    return value


def real(name, value, minimum=None, exclusive=False, maximum=None):
    """A finite real number (not a ``bool``) within the bounds given, as a
    ``float``; ``exclusive`` makes the minimum strict (the maximum is)."""
    _typed(name, value, (numbers.Real,), 'a real number')
    try:
        value = float(value)
    except OverflowError:  # an int past the floats
        value = math.inf if value > 0 else -math.inf
    if not math.isfinite(value):
        raise ValueError('{} must be finite, got {!r}'.format(name, value))
    for bound, strict, ok, words in (
            (minimum, exclusive, value.__gt__, ('greater than', 'at least')),
            (maximum, True, value.__lt__, ('less than', 'at most'))):
        if bound is not None and not (ok(bound) or not strict
                                      and value == bound):
            raise ValueError('{} must be {} {}, got {!r}'.format(
                name, words[0 if strict else 1], bound, value))
    return value


def boolean(name, value):
    """A ``bool`` or ``numpy.bool_``, as a ``bool``. Integers are refused:
    ``clip=1`` is more often a typo for a number than ``True``."""
    return bool(_typed(name, value, (bool, numpy.bool_), 'a bool'))


def count(name, value):
    """A non-negative integer (not a ``bool``), as an ``int``."""
    value = int(_typed(name, value, (numbers.Integral,), 'an int'))
    if value < 0:  # (an int: numpy 2 would print np.int64(-1))
        raise ValueError('{} must be at least 0, got {!r}'.format(name, value))
    return value


def string(name, value):
    return _typed(name, value, (str,), 'a str')


def optimizer(name, value):
    """An optimizer (with ``update()``, ChainerMN's too), not a class."""
    if isinstance(value, type) or not callable(getattr(value, 'update', 0)):
        what = ('the class {0}: make one, {0}(...)'.format(value.__name__)
                if isinstance(value, type) else _describe(value))
        raise TypeError('{} must be an optimizer (with an update() method), '
                        'not {}'.format(name, what))
    return value


def pattern(name, value):
    """One regular expression on ``str`` (plain or compiled), compiled; a
    ``bytes`` one could never match a parameter path."""
    if isinstance(value, re.Pattern):
        if not isinstance(value.pattern, str):
            raise TypeError('{} must be a regular expression on str, not the '
                            'compiled {} pattern {!r}'.format(
                                name, type(value.pattern).__name__, value))
        return value
    _typed(name, value, (str,), 'a regular expression (a str)')
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError('{} is not a valid regular expression: {!r}: '
                         '{}'.format(name, value, e)) from None


def patterns(name, values):
    """A list of :func:`pattern` s as a tuple; a single ``str`` or compiled
    pattern is a list of one, ``bytes`` is refused (not iterated)."""
    if values is None:
        return ()
    if isinstance(values, (str, re.Pattern)):
        values = (values,)
    try:
        if isinstance(values, (bytes, bytearray)):
            raise TypeError  # b'/b$' iterates as ints: the error would name 47
        items = tuple(values)
    except TypeError:
        raise TypeError('{} must be a list of regular expressions (str), '
                        'not {}'.format(name, _describe(values))) from None
    return tuple(pattern('{} item {}'.format(name, i), item)
                 for i, item in enumerate(items))


def addressed(path, weight, grad, states=(), written=('weight',),
              one_dtype=False, extra=None, names=('momentum buffer',),
              extra_name='float16 weight', gdtype=None):
    """Checks what one row reads and writes through addresses, as NumPy
    checks Chainer's in-place operations: each array of ``weight``'s shape,
    floating, writeable where ``written`` names it (``'weight'``,
    ``'gradient'``, the ``names`` of ``states``; ``extra``, what a mixed16
    row writes besides, always: its ``weight`` is a float32 master, as
    Chainer's fp32 update has it); with ``one_dtype`` (a GPU), of the
    weight's dtype (a gradient's ``gdtype``) and device. ``grad`` ``None``:
    the row's own arrays only. Errors name ``path``."""
    named = (() if grad is None else (('gradient', grad),)) + tuple(
        zip(names, states))
    if extra is not None:
        named += ((extra_name, extra),)
        written = tuple(written) + (extra_name,)
    for name, a in named:
        if a.shape != weight.shape:
            raise ValueError('{}: the {} has shape {} but the weight {}: '
                             'operands could not be broadcast together'
                             .format(path, name, a.shape, weight.shape))
    for name, a in (('weight', weight),) + named:
        if a.dtype.kind != 'f':  # as NumPy's casts of the results refuse it
            raise TypeError(
                'only floating-point arrays (float16, float32, float64) '
                'are updated; the {} of {} is {}'.format(name, path, a.dtype))
    if extra is not None and weight.dtype != numpy.float32:  # the master's
        raise TypeError('{}: the master copy is {}, not float32'.format(
            path, weight.dtype))  # grad, float32, is refused in Chainer's
    for name, a in named:
        like = gdtype if name == 'gradient' and gdtype is not None else (
            weight.dtype if name != extra_name else a.dtype)
        if one_dtype and a.dtype != like:
            raise TypeError('{}: the {} is {} but the weight {}'.format(
                path, name, a.dtype, like))  # (mixed16: the float16 one)
        if one_dtype and not isinstance(a, numpy.ndarray) and not isinstance(
                weight, numpy.ndarray) and a.device != weight.device:
            raise ValueError('{}: the {} is on {} but the weight on {}'.format(
                path, name, a.device, weight.device))
    for name, a in (('weight', weight),) + named:  # CuPy's: always writeable
        if name in written and not getattr(a.flags, 'writeable', True):
            raise ValueError('{}: the {} is read-only (output array is '
                             'read-only)'.format(path, name))


def direct(dtype, arrays):
    """Whether ``arrays`` go as they are: ``dtype``, native, C, aligned, no
    ``ndarray`` subclass (the CPU's stamps read plain ones only)."""
    return all(a.dtype == dtype and a.dtype.isnative and a.flags.c_contiguous
               and getattr(a.flags, 'aligned', True)
               and not isinstance(a, numpy.generic)  # a scalar: no address
               and numpy.ndarray not in type(a).__mro__[1:] for a in arrays)


class CheckedAttribute(object):

    """An attribute checked on set by ``check(name, value, **options)``."""

    def __init__(self, check=real, **options):
        self._check, self._options, self.name = check, options, None

    def __set_name__(self, owner, name):
        self.name = name

    def check(self, value, name=None):
        """``value`` as it would be stored, or an error naming ``name``."""
        return self._check(name or self.name, value, **self._options)

    def __set__(self, obj, value):
        obj.__dict__[self.name] = self.check(value)


class CheckedHyperparameter(CheckedAttribute):

    """An optimizer attribute kept in ``optimizer.hyperparam``, checked."""

    def __set_name__(self, owner, name):
        super(CheckedHyperparameter, self).__set_name__(owner, name)
        self.__doc__ = 'Alias to ``self.hyperparam.{}``'.format(name)

    def __get__(self, obj, cls=None):
        return self if obj is None else getattr(obj.hyperparam, self.name)

    def __set__(self, obj, value):
        setattr(obj.hyperparam, self.name, self.check(value))


def find_check(obj, attr):
    """``check(value)`` of checked ``attr`` of ``obj`` (or class), or None."""
    found = getattr(obj if isinstance(obj, type) else type(obj), attr, None)
    return found.check if isinstance(found, CheckedAttribute) else None


def unexpected(face, kwargs, hints):
    """Refuses unknown keyword arguments (``hints``: name -> instead)."""
    for name in sorted(kwargs):
        raise TypeError('{}() got an unexpected keyword argument {!r}{}'
                        .format(face, name, ': ' + hints[name]
                                if name in hints else ''))


def double_adaptation(face='LARS'):
    """Refuses GradientLARS on ``face`` (``'LARS'`` or ``'LAMB'``)."""
    raise TypeError(
        'GradientLARS on a chainer_lars.{0} optimizer would adapt the '
        'rates twice: use {0} alone{1}'.format(face, {
            'LAMB': ', or chainer.optimizers.Adam, with or without the hook',
            'LARS': " (its trust_coefficient is the hook's), or the hook on "
                    'chainer.optimizers.MomentumSGD'}[face]))
