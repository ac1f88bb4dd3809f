"""CUDA kernels of chainer-lars (CuPy RawModule, built once per dtype).

Two launches update any number of arrays of one dtype on one device, with
cost linear in their total size:

1. ``chainer_lars_multi_norms``: every block takes a chunk of
   :data:`CHUNK` elements of one array and writes the chunk's partial sums
   of ``||w||^2`` and ``||g||^2``; the last block of each array to finish
   (counted with an atomic) sums that array's partials, once, and writes
   its ratio and squared norms to a small per-array ``stats`` array on the
   device. The sums run in a fixed order, whichever block is last, so the
   result is deterministic.
2. an elementwise pass over the same chunks that reads each array's ratio:
   ``chainer_lars_multi_scale_add`` (the hook: ``g <- r g + r S wd w``) or
   ``chainer_lars_multi_momentum`` (the optimizer's fused momentum step).

The arrays are found through a table of pointers (:class:`Table`), uploaded
once and cached while the arrays stay where they are (CuPy's memory pool
hands gradients the same blocks every iteration). The ratio never reaches
the host and nothing synchronises: ``stats`` is what the observers read,
on demand.

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
#: Elements per block: each thread handles 16, enough to hide the latency
#: of the loads while keeping a ResNet-50 update at a few thousand blocks.
CHUNK = 16 * THREADS

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

// The table (int64 words) of T arrays split into B blocks:
//   [0, T)            weights          [T, 2T)     gradients
//   [2T, 3T)          momentum buffers (the optimizer; 0 for the hook)
//   [3T, 4T)          sizes
//   [4T, 5T]          first block of each array, then B
//   [5T+1, 6T+1)      flags: 1 uses weight decay, 2 uses adaptation
//   [6T+1, 6T+1+B)    array of each block
#define LARS_FIRST(T, t) table[4 * (T) + (t)]
#define LARS_FLAGS(T, t) table[5 * (T) + 1 + (t)]

// The array of this block and the range of its elements.
__device__ __forceinline__ void lars_block_range(
        const long long* table, long long T, long long& t,
        long long& begin, long long& end) {{
    t = table[6 * T + 1 + blockIdx.x];
    begin = ((long long)blockIdx.x - LARS_FIRST(T, t)) * LARS_CHUNK;
    const long long size = table[3 * T + t];
    end = begin + LARS_CHUNK < size ? begin + LARS_CHUNK : size;
}}

// stats[3t] = the ratio r of array t, stats[3t+1] = ||w||^2 and
// stats[3t+2] = ||g||^2 of g as stored (loss_scale times the gradient).
// done[] counts finished blocks per array; it must be 0 before the launch
// and is 0 again after it.
extern "C" __global__ void chainer_lars_multi_norms(
        const long long* table, long long ntensors, C* partial,
        unsigned int* done, C* stats, C weight_decay, C eps,
        C trust_coefficient, C threshold, int require_grad, C clip_lr,
        C loss_scale) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    const S* w = (const S*)table[t];
    const S* g = (const S*)table[T + t];
    C sw = 0, sg = 0;
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
        C a = lars_load(w, i);
        C b = lars_load(g, i);
        sw += a * a;
        sg += b * b;
    }}
    lars_block_sum2(sw, sg);
    const long long first = LARS_FIRST(T, t);
    const long long last = LARS_FIRST(T, t + 1);
    __shared__ int is_last;
    if (threadIdx.x == 0) {{
        partial[2 * blockIdx.x] = sw;
        partial[2 * blockIdx.x + 1] = sg;
        // The partials must be visible to the block that counts last.
        __threadfence();
        const unsigned int ticket = atomicAdd(&done[t], 1u);
        is_last = ticket == (unsigned int)(last - first - 1);
    }}
    __syncthreads();
    if (!is_last) {{
        return;
    }}
    const volatile C* p = partial;
    C a = 0, b = 0;
    for (long long k = first + threadIdx.x; k < last; k += LARS_THREADS) {{
        a += p[2 * k];
        b += p[2 * k + 1];
    }}
    lars_block_sum2(a, b);
    if (threadIdx.x == 0) {{
        const long long flags = LARS_FLAGS(T, t);
        const C wd = (flags & 1) ? weight_decay : (C)0;
        stats[3 * t] = (flags & 2) ? chainer_lars_trust_ratio<C>(
            sqrt(a), sqrt(b) / loss_scale, wd, eps, trust_coefficient,
            threshold, require_grad, clip_lr) : (C)1;
        stats[3 * t + 1] = a;
        stats[3 * t + 2] = b;
        done[t] = 0;
    }}
}}

// The hook: g <- r * g + r * loss_scale * weight_decay * w, which is the
// rescaled gradient still multiplied by the loss scale.
extern "C" __global__ void chainer_lars_multi_scale_add(
        const long long* table, long long ntensors, const C* stats,
        C weight_decay, C loss_scale) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    const C r = stats[3 * t];
    const C c = (LARS_FLAGS(T, t) & 1) ? r * loss_scale * weight_decay
                                       : (C)0;
    const S* w = (const S*)table[t];
    S* g = (S*)table[T + t];
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
        lars_store(g, i, r * lars_load(g, i) + c * lars_load(w, i));
    }}
}}

// The optimizer: one LARS momentum step with the ratio r of stats. The
// gradient is divided by the loss scale in place first, as Chainer's
// update rules do, and used as stored (rounded to S).
extern "C" __global__ void chainer_lars_multi_momentum(
        const long long* table, long long ntensors, const C* stats, C lr,
        C momentum, C weight_decay, C loss_scale, int nesterov) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    const C a = lr * stats[3 * t];
    const C b = (LARS_FLAGS(T, t) & 1) ? a * weight_decay : (C)0;
    S* w = (S*)table[t];
    S* g = (S*)table[T + t];
    S* v = (S*)table[2 * T + t];
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
        if (loss_scale != (C)1) {{
            lars_store(g, i, lars_load(g, i) / loss_scale);
        }}
        const C gi = lars_load(g, i);
        const C wi = lars_load(w, i);
        const C u = a * gi + b * wi;
        const C vi = momentum * lars_load(v, i) + u;
        lars_store(v, i, vi);
        lars_store(w, i, wi - (nesterov ? u + momentum * vi : vi));
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
    """Whether these device arrays can go through the kernels."""
    dtype = arrays[0].dtype
    return dtype in _TYPES and all(
        a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def empty_pinned(xp, shape, dtype):
    """A host array in page-locked memory, as :func:`cupyx.empty_pinned`."""
    dtype = numpy.dtype(dtype)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    memory = xp.cuda.alloc_pinned_memory(count * dtype.itemsize)
    return numpy.frombuffer(memory, dtype, count).reshape(shape)


class Table(object):

    """The device table of one set of arrays, and its work buffers.

    Attributes:
        ntensors (int): How many arrays.
        nblocks (int): How many blocks each launch has.
        words: The table on the device (int64).
        partial: Per-block partial sums (compute dtype, ``2 * nblocks``).
        done: Per-array block counters (uint32, zero between launches).
        stats: Per array, ``(r, ||w||^2, ||g||^2)`` of the last launch of
            :func:`norms` (compute dtype, shape ``(ntensors, 3)``).

    """

    def __init__(self, xp, dtype, items):
        ntensors = len(items)
        sizes = [w.size for w, _, _, _ in items]
        counts = [-(-n // CHUNK) for n in sizes]
        first = numpy.zeros(ntensors + 1, numpy.int64)
        numpy.cumsum(counts, out=first[1:])
        nblocks = int(first[-1])
        host = empty_pinned(xp, (6 * ntensors + 1 + nblocks,), numpy.int64)
        host[:ntensors] = [w.data.ptr for w, _, _, _ in items]
        host[ntensors:2 * ntensors] = [g.data.ptr for _, g, _, _ in items]
        host[2 * ntensors:3 * ntensors] = [
            0 if v is None else v.data.ptr for _, _, v, _ in items]
        host[3 * ntensors:4 * ntensors] = sizes
        host[4 * ntensors:5 * ntensors + 1] = first
        host[5 * ntensors + 1:6 * ntensors + 1] = [
            flags for _, _, _, flags in items]
        host[6 * ntensors + 1:] = numpy.repeat(
            numpy.arange(ntensors), counts)
        self.ntensors = ntensors
        self.nblocks = nblocks
        self.words = xp.empty(host.size, numpy.int64)
        stream = xp.cuda.get_current_stream()
        self.words.set(host, stream)
        # The pinned source must outlive the asynchronous copy.
        self._host = host
        self._uploaded = stream.record()
        c = compute_dtype(dtype)
        self.partial = xp.empty(2 * nblocks, c)
        self.done = xp.zeros(ntensors, numpy.uint32)
        self.stats = xp.empty((ntensors, 3), c)

    def release(self):
        """Waits until the table's upload no longer needs its host copy."""
        self._uploaded.synchronize()


