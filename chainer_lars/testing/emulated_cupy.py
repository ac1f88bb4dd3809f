"""An emulated CUDA device for Chainer: the part of CuPy that LARS uses.

:func:`installed` makes Chainer see this module as CuPy, so that arrays
created here (:class:`ndarray`) live on ``@cupy:0`` as far as Chainer knows:
``param.device.xp`` is this module, Chainer's update rules call
``update_core_gpu``, and chainer-lars's GPU branches run unchanged, with
their kernels compiled by :mod:`chainer_lars.testing.cuda_emulator`.

What is emulated:

* device memory: every array owns a host buffer with guard bytes on both
  sides (checked after every kernel launch) and starts filled with ``0xff``
  bytes (NaN for floats), as uninitialised device memory might be, so that
  a kernel that reads what nobody wrote gives NaN, not a plausible number;
  ``data.ptr`` is the buffer's address, so kernels and pointer tables use
  it directly;
* arithmetic on arrays, and the NumPy-like functions Chainer calls
  (``zeros_like``, ``isfinite``, ...), computed with NumPy on the buffers;
* :class:`RawModule` (through the emulator) and :class:`ElementwiseKernel`
  (the operation compiled as a C++ loop), so Chainer's own
  ``MomentumSGD`` and ``SGD`` run on the device too;
* two devices, ``0`` and ``1``, without peer access: an array lives on
  the device current where it was allocated (``with Device(1):``); an
  operation (arithmetic, ``astype``, an ``ElementwiseKernel``) given an
  array of a device other than the current one raises CuPy's
  ``ValueError`` ("Peer access is unavailable"), where only a copy
  (``copy()``, ``cupy.array``) crosses devices; a ``RawModule`` kernel
  given such memory, directly or through an address in an ``int64`` array
  (a pointer table), fails as the illegal memory access it would be on a
  GPU (CuPy does not check those), before it runs;
* streams, events and pinned memory, as synchronous stand-ins;
* :data:`stats`: kernel launches by name, and transfers in each direction.
  Every way a value can leave the device counts as a device-to-host
  transfer: ``get()``, ``float()``, ``int()``, ``bool()``, ``item()``,
  ``numpy.asarray()``, printing.
"""

import contextlib
import ctypes
import sys
import types
import weakref

import numpy

from chainer_lars.testing import cuda_emulator


_GUARD = 64
_GUARD_BYTE = 0xa5
_ALIGN = 256  # cudaMalloc's alignment


class Stats(object):

    """What happened on the emulated device since the last :meth:`reset`."""

    def __init__(self):
        self.reset()

    def reset(self):
        #: list of str: the name of every kernel launched, in order.
        self.launches = []
        #: int: device-to-host transfers (any value read on the host).
        self.to_host = 0
        #: int: device-to-host copies that the host does not wait for.
        self.to_host_async = 0
        #: int: host-to-device transfers.
        self.to_device = 0
        #: int: elementwise (non-kernel) operations computed on the device.
        self.operations = 0
        #: int: device arrays allocated.
        self.allocations = 0


#: The statistics of this process's emulated device.
stats = Stats()

_allocations = weakref.WeakValueDictionary()


class _Allocation(object):

    """A block of emulated device memory, from the pool where possible.

    As CuPy's memory pool does, a freed block of a size is handed to the
    next request of that size, so that arrays allocated anew every
    iteration (gradients after ``cleargrads()``) keep their addresses.

    """

    __slots__ = ('buffer', 'start', 'nbytes', 'device_id', '__weakref__')

    def __init__(self, nbytes):
        stats.allocations += 1
        self.device_id = _current[-1]
        if self.device_id:
            _off_device_0.add(self)
        free = _pool.get(nbytes)
        if free:
            self.buffer, self.start = free.pop()
            self.buffer.fill(_GUARD_BYTE)
        else:
            self.buffer = numpy.empty(nbytes + 2 * _GUARD + _ALIGN,
                                      numpy.uint8)
            self.buffer.fill(_GUARD_BYTE)
            address = self.buffer.ctypes.data + _GUARD
            self.start = _GUARD + (-address) % _ALIGN
        self.nbytes = nbytes
        self.buffer[self.start:self.start + nbytes] = 0xff
        _allocations[id(self)] = self

    def __del__(self):
        _pool.setdefault(self.nbytes, []).append((self.buffer, self.start))

    def intact(self):
        b = self.buffer
        return (bool((b[:self.start] == _GUARD_BYTE).all())
                and bool((b[self.start + self.nbytes:] == _GUARD_BYTE).all()))


