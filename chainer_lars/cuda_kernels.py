"""CUDA kernels of chainer-lars (CuPy RawModule, built once per dtype).

Two launches per array: ``chainer_lars_sqnorms`` reduces ``||w||^2`` and
``||g||^2`` of one array into a few per-block partial sums, and an
elementwise kernel (``chainer_lars_scale_add`` for the hook,
``chainer_lars_momentum`` for the optimizer) sums those partials in every
block, computes the ratio on the device and rewrites the array. The ratio
never reaches the host, nothing synchronises, and the fixed order of the
sums makes the result deterministic (no atomics).

The multi-tensor pair ``chainer_lars_multi_sqnorms`` /
``chainer_lars_multi_scale_add`` does the same for all arrays of one dtype
on one device in two launches per update: every block takes a chunk of
:data:`CHUNK` elements of one array, found through a table of pointers
that is uploaded once and cached while the arrays stay where they are
(CuPy's memory pool hands gradients the same blocks every iteration).

Storage and compute types: float16 arrays are read and written as raw
16-bit values with the hardware conversion instructions and computed in
float32; float32 in float32; float64 in float64.

Every function takes the array module ``xp`` of the device it runs on (what
``param.device.xp`` is: CuPy on a GPU) and reaches CuPy only through it:
``xp.RawModule``, ``xp.empty``, ``xp.cuda``. So the code above the kernels
runs unchanged on :mod:`chainer_lars.testing.emulated_cupy`, which executes
the same kernel sources on the CPU.
"""

import collections

import numpy

from chainer_lars import ratio as _ratio


#: Threads per block, a power of two (the block reductions rely on it).
THREADS = 256
#: Elements per block in the multi-tensor kernels.
CHUNK = 16 * THREADS
#: At most this many partial sums per array in the per-array kernels; every
#: block of the elementwise kernel reads them all, so they stay few.
MAX_PARTS = 128
#: At most this many blocks in a per-array elementwise launch.
MAX_BLOCKS = 2048

#: dtype -> (C storage type, C compute type, NumPy compute dtype)
_TYPES = {
    numpy.dtype(numpy.float16): ('unsigned short', 'float',
                                 numpy.dtype(numpy.float32)),
    numpy.dtype(numpy.float32): ('float', 'float',
                                 numpy.dtype(numpy.float32)),
    numpy.dtype(numpy.float64): ('double', 'double',
                                 numpy.dtype(numpy.float64)),
}

_LOAD_STORE = {
    'unsigned short': r'''
__device__ __forceinline__ C lars_load(const S* p, long long i) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(p[i]));
    return f;
}
__device__ __forceinline__ void lars_store(S* p, long long i, C x) {
    unsigned short h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(x));
    p[i] = h;
}
''',
    'float': r'''
__device__ __forceinline__ C lars_load(const S* p, long long i) {
    return p[i];
}
__device__ __forceinline__ void lars_store(S* p, long long i, C x) {
    p[i] = x;
}
''',
}
_LOAD_STORE['double'] = _LOAD_STORE['float']

