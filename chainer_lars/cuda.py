"""The CUDA executor: two launches per update for a group of any size.

The norms kernel (the last block of each array sums its partials in a fixed
order), then the hook's or the optimizer's step, over a table of pointers
(:class:`Table`) cached by address (:class:`TableCache`), the settings
uploaded from pinned buffers, no synchronisation; float16 computes in
float32. CuPy is reached only through the device's ``xp``: the code runs
unchanged on :mod:`chainer_lars.testing.emulated_cupy`."""

import collections
import operator

import numpy

from chainer_lars import checks
from chainer_lars import layout as L
from chainer_lars import ratio


#: Threads per block, a power of two (the block reductions rely on it).
THREADS = 256
#: Elements per block: 16 a thread, enough to hide the loads' latency.
CHUNK = 16 * THREADS

_SIGNATURE = operator.attrgetter('dtype', 'shape', 'strides')
_SHAPE = operator.attrgetter('shape')
_POINTER = operator.attrgetter('data.ptr')

#: dtype -> (C storage type, C compute type, NumPy compute dtype)
_TYPES = {numpy.dtype(d): (storage, compute, numpy.dtype(c))
          for d, storage, compute, c in (('e', 'unsigned short', 'float', 'f'),
                                         ('f', 'float', 'float', 'f'),
                                         ('d', 'double', 'double', 'd'))}

