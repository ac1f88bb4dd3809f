#!/usr/bin/env python
"""Per-update cost of LARS in Chainer, against the streaming floor.

Times, on the parameter sets of three models (the MNIST MLP of Chainer's
example, a CIFAR ResNet-20 and ResNet-50) and two linear-cost sets (one
array of 32 Mi elements, ``one_32m``, and 1,000 arrays of 1 Ki elements,
``many_1k``), in float32 and float16, with weight decay on and off:

=========================  =================================================
``momentum_sgd``           Chainer's ``MomentumSGD.update()`` alone
``momentum_sgd+chainer``   the same with ``chainer.optimizer_hooks.
                           GradientLARS`` registered
``momentum_sgd+hook``      the same with ``chainer_lars.GradientLARS``
``chainer_hook``           Chainer's hook alone, ``hook(rule, param)`` for
                           every parameter
``hook``                   ``chainer_lars.GradientLARS`` alone,
                           ``hook(optimizer)`` (float16: ``hook(rule,
                           param)`` for every parameter, because called
                           with the optimizer it only defers float16
                           gradients to their update rules)
``lars``                   ``chainer_lars.LARS.update()``
``..._pa``                 the same with ``multi_tensor=False``: the
                           per-array path (``momentum_sgd+hook_pa``,
                           ``hook_pa``, ``lars_pa``)
``floor``                  the streaming floor (below)
=========================  =================================================

**The streaming floor** is the least memory traffic of any LARS that makes
two passes (the norms must be known before the gradient can be rescaled):
one read of every weight and gradient for the norms, then one more read of
both and one write of the gradient. It is timed on the same arrays with one
library call per pass and array, the fastest plain NumPy (or CuPy) calls
for each traffic pattern::

    xp.dot(w, w); xp.dot(g, g)      # BLAS, one read of w and of g
    xp.add(g, w, out=g)             # one read of both, one write of g

No LARS can do less traffic, but ``add`` does less *arithmetic* than
``g <- r * g + c * w`` (NumPy has no fused multiply-add), so on a machine
whose cores are not much faster than its memory the NumPy passes with
weight decay fall short of it, and only compiled ones (the Numba
kernels) reach it; with weight decay off the second pass is ``g *= r``,
one read fewer, and a LARS can beat it. The optimizers
(``momentum_sgd``, ``lars``) also move a momentum buffer and the weights,
so their fraction of the floor is naturally lower. For float16 on CPU,
NumPy's ``dot`` has no BLAS path; the floor is then what those same calls
cost, not a memory bound.

The targets of the CPU paths (issue 11) are printed under their cases
with PASS or FAIL, from the float32 cases: on ResNet-20, ``lars`` at most
0.6 of ``momentum_sgd`` and ``momentum_sgd+hook`` at most 1.25 of it; on
ResNet-50, ``hook`` at least 0.9 of the floor and ``lars`` faster than
``momentum_sgd``. For the linear-cost sets the time per element is
printed, so that 1,000 small arrays can be compared with one large one.

Reported: the median time per call over interleaved repetitions (the
variants run in a rotating order within each repetition, all in one
process), each variant as a fraction of the floor (``floor / variant``: 1.0
is at the floor, 0.9 is 90 %), and speed-ups between variants. Fractions
and speed-ups are medians of the per-repetition ratios, so slow drifts of a
shared machine cancel out. Each call is timed with ``time.perf_counter``
(wall) and ``time.process_time`` (this process's CPU time); the table uses
wall time unless ``--clock cpu`` is given, which on a CPU shared with
other jobs leaves out the time the process waits descheduled (set
``OPENBLAS_NUM_THREADS=1`` then, or BLAS threads add their CPU time).

Before every timed call the weights and gradients are restored from a
saved copy (not timed): hooks rewrite gradients and optimizers move the
weights. Momentum buffers are not restored; with the same gradient every
time they converge to ``step / (1 - momentum)``, so values stay bounded.
Small parameter sets (the MLP, ResNet-20) therefore start warm in the
last-level cache, as after a backward pass; ResNet-50's do not fit.

**The host cost of the GPU path** (``--gpu-host``): the GPU variants'
host code on an emulated device whose kernel launches are no-ops, beside
Chainer's ``MomentumSGD`` on CPU, interleaved in one run, as microseconds
per update and per array (``benchmarks/gpu_host.py``). The target: the
multi-tensor ``LARS`` and hook at most a quarter of ``MomentumSGD``'s CPU
cost per array on the ResNet-20 set; the mode exits with 1 if one fails.
The fraction of the H200 paper model that a GPU run reaches is printed
by ``benchmarks/paper_model.py`` (``gpu_check.sh`` calls it).

Usage::

    python benchmarks/bench_lars.py                        # CPU, everything
    python benchmarks/bench_lars.py --device 0 --json gpu.json
    python benchmarks/bench_lars.py --models mlp --reps 3
    python benchmarks/bench_lars.py --gpu-host             # no GPU needed

The exit status is 1 when a target printed FAIL (a target whose
variant raised fails too) or a case or variant raised, once the table and
the JSON are written; 2 for a usage error.

Importable: :func:`run` returns the result as a dict (what ``--json``
writes) and :func:`format_tables` prints it. CuPy is imported only for a
GPU device.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import warnings

import numpy

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import optimizer_hooks

try:
    import chainer_lars
    import chainer_lars.cpu
except ImportError:
    # Run as a script from a source checkout without installing.
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    import chainer_lars
    import chainer_lars.cpu

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import bench_flags  # NOQA: E402


MODELS = ('mlp', 'cifar_resnet20', 'resnet50', 'one_32m', 'many_1k')
#: The parameter sets whose time per element is reported.
LINEAR_COST = ('one_32m', 'many_1k')
#: ``mixed16``: float16 parameters and gradients with float32 master copies
#: (``use_fp32_update()``), as large batches are trained on GPUs.
DTYPES = ('float32', 'float16', 'mixed16')
MIXED16 = 'mixed16'
VARIANTS = ('floor', 'momentum_sgd', 'momentum_sgd+chainer',
            'momentum_sgd+hook', 'momentum_sgd+hook_pa', 'chainer_hook',
            'hook', 'hook_pa', 'lars', 'lars_pa', 'lars_float32')
#: (name, faster variant, slower variant): reported as slower / faster.
SPEEDUPS = (
    ('hook_vs_chainer_hook', 'hook', 'chainer_hook'),
    ('sgd+hook_vs_sgd+chainer', 'momentum_sgd+hook', 'momentum_sgd+chainer'),
    ('lars_vs_momentum_sgd', 'lars', 'momentum_sgd'),
    ('hook_vs_per_array', 'hook', 'hook_pa'),
    ('lars_vs_per_array', 'lars', 'lars_pa'),
)
#: (model, dtype, name, kind, variant, other, bound): the CPU targets,
#: checked on the cases of that dtype. ``ratio``: the median of the
#: per-repetition ratios variant / other at most bound; ``floor``:
#: variant's fraction of the floor at least bound; ``below``: that median
#: of variant / other less than bound. In mixed16, ``lars_float32`` is
#: LARS on float32 copies of the same parameters, timed in the same case.
TARGETS = (
    ('cifar_resnet20', 'float32', 'LARS / MomentumSGD', 'ratio', 'lars',
     'momentum_sgd', 0.6),
    ('cifar_resnet20', 'float32', '(MomentumSGD + hook) / MomentumSGD',
     'ratio', 'momentum_sgd+hook', 'momentum_sgd', 1.25),
    ('resnet50', 'float32', 'hook, fraction of the floor', 'floor', 'hook',
     None, 0.9),
    ('resnet50', 'float32', 'LARS / MomentumSGD', 'below', 'lars',
     'momentum_sgd', 1.0),
    ('resnet50', MIXED16, 'LARS / MomentumSGD, both mixed16', 'ratio',
     'lars', 'momentum_sgd', 0.5),
    ('resnet50', MIXED16, 'LARS mixed16 / LARS float32', 'ratio', 'lars',
     'lars_float32', 1.2),
)

# Hyperparameters only matter for the values, not the cost, except that
# NumPy's float16 loops take a slow path for subnormal numbers (below 6.1e-5
# in magnitude): these scales keep gradients, steps and momentum buffers
# mostly normal in float16 too, as in a well-scaled fp16 run. LARS uses an
# ImageNet-recipe rate (the trust coefficient makes its steps small).
LR = 0.1
MOMENTUM = 0.9
LARS_LR = 10.0
TRUST_COEFFICIENT = 1e-3
GRAD_SCALE = 1e-2


class MLP(chainer.Chain):

    """The MLP of Chainer's MNIST example (784-1000-1000-10)."""

    def __init__(self, n_units=1000, n_out=10):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(784, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        return self.l3(h)


class _BasicBlock(chainer.Chain):

    def __init__(self, in_channels, out_channels, stride):
        super(_BasicBlock, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(in_channels, out_channels, 3,
                                         stride, 1, nobias=True)
            self.bn1 = L.BatchNormalization(out_channels)
            self.conv2 = L.Convolution2D(out_channels, out_channels, 3, 1, 1,
                                         nobias=True)
            self.bn2 = L.BatchNormalization(out_channels)
            if stride != 1 or in_channels != out_channels:
                self.shortcut = L.Convolution2D(
                    in_channels, out_channels, 1, stride, nobias=True)
                self.bn_shortcut = L.BatchNormalization(out_channels)
            else:
                self.shortcut = None

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        s = x if self.shortcut is None else self.bn_shortcut(self.shortcut(x))
        return F.relu(h + s)


class CifarResNet20(chainer.Chain):

    """ResNet-20 for CIFAR-10 (He et al. 2016), 1x1-conv shortcuts."""

    def __init__(self, n_out=10, n_blocks=3):
        super(CifarResNet20, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 16, 3, 1, 1, nobias=True)
            self.bn = L.BatchNormalization(16)
            self.blocks = chainer.ChainList()
            in_channels = 16
            for stage, channels in enumerate((16, 32, 64)):
                for i in range(n_blocks):
                    stride = 2 if stage > 0 and i == 0 else 1
                    self.blocks.add_link(
                        _BasicBlock(in_channels, channels, stride))
                    in_channels = channels
            self.fc = L.Linear(64, n_out)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        for block in self.blocks:
            h = block(h)
        return self.fc(F.average(h, axis=(2, 3)))


class Arrays(chainer.Link):

    """Bare parameters of the given sizes (the linear-cost sets)."""

    def __init__(self, sizes):
        super(Arrays, self).__init__()
        with self.init_scope():
            for k, n in enumerate(sizes):
                setattr(self, 'p{:04d}'.format(k), chainer.Parameter(
                    chainer.initializers.Normal(0.05), (n,)))


def build_model(name, dtype):
    """The link of model ``name`` with its parameters initialised in ``dtype``.

    Nothing is run forward: the parameters are created at construction.

    """
    with chainer.using_config('dtype', numpy.dtype(dtype)):
        if name == 'mlp':
            return MLP()
        if name == 'cifar_resnet20':
            return CifarResNet20()
        if name == 'resnet50':
            return L.ResNet50Layers(pretrained_model=None)
        if name == 'one_32m':
            return Arrays([32 * 2 ** 20])
        if name == 'many_1k':
            return Arrays([2 ** 10] * 1000)
    raise ValueError('unknown model {!r}; choose from {}'.format(
        name, ', '.join(MODELS)))


class _Case(object):

    """One parameter set on one device, shared by all the variants.

    ``self.link`` holds the arrays; each variant gets its own shallow copy
    (``link.copy(mode='share')``) so that it has its own update rules and
    state while reading and writing the same weight and gradient arrays.

    """

    def __init__(self, model, dtype, device, seed):
        self.mixed16 = dtype == MIXED16
        link = build_model(model, 'float16' if self.mixed16 else dtype)
        link.to_device(device)
        rng = numpy.random.RandomState(seed)
        self.device = device
        self.link = link
        self.paths = []
        self.pairs = []
        for path, param in sorted(link.namedparams()):
            grad = rng.standard_normal(param.shape).astype(param.dtype)
            grad *= param.dtype.type(GRAD_SCALE)
            param.grad = device.send(grad)
            self.paths.append(path)
            self.pairs.append((param.array, param.grad))
        self.saved = [(w.copy(), g.copy()) for w, g in self.pairs]
        self.initial = dict(zip(self.paths, (w for w, _ in self.saved)))
        self.copies = []  # the links whose weights are their own
        # Flat views for the floor; all arrays here are C-contiguous.
        self.flat = [(w.reshape(-1), g.reshape(-1)) for w, g in self.pairs]
        self.n_params = sum(w.size for w, _ in self.pairs)
        self.n_bytes = sum(w.nbytes for w, _ in self.pairs)

    def restore(self):
        xp = self.device.xp
        for (w, g), (w0, g0) in zip(self.pairs, self.saved):
            xp.copyto(w, w0)
            xp.copyto(g, g0)
        # The copies' own weights and float32 master copies too: left to
        # drift, LARS's steps (a fraction of the weight's norm) with the
        # same gradient every time would grow them to inf within a few
        # hundred updates, and the case would time arithmetic on inf.
        for copy in self.copies:
            for path, param in copy.namedparams():
                xp.copyto(param.array, self.initial[path], casting='unsafe')
                master = getattr(param.update_rule, '_fp32_param', None)
                if master is not None and master.array is not None:
                    xp.copyto(master.array, self.initial[path])

    def float32_copy(self):
        """A float32 copy of the link, with float32 gradients."""
        copy = self.link.copy(mode='copy')
        for path, param in copy.namedparams():
            param.array = param.array.astype(numpy.float32)
        for param, (_, g) in zip(
                (dict(copy.namedparams())[p] for p in self.paths),
                self.pairs):
            param.grad = g.astype(numpy.float32)
        self.copies.append(copy)
        return copy

    def share(self):
        """A copy of the link whose parameters hold the same arrays
        (mixed16: arrays of their own, since Chainer's fp32 update assigns
        each rule's parameter a new float16 array, which the parameters of
        a shared copy share: every other variant would see its arrays
        replaced, and its plan made anew, at each update)."""
        copy = self.link.copy(mode='copy' if self.mixed16 else 'share')
        params = dict(copy.namedparams())
        for path, (_, g) in zip(self.paths, self.pairs):
            params[path].grad = g
        if self.mixed16:
            self.copies.append(copy)
        return copy


def _make_variants(case, weight_decay):
    """``{name: callable}``: one timed call of each variant on ``case``."""
    xp = case.device.xp
    variants = {}
    # mixed16: the float32 floor, on float32 copies (the masters' traffic).
    flat = case.flat
    if case.mixed16:
        flat = [(w.astype(numpy.float32), g.astype(numpy.float32))
                for w, g in flat]

    def floor():
        for w, g in flat:
            xp.dot(w, w)
            xp.dot(g, g)
            xp.add(g, w, out=g)
    variants['floor'] = floor

    def fp32_update(opt):
        if case.mixed16:
            opt.use_fp32_update()
        return opt

    def momentum_sgd(hook=None):
        opt = chainer.optimizers.MomentumSGD(lr=LR, momentum=MOMENTUM)
        fp32_update(opt).setup(case.share())
        if hook is not None:
            opt.add_hook(hook)
        return opt.update

    variants['momentum_sgd'] = momentum_sgd()
    variants['momentum_sgd+chainer'] = momentum_sgd(
        optimizer_hooks.GradientLARS(weight_decay=weight_decay))
    variants['momentum_sgd+hook'] = momentum_sgd(
        chainer_lars.GradientLARS(weight_decay=weight_decay))
    variants['momentum_sgd+hook_pa'] = momentum_sgd(
        chainer_lars.GradientLARS(weight_decay=weight_decay,
                                  multi_tensor=False))

    for name, multi_tensor in (('lars', True), ('lars_pa', False)):
        lars = chainer_lars.LARS(lr=LARS_LR, momentum=MOMENTUM,
                                 weight_decay=weight_decay,
                                 trust_coefficient=TRUST_COEFFICIENT,
                                 multi_tensor=multi_tensor)
        fp32_update(lars).setup(case.share())
        variants[name] = lars.update
    if case.mixed16:
        # The same update of float32 parameters of the same sizes, timed
        # in turn with the others: mixed16 against float32 in one run.
        lars = chainer_lars.LARS(lr=LARS_LR, momentum=MOMENTUM,
                                 weight_decay=weight_decay,
                                 trust_coefficient=TRUST_COEFFICIENT)
        lars.setup(case.float32_copy())
        variants['lars_float32'] = lars.update
        # The hooks alone would rescale the float16 gradients, which in
        # mixed16 their delegates rescale on the masters inside the rules.
        return variants

    target = case.share()
    opt = chainer.optimizers.MomentumSGD(lr=LR, momentum=MOMENTUM)
    opt.setup(target)
    rules_params = [(p.update_rule, p) for _, p in sorted(
        target.namedparams())]

    chainer_hook = optimizer_hooks.GradientLARS(weight_decay=weight_decay)

    def chainer_hook_alone():
        for rule, param in rules_params:
            chainer_hook(rule, param)
    variants['chainer_hook'] = chainer_hook_alone

    fp16 = any(g.dtype == numpy.float16 for _, g in case.pairs)
    for name, multi_tensor in (('hook', True), ('hook_pa', False)):
        variants[name] = _hook_alone(
            chainer_lars.GradientLARS(weight_decay=weight_decay,
                                      multi_tensor=multi_tensor),
            opt, rules_params, fp16)
    return variants


def _hook_alone(hook, opt, rules_params, fp16):
    if fp16:
        def hook_alone():
            for rule, param in rules_params:
                hook(rule, param)
    else:
        def hook_alone():
            hook(opt)
    return hook_alone


def _synchronizer(device):
    if device.xp is numpy:
        return lambda: None
    return device.device.synchronize


def _median_ratio(num, den):
    return float(numpy.median(numpy.asarray(num) / numpy.asarray(den)))


def run_case(model, dtype, weight_decay, device, reps, warmup, seed=0,
             clock='wall', case_seconds=None):
    """Times every variant on one parameter set; returns a dict.

    Both clocks are recorded; ``clock`` says which one the medians, floor
    fractions and speed-ups are computed from. With ``case_seconds``, the
    case stops after the first repetition that ends past that many seconds
    of timed repetitions, but not before 3 (NumPy's float16 loops make
    ResNet-50 in fp16 some 20 times slower than fp32).

    """
    case = _Case(model, dtype, device, seed)
    variants = _make_variants(case, weight_decay)
    sync = _synchronizer(device)
    names = [v for v in VARIANTS if v in variants]
    errors = {}
    times = {name: [] for name in names}
    cpu_times = {name: [] for name in names}
    timed_since = None
    done = 0
    for rep in range(warmup + reps):
        if rep == warmup:
            timed_since = time.perf_counter()
        elif (case_seconds is not None and done >= 3
              and time.perf_counter() - timed_since > case_seconds):
            break
        if rep >= warmup:
            done += 1
        # Rotate the order so that no variant always follows the same one.
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            case.restore()
            sync()
            start_cpu = time.process_time()
            start = time.perf_counter()
            try:
                variants[name]()
                sync()
            except Exception as e:  # report it and go on with the others
                errors[name] = '{}: {}'.format(type(e).__name__, e)
                continue
            elapsed = time.perf_counter() - start
            elapsed_cpu = time.process_time() - start_cpu
            if rep >= warmup:
                times[name].append(elapsed)
                cpu_times[name].append(elapsed_cpu)
    ok = [n for n in names if n not in errors]
    basis = times if clock == 'wall' else cpu_times
    median = {n: float(numpy.median(basis[n])) for n in ok}
    fraction = {}
    if 'floor' in median:
        fraction = {n: _median_ratio(basis['floor'], basis[n]) for n in ok}
    speedups = {name: _median_ratio(basis[slow], basis[fast])
                for name, fast, slow in SPEEDUPS
                if fast in median and slow in median}
    targets = []
    if device.xp is numpy:
        targets = _targets(model, dtype, basis, median, fraction)
    return {
        'model': model, 'dtype': dtype, 'weight_decay': weight_decay,
        'n_arrays': len(case.pairs), 'n_params': case.n_params,
        'bytes_per_array_set': case.n_bytes, 'reps': done,
        'median_s': median, 'floor_fraction': fraction,
        'speedups': speedups, 'targets': targets, 'clock': clock,
        'times_s': times, 'cpu_times_s': cpu_times, 'errors': errors,
    }


_OPS = {'floor': '>=', 'ratio': '<=', 'below': '<'}


def _targets(model, dtype, basis, median, fraction):
    """The :data:`TARGETS` of ``model`` and ``dtype`` within one case, each
    with its value and verdict; one whose variant failed (or whose case
    did: empty ``median``) fails, its value ``None``."""
    out = []
    for target in TARGETS:
        target_model, target_dtype, name, kind, variant, other, bound = target
        if target_model != model or target_dtype != dtype:
            continue
        op = _OPS[kind]
        missing = [v for v in (variant, other)
                   if v is not None and v not in median]
        if missing:
            out.append({'name': name, 'value': None, 'op': op,
                        'bound': bound, 'pass': False,
                        'failed': ', '.join(missing)})
            continue
        if kind == 'floor':
            value = fraction.get(variant)
            ok = value is not None and value >= bound
        else:
            value = _median_ratio(basis[variant], basis[other])
            ok = value <= bound if kind == 'ratio' else value < bound
        out.append({'name': name, 'value': value, 'op': op, 'bound': bound,
                    'pass': bool(ok)})
    return out


def _verdict(t):
    """A target as ``value op bound  PASS`` (or ``FAIL``)."""
    if t['value'] is None:
        return '{} {:g}  FAIL ({} failed)'.format(t['op'], t['bound'],
                                                  t.get('failed', 'it'))
    return '{:.3f} {} {:g}  {}'.format(t['value'], t['op'], t['bound'],
                                       'PASS' if t['pass'] else 'FAIL')


def failures(result):
    """What failed in a :func:`run` result, one line each: targets missed,
    cases and variants that raised. Empty when everything passed."""
    lines = []
    for c in result['cases']:
        name = '{} {} wd={:g}'.format(c['model'], c['dtype'],
                                      c['weight_decay'])
        if 'error' in c:
            lines.append('{}: case failed: {}'.format(name, c['error']))
        for v, e in sorted(c.get('errors', {}).items()):
            lines.append('{}: {} failed: {}'.format(name, v, e))
        for t in c.get('targets', ()):
            if not t['pass']:
                lines.append('{}: target {}: {}'.format(name, t['name'],
                                                        _verdict(t)))
    return lines


def _cpu_model():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(
            ['git', 'describe', '--always', '--dirty', '--abbrev=12'],
            cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() or None


def _installed(name):
    """The version of the distribution ``name`` installed, or ``None``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(device):
    """What the numbers depend on, recorded beside them."""
    info = {
        'python': platform.python_version(),
        'numpy': numpy.__version__,
        'chainer': chainer.__version__,
        'chainer_lars': chainer_lars.__version__,
        'numba': _installed('numba'),
        'git': _git_commit(),
        # Numba-compiled or chunked NumPy passes for float32/float64.
        'cpu_kernels': chainer_lars.cpu.backend(),
        'cpu': _cpu_model(),
        'cpu_count': os.cpu_count(),
        'threads_env': {k: os.environ.get(k) for k in (
            'OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS',
            'OPENBLAS_CORETYPE')},
        'device': str(device),
    }
    if hasattr(os, 'getloadavg'):
        # Other processes on a shared machine show up here, not in the times.
        info['loadavg_1_5_15'] = os.getloadavg()
    if hasattr(os, 'sched_getaffinity'):
        info['cpus_usable'] = len(os.sched_getaffinity(0))
    if device.xp is not numpy:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(device.device.id)
        name = props['name']
        info['gpu'] = name.decode() if isinstance(name, bytes) else name
        info['cupy'] = cupy.__version__
    return info


def run(models=MODELS, dtypes=DTYPES, weight_decays=(5e-4, 0.0),
        device='@numpy', reps=15, warmup=2, seed=0, clock='wall',
        case_seconds=None, log=None):
    """Runs every case; returns ``{'machine': ..., 'cases': [...]}``."""
    for model in models:
        if model not in MODELS:
            raise ValueError('unknown model {!r}; choose from {}'.format(
                model, ', '.join(MODELS)))
    for dtype in dtypes:
        if dtype != MIXED16 and numpy.dtype(dtype).kind != 'f':
            raise ValueError('dtypes must be floating point, not {!r}'.format(
                dtype))
    device = chainer.get_device(device)
    if device.xp is chainer.backend.chainerx:
        raise ValueError('ChainerX devices are not benchmarked; use '
                         '@numpy or @cupy:N')
    if clock not in ('wall', 'cpu'):
        raise ValueError("clock must be 'wall' or 'cpu', not {!r}".format(
            clock))
    if clock == 'cpu' and device.xp is not numpy:
        raise ValueError('--clock cpu measures the host only; use wall '
                         'time on a GPU')
    device.use()
    start = time.perf_counter()
    result = {'machine': machine_info(device), 'reps': reps,
              'warmup': warmup, 'clock': clock, 'cases': []}
    for model in models:
        for dtype in dtypes:
            for wd in weight_decays:
                try:
                    case = run_case(model, dtype, wd, device, reps, warmup,
                                    seed, clock, case_seconds)
                except Exception as e:  # keep the other cases (GPU budget)
                    case = {'model': model, 'dtype': dtype,
                            'weight_decay': wd,
                            'error': '{}: {}'.format(type(e).__name__, e),
                            'targets': [] if device.xp is not numpy else
                            _targets(model, dtype, {}, {}, {})}
                result['cases'].append(case)
                if log is not None:
                    log(format_tables({'cases': [case]}, header=False))
    if hasattr(os, 'getloadavg'):
        result['machine']['loadavg_1_5_15_at_end'] = os.getloadavg()
    # What a run of these cases takes, for the README's commands.
    result['machine']['run_seconds'] = round(time.perf_counter() - start, 1)
    return result


_SHORT = {'floor': 'floor', 'momentum_sgd': 'sgd',
          'momentum_sgd+chainer': 'sgd+ch', 'momentum_sgd+hook': 'sgd+ours',
          'momentum_sgd+hook_pa': 'sgd+o_pa', 'chainer_hook': 'ch_hook',
          'hook': 'our_hook', 'hook_pa': 'hook_pa', 'lars': 'LARS',
          'lars_pa': 'LARS_pa', 'lars_float32': 'LARS_f32'}


#: The speed-up columns' heads, as :data:`SPEEDUPS` computes them: the
#: slower variant over the faster.
_SPEEDUP_LABELS = ('ch/hook', 'sgd+ch/sgd+ours', 'sgd/LARS', 'pa/hook',
                   'pa/LARS')


def format_tables(result, header=True):
    """The result as text: two lines per case (times, then fractions)."""
    cols = ' '.join('{:>8}'.format(_SHORT[v]) for v in VARIANTS)
    lines = []
    if header:
        lines.append('clock: {}; ms = median per call; frac = floor / '
                     'variant; speed-ups = slower / faster'.format(
                         result.get('clock', 'wall')))
        lines.append('{:<30} {:>6} {:>4}      {} | {}'.format(
            'model dtype weight_decay', 'MiB', 'reps', cols,
            ' '.join(_SPEEDUP_LABELS)))
    for c in result['cases']:
        name = '{} {} {:g}'.format(c['model'], c['dtype'], c['weight_decay'])
        if 'error' in c:
            lines.append('{:<30} case failed: {}'.format(name, c['error']))
            lines += ['    target {}: {}'.format(t['name'], _verdict(t))
                      for t in c.get('targets', ())]
            continue
        ms = ' '.join(
            '{:8.3f}'.format(1e3 * c['median_s'][v]) if v in c['median_s']
            else '{:>8}'.format('error' if v in c['errors'] else '-')
            for v in VARIANTS)
        frac = ' '.join(
            '{:8.2f}'.format(c['floor_fraction'][v])
            if v in c['floor_fraction'] else '{:>8}'.format('-')
            for v in VARIANTS)
        sp = ' '.join(
            '{:>6.2f}x'.format(c['speedups'][s]) if s in c['speedups']
            else '{:>7}'.format('-') for s, _, _ in SPEEDUPS)
        lines.append('{:<30} {:6.1f} {:4d} ms   {} |'.format(
            name, c['bytes_per_array_set'] / 2.0 ** 20, c['reps'], ms))
        lines.append('{:<42} frac {} | {}'.format('', frac, sp))
        if c['model'] in LINEAR_COST:
            per = ' '.join(
                '{:8.3f}'.format(1e9 * c['median_s'][v] / c['n_params'])
                if v in c['median_s'] else '{:>8}'.format('-')
                for v in VARIANTS)
            lines.append('{:<42} ns/e {} |'.format('', per))
        for t in c.get('targets', ()):
            lines.append('    target {}: {}'.format(t['name'], _verdict(t)))
        for v, e in sorted(c['errors'].items()):
            lines.append('    {} failed: {}'.format(v, e))
    return '\n'.join(lines)


def summary(result):
    """The targets' verdicts and the linear-cost comparison, as lines."""
    lines = []
    targets = [(c, t) for c in result['cases'] for t in c.get('targets', ())]
    cases = [c for c in result['cases'] if 'error' not in c]
    if targets:
        lines.append('\ntargets ({} clock):'.format(
            result.get('clock', 'wall')))
        for c, t in targets:
            lines.append('  {} {} wd={:g}: {} = {}'.format(
                c['model'], c['dtype'], c['weight_decay'], t['name'],
                _verdict(t)))
    by_key = {(c['model'], c['dtype'], c['weight_decay']): c for c in cases}
    pairs = [(c, by_key.get(('many_1k', c['dtype'], c['weight_decay'])))
             for c in cases if c['model'] == 'one_32m']
    pairs = [(one, many) for one, many in pairs if many is not None]
    if pairs:
        lines.append('\nlinear cost: time per element of 1,000 arrays of '
                     '1 Ki / one array of 32 Mi')
        for one, many in pairs:
            ratios = ' '.join(
                '{}={:.2f}'.format(_SHORT[v], (
                    many['median_s'][v] / many['n_params'])
                    / (one['median_s'][v] / one['n_params']))
                for v in VARIANTS
                if v in one['median_s'] and v in many['median_s'])
            lines.append('  {} wd={:g}: {}'.format(
                one['dtype'], one['weight_decay'], ratios))
    return lines


def _gpu_host(args, argv):
    """The ``--gpu-host`` mode; exits 1 if a target fails."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import gpu_host

    results, ok = [], True
    for model in args.models:
        result = gpu_host.run(build_model, model, args.reps,
                              max(args.warmup, 1))
        for line in gpu_host.format_result(result):
            print(line, flush=True)
        ok &= all(t['pass'] for t in result['targets'])
        results.append(result)
    m = machine_info(chainer.get_device('@numpy'))
    print('\n{} ({} CPUs usable), python {}, numpy {}, chainer {}, git {}; '
          'load average (1, 5, 15 min) at the end {}'.format(
              m['cpu'], m.get('cpus_usable', m['cpu_count']), m['python'],
              m['numpy'], m['chainer'], m['git'],
              ' '.join('{:.2f}'.format(x)
                       for x in m.get('loadavg_1_5_15', ()))))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'gpu_host': results, 'machine': m}, f, indent=1,
                      sort_keys=True)
    if not ok:
        sys.exit(1)
    return results


class ListFlag(argparse.Action):

    """A flag of one or more values, space- or comma-separated.

    ``--dtypes float32 float16`` and ``--dtypes float32,float16`` are
    the same, here and in ``examples/mnist/results.py``. ``type`` checks
    each value (an ``argparse.ArgumentTypeError`` is a usage error).
    """

    def __init__(self, option_strings, dest, type=str, **kwargs):
        self._kind = type
        super(ListFlag, self).__init__(option_strings, dest, nargs='+',
                                       **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parsed = []
        for value in (v for token in values for v in token.split(',') if v):
            try:
                parsed.append(self._kind(value))
            except (argparse.ArgumentTypeError, TypeError,
                    ValueError) as e:
                parser.error('{} {}: {}'.format(
                    option_string, value,
                    e if isinstance(e, argparse.ArgumentTypeError)
                    else 'not a valid value'))
        setattr(namespace, self.dest, tuple(parsed))


def _model(name):
    if name not in MODELS:
        raise argparse.ArgumentTypeError(
            'unknown model; choose from ' + ', '.join(MODELS))
    return name


def _float_dtype(name):
    if name == MIXED16:
        return name
    try:
        kind = numpy.dtype(name).kind
    except TypeError:
        raise argparse.ArgumentTypeError('not a NumPy dtype')
    if kind != 'f':
        raise argparse.ArgumentTypeError(
            'not a floating-point dtype (LARS updates float16, float32 '
            'and float64 parameters)')
    return name


def _weight_decay(text):
    value = float(text)
    if not 0 <= value < float('inf'):
        raise argparse.ArgumentTypeError('must be finite and at least 0')
    return value


def parse_args(argv=None):
    """The flags, or a usage error (exit status 2) naming the bad one."""
    parser = argparse.ArgumentParser(
        description='Per-update cost of LARS against the streaming floor.')
    parser.add_argument('--device', '-d', default=None,
                        help='Chainer device specifier: @numpy, -1, '
                             '@cupy:0, 0 (default: @numpy)')
    parser.add_argument('--models', action=ListFlag, type=_model,
                        default=None,
                        help='one or more of ' + ', '.join(MODELS)
                        + ', space- or comma-separated (default: all; '
                        'with --gpu-host, cifar_resnet20)')
    parser.add_argument('--dtypes', action=ListFlag, type=_float_dtype,
                        default=None,
                        help='one or more floating-point dtypes, space- or '
                        'comma-separated (default: {})'.format(
                            ' '.join(DTYPES)))
    parser.add_argument('--weight-decays', action=ListFlag,
                        type=_weight_decay, default=None,
                        help='one or more, space- or comma-separated; 0 is '
                        'weight decay off (default: 0.0005 0)')
    parser.add_argument('--reps', type=int, default=None,
                        help='timed repetitions of every variant (default '
                             '15; with --gpu-host, 300)')
    parser.add_argument('--warmup', type=int, default=2,
                        help='untimed repetitions first (state, kernels) '
                        '(default: %(default)s)')
    parser.add_argument('--clock', choices=('wall', 'cpu'), default=None,
                        help='what the table is computed from: wall time '
                             '(perf_counter) or, on a CPU shared with other '
                             'jobs, this process\'s CPU time (process_time, '
                             'which leaves out time spent descheduled); both '
                             'are in the JSON (default: wall)')
    parser.add_argument('--case-seconds', type=float, default=None,
                        help='stop a case after this many seconds of timed '
                             'repetitions (at least 3 are run)')
    parser.add_argument('--seed', type=int, default=None,
                        help='of the random gradients (default: 0)')
    parser.add_argument('--json', help='also write the result here')
    parser.add_argument('--gpu-host', action='store_true',
                        help='time the host code of the GPU path instead, '
                             'on an emulated device whose launches are '
                             'no-ops, beside MomentumSGD on CPU (see '
                             'benchmarks/gpu_host.py); exits 1 if a target '
                             'fails')
    args = parser.parse_args(argv)
    if args.gpu_host:
        # The mode times the emulated device beside the CPU, in float32
        # on the models' own arrays: these would be silently ignored.
        given = [flag for flag, dest in (
            ('--device', 'device'), ('--dtypes', 'dtypes'),
            ('--weight-decays', 'weight_decays'), ('--clock', 'clock'),
            ('--case-seconds', 'case_seconds'), ('--seed', 'seed'))
            if getattr(args, dest) is not None]
        if given:
            parser.error('--gpu-host takes --models, --reps, --warmup and '
                         '--json only, not {}'.format(', '.join(given)))
    for dest, default in (('device', '@numpy'), ('dtypes', DTYPES),
                          ('weight_decays', (5e-4, 0.0)), ('clock', 'wall'),
                          ('seed', 0)):
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    if args.reps is None:
        args.reps = 300 if args.gpu_host else 15
    if args.models is None:
        args.models = ('cifar_resnet20',) if args.gpu_host else MODELS
    if args.reps < 1 or args.warmup < 0:
        parser.error('--reps must be >= 1 and --warmup >= 0')
    if args.case_seconds is not None and not args.case_seconds > 0:
        parser.error('--case-seconds must be positive, got {}'.format(
            args.case_seconds))
    if args.seed < 0:
        parser.error('--seed must be at least 0, got {}'.format(args.seed))
    if not args.gpu_host:
        device = bench_flags.device(parser, args.device)
        if args.clock == 'cpu' and device.xp is not numpy:
            parser.error('--clock cpu measures the host only; use wall '
                         'time on a GPU')
    bench_flags.output_file(parser, '--json', args.json)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.gpu_host:
        return _gpu_host(args, argv)

    print(format_tables({'cases': [], 'clock': args.clock}))
    with warnings.catch_warnings():
        # float16 without master copies is timed on purpose.
        warnings.filterwarnings('ignore', '.* rounded away in float16',
                                RuntimeWarning)
        result = run(args.models, args.dtypes, args.weight_decays,
                     args.device, args.reps, args.warmup, args.seed,
                     args.clock, args.case_seconds,
                     log=lambda s: print(s, flush=True))
    result['command'] = ' '.join(
        [os.path.basename(sys.executable)] + sys.argv if argv is None
        else ['bench_lars.py'] + list(argv))
    m = result['machine']
    print('\n{} ({} CPUs usable), numpy {}, chainer {}, git {}, CPU kernels '
          '{}, device {}{}; thread env {}'.format(
              m['cpu'], m.get('cpus_usable', m['cpu_count']), m['numpy'],
              m['chainer'], m['git'], m['cpu_kernels'], m['device'],
              ' ({})'.format(m['gpu']) if 'gpu' in m else '',
              {k: v for k, v in m['threads_env'].items() if v is not None}))
    if 'loadavg_1_5_15' in m:
        print('load average (1, 5, 15 min) at start {}, at end {}'.format(
            *('{:.2f} {:.2f} {:.2f}'.format(*m[k]) for k in (
                'loadavg_1_5_15', 'loadavg_1_5_15_at_end'))))
    for line in summary(result):
        print(line)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1, sort_keys=True)
    failed = failures(result)
    if failed:
        print('\nFAILED ({}): {}'.format(len(failed), '; '.join(failed)))
        sys.exit(1)
    return result


if __name__ == '__main__':
    main()
