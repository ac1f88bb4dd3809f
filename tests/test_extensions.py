import math
import re
import warnings

import numpy
import pytest

import chainer
from chainer import optimizers
from chainer import serializers
from chainer import testing
from chainer import training
import chainer.links as L

import chainer_lars


def make_trainer(optimizer_factory, iterations, out, data_size=20,
                 batchsize=5, hooks=()):
    """A real trainer on a tiny linear classifier, stopped after iterations.

    ``data_size / batchsize`` iterations make one epoch; ``hooks`` are added
    to the optimizer in order. ``out`` is the trainer's folder, a test's
    temporary one: Chainer's default, ``result`` in the current folder,
    would be the user's (a LogReport writes its log there).
    """
    rng = numpy.random.RandomState(0)
    x = rng.randn(data_size, 3).astype(numpy.float32)
    t = rng.randint(0, 2, data_size).astype(numpy.int32)
    model = L.Classifier(L.Linear(3, 2, initialW=rng.randn(2, 3)))
    optimizer = optimizer_factory()
    optimizer.setup(model)
    for hook in hooks:
        optimizer.add_hook(hook)
    it = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), batchsize, shuffle=False)
    updater = training.updaters.StandardUpdater(it, optimizer)
    return training.Trainer(updater, (iterations, 'iteration'), out=str(out))


def record(trainer, attr='lr'):
    """Records the value of an optimizer attribute used by each update.

    The recorder runs before the schedule (a higher priority), so it sees
    the value the update it follows has just used.
    """
    values = []
    optimizer = trainer.updater.get_optimizer('main')

    @training.make_extension(trigger=(1, 'iteration'),
                             priority=training.PRIORITY_WRITER)
    def recorder(trainer):
        values.append(getattr(optimizer, attr))

    trainer.extend(recorder)
    return values


# -- WarmupPolynomialShift -------------------------------------------------

def test_schedule_values_by_hand():
    shift = chainer_lars.WarmupPolynomialShift(
        'lr', warmup_count=4, max_count=10, init=2.0)
    got = [shift.value(t) for t in range(12)]
    want = [0.5, 1.0, 1.5, 2.0,  # warm-up: 2 * (t + 1) / 4
            2.0, 2 * (5 / 6) ** 2, 2 * (4 / 6) ** 2, 2 * (3 / 6) ** 2,
            2 * (2 / 6) ** 2, 2 * (1 / 6) ** 2,
            0.0, 0.0]  # after max_count
    numpy.testing.assert_allclose(got, want, rtol=1e-15)


# The values each update uses, worked out by hand from the formula of
# WarmupPolynomialShift's docstring for a peak of 0.3; each list runs past
# max_count.
SCHEDULES = [
    # warm-up 3 of 6: 0.3 * (t + 1) / 3, then 0.3 * (1 - (t - 3) / 3) ** 2
    ((3, 6, 2.0, 0.0),
     [0.1, 0.2, 0.3, 0.3, 0.3 * 4 / 9, 0.3 / 9, 0.0, 0.0, 0.0]),
    # no warm-up: 0.3 * (1 - t / 4) ** 2
    ((0, 4, 2.0, 0.0), [0.3, 0.3 * 9 / 16, 0.3 / 4, 0.3 / 16, 0.0, 0.0]),
    # warm-up only
    ((4, 4, 2.0, 0.0), [0.075, 0.15, 0.225, 0.3, 0.0, 0.0]),
    # linear decay to 0.1: 0.1 + 0.2 * (1 - (t - 2) / 4)
    ((2, 6, 1.0, 0.1), [0.15, 0.3, 0.3, 0.25, 0.2, 0.15, 0.1, 0.1]),
    # square root: 0.1 + 0.2 * sqrt(1 - (t - 1) / 4)
    ((1, 5, 0.5, 0.1),
     [0.3, 0.3, 0.1 + 0.1 * math.sqrt(3), 0.1 + 0.1 * math.sqrt(2), 0.2,
      0.1, 0.1]),
]


@pytest.mark.parametrize('args,want', SCHEDULES)
def test_schedule_in_trainer(args, want, tmp_path):
    warmup, total, power, end = args
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=0.3),
                           iterations=len(want), out=tmp_path)
    trainer.extend(chainer_lars.WarmupPolynomialShift(
        'lr', warmup, total, power=power, end=end))
    used = record(trainer)
    trainer.run()
    numpy.testing.assert_allclose(used, want, rtol=1e-12)
    assert used[-1] == end


def test_schedule_any_attribute(tmp_path):
    trainer = make_trainer(lambda: optimizers.MomentumSGD(momentum=0.5),
                           iterations=6, out=tmp_path)
    trainer.extend(chainer_lars.WarmupPolynomialShift(
        'momentum', 2, 6, init=0.8))
    used = record(trainer, 'momentum')
    trainer.run()
    # 0.8 * (t + 1) / 2, then 0.8 * (1 - (t - 2) / 4) ** 2.
    want = [0.4, 0.8, 0.8, 0.45, 0.2, 0.05]
    numpy.testing.assert_allclose(used, want, rtol=1e-12)


def test_schedule_drives_lars_lr(tmp_path):
    trainer = make_trainer(lambda: chainer_lars.LARS(lr=5.0), iterations=8,
                           out=tmp_path)
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 3, 8))
    used = record(trainer)
    trainer.run()
    # 5 * (t + 1) / 3, then 5 * (1 - (t - 3) / 5) ** 2.
    want = [5 / 3, 10 / 3, 5.0, 5.0, 3.2, 1.8, 0.8, 0.2]
    numpy.testing.assert_allclose(used, want, rtol=1e-12)