_SOURCE = r'''
typedef {storage} S;
typedef {gstorage} G;
typedef {compute} C;
#define LARS_THREADS {threads}
#define LARS_CHUNK {chunk}
// A mixed16 group: float32 weights (the masters) and states, float16
// gradients, and the float16 weights written as the masters rounded.
#define LARS_MIXED16 {mixed16}

// Loads in the compute type and stores rounded to nearest; float16 is
// stored as its bits, with the hardware's conversions.
template <typename T>
__device__ __forceinline__ T lars_load(const T* p, long long i) {{
    return p[i];
}}
template <typename T, typename X>
__device__ __forceinline__ void lars_store(T* p, long long i, X x) {{
    p[i] = (T)x;
}}
__device__ __forceinline__ float lars_load(const unsigned short* p,
                                           long long i) {{
    float f;
    asm("{{ cvt.f32.f16 %0, %1; }}" : "=f"(f) : "h"(p[i]));
    return f;
}}
__device__ __forceinline__ void lars_store(unsigned short* p, long long i,
                                           float x) {{
    unsigned short h;
    asm("{{ cvt.rn.f16.f32 %0, %1; }}" : "=h"(h) : "f"(x));
    p[i] = h;
}}

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
//   [2T, 3T)          first states (momentum buffers; 0 for the hook)
//   [3T, 4T)          second states    [4T, 5T)    float16 weights (mixed16)
//   [5T, 6T)          sizes
//   [6T, 7T]          first block of each array, then B
//   [7T+1, 7T+1+B)    array of each block
#define LARS_FIRST(T, t) table[6 * (T) + (t)]

// The settings of array t: one row of LARS_COLUMNS values (the layout of
// chainer_lars/layout.py), uploaded for every update.
{defines}

// The array of this block and the range of its elements.
__device__ __forceinline__ void lars_block_range(
        const long long* table, long long T, long long& t,
        long long& begin, long long& end) {{
    t = table[7 * T + 1 + blockIdx.x];
    begin = ((long long)blockIdx.x - LARS_FIRST(T, t)) * LARS_CHUNK;
    const long long size = table[5 * T + t];
    end = begin + LARS_CHUNK < size ? begin + LARS_CHUNK : size;
}}

// Adds the block's sums a and b to those of array t (partial[]; the block
// that counts last sums them in a fixed order). True in that block, where
// every thread gets the array's sums. done[] counts finished blocks per
// array; it must be 0 before the launch and is 0 again after it.
__device__ __forceinline__ bool lars_array_sum2(
        const long long* table, long long T, long long t, C* partial,
        unsigned int* done, C& a, C& b) {{
    lars_block_sum2(a, b);
    const long long first = LARS_FIRST(T, t);
    const long long last = LARS_FIRST(T, t + 1);
    __shared__ int is_last;
    if (threadIdx.x == 0) {{
        partial[2 * blockIdx.x] = a;
        partial[2 * blockIdx.x + 1] = b;
        // The partials must be visible to the block that counts last.
        __threadfence();
        const unsigned int ticket = atomicAdd(&done[t], 1u);
        is_last = ticket == (unsigned int)(last - first - 1);
    }}
    __syncthreads();
    if (!is_last) {{
        return false;
    }}
    const volatile C* p = partial;
    a = 0;
    b = 0;
    for (long long k = first + threadIdx.x; k < last; k += LARS_THREADS) {{
        a += p[2 * k];
        b += p[2 * k + 1];
    }}
    lars_block_sum2(a, b);
    if (threadIdx.x == 0) {{
        done[t] = 0;
    }}
    return true;
}}

// stats[3t] = the ratio r of array t, stats[3t+1] = ||w||^2 and
// stats[3t+2] = ||g||^2 of g as stored (loss_scale times the gradient;
// mixed16: of g / loss_scale in float32, as its rule divides it).
extern "C" __global__ void chainer_lars_multi_norms(
        const long long* table, long long ntensors, const C* settings,
        C* partial, unsigned int* done, C* stats) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    const S* w = (const S*)table[t];
    const G* g = (const G*)table[T + t];
#if LARS_MIXED16
    const C unscale = settings[LARS_COLUMNS * t + LARS_LOSS_SCALE];
#endif
    C sw = 0, sg = 0;
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
        C a = lars_load(w, i);
#if LARS_MIXED16
        C b = lars_load(g, i) / unscale;
#else
        C b = lars_load(g, i);
#endif
        sw += a * a;
        sg += b * b;
    }}
    if (!lars_array_sum2(table, T, t, partial, done, sw, sg)) {{
        return;
    }}
    if (threadIdx.x == 0) {{
        const C* s = settings + LARS_COLUMNS * t;
#if LARS_MIXED16
        const C g_scale = (C)1;  // sg is of g / loss_scale already
#else
        const C g_scale = s[LARS_LOSS_SCALE];
#endif
        stats[3 * t] = s[LARS_ADAPT] != (C)0 ? chainer_lars_trust_ratio<C>(
            sqrt(sw), sqrt(sg) / g_scale, s[LARS_WEIGHT_DECAY],
            s[LARS_EPS], s[LARS_TRUST_COEFFICIENT], s[LARS_THRESHOLD],
            s[LARS_REQUIRE_GRAD] != (C)0, s[LARS_CLIP_LR]) : (C)1;
        stats[3 * t + 1] = sw;
        stats[3 * t + 2] = sg;
    }}
}}

// The hook: g <- r * g + r * loss_scale * weight_decay * w, which is the
// rescaled gradient still multiplied by the loss scale.
extern "C" __global__ void chainer_lars_multi_scale_add(
        const long long* table, long long ntensors, const C* settings,
        const C* stats) {{
    long long t, begin, end;
    lars_block_range(table, ntensors, t, begin, end);
    const S* w = (const S*)table[t];
    G* g = (G*)table[ntensors + t];
    const C* s = settings + LARS_COLUMNS * t;
    const C r = stats[3 * t];
    const C c = r * s[LARS_LOSS_SCALE] * s[LARS_WEIGHT_DECAY];
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
        lars_store(g, i, r * lars_load(g, i) + c * lars_load(w, i));
    }}
}}

// The optimizer: one LARS momentum step with the ratio r of stats. The
// gradient is divided by the loss scale in place first, as Chainer's
// update rules do, and used as stored (rounded to S).
extern "C" __global__ void chainer_lars_multi_momentum(
        const long long* table, long long ntensors, const C* settings,
        const C* stats) {{
    long long t, begin, end;
    lars_block_range(table, ntensors, t, begin, end);
    S* w = (S*)table[t];
    G* g = (G*)table[ntensors + t];
    S* v = (S*)table[2 * ntensors + t];
    const C* s = settings + LARS_COLUMNS * t;
    const C a = s[LARS_LR] * stats[3 * t];
    const C b = a * s[LARS_WEIGHT_DECAY];
    const C loss_scale = s[LARS_LOSS_SCALE];
    const C momentum = s[LARS_MOMENTUM];
    const bool nesterov = s[LARS_NESTEROV] != (C)0;
#if LARS_MIXED16
    G* h = (G*)table[4 * ntensors + t];
#endif
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {{
#if LARS_MIXED16
        const C gi = lars_load(g, i) / loss_scale;  // g left as it is
#else
        if (loss_scale != (C)1) {{
            lars_store(g, i, lars_load(g, i) / loss_scale);
        }}
        const C gi = lars_load(g, i);
#endif
        const C wi = lars_load(w, i);
        const C u = a * gi + b * wi;
        const C vi = momentum * lars_load(v, i) + u;
        lars_store(v, i, vi);
        const C wn = wi - (nesterov ? u + momentum * vi : vi);
        lars_store(w, i, wn);
#if LARS_MIXED16
        lars_store(h, i, wn);
#endif
    }}
}}
'''

