#!/usr/bin/env python
"""One update of LARS and LAMB beside the optimizers a GPU user would take
instead, on the same parameter shapes, one process per framework.

On each shape set (``shape_sets.py``: ResNet-50's arrays and BERT-large's),
it times one update of:

* ours: ``chainer_lars.LARS``, ``chainer_lars.LAMB`` and Chainer's
  ``MomentumSGD`` with ``chainer_lars.GradientLARS``, in float32 and in
  mixed16 (float16 parameters with float32 masters, ``use_fp32_update()``);
* Chainer's ``MomentumSGD`` and ``Adam``, in float32 and mixed16;
* PyTorch's ``SGD`` and ``Adam``, each for-loop (``foreach=False``),
  ``foreach`` and ``fused``; timm's ``Lars`` and ``Lamb``; apex's
  ``FusedLAMB`` where it imports (all float32: PyTorch's mixed precision
  keeps float32 parameters).

Chainer's rows run in one process and PyTorch's in another (each a run of
this script with ``--worker``), one after the other, so that neither
framework's allocator or threads disturb the other's.

**Method.** Before every update, each parameter gets a new gradient array,
as backward makes them (the old one dropped first, then a spacer of random
size allocated, so that the memory pool need not hand out the same
addresses again: the JSON records how often they changed). The update is
timed as ``cupyx.profiler.benchmark`` times a call: CUDA events recorded
on the stream before and after it (GPU time), ``time.perf_counter``
around the call (host time), and until the end event has completed (wall
time). Medians over ``--reps`` updates after ``--warmup``. In each process,
a device-to-device copy of ``--copy-mib`` MiB is timed the same way; its
bandwidth (bytes read plus written per second) turns each update's time
into bytes per parameter (``time x bandwidth / parameters``), shown beside
the update's byte floor (``paper_model.floor_bytes``: the fewest bytes
any implementation of that update moves) and their ratio. On a CPU there
is no GPU time and the wall time stands in.

Below each table: the issue's goals, as ratios of wall times (ours
against timm's ``Lars`` and ``Lamb``, and against PyTorch's fused ``SGD``
and ``Adam``). Ours and PyTorch's are timed in separate processes with
no shared control but the device copy (which follows the device's
bandwidth, not the host's speed): a ratio near its bound can fall on
either side of it from one run to another, which the output's header
says.

``--timeout`` is for all the processes together: each gets the time
left over the processes still to run. ``--json`` and ``--markdown`` are
written after each process (naming the ones still to run), so a run
stopped from outside keeps what was done.

Usage::

    python benchmarks/gpu_peers.py --device 0 --json peers.json \\
        --markdown peers.md
    python benchmarks/gpu_peers.py --device @numpy --sets tiny  # CPU smoke

The exit status is 1 when a worker failed or one of our or Chainer's rows
did (a peer that is not installed is 'not available', not a failure).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import bench_flags  # NOQA: E402
import paper_model  # NOQA: E402
import shape_sets  # NOQA: E402

FRAMEWORKS = ('chainer', 'torch')
PRECISIONS = ('float32', 'mixed16')

# Hyperparameters matter only for the values, which must stay finite over
# a few dozen updates; the same across frameworks where they have them.
LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
LAMB_LR = 1e-3
LAMB_WEIGHT_DECAY = 0.01
W_SCALE = 0.05
G_SCALE = 1e-2

#: (label, framework, byte floor's update): every row, in table order;
#: the Chainer rows run in float32 and mixed16, the others in float32.
ROWS = (
    ('chainer_lars.LARS', 'chainer', 'lars'),
    ('chainer_lars.LAMB', 'chainer', 'lamb'),
    ('MomentumSGD + chainer_lars.GradientLARS', 'chainer', 'lars'),
    ('chainer MomentumSGD', 'chainer', 'momentum_sgd'),
    ('chainer Adam', 'chainer', 'adam'),
    ('torch SGD for-loop', 'torch', 'momentum_sgd'),
    ('torch SGD foreach', 'torch', 'momentum_sgd'),
    ('torch SGD fused', 'torch', 'momentum_sgd'),
    ('torch Adam for-loop', 'torch', 'adam'),
    ('torch Adam foreach', 'torch', 'adam'),
    ('torch Adam fused', 'torch', 'adam'),
    ('timm Lars', 'torch', 'lars'),
    ('timm Lamb', 'torch', 'lamb'),
    ('apex FusedLAMB', 'torch', 'lamb'),
)
#: (ours, peer, bound): the goals of issue 46, on float32 wall times.
GOALS = (
    ('chainer_lars.LARS', 'timm Lars', 1.0),
    ('chainer_lars.LAMB', 'timm Lamb', 1.0),
    ('chainer_lars.LARS', 'torch SGD fused', 1.5),
    ('chainer_lars.LAMB', 'torch Adam fused', 1.5),
)


def parse_device(spec):
    """``None`` for the CPU (``@numpy``, ``-1``), else the GPU's number
    (``0``, ``@cupy:0``); ``ValueError`` for anything else."""
    text = str(spec).strip()
    if text in ('@numpy', '-1'):
        return None
    if text.startswith('@cupy:'):
        text = text[len('@cupy:'):]
    if text.isdigit():
        return int(text)
    raise ValueError('{!r} is not @numpy, -1, a GPU number or @cupy:N'
                     .format(spec))


def _median(values):
    return float(numpy.median(values)) if values else None


class _Timer(object):

    """Times calls the way ``cupyx.profiler.benchmark`` does: events on
    the stream around the call (GPU), ``perf_counter`` around the call
    (host) and until the end event completed (wall). ``events``: a
    function returning two fresh events, or ``None`` on the CPU;
    ``elapsed(start, end)`` in milliseconds."""

    def __init__(self, sync, events=None, elapsed=None):
        self.sync = sync
        self.events = events
        self.elapsed = elapsed

    def __call__(self, fn):
        """``(wall s, host s, GPU s or None)`` of one call of ``fn``."""
        self.sync()
        if self.events is not None:
            start_event, end_event = self.events()
            start_event.record()
        start = time.perf_counter()
        fn()
        returned = time.perf_counter()
        gpu = None
        if self.events is not None:
            end_event.record()
            end_event.synchronize()
            gpu = self.elapsed(start_event, end_event) * 1e-3
        else:
            self.sync()
        return time.perf_counter() - start, returned - start, gpu


def time_updates(update, renew, timer, reps, warmup, address=None):
    """Runs ``renew`` (new gradients, untimed) then ``update`` (timed),
    ``warmup + reps`` times; returns medians and how often the gradients'
    addresses (``address()``: a tuple) changed from one update to the
    next."""
    walls, hosts, gpus = [], [], []
    changed, last = 0, None
    for rep in range(warmup + reps):
        renew()
        if address is not None:
            now = address()
            changed += last is not None and now != last
            last = now
        wall, host, gpu = timer(update)
        if rep >= warmup:
            walls.append(wall)
            hosts.append(host)
            if gpu is not None:
                gpus.append(gpu)
    out = {'wall_s': _median(walls), 'host_s': _median(hosts),
           'gpu_s': _median(gpus), 'reps': reps}
    if address is not None:
        out['new_addresses'] = changed / max(warmup + reps - 1, 1)
    return out


def bandwidth(copy, nbytes, timer, reps=20, warmup=3):
    """Bytes read plus written per second of ``copy()`` moving
    ``nbytes``, from its median GPU time (wall time on a CPU)."""
    times = time_updates(copy, lambda: None, timer, reps, warmup)
    t = times['gpu_s'] if times['gpu_s'] is not None else times['wall_s']
    return {'bytes': nbytes, 'seconds': t, 'bandwidth': 2.0 * nbytes / t}


def _row_result(label, framework, floor, precision, shape_set, times,
                bw):
    """One row of the table: the times and what they are worth in bytes
    per parameter at the copy bandwidth ``bw`` of the same process."""
    row = {'update': label, 'framework': framework, 'floor': floor,
           'precision': precision, 'set': shape_set['name'],
           'n_params': shape_set['n_params'],
           'n_arrays': shape_set['n_arrays'],
           'floor_bytes': paper_model.floor_bytes(floor, precision)}
    row.update(times)
    t = times['gpu_s'] if times.get('gpu_s') is not None else times.get(
        'wall_s')
    if t is not None and bw:
        row['bytes_per_param'] = t * bw / shape_set['n_params']
        row['x_floor'] = row['bytes_per_param'] / row['floor_bytes']
    return row


def _failed(label, framework, floor, precision, shape_set, message,
            key='error'):
    row = _row_result(label, framework, floor, precision, shape_set, {},
                      None)
    row[key] = message
    return row


def _spacer_size(rng):
    """Bytes of a spacer: an array of random size allocated before the new
    gradients, so that they need not land where the last ones were."""
    return int(rng.randint(1, 1 << 16)) * 64


# --- Chainer's process -----------------------------------------------------

def _import_chainer_lars():
    try:
        import chainer_lars
    except ImportError:
        # Run from a source checkout without installing.
        sys.path.insert(0, os.path.dirname(_HERE))
        import chainer_lars
    return chainer_lars


def _chainer_makers():
    import chainer
    chainer_lars = _import_chainer_lars()

    def lars():
        return chainer_lars.LARS(lr=LR, momentum=MOMENTUM,
                                 weight_decay=WEIGHT_DECAY), None

    def lamb():
        return chainer_lars.LAMB(alpha=LAMB_LR,
                                 weight_decay_rate=LAMB_WEIGHT_DECAY), None

    def hook():
        return (chainer.optimizers.MomentumSGD(lr=LR, momentum=MOMENTUM),
                chainer_lars.GradientLARS(weight_decay=WEIGHT_DECAY))

    def momentum_sgd():
        return chainer.optimizers.MomentumSGD(lr=LR, momentum=MOMENTUM), None

    def adam():
        return chainer.optimizers.Adam(alpha=LAMB_LR), None

    return {'chainer_lars.LARS': lars, 'chainer_lars.LAMB': lamb,
            'MomentumSGD + chainer_lars.GradientLARS': hook,
            'chainer MomentumSGD': momentum_sgd, 'chainer Adam': adam}


def chainer_link(shapes, precision, device, seed=0):
    """A link holding one parameter per shape on ``device`` (a Chainer
    device), float16 in mixed16, else ``precision``, with random weights;
    and one saved random gradient per parameter (same dtype)."""
    import chainer
    xp = device.xp
    dtype = numpy.float16 if precision == 'mixed16' else numpy.dtype(
        precision)
    rng = xp.random.RandomState(seed)

    def draw(shape, scale):
        if xp is numpy:
            a = rng.standard_normal(shape).astype(numpy.float32)
        else:
            a = rng.standard_normal(tuple(shape), dtype=numpy.float32)
        a *= scale
        return a.astype(dtype)

    link = chainer.Link()
    grads = []
    with link.init_scope():
        for k, shape in enumerate(shapes):
            setattr(link, 'p{:04d}'.format(k),
                    chainer.Parameter(draw(shape, W_SCALE)))
            grads.append(draw(shape, G_SCALE))
    # The arrays are there already (no copy); the link learns its device.
    link.to_device(device)
    return link, grads


def chainer_timer(device):
    """A :class:`_Timer` for a Chainer device, and a function that gives
    the memory pool's free blocks back."""
    if device.xp is numpy:
        return _Timer(lambda: None), lambda: None
    import cupy
    return (_Timer(device.device.synchronize,
                   lambda: (cupy.cuda.Event(), cupy.cuda.Event()),
                   cupy.cuda.get_elapsed_time),
            cupy.get_default_memory_pool().free_all_blocks)