def test_schedule_resumes_from_snapshot(tmp_path):
    def run(iterations, resume=None):
        trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=0.2),
                               iterations, out=tmp_path / 'out')
        trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 3, 10),
                       name='schedule')
        used = record(trainer)
        if resume is not None:
            serializers.load_npz(resume, trainer)
        trainer.run()
        return trainer, used

    _, uninterrupted = run(10)
    first, head = run(4)
    serializers.save_npz(str(tmp_path / 'snapshot'), first)
    # A trainer built with another initial lr: the snapshot's peak wins.
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=99.0), 10,
                           out=tmp_path / 'out')
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 3, 10),
                   name='schedule')
    tail = record(trainer)
    serializers.load_npz(str(tmp_path / 'snapshot'), trainer)
    trainer.run()
    assert head + tail == uninterrupted


def _schedule_snapshot(tmp_path, **kwargs):
    """A snapshot of a trainer after 4 of 10 iterations under a schedule
    of ``kwargs`` (``warmup_count=3, max_count=10`` by default)."""
    kwargs = dict({'warmup_count': 3, 'max_count': 10}, **kwargs)
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=0.2), 4,
                           out=tmp_path / 'first')
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', **kwargs),
                   name='schedule')
    trainer.run()
    path = str(tmp_path / 'snapshot.npz')
    serializers.save_npz(path, trainer)
    return path


@pytest.mark.parametrize('changed, words', [
    # -e 3 instead of 2: the rate, decayed to about 0, would come back.
    ({'max_count': 15}, 'max_count=10, this schedule has max_count=15'),
    ({'warmup_count': 2}, 'warmup_count=3, this schedule has warmup_count=2'),
    ({'power': 1.0}, 'power=2.0, this schedule has power=1.0'),
    ({'end': 0.01}, 'end=0.0, this schedule has end=0.01'),
    ({'init': 0.3}, 'init=0.2, this schedule has init=0.3'),
])
def test_schedule_refuses_a_snapshot_of_another_schedule(
        tmp_path, changed, words):
    path = _schedule_snapshot(tmp_path, init=0.2)
    kwargs = dict({'warmup_count': 3, 'max_count': 10, 'init': 0.2},
                  **changed)
    shift = chainer_lars.WarmupPolynomialShift('lr', **kwargs)
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=0.2), 10,
                           out=tmp_path / 'out')
    trainer.extend(shift, name='schedule')
    with pytest.raises(ValueError, match=re.escape(words)):
        serializers.load_npz(path, trainer)
    assert shift._t == 0  # nothing of the snapshot loaded into it


def test_schedule_loads_a_snapshot_of_version_0_2_0(tmp_path):
    # Version 0.2.0 saved the count and the peak only.
    path = _schedule_snapshot(tmp_path)
    with numpy.load(path) as npz:
        entries = dict(npz)
    prefix = 'extensions/schedule/'
    old = {key: value for key, value in entries.items()
           if not key.startswith(prefix)
           or key[len(prefix):] in ('_t', '_init')}
    assert len(entries) - len(old) == 5
    numpy.savez(path, **old)
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=99.0), 10,
                           out=tmp_path / 'out')
    shift = chainer_lars.WarmupPolynomialShift('lr', 3, 10, power=1.0)
    trainer.extend(shift, name='schedule')
    serializers.load_npz(path, trainer)
    assert (shift._t, shift._init) == (4, 0.2)


def test_schedule_loads_a_snapshot_without_its_attribute(tmp_path):
    # 0.3.0.dev0 saved the shape, not the attribute: still checked.
    path = _schedule_snapshot(tmp_path)
    with numpy.load(path) as npz:
        entries = dict(npz)
    assert bytes(entries.pop('extensions/schedule/attr')) == b'lr'
    numpy.savez(path, **entries)
    for max_count, error in ((10, None), (15, 'max_count=10')):
        trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=99.0), 10,
                               out=tmp_path / 'out')
        shift = chainer_lars.WarmupPolynomialShift('lr', 3, max_count)
        trainer.extend(shift, name='schedule')
        if error is None:
            serializers.load_npz(path, trainer)
            assert (shift._t, shift._init) == (4, 0.2)
        else:
            with pytest.raises(ValueError, match=error):
                serializers.load_npz(path, trainer)


@pytest.mark.parametrize('warmups', [{}, {'lr': 2, 'weight_decay': 0}])
def test_schedules_registered_in_another_order_are_refused(tmp_path,
                                                           warmups):
    # Chainer names them WarmupPolynomialShift and WarmupPolynomialShift_1
    # in the order registered: swapped, each would load the other's peak.
    # The order is named even where the swapped schedules differ too.
    def trainer(attrs):
        trainer = make_trainer(
            lambda: chainer_lars.LARS(lr=2.0, weight_decay=1e-4), 4,
            out=tmp_path / '-'.join(attrs))
        for attr in attrs:
            trainer.extend(chainer_lars.WarmupPolynomialShift(
                attr, warmups.get(attr, 2), 8))
        return trainer
    first = trainer(['lr', 'weight_decay'])
    first.run()
    path = str(tmp_path / 'snapshot.npz')
    serializers.save_npz(path, first)
    with pytest.raises(ValueError, match=re.escape(
            "written with attr='lr', this schedule has attr='weight_decay'; "
            "Chainer finds an extension's part by its name: register the "
            'schedules in the order of that run, or name them')):
        serializers.load_npz(path, trainer(['weight_decay', 'lr']))
    serializers.load_npz(path, trainer(['lr', 'weight_decay']))


