"""chainer-lars: Layer-wise Adaptive Rate Scaling (LARS, LAMB) for Chainer."""

from chainer_lars.extensions import LossScaleState  # NOQA
from chainer_lars.extensions import TrustRatioObserver  # NOQA
from chainer_lars.extensions import WarmupPolynomialShift  # NOQA
from chainer_lars.hook import GradientLARS  # NOQA
from chainer_lars.lamb import LAMB  # NOQA
from chainer_lars.lamb import LAMBRule  # NOQA
from chainer_lars.lars import LARS  # NOQA
from chainer_lars.lars import LARSRule  # NOQA

__version__ = '0.3.0.dev0'

__all__ = ['GradientLARS', 'LAMB', 'LAMBRule', 'LARS', 'LARSRule',
           'LossScaleState', 'TrustRatioObserver', 'WarmupPolynomialShift',
           '__version__']