#: LAMB's two kernels (layout.LAMB), after the source above.
_LAMB_SOURCE = r'''
// r = (m / c1) / (sqrt(v / c2) + eps) + wd w of one element.
__device__ __forceinline__ C lamb_direction(C w, C m, C v, const C* s) {
    return (m / s[LARS_CORRECTION1])
        / (sqrt(v / s[LARS_CORRECTION2]) + s[LARS_EPS])
        + s[LARS_WEIGHT_DECAY] * w;
}

#define LAMB_POINTERS(T, t) \
    S* w = (S*)table[t]; \
    S* m = (S*)table[2 * (T) + (t)]; \
    S* v = (S*)table[3 * (T) + (t)]; \
    const C* s = settings + LARS_COLUMNS * (t);

// The gradient unscaled (in place; mixed16: on the fly, g left as it
// is), the moments, and as in chainer_lars_multi_norms, stats[3t] = the
// ratio ||w|| / ||r||, stats[3t+1] = ||w||^2, stats[3t+2] = ||r||^2.
extern "C" __global__ void chainer_lars_lamb_norms(
        const long long* table, long long ntensors, const C* settings,
        C* partial, unsigned int* done, C* stats) {
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    LAMB_POINTERS(T, t)
    G* g = (G*)table[T + t];
    const C loss_scale = s[LARS_LOSS_SCALE];
    const C b1 = s[LARS_BETA1], b2 = s[LARS_BETA2];
    C sw = 0, sr = 0;
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {
#if LARS_MIXED16
        const C gi = lars_load(g, i) / loss_scale;
#else
        if (loss_scale != (C)1) {
            lars_store(g, i, lars_load(g, i) / loss_scale);
        }
        const C gi = lars_load(g, i);
#endif
        lars_store(m, i, b1 * lars_load(m, i) + ((C)1 - b1) * gi);
        lars_store(v, i, b2 * lars_load(v, i) + ((C)1 - b2) * (gi * gi));
        const C wi = lars_load(w, i);
        const C r = lamb_direction(wi, lars_load(m, i), lars_load(v, i), s);
        sw += wi * wi;
        sr += r * r;
    }
    if (lars_array_sum2(table, T, t, partial, done, sw, sr)
            && threadIdx.x == 0) {
        stats[3 * t] = s[LARS_ADAPT] != (C)0 ? chainer_lars_trust_ratio<C>(
            sqrt(sw), sqrt(sr), 0, 0, 1, 0, 1, s[LARS_CLIP_LR]) : (C)1;
        stats[3 * t + 1] = sw;
        stats[3 * t + 2] = sr;
    }
}

// w <- w - lr ratio r (mixed16: and the float16 weight, w rounded).
extern "C" __global__ void chainer_lars_lamb_step(
        const long long* table, long long ntensors, const C* settings,
        const C* stats) {
    long long t, begin, end;
    lars_block_range(table, ntensors, t, begin, end);
    LAMB_POINTERS(ntensors, t)
    const C a = s[LARS_LR] * stats[3 * t];
#if LARS_MIXED16
    G* h = (G*)table[4 * ntensors + t];
#endif
    for (long long i = begin + threadIdx.x; i < end; i += LARS_THREADS) {
        const C wi = lars_load(w, i);
        const C wn = wi - a * lamb_direction(
            wi, lars_load(m, i), lars_load(v, i), s);
        lars_store(w, i, wn);
#if LARS_MIXED16
        lars_store(h, i, wn);
#endif
    }
}
'''