@pytest.mark.parametrize('state', [False, True])
def test_schedule_resumes_exactly_with_autoload(tmp_path, state):
    # snapshot(autoload=True) loads after the schedule's initialize() has
    # set the rate of t=0: the first update must still use the snapshot's.
    def run(iterations, out):
        trainer = make_trainer(lambda: chainer_lars.LARS(lr=2.0), iterations,
                               out=out)
        optimizer = trainer.updater.get_optimizer('main')
        trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 4, 8))
        if state:
            optimizer.loss_scaling(scale=4.0)
            lss = chainer_lars.LossScaleState(optimizer)
            trainer.extend(lss)
        trainer.extend(training.extensions.snapshot(autoload=True),
                       trigger=(1, 'iteration'))
        used, scales = record(trainer), []
        trainer.extend(lambda _: scales.append(lss.last_loss_scale)
                       if state else None, trigger=(1, 'iteration'),
                       priority=training.PRIORITY_WRITER - 1)
        trainer.run()
        return used, scales, [p.array.copy() for p in
                              trainer.updater.get_optimizer('main')
                              .target.params()]

    whole = run(8, tmp_path / 'whole')
    head = run(3, tmp_path / 'cut')
    tail = run(8, tmp_path / 'cut')
    assert head[0] + tail[0] == whole[0]
    assert head[1] + tail[1] == whole[1]
    for a, b in zip(tail[2], whole[2]):
        assert (a == b).all()


@pytest.mark.parametrize('autoload', [False, True])
def test_schedule_with_a_finished_trigger_resumes_with_autoload(tmp_path,
                                                                autoload):
    # As the docs say: Chainer does not start an extension whose trigger
    # has finished (ManualScheduleTrigger past its last point), so after
    # load_npz nothing sets the rate again; autoload loads it after the
    # schedule has started.
    def run(iterations, out, load=False):
        trainer = make_trainer(lambda: chainer_lars.LARS(lr=1.0), iterations,
                               out=out)
        trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 1, 3),
                       trigger=training.triggers.ManualScheduleTrigger(
                           [2, 4, 6], 'iteration'))
        trainer.extend(training.extensions.snapshot(
            filename='snapshot', autoload=autoload), trigger=(6, 'iteration'))
        used = record(trainer)
        if load:
            serializers.load_npz(str(out / 'snapshot'), trainer)
        trainer.run()
        return used

    whole = run(10, tmp_path / 'whole')
    assert whole == [1.0] * 4 + [0.25] * 2 + [0.0] * 4
    head = run(6, tmp_path / 'cut')
    tail = run(10, tmp_path / 'cut', load=not autoload)
    assert (head + tail == whole) is autoload


@pytest.mark.parametrize('names', [None, ('gen_alpha', 'dis_alpha')])
def test_schedules_of_two_optimizers_need_names_to_change_order(tmp_path,
                                                                names):
    # As the docs say: two schedules of one attribute and the same settings
    # (a GAN's, each peak read from its optimizer) registered in another
    # order load each other's peak; named, they load their own.
    def trainer(order, out):
        trainer = make_trainer(lambda: optimizers.Adam(alpha=2e-4), 4,
                               out=out)
        second = optimizers.Adam(alpha=1e-4).setup(L.Linear(2, 2))
        shifts = [chainer_lars.WarmupPolynomialShift(
            'alpha', 2, 8, optimizer=o) for o in (
                trainer.updater.get_optimizer('main'), second)]
        for k in order:
            trainer.extend(shifts[k], name=names and names[k])
        return trainer, shifts

    first, _ = trainer([0, 1], tmp_path / 'first')
    first.run()
    path = str(tmp_path / 'snapshot.npz')
    serializers.save_npz(path, first)
    again, shifts = trainer([1, 0], tmp_path / 'again')
    serializers.load_npz(path, again)
    peaks = [shift._init for shift in shifts]
    assert peaks == ([2e-4, 1e-4] if names else [1e-4, 2e-4])


class _MultiNode(object):

    """What ChainerMN's multi-node optimizer is to the extensions: an
    ``actual_optimizer`` in its ``__dict__``, attributes forwarded."""

    def __init__(self, actual):
        super(_MultiNode, self).__setattr__('actual_optimizer', actual)

    def __getattr__(self, name):
        return getattr(self.actual_optimizer, name)

    def __setattr__(self, name, value):
        setattr(self.actual_optimizer, name, value)

    def update(self, *args, **kwargs):
        self.actual_optimizer.update(*args, **kwargs)


@pytest.mark.parametrize('kwargs, words', [
    ({'attr': 'momentum', 'init': 1.5},
     "^init=1.5 is not a valid value of the optimizer's momentum"),
    ({'attr': 'trust_coefficient', 'init': 1e-3},
     "^end=0.0 is not a valid value of the optimizer's trust_coefficient"),
])
def test_schedule_checks_the_values_under_chainermn(kwargs, words):
    optimizer = _MultiNode(chainer_lars.LARS())
    with pytest.raises(ValueError, match=words):
        chainer_lars.WarmupPolynomialShift(
            warmup_count=2, max_count=5, optimizer=optimizer, **kwargs)
    chainer_lars.WarmupPolynomialShift('momentum', 2, 5, init=0.9,
                                       optimizer=optimizer)