_SOURCE = r'''
typedef {storage} S;
typedef {compute} C;
#define LARS_THREADS {threads}
#define LARS_CHUNK {chunk}

{load_store}

{trust_ratio}

// Sums a and b over the block in a fixed order; every thread gets the sums.
__device__ __forceinline__ void lars_block_sum2(C& a, C& b) {{
    __shared__ C sa[LARS_THREADS];
    __shared__ C sb[LARS_THREADS];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int s = LARS_THREADS / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) {{
            sa[threadIdx.x] += sa[threadIdx.x + s];
            sb[threadIdx.x] += sb[threadIdx.x + s];
        }}
        __syncthreads();
    }}
    a = sa[0];
    b = sb[0];
    __syncthreads();
}}

// Squared norms of a strided range of w and g, summed over the block.
__device__ __forceinline__ void lars_sqnorms(
        const S* w, const S* g, long long begin, long long end,
        long long stride, C& w_sq, C& g_sq) {{
    C sw = 0, sg = 0;
    for (long long i = begin + threadIdx.x; i < end; i += stride) {{
        C a = lars_load(w, i);
        C b = lars_load(g, i);
        sw += a * a;
        sg += b * b;
    }}
    lars_block_sum2(sw, sg);
    w_sq = sw;
    g_sq = sg;
}}

// Totals of the partial sums [first, last), computed by every block alike.
__device__ __forceinline__ void lars_total(
        const C* partial, long long first, long long last,
        C& w_sq, C& g_sq) {{
    C a = 0, b = 0;
    for (long long k = first + threadIdx.x; k < last; k += LARS_THREADS) {{
        a += partial[2 * k];
        b += partial[2 * k + 1];
    }}
    lars_block_sum2(a, b);
    w_sq = a;
    g_sq = b;
}}

extern "C" __global__ void chainer_lars_sqnorms(
        const S* w, const S* g, long long n, C* partial) {{
    C w_sq, g_sq;
    lars_sqnorms(w, g, (long long)blockIdx.x * LARS_THREADS, n,
                 (long long)gridDim.x * LARS_THREADS, w_sq, g_sq);
    if (threadIdx.x == 0) {{
        partial[2 * blockIdx.x] = w_sq;
        partial[2 * blockIdx.x + 1] = g_sq;
    }}
}}

// g <- r * g + r * loss_scale * weight_decay * w, with the ratio r of the
// unscaled gradient; adapt == 0 gives r = 1.
extern "C" __global__ void chainer_lars_scale_add(
        const S* w, S* g, long long n, const C* partial, int nparts,
        C weight_decay, C eps, C trust_coefficient, C threshold, int adapt,
        C clip_lr, C loss_scale) {{
    C w_sq, g_sq;
    lars_total(partial, 0, nparts, w_sq, g_sq);
    C r = adapt ? chainer_lars_trust_ratio<C>(
        sqrt(w_sq), sqrt(g_sq) / loss_scale, weight_decay, eps,
        trust_coefficient, threshold, 0, clip_lr) : (C)1;
    C c = r * loss_scale * weight_decay;
    for (long long i = (long long)blockIdx.x * LARS_THREADS + threadIdx.x;
         i < n; i += (long long)gridDim.x * LARS_THREADS) {{
        lars_store(g, i, r * lars_load(g, i) + c * lars_load(w, i));
    }}
}}

// One LARS momentum step; nparts == 0 means no layer adaptation (r = 1).
extern "C" __global__ void chainer_lars_momentum(
        S* w, const S* g, S* v, long long n, const C* partial, int nparts,
        C lr, C momentum, C weight_decay, C trust_coefficient, C eps,
        int nesterov) {{
    C r = 1;
    if (nparts > 0) {{
        C w_sq, g_sq;
        lars_total(partial, 0, nparts, w_sq, g_sq);
        r = chainer_lars_trust_ratio<C>(
            sqrt(w_sq), sqrt(g_sq), weight_decay, eps, trust_coefficient,
            (C)0, 1, (C)-1);
    }}
    C a = lr * r;
    C b = a * weight_decay;
    for (long long i = (long long)blockIdx.x * LARS_THREADS + threadIdx.x;
         i < n; i += (long long)gridDim.x * LARS_THREADS) {{
        C wi = lars_load(w, i);
        C u = a * lars_load(g, i) + b * wi;
        C vi = momentum * lars_load(v, i) + u;
        lars_store(v, i, vi);
        lars_store(w, i, wi - (nesterov ? u + momentum * vi : vi));
    }}
}}

// The multi-tensor table (int64 words), for T arrays and B blocks:
//   [0, T)          pointers to the weights
//   [T, 2T)         pointers to the gradients
//   [2T, 3T)        sizes
//   [3T, 4T]        first block of each array, and B
//   [4T+1, 4T+1+B)  array of each block
//   [4T+1+B, 4T+1+2B) first element of each block
//   [4T+1+2B, 5T+1+2B) flags: 1 uses weight decay, 2 uses adaptation

// The array of this block and the range of its elements.
__device__ __forceinline__ void lars_block_range(
        const long long* table, long long T, int nblocks, long long& t,
        long long& begin, long long& end) {{
    t = table[4 * T + 1 + blockIdx.x];
    begin = table[4 * T + 1 + nblocks + blockIdx.x];
    const long long size = table[2 * T + t];
    end = begin + LARS_CHUNK < size ? begin + LARS_CHUNK : size;
}}

extern "C" __global__ void chainer_lars_multi_sqnorms(
        const long long* table, int ntensors, int nblocks, C* partial) {{
    const long long T = ntensors;
    const long long b = blockIdx.x;
    long long t, begin, end;
    lars_block_range(table, T, nblocks, t, begin, end);
    C w_sq, g_sq;
    lars_sqnorms((const S*)table[t], (const S*)table[T + t], begin, end,
                 LARS_THREADS, w_sq, g_sq);
    if (threadIdx.x == 0) {{
        partial[2 * b] = w_sq;
        partial[2 * b + 1] = g_sq;
    }}
}}

extern "C" __global__ void chainer_lars_multi_scale_add(
        const long long* table, int ntensors, int nblocks,
        const C* partial, C weight_decay, C eps, C trust_coefficient,
        C threshold, C clip_lr, C loss_scale) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, nblocks, t, begin, end);
    const long long flags = table[4 * T + 1 + 2 * nblocks + t];
    const C wd = (flags & 1) ? weight_decay : (C)0;
    C w_sq, g_sq;
    lars_total(partial, table[3 * T + t], table[3 * T + t + 1], w_sq, g_sq);
    C r = (flags & 2) ? chainer_lars_trust_ratio<C>(
        sqrt(w_sq), sqrt(g_sq) / loss_scale, wd, eps, trust_coefficient,
        threshold, 0, clip_lr) : (C)1;
    C c = r * loss_scale * wd;
    const S* w = (const S*)table[t];
    S* g = (S*)table[T + t];
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
        lars_store(g, i, r * lars_load(g, i) + c * lars_load(w, i));
    }}
}}
'''