_modules = {}
#: The kernels of an update, by op.
_STEPS = {L.RESCALE: 'chainer_lars_multi_scale_add',
          L.STEP: 'chainer_lars_multi_momentum',
          L.LAMB: 'chainer_lars_lamb_step'}
_NORMS = {L.LAMB: 'chainer_lars_lamb_norms'}


def source(dtype, mixed16=False):
    """The CUDA source of the kernels for arrays of ``dtype`` (with
    ``mixed16``, float32 masters and states with float16 gradients and
    weights)."""
    storage, compute, _ = _TYPES[numpy.dtype(dtype)]
    gstorage = _TYPES[numpy.dtype(numpy.float16)][0] if mixed16 else storage
    return _SOURCE.format(
        storage=storage, gstorage=gstorage, compute=compute,
        threads=THREADS, chunk=CHUNK, defines=L.cuda_defines(),
        mixed16=int(mixed16), trust_ratio=ratio.CUDA_TRUST_RATIO
    ) + _LAMB_SOURCE


def _kernel(xp, dtype, mixed16, name):
    """The kernel ``name`` for ``dtype``, compiled once per device (CuPy
    loads a module on the device current when a function is taken)."""
    dtype = numpy.dtype(dtype)
    key = (xp, xp.cuda.Device().id, dtype, mixed16)
    module = _modules.get(key)
    if module is None:
        module = _modules[key] = xp.RawModule(code=source(dtype, mixed16))
    return module.get_function(name)


def supports(*arrays):
    """Whether these device arrays can go through the kernels as they are."""
    dtype = arrays[0].dtype
    return dtype in _TYPES and checks.direct(dtype, arrays)


def empty_pinned(xp, shape, dtype):
    """A host array in page-locked memory, as :func:`cupyx.empty_pinned`."""
    dtype = numpy.dtype(dtype)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    memory = xp.cuda.alloc_pinned_memory(count * dtype.itemsize)
    return numpy.frombuffer(memory, dtype, count).reshape(shape)