@pytest.mark.parametrize('make', [
    lambda o: chainer_lars.WarmupPolynomialShift('lr', 2, 6, init=0.5,
                                                 optimizer=o),
    chainer_lars.LossScaleState,
])
@pytest.mark.parametrize('cls', [chainer_lars.LARS, optimizers.MomentumSGD])
def test_an_optimizer_class_is_refused(make, cls):
    # Without the parentheses: the class's lr descriptor was overwritten.
    before = dict(vars(cls))
    with pytest.raises(TypeError, match=(
            r'^optimizer must be an optimizer \(with an update\(\) '
            r'method\), not the class {0}: make one, {0}\(\.\.\.\)$'.format(
                cls.__name__))):
        make(cls)
    assert dict(vars(cls)) == before
    assert cls(lr=0.25).lr == 0.25


@pytest.mark.parametrize('attr', ['update', 'target', 'hyperparam'])
def test_schedule_of_a_method_or_object_is_refused(tmp_path, attr):
    optimizer = chainer_lars.LARS()
    message = "^the optimizer's {} must be a real number".format(attr)
    with pytest.raises(TypeError, match=message):
        chainer_lars.WarmupPolynomialShift(attr, 1, 3, init=0.5,
                                           optimizer=optimizer)
    assert re.match(message, run_refused(tmp_path, optimizer, attr,
                                         error=TypeError, init=0.5))
    assert callable(optimizer.update)


@pytest.mark.parametrize('kwargs,error,words', [
    ({'warmup_count': -1, 'max_count': 3}, ValueError,
     'warmup_count must be at least 0, got -1'),
    ({'warmup_count': 1.5, 'max_count': 3}, TypeError,
     'warmup_count must be an int, not 1.5 (float)'),
    ({'warmup_count': 4, 'max_count': 3}, ValueError,
     'max_count must be at least 1 and warmup_count (4), got 3'),
    # A run at end (0 for a rate) from its first update.
    ({'warmup_count': 0, 'max_count': 0}, ValueError,
     'max_count must be at least 1 and warmup_count (0), got 0'),
    ({'warmup_count': 1, 'max_count': 3, 'power': 0}, ValueError,
     'power must be greater than 0.0, got 0.0'),
    ({'warmup_count': 1, 'max_count': 3, 'init': float('nan')}, ValueError,
     'init must be finite, got nan'),
])
def test_schedule_arguments_checked(kwargs, error, words):
    with pytest.raises(error, match='^' + re.escape(words) + '$'):
        chainer_lars.WarmupPolynomialShift('lr', **kwargs)


@pytest.mark.parametrize('kwargs,error,words', [
    ({'attr': None}, TypeError, r'^attr must be a str, not None'),
    ({'optimizer': 'main'}, TypeError,
     r"^optimizer must be an optimizer .*not 'main' \(str\)$"),
    ({'optimizer': chainer_lars.GradientLARS()}, TypeError,
     '^optimizer must be an optimizer'),
    ({'attr': 'lrr', 'optimizer': optimizers.MomentumSGD()}, ValueError,
     r"^attr 'lrr': the optimizer \(MomentumSGD\) has no attribute"),
    ({'end': -0.01, 'init': 0.1}, ValueError,
     r'^end must not be negative when init is non-negative \(0.1\).*'
     r'end=-0.01$'),
    ({'end': -0.01, 'init': 0.0}, ValueError, '^end must not be negative'),
    ({'end': 0.5, 'init': -0.5}, ValueError,
     r'^end must not be positive when init is negative \(-0.5\)'),
    ({'attr': 'momentum', 'init': 0.9, 'end': 1.0,
      'optimizer': chainer_lars.LARS()}, ValueError,
     "^end=1.0 is not a valid value of the optimizer's momentum: "
     'momentum must be less than 1.0'),
    ({'attr': 'momentum', 'init': 1.5,
      'optimizer': chainer_lars.LARS()}, ValueError,
     "^init=1.5 is not a valid value of the optimizer's momentum"),
    ({'attr': 't'}, ValueError,
     "^attr 't': the optimizer's own count, not a hyperparameter such as "
     "'lr'$"),
    ({'attr': 'epoch'}, ValueError, "^attr 'epoch': the optimizer's own"),
])
def test_schedule_refused_at_construction(kwargs, error, words):
    kwargs = dict({'attr': 'lr', 'warmup_count': 2, 'max_count': 5},
                  **kwargs)
    optimizer = kwargs.get('optimizer')
    before = dict(getattr(optimizer, '__dict__', {}))
    with pytest.raises(error, match=words):
        chainer_lars.WarmupPolynomialShift(**kwargs)
    assert getattr(optimizer, '__dict__', {}) == before


@pytest.mark.parametrize('t, error, words', [
    (-3, ValueError, '^t must be at least 0, got -3$'),
    (1.5, TypeError, r'^t must be an int, not 1.5 \(float\)$'),
    (True, TypeError, '^t must be an int'),
])
def test_schedule_value_checks_t(t, error, words):
    shift = chainer_lars.WarmupPolynomialShift('lr', 2, 5, init=0.5)
    with pytest.raises(error, match=words):
        shift.value(t)
    assert shift.value(numpy.int64(1)) == 0.5