_pool = {}
#: The current device: the last entered (``use()``: until its block ends).
_current = [0]
#: Allocations on device 1, whose launches check addresses (see below).
_off_device_0 = weakref.WeakSet()


def check_devices(kernel, arrays):
    """Raises if a launch on the current device is given memory of another
    device: an array, or an address inside one held by an ``int64`` array
    (a pointer table), as a GPU without peer access would fault."""
    current = _current[-1]
    if current == 0 and not _off_device_0:
        return
    for a in arrays:
        if a._alloc.device_id != current:
            raise cuda_emulator.EmulatorError(
                '{}: an array of device {} given to a launch on device {} '
                '(an illegal memory access)'.format(
                    kernel, a._alloc.device_id, current))
    tables = [a._a.ravel() for a in arrays if a.dtype == numpy.int64]
    if not tables:
        return
    words = numpy.concatenate(tables)
    for allocation in list(_allocations.values()):
        if allocation.device_id != current and allocation.nbytes:
            start = allocation.buffer.ctypes.data + allocation.start
            if ((words >= start) & (words < start + allocation.nbytes)).any():
                raise cuda_emulator.EmulatorError(
                    '{}: an address in device {}\'s memory given to a launch '
                    'on device {} (an illegal memory access)'.format(
                        kernel, allocation.device_id, current))


def check_guards(kernel):
    """Raises if a launch wrote outside some device array."""
    for allocation in list(_allocations.values()):
        if not allocation.intact():
            raise cuda_emulator.EmulatorError(
                '{} wrote outside a device array of {} bytes'.format(
                    kernel, allocation.nbytes))


class _Pointer(object):

    __slots__ = ('ptr', 'mem', 'device_id')

    def __init__(self, ptr, mem, device_id):
        self.ptr = ptr
        self.mem = mem
        self.device_id = device_id


class Device(object):

    """An emulated device, ``0`` or ``1`` (``None``: the current one); as
    CuPy's, a context manager that makes it current within the block."""

    def __init__(self, device=None):
        device = _current[-1] if device is None else int(device)
        if device not in (0, 1):
            raise RuntimeError(
                'the emulated machine has two CUDA devices (0 and 1), not '
                '{}'.format(device))
        self.id = device

    def __enter__(self):
        _current.append(self.id)
        return self

    def __exit__(self, *exc_info):
        _current.pop()

    def use(self):  # until the end of the block it is used in, as CuPy's
        _current[-1] = self.id

    def synchronize(self):
        pass

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return '<emulated CUDA Device {}>'.format(self.id)


class Event(object):

    """A recorded event; launches are synchronous, so it is always done."""

    done = True

    def synchronize(self):
        pass


class Stream(object):

    """A stand-in for :class:`cupy.cuda.Stream`: launches run at once."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def record(self, event=None):
        return Event() if event is None else event

    def synchronize(self):
        pass


_current_stream = Stream()


def alloc_pinned_memory(size):
    """Host memory for :func:`numpy.frombuffer`, as CuPy's pinned memory."""
    return memoryview(bytearray(max(0, int(size))))


