"""Runs CUDA C kernels on the CPU: compile, check each launch, execute.

A stand-in for :class:`cupy.RawModule` on machines without a GPU.
:class:`Module` compiles a CUDA source with the system C++ compiler after
``cuda_emulator.h`` (which says what of CUDA is provided and how) and gives
kernels by name; calling one, ``kernel(grid, block, args)`` as with CuPy,
checks the launch and runs it on the host, synchronously:

* ``grid`` and ``block`` must be tuples of one to three positive ints within
  CUDA's limits (1024 threads a block, 2**31 - 1 blocks along x, 65535
  along y and z);
* ``args`` must match the kernel's C signature one for one: a pointer
  parameter takes a device array (:class:`emulated_cupy.ndarray`) that is
  C-contiguous and whose dtype is the pointee type (``unsigned short`` is
  float16 storage), and a scalar parameter takes a NumPy scalar of exactly
  its type (``numpy.int64`` for ``long long``, ``numpy.float32`` for
  ``float``, ...). CuPy packs each argument by its own type, not the
  kernel's, so an ``int`` passed where ``long long`` is declared, or a
  Python float (packed as a double) where ``float`` is, would shift or
  garble every later argument on a GPU; here it is an error.
* an array of another device than the current one, given directly or by
  an address inside it in an ``int64`` array, fails the launch (see
  :mod:`chainer_lars.testing.emulated_cupy`);
* After the launch, the guard bytes around every live device array are
  checked, so that a write past the end of an array fails the launch.

Mechanical substitutions made in the source before compiling (nothing
else is changed): the inline PTX of ``cvt.f32.f16`` and ``cvt.rn.f16.f32``
becomes calls of the header's conversion functions; any other ``asm`` is
refused.

What it cannot tell: speed, the GPU's own scheduling (blocks run one after
another, so races between blocks cannot show), memory-model effects of real
hardware, and CuPy's own behaviour.
"""

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading

import numpy


_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'cuda_emulator.h')

#: Compiler and flags; ``CXX`` overrides the compiler.
CXXFLAGS = ('-std=c++20', '-O2', '-fPIC', '-shared', '-pthread',
            '-ffp-contract=off', '-fno-fast-math')

_MAX_THREADS = 1024
_MAX_BLOCK = (1024, 1024, 64)
_MAX_GRID = (2 ** 31 - 1, 65535, 65535)


class EmulatorError(RuntimeError):

    """A kernel source the emulator cannot take, or a failed launch."""


class LaunchError(TypeError):

    """A launch whose configuration or arguments do not fit the kernel."""


#: C type name -> (ctypes type, NumPy dtypes accepted for it)
_C_TYPES = {
    'float': (ctypes.c_float, (numpy.dtype(numpy.float32),)),
    'double': (ctypes.c_double, (numpy.dtype(numpy.float64),)),
    'int': (ctypes.c_int32, (numpy.dtype(numpy.int32),)),
    'unsigned int': (ctypes.c_uint32, (numpy.dtype(numpy.uint32),)),
    'long long': (ctypes.c_int64, (numpy.dtype(numpy.int64),)),
    'unsigned long long': (ctypes.c_uint64, (numpy.dtype(numpy.uint64),)),
    'unsigned short': (ctypes.c_uint16, (numpy.dtype(numpy.uint16),
                                         numpy.dtype(numpy.float16))),
    'bool': (ctypes.c_bool, (numpy.dtype(numpy.bool_),)),
}

_ASM = re.compile(
    r'asm\s*\(\s*"\{\s*(cvt\.[a-z0-9.]+)\s+%0\s*,\s*%1\s*;\s*\}"\s*'
    r':\s*"=\w"\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*'
    r':\s*"\w"\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*\)\s*;')
_CONVERSIONS = {
    'cvt.f32.f16': 'emu_cvt_f32_f16',
    'cvt.rn.f16.f32': 'emu_cvt_rn_f16_f32',
}
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')
_TYPEDEF = re.compile(r'typedef\s+([\w ]+?)\s+(\w+)\s*;')


