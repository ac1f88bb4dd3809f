import re

import numpy
import pytest

from chainer import optimizer

from chainer_lars import checks


@pytest.mark.parametrize('value,expected', [
    (3, 3.0),
    (0.25, 0.25),
    (numpy.float32(0.5), 0.5),
    (numpy.int64(2), 2.0),
])
def test_real_accepts_real_numbers_and_returns_a_float(value, expected):
    got = checks.real('x', value)
    assert got == expected
    assert type(got) is float


@pytest.mark.parametrize('value,error,words', [
    (True, TypeError, r'^x must be a real number, not True \(bool\)$'),
    (numpy.bool_(False), TypeError, r'x must be a real number.*False'),
    ('0.1', TypeError, r"x must be a real number, not '0.1' \(str\)"),
    (None, TypeError, r'x must be a real number, not None \(NoneType\)'),
    (float('nan'), ValueError, r'^x must be finite, got nan$'),
    (float('-inf'), ValueError, r'^x must be finite, got -inf$'),
    (10 ** 400, ValueError, r'^x must be finite, got inf$'),
    (-10 ** 400, ValueError, r'^x must be finite, got -inf$'),
])
def test_real_refuses(value, error, words):
    with pytest.raises(error, match=words):
        checks.real('x', value)


def test_real_bounds():
    assert checks.real('x', 0.0, minimum=0.0) == 0.0
    with pytest.raises(ValueError, match=r'^x must be at least 0.0, got -1.0'):
        checks.real('x', -1.0, minimum=0.0)
    with pytest.raises(ValueError,
                       match=r'^x must be greater than 0.0, got 0.0$'):
        checks.real('x', 0.0, minimum=0.0, exclusive=True)
    assert checks.real('x', 1e-300, minimum=0.0, exclusive=True) == 1e-300
    with pytest.raises(ValueError, match=r'^x must be less than 1.0, got 1.0'):
        checks.real('x', 1.0, maximum=1.0)
    assert checks.real('x', 0.999, maximum=1.0) == 0.999


@pytest.mark.parametrize('value', [True, False, numpy.bool_(True),
                                   numpy.bool_(False)])
def test_boolean_accepts_bool_and_numpy_bool(value):
    got = checks.boolean('flag', value)
    assert got == bool(value)
    assert type(got) is bool


@pytest.mark.parametrize('value,words', [
    (1, r'^flag must be a bool, not 1 \(int\)$'),
    ('yes', r"^flag must be a bool, not 'yes' \(str\)$"),
    (None, r'^flag must be a bool, not None \(NoneType\)$'),
])
def test_boolean_refuses(value, words):
    with pytest.raises(TypeError, match=words):
        checks.boolean('flag', value)


def test_count():
    assert checks.count('n', 0) == 0
    got = checks.count('n', numpy.int64(7))
    assert got == 7 and type(got) is int
    for value in (-1, numpy.int64(-1)):  # numpy 2 printed np.int64(-1)
        with pytest.raises(ValueError,
                           match=r'^n must be at least 0, got -1$'):
            checks.count('n', value)
    with pytest.raises(TypeError, match=r'^n must be an int, not 1.5'):
        checks.count('n', 1.5)
    with pytest.raises(TypeError, match=r'^n must be an int, not True'):
        checks.count('n', True)


def test_string():
    assert checks.string('s', 'lr') == 'lr'
    with pytest.raises(TypeError, match=r'^s must be a str, not 3 \(int\)$'):
        checks.string('s', 3)


def test_pattern():
    assert checks.pattern('p', '/W$').search('/l1/W')
    compiled = re.compile('/b$')
    assert checks.pattern('p', compiled) is compiled
    with pytest.raises(ValueError,
                       match=r"^p is not a valid regular expression: '\('"):
        checks.pattern('p', '(')
    with pytest.raises(TypeError, match=r'^p must be a regular expression '
                                        r'\(a str\), not 3 \(int\)$'):
        checks.pattern('p', 3)


def test_patterns():
    assert checks.patterns('p', None) == ()
    assert checks.patterns('p', ()) == ()
    one = checks.patterns('p', '/b$')
    assert [c.pattern for c in one] == ['/b$']
    many = checks.patterns('p', (s for s in ['/b$', re.compile('gamma')]))
    assert [c.pattern for c in many] == ['/b$', 'gamma']
    with pytest.raises(ValueError, match=r"^p item 1 is not a valid regular "
                                         r"expression: '\['"):
        checks.patterns('p', ['ok', '['])
    with pytest.raises(TypeError, match=r'^p item 0 must be .*None'):
        checks.patterns('p', [None])
    with pytest.raises(TypeError,
                       match=r'^p must be a list of regular expressions.*3'):
        checks.patterns('p', 3)


class Holder(object):

    positive = checks.CheckedAttribute(checks.real, minimum=0.0,
                                       exclusive=True)
    flag = checks.CheckedAttribute(checks.boolean)

    def __init__(self):
        self.positive = 1
        self.flag = numpy.bool_(True)


def test_checked_attribute_stores_the_checked_value():
    holder = Holder()
    assert holder.positive == 1.0 and type(holder.positive) is float
    # Kept under its own name, where a reader greps it.
    assert vars(holder)['positive'] == 1.0
    assert holder.flag is True
    assert isinstance(Holder.positive, checks.CheckedAttribute)
    assert Holder.positive.name == 'positive'
    assert Holder.positive.check(2) == 2.0


def test_checked_attribute_refuses_and_keeps_the_old_value():
    holder = Holder()
    with pytest.raises(ValueError,
                       match=r'^positive must be greater than 0.0, got 0.0'):
        holder.positive = 0
    assert holder.positive == 1.0
    with pytest.raises(TypeError, match='^flag must be a bool'):
        holder.flag = 0
    assert holder.flag is True


class HyperparamHolder(object):

    lr = checks.CheckedHyperparameter(checks.real, minimum=0.0)

    def __init__(self):
        self.hyperparam = optimizer.Hyperparameter()
        self.lr = 0.5


def test_checked_hyperparameter_lives_in_the_hyperparameter():
    holder = HyperparamHolder()
    assert holder.hyperparam.lr == 0.5
    holder.hyperparam.lr = 0.25  # an update rule or a snapshot may set it
    assert holder.lr == 0.25
    with pytest.raises(ValueError, match='^lr must be at least 0.0'):
        holder.lr = -1
    assert holder.hyperparam.lr == 0.25
    assert HyperparamHolder.lr.__doc__ == 'Alias to ``self.hyperparam.lr``'


def test_find_check():
    holder = Holder()
    assert checks.find_check(holder, 'positive')(3) == 3.0
    assert checks.find_check(HyperparamHolder(), 'lr')(0) == 0.0
    assert checks.find_check(HyperparamHolder, 'lr')(0) == 0.0  # a class
    assert checks.find_check(holder, 'flag')(numpy.bool_(False)) is False
    # Not a checked attribute, or no attribute at all.
    assert checks.find_check(optimizer.Hyperparameter(), 'lr') is None
    assert checks.find_check(holder, 'missing') is None
