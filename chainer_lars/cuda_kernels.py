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
import operator

import numpy

from chainer_lars import ratio


#: Threads per block, a power of two (the block reductions rely on it).
THREADS = 256
#: Elements per block: each thread handles 16, enough to hide the latency
#: of the loads while keeping a ResNet-50 update at a few thousand blocks.
CHUNK = 16 * THREADS

#: Readers of what a launch depends on: an array's dtype, shape and
#: strides, and its device address.
_SIGNATURE = operator.attrgetter('dtype', 'shape', 'strides')
_POINTER = operator.attrgetter('data.ptr')

#: Columns of the per-array settings the kernels read (see the source).
WEIGHT_DECAY, EPS, TRUST_COEFFICIENT, CLIP_LR, LOSS_SCALE, ADAPT, LR, \
    MOMENTUM, NESTEROV = range(9)
SETTINGS = 9

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
//   [5T+1, 5T+1+B)    array of each block
#define LARS_FIRST(T, t) table[4 * (T) + (t)]

// The settings of array t (one row of LARS_SETTINGS values, uploaded for
// every update): weight decay (0 where the array is excluded from it),
// eps, trust coefficient, the LARC clipping rate (negative: none), the
// loss scale, whether the array is adapted (0 or 1), and for the
// optimizer the learning rate, the momentum and Nesterov (0 or 1).
#define LARS_SETTINGS {settings}
#define LARS_WEIGHT_DECAY 0
#define LARS_EPS 1
#define LARS_TRUST_COEFFICIENT 2
#define LARS_CLIP_LR 3
#define LARS_LOSS_SCALE 4
#define LARS_ADAPT 5
#define LARS_LR 6
#define LARS_MOMENTUM 7
#define LARS_NESTEROV 8

// The array of this block and the range of its elements.
__device__ __forceinline__ void lars_block_range(
        const long long* table, long long T, long long& t,
        long long& begin, long long& end) {{
    t = table[5 * T + 1 + blockIdx.x];
    begin = ((long long)blockIdx.x - LARS_FIRST(T, t)) * LARS_CHUNK;
    const long long size = table[3 * T + t];
    end = begin + LARS_CHUNK < size ? begin + LARS_CHUNK : size;
}}

// stats[3t] = the ratio r of array t, stats[3t+1] = ||w||^2 and
// stats[3t+2] = ||g||^2 of g as stored (loss_scale times the gradient).
// done[] counts finished blocks per array; it must be 0 before the launch
// and is 0 again after it. threshold and require_grad are those of the
// form of LARS (the hook's or the optimizer's).
extern "C" __global__ void chainer_lars_multi_norms(
        const long long* table, long long ntensors, const C* settings,
        C* partial, unsigned int* done, C* stats, C threshold,
        int require_grad) {{
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
        const C* s = settings + LARS_SETTINGS * t;
        stats[3 * t] = s[LARS_ADAPT] != (C)0 ? chainer_lars_trust_ratio<C>(
            sqrt(a), sqrt(b) / s[LARS_LOSS_SCALE], s[LARS_WEIGHT_DECAY],
            s[LARS_EPS], s[LARS_TRUST_COEFFICIENT], threshold, require_grad,
            s[LARS_CLIP_LR]) : (C)1;
        stats[3 * t + 1] = a;
        stats[3 * t + 2] = b;
        done[t] = 0;
    }}
}}

