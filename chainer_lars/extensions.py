"""Trainer extensions for large-batch training with LARS."""

import warnings

import numpy

import chainer
from chainer.training import extension

from chainer_lars import checks
from chainer_lars import fused


class WarmupPolynomialShift(extension.Extension):

    """Linear warm-up, then polynomial decay, of an optimizer attribute.

    The large-batch recipes' schedule (`Goyal et al.
    <https://arxiv.org/abs/1706.02677>`_, `You et al.
    <https://arxiv.org/abs/1708.03888>`_) in one extension (Chainer's
    ``WarmupShift`` and ``PolynomialShift`` overwrite each other). After
    :math:`t` calls the attribute is

    .. math::

        v(t) = v_0 (t + 1) / T_w \\ (t < T_w), \\quad
        v_e + (v_0 - v_e) \\left(1 - \\frac{t - T_w}{T - T_w}\\right)^p
        \\ (T_w \\le t < T), \\quad v_e \\ (t \\ge T),

    (in plain text: ``init * (t + 1) / warmup_count`` during the warm-up, then
    ``end + (init - end) * (1 - (t - warmup_count) / (max_count -
    warmup_count)) ** power``, then ``end``): no update of the warm-up has a
    rate of 0. Snapshots hold the count, the peak and the schedule; loading one
    of another schedule (or of another ``init`` given) raises ``ValueError``: a
    longer ``max_count`` would bring a decayed rate back up (one that holds
    the count and the peak only, no schedule, loads). The values, and that no
    other shift sets the attribute, are checked before it first changes.

    Args:
        attr (str): The optimizer attribute, e.g. ``'lr'``.
        warmup_count (int): :math:`T_w`, calls of the warm-up; 0 for none.
        max_count (int): :math:`T`, calls after which the value is ``end``.
        power (float): :math:`p`, above 0.
        init (float): :math:`v_0`, the peak; ``None``: read as training starts.
        end (float): :math:`v_e`.
        optimizer (~chainer.Optimizer): The optimizer (anything with
            ``update()``, such as ChainerMN's); ``None``: the main one.

    """

    trigger, _set = (1, 'iteration'), None  # _set: initialize()'s optimizer

    def __init__(self, attr, warmup_count, max_count, power=2.0, init=None,
                 end=0.0, optimizer=None):
        self._attr = checks.string('attr', attr)
        if attr in ('t', 'epoch'):  # Chainer's counts: its update() sets t
            raise ValueError("attr {!r}: the optimizer's own count, not a "
                             "hyperparameter such as 'lr'".format(attr))
        self._warmup_count = checks.count('warmup_count', warmup_count)
        self._max_count = checks.count('max_count', max_count)
        if self._max_count < max(self._warmup_count, 1):  # 0: all at end
            raise ValueError('max_count must be at least 1 and warmup_count '
                             '({}), got {}'.format(self._warmup_count,
                                                   self._max_count))
        self._power = checks.real('power', power, minimum=0.0, exclusive=True)
        self._init = None if init is None else checks.real('init', init)
        self._end = checks.real('end', end)
        self._check_sign(self._init)
        if optimizer is not None:
            checks.optimizer('optimizer', optimizer)
            self._check_attr(self._actual(optimizer, None))
            self._check_values(self._actual(optimizer, None), self._init)
        self._optimizer, self._given_init, self._t = optimizer, self._init, 0

    def value(self, t):
        """The value after ``t`` calls (see the formula above)."""
        t = checks.count('t', t)
        checks.real('the peak (init=None: read when training starts)',
                    self._init)
        if t < self._warmup_count:
            return self._init * (t + 1) / self._warmup_count
        if t >= self._max_count:
            return self._end
        decay = 1.0 - (t - self._warmup_count) / (
            self._max_count - self._warmup_count)
        return self._end + (self._init - self._end) * decay ** self._power

    @staticmethod
    def _actual(optimizer, trainer):  # ChainerMN's forwards to its actual
        optimizer = optimizer or trainer.updater.get_optimizer('main')
        return vars(optimizer).get('actual_optimizer', optimizer)

    def initialize(self, trainer):
        optimizer = self._actual(self._optimizer, trainer)
        for name, entry in getattr(trainer, '_extensions', {}).items():
            other = entry.extension  # Chainer's shifts: _attr, _optimizer
            if (other is not self and getattr(other, '_attr', 0) == self._attr
                    and hasattr(other, '_optimizer') and self._actual(
                        other._optimizer, trainer) is optimizer):
                raise ValueError("WarmupPolynomialShift: the extension {!r} "
                                 "sets the optimizer's {} too: each would "
                                 "overwrite the other's value at every call; "
                                 'keep one schedule'.format(name, self._attr))
        current = self._check_attr(optimizer)
        init = current if self._init is None else self._init
        self._check_sign(init)
        self._check_values(optimizer, init)
        self._init, self._set = init, optimizer
        setattr(optimizer, self._attr, self.value(self._t))

    def _check_attr(self, opt):  # returns its value, a real number
        prop = getattr(type(opt), self._attr, None)
        if isinstance(prop, property) and prop.fset is None:
            alpha = self._attr == 'lr' and hasattr(
                getattr(opt, 'hyperparam', None), 'alpha')
            raise ValueError(
                "attr {0!r}: the optimizer's ({1}) {0} is read only{2}".format(
                    self._attr, type(opt).__name__, ": {}'s learning "
                    "rate is 'alpha' (its lr is the rate after bias "
                    "correction, computed from alpha); schedule 'alpha' "
                    'instead'.format(type(opt).__name__) if alpha else ''))
        if not hasattr(opt, self._attr):
            raise ValueError(
                'attr {!r}: the optimizer ({}) has no attribute of that '
                'name'.format(self._attr, type(opt).__name__))
        return checks.real("the optimizer's {}{}".format(
            self._attr, ' (read for init=None)' if self._init is None
            else ''), getattr(opt, self._attr))

    def _check_sign(self, init):  # init=None: read when training starts
        if init is not None and (init >= 0) != (self._end >= 0) and self._end:
            raise ValueError(
                'end must not be {} when init is {} ({!r}): the schedule '
                'would take {} through 0; got end={!r}'.format(*(
                    ('negative', 'non-negative') if init >= 0 else
                    ('positive', 'negative')), init, self._attr, self._end))

    def _check_values(self, optimizer, init):
        check = checks.find_check(optimizer, self._attr) or float  # any real
        for name, value in (('init', init), ('end', self._end)):
            try:
                if value is not None:  # None: read when training starts
                    check(value)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    '{}={!r} is not a valid value of the optimizer\'s {}: '
                    '{}'.format(name, value, self._attr, e)) from None

    def __call__(self, trainer):
        optimizer = self._actual(self._optimizer, trainer)
        if self._set is None:  # by hand, before initialize(): checked here
            self._check_attr(optimizer)
            self._check_values(optimizer, self._init)
        setattr(optimizer, self._attr, self.value(self._t + 1))  # then counted
        self._t += 1

    def serialize(self, serializer):
        # All read before any is set; 0.2.0's hold the count and peak only,
        # 0.3.0.dev0's not the attribute (saved as its name's UTF-8 bytes).
        loading = isinstance(serializer, chainer.serializer.Deserializer)
        mine = {name: getattr(self, '_' + name) for name in (
            'warmup_count', 'max_count', 'power', 'end')}
        saved = {name: fused.read(serializer, name, value)  # None: not saved
                 for name, value in mine.items()}
        attr = fused.read(serializer, 'attr', None if loading else
                          numpy.frombuffer(self._attr.encode(), numpy.uint8))
        if attr is not None:
            mine['attr'], saved['attr'] = self._attr, bytes(
                numpy.asarray(attr, numpy.uint8)).decode()
        t = int(serializer('_t', self._t))
        init = serializer('_init', numpy.nan if self._init is None
                          else self._init)
        init = None if numpy.isnan(init) else float(init)
        # A peak read from the optimizer (init=None) is the snapshot's.
        if self._given_init is not None and init is not None:
            mine['init'], saved['init'] = self._given_init, init
        for name in sorted(mine, key='attr'.__ne__):  # the order first
            if saved[name] is not None and saved[name] != mine[name]:
                raise ValueError(
                    'WarmupPolynomialShift: the snapshot was written with '
                    '{0}={1!r}, this schedule has {0}={2!r}; {3}'.format(
                        name, saved[name], mine[name], 'Chainer finds an '
                        "extension's part by its name: register the "
                        'schedules in the order of that run, or name them'
                        if name == 'attr' else 'a resumed schedule continues '
                        'its own curve: to change it, start a new run'))
        self._t, self._init = t, self._init if init is None else init
        if loading and self._set is not None:  # after initialize(): autoload
            setattr(self._set, self._attr, self.value(t))


