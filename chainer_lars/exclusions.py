"""Which parameters get weight decay and which get layer adaptation."""

import warnings

from chainer_lars import checks

_NAMES = ('exclude_from_weight_decay', 'exclude_from_layer_adaptation')


class ExclusionRules(object):

    """The two exclusion lists of regular expressions searched in the
    parameter paths. Unlike TensorFlow's, they act independently."""

    def __init__(self, exclude_from_weight_decay=(),
                 exclude_from_layer_adaptation=()):
        lists = exclude_from_weight_decay, exclude_from_layer_adaptation
        for name, patterns in zip(_NAMES, lists):  # each checked in turn
            setattr(self, name, checks.patterns(name, patterns))

    def lookup(self, path):
        """``(uses_weight_decay, uses_adaptation)`` for ``path``."""
        return tuple(not any(p.search(path) for p in getattr(self, name))
                     for name in _NAMES)

    def warn_unmatched(self, face, paths, stacklevel):
        """Warns, once, of a list that matches none of ``paths``."""
        for name in _NAMES * (bool(paths) and not getattr(self, '_warned', 0)):
            patterns = getattr(self, name)
            if patterns and not any(p.search(s) for s in paths
                                    for p in patterns):
                warnings.warn('{}: {}={} matches no parameter path (such as '
                              '{}): it excludes nothing'.format(
                                  face, name, [p.pattern for p in patterns],
                                  ', '.join(sorted(paths)[:3])),
                              stacklevel=stacklevel + 1)
        self._warned = getattr(self, '_warned', False) or bool(paths)


def _fixed(name, get=None, why="each parameter's flags are computed once",
           doc='tuple of str: The {} patterns.'):
    """A property set by the constructor only: ``get``, else ``_rules``'s."""
    def refuse(self, value):
        raise AttributeError('{0} is fixed when the {1} is made ({2}): pass '
                             'it to the constructor, {1}(..., {0}={3!r})'
                             .format(name, type(self).__name__, why, value))
    return property(get or (lambda self: tuple(p.pattern for p in getattr(
        self._rules, name))), refuse, doc=doc.format(name))


class ExclusionProperties(object):

    """Read-only exclusion lists and ``multi_tensor``; the faces' ``repr``."""

    _REPR = ()
    exclude_from_weight_decay = _fixed('exclude_from_weight_decay')
    exclude_from_layer_adaptation = _fixed('exclude_from_layer_adaptation')
    multi_tensor = _fixed('multi_tensor', lambda self: self._multi_tensor,
                          'its plans are made for it',
                          'bool: Whether arrays go together, by dtype.')

    def __repr__(self):
        names = self._REPR + _NAMES + ('multi_tensor',)
        return '{}({})'.format(type(self).__name__, ', '.join(
            '{}={}'.format(n, getattr(self, n)) for n in names))