def _on_current(*arrays):
    """Raises CuPy's error of an operation on the current device given an
    array of another (none but a copy crosses devices without peer access)."""
    for a in arrays:
        if isinstance(a, ndarray) and a._alloc.device_id != _current[-1]:
            raise ValueError(
                'The device where the array resides ({}) is different from '
                'the current device ({}). Peer access is unavailable between '
                'these devices.'.format(a._alloc.device_id, _current[-1]))


def _unwrap(value):
    if isinstance(value, ndarray):
        _on_current(value)
        return value._a
    if isinstance(value, numpy.ndarray):
        raise TypeError(
            'a NumPy array on the host cannot be mixed with a device array '
            '(send it with chainer.backends.cuda.to_gpu first)')
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


def _wrap(value):
    if isinstance(value, numpy.ndarray):
        return ndarray._from_host(value)
    if isinstance(value, numpy.generic):
        return ndarray._from_host(numpy.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def _rebuild(a):
    """An unpickled or copied device array (see ``ndarray.__reduce__``)."""
    return ndarray._from_host(a)


class _Flags(object):

    def __init__(self, a):
        self.c_contiguous = a.flags.c_contiguous
        self.f_contiguous = a.flags.f_contiguous
        self.owndata = False


_HEADER = frozenset(['dtype', 'size', 'ndim', 'itemsize', 'nbytes', 'strides',
                     'data', 'flags', 'device', 'T', 'base'])


class ndarray(object):

    """An array in emulated device memory (a view of its host buffer)."""

    __array_priority__ = 1000

    def __init__(self, shape, dtype=float, memptr=None, strides=None,
                 order='C'):
        dtype = numpy.dtype(dtype)
        shape = (shape,) if numpy.isscalar(shape) else tuple(shape)
        nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
        self._alloc = _Allocation(nbytes)
        raw = self._alloc.buffer[self._alloc.start:
                                 self._alloc.start + nbytes]
        self._bind(self._alloc, raw.view(dtype).reshape(shape, order=order))

    def _bind(self, alloc, a):
        # Plain attributes, read at C speed as CuPy's are, so that timing
        # the host code on this module does not count Python properties
        # (set past __setattr__, which refuses most of them).
        self.__dict__.update(
            _alloc=alloc, _a=a, shape=a.shape, dtype=a.dtype, size=a.size,
            ndim=a.ndim, itemsize=a.itemsize, nbytes=a.nbytes,
            strides=a.strides)

    def __setattr__(self, name, value):
        # As CuPy's: the shape may be set (a reshape without a copy, refused
        # where one would be needed), the rest of the header not.
        if name == 'shape':
            a = self._a.reshape(value)
            if a.size and not numpy.shares_memory(a, self._a):
                raise AttributeError(
                    'Incompatible shape for in-place modification. Use '
                    '`.reshape()` to make a copy with the desired shape.')
            self._bind(self._alloc, a)
        elif name in _HEADER:
            raise AttributeError(
                "attribute '{}' of 'cupy.ndarray' objects is not "
                "writable".format(name))
        else:
            object.__setattr__(self, name, value)

    def __reduce__(self):
        # As CuPy's: through the host, into a new allocation.
        return _rebuild, (numpy.array(self._a),)

    @classmethod
    def _view(cls, alloc, a):
        self = cls.__new__(cls)
        self._bind(alloc, a)
        return self

    @classmethod
    def _from_host(cls, a):
        a = numpy.asarray(a)
        out = cls(a.shape, a.dtype)
        out._a[...] = a
        return out

    # --- properties --------------------------------------------------
    flags = property(lambda self: _Flags(self._a))
    device = property(lambda self: Device(self._alloc.device_id))

    @property
    def data(self):
        # An attribute of CuPy's arrays: made once, as there.
        pointer = self.__dict__.get('_data')
        if pointer is None:
            # CuPy allocates nothing for an empty array: its address is 0.
            pointer = self._data = _Pointer(
                self._a.ctypes.data if self._a.size else 0, self._alloc,
                self._alloc.device_id)
        return pointer

    T = property(lambda self: self._view(self._alloc, self._a.T))
    base = None

    def __len__(self):
        return len(self._a)

    # --- leaving the device ------------------------------------------
    def get(self, stream=None, order='C', out=None, blocking=True):
        if blocking:
            stats.to_host += 1
        else:  # into pinned memory, read once an event says it is done
            stats.to_host_async += 1
        if out is not None:
            out[...] = self._a
            return out
        return self._a.copy()

    def set(self, arr, stream=None):
        stats.to_device += 1
        self._a[...] = numpy.asarray(arr)

    def __array__(self, dtype=None, copy=None):
        # As CuPy: a test that converts implicitly fails here, not only on
        # a GPU.
        raise TypeError(
            'Implicit conversion to a NumPy array is not allowed. Please use '
            '`.get()` to construct a NumPy array explicitly.')

    def item(self):
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def __float__(self):
        return float(self.get())

    def __int__(self):
        return int(self.get())

    def __index__(self):
        return int(self.get())

    def __bool__(self):
        return bool(self.get())

    def __repr__(self):
        return 'emulated_cupy.' + repr(self.get())

    __str__ = __repr__

    # --- on the device -----------------------------------------------
    def _op(self, function, *args, **kwargs):
        stats.operations += 1
        return _wrap(function(*_unwrap(args), **kwargs))

    def _iop(self, function, other):
        stats.operations += 1
        _on_current(self)
        function(self._a, _unwrap(other), out=self._a, casting='same_kind')
        return self

    def astype(self, dtype, order='K', casting=None, subok=None, copy=True):
        if not copy and numpy.dtype(dtype) == self.dtype:
            return self
        return self._op(lambda a: a.astype(dtype), self)

    def copy(self, order='C'):
        # As CuPy's: onto the current device, from any (a memcpy).
        stats.operations += 1
        return _wrap(numpy.array(self._a))

    def fill(self, value):
        stats.operations += 1
        self._a.fill(value)

    def reshape(self, *shape, **kwargs):
        return self._view(self._alloc, self._a.reshape(*shape, **kwargs))

    def ravel(self):
        return self.reshape(-1)

    def view(self, dtype=None):
        return self._view(self._alloc, self._a.view(dtype))

    def __getitem__(self, key):
        result = self._a[_unwrap(key)]
        if (isinstance(result, numpy.ndarray)
                and numpy.shares_memory(result, self._a)):
            return self._view(self._alloc, result)  # basic indexing: a view
        return _wrap(result)

    def __setitem__(self, key, value):
        stats.operations += 1
        _on_current(self)
        self._a[_unwrap(key)] = _unwrap(value)

    def sum(self, axis=None, dtype=None, keepdims=False):
        return self._op(numpy.sum, self, axis=axis, dtype=dtype,
                        keepdims=keepdims)

    def dot(self, other):
        return self._op(numpy.dot, self, other)

    def __neg__(self):
        return self._op(numpy.negative, self)

    def __abs__(self):
        return self._op(numpy.abs, self)


def _binary(function, reflected=False):
    if reflected:
        return lambda self, other: self._op(function, other, self)
    return lambda self, other: self._op(function, self, other)


for _name, _function in [
        ('add', numpy.add), ('sub', numpy.subtract),
        ('mul', numpy.multiply), ('truediv', numpy.true_divide),
        ('floordiv', numpy.floor_divide), ('pow', numpy.power),
        ('mod', numpy.mod), ('matmul', numpy.matmul),
        ('and', numpy.logical_and), ('or', numpy.logical_or)]:
    setattr(ndarray, '__{}__'.format(_name), _binary(_function))
    setattr(ndarray, '__r{}__'.format(_name), _binary(_function, True))
    setattr(ndarray, '__i{}__'.format(_name),
            lambda self, other, f=_function: self._iop(f, other))
for _name, _function in [
        ('lt', numpy.less), ('le', numpy.less_equal),
        ('gt', numpy.greater), ('ge', numpy.greater_equal),
        ('eq', numpy.equal), ('ne', numpy.not_equal)]:
    setattr(ndarray, '__{}__'.format(_name), _binary(_function))
ndarray.__hash__ = None


# --- the module's functions ------------------------------------------------

def empty(shape, dtype=float, order='C'):
    return ndarray(shape, dtype, order=order)


def empty_like(a, dtype=None, order='K', subok=None, shape=None):
    return empty(a.shape if shape is None else shape,
                 a.dtype if dtype is None else dtype)


def zeros(shape, dtype=float, order='C'):
    a = empty(shape, dtype, order)
    a._a[...] = 0
    return a


def zeros_like(a, dtype=None, order='K', subok=None, shape=None):
    out = empty_like(a, dtype, shape=shape)
    out._a[...] = 0
    return out


def full(shape, fill_value, dtype=None):
    a = empty(shape, numpy.result_type(fill_value) if dtype is None
              else dtype)
    a._a[...] = fill_value
    return a


def full_like(a, fill_value, dtype=None):
    return full(a.shape, fill_value, a.dtype if dtype is None else dtype)


def ones_like(a, dtype=None):
    return full_like(a, 1, dtype)


def ones(shape, dtype=float):
    return full(shape, 1, dtype)


def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray):
        if a._alloc.device_id != _current[-1]:
            a = a.copy()  # as CuPy's: onto the current device
        return a if dtype is None else a.astype(dtype, copy=False)
    stats.to_device += 1
    return ndarray._from_host(numpy.asarray(a, dtype=dtype))