def flags(uses_weight_decay, uses_adaptation):
    """The table's flag word of an array."""
    return int(bool(uses_weight_decay)) | 2 * int(bool(uses_adaptation))


class TableCache(object):

    """Tables of the sets of arrays seen lately, reused while they repeat.

    The key is every array's address and size and its flags, so a table is
    rebuilt exactly when one of them changes: one host-side tuple
    comparison per update while the model's memory stays where it is.

    Args:
        capacity (int): How many tables to keep (least recently used go).

    Attributes:
        builds (int): How many tables were built.

    """

    def __init__(self, capacity=8):
        self.capacity = capacity
        self.builds = 0
        self._tables = collections.OrderedDict()

    def get(self, xp, dtype, items):
        """The table of ``items``: ``(w, g, v or None, flags)`` per array.

        All arrays are contiguous, non-empty, of ``dtype`` and on the
        current device.

        """
        key = (xp, numpy.dtype(dtype), xp.cuda.Device().id,
               tuple((w.data.ptr, g.data.ptr,
                      0 if v is None else v.data.ptr, w.size, f)
                     for w, g, v, f in items))
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table
        table = Table(xp, dtype, items)
        self.builds += 1
        self._tables[key] = table
        while len(self._tables) > self.capacity:
            self._tables.popitem(last=False)[1].release()
        return table

    def __getstate__(self):
        # Device tables are not state: a copy builds its own.
        return {'capacity': self.capacity, 'builds': 0}

    def __setstate__(self, state):
        self.__init__(state['capacity'])

    def __deepcopy__(self, memo):
        return TableCache(self.capacity)