def chainer_copy(device, nbytes, seed=0):
    """A function that copies ``nbytes`` (rounded down to float32s) of
    random data from one array to another on ``device`` (on a GPU, one
    device-to-device ``cudaMemcpyAsync``), and the bytes it copies."""
    n = nbytes // 4
    if device.xp is numpy:
        a = numpy.random.RandomState(seed).standard_normal(n).astype(
            numpy.float32)
        b = numpy.empty_like(a)
        return (lambda: numpy.copyto(b, a)), a.nbytes
    import cupy
    a = cupy.random.RandomState(seed).standard_normal(n, dtype=numpy.float32)
    b = cupy.empty_like(a)
    stream = cupy.cuda.get_current_stream()
    return (lambda: b.data.copy_from_device_async(a.data, a.nbytes, stream),
            a.nbytes)


def _chainer_worker(spec):
    import chainer
    chainer_lars = _import_chainer_lars()
    gpu = spec['gpu']
    device = chainer.get_device('@numpy' if gpu is None else
                                '@cupy:{}'.format(gpu))
    device.use()
    xp = device.xp
    info = {'chainer': chainer.__version__,
            'chainer_lars': chainer_lars.__version__,
            'numpy': numpy.__version__}
    timer, free = chainer_timer(device)
    if xp is not numpy:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(gpu)['name']
        info.update(cupy=cupy.__version__, gpu=name.decode()
                    if isinstance(name, bytes) else name)
    copy, nbytes = chainer_copy(device, spec['copy_bytes'])
    bw = bandwidth(copy, nbytes, timer)
    del copy
    free()
    makers = _chainer_makers()
    rows = []
    floors = {label: floor for label, framework, floor in ROWS
              if framework == 'chainer'}
    for shape_set in spec['sets']:
        for label in makers:
            for precision in PRECISIONS:
                try:
                    times = _time_chainer(makers[label], shape_set,
                                          precision, device, timer, spec)
                    rows.append(_row_result(label, 'chainer', floors[label],
                                            precision, shape_set, times,
                                            bw['bandwidth']))
                except Exception as e:  # report it, go on with the others
                    rows.append(_failed(label, 'chainer', floors[label],
                                        precision, shape_set,
                                        '{}: {}'.format(type(e).__name__,
                                                        e)))
                free()
                _log(rows[-1])
    return {'framework': 'chainer', 'versions': info, 'copy': bw,
            'rows': rows}


