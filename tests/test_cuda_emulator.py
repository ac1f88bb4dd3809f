"""The CUDA emulator itself: conversions, launch checks, barriers, memory.

If the emulator were wrong, the emulated GPU tests (test_gpu.py) could pass
on broken kernels; these tests hold it to what the hardware does.
"""

import json
import os
import time

import numpy
import pytest

from chainer_lars import cuda as cuda_kernels
from chainer_lars import layout as L
from chainer_lars.testing import cuda_emulator
from chainer_lars.testing import emulated_cupy as xp
from tests import forked


_CONVERT = r'''
extern "C" __global__ void widen(const unsigned short* h, float* f,
                                 long long n) {
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x;
        asm("{ cvt.f32.f16 %0, %1; }" : "=f"(x) : "h"(h[i]));
        f[i] = x;
    }
}
extern "C" __global__ void narrow(const float* f, unsigned short* h,
                                  long long n) {
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned short y;
        asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(y) : "f"(f[i]));
        h[i] = y;
    }
}
'''


@pytest.fixture(scope='module')
def convert():
    return cuda_emulator.Module(_CONVERT)


def _same_bits_or_both_nan(actual, expected):
    nan = numpy.isnan(expected)
    numpy.testing.assert_array_equal(numpy.isnan(actual), nan)
    numpy.testing.assert_array_equal(
        actual[~nan].view(numpy.uint32 if actual.itemsize == 4
                          else numpy.uint16),
        expected[~nan].view(numpy.uint32 if actual.itemsize == 4
                            else numpy.uint16))


def test_float16_widening_is_exact_for_every_value(convert):
    bits = numpy.arange(1 << 16, dtype=numpy.uint16)
    h = xp.asarray(bits)
    f = xp.empty(bits.size, numpy.float32)
    convert.get_function('widen')((8,), (256,),
                                  (h, f, numpy.int64(bits.size)))
    _same_bits_or_both_nan(f.get(), bits.view(numpy.float16).astype(
        numpy.float32))


def test_float16_narrowing_rounds_to_nearest_even(convert):
    rng = numpy.random.RandomState(0)
    bits = numpy.concatenate([
        rng.randint(0, 1 << 32, 1 << 20, dtype=numpy.uint64),
        # every float from the subnormal halves to the smallest normal,
        # and around the largest finite half (65504) and inf
        numpy.arange(0x33000000, 0x38800000, 61),
        numpy.arange(0x477fe000 - 4096, 0x47800000 + 4096),
        numpy.array([0, 0x7f800000, 0x7fc00000, 0x7f800001, 0x33000000,
                     0x33000001, 0x387fffff, 0x38800000]),
    ]).astype(numpy.uint32)
    bits = numpy.concatenate([bits, bits | 0x80000000])
    values = bits.view(numpy.float32)
    f = xp.asarray(values)
    h = xp.empty(values.size, numpy.uint16)
    convert.get_function('narrow')((8,), (256,),
                                   (f, h, numpy.int64(values.size)))
    with numpy.errstate(over='ignore', invalid='ignore'):
        expected = values.astype(numpy.float16)
    _same_bits_or_both_nan(h.get().view(numpy.float16), expected)


@pytest.fixture(scope='module')
def kernels():
    return cuda_emulator.Module(cuda_kernels.source(numpy.float32))


def _table(n=5):
    """The words and block map of one array of ``n`` float32 elements."""
    w = xp.asarray(numpy.ones(n, numpy.float32))
    g = xp.asarray(numpy.ones(n, numpy.float32))
    words = numpy.zeros(5 + len(L.COLUMNS), numpy.int64)
    words[:2] = w.data.ptr, g.data.ptr
    words[5:].view(numpy.float32)[:len(L.COLUMNS)] = L.rows(1)[0]
    return dict(arrays=(w, g), words=xp.asarray(words),
                blocks=xp.asarray(numpy.array([0, 1, 0, n], numpy.int64)))