def norms(xp, table, dtype, weight_decay, eps, trust_coefficient, threshold,
          require_grad, clip_lr, loss_scale):
    """Launches the norms and ratios of a table's arrays into its stats.

    ``clip_lr`` is ``None`` for no clipping; ``loss_scale`` is the factor by
    which the stored gradients exceed the true ones.

    """
    c = compute_dtype(dtype).type
    _kernel(xp, dtype, 'chainer_lars_multi_norms')(
        (table.nblocks,), (THREADS,),
        (table.words, numpy.int64(table.ntensors), table.partial,
         table.done, table.stats, c(weight_decay), c(eps),
         c(trust_coefficient), c(threshold), numpy.int32(bool(require_grad)),
         c(-1.0 if clip_lr is None else clip_lr), c(loss_scale)))
    return table.stats


def scale_add(xp, table, dtype, weight_decay, loss_scale):
    """The hook's rescaling, with the ratios of the last :func:`norms`."""
    c = compute_dtype(dtype).type
    _kernel(xp, dtype, 'chainer_lars_multi_scale_add')(
        (table.nblocks,), (THREADS,),
        (table.words, numpy.int64(table.ntensors), table.stats,
         c(weight_decay), c(loss_scale)))


def momentum_step(xp, table, dtype, lr, momentum, weight_decay, loss_scale,
                  nesterov):
    """The optimizer's step, with the ratios of the last :func:`norms`."""
    c = compute_dtype(dtype).type
    _kernel(xp, dtype, 'chainer_lars_multi_momentum')(
        (table.nblocks,), (THREADS,),
        (table.words, numpy.int64(table.ntensors), table.stats, c(lr),
         c(momentum), c(weight_decay), c(loss_scale),
         numpy.int32(bool(nesterov))))