def array(a, dtype=None, copy=True, order='K', ndmin=0):
    if isinstance(a, ndarray):
        if a._alloc.device_id != _current[-1] or dtype in (None, a.dtype):
            a = a.copy()  # (as CuPy's: across devices too)
        return a if dtype in (None, a.dtype) else a.astype(dtype)
    return asarray(a, dtype)


def copyto(dst, src, casting='same_kind', where=None):
    """As CuPy's: ``src`` of another device is copied to ``dst``'s first."""
    stats.operations += 1
    numpy.copyto(dst._a, src._a if isinstance(src, ndarray) else src,
                 casting=casting, where=getattr(where, '_a', where is None or
                                                where))


def ascontiguousarray(a, dtype=None):
    dtype = a.dtype if dtype is None else numpy.dtype(dtype)
    if a.flags.c_contiguous and a.dtype == dtype:
        return a
    _on_current(a)
    out = ndarray(a.shape, dtype)
    out._a[...] = a._a
    return out


def get_array_module(*args):
    for arg in args:
        if isinstance(arg, ndarray):
            return sys.modules[__name__]
    return numpy


def _numpy_function(name):
    function = getattr(numpy, name)

    def run(*args, **kwargs):
        stats.operations += 1
        return _wrap(function(*_unwrap(args), **{
            k: _unwrap(v) for k, v in kwargs.items()}))
    run.__name__ = name
    return run