def _norms_args(table, **change):
    args = dict(words=table['words'], blocks=table['blocks'],
                ntensors=numpy.int64(1),
                partial=xp.zeros(2, numpy.float32),
                done=xp.zeros(1, numpy.uint32),
                stats=xp.zeros(3, numpy.float32),
                rounded=xp.zeros(1, numpy.uint32))
    args.update(change)
    return tuple(args.values())


@pytest.mark.parametrize('change, message', [
    (dict(ntensors=numpy.int32(1)), 'long long'),
    (dict(ntensors=1), 'NumPy scalar'),
    (dict(ntensors=numpy.float64(1)), 'long long'),
    (dict(partial=xp.zeros(2, numpy.float64)), 'points to float'),
    (dict(stats=numpy.zeros(3, numpy.float32)), 'device array'),
    (dict(stats=xp.zeros(3, numpy.float64)), 'points to float'),
    (dict(done=xp.zeros(1, numpy.int64)), 'points to unsigned int'),
    (dict(words=xp.zeros(4, numpy.int32)), 'points to long long'),
])
def test_arguments_must_match_the_signature(kernels, change, message):
    table = _table()
    kernel = kernels.get_function('chainer_lars_multi_norms')
    with pytest.raises(cuda_emulator.LaunchError, match=message):
        kernel((1,), (256,), _norms_args(table, **change))
    kernel((1,), (256,), _norms_args(table))  # the right ones work


@pytest.mark.parametrize('grid, block', [
    ((0,), (256,)), ((1,), (0,)), ((1,), (2048,)), ((1,), (32, 32, 2)),
    ((2 ** 31,), (256,)), ((1, 65536), (256,)), ([1], (256,)),
    ((1.0,), (256,)), ((1, 1, 1, 1), (256,)),
])
def test_illegal_configurations_are_refused(kernels, grid, block):
    table = _table()
    kernel = kernels.get_function('chainer_lars_multi_norms')
    with pytest.raises(cuda_emulator.LaunchError):
        kernel(grid, block, _norms_args(table))


def test_argument_count_is_checked(kernels):
    table = _table()
    kernel = kernels.get_function('chainer_lars_multi_norms')
    with pytest.raises(cuda_emulator.LaunchError, match='takes 7'):
        kernel((1,), (256,), _norms_args(table)[:6])


#: Builds of the emulator, by the flags added to its compiler's: the
#: default (a block's threads take turns on one OS thread, switched by the
#: header's own code on x86-64), ucontext's switch (what other machines
#: get), and an OS thread per warp, the warps running concurrently.
VARIANTS = {
    'default': (),
    'ucontext': ('-DEMU_UCONTEXT',),
    'thread-per-warp': ('-DEMU_FIBERS_PER_THREAD=32',),
}

_SYNC = r'''
extern "C" __global__ void block_sums(const double* x, double* out,
                                      int barriers) {
    __shared__ double s[256];
    s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    if (barriers) {
        __syncthreads();
    }
    for (unsigned int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            s[threadIdx.x] += s[threadIdx.x + k];
        }
        if (barriers) {
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = s[0];
    }
}
extern "C" __global__ void diverge(float* x) {
    if (threadIdx.x == 3) {
        return;
    }
    __syncthreads();
    x[threadIdx.x] = 1;
}
extern "C" __global__ void wait_for_last(int* out) {
    __shared__ volatile int flag;
    if (threadIdx.x == blockDim.x - 1) {
        flag = blockIdx.x + 1;
    }
    while (flag != (int)blockIdx.x + 1) {
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = blockIdx.x;
}
extern "C" __global__ void spin(const int* flag, int* out) {
    while (*(volatile const int*)flag == 0) {
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}
'''


@pytest.fixture(scope='module', params=sorted(VARIANTS))
def variant(request):
    """``(name, module)``: the kernels of ``_SYNC`` in one build."""
    flags = cuda_emulator.CXXFLAGS
    cuda_emulator.CXXFLAGS = flags + VARIANTS[request.param]
    try:
        return request.param, cuda_emulator.Module(_SYNC)
    finally:
        cuda_emulator.CXXFLAGS = flags


