"""The examples: trainers, and the modules they share.

Each trainer imports this package before Chainer, which imports
``chainer_lars_compat`` here: on Python 3.12+ with numpy 2 it puts back
what Chainer 7.8.1 reads at import, so that the trainers run there as
``python examples/...`` (the resume command a trainer prints included);
on Python 3.9 to 3.11 it does nothing.

CuPy installed without NCCL warns, in 8 lines, as Chainer's trainer is
imported (``chainer.training`` imports its multi-process updater, which
imports ``cupy.cuda.nccl``), at every run of every trainer, ``--help``
included; these trainers use NCCL only in ChainerMN's ``pure_nccl``
communicator, which says itself that NCCL is missing. That one warning
is filtered here, by its message, before a trainer imports Chainer (each
imports this package first); every other warning shows as before.
"""

import warnings

import chainer_lars_compat  # NOQA: before Chainer


warnings.filterwarnings('ignore', message=r'\s*nccl library could not be '
                        r'loaded', category=UserWarning)