// The hook: g <- r * g + r * loss_scale * weight_decay * w, which is the
// rescaled gradient still multiplied by the loss scale.
extern "C" __global__ void chainer_lars_multi_scale_add(
        const long long* table, long long ntensors, const C* settings,
        const C* stats) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    const C* s = settings + LARS_SETTINGS * t;
    const C r = stats[3 * t];
    const C c = r * s[LARS_LOSS_SCALE] * s[LARS_WEIGHT_DECAY];
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
        const long long* table, long long ntensors, const C* settings,
        const C* stats) {{
    const long long T = ntensors;
    long long t, begin, end;
    lars_block_range(table, T, t, begin, end);
    const C* s = settings + LARS_SETTINGS * t;
    const C a = s[LARS_LR] * stats[3 * t];
    const C b = a * s[LARS_WEIGHT_DECAY];
    const C loss_scale = s[LARS_LOSS_SCALE];
    const C momentum = s[LARS_MOMENTUM];
    const bool nesterov = s[LARS_NESTEROV] != (C)0;
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
        settings=SETTINGS,
        load_store=_LOAD_STORE[storage], trust_ratio=ratio.CUDA_TRUST_RATIO)


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

    Args:
        xp: The array module of the device.
        dtype: The arrays' dtype.
        weights, grads (list): The arrays (contiguous, non-empty).
        states (list): The momentum buffers, or ``None`` (the hook).

    Attributes:
        ntensors (int): How many arrays.
        nblocks (int): How many blocks each launch has.
        words: The table on the device (int64).
        settings: Per array, the :data:`SETTINGS` values of the current
            update (compute dtype, shape ``(ntensors, SETTINGS)``), written
            by :meth:`set_settings`.
        stats: Per array, ``(r, ||w||^2, ||g||^2)`` of the last launch of
            :func:`norms` (compute dtype, shape ``(ntensors, 3)``).

    """

    #: Pinned buffers the settings are uploaded from, used in turn: one is
    #: written again only after its copy is done, which it is unless the
    #: device is this many updates behind.
    RING = 4

    def __init__(self, xp, dtype, weights, grads, states=None):
        ntensors = len(weights)
        sizes = [w.size for w in weights]
        counts = [-(-n // CHUNK) for n in sizes]
        first = numpy.zeros(ntensors + 1, numpy.int64)
        numpy.cumsum(counts, out=first[1:])
        nblocks = int(first[-1])
        host = empty_pinned(xp, (5 * ntensors + 1 + nblocks,), numpy.int64)
        host[:ntensors] = [w.data.ptr for w in weights]
        host[ntensors:2 * ntensors] = [g.data.ptr for g in grads]
        host[2 * ntensors:3 * ntensors] = (
            0 if states is None else [v.data.ptr for v in states])
        host[3 * ntensors:4 * ntensors] = sizes
        host[4 * ntensors:5 * ntensors + 1] = first
        host[5 * ntensors + 1:] = numpy.repeat(numpy.arange(ntensors), counts)
        self.ntensors = ntensors
        self.nblocks = nblocks
        self.compute_dtype = compute_dtype(dtype)
        self.words = xp.empty(host.size, numpy.int64)
        stream = xp.cuda.get_current_stream()
        self.words.set(host, stream)
        # Each pinned source must outlive its asynchronous copy.
        self._uploads = [(host, stream.record())]
        self._ring = [
            [empty_pinned(xp, (ntensors, SETTINGS), self.compute_dtype),
             None] for _ in range(self.RING)]
        self._next = 0
        self.settings = xp.empty((ntensors, SETTINGS), self.compute_dtype)
        self.partial = xp.empty(2 * nblocks, self.compute_dtype)
        self.done = xp.zeros(ntensors, numpy.uint32)
        self.stats = xp.empty((ntensors, 3), self.compute_dtype)
        self._xp = xp

    def set_settings(self, rows):
        """Uploads this update's settings (host rows, ``SETTINGS`` each)."""
        slot = self._ring[self._next]
        self._next = (self._next + 1) % self.RING
        if slot[1] is not None:
            slot[1].synchronize()
        slot[0][...] = rows
        stream = self._xp.cuda.get_current_stream()
        self.settings.set(slot[0], stream)
        slot[1] = stream.record()

    def release(self):
        """Waits until no upload needs the table's host buffers."""
        for _, event in self._uploads + self._ring:
            if event is not None:
                event.synchronize()


class TableCache(object):

    """Tables of the sets of arrays seen lately, reused while they repeat.

    The key is every array's address and size, so a table is rebuilt
    exactly when one of them changes: one host-side tuple comparison per
    update while the model's memory stays where it is (CuPy's memory pool
    hands a backward pass's gradients the same blocks every iteration).

    Args:
        capacity (int): How many tables to keep (least recently used go).

    Attributes:
        builds (int): How many tables were built.

    """

    def __init__(self, capacity=8):
        self.capacity = capacity
        self.builds = 0
        self._tables = collections.OrderedDict()

    def get(self, xp, dtype, weights, grads, states=None, key=None):
        """The table of these arrays (see :class:`Table`).

        A caller that knows the weights and states are the same arrays at
        every call (a multi-tensor group) passes its own ``key``, which
        must then change whenever a gradient's address does.

        """
        if key is None:
            key = (xp, numpy.dtype(dtype), xp.cuda.Device().id,
                   tuple(map(_POINTER, weights)), tuple(map(_POINTER, grads)),
                   None if states is None else tuple(map(_POINTER, states)),
                   tuple(w.size for w in weights))
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table
        table = Table(xp, dtype, weights, grads, states)
        self.builds += 1
        self._tables[key] = table
        while len(self._tables) > self.capacity:
            self._tables.popitem(last=False)[1].release()
        return table

    def __getstate__(self):
        # Device tables are not state: a copy builds its own.
        return {'capacity': self.capacity}

    def __setstate__(self, state):
        self.__init__(state['capacity'])

    def __deepcopy__(self, memo):
        return TableCache(self.capacity)


def norms(xp, table, dtype, threshold, require_grad):
    """Launches the norms and ratios of a table's arrays into its stats.

    Reads the table's settings; ``threshold`` and ``require_grad`` are
    those of the form of LARS (see :func:`chainer_lars.ratio.trust_ratio`).

    """
    c = table.compute_dtype.type
    _kernel(xp, dtype, 'chainer_lars_multi_norms')(
        (table.nblocks,), (THREADS,),
        (table.words, numpy.int64(table.ntensors), table.settings,
         table.partial, table.done, table.stats, c(threshold),
         numpy.int32(bool(require_grad))))
    return table.stats


def scale_add(xp, table, dtype):
    """The hook's rescaling, with the ratios of the last :func:`norms`."""
    _kernel(xp, dtype, 'chainer_lars_multi_scale_add')(
        (table.nblocks,), (THREADS,),
        (table.words, numpy.int64(table.ntensors), table.settings,
         table.stats))


def momentum_step(xp, table, dtype):
    """The optimizer's step, with the ratios of the last :func:`norms`."""
    _kernel(xp, dtype, 'chainer_lars_multi_momentum')(
        (table.nblocks,), (THREADS,),
        (table.words, numpy.int64(table.ntensors), table.settings,
         table.stats))


def settings(n, weight_decay, eps, trust_coefficient, loss_scale, adapt,
             clip_lr=None, lr=0.0, momentum=0.0, nesterov=False):
    """The :data:`SETTINGS` rows of ``n`` arrays, on the host.

    Each value is a scalar for all the arrays or a sequence of one per
    array; ``clip_lr`` is ``None`` (or negative) for no clipping, and
    ``lr``, ``momentum`` and ``nesterov`` matter to the optimizer only.

    """
    rows = numpy.empty((n, SETTINGS))
    rows[:, WEIGHT_DECAY] = weight_decay
    rows[:, EPS] = eps
    rows[:, TRUST_COEFFICIENT] = trust_coefficient
    rows[:, CLIP_LR] = -1.0 if clip_lr is None else clip_lr
    rows[:, LOSS_SCALE] = loss_scale
    rows[:, ADAPT] = adapt
    rows[:, LR] = lr
    rows[:, MOMENTUM] = momentum
    rows[:, NESTEROV] = nesterov
    return rows


def hook_update(xp, tables, dtype, weights, grads, rows, form, key=None):
    """The hook's update of these arrays: two launches.

    Args:
        tables (TableCache): Where the arrays' table is kept.
        rows: Their :func:`settings`.
        form (~chainer_lars.ratio.RatioForm): The hook's form.
        key: The table's key, if the caller keeps one (see
            :meth:`TableCache.get`).

    Returns:
        Table: The table, whose ``stats`` hold what the update applied.

    """
    table = tables.get(xp, dtype, weights, grads, key=key)
    table.set_settings(rows)
    norms(xp, table, dtype, form.threshold, form.require_grad)
    scale_add(xp, table, dtype)
    return table


def lars_update(xp, tables, dtype, weights, grads, states, rows, form,
                key=None):
    """The optimizer's update of these arrays: two launches (see
    :func:`hook_update`); ``states`` are the momentum buffers."""
    table = tables.get(xp, dtype, weights, grads, states, key=key)
    table.set_settings(rows)
    norms(xp, table, dtype, form.threshold, form.require_grad)
    momentum_step(xp, table, dtype)
    return table


class CudaExecutor(object):

    """The multi-tensor executor of CUDA devices (see ``multi_tensor``).

    One :func:`norms` and one step launch per update and group, whatever
    the number of arrays; per-array settings (a rule's own ``lr``, the
    exclusions, the loss scale) travel in the table's settings row, so a
    group is never split by them.

    """

    def supports(self, *arrays):
        """Non-empty C-contiguous float16/32/64 arrays of one dtype.

        A zero-size array has no block, so no block would write its stats;
        it takes the per-array path, which leaves it alone.

        """
        return supports(*arrays) and arrays[0].size > 0

    def prepare(self, group):
        group.tables = _GroupTables(group)

    def _select(self, group, grads):
        """``(keep, rejected)``: the positions of the gradients the kernels
        can take, ``None`` for all of them, and of those they cannot."""
        try:
            # Of the weight's dtype, shape and strides (C-contiguous, as the
            # weight is): one comparison of lists in the usual case.
            if list(map(_SIGNATURE, grads)) == group.tables.signature:
                return None, []
        except AttributeError:  # a gradient is None
            pass
        keep, rejected = [], []
        for k, (w, g) in enumerate(zip(group.weights, grads)):
            if (g is not None and g.dtype == w.dtype and g.size == w.size
                    and g.flags.c_contiguous):
                keep.append(k)
            else:
                rejected.append(k)
        return keep, rejected

    def _run(self, group, keep, grads, rows, update, form, states=None):
        """One table update (:func:`lars_update` or :func:`hook_update`) of
        the ``keep`` arrays of the group; the group's table cache is keyed
        by the gradients' addresses, as the weights and states stay."""
        weights = group.weights
        if keep is not None:
            weights = [weights[k] for k in keep]
            grads = [grads[k] for k in keep]
            states = None if states is None else [states[k] for k in keep]
        key = (None if keep is None else tuple(keep),
               tuple(map(_POINTER, grads)))
        args = (weights, grads) if states is None else (
            weights, grads, states)
        with group.device.create_context():
            table = update(group.device.xp, group.tables.cache, group.dtype,
                           *args, rows=rows, form=form, key=key)
        group.tables.last = (table, slice(None) if keep is None else keep,
                             rows[:, LOSS_SCALE])

    def lars_step(self, group, grads, hyper, form):
        from chainer_lars import multi_tensor as mt

        keep, rejected = self._select(group, grads)
        if keep is None or keep:
            h = hyper if keep is None else hyper[keep]
            rows = settings(
                len(h), h[:, mt.LARS_WEIGHT_DECAY], h[:, mt.LARS_EPS],
                h[:, mt.LARS_TRUST_COEFFICIENT], h[:, mt.LARS_LOSS_SCALE],
                h[:, mt.LARS_ADAPT], lr=h[:, mt.LARS_LR],
                momentum=h[:, mt.LARS_MOMENTUM],
                nesterov=h[:, mt.LARS_NESTEROV])
            self._run(group, keep, grads, rows, lars_update, form,
                      group.tables.momentum)
        return rejected

    def hook_rescale(self, group, grads, hyper, form, eps,
                     trust_coefficient):
        from chainer_lars import multi_tensor as mt

        keep, rejected = self._select(group, grads)
        if keep is None or keep:
            h = hyper if keep is None else hyper[keep]
            rows = settings(
                len(h), h[:, mt.HOOK_WEIGHT_DECAY], eps,
                trust_coefficient, h[:, mt.HOOK_LOSS_SCALE],
                h[:, mt.HOOK_ADAPT], clip_lr=h[:, mt.HOOK_CLIP_LR])
            self._run(group, keep, grads, rows, hook_update, form)
        return rejected

    def observe(self, group):
        """``(ratio, ||w||, ||g||)`` per array, NaN where none was taken.

        One transfer from the device per call.

        """
        last = group.tables.last
        out = numpy.full((len(group), 3), numpy.nan)
        if last is None:
            return out
        table, keep, loss_scales = last
        stats = table.stats.get().astype(numpy.float64)
        out[keep, 0] = stats[:, 0]
        out[keep, 1] = numpy.sqrt(stats[:, 1])
        out[keep, 2] = numpy.sqrt(stats[:, 2]) / loss_scales
        return out


class _GroupTables(object):

    """What a :class:`CudaExecutor` keeps for a group: its tables, the
    weights' signatures and momentum buffers, and the table and rows of
    the last update (for ``observe``)."""

    __slots__ = ('cache', 'signature', 'momentum', 'last')

    def __init__(self, group):
        self.cache = TableCache(capacity=4)
        self.signature = list(map(_SIGNATURE, group.weights))
        self.momentum = [s[0] if s else None for s in group.states]
        self.last = None


#: The one :class:`CudaExecutor` (it keeps nothing of its own).
executor = CudaExecutor()