def test_schedule_value_without_a_peak_says_when_it_is_read():
    # init=None: the peak is the optimizer's value when training starts.
    shift = chainer_lars.WarmupPolynomialShift('lr', 2, 5)
    with pytest.raises(TypeError, match=re.escape(
            'the peak (init=None: read when training starts) must be a '
            'real number, not None (NoneType)')):
        shift.value(0)


def test_schedule_called_before_it_starts_counts_nothing(tmp_path):
    trainer = make_trainer(lambda: optimizers.SGD(lr=0.5), 1, tmp_path)
    schedule = chainer_lars.WarmupPolynomialShift('lr', 2, 4)
    with pytest.raises(TypeError, match=re.escape(
            'the peak (init=None: read when training starts) must be')):
        schedule(trainer)  # before initialize(): no peak yet
    schedule.initialize(trainer)
    optimizer = trainer.updater.get_optimizer('main')
    assert optimizer.lr == schedule.value(0) == 0.25
    schedule(trainer)
    assert optimizer.lr == schedule.value(1) == 0.5


def test_schedule_called_by_hand_checks_its_attribute_first(tmp_path):
    """With init given and no optimizer, before initialize(): a misspelt
    attribute made a new one, unchecked, and counted the call."""
    trainer = make_trainer(lambda: optimizers.SGD(lr=0.5), 1, tmp_path)
    optimizer = trainer.updater.get_optimizer('main')
    schedule = chainer_lars.WarmupPolynomialShift('lrr', 2, 4, init=1.0)
    with pytest.raises(ValueError, match="attr 'lrr': the optimizer"):
        schedule(trainer)
    assert not hasattr(optimizer, 'lrr') and optimizer.lr == 0.5
    schedule = chainer_lars.WarmupPolynomialShift('lr', 2, 4, init=-1.0)
    lars = make_trainer(lambda: chainer_lars.LARS(lr=0.5), 1, tmp_path / 'b')
    with pytest.raises(ValueError, match='init=-1.0 is not a valid value'):
        schedule(lars)
    assert lars.updater.get_optimizer('main').lr == 0.5
    schedule = chainer_lars.WarmupPolynomialShift('lr', 2, 4, init=1.0)
    schedule(trainer)  # as a started one: its first call
    assert optimizer.lr == schedule.value(1) == 1.0


def test_schedule_may_keep_a_negative_sign():
    shift = chainer_lars.WarmupPolynomialShift('x', 0, 2, init=-0.5)
    assert [shift.value(t) for t in range(3)] == [-0.5, -0.125, 0.0]


def run_refused(out, optimizer, attr, error=ValueError, **kwargs):
    """Runs a trainer whose schedule is refused when training starts."""
    trainer = make_trainer(lambda: optimizer, iterations=3, out=out)
    trainer.extend(chainer_lars.WarmupPolynomialShift(attr, 1, 3, **kwargs))
    before = dict(vars(optimizer.hyperparam))
    with pytest.raises(error) as info:
        trainer.run(show_loop_exception_msg=False)
    # Refused before anything was set or updated.
    assert optimizer.t == 0
    assert dict(vars(optimizer.hyperparam)) == before
    return str(info.value)


def test_schedule_of_a_missing_attribute_is_refused_at_start(tmp_path):
    # 'lrr' used to be created on the optimizer, leaving lr alone.
    optimizer = optimizers.MomentumSGD(lr=0.1)
    message = run_refused(tmp_path, optimizer, 'lrr', init=0.1)
    assert message.startswith("attr 'lrr': the optimizer (MomentumSGD) has "
                              'no attribute')
    assert not hasattr(optimizer, 'lrr')


ADAM_LR = (r"^attr 'lr': the optimizer's \(Adam\) lr is read only: "
           r"Adam's learning rate is 'alpha' .*schedule 'alpha' instead$")


def test_schedule_of_adams_lr_names_alpha(tmp_path):
    """Adam's lr is a read-only property; before the first update reading
    it raises RuntimeError (which used to escape the check)."""
    optimizer = optimizers.Adam()
    optimizer.setup(chainer.links.Linear(2, 2))
    with pytest.raises(ValueError, match=ADAM_LR):
        chainer_lars.WarmupPolynomialShift('lr', 1, 3, optimizer=optimizer)
    assert re.match(ADAM_LR, run_refused(tmp_path, optimizers.Adam(),
                                         'lr', init=1e-3))
    # The advice works.
    chainer_lars.WarmupPolynomialShift('alpha', 1, 3, optimizer=optimizer)


def test_schedule_to_a_negative_end_is_refused_at_start(tmp_path):
    message = run_refused(tmp_path, optimizers.MomentumSGD(lr=0.1), 'lr',
                          end=-1e-3)
    assert message.startswith(
        'end must not be negative when init is non-negative (0.1)')


def test_schedule_outside_a_checked_attribute_is_refused_at_start(tmp_path):
    # The trust coefficient of LARS must stay positive: a decay to the
    # default end of 0 would fail only at the last iteration.
    message = run_refused(tmp_path, chainer_lars.LARS(),
                          'trust_coefficient')
    assert message.startswith(
        "end=0.0 is not a valid value of the optimizer's trust_coefficient")


def test_schedule_of_a_non_number_is_refused_at_start(tmp_path):
    optimizer = optimizers.MomentumSGD()
    optimizer.tag = 'sgd'
    message = run_refused(tmp_path, optimizer, 'tag', error=TypeError)
    assert message.startswith("the optimizer's tag (read for init=None) "
                              "must be a real number, not 'sgd' (str)")


