"""The CUDA executor: a group's update uploads its addresses and settings
(pinned, asynchronously), then two kernels; CuPy only via ``device.xp``."""

import operator

import numpy

from chainer_lars import checks
from chainer_lars import layout as L
from chainer_lars import ratio


#: Threads per block (a power of two: the reductions), elements per block.
THREADS = 256
CHUNK = 32 * THREADS

_SIGNATURE = operator.attrgetter('dtype', 'shape', 'strides', 'data.device_id')
_POINTER = operator.attrgetter('data.ptr')
_RETIRED = []  # dead states' pinned buffers, until their copies are done

#: dtype -> (C storage type, C compute type, NumPy compute dtype)
_TYPES = {numpy.dtype('e'): ('unsigned short', 'float', numpy.dtype('f')),
          numpy.dtype('f'): ('float', 'float', numpy.dtype('f')),
          numpy.dtype('d'): ('double', 'double', numpy.dtype('d'))}

_SOURCE = r'''
typedef {storage} S;
typedef {gstorage} G;
typedef {compute} C;
#define LARS_THREADS {threads}
#define LARS_CHUNK {chunk}
#define LARS_VEC (16 / (int)sizeof(S))  // elements in 16 bytes of S
#define LARS_MIXED16 {mixed16}
#define LARS_COUNT_ROUNDED {count}

// To the compute type and back, rounded to nearest (float16 as its bits).
template <typename T>
__device__ __forceinline__ C lars_c(T x) {{ return (C)x; }}
__device__ __forceinline__ C lars_c(unsigned short h) {{
    float f;
    asm("{{ cvt.f32.f16 %0, %1; }}" : "=f"(f) : "h"(h));
    return f;
}}
template <typename T>
__device__ __forceinline__ void lars_s(T& y, C x) {{ y = (T)x; }}
__device__ __forceinline__ void lars_s(unsigned short& y, C x) {{
    asm("{{ cvt.rn.f16.f32 %0, %1; }}" : "=h"(y) : "f"((float)x));
}}

// n <= LARS_VEC elements from i: one 16-byte access where p (packed).
template <typename T> struct alignas(sizeof(T) * LARS_VEC) lars_pack {{
    T v[LARS_VEC];
}};
template <typename T> __device__ __forceinline__ void lars_get(
        const T* a, long long i, int n, bool p, C* x) {{
    if (p) {{
        const lars_pack<T> v = *(const lars_pack<T>*)(a + i);
        for (int j = 0; j < LARS_VEC; ++j) x[j] = lars_c(v.v[j]);
    }} else {{
        for (int j = 0; j < n; ++j) x[j] = lars_c(a[i + j]);
    }}
}}
template <typename T> __device__ __forceinline__ void lars_put(
        T* a, long long i, int n, bool p, const C* x) {{
    if (p) {{
        lars_pack<T> v;
        for (int j = 0; j < LARS_VEC; ++j) lars_s(v.v[j], x[j]);
        *(lars_pack<T>*)(a + i) = v;
    }} else {{
        for (int j = 0; j < n; ++j) lars_s(a[i + j], x[j]);
    }}
}}
template <typename T> __device__ __forceinline__ bool lars_aligned(const T* a)
{{ return (unsigned long long)a % (sizeof(T) * LARS_VEC) == 0; }}

{trust_ratio}

// Sums a and b over the block in a fixed order, for every thread.
__device__ __forceinline__ void lars_block_sum2(C& a, C& b) {{
    __shared__ C sa[LARS_THREADS], sb[LARS_THREADS];
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

// words (T arrays): T weights, gradients (0: left), states, states, what a
// mixed16 row writes; T rows of LARS_COLUMNS settings of C. blocks: each
// array's first block and B (T + 1), each block's array (B), sizes (T).
{defines}

// This block's array t, range and settings s; false where t is left.
__device__ __forceinline__ bool lars_block_range(
        const long long* words, const long long* blocks, long long T,
        long long& t, long long& begin, long long& end, const C*& s) {{
    const long long B = blocks[T];
    t = blocks[T + 1 + blockIdx.x];
    begin = ((long long)blockIdx.x - blocks[t]) * LARS_CHUNK;
    const long long size = blocks[T + 1 + B + t];
    end = begin + LARS_CHUNK < size ? begin + LARS_CHUNK : size;
    s = (const C*)(words + 5 * T) + LARS_COLUMNS * t;
    return words[T + t] != 0;
}}

// The kernels' start; their loop over vectors of n elements from i.
#define LARS_BLOCK \
    long long t, begin, end; \
    const C* s; \
    if (!lars_block_range(words, blocks, T, t, begin, end, s)) return;
#define LARS_FOR_EACH(i, n, p) \
    for (long long i = begin + threadIdx.x * LARS_VEC; i < end; \
         i += LARS_THREADS * LARS_VEC) \
        for (int n = end - i < LARS_VEC ? (int)(end - i) : LARS_VEC, \
             p = packed && n == LARS_VEC, once = 1; once; once = 0)

// Adds the block's sums to array t's partials; true in thread 0 of the
// block that counts last (done[t]), which writes the array's sums (fixed
// order) to stats and restarts its rounded-away count: the ratio is left.
__device__ __forceinline__ bool lars_array_sum2(
        const long long* blocks, long long t, C* partial, unsigned int* done,
        C* stats, unsigned int* rounded, C& a, C& b) {{
    lars_block_sum2(a, b);
    const long long first = blocks[t], last = blocks[t + 1];
    __shared__ int is_last;
    if (threadIdx.x == 0) {{
        partial[2 * blockIdx.x] = a;
        partial[2 * blockIdx.x + 1] = b;
        __threadfence();  // visible to the block that counts last
        is_last = atomicAdd(&done[t], 1u) == (unsigned int)(last - first - 1);
    }}
    __syncthreads();
    if (!is_last) return false;
    const volatile C* q = partial;
    a = b = 0;
    for (long long k = first + threadIdx.x; k < last; k += LARS_THREADS) {{
        a += q[2 * k];
        b += q[2 * k + 1];
    }}
    lars_block_sum2(a, b);
    if (threadIdx.x != 0) return false;
    done[t] = 0;
    stats[3 * t + 1] = a;
    stats[3 * t + 2] = b;
    rounded[t] = 0;
    return true;
}}

// Adds the block's float16 weights whose step rounded away to rounded[t].
__device__ __forceinline__ void lars_count(unsigned int* rounded,
                                           long long t, C lost) {{
#if LARS_COUNT_ROUNDED
    C none = 0;
    lars_block_sum2(lost, none);
    if (threadIdx.x == 0 && lost > (C)0) {{
        atomicAdd(&rounded[t], (unsigned int)lost);
    }}
#endif
}}

// stats: the ratio, ||w||^2, ||g||^2 (of g as stored; mixed16: g / s).
extern "C" __global__ void chainer_lars_multi_norms(
        const long long* words, const long long* blocks, long long T,
        C* partial, unsigned int* done, C* stats, unsigned int* rounded) {{
    LARS_BLOCK
    const S* w = (const S*)words[t];
    const G* g = (const G*)words[T + t];
    const bool packed = lars_aligned(w) && lars_aligned(g);
    const C unscale = LARS_MIXED16 ? s[LARS_LOSS_SCALE] : (C)1;
    const C g_scale = LARS_MIXED16 ? (C)1 : s[LARS_LOSS_SCALE];
    C sw = 0, sg = 0;
    LARS_FOR_EACH(i, n, p) {{
        C a[LARS_VEC], b[LARS_VEC];
        lars_get(w, i, n, p, a);
        lars_get(g, i, n, p, b);
        for (int j = 0; j < n; ++j) {{
            b[j] = b[j] / unscale;
            sw += a[j] * a[j];
            sg += b[j] * b[j];
        }}
    }}
    if (lars_array_sum2(blocks, t, partial, done, stats, rounded, sw, sg)) {{
        stats[3 * t] = s[LARS_ADAPT] != (C)0 ? chainer_lars_trust_ratio<C>(
            sqrt(sw), sqrt(sg) / g_scale, s[LARS_WEIGHT_DECAY], s[LARS_EPS],
            s[LARS_TRUST_COEFFICIENT], s[LARS_THRESHOLD],
            s[LARS_REQUIRE_GRAD] != (C)0, s[LARS_CLIP_LR]) : (C)1;
    }}
}}

// The hook: g <- r g + r s wd w (s: the loss scale in g); mixed16:
// x <- r (g / s) + r wd w, its rule's gradient.
extern "C" __global__ void chainer_lars_multi_scale_add(
        const long long* words, const long long* blocks, long long T,
        const C* stats, unsigned int* rounded) {{
    LARS_BLOCK
    const S* w = (const S*)words[t];
    G* g = (G*)words[T + t];
    S* x = LARS_MIXED16 ? (S*)words[4 * T + t] : (S*)g;  // written
    const C r = stats[3 * t];
    const C unscale = LARS_MIXED16 ? s[LARS_LOSS_SCALE] : (C)1;
    const C c = r * (LARS_MIXED16 ? (C)1 : s[LARS_LOSS_SCALE])
        * s[LARS_WEIGHT_DECAY];
    const bool packed = lars_aligned(w) && lars_aligned(g) && lars_aligned(x);
    LARS_FOR_EACH(i, n, p) {{
        C a[LARS_VEC], b[LARS_VEC];
        lars_get(w, i, n, p, a);
        lars_get(g, i, n, p, b);
        for (int j = 0; j < n; ++j) b[j] = r * (b[j] / unscale) + c * a[j];
        lars_put(x, i, n, p, b);
    }}
}}

// g / loss_scale: in place and as stored, as in Chainer (mixed16: on the fly).
__device__ __forceinline__ void lars_unscaled(
        G* g, long long i, int n, bool p, C loss_scale, C* x) {{
    lars_get(g, i, n, p, x);
    for (int j = 0; j < n; ++j) x[j] = x[j] / loss_scale;
#if !LARS_MIXED16
    if (loss_scale != (C)1) {{
        lars_put(g, i, n, p, x);
        lars_get(g, i, n, p, x);  // as stored
    }}
#endif
}}

// Writes w (mixed16: and h); lost counts float16 steps rounded away.
__device__ __forceinline__ void lars_write(
        S* w, G* h, long long i, int n, bool p, const C* wi, const C* wn,
        C& lost) {{
    lars_put(w, i, n, p, wn);
#if LARS_MIXED16
    lars_put(h, i, n, p, wn);
#elif LARS_COUNT_ROUNDED
    C stored[LARS_VEC];
    lars_get(w, i, n, p, stored);
    for (int j = 0; j < n; ++j) lost += stored[j] == wi[j] && wn[j] != wi[j];
#endif
}}

// Array t's w, g, states m and v (LARS's: m), what a mixed16 row writes.
#define LARS_POINTERS \
    S* w = (S*)words[t]; \
    G* g = (G*)words[T + t]; \
    S* m = (S*)words[2 * T + t]; \
    S* v = (S*)words[3 * T + t]; \
    G* h = (G*)words[4 * T + t]; \
    const bool packed = lars_aligned(w) && lars_aligned(g) \
        && lars_aligned(m) && lars_aligned(v) && lars_aligned(h);

// The optimizer: one LARS momentum step with the ratio r of stats.
extern "C" __global__ void chainer_lars_multi_momentum(
        const long long* words, const long long* blocks, long long T,
        const C* stats, unsigned int* rounded) {{
    LARS_BLOCK
    LARS_POINTERS  // (v: no second state, a null pointer never read)
    const C a = s[LARS_LR] * stats[3 * t], b = a * s[LARS_WEIGHT_DECAY];
    const C momentum = s[LARS_MOMENTUM];
    const bool nesterov = s[LARS_NESTEROV] != (C)0;
    C lost = 0;
    LARS_FOR_EACH(i, n, p) {{
        C wi[LARS_VEC], gi[LARS_VEC], mi[LARS_VEC], wn[LARS_VEC];
        lars_unscaled(g, i, n, p, s[LARS_LOSS_SCALE], gi);
        lars_get(w, i, n, p, wi);
        lars_get(m, i, n, p, mi);
        for (int j = 0; j < n; ++j) {{
            const C u = a * gi[j] + b * wi[j];
            mi[j] = momentum * mi[j] + u;
            wn[j] = wi[j] - (nesterov ? u + momentum * mi[j] : mi[j]);
        }}
        lars_put(m, i, n, p, mi);
        lars_write(w, h, i, n, p, wi, wn, lost);
    }}
    lars_count(rounded, t, lost);
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

// The moments, and stats: the ratio ||w|| / ||r||, ||w||^2, ||r||^2.
extern "C" __global__ void chainer_lars_lamb_norms(
        const long long* words, const long long* blocks, long long T,
        C* partial, unsigned int* done, C* stats, unsigned int* rounded) {
    LARS_BLOCK
    LARS_POINTERS
    const C b1 = s[LARS_BETA1], b2 = s[LARS_BETA2];
    C sw = 0, sr = 0;
    LARS_FOR_EACH(i, n, p) {
        C wi[LARS_VEC], gi[LARS_VEC], mi[LARS_VEC], vi[LARS_VEC];
        lars_unscaled(g, i, n, p, s[LARS_LOSS_SCALE], gi);
        lars_get(m, i, n, p, mi);
        lars_get(v, i, n, p, vi);
        for (int j = 0; j < n; ++j) {
            mi[j] = b1 * mi[j] + ((C)1 - b1) * gi[j];
            vi[j] = b2 * vi[j] + ((C)1 - b2) * (gi[j] * gi[j]);
        }
        lars_put(m, i, n, p, mi);
        lars_put(v, i, n, p, vi);
        lars_get(m, i, n, p, mi);  // as stored
        lars_get(v, i, n, p, vi);
        lars_get(w, i, n, p, wi);
        for (int j = 0; j < n; ++j) {
            const C r = lamb_direction(wi[j], mi[j], vi[j], s);
            sw += wi[j] * wi[j];
            sr += r * r;
        }
    }
    if (lars_array_sum2(blocks, t, partial, done, stats, rounded, sw, sr)) {
        stats[3 * t] = s[LARS_ADAPT] != (C)0 ? chainer_lars_trust_ratio<C>(
            sqrt(sw), sqrt(sr), 0, 0, 1, 0, 1, s[LARS_CLIP_LR]) : (C)1;
    }
}

// w <- w - lr ratio r (mixed16: and the float16 weight, w rounded).
extern "C" __global__ void chainer_lars_lamb_step(
        const long long* words, const long long* blocks, long long T,
        const C* stats, unsigned int* rounded) {
    LARS_BLOCK
    LARS_POINTERS
    const C a = s[LARS_LR] * stats[3 * t];
    C lost = 0;
    LARS_FOR_EACH(i, n, p) {
        C wi[LARS_VEC], mi[LARS_VEC], vi[LARS_VEC], wn[LARS_VEC];
        lars_get(w, i, n, p, wi);
        lars_get(m, i, n, p, mi);
        lars_get(v, i, n, p, vi);
        for (int j = 0; j < n; ++j) {
            wn[j] = wi[j] - a * lamb_direction(wi[j], mi[j], vi[j], s);
        }
        lars_write(w, h, i, n, p, wi, wn, lost);
    }
    lars_count(rounded, t, lost);
}
'''

