"""The CUDA sources compile with NVRTC, where it is installed.

Needs CuPy and NVRTC but no GPU, so the kernels are at least checked by the
compiler on machines without one.
"""

import numpy
import pytest


@pytest.fixture(scope='module')
def nvrtc():
    pytest.importorskip('cupy')
    from cupy_backends.cuda.libs import nvrtc
    try:
        nvrtc.getVersion()
    except Exception as e:  # the library is missing, not a test failure
        pytest.skip('NVRTC cannot be loaded: {}'.format(e))
    return nvrtc


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
def test_kernels_compile(nvrtc, dtype):
    from chainer_lars import cuda_kernels
    program = nvrtc.createProgram(cuda_kernels.source(dtype),
                                  'chainer_lars.cu', [], [])
    try:
        nvrtc.compileProgram(program, ['-arch=compute_70'])
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(program))
    ptx = nvrtc.getPTX(program)
    for name in ['chainer_lars_sqnorms', 'chainer_lars_scale_add',
                 'chainer_lars_momentum', 'chainer_lars_multi_sqnorms',
                 'chainer_lars_multi_scale_add']:
        assert '.entry {}('.format(name).encode() in ptx or (
            '.entry {}('.format(name) in str(ptx))