def test_barriers_order_the_threads_of_a_block(variant):
    # A tree reduction in shared memory over 4 blocks of 256 threads: right
    # with its barriers in every build; without them, in the builds where
    # a block's threads take turns on one thread, thread 0 adds what
    # threads 1, 2, ... have not written yet, as a GPU may.
    name, module = variant
    kernel = module.get_function('block_sums')
    values = numpy.arange(1024, dtype=numpy.float64) ** 2
    x = xp.asarray(values)
    out = xp.zeros(4, numpy.float64)
    kernel((4,), (256,), (x, out, numpy.int32(1)))
    numpy.testing.assert_array_equal(out.get(),
                                     values.reshape(4, 256).sum(axis=1))
    if name != 'thread-per-warp':
        kernel((4,), (256,), (x, out, numpy.int32(0)))
        assert (out.get() != values.reshape(4, 256).sum(axis=1)).all()


def test_divergent_barrier_is_an_error(variant):
    x = xp.zeros(64, numpy.float32)
    with pytest.raises(cuda_emulator.EmulatorError, match='divergent'):
        variant[1].get_function('diverge')((2,), (64,), (x,))


def test_threads_of_a_block_run_concurrently(variant):
    # Every thread waits for the last thread of its block, which only works
    # if they run at the same time, as on a GPU: where the threads take
    # turns, each spins until preempted, while those before it are still
    # suspended in their preemption (63 a block).
    out = xp.zeros(2 * 64, numpy.int32)
    variant[1].get_function('wait_for_last')((2,), (64,), (out,))
    numpy.testing.assert_array_equal(out.get(), numpy.repeat(range(2), 64))


def test_a_launch_that_never_ends_fails_and_the_next_starts_afresh(
        variant):
    # Every thread spins on a flag that nobody sets: released from no
    # barrier, they are abandoned at the timeout, and the launch fails
    # instead of hanging the test run.
    name, module = variant
    flag = xp.zeros(1, numpy.int32)
    out = xp.zeros(2 * 64, numpy.int32)
    module.set_timeout(0.3)
    try:
        start = time.monotonic()
        with pytest.raises(cuda_emulator.EmulatorError,
                           match=r'spin: the launch ran for over 300 ms: .* '
                           r'threads still running abandoned'):
            module.get_function('spin')((2,), (64,), (flag, out))
        assert time.monotonic() - start < 60
    finally:
        module.set_timeout(None)
    assert (out.get() == 0).all()
    # The abandoned threads start the next launches from the top.
    flag[...] = 1
    module.get_function('spin')((2,), (64,), (flag, out))
    numpy.testing.assert_array_equal(out.get(), 1)
    values = numpy.arange(512, dtype=numpy.float64)
    sums = xp.zeros(2, numpy.float64)
    module.get_function('block_sums')((2,), (256,), (
        xp.asarray(values), sums, numpy.int32(1)))
    numpy.testing.assert_array_equal(sums.get(),
                                     values.reshape(2, 256).sum(axis=1))


def test_a_write_past_an_array_is_caught():
    module = cuda_emulator.Module(r'''
extern "C" __global__ void overrun(float* x, long long n) {
    x[n + threadIdx.x] = 1;
}
''')
    x = xp.zeros(10, numpy.float32)
    with pytest.raises(cuda_emulator.EmulatorError, match='wrote outside'):
        module.get_function('overrun')((1,), (2,), (x, numpy.int64(10)))