_modules = {}


def source(dtype):
    """The CUDA source of the kernels for arrays of ``dtype``."""
    storage, compute, _ = _TYPES[numpy.dtype(dtype)]
    return _SOURCE.format(
        storage=storage, compute=compute, threads=THREADS, chunk=CHUNK,
        load_store=_LOAD_STORE[storage], trust_ratio=_ratio.CUDA_TRUST_RATIO)


def _kernel(xp, dtype, name):
    """The kernel ``name`` for arrays of ``dtype`` (compiled once a device).

    CuPy loads a module on the device current when a function is first
    taken from it, so modules are kept per device.

    """
    dtype = numpy.dtype(dtype)
    key = (xp, xp.cuda.Device().id, dtype)
    module = _modules.get(key)
    if module is None:
        module = _modules[key] = xp.RawModule(code=source(dtype))
    return module.get_function(name)


def compute_dtype(dtype):
    """The dtype the kernels compute in for arrays of ``dtype``."""
    return _TYPES[numpy.dtype(dtype)][2]


def supports(*arrays):
    """Whether these CuPy arrays can go through the kernels."""
    dtype = arrays[0].dtype
    return dtype in _TYPES and all(
        a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def _blocks(n, per_block, limit):
    return max(1, min(limit, -(-n // per_block)))


def sqnorm_partials(xp, w, g):
    """Partial sums of ``||w||^2`` and ``||g||^2`` (one launch).

    Returns:
        ndarray: Shape ``(2 * k,)``: ``k`` pairs whose sum is the pair of
        squared norms, in the compute dtype.

    """
    n = w.size
    nparts = _blocks(n, THREADS * 4, MAX_PARTS)
    partial = xp.empty(2 * nparts, compute_dtype(w.dtype))
    _kernel(xp, w.dtype, 'chainer_lars_sqnorms')(
        (nparts,), (THREADS,), (w, g, numpy.int64(n), partial))
    return partial


def scale_add_by_ratio(xp, w, g, partial, weight_decay, eps,
                       trust_coefficient, threshold, clip_lr, loss_scale,
                       adapt):
    """``g <- r (g + S wd w)`` with the ratio computed on the device.

    ``partial`` comes from :func:`sqnorm_partials`; ``loss_scale`` is the
    factor ``S`` by which the stored ``g`` exceeds the true gradient.

    """
    n = w.size
    c = compute_dtype(w.dtype).type
    _kernel(xp, w.dtype, 'chainer_lars_scale_add')(
        (_blocks(n, THREADS, MAX_BLOCKS),), (THREADS,),
        (w, g, numpy.int64(n), partial, numpy.int32(partial.size // 2),
         c(weight_decay), c(eps), c(trust_coefficient), c(threshold),
         numpy.int32(bool(adapt)), c(-1.0 if clip_lr is None else clip_lr),
         c(loss_scale)))


def lars_momentum_step(xp, w, g, v, partial, lr, momentum, weight_decay,
                       trust_coefficient, eps, nesterov):
    """One LARS momentum step (one launch); ``partial=None``: ``r = 1``."""
    n = w.size
    if n == 0:
        return
    c = compute_dtype(w.dtype).type
    if partial is None:
        partial = xp.empty(0, c)
    _kernel(xp, w.dtype, 'chainer_lars_momentum')(
        (_blocks(n, THREADS, MAX_BLOCKS),), (THREADS,),
        (w, g, v, numpy.int64(n), partial, numpy.int32(partial.size // 2),
         c(lr), c(momentum), c(weight_decay), c(trust_coefficient), c(eps),
         numpy.int32(bool(nesterov))))


def empty_pinned(xp, shape, dtype):
    """A host array in page-locked memory, as :func:`cupyx.empty_pinned`."""
    dtype = numpy.dtype(dtype)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    memory = xp.cuda.alloc_pinned_memory(count * dtype.itemsize)
    return numpy.frombuffer(memory, dtype, count).reshape(shape)


class MultiTensorTables(object):

    """Device copies of multi-tensor tables, reused while pointers repeat.

    A table is uploaded from pinned memory with an asynchronous copy on the
    current stream, so building one does not wait for the device either.

    Args:
        capacity (int): How many tables to keep (least recently used go).

    Attributes:
        builds (int): How many tables were built, for tests and benchmarks.

    """

    def __init__(self, capacity=8):
        self.capacity = capacity
        self.builds = 0
        self._tables = collections.OrderedDict()

    def get(self, xp, dtype, items):
        """The table for ``items`` (a list of ``(w, g, uses_wd, adapt)``).

        Returns:
            tuple: ``(table, nblocks, first_blocks)`` with ``first_blocks``
            a host list of each array's first block, and ``nblocks`` last.

        """
        key = (xp, numpy.dtype(dtype), xp.cuda.Device().id,
               tuple((w.data.ptr, g.data.ptr, w.size, uses_wd, adapt)
                     for w, g, uses_wd, adapt in items))
        entry = self._tables.get(key)
        if entry is not None:
            self._tables.move_to_end(key)
            return entry[:3]
        entry = self._build(xp, items)
        self.builds += 1
        self._tables[key] = entry
        while len(self._tables) > self.capacity:
            _, old = self._tables.popitem(last=False)
            old[4].synchronize()  # its pinned source must outlive the copy
        return entry[:3]

    @staticmethod
    def _build(xp, items):
        ntensors = len(items)
        sizes = [w.size for w, _, _, _ in items]
        counts = [-(-n // CHUNK) for n in sizes]
        first = [0]
        for count in counts:
            first.append(first[-1] + count)
        nblocks = first[-1]
        words = 5 * ntensors + 1 + 2 * nblocks
        host = empty_pinned(xp, (words,), numpy.int64)
        host[:ntensors] = [w.data.ptr for w, _, _, _ in items]
        host[ntensors:2 * ntensors] = [g.data.ptr for _, g, _, _ in items]
        host[2 * ntensors:3 * ntensors] = sizes
        host[3 * ntensors:4 * ntensors + 1] = first
        block_tensor = numpy.repeat(numpy.arange(ntensors), counts)
        block_start = (numpy.arange(nblocks)
                       - numpy.repeat(first[:-1], counts)) * CHUNK
        base = 4 * ntensors + 1
        host[base:base + nblocks] = block_tensor
        host[base + nblocks:base + 2 * nblocks] = block_start
        host[base + 2 * nblocks:] = [
            int(uses_wd) | 2 * int(adapt) for _, _, uses_wd, adapt in items]
        table = xp.empty(words, numpy.int64)
        stream = xp.cuda.get_current_stream()
        table.set(host, stream)
        return table, nblocks, first, host, stream.record()


def multi_scale_add(xp, tables, items, weight_decay, eps, trust_coefficient,
                    threshold, clip_lr, loss_scale):
    """The hook's rescaling of many arrays of one dtype, in two launches.

    Args:
        xp: The array module of the device (CuPy).
        tables (MultiTensorTables): The table cache to use.
        items (list): ``(w, g, uses_weight_decay, uses_adaptation)`` per
            array, all contiguous, non-empty, of one dtype, on the current
            device.

    Returns:
        list: Per item, a view of the partial sums of its squared norms
        (for the observer).

    """
    dtype = items[0][0].dtype
    table, nblocks, first = tables.get(xp, dtype, items)
    c = compute_dtype(dtype).type
    partial = xp.empty(2 * nblocks, compute_dtype(dtype))
    ntensors = numpy.int32(len(items))
    _kernel(xp, dtype, 'chainer_lars_multi_sqnorms')(
        (nblocks,), (THREADS,), (table, ntensors, numpy.int32(nblocks),
                                 partial))
    _kernel(xp, dtype, 'chainer_lars_multi_scale_add')(
        (nblocks,), (THREADS,),
        (table, ntensors, numpy.int32(nblocks), partial, c(weight_decay),
         c(eps), c(trust_coefficient), c(threshold),
         c(-1.0 if clip_lr is None else clip_lr), c(loss_scale)))
    return [partial[2 * first[k]:2 * first[k + 1]]
            for k in range(len(items))]