def _substitute_asm(source):
    def replace(match):
        instruction, out, operand = match.groups()
        function = _CONVERSIONS.get(instruction)
        if function is None:
            raise EmulatorError(
                'the emulator does not provide the PTX instruction '
                '{!r}'.format(instruction))
        return '{} = {}({});'.format(out.strip(), function, operand.strip())
    source = _ASM.sub(replace, source)
    if re.search(r'\basm\b', source):
        raise EmulatorError(
            'the source has inline asm other than the float16 conversions '
            'the emulator knows: {!r}'.format(
                source[source.index('asm'):][:80]))
    return source


class Parameter(object):

    """One parameter of a kernel's C signature."""

    def __init__(self, declaration, typedefs):
        text = ' '.join(declaration.replace('*', ' * ').split())
        tokens = text.split(' ')
        self.name = tokens[-1]
        words = [t for t in tokens[:-1]
                 if t not in ('const', '__restrict__', 'volatile')]
        self.is_pointer = '*' in words
        if words.count('*') > 1:
            raise EmulatorError('pointer to pointer: ' + declaration)
        words = [w for w in words if w != '*']
        base = ' '.join(words)
        base = typedefs.get(base, base)
        if base not in _C_TYPES:
            raise EmulatorError('unsupported parameter type {!r} in {!r}'
                                .format(base, declaration))
        self.c_type = base
        self.ctype, self.dtypes = _C_TYPES[base]
        self.declaration = declaration.strip()

    def pack(self, kernel, index, value):
        """The ctypes object holding ``value``, checked against the type."""
        where = 'argument {} ({}) of {}'.format(
            index, self.declaration, kernel)
        if self.is_pointer:
            if not isinstance(value, device.ndarray):
                raise LaunchError('{} must be a device array, not {}'.format(
                    where, type(value).__name__))
            if value.dtype not in self.dtypes:
                raise LaunchError('{} points to {} but got an array of {}'
                                  .format(where, self.c_type, value.dtype))
            if not value.flags.c_contiguous:
                raise LaunchError(
                    '{} got a non-contiguous array; the kernels take no '
                    'strides'.format(where))
            return ctypes.c_void_p(value.data.ptr)
        if (not isinstance(value, numpy.generic)
                or value.dtype not in self.dtypes):
            raise LaunchError(
                '{} must be a NumPy scalar of {}, not {!r} ({}); CuPy '
                'packs an argument by its own type, so any other type '
                'misaligns the arguments on a GPU'.format(
                    where, self.dtypes[0], value,
                    getattr(value, 'dtype', type(value).__name__)))
        return self.ctype(value.item())


def parse_kernels(source):
    """``{name: [Parameter, ...]}`` of the ``extern "C" __global__``s."""
    typedefs = {}
    for base, name in _TYPEDEF.findall(source):
        typedefs[name] = ' '.join(base.split())
    kernels = {}
    for name, params in _KERNEL.findall(source):
        kernels[name] = [Parameter(p, typedefs)
                         for p in params.split(',') if p.strip()]
    return kernels


def _wrapper(name, params):
    """C++ of the entry point that unpacks ``void** args`` and launches."""
    lines = ['extern "C" int emu_launch_{}(const unsigned int* grid, '
             'const unsigned int* block, void** args) {{'.format(name)]
    names = []
    for i, p in enumerate(params):
        lines.append('    auto a{0} = *({1}*)args[{0}];'.format(
            i, _declared_type(p)))
        names.append('a{}'.format(i))
    lines.append('    return emu_run(grid, block, [&]() {{ {}({}); }});'
                 .format(name, ', '.join(names)))
    lines.append('}')
    return '\n'.join(lines)


def _declared_type(p):
    # The declaration without its name, e.g. "const S*", "long long".
    text = p.declaration
    return text[:text.rindex(p.name)].strip()


_build_lock = threading.Lock()


def cache_dir():
    """Where compiled kernels are kept (``CHAINER_LARS_EMULATOR_CACHE``)."""
    return os.environ.get('CHAINER_LARS_EMULATOR_CACHE') or os.path.join(
        os.path.expanduser('~'), '.cache', 'chainer_lars', 'emulator')