def test_memory_of_another_device_is_an_illegal_access(kernels):
    # Two devices without peer access: a launch on device 0 given an array
    # of device 1, or its address in a pointer table, fails before it runs
    # (on a GPU, an illegal memory access that ends the CUDA context).
    kernel = kernels.get_function('chainer_lars_multi_norms')
    table = _table()
    assert xp.cuda.Device().id == 0 and table['words'].device.id == 0
    with xp.cuda.Device(1):
        assert xp.cuda.Device().id == 1
        g = xp.asarray(numpy.ones(5, numpy.float32))
        stats = xp.zeros(3, numpy.float32)
        with pytest.raises(cuda_emulator.EmulatorError, match=r'an array of '
                           r'device 0 given to a launch on device 1'):
            kernel((1,), (256,), _norms_args(table))
    assert (g.device.id, g.data.device_id, xp.cuda.Device().id) == (1, 1, 0)
    with pytest.raises(cuda_emulator.EmulatorError, match=r'an array of '
                       r'device 1 given to a launch on device 0'):
        kernel((1,), (256,), _norms_args(table, stats=stats))
    words = table['words'].get()
    words[1] = g.data.ptr + 8  # inside it
    with pytest.raises(cuda_emulator.EmulatorError, match=r"an address in "
                       r"device 1's memory given to a launch on device 0"):
        kernel((1,), (256,), _norms_args(table, words=xp.asarray(words)))
    kernel((1,), (256,), _norms_args(table))  # its own memory: it runs
    with pytest.raises(RuntimeError, match='two CUDA devices'):
        xp.cuda.Device(2)


def test_operations_on_another_devices_array_raise_cupys_error():
    # As CuPy without peer access: arithmetic, astype, elementwise kernels
    # refuse an array of another device; a copy crosses devices.
    with xp.cuda.Device(1):
        g = xp.asarray(numpy.arange(4, dtype=numpy.float32))
    peer = r'\(1\) is different from the current device \(0\)\. Peer access'
    kernel = xp.ElementwiseKernel('T x', 'T y', 'y = x;', 'copy')
    for operation in (lambda: g * 2, lambda: g.astype(numpy.float64),
                      lambda: xp.isfinite(g), lambda: g.__itruediv__(2),
                      lambda: g.__setitem__(0, 1),
                      lambda: kernel(g, xp.empty_like(g))):
        with pytest.raises(ValueError, match=peer):
            operation()
    with pytest.raises(ValueError, match=peer):
        xp.ascontiguousarray(g[::2])  # (a contiguous one: returned as is)
    copies = [g.copy(), xp.array(g), xp.array(g, numpy.float64),
              xp.asarray(g), xp.zeros(4, numpy.float32)]
    xp.copyto(copies[-1], g)
    for copy in copies:
        assert copy.device.id == 0 and copy.get().tolist() == [0, 1, 2, 3]
    with xp.cuda.Device(1):
        assert (g * 2).get().tolist() == [0, 2, 4, 6]
    with xp.cuda.Device(1):  # use(): until the block ends, as CuPy's
        xp.cuda.Device(0).use()
        assert xp.cuda.Device().id == 0
    assert xp.cuda.Device().id == 0


def test_fresh_device_memory_reads_as_nan():
    # A kernel that reads what no one wrote then gives NaN, not a number
    # that may look right.
    assert numpy.isnan(xp.empty(4, numpy.float32).get()).all()
    assert numpy.isnan(xp.empty(4, numpy.float16).get()).all()


def test_the_array_header_is_read_only_as_cupys():
    """CuPy sets a shape in place (a reshape without a copy) and refuses
    every other field of the header: so does the emulation, so that no
    test changes a device array in a way a GPU run cannot."""
    x = xp.arange(12, dtype=numpy.float32)
    address = x.data.ptr
    x.shape = (3, 4)
    assert (x.shape, x.strides, x.ndim, x.data.ptr) == (
        (3, 4), (16, 4), 2, address)
    numpy.testing.assert_array_equal(x.get()[1], [4, 5, 6, 7])
    with pytest.raises(AttributeError):  # a copy would be needed
        x.T.shape = (12,)
    for name, value in (('dtype', numpy.int32), ('strides', (4, 12)),
                        ('size', 6), ('nbytes', 24), ('ndim', 1),
                        ('itemsize', 8), ('data', None)):
        with pytest.raises(AttributeError, match=name):
            setattr(x, name, value)
    assert (x.dtype, x.strides, x.shape) == (numpy.float32, (16, 4), (3, 4))


