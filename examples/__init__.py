"""The examples: trainers, and the modules they share.

CuPy installed without NCCL warns, in 8 lines, as Chainer's trainer is
imported (``chainer.training`` imports its multi-process updater, which
imports ``cupy.cuda.nccl``), at every run of every trainer, ``--help``
included; these trainers use NCCL only in ChainerMN's ``pure_nccl``
communicator, which says itself that NCCL is missing. That one warning
is filtered here, by its message, before a trainer imports Chainer (each
imports this package first); every other warning shows as before.
"""

import warnings


warnings.filterwarnings('ignore', message=r'\s*nccl library could not be '
                        r'loaded', category=UserWarning)