def _time_chainer(make, shape_set, precision, device, timer, spec):
    link, grads = chainer_link(shape_set['shapes'], precision, device,
                               spec['seed'])
    opt, hook = make()
    if precision == 'mixed16':
        opt.use_fp32_update()
    opt.setup(link)
    if hook is not None:
        opt.add_hook(hook)
    params = [p for _, p in sorted(link.namedparams())]
    xp = device.xp
    rng = numpy.random.RandomState(spec['seed'])

    def renew():
        for p in params:
            p.grad = None
        spacer = xp.empty(_spacer_size(rng), numpy.uint8)
        for p, g in zip(params, grads):
            p.grad = g.copy()
        del spacer

    def address():
        return tuple(p.grad.data.ptr if xp is not numpy
                     else p.grad.ctypes.data for p in params)

    return time_updates(opt.update, renew, timer, spec['reps'],
                        spec['warmup'], address)


# --- PyTorch's process -----------------------------------------------------

def _torch_makers(torch):
    """label -> (function of the parameter list returning an optimizer,
    or the reason it is not available)."""
    makers = {}
    for name, cls, kwargs in (
            ('SGD', torch.optim.SGD, dict(lr=LR, momentum=MOMENTUM,
                                          weight_decay=WEIGHT_DECAY)),
            ('Adam', torch.optim.Adam, dict(lr=LAMB_LR))):
        for impl, flags in (('for-loop', dict(foreach=False)),
                            ('foreach', dict(foreach=True)),
                            ('fused', dict(fused=True))):
            makers['torch {} {}'.format(name, impl)] = (
                lambda params, cls=cls, kw=dict(kwargs, **flags):
                cls(params, **kw))
    try:
        from timm.optim import Lamb
        from timm.optim import Lars
    except Exception as e:
        why = 'not available ({}: {})'.format(type(e).__name__, e)
        makers['timm Lars'] = makers['timm Lamb'] = why
    else:
        makers['timm Lars'] = lambda params: Lars(
            params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
            trust_coeff=1e-3)
        # No clipping of the global gradient norm: chainer_lars.LAMB has
        # none, and it would read every gradient once more.
        makers['timm Lamb'] = lambda params: Lamb(
            params, lr=LAMB_LR, weight_decay=LAMB_WEIGHT_DECAY,
            max_grad_norm=None)
    try:
        from apex.optimizers import FusedLAMB
    except Exception as e:
        makers['apex FusedLAMB'] = 'not available ({}: {})'.format(
            type(e).__name__, e)
    else:
        makers['apex FusedLAMB'] = lambda params: FusedLAMB(
            params, lr=LAMB_LR, weight_decay=LAMB_WEIGHT_DECAY)
    return makers


