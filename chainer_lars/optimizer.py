"""The names this module held up to 0.2.0, for its pickles and imports."""

from chainer_lars.fused import FusedMethod  # NOQA
from chainer_lars.fused import FusedRule  # NOQA
from chainer_lars.fused import serialize_loss_scaling  # NOQA
from chainer_lars.fused import serialize_master  # NOQA
from chainer_lars.lars import LARS  # NOQA
from chainer_lars.lars import LARSRule  # NOQA
