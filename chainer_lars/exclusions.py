"""Which parameters get weight decay and which get layer adaptation."""

from chainer_lars import checks


class ExclusionRules(object):

    """The two exclusion lists: regular expressions searched (:func:`re.
    search`) in the parameter paths (a ``str`` is a list of one). Unlike in
    the TensorFlow optimizer they come from, they act independently: an
    array excluded from adaptation keeps its weight decay, one excluded from
    weight decay is adapted with a weight decay of 0."""

    def __init__(self, exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=()):
        self.exclude_from_weight_decay = checks.patterns(
            'exclude_from_weight_decay', exclude_from_weight_decay)
        self.exclude_from_layer_adaptation = checks.patterns(
            'exclude_from_layer_adaptation', exclude_from_layer_adaptation)

    def __bool__(self):
        return bool(self.exclude_from_weight_decay
                    or self.exclude_from_layer_adaptation)

    def lookup(self, path):
        """Returns ``(uses_weight_decay, uses_adaptation)`` for ``path``
        (the faces look it up once, when they plan)."""
        return tuple(not any(p.search(path) for p in patterns)
                     for patterns in (self.exclude_from_weight_decay,
                                      self.exclude_from_layer_adaptation))

    def patterns(self):
        """The two lists as tuples of strings."""
        return (tuple(p.pattern for p in self.exclude_from_weight_decay),
                tuple(p.pattern for p in self.exclude_from_layer_adaptation))


class ExclusionProperties(object):

    """The two exclusion lists, as read-only tuples of strings (compiled
    once, at construction), of an object that keeps them in ``_rules``,
    and a ``repr`` of the attributes named in ``_REPR``."""

    _REPR = ()

    @property
    def exclude_from_weight_decay(self):
        """tuple of str: The weight-decay exclusion patterns."""
        return self._rules.patterns()[0]

    @exclude_from_weight_decay.setter
    def exclude_from_weight_decay(self, value):
        self._fixed('exclude_from_weight_decay')

    @property
    def exclude_from_layer_adaptation(self):
        """tuple of str: The layer-adaptation exclusion patterns."""
        return self._rules.patterns()[1]

    @exclude_from_layer_adaptation.setter
    def exclude_from_layer_adaptation(self, value):
        self._fixed('exclude_from_layer_adaptation')

    def _fixed(self, name):
        raise AttributeError(
            '{0} is fixed when the {1} is made (each parameter\'s flags '
            'are computed once): pass it to the constructor, {1}(..., '
            '{0}=[...])'.format(name, type(self).__name__))

    def __repr__(self):
        return '{}({})'.format(type(self).__name__, ', '.join(
            '{}={}'.format(name.lstrip('_'), getattr(self, name))
            for name in self._REPR))