def _torch_worker(spec):
    labels = [(label, floor) for label, framework, floor in ROWS
              if framework == 'torch']
    try:
        import torch
    except Exception as e:
        why = 'not available ({}: {})'.format(type(e).__name__, e)
        rows = [_failed(label, 'torch', floor, 'float32', s, why,
                        key='unavailable')
                for s in spec['sets'] for label, floor in labels]
        return {'framework': 'torch', 'versions': {}, 'copy': None,
                'rows': rows}
    gpu = spec['gpu']
    info = {'torch': torch.__version__}
    try:
        import timm
        info['timm'] = timm.__version__
    except Exception:
        pass
    if gpu is None:
        device = torch.device('cpu')
        timer = _Timer(lambda: None)

        def free():
            pass
    else:
        device = torch.device('cuda', gpu)
        torch.cuda.set_device(device)

        def events():
            return (torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True))
        timer = _Timer(lambda: torch.cuda.synchronize(device), events,
                       lambda s, e: s.elapsed_time(e))
        info['gpu'] = torch.cuda.get_device_name(device)

        def free():
            torch.cuda.empty_cache()
    copy, nbytes = _torch_copy(torch, device, spec['copy_bytes'],
                               spec['seed'])
    bw = bandwidth(copy, nbytes, timer)
    del copy
    free()
    makers = _torch_makers(torch)
    rows = []
    for shape_set in spec['sets']:
        for label, floor in labels:
            make = makers[label]
            if isinstance(make, str):
                rows.append(_failed(label, 'torch', floor, 'float32',
                                    shape_set, make, key='unavailable'))
            else:
                try:
                    times = _time_torch(torch, make, shape_set, device,
                                        timer, spec)
                    rows.append(_row_result(label, 'torch', floor,
                                            'float32', shape_set, times,
                                            bw['bandwidth']))
                except Exception as e:  # report it, go on with the others
                    rows.append(_failed(label, 'torch', floor, 'float32',
                                        shape_set, '{}: {}'.format(
                                            type(e).__name__, e)))
            free()
            _log(rows[-1])
    return {'framework': 'torch', 'versions': info, 'copy': bw,
            'rows': rows}


