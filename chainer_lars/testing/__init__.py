"""Testing aids: a CPU emulation of the CUDA device chainer-lars uses.

:mod:`chainer_lars.testing.cuda_emulator` compiles and runs CUDA kernels on
the host; :mod:`chainer_lars.testing.emulated_cupy` is the part of CuPy
that Chainer and chainer-lars use, backed by it. Neither is imported by
``import chainer_lars``.
"""