@pytest.mark.parametrize('other, name', [
    (lambda: chainer_lars.WarmupPolynomialShift('lr', 2, 4),
     'WarmupPolynomialShift_1'),
    (lambda: training.extensions.ExponentialShift('lr', 0.5),
     'ExponentialShift'),
    (lambda: training.extensions.WarmupShift('lr', 0.0, 2, 0.1),
     'WarmupShift'),
    (lambda: training.extensions.MultistepShift('lr', 0.1, [2], 0.1),
     'MultistepShift'),
])
def test_a_second_shift_of_the_attribute_is_refused_at_start(
        tmp_path, other, name):
    """Each would set the rate from its own count at every call: the run
    followed whichever came last. Refused before either changed it."""
    optimizer = optimizers.MomentumSGD(lr=0.1)
    trainer = make_trainer(lambda: optimizer, iterations=3, out=tmp_path)
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 1, 3))
    trainer.extend(other())
    with pytest.raises(ValueError, match=re.escape(
            "WarmupPolynomialShift: the extension '{}' sets the optimizer's "
            "lr too: each would overwrite the other's value at every call; "
            'keep one schedule'.format(name))):
        trainer.run(show_loop_exception_msg=False)
    assert optimizer.t == 0 and optimizer.lr == 0.1


@pytest.mark.parametrize('first, second', [('wrapper', 'main'),
                                           ('main', 'wrapper'),
                                           ('wrapper', 'actual')])
def test_a_second_shift_through_chainermns_wrapper_is_refused(
        tmp_path, first, second):
    """ChainerMN's optimizer forwards its attributes to the one it wraps:
    a schedule given the wrapper and another given the wrapped optimizer
    (or the updater's) set the same rate."""
    optimizer = optimizers.MomentumSGD(lr=0.1)
    trainer = make_trainer(lambda: optimizer, iterations=3, out=tmp_path)
    given = dict(wrapper=_MultiNode(optimizer), main=None, actual=optimizer)
    trainer.extend(chainer_lars.WarmupPolynomialShift(
        'lr', 1, 3, optimizer=given[first]))
    trainer.extend(training.extensions.ExponentialShift(
        'lr', 0.5, optimizer=given[second]))
    with pytest.raises(ValueError, match=re.escape(
            "the extension 'ExponentialShift' sets the optimizer's lr too")):
        trainer.run(show_loop_exception_msg=False)
    assert optimizer.t == 0 and optimizer.lr == 0.1


def test_an_extension_that_only_names_the_attribute_runs_beside(tmp_path):
    """Chainer's shifts hold ``_attr`` and ``_optimizer``; an extension
    with an ``_attr`` alone (a user's that reports it) sets nothing."""
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=0.1), 2,
                           out=tmp_path)
    reporter = training.make_extension(trigger=(1, 'iteration'))(
        lambda trainer: None)
    reporter._attr = 'lr'
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 1, 2))
    trainer.extend(reporter, name='reporter')
    trainer.run()
    assert trainer.updater.get_optimizer('main').lr == 0.0


def test_shifts_of_other_attributes_or_optimizers_run_together(tmp_path):
    trainer = make_trainer(lambda: optimizers.MomentumSGD(lr=0.1), 4,
                           out=tmp_path)
    other = optimizers.MomentumSGD(lr=0.1).setup(L.Linear(2, 2))
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 2, 4))
    trainer.extend(training.extensions.ExponentialShift('momentum', 0.5))
    trainer.extend(chainer_lars.WarmupPolynomialShift('lr', 2, 4,
                                                      optimizer=other))
    values = record(trainer)
    trainer.run()
    assert values == [0.05, 0.1, 0.1, 0.025]
    assert trainer.updater.get_optimizer('main').momentum == 0.9 * 0.5 ** 4
    assert other.lr == 0.0  # its own four calls


# -- TrustRatioObserver ----------------------------------------------------

class FakeSource(object):

    def __init__(self, values):
        self.values = values
        self.calls = 0

    def observe(self):
        self.calls += 1
        return self.values


def observe_once(observer, trainer=None):
    observation = {}
    reporter = chainer.Reporter()
    with reporter.scope(observation):
        observer(trainer)
    return observation


def test_observer_reports_each_quantity():
    source = FakeSource({'/l1/W': (0.5, 2.0, 3.0), '/l1/b': (1.0, 0.0, 0.1)})
    observation = observe_once(chainer_lars.TrustRatioObserver(source))
    assert observation == {
        'lars/ratio/l1/W': 0.5, 'lars/w_norm/l1/W': 2.0,
        'lars/g_norm/l1/W': 3.0, 'lars/ratio/l1/b': 1.0,
        'lars/w_norm/l1/b': 0.0, 'lars/g_norm/l1/b': 0.1}