_modules = {}
#: The kernels of an update, by op: the norms, then the step.
_KERNELS = {
    L.RESCALE: ('chainer_lars_multi_norms', 'chainer_lars_multi_scale_add'),
    L.STEP: ('chainer_lars_multi_norms', 'chainer_lars_multi_momentum'),
    L.LAMB: ('chainer_lars_lamb_norms', 'chainer_lars_lamb_step')}


def source(dtype, mixed16=False):
    """The CUDA source of the kernels for arrays of ``dtype`` (with
    ``mixed16``, float32 masters and states with float16 gradients)."""
    storage, compute, _ = _TYPES[numpy.dtype(dtype)]
    gstorage = _TYPES[numpy.dtype(numpy.float16)][0] if mixed16 else storage
    return _SOURCE.format(
        storage=storage, gstorage=gstorage, compute=compute, threads=THREADS,
        chunk=CHUNK, mixed16=int(mixed16), trust_ratio=ratio.CUDA_TRUST_RATIO,
        count=int(numpy.dtype(dtype) == numpy.float16 and not mixed16),
        defines='\n'.join('#define LARS_{} {}'.format(name.upper(), k)
                          for k, name in enumerate(L.COLUMNS + ('columns',)))
    ) + _LAMB_SOURCE


def _kernels(xp, group):
    """A group's two kernels, compiled once per device and dtypes."""
    key = (xp, xp.cuda.Device().id, group.dtype, group.mixed16)
    if key not in _modules:
        _modules[key] = xp.RawModule(code=source(group.dtype, group.mixed16))
    return [_modules[key].get_function(name) for name in _KERNELS[group.op]]


