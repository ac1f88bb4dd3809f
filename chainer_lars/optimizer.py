"""The names this module held up to chainer-lars 0.2.0, where pickles and
imports of that version find them: :class:`~chainer_lars.LARS` and
:class:`~chainer_lars.LARSRule` live in :mod:`chainer_lars.lars`, what
they share with LAMB in :mod:`chainer_lars.fused`."""

from chainer_lars.fused import FusedMethod  # NOQA
from chainer_lars.fused import FusedRule  # NOQA
from chainer_lars.fused import serialize_loss_scaling  # NOQA
from chainer_lars.fused import serialize_master  # NOQA
from chainer_lars.lars import LARS  # NOQA
from chainer_lars.lars import LARSRule  # NOQA