def test_observer_prefix_pattern_and_key():
    source = FakeSource({'/l1/W': (0.5, 2.0, 3.0), '/l1/b': (1.0, 0.0, 0.1)})
    observer = chainer_lars.TrustRatioObserver(source, prefix='x',
                                               pattern='/W$')
    assert observe_once(observer) == {
        'x/ratio/l1/W': 0.5, 'x/w_norm/l1/W': 2.0, 'x/g_norm/l1/W': 3.0}
    assert observer.key('g_norm', '/l1/W') == 'x/g_norm/l1/W'
    with pytest.raises(ValueError, match="^quantity must be one of "
                       r"\('ratio', 'w_norm', 'g_norm'\), got 'lr'$"):
        observer.key('lr', '/l1/W')
    # A path as namedparams() gives it, not glued to the quantity's name.
    for path in ('l1/W', ''):
        with pytest.raises(ValueError, match=r"^path must be a parameter's "
                           r"path, starting with '/' \(e.g. '/l1/W'\), got "
                           + re.escape(repr(path)) + '$'):
            observer.key('ratio', path)
    for path in (None, b'/l1/W'):
        with pytest.raises(TypeError, match='^path must be a str, not '):
            observer.key('ratio', path)


def test_observer_without_a_prefix():
    # The names start with the quantity (they started with '/').
    source = FakeSource({'/l1/W': (0.5, 2.0, 3.0)})
    observer = chainer_lars.TrustRatioObserver(source, prefix='')
    assert observe_once(observer) == {
        'ratio/l1/W': 0.5, 'w_norm/l1/W': 2.0, 'g_norm/l1/W': 3.0}
    assert observer.key('ratio', '/l1/W') == 'ratio/l1/W'


@pytest.mark.parametrize('kwargs,error,words', [
    ({'pattern': '('}, ValueError,
     r"^pattern is not a valid regular expression: '\('"),
    ({'pattern': 3}, TypeError, r'^pattern must be .*not 3 \(int\)$'),
    # A bytes pattern could never search a str path.
    ({'pattern': b'/W$'}, TypeError, r"^pattern must be .*b'/W\$' \(bytes"),
    ({'pattern': re.compile(b'/W$')}, TypeError,
     '^pattern must be .*compiled bytes pattern'),
    ({'prefix': None}, TypeError, r'^prefix must be a str, not None'),
])
def test_observer_arguments_checked(kwargs, error, words):
    with pytest.raises(error, match=words):
        chainer_lars.TrustRatioObserver(FakeSource({}), **kwargs)


def test_observer_warns_once_of_a_pattern_that_matches_no_path():
    # A typo ('/w$' for '/W$') reported nothing, without a word.
    source = FakeSource({'/l1/W': (0.5, 2.0, 3.0), '/l1/b': (1.0, 0.0, 0.1),
                         '/l2/W': (0.4, 1.0, 2.0), '/l2/b': (1.0, 0.0, 0.1)})
    observer = chainer_lars.TrustRatioObserver(source, pattern='/w$')
    with pytest.warns(UserWarning, match=re.escape(
            "TrustRatioObserver: the pattern '/w$' matches none of the paths "
            'observed (/l1/W, /l1/b, /l2/W, ...): nothing reported')) as w:
        assert observe_once(observer) == {}
    assert len(w) == 1
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert observe_once(observer) == {}  # once
        source.values = {'/l1/W': (0.5, 2.0, 3.0)}
        with pytest.warns(UserWarning, match=re.escape('observed (/l1/W):')):
            observe_once(chainer_lars.TrustRatioObserver(source, pattern='b'))
        source.values = {}  # nothing observed (a skipped update): no word
        assert observe_once(chainer_lars.TrustRatioObserver(
            source, pattern='/w$')) == {}


def test_observer_takes_a_compiled_pattern():
    source = FakeSource({'/l1/W': (0.5, 2.0, 3.0), '/l1/b': (1.0, 0.0, 0.1)})
    observer = chainer_lars.TrustRatioObserver(source,
                                               pattern=re.compile('/b$'))
    assert sorted(observe_once(observer)) == [
        'lars/g_norm/l1/b', 'lars/ratio/l1/b', 'lars/w_norm/l1/b']


def test_observer_checks_source(tmp_path):
    with pytest.raises(TypeError, match=re.escape(
            'source must be a chainer_lars.LARS, LAMB or GradientLARS '
            'instance (anything with an observe() method), got <object')):
        chainer_lars.TrustRatioObserver(object())
    trainer = make_trainer(lambda: optimizers.MomentumSGD(), 1, out=tmp_path)
    trainer.extend(chainer_lars.TrustRatioObserver(), trigger=(1, 'iteration'))
    with pytest.raises(TypeError, match='GradientLARS'):
        trainer.run(show_loop_exception_msg=False)


@pytest.mark.parametrize('source', [chainer_lars.GradientLARS,
                                    chainer_lars.LARS, chainer_lars.LAMB,
                                    optimizers.SGD()])
def test_observer_refuses_a_source_it_cannot_read(source):
    with pytest.raises(TypeError, match='^source must be a chainer_lars.LARS'
                       ', LAMB or GradientLARS instance'):
        chainer_lars.TrustRatioObserver(source)


@pytest.mark.parametrize('hooked', [False, True])
def test_observer_checks_the_main_optimizer_before_the_first_update(
        hooked, tmp_path):
    hooks = [chainer_lars.GradientLARS()] if hooked else []
    trainer = make_trainer(lambda: optimizers.MomentumSGD(), 3, out=tmp_path,
                           hooks=hooks)
    trainer.extend(chainer_lars.TrustRatioObserver())  # once per epoch
    with pytest.raises(TypeError, match=(
            r'^TrustRatioObserver: the main optimizer \(MomentumSGD\) has '
            r'no observe\(\); pass .*TrustRatioObserver\(hook\)')):
        trainer.run(show_loop_exception_msg=False)
    assert trainer.updater.get_optimizer('main').t == 0