for _name in ['sqrt', 'square', 'isfinite', 'isnan', 'isinf', 'all', 'any',
              'where', 'sum', 'abs', 'maximum', 'minimum', 'multiply',
              'add', 'subtract', 'divide', 'true_divide', 'negative',
              'power', 'exp', 'log', 'dot', 'clip', 'sign',
              'logical_and', 'logical_or', 'logical_not', 'concatenate',
              'stack', 'arange']:
    globals()[_name] = _numpy_function(_name)

for _name in ['float16', 'float32', 'float64', 'int8', 'int16', 'int32',
              'int64', 'uint8', 'uint16', 'uint32', 'uint64', 'bool_',
              'dtype', 'result_type', 'can_cast', 'isscalar', 'ndim',
              'inf', 'nan', 'pi', 'e', 'newaxis', 'integer', 'floating',
              'number', 'generic', 'finfo', 'iinfo']:
    globals()[_name] = getattr(numpy, _name)


def RawModule(code=None, options=(), **kwargs):  # NOQA: CuPy's name
    """A :class:`cuda_emulator.Module` (compiled once per source)."""
    module = _raw_modules.get(code)
    if module is None or cuda_emulator.plants:
        module = _raw_modules[code] = cuda_emulator.Module(code, options)
    return module


_raw_modules = {}