class TrustRatioObserver(extension.Extension):

    """Reports each layer's trust ratio and norms (LARS, LAMB).

    It reports ``source.observe()`` as ``<prefix>/ratio<path>``,
    ``<prefix>/w_norm<path>`` and ``<prefix>/g_norm<path>`` (:meth:`key`).
    On a GPU the values reach the host only at its calls: give it the
    interval you want (default once per epoch), not every iteration.

    Args:
        source (object): Anything with ``observe()`` (``LARS``, ``LAMB``,
            ``GradientLARS``); ``None``: the main one, a ``LARS`` or ``LAMB``.
        prefix (str): The first component of the names (``''``: none).
        pattern (str): A regular expression: only the paths it matches
            (:func:`re.search`) are reported, e.g. ``'/W$'``.

    """

    trigger, priority = (1, 'epoch'), extension.PRIORITY_WRITER
    quantities = ('ratio', 'w_norm', 'g_norm')
    _warned = False  # of a pattern that matches no path observed

    def __init__(self, source=None, prefix='lars', pattern=None):
        if isinstance(source, type) or source is not None and not callable(
                getattr(source, 'observe', None)):
            raise TypeError('source must be a chainer_lars.LARS, LAMB or '
                            'GradientLARS instance (anything with an '
                            'observe() method), got {!r}'.format(source))
        self._source, self._prefix = source, checks.string('prefix', prefix)
        self._pattern = (None if pattern is None
                         else checks.pattern('pattern', pattern))

    def key(self, quantity, path):
        """The name under which ``quantity`` (``'ratio'``, ``'w_norm'`` or
        ``'g_norm'``) of the parameter at ``path`` is reported."""
        if quantity not in self.quantities:
            raise ValueError('quantity must be one of {}, got {!r}'.format(
                self.quantities, quantity))
        if not checks.string('path', path).startswith('/'):
            raise ValueError("path must be a parameter's path, starting with "
                             "'/' (e.g. '/l1/W'), got {!r}".format(path))
        return (self._prefix and self._prefix + '/') + quantity + path

    def _get_source(self, trainer):
        source = self._source
        if source is None:
            source = trainer.updater.get_optimizer('main')
            if not callable(getattr(source, 'observe', None)):
                raise TypeError(
                    'TrustRatioObserver: the main optimizer ({}) has no '
                    'observe(); pass the object that has, '
                    'TrustRatioObserver(hook) with the GradientLARS hook '
                    'registered on it'.format(type(source).__name__))
        return source

    initialize = _get_source  # when training starts, not an epoch in

    def __call__(self, trainer):
        observed = self._get_source(trainer).observe()
        report = {self.key(quantity, path): value
                  for path, values in observed.items()
                  if self._pattern is None or self._pattern.search(path)
                  for quantity, value in zip(self.quantities, values)}
        if observed and not report and not self._warned:  # once
            self._warned = True
            warnings.warn('TrustRatioObserver: the pattern {!r} matches none '
                          'of the paths observed ({}): nothing reported'
                          .format(self._pattern.pattern, ', '.join(sorted(
                              observed)[:3] + ['...'] * (len(observed) > 3))))
        chainer.report(report)


