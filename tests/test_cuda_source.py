"""The CUDA sources compile with NVRTC for every architecture we claim.

Needs CuPy and NVRTC (the ``nvidia-cuda-nvrtc-cu12`` wheel) but no GPU.
Skipped where they are missing, unless ``CHAINER_LARS_REQUIRE_NVRTC=1``
(set by ``.ci/run``), where that fails instead.
"""

import ctypes
import glob
import os

import numpy
import pytest

from chainer_lars import cuda as cuda_kernels
from chainer_lars.testing import cuda_emulator


#: From Volta, the oldest GPU CuPy 13 supports, to Hopper (H100/H200):
#: PTX for the oldest, which newer drivers compile for their GPU, and
#: machine code for the newest.
ARCHITECTURES = ['compute_70', 'compute_80', 'sm_90']


def _load_nvrtc_wheel():
    # CuPy looks for libnvrtc on the library path, where the wheel's copy
    # is not; loaded first, it is found by its soname.
    try:
        import nvidia.cuda_nvrtc
    except ImportError:
        return
    for folder in nvidia.cuda_nvrtc.__path__:
        for path in sorted(glob.glob(os.path.join(folder, 'lib',
                                                  'libnvrtc.so.*'))):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return


@pytest.fixture(scope='module')
def nvrtc():
    try:
        _load_nvrtc_wheel()
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as e:  # missing library: not a failure of the code
        reason = 'NVRTC cannot be loaded: {}: {}'.format(
            type(e).__name__, e)
        if os.environ.get('CHAINER_LARS_REQUIRE_NVRTC') == '1':
            pytest.fail(reason + ', and CHAINER_LARS_REQUIRE_NVRTC=1',
                        pytrace=False)
        pytest.skip(reason)
    return nvrtc


@pytest.mark.parametrize('arch', ARCHITECTURES)
@pytest.mark.parametrize('dtype, mixed16', [
    (numpy.float16, False), (numpy.float32, False), (numpy.float64, False),
    (numpy.float32, True)])
def test_kernels_compile(nvrtc, dtype, mixed16, arch):
    if int(arch.split('_')[1]) not in nvrtc.getSupportedArchs():
        # CUDA 13's NVRTC (CuPy 14's) compiles from Turing on: Volta is
        # CuPy 13's and CUDA 12's oldest, not its.
        pytest.skip('NVRTC {}.{} does not compile for {}'.format(
            *nvrtc.getVersion(), arch))
    source = cuda_kernels.source(dtype, mixed16)
    program = nvrtc.createProgram(source, 'chainer_lars.cu', [], [])
    try:
        nvrtc.compileProgram(program, ['-arch=' + arch])
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(program))
    # Every kernel the emulator runs is one the GPU gets.
    names = sorted(cuda_emulator.parse_kernels(source))
    assert names == ['chainer_lars_lamb_norms', 'chainer_lars_lamb_step',
                     'chainer_lars_multi_momentum',
                     'chainer_lars_multi_norms',
                     'chainer_lars_multi_scale_add']
    if arch.startswith('compute_'):
        ptx = nvrtc.getPTX(program)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        for name in names:
            assert '.entry {}('.format(name) in ptx
    else:
        assert len(nvrtc.getCUBIN(program)) > 0