class Table(object):

    """The device table of a set of arrays (its layout is in the source),
    the current ``settings`` rows, and ``stats``: per array ``(r, ||w||^2,
    ||g||^2)`` of the last launch."""

    #: Pinned buffers the settings are uploaded from, in turn: one is
    #: written again only after its copy is done.
    RING = 4

    def __init__(self, xp, dtype, weights, grads, states=(), halves=None):
        ntensors = len(weights)
        sizes = [w.size for w in weights]
        counts = [-(-n // CHUNK) for n in sizes]
        first = numpy.zeros(ntensors + 1, numpy.int64)
        numpy.cumsum(counts, out=first[1:])
        nblocks = int(first[-1])
        host = empty_pinned(xp, (7 * ntensors + 1 + nblocks,), numpy.int64)
        _point(host, ntensors, weights, grads, states, halves)
        host[5 * ntensors:6 * ntensors] = sizes
        self.layout = layout(dtype, weights, states, halves)
        host[6 * ntensors:7 * ntensors + 1] = first
        host[7 * ntensors + 1:] = numpy.repeat(numpy.arange(ntensors), counts)
        self.ntensors, self.nblocks = ntensors, nblocks
        self.compute_dtype = _TYPES[numpy.dtype(dtype)][2]
        self.words = xp.empty(host.size, numpy.int64)
        stream = xp.cuda.get_current_stream()
        self.words.set(host, stream)
        # Each pinned source must outlive its asynchronous copy.
        self._upload = (host, stream.record())
        shape = (ntensors, len(L.COLUMNS))
        self._ring = [[empty_pinned(xp, shape, self.compute_dtype), None]
                      for _ in range(self.RING)]
        self._next = 0
        self.settings = xp.empty(shape, self.compute_dtype)
        self.partial = xp.empty(2 * nblocks, self.compute_dtype)
        self.done = xp.zeros(ntensors, numpy.uint32)
        self.stats = xp.empty((ntensors, 3), self.compute_dtype)
        self._xp = xp

    def set_settings(self, rows):
        """Uploads this update's settings rows."""
        slot = self._ring[self._next]
        self._next = (self._next + 1) % self.RING
        if slot[1] is not None:
            slot[1].synchronize()
        slot[0][...] = rows
        stream = self._xp.cuda.get_current_stream()
        self.settings.set(slot[0], stream)
        slot[1] = stream.record()

    def repoint(self, weights, grads, states=(), halves=None):
        """Points the table at other arrays of its :func:`layout`: only
        the pointers are written and uploaded, nothing is allocated."""
        host, event = self._upload
        event.synchronize()  # the last upload from ``host`` is done
        n = self.ntensors
        _point(host, n, weights, grads, states, halves)
        stream = self._xp.cuda.get_current_stream()
        # In stream order: launches queued with the old pointers read them.
        self.words[:5 * n].set(host[:5 * n], stream)
        self._upload = (host, stream.record())

    def release(self):
        """Waits until no upload needs the table's host buffers."""
        for _, event in [self._upload] + self._ring:
            if event is not None:
                event.synchronize()


def _point(host, n, weights, grads, states, halves):
    """Writes the pointer rows of a table of ``n`` arrays into ``host``."""
    host[:5 * n] = 0
    words = host[:5 * n].reshape(5, n)
    words[0] = list(map(_POINTER, weights))
    words[1] = list(map(_POINTER, grads))
    for k, arrays in enumerate(states):  # per row (v,) or (m, v)
        words[2:2 + len(arrays), k] = list(map(_POINTER, arrays))
    if halves is not None:
        words[4] = list(map(_POINTER, halves))


def layout(dtype, weights, states=(), halves=None):
    """What a table's arrays must share for it to be repointed to them:
    the dtype, the sizes, the states per row, whether there are halves."""
    return (numpy.dtype(dtype), tuple(w.size for w in weights),
            tuple(map(len, states)), halves is None)


class TableCache(object):

    """The tables of the last sets of arrays, by key (least recently used
    go; ``builds`` counts them). When full, a miss repoints the least
    recently used table if it has the arrays' layout (``repoints`` counts
    them): the gradients of a real run are new arrays at every update, and
    their addresses need not repeat."""

    def __init__(self, capacity=8):
        self.capacity = capacity
        self.builds = self.repoints = 0
        self._tables = collections.OrderedDict()

    def get(self, key, xp, dtype, weights, grads, states=(), halves=None):
        """The table of these arrays; ``key`` must change whenever an
        address does."""
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table
        if self._tables and len(self._tables) >= self.capacity:
            oldest, old = next(iter(self._tables.items()))
            if old.layout == layout(dtype, weights, states, halves):
                del self._tables[oldest]
                old.repoint(weights, grads, states, halves)
                self.repoints += 1
                self._tables[key] = old
                return old
        table = Table(xp, dtype, weights, grads, states, halves)
        self.builds += 1
        self._tables[key] = table
        while len(self._tables) > self.capacity:
            self._tables.popitem(last=False)[1].release()
        return table


class _GroupTables(object):

    """A group's tables, weights' signatures, whether every row goes as it
    is, the gradients' shapes of the last check passed and of the current
    one, and the last update's table, rows and loss scales."""

    __slots__ = ('cache', 'signature', 'direct', 'last', 'empty', 'shapes',
                 'now')
    CAPACITY = 4

    def __init__(self, group):
        self.cache = TableCache(capacity=self.CAPACITY)
        # What the gradients must be like: the weights (mixed16: halves).
        self.signature = list(map(_SIGNATURE, group.halves or group.weights))
        halves = group.halves or [None] * len(group)
        self.direct = all(
            w.size and supports(w, *states) and (
                h is None or supports(h))
            for w, states, h in zip(group.weights, group.states, halves))
        self.last, self.empty = None, []
        self.shapes = self.now = None


class CudaExecutor(object):

    """The executor of CUDA devices (see :mod:`chainer_lars.engine`)."""

    def run_unchanged(self, group, grads, op):
        return False

    def prepare(self, group):
        group.tables = _GroupTables(group)

    def changed(self, group, grads):
        """Whether the gradients' shapes differ from those of the last
        :meth:`passed` check (on a GPU, the engine checks sizes and dtypes,
        known from the shapes and the kernels' dtype checks)."""
        tables = group.tables
        try:
            tables.now = list(map(_SHAPE, grads))
        except AttributeError:  # a gradient is None
            tables.now = [None if g is None else g.shape for g in grads]
        return tables.now != tables.shapes

    def passed(self, group):
        tables = group.tables
        tables.shapes = tables.now

    def _select(self, group, grads, op):
        """``(keep, rejected, empty)``: the rows the kernels take (``None``
        for all), those they cannot take as they are, and the empty ones
        (no block would write their stats)."""
        tables = group.tables
        try:
            # Gradients of the weights' dtype, shape and strides: one
            # comparison of lists in the usual case.
            if tables.direct and (list(map(_SIGNATURE, grads))
                                  == tables.signature):
                return None, [], []
        except AttributeError:  # a gradient is None
            pass
        keep, rejected, empty = [], [], []
        halves = group.halves or [None] * len(group)
        for k, (w, g, h) in enumerate(zip(group.weights, grads, halves)):
            states = group.states[k] if op != L.RESCALE else ()
            if (g is None or g.size != w.size or not supports(w, *states)
                    or not supports(g, *(() if h is None else (h,)))
                    or g.dtype != group.gdtype):
                rejected.append(k)
            elif w.size:
                keep.append(k)
            else:
                empty.append(k)
        return keep, rejected, empty

    def run(self, group, grads, op):
        keep, rejected, empty = self._select(group, grads, op)
        tables = group.tables
        tables.empty = empty
        if keep is not None and not keep:
            tables.last = None
            return rejected
        weights, rows, halves = group.weights, group.rows, group.halves
        states = group.states if op != L.RESCALE else ()
        if keep is not None:
            weights = [weights[k] for k in keep]
            grads = [grads[k] for k in keep]
            states = [states[k] for k in keep] if states else ()
            halves = halves and [halves[k] for k in keep]
            rows = rows[keep]
        xp = group.device.xp
        mixed16 = halves is not None
        # The op too: the hook's table has no momentum pointers.
        key = (op, None if keep is None else tuple(keep),
               tuple(map(_POINTER, grads)))
        with group.device.create_context():
            table = tables.cache.get(key, xp, group.dtype, weights, grads,
                                     states, halves)
            table.set_settings(rows)
            args = (table.words, numpy.int64(table.ntensors), table.settings)
            grid = (table.nblocks,), (THREADS,)
            _kernel(xp, group.dtype, mixed16, _NORMS.get(
                op, 'chainer_lars_multi_norms'))(
                *grid, args + (table.partial, table.done, table.stats))
            _kernel(xp, group.dtype, mixed16, _STEPS[op])(
                *grid, args + (table.stats,))
        # The norms of a mixed16 gradient are of g / loss_scale already,
        # LAMB's of its unscaled direction.
        tables.last = (table, slice(None) if keep is None else keep,
                       1.0 if mixed16 or op == L.LAMB
                       else rows[:, L.LOSS_SCALE].copy())
        return rejected

    def observe(self, group):
        """``(ratio, ||w||, ||g||)`` per array, NaN where none was taken;
        one transfer from the device."""
        out = numpy.full((len(group), 3), numpy.nan)
        for k in group.tables.empty:
            # What the CPU loop records for an empty array.
            if group.op != L.RESCALE:
                out[k, 0] = 1.0
                if group.rows[k, L.ADAPT] or group.op == L.LAMB:
                    out[k, 1:] = 0.0
        last = group.tables.last
        if last is None:
            return out
        table, keep, loss_scales = last
        stats = table.stats.get().astype(numpy.float64)
        out[keep, 0] = stats[:, 0]
        out[keep, 1:] = numpy.sqrt(stats[:, 1:])
        out[keep, 2] /= loss_scales
        return out


executor = CudaExecutor()