def RawKernel(code, name, options=(), **kwargs):  # NOQA: CuPy's name
    return RawModule(code=code, options=options).get_function(name)


class ElementwiseKernel(object):

    """CuPy's elementwise kernel, its operation compiled as a C++ loop.

    Parameters are ``'T x, float32 y, raw T z'`` as in CuPy; a type
    placeholder is bound from the first argument that has it. Every array
    argument must have the output's shape (no broadcasting), which is how
    Chainer's update rules use these kernels; scalars are passed by value.
    float16 is computed as ``float`` and rounded back with the emulator's
    conversions, as CuPy's ``float16`` type does.

    """

    def __init__(self, in_params, out_params, operation, name='kernel',
                 **kwargs):
        self.name = name
        self.operation = operation
        self.in_params = self._parse(in_params)
        self.out_params = self._parse(out_params)
        self._modules = {}

    @staticmethod
    def _parse(params):
        parsed = []
        for p in params.split(','):
            words = p.split()
            if not words:
                continue
            raw = words[0] == 'raw'
            if raw:
                words = words[1:]
            parsed.append((words[0], words[1], raw))
        return parsed

    def __call__(self, *args, **kwargs):
        params = self.in_params + self.out_params
        nin = len(self.in_params)
        if not execute and not check:
            stats.launches.append(self.name)
            return args[nin] if len(self.out_params) == 1 else tuple(
                args[nin:])
        args = list(args)
        if len(args) != len(params):
            raise TypeError('{} takes {} arguments, got {}'.format(
                self.name, len(params), len(args)))
        _on_current(*args)  # (before the dtypes and shapes, as CuPy)
        types = {}
        for (ctype, _, _), a in zip(params, args):
            if ctype not in _ELEMENT_TYPES and ctype not in types and (
                    isinstance(a, (ndarray, numpy.generic))):
                types[ctype] = numpy.dtype(a.dtype)
        shape = None
        for (ctype, name, raw), a in zip(params[nin:], args[nin:]):
            if not isinstance(a, ndarray):
                raise TypeError('output {} of {} must be a device array'
                                .format(name, self.name))
            shape = a.shape
        kinds = []
        for (ctype, name, raw), a in zip(params, args):
            dtype = _ELEMENT_TYPES.get(ctype) or types.get(ctype)
            if dtype is None:
                dtype = numpy.result_type(a)
                types[ctype] = dtype
            if isinstance(a, ndarray):
                if a.shape != shape or not a.flags.c_contiguous:
                    raise TypeError(
                        '{} of {}: the emulated ElementwiseKernel takes '
                        'contiguous arrays of one shape, got {} and {}'
                        .format(name, self.name, a.shape, shape))
                if a.dtype != dtype:
                    raise TypeError('{} of {} must be {}, got {}'.format(
                        name, self.name, dtype, a.dtype))
                kinds.append('array')
            else:
                kinds.append('scalar')
        key = (tuple(sorted((k, str(v)) for k, v in types.items())),
               tuple(kinds))
        function = self._modules.get(key)
        if function is None:
            function = self._modules[key] = self._build(types, kinds)
        values = []
        for (ctype, name, raw), a, kind in zip(params, args, kinds):
            dtype = _ELEMENT_TYPES.get(ctype) or types[ctype]
            if kind == 'array':
                values.append(ctypes.c_void_p(a.data.ptr))
            else:
                storage = _storage(dtype)
                values.append(numpy.asarray(a, dtype).view(storage)[()]
                              .item())
        stats.launches.append(self.name)
        if not execute:
            return args[nin] if len(self.out_params) == 1 else tuple(
                args[nin:])
        function(int(numpy.prod(shape, dtype=numpy.int64)),
                 *[numpy.uint64(v.value or 0 if isinstance(v, ctypes.c_void_p)
                                else 0) if kind == 'array' else v
                   for v, kind in zip(values, kinds)])
        check_guards(self.name)
        return args[nin] if len(self.out_params) == 1 else tuple(args[nin:])

    def _build(self, types, kinds):
        params = self.in_params + self.out_params
        nin = len(self.in_params)
        decls, body, ctypes_args = [], [], [ctypes.c_int64]
        typedefs = ''.join('typedef {} {};\n'.format(_c_name(v), k)
                           for k, v in sorted(types.items()))
        for i, ((ctype, name, raw), kind) in enumerate(zip(params, kinds)):
            dtype = _ELEMENT_TYPES.get(ctype) or types[ctype]
            c = _c_name(dtype)
            if kind == 'array':
                decls.append('unsigned long long p{}'.format(i))
                ctypes_args.append(ctypes.c_uint64)
                ref = '' if i < nin else '&'
                const = 'const ' if i < nin else ''
                body.append('{}{}{} {} = (({}*)p{})[i];'.format(
                    const, c, ref, name, c, i))
            else:
                storage = _storage(dtype)
                decls.append('{} s{}'.format(_c_name(storage), i))
                ctypes_args.append(_CTYPES[storage])
                body.append('const {} {} = emu_from_bits<{}>(s{});'.format(
                    c, name, c, i))
        code = (typedefs + 'extern "C" void emu_elementwise(long long n, '
                + ', '.join(decls) + ') {\n'
                + '    for (long long i = 0; i < n; ++i) {\n        '
                + '\n        '.join(body) + '\n        '
                # CuPy ends the operation with ';' (Chainer's SGD has none).
                + self.operation + ';\n    }\n}\n')
        lib = cuda_emulator._compile(_ELEMENTWISE_PRELUDE + code)
        function = lib.emu_elementwise
        function.argtypes = ctypes_args
        return function


