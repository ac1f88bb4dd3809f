"""chainer-lars: Layer-wise Adaptive Rate Scaling (LARS) for Chainer."""

from chainer_lars.hook import GradientLARS  # NOQA

__version__ = '0.1.0'

__all__ = ['GradientLARS', '__version__']