def test_the_header_is_precompiled_once_and_the_modules_use_it(
        tmp_path, monkeypatch):
    """With GCC the header is parsed once per header, compiler and flags
    (a ``.gch`` beside a copy in ``pch-<digest>/``, older ones removed), a
    module compiled through it computes as one compiled without, and
    another compiler gets the header itself."""
    if not cuda_emulator._is_gcc(cuda_emulator.compiler()):
        pytest.skip('the C++ compiler is not GCC')
    monkeypatch.setenv('CHAINER_LARS_EMULATOR_CACHE', str(tmp_path))
    (tmp_path / 'pch-stale').mkdir()
    with open(cuda_emulator._HEADER) as f:
        header = f.read()
    copy = cuda_emulator._precompiled(header, str(tmp_path))
    assert os.path.isfile(copy + '.gch') and copy != cuda_emulator._HEADER
    assert [p.name for p in tmp_path.iterdir()] == [
        os.path.basename(os.path.dirname(copy))]
    assert cuda_emulator._precompiled(header, str(tmp_path)) == copy
    source = r'''
extern "C" __global__ void twice(float* x) {
    x[threadIdx.x] *= 2;
}
'''
    outs = []
    for use in (True, False):
        if not use:
            monkeypatch.setenv('CHAINER_LARS_EMULATOR_CACHE',
                               str(tmp_path / 'without'))
            monkeypatch.setattr(cuda_emulator, '_is_gcc', lambda cxx: False)
            assert cuda_emulator._precompiled(
                header, str(tmp_path / 'without')) == cuda_emulator._HEADER
        x = xp.asarray(numpy.arange(8, dtype=numpy.float32))
        cuda_emulator.Module(source).get_function('twice')((1,), (8,), (x,))
        outs.append(x.get())
    numpy.testing.assert_array_equal(outs[0], 2 * numpy.arange(8))
    numpy.testing.assert_array_equal(outs[0], outs[1])
    assert not any(p.name.startswith('pch-')
                   for p in (tmp_path / 'without').iterdir())


def test_other_inline_asm_is_refused():
    with pytest.raises(cuda_emulator.EmulatorError, match='inline asm'):
        cuda_emulator.Module(r'''
extern "C" __global__ void k(float* x) {
    asm volatile("membar.gl;");
}
''')


def test_device_values_read_on_the_host_are_counted():
    a = xp.asarray(numpy.arange(4, dtype=numpy.float32))
    xp.stats.reset()
    total = (a * 2).sum()
    assert xp.stats.to_host == 0
    float(total)
    bool(total > 0)
    a.get()
    assert xp.stats.to_host == 3


def test_device_arrays_refuse_implicit_conversion_as_cupy():
    # CuPy raises here; an emulator that converted would let a test pass
    # on the CPU that fails on a GPU (two did, on the H100).
    a = xp.asarray(numpy.arange(4, dtype=numpy.float32))
    with pytest.raises(TypeError, match='Implicit conversion to a NumPy '
                       'array is not allowed'):
        numpy.asarray(a)
    numpy.testing.assert_array_equal(a.get(), numpy.arange(4))