_ELEMENT_TYPES = {
    'float16': numpy.dtype(numpy.float16),
    'float32': numpy.dtype(numpy.float32),
    'float64': numpy.dtype(numpy.float64),
    'int32': numpy.dtype(numpy.int32), 'int64': numpy.dtype(numpy.int64),
    'bool': numpy.dtype(numpy.bool_),
}


def _c_name(dtype):
    return {'float16': 'float16', 'float32': 'float', 'float64': 'double',
            'int32': 'int', 'int64': 'long long', 'bool': 'bool',
            'uint16': 'unsigned short', 'uint32': 'unsigned int',
            'uint64': 'unsigned long long'}[numpy.dtype(dtype).name]


def _storage(dtype):
    return numpy.dtype(numpy.uint16) if dtype == numpy.float16 else dtype


_CTYPES = {
    numpy.dtype(numpy.uint16): ctypes.c_uint16,
    numpy.dtype(numpy.float32): ctypes.c_float,
    numpy.dtype(numpy.float64): ctypes.c_double,
    numpy.dtype(numpy.int32): ctypes.c_int32,
    numpy.dtype(numpy.int64): ctypes.c_int64,
    numpy.dtype(numpy.bool_): ctypes.c_bool,
}

_ELEMENTWISE_PRELUDE = r'''
// CuPy's float16: stored as 16 bits, computed as float.
struct float16 {
    unsigned short bits;
    float16() : bits(0) {}
    float16(float f) : bits(emu_cvt_rn_f16_f32(f)) {}
    operator float() const { return emu_cvt_f32_f16(bits); }
    float16& operator+=(float x) { return *this = float16(float(*this) + x); }
    float16& operator-=(float x) { return *this = float16(float(*this) - x); }
    float16& operator*=(float x) { return *this = float16(float(*this) * x); }
    float16& operator/=(float x) { return *this = float16(float(*this) / x); }
};
template <typename T, typename B> T emu_from_bits(B b) { return (T)b; }
template <> float16 emu_from_bits<float16, unsigned short>(unsigned short b) {
    float16 h; h.bits = b; return h;
}
'''