def supports(*arrays):
    """Whether these device arrays can go through the kernels as they are."""
    return arrays[0].dtype in _TYPES and checks.direct(arrays[0].dtype, arrays)


def empty_pinned(xp, size, dtype):
    """A host array in page-locked memory, as :func:`cupyx.empty_pinned`."""
    memory = xp.cuda.alloc_pinned_memory(size * numpy.dtype(dtype).itemsize)
    return numpy.frombuffer(memory, dtype, size)


class _DeviceState(object):

    """A group's device side: two kernels, the block map, its arrays' words,
    the ring of pinned buffers and events (reused once copied), ``stats`` a
    row ``(r, ||w||^2, ||g||^2)``, ``rounded`` float16 weights (copied:
    ``counted``, read: ``lost``), the last gradients (``last``, observed)."""

    RING = 4
    ring, next, counts, counted, lost, last = (), 0, None, None, None, None

    def __init__(self, group):
        xp, n, at = group.device.xp, len(group), group.device.device.id
        self.compute_dtype = _TYPES[group.dtype][2]
        sizes = [w.size for w in group.weights]
        counts = [-(-k // CHUNK) for k in sizes]
        self.nblocks = sum(counts)
        self.blocks = xp.asarray(numpy.concatenate([
            numpy.cumsum([0] + counts), numpy.repeat(numpy.arange(n), counts),
            sizes]).astype(numpy.int64))
        self.own = numpy.zeros((5, n), numpy.int64)
        self.direct = numpy.ones(n, bool)  # every array of the row supported
        for k, (w, states, x) in enumerate(
                zip(group.weights, group.states, group.extras)):
            for j, a in ((0, w), (4, x)) + tuple(enumerate(states, 2)):
                self.own[j, k] = 0 if a is None else a.data.ptr
                self.direct[k] &= a is None or supports(a)
        self.kernels = _kernels(xp, group)
        self.places = [(w.shape, at) for w in group.weights]  # not reshaped
        self.signature = [(group.gdtype, w.shape, tuple(  # C (flags: slow)
            s * group.gdtype.itemsize // w.itemsize for s in w.strides), at)
            for w in group.weights] if self.direct.all() else None
        self.nbytes = numpy.array(sizes, numpy.int64) * group.gdtype.itemsize
        self.empty = self.nbytes == 0
        words = 5 * n + -(-group.rows.size * self.compute_dtype.itemsize // 8)
        self.ring = [[empty_pinned(xp, words, numpy.int64), None]
                     for _ in range(self.RING)]
        self.words = xp.empty(words, numpy.int64)
        self.partial = xp.empty(2 * max(self.nblocks, 1), self.compute_dtype)
        self.done = xp.zeros(n, numpy.uint32)
        self.stats = xp.empty((n, 3), self.compute_dtype)
        self.rounded = xp.zeros(n, numpy.uint32)
        head = (self.words, self.blocks, numpy.int64(n))
        tail = (self.stats, self.rounded)
        self.arguments = (head + (self.partial, self.done) + tail, head + tail)
        if group.dtype == numpy.float16 and group.op != L.RESCALE:
            self.counts = empty_pinned(xp, n, numpy.uint32)

    def __del__(self):  # a copy still pending must keep its pinned buffer
        _RETIRED.append(([s[1] for s in self.ring] + [
            self.counted and self.counted[1]], self.ring, self.counts))

    def upload(self, group, gptr, stream):
        _RETIRED[:] = [r for r in _RETIRED if not all(
            e is None or e.done for e in r[0])]
        slot, self.next = self.ring[self.next], (self.next + 1) % self.RING
        if slot[1] is not None:
            slot[1].synchronize()  # its last copy is done
        host, n = slot[0], len(group)
        host[:5 * n] = self.own.reshape(-1)
        host[n:2 * n] = gptr
        host[5 * n:].view(self.compute_dtype)[:group.rows.size] = (
            group.rows.reshape(-1))
        self.words.set(host, stream)
        slot[1] = stream.record(slot[1])


def _overlapping(start, nbytes):
    """Which of the byte ranges at ``start`` (0: none) overlap another."""
    order = numpy.argsort(start)
    start = start[order]
    end = numpy.maximum.accumulate(start + nbytes[order] * (start > 0))
    run = numpy.cumsum(numpy.r_[True, start[1:] >= end[:-1]])  # their runs
    return order[numpy.bincount(run)[run] > 1]


class CudaExecutor(object):

    """The executor of CUDA devices (see :mod:`chainer_lars.engine`)."""

    def prepare(self, group):
        with group.device.create_context():
            group.state = _DeviceState(group)

    def take(self, plan, groups, grads):
        """Each group's gradient pointers the kernels take as they are (0:
        not taken; an empty array's, 0 in CuPy, 1; gradients that share the
        memory the op writes: the engine's, in turn), how many are not."""
        found, missing = [], 0
        for group, g in zip(groups, grads):
            state = group.state
            try:  # (AttributeError: a gradient is None, or NumPy's)
                fast = list(map(_SIGNATURE, g)) == state.signature and list(
                    map(_POINTER, g))
            except AttributeError:
                fast = []
            p = numpy.array(fast or [  # (not CuPy's: a model moved)
                a.data.ptr or 1 if isinstance(a, type(state.words)) and ok
                and (a.shape, a.data.device_id) == place
                and a.dtype == group.gdtype and supports(a) else 0
                for a, place, ok in zip(g, state.places, state.direct)],
                numpy.int64) | (state.empty & bool(fast))
            if len(g) > 1 and 1 in L.written(
                    group.op, group.scaled, group.mixed16):
                p[_overlapping(p * ~state.empty, state.nbytes)] = 0
            found.append(p)
            missing += len(g) - numpy.count_nonzero(p)
        return found, missing

    def update(self, plan, grads):
        """Whether a plan of one group ran, every gradient as it is."""
        (gptr,), missing = self.take(plan, plan.groups, [grads])
        if not missing:
            plan.groups[0].last.copies = {}
            self.run(plan.groups[0], gptr)
        return not missing

    address = staticmethod(lambda array: array.data.ptr)

    def run(self, group, gptr):
        state = group.state
        state.last = (gptr, group.op, group.adapt.copy(), 1.0 if (
            group.mixed16 or group.op == L.LAMB) else group.rows[
                :, L.LOSS_SCALE].copy())
        if gptr.max() <= 1:  # none taken but empty ones (address 1)
            return
        with group.device.create_context():
            stream = group.device.xp.cuda.get_current_stream()
            state.upload(group, gptr, stream)
            for kernel, arguments in zip(state.kernels, state.arguments):
                kernel((state.nblocks,), (THREADS,), arguments)
            if state.counts is not None:
                self.rounded(state)  # read once done, never waited for
                state.rounded.get(stream, out=state.counts, blocking=False)
                state.counted = (gptr, stream.record())

    @staticmethod
    def observe(state):
        """``(ratio, ||w||, ||g||)`` per array (NaN: not taken); one copy."""
        out = numpy.full((len(state.empty), 3), numpy.nan)
        if state.last is None:
            return out
        gptr, op, adapt, loss_scales = state.last
        taken = gptr != 0
        empty = taken & state.empty
        if op != L.RESCALE:  # what the CPU loop records of no element
            out[empty, 0] = 1.0
            out[empty & ((adapt != 0) | (op == L.LAMB)), 1:] = 0.0
        full = taken & ~state.empty
        if full.any():
            stats = state.stats.get().astype(numpy.float64)
            out[full, 0] = stats[full, 0]
            out[full, 1:] = numpy.sqrt(stats[full, 1:])
            out[full, 2] /= numpy.broadcast_to(loss_scales, full.shape)[full]
        return out

    @staticmethod
    def rounded(state):
        """The counts of float16 weights whose step rounded away, of the
        last update whose copy to the host is done (``None``: none yet)."""
        if state.counted is not None and state.counted[1].done:
            state.lost = numpy.where(state.counted[0], state.counts, 0)
            state.counted = None
        return state.lost


executor = CudaExecutor()