def test_observer_observes_only_at_its_interval(tmp_path):
    source = FakeSource({'/l1/W': (0.5, 2.0, 3.0)})
    trainer = make_trainer(lambda: optimizers.MomentumSGD(), 12, out=tmp_path)
    trainer.extend(chainer_lars.TrustRatioObserver(source),
                   trigger=(4, 'iteration'))
    trainer.run()
    assert source.calls == 3


def hand_ratio(w, g, wd, eta, eps=0.0, threshold=0.0):
    w_norm = numpy.linalg.norm(w.astype(numpy.float64))
    g_norm = numpy.linalg.norm(g.astype(numpy.float64))
    if w_norm > threshold and g_norm > 0:
        return eta * w_norm / (eps + g_norm + wd * w_norm), w_norm, g_norm
    return 1.0, w_norm, g_norm


class GradCapture(object):

    """Keeps copies of each weight and gradient as an update sees them."""

    name = 'GradCapture'
    call_for_each_param = True
    timing = 'pre'

    def __init__(self):
        self.arrays = {}

    def __call__(self, rule, param):
        self.arrays[param.name] = (param.array.copy(), param.grad.copy())


def check_observer_in_trainer(out, optimizer, hook, source, wd, eta, eps,
                              threshold, excluded):
    capture = GradCapture()
    # The capture runs first, so it sees the gradient before the hook.
    hooks = [capture] + ([hook] if hook is not None else [])
    trainer = make_trainer(lambda: optimizer, iterations=3, out=out,
                           hooks=hooks)
    trainer.extend(chainer_lars.TrustRatioObserver(source),
                   trigger=(1, 'iteration'))
    trainer.extend(training.extensions.LogReport(
        trigger=(1, 'iteration'), filename=None))
    trainer.run()
    log = trainer.get_extension('LogReport').log
    assert len(log) == 3
    # The capture holds the arrays of the last (3rd) update.
    for name in ('W', 'b'):
        w, g = capture.arrays[name]
        want = hand_ratio(w, g, wd, eta, eps, threshold)
        if name in excluded:
            want = (1.0,) + want[1:]
        keys = ['lars/{}/predictor/{}'.format(quantity, name)
                for quantity in ('ratio', 'w_norm', 'g_norm')]
        if isinstance(optimizer, chainer_lars.LARS) and name in excluded:
            # LARS reports only the arrays it adapts.
            assert not set(keys) & set(log[-1])
            continue
        for key, value in zip(keys, want):
            testing.assert_allclose(log[-1][key], value, rtol=1e-5)


def test_observer_with_lars_optimizer(tmp_path):
    optimizer = chainer_lars.LARS(lr=0.5, weight_decay=1e-2,
                                  trust_coefficient=0.1)
    check_observer_in_trainer(tmp_path, optimizer, None, optimizer, wd=1e-2,
                              eta=0.1, eps=0.0, threshold=0.0, excluded=())


def test_observer_with_lars_optimizer_as_default_source(tmp_path):
    optimizer = chainer_lars.LARS(
        lr=0.5, weight_decay=1e-2, trust_coefficient=0.1,
        exclude_from_weight_decay=['/b$'],
        exclude_from_layer_adaptation=['/b$'])
    check_observer_in_trainer(tmp_path, optimizer, None, None, wd=1e-2,
                              eta=0.1, eps=0.0, threshold=0.0,
                              excluded=('b',))


def test_observer_names_lamb_and_reads_it_as_the_main_optimizer(tmp_path):
    doc = chainer_lars.TrustRatioObserver.__doc__
    source = doc[doc.index('source (object):'):doc.index('prefix (str)')]
    source = ' '.join(source.split())
    assert source.startswith('source (object): Anything with ``observe()`` '
                             '(``LARS``, ``LAMB``'), source
    assert '``LARS`` or ``LAMB``' in source  # the main optimizer's
    trainer = make_trainer(lambda: chainer_lars.LAMB(alpha=0.01), 4,
                           out=tmp_path)
    trainer.extend(chainer_lars.TrustRatioObserver(), trigger=(4, 'iteration'))
    trainer.extend(training.extensions.LogReport(trigger=(4, 'iteration')))
    trainer.run()
    optimizer = trainer.updater.get_optimizer('main')
    log = trainer.get_extension('LogReport').log
    for path, values in optimizer.observe().items():
        for quantity, value in zip(('ratio', 'w_norm', 'g_norm'), values):
            assert log[-1]['lars/{}{}'.format(quantity, path)] == value
    assert optimizer.observe()


def test_observer_with_gradient_lars_hook(tmp_path):
    hook = chainer_lars.GradientLARS(
        weight_decay=1e-3, exclude_from_weight_decay=['/b$'],
        exclude_from_layer_adaptation=['/b$'])
    check_observer_in_trainer(tmp_path, optimizers.MomentumSGD(lr=0.1),
                              hook, hook, wd=1e-3, eta=1.0, eps=1e-9,
                              threshold=1e-2, excluded=('b',))


def test_hand_ratio_is_the_spec():
    w = numpy.array([3.0, 4.0])
    g = numpy.array([0.0, 2.0])
    r, w_norm, g_norm = hand_ratio(w, g, wd=0.1, eta=0.01)
    assert (w_norm, g_norm) == (5.0, 2.0)
    assert math.isclose(r, 0.01 * 5.0 / (2.0 + 0.5))