#: Bugs planted one at a time in the kernel source, with the tests that
#: must then fail. Each must name text that is in the source.
PLANTS = {
    'a reduction step dropped': (
        's > 0; s >>= 1', 's > 1; s >>= 1'),
    'a block map offset off by one': (
        't = blocks[T + 1 + blockIdx.x];',
        't = blocks[T + blockIdx.x];'),
    'the adaptation flag read from the weight-decay column': (
        's[LARS_ADAPT] != (C)0 ? chainer_lars_trust_ratio<C>(\n'
        '            sqrt(sw), sqrt(sg)',
        's[LARS_WEIGHT_DECAY] != (C)0 ? chainer_lars_trust_ratio<C>(\n'
        '            sqrt(sw), sqrt(sg)'),
    'the loss scale ignored in the ratio': (
        'const C g_scale = LARS_MIXED16 ? (C)1 : s[LARS_LOSS_SCALE];',
        'const C g_scale = 1;'),
    'the last block miscounted': (
        '== (unsigned int)(last - first - 1);',
        '== (unsigned int)(last - first);'),
    'a zero weight array adapted (threshold compared with >=)': (
        '!(w_norm > threshold)', '!(w_norm >= threshold)'),
    'the mixed16 gradient stepped with its loss scale in it': (
        'x[j] = x[j] / loss_scale;', 'x[j] = x[j];'),
    'the mixed16 float16 weight left unwritten': (
        '    lars_put(h, i, n, p, wn);\n', ''),
    'the partial of a block written to the wrong slot': (
        'partial[2 * blockIdx.x + 1] = b;',
        'partial[2 * blockIdx.x + 1] = a;'),
    "LAMB's second moments read from the first moments' pointers": (
        'S* v = (S*)words[3 * T + t];', 'S* v = (S*)words[2 * T + t];'),
    "LAMB's second bias correction dropped": (
        '(sqrt(v / s[LARS_CORRECTION2])', '(sqrt(v)'),
    'a vector access read as its first element': (
        'x[j] = lars_c(v.v[j]);', 'x[j] = lars_c(v.v[0]);'),
    "a row's left gradient taken": (
        'return words[T + t] != 0;', 'return true;'),
}


@pytest.mark.parametrize('plant', sorted(PLANTS))
def test_a_planted_bug_fails_the_gpu_tests(plant):
    old, new = PLANTS[plant]
    # The tests that exercise the planted code: the mixed16 and LAMB
    # kernels' own, the zero weight's, else those of LARS and the hook
    # (with -x, the first failure ends the run: the tests that pass before
    # it are the time a plant costs).
    selection = (['mixed16_batched_agrees and static'] if 'mixed16' in plant
                 else ['lamb_agrees_with_cpu and static-True']
                 if 'LAMB' in plant else ['takes_what_it_can']
                 if 'left' in plant else ['zero_weight']
                 if 'zero weight' in plant else
                 ['every_size', 'zero_weight',
                  'hook_agrees_with_cpu and static-True',
                  'lars_agrees_with_cpu and static'])
    for dtype in (numpy.float16, numpy.float32, numpy.float64):
        assert old in cuda_kernels.source(dtype)
    tests = os.path.join(os.path.dirname(__file__), 'test_gpu.py')
    # A planted bug may crash the process (a pointer read from the wrong
    # word): that is caught too, so it runs in a process of its own, forked
    # from tests/forked.py's server (which has imported Chainer already).
    code = """
import os, sys
from chainer_lars.testing import cuda_emulator
# The plant for this process (the emulator may have been imported before,
# without it) and for any process its tests start.
cuda_emulator.plants[:] = [tuple(p) for p in {plants!r}]
os.environ['CHAINER_LARS_EMULATOR_PLANTS'] = {environ!r}
import pytest
sys.exit(pytest.main(['-x', '-q', '-p', 'no:cacheprovider', {tests!r},
                      '-m', 'not gpu', '-k', {select!r}]))
""".format(plants=[[old, new]], environ=json.dumps([[old, new]]),
           tests=tests, select='({}) and not fp32'.format(
               ' or '.join(selection)))
    returncode, stdout, stderr = forked.run(code, timeout=900)
    # Failed tests (1) or a crash (a signal); not a run that passed, that
    # selected no test (5) or that could not run the tests (2 to 4).
    assert returncode == 1 or returncode < 0, (
        'planted bug "{}" went unnoticed:\n{}{}'.format(
            plant, stdout, stderr))