def compiler():
    """The C++ compiler: ``$CXX``, else ``g++``, else ``c++``."""
    for candidate in (os.environ.get('CXX'), 'g++', 'c++'):
        if candidate and shutil.which(candidate):
            return candidate
    raise EmulatorError('no C++ compiler found (set CXX, or install g++)')


def _is_gcc(cxx):
    try:
        version = subprocess.run([cxx, '--version'], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL,
                                 universal_newlines=True).stdout
    except OSError:
        return False
    return 'Free Software Foundation' in version and 'clang' not in version


def _precompiled(header, directory):
    """The header to include: with GCC, a copy of ``cuda_emulator.h``
    beside its precompiled ``.gch`` (built once per header, compiler and
    flags, in ``pch-<digest>/``; it parses the C++ library's headers
    once, which is about half of each module's compile), else the header
    itself (also if the build fails: GCC falls back to the header when a
    ``.gch`` does not fit)."""
    cxx = compiler()
    digest = hashlib.sha256('\0'.join(
        (header, cxx) + CXXFLAGS).encode()).hexdigest()[:24]
    final = os.path.join(directory, 'pch-' + digest)
    copy = os.path.join(final, 'cuda_emulator.h')
    if os.path.exists(copy + '.gch'):
        return copy
    if not _is_gcc(cxx):
        return _HEADER
    tmp = tempfile.mkdtemp(dir=directory)
    try:
        with open(os.path.join(tmp, 'cuda_emulator.h'), 'w') as f:
            f.write(header)  # the text the digest names
        flags = [f for f in CXXFLAGS if f != '-shared']
        result = subprocess.run(
            [cxx] + flags + ['-x', 'c++-header', os.path.join(
                tmp, 'cuda_emulator.h'), '-o', os.path.join(
                    tmp, 'cuda_emulator.h.gch')],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if result.returncode != 0:
            return _HEADER
        # Older headers' builds (70 MB each) go; another process's
        # finished build of this one wins.
        for name in os.listdir(directory):
            if name.startswith('pch-') and name != 'pch-' + digest:
                shutil.rmtree(os.path.join(directory, name),
                              ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            pass
        return copy if os.path.exists(copy + '.gch') else _HEADER
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _compile(code):
    with open(_HEADER) as f:
        header = f.read()
    digest = hashlib.sha256('\0'.join(
        (header, code, compiler()) + CXXFLAGS).encode()).hexdigest()[:24]
    directory = cache_dir()
    path = os.path.join(directory, 'kernels-{}.so'.format(digest))
    with _build_lock:
        if not os.path.exists(path):
            os.makedirs(directory, exist_ok=True)
            include = _precompiled(header, directory)
            with tempfile.TemporaryDirectory(dir=directory) as tmp:
                cpp = os.path.join(tmp, 'kernels.cpp')
                with open(cpp, 'w') as f:
                    f.write('#include "{}"\n#line 1 "kernels.cu"\n'.format(
                        include))
                    f.write(code)
                out = os.path.join(tmp, 'kernels.so')
                result = subprocess.run(
                    [compiler()] + list(CXXFLAGS) + [cpp, '-o', out],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    universal_newlines=True)
                if result.returncode != 0:
                    raise EmulatorError('the C++ compiler failed:\n'
                                        + result.stdout)
                os.replace(out, path)
    return ctypes.CDLL(path)


#: Source mutations applied by :class:`Module` before compiling, for
#: tests that check a planted bug is caught: a list of ``(old, new)``, also
#: read from ``CHAINER_LARS_EMULATOR_PLANTS`` (JSON) by a child process.
plants = [tuple(p) for p in json.loads(
    os.environ.get('CHAINER_LARS_EMULATOR_PLANTS') or '[]')]


class Module(object):

    """A CUDA source compiled for the host; like :class:`cupy.RawModule`.

    Args:
        code (str): The CUDA C source.
        options (tuple): Accepted for CuPy's signature; ignored.

    """

    def __init__(self, code, options=(), **kwargs):
        for old, new in plants:
            if old not in code:
                raise EmulatorError(
                    'planted bug: {!r} is not in the source'.format(old))
            code = code.replace(old, new)
        self.code = code
        self._params = parse_kernels(code)
        if not self._params:
            raise EmulatorError('no extern "C" __global__ kernel in source')
        host = _substitute_asm(code) + '\n' + '\n'.join(
            _wrapper(name, params) for name, params in self._params.items())
        self._lib = _compile(host)
        self._lib.emu_last_error.restype = ctypes.c_char_p

    def set_timeout(self, seconds):
        """How long each launch of this module may run, from the next one
        on, before it fails with :class:`EmulatorError` (its threads still
        running abandoned); ``None``: the compiled ``EMU_TIMEOUT_MS``
        (60 s)."""
        ms = 0 if seconds is None else max(1, int(round(seconds * 1000)))
        self._lib.emu_set_timeout_ms(ctypes.c_int(ms))

    def get_function(self, name):
        """The kernel ``name``, as a callable :class:`Kernel`."""
        if name not in self._params:
            raise EmulatorError('no kernel {!r} in the module (it has {})'
                                .format(name, sorted(self._params)))
        return Kernel(name, self._params[name],
                      getattr(self._lib, 'emu_launch_' + name), self._lib)


def _dims(kernel, what, value, limits):
    if isinstance(value, (int, numpy.integer)):
        value = (value,)
    if not isinstance(value, tuple) or not 1 <= len(value) <= 3:
        raise LaunchError('{} of {} must be a tuple of 1 to 3 ints, got {!r}'
                          .format(what, kernel, value))
    dims = []
    for v, limit in zip(value, limits):
        if (isinstance(v, bool)
                or not isinstance(v, (int, numpy.integer))
                or not 1 <= v <= limit):
            raise LaunchError('{} of {} must hold ints in [1, {}], got {!r}'
                              .format(what, kernel, limit, value))
        dims.append(int(v))
    return dims + [1] * (3 - len(dims))


class Device(object):

    """The device whose arrays the kernels take, bound by
    :mod:`chainer_lars.testing.emulated_cupy` when it is imported (this
    module does not import it): the array type, whether launches execute
    and are checked, and what a launch records and checks afterwards."""

    ndarray = ()

    def execute(self):
        return True

    def check(self):
        return True

    def launched(self, name):
        pass

    def check_guards(self, name):
        pass

    def check_devices(self, name, arrays):
        pass


#: The bound device (see :class:`Device`).
device = Device()


class Kernel(object):

    """A compiled kernel; called as ``kernel(grid, block, args)``."""

    def __init__(self, name, params, entry, lib):
        self.name = name
        self.params = params
        self._entry = entry
        self._lib = lib

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        if not device.execute() and not device.check():
            device.launched(self.name)
            return
        grid = _dims(self.name, 'grid', grid, _MAX_GRID)
        block = _dims(self.name, 'block', block, _MAX_BLOCK)
        if block[0] * block[1] * block[2] > _MAX_THREADS:
            raise LaunchError('block of {} has {} threads, over {}'.format(
                self.name, block[0] * block[1] * block[2], _MAX_THREADS))
        if shared_mem:
            raise LaunchError('dynamic shared memory is not emulated')
        if not isinstance(args, tuple):
            raise LaunchError('args of {} must be a tuple'.format(self.name))
        if len(args) != len(self.params):
            raise LaunchError('{} takes {} arguments ({}), got {}'.format(
                self.name, len(self.params),
                ', '.join(p.declaration for p in self.params), len(args)))
        packed = [p.pack(self.name, i, a)
                  for i, (p, a) in enumerate(zip(self.params, args))]
        pointers = (ctypes.c_void_p * max(1, len(packed)))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
              for v in packed])
        dims = ctypes.c_uint * 3
        device.check_devices(self.name, [
            a for p, a in zip(self.params, args) if p.is_pointer])
        device.launched(self.name)
        if not device.execute():
            return
        if self._entry(dims(*grid), dims(*block), pointers):
            raise EmulatorError('{}: {}'.format(
                self.name, self._lib.emu_last_error().decode()))
        device.check_guards(self.name)