class LossScaleState(extension.Extension):

    """Saves in snapshots the loss scale, its dynamic-scaling state and the
    float32 master copies, which Chainer's optimizers leave out (``LARS`` and
    ``LAMB`` save them); counts the updates dynamic scaling skipped, once a
    call: leave its trigger at every iteration. Add it in every process of a
    ChainerMN run; snapshots without it still load.

    Args:
        optimizer (~chainer.Optimizer): The optimizer (ChainerMN's too).

    Attributes:
        skipped_updates (int): Updates skipped so far (saved).
        last_loss_scale (float): The scale of the last update (``None``
            before the first, or without loss scaling).
        last_skipped (bool): Whether the last update was skipped.

    """

    trigger, priority = (1, 'iteration'), extension.PRIORITY_WRITER

    def __init__(self, optimizer):
        self._optimizer = checks.optimizer('optimizer', optimizer)
        self.skipped_updates, self.last_loss_scale = 0, None
        self.last_skipped, self._next = False, None

    @property
    def loss_scale(self):
        """The scale of the next update (``None`` without loss scaling)."""
        return self._optimizer._loss_scale

    def initialize(self, trainer):
        self._next = self.loss_scale

    def __call__(self, trainer):
        self.last_skipped = bool(getattr(  # set by update() (dynamic scaling)
            self._optimizer, '_loss_scaling_isnan', False))
        self.skipped_updates += self.last_skipped
        self.last_loss_scale, self._next = self._next, self.loss_scale

    def serialize(self, serializer):
        fused.drop_masters(self._optimizer.target.params())  # float32's
        n = fused.read(serializer, 'skipped_updates', self.skipped_updates)
        if n is None:  # a snapshot without this extension: made anew
            return fused.drop_masters(self._optimizer.target.params(), ())
        fused.serialize_loss_scaling(self._optimizer, serializer)
        self.skipped_updates = int(n)
        loading = isinstance(serializer, chainer.serializer.Deserializer)
        if loading:  # after initialize() too (autoload)
            self._next = self.loss_scale
        for path, param in self._optimizer.target.namedparams():
            rule = getattr(param, 'update_rule', None)
            if (rule is None or isinstance(rule, fused.FusedRule)
                    or loading and param.raw_array is None):
                continue  # no update; a fused rule saves its own copy
            fused.serialize_master(rule, serializer[path], param.device)
        fused.drop_masters(self._optimizer.target.params())  # float32's