def _torch_copy(torch, device, nbytes, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(nbytes // 4, generator=gen, device=device)
    b = torch.empty_like(a)
    return (lambda: b.copy_(a)), a.numel() * a.element_size()


def _time_torch(torch, make, shape_set, device, timer, spec):
    gen = torch.Generator(device=device).manual_seed(spec['seed'])
    params, grads = [], []
    for shape in shape_set['shapes']:
        params.append(torch.nn.Parameter(torch.randn(
            shape, generator=gen, device=device) * W_SCALE))
        grads.append(torch.randn(shape, generator=gen, device=device)
                     * G_SCALE)
    opt = make(params)
    rng = numpy.random.RandomState(spec['seed'])

    def renew():
        for p in params:
            p.grad = None
        spacer = torch.empty(_spacer_size(rng), dtype=torch.uint8,
                             device=device)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        del spacer

    def address():
        return tuple(p.grad.data_ptr() for p in params)

    return time_updates(opt.step, renew, timer, spec['reps'],
                        spec['warmup'], address)


def _log(row):
    what = row.get('error') or row.get('unavailable')
    if what is None:
        what = 'wall {:.3f} ms, host {:.3f} ms, GPU {}'.format(
            row['wall_s'] * 1e3, row['host_s'] * 1e3,
            '-' if row['gpu_s'] is None else '{:.3f} ms'.format(
                row['gpu_s'] * 1e3))
    print('  {} {} {}: {}'.format(row['set'], row['update'],
                                  row['precision'], what), flush=True)


WORKERS = {'chainer': _chainer_worker, 'torch': _torch_worker}


# --- the parent: workers, then the table -----------------------------------

def run_worker(framework, spec, timeout, python=None):
    """Runs one framework's rows in a process of its own; returns its
    result, or one that says why there is none."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, 'spec.json')
        out_path = os.path.join(tmp, 'out.json')
        with open(spec_path, 'w') as f:
            json.dump(spec, f)
        cmd = [python or sys.executable, os.path.abspath(__file__),
               '--worker', framework, '--spec', spec_path, '--out',
               out_path]
        try:
            done = subprocess.run(cmd, timeout=timeout,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            output, status = done.stdout, done.returncode
        except subprocess.TimeoutExpired as e:
            output = e.stdout or ''
            if isinstance(output, bytes):
                output = output.decode(errors='replace')
            output, status = output, 'timed out after {} s'.format(timeout)
        sys.stdout.write(output)
        sys.stdout.flush()
        if status == 0 and os.path.exists(out_path):
            with open(out_path) as f:
                return json.load(f)
    tail = ' '.join(output.strip().splitlines()[-3:])
    return {'framework': framework, 'versions': {}, 'copy': None,
            'rows': [], 'error': 'the {} process failed (exit status {}): '
            '{}'.format(framework, status, tail)}


def _git_commit():
    try:
        done = subprocess.run(
            ['git', 'describe', '--always', '--dirty', '--abbrev=12'],
            cwd=_HERE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def run(sets, device='0', frameworks=FRAMEWORKS, reps=20, warmup=3,
        copy_mib=None, seed=0, timeout=600, log=print, save=None):
    """Every framework's rows on every shape set; the merged result.

    ``timeout``: seconds for all the processes together, shared out as
    they go (each gets the time left over the processes left, so one that
    ends early leaves its time to the next). ``save(result)`` is called
    after each process, the result then naming the frameworks still to
    run in ``'pending'``, so that what is done is kept if this process is
    stopped."""
    gpu = parse_device(device)
    if copy_mib is None:
        copy_mib = 1024 if gpu is not None else 64
    log('shape sets: ' + ', '.join(sets))
    shape_list = [shape_sets.get(name) for name in sets]
    spec = {'gpu': gpu, 'sets': shape_list, 'reps': reps, 'warmup': warmup,
            'copy_bytes': int(copy_mib * 2 ** 20), 'seed': seed}
    result = {'device': str(device), 'git': _git_commit(),
              'python': platform.python_version(),
              'cpu_count': os.cpu_count(), 'reps': reps, 'warmup': warmup,
              'sets': [{k: s[k] for k in ('name', 'n_params', 'n_arrays',
                                          'source')} for s in shape_list],
              'processes': [], 'pending': list(frameworks)}
    deadline = time.monotonic() + timeout
    for k, framework in enumerate(frameworks):
        share = (deadline - time.monotonic()) / (len(frameworks) - k)
        log('{} process ({:.0f} s at most)'.format(framework, share))
        start = time.perf_counter()
        worker = run_worker(framework, spec, max(share, 1.0))
        worker['seconds'] = time.perf_counter() - start
        result['processes'].append(worker)
        result['pending'].remove(framework)
        if save is not None:
            save(result)
    del result['pending']
    return result


def rows_of(result):
    return [row for p in result['processes'] for row in p['rows']]


def goals(result):
    """The issue's goals per shape set: ``(set, ours, peer, ratio or None,
    bound)``, from float32 wall times."""
    walls = {(r['set'], r['update']): r.get('wall_s')
             for r in rows_of(result) if r['precision'] == 'float32'}
    out = []
    for s in result['sets']:
        for ours, peer, bound in GOALS:
            a, b = walls.get((s['name'], ours)), walls.get((s['name'], peer))
            out.append((s['name'], ours, peer,
                        a / b if a and b else None, bound))
    return out


def _ms(seconds):
    return '-' if seconds is None else '{:.3f}'.format(seconds * 1e3)


#: What the goals' ratios can and cannot tell, under the table's header.
_SEPARATE = (
    'Ours and the peers run in separate processes, one after the other, '
    'with no control timed in both but the device copy, which follows the '
    "device's bandwidth, not the host's: a goal's ratio near its bound can "
    'fall on the other side of it in another run.')


def markdown(result):
    """The result as Markdown: a header, one table per shape set, the
    goals."""
    lines = ['# One update beside the peers', '',
             'git {}, device {}, Python {}; median of {} updates after {}; '
             'new gradients before every update.'.format(
                 result['git'], result['device'], result['python'],
                 result['reps'], result['warmup']), '', _SEPARATE, '']
    if result.get('pending'):
        lines.append('- not run yet when this was written: {}'.format(
            ', '.join(p + ' process' for p in result['pending'])))
    for p in result['processes']:
        versions = ', '.join('{} {}'.format(k, v)
                             for k, v in sorted(p['versions'].items()))
        copy = p.get('copy')
        lines.append('- {} process{}: {}{}'.format(
            p['framework'], '' if 'seconds' not in p else ' ({:.0f} s)'
            .format(p['seconds']), versions or '-',
            '' if not copy else '; device copy of {:.0f} MiB: {:.3f} TB/s'
            .format(copy['bytes'] / 2 ** 20, copy['bandwidth'] / 1e12)))
        if p.get('error'):
            lines.append('  - ' + p['error'])
    rows = rows_of(result)
    for s in result['sets']:
        lines += ['', '## {}: {:,} parameters in {} arrays'.format(
            s['name'], s['n_params'], s['n_arrays']), '',
            '| update | precision | wall ms | host ms | GPU ms | bytes/param '
            'at copy bandwidth | floor bytes/param | x floor |',
            '|---|---|---:|---:|---:|---:|---:|---:|']
        for r in rows:
            if r['set'] != s['name']:
                continue
            head = '| {} | {} |'.format(r['update'], r['precision'])
            if r.get('error') or r.get('unavailable'):
                lines.append('{} {} | | | | {} | |'.format(
                    head, 'error: ' + r['error'] if r.get('error')
                    else r['unavailable'], r['floor_bytes']))
                continue
            lines.append('{} {} | {} | {} | {} | {} | {} |'.format(
                head, _ms(r['wall_s']), _ms(r['host_s']), _ms(r['gpu_s']),
                '-' if 'bytes_per_param' not in r
                else '{:.1f}'.format(r['bytes_per_param']),
                r['floor_bytes'], '-' if 'x_floor' not in r
                else '{:.2f}'.format(r['x_floor'])))
    lines += ['', 'Goals (float32 wall times):', '']
    for name, ours, peer, ratio, bound in goals(result):
        lines.append('- {}: {} / {} = {} (goal {} {:g}){}'.format(
            name, ours, peer, '-' if ratio is None else '{:.2f}'.format(
                ratio), '<' if bound == 1.0 else '<=', bound,
            '' if ratio is None else ' met' if (
                ratio < bound if bound == 1.0 else ratio <= bound)
            else ' missed'))
    return '\n'.join(lines)


def failed(result):
    """Whether a process failed, or one of the Chainer process's rows."""
    return any(p.get('error') for p in result['processes']) or any(
        r.get('error') for r in rows_of(result)
        if r['framework'] == 'chainer')


def _set_name(text):
    if text not in shape_sets.SETS:
        raise argparse.ArgumentTypeError('unknown shape set {!r}; choose '
                                         'from {}'.format(
                                             text, ', '.join(shape_sets.SETS)))
    return text


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', '-d', default='0',
                        help='0, @cupy:0 (a GPU), or @numpy, -1 (the CPU); '
                        'default %(default)s')
    parser.add_argument('--sets', default='resnet50,bert_large',
                        help='comma-separated, of: {} (default: '
                        '%(default)s)'.format(', '.join(shape_sets.SETS)))
    parser.add_argument('--frameworks', default=','.join(FRAMEWORKS),
                        help='comma-separated, of: {} (default: all)'.format(
                            ', '.join(FRAMEWORKS)))
    parser.add_argument('--reps', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--copy-mib', type=float, default=None,
                        help='size of the timed device copy (default 1024 '
                        'on a GPU, 64 on the CPU)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--timeout', type=float, default=600,
                        help='seconds for all the processes together, each '
                        'getting the time left over the processes left '
                        '(default %(default)s)')
    parser.add_argument('--json', help='also write the result here')
    parser.add_argument('--markdown', help='also write the table here')
    parser.add_argument('--worker', choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument('--spec', help=argparse.SUPPRESS)
    parser.add_argument('--out', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        if not (args.spec and args.out):
            parser.error('--worker needs --spec and --out')
        return args
    try:
        parse_device(args.device)
    except ValueError as e:
        parser.error('--device: {}'.format(e))
    args.sets = [s for s in args.sets.split(',') if s]
    for name in args.sets:
        if name not in shape_sets.SETS:
            parser.error('--sets: unknown {!r}; choose from {}'.format(
                name, ', '.join(shape_sets.SETS)))
    args.frameworks = [f for f in args.frameworks.split(',') if f]
    for name in args.frameworks:
        if name not in FRAMEWORKS:
            parser.error('--frameworks: unknown {!r}; choose from {}'.format(
                name, ', '.join(FRAMEWORKS)))
    if not args.sets or not args.frameworks:
        parser.error('--sets and --frameworks name at least one each')
    if args.reps < 1 or args.warmup < 0:
        parser.error('--reps must be >= 1 and --warmup >= 0')
    if args.copy_mib is not None and not args.copy_mib > 0:
        parser.error('--copy-mib must be positive')
    if not args.timeout > 0:
        parser.error('--timeout must be positive')
    if not 0 <= args.seed < 2 ** 32:  # NumPy's RandomState takes these
        parser.error('--seed must be from 0 to 2**32 - 1, got {}'.format(
            args.seed))
    # Here, not in the workers: a GPU that is not there failed every row
    # (a traceback per worker, then a table of '-').
    bench_flags.device(parser, args.device)
    bench_flags.output_file(parser, '--json', args.json)
    bench_flags.output_file(parser, '--markdown', args.markdown)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker is not None:
        with open(args.spec) as f:
            spec = json.load(f)
        out = WORKERS[args.worker](spec)
        with open(args.out, 'w') as f:
            json.dump(out, f)
        return 0
    result = run(args.sets, args.device, args.frameworks, args.reps,
                 args.warmup, args.copy_mib, args.seed, args.timeout,
                 save=lambda partial: _write(args, partial))
    print(markdown(result))
    _write(args, result)
    return 1 if failed(result) else 0


def _write(args, result):
    """The result in ``--json`` and ``--markdown``, where asked for."""
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1, sort_keys=True)
    if args.markdown:
        with open(args.markdown, 'w') as f:
            f.write(markdown(result) + '\n')


if __name__ == '__main__':
    sys.exit(main())