# --- the cuda submodule and the Chainer hook-up ---------------------------

cuda = types.SimpleNamespace(
    Device=Device, Event=Event, Stream=Stream,
    get_current_stream=lambda: _current_stream,
    alloc_pinned_memory=alloc_pinned_memory,
    runtime=types.SimpleNamespace(getDeviceCount=lambda: 2),
)
cuda.Stream.null = _current_stream


#: Whether launches run; :func:`installed` with ``execute=False`` checks
#: and counts them but skips the work (to time the host code alone).
execute = True
#: Whether a launch that does not run still checks its arguments.
check = True


class _Device(cuda_emulator.Device):

    """This module as the emulator's device (cuda_emulator.Device)."""

    ndarray = ndarray

    def execute(self):
        return execute

    def check(self):
        return check

    def launched(self, name):
        stats.launches.append(name)

    def check_guards(self, name):
        check_guards(name)

    def check_devices(self, name, arrays):
        check_devices(name, arrays)


cuda_emulator.device = _Device()


@contextlib.contextmanager
def installed(execute=True, check=True):
    """Makes Chainer take this module for CuPy, within the block.

    With ``execute=False`` every kernel launch is checked and counted but
    does nothing; with ``check=False`` as well, a launch is only counted,
    a no-op, so that what the block costs is the host code of the GPU path
    alone (``benchmarks/bench_lars.py --gpu-host``).

    ``chainer.backends.cuda`` then reports CUDA as available with two
    devices, ``@cupy:0`` and ``@cupy:1``, whose arrays are this
    module's. Kernel caches that
    chainer-lars keeps per array module need nothing cleared: this module is
    its own array module.

    """
    import chainer
    from chainer.backends import cuda as chainer_cuda

    module = sys.modules[__name__]
    if execute and not check:
        raise ValueError('check=False needs execute=False: a launch that '
                         'runs is always checked')
    saved_execute, saved_check = module.execute, module.check
    module.execute, module.check = execute, check
    # Chainer computes its tuple of array types once, on first use, from
    # cuda.available: made before the block, it would refuse this module's
    # arrays as gradients; made inside, it would keep them after.
    saved_array_types = chainer._array_types, chainer._cpu_array_types
    chainer._array_types = chainer._cpu_array_types = None
    replaced = dict(available=True, cupy=module, ndarray=ndarray,
                    Device=Device, Event=Event, Stream=Stream)
    saved = {name: getattr(chainer_cuda, name) for name in replaced}
    # Defined by Chainer's import only where CuPy is usable: cuDNN is off.
    had_cudnn_flag = hasattr(chainer_cuda, '_cudnn_disabled_by_user')
    cudnn_flag = getattr(chainer_cuda, '_cudnn_disabled_by_user', True)
    chainer_cuda._cudnn_disabled_by_user = True
    saved_xp = chainer_cuda.GpuDevice.xp
    saved_types = chainer_cuda.GpuDevice.supported_array_types
    for name, value in replaced.items():
        setattr(chainer_cuda, name, value)
    chainer_cuda.GpuDevice.xp = module
    chainer_cuda.GpuDevice.supported_array_types = (ndarray,)
    try:
        yield module
    finally:
        chainer._array_types, chainer._cpu_array_types = saved_array_types
        module.execute, module.check = saved_execute, saved_check
        for name, value in saved.items():
            setattr(chainer_cuda, name, value)
        chainer_cuda.GpuDevice.xp = saved_xp
        chainer_cuda.GpuDevice.supported_array_types = saved_types
        if had_cudnn_flag:
            chainer_cuda._cudnn_disabled_by_user = cudnn_flag
        else:
            del chainer_cuda._cudnn_disabled_by_user
