"""A property-based fuzz test against Chainer's own optimizer.

Between updates of a small model, hypothesis changes its parameters at
random: arrays replaced by others of another shape, dtype, byte order or
layout, read-only, memory-mapped or made from ``bytes``, or changed in
place (buffer reallocated, strides, byte order, read-only); gradients dropped
or replaced; update rules disabled and enabled; hooks added and removed;
hyperparameters changed, to invalid values too. A twin model takes the same
changes under Chainer's ``MomentumSGD`` with a hook that applies the float64
formula of :mod:`tests.lars_reference` (for :class:`chainer_lars.LARS`, its
ratio: ``MomentumSGD`` then makes the same step, its ``v`` negated). Every
update must give the twin's result within the dtypes' rounding, or raise an
error of the twin's type; :class:`~chainer_lars.LARS` with ``multi_tensor``
and the hook (where the error is its own) must then leave every array as it
was. The cases run in a process of their own (tests/forked.py): a crash
fails the test, with the last case printed, and so does a run of fewer
examples than asked, or of fewer updates compared with the twin's than half
the examples. ``CHAINER_LARS_FUZZ_EXAMPLES`` sets the number of examples per
test (default 30, the same examples every run; when set, new random ones).
"""

import os
import sys
import tempfile
import traceback
import warnings

import numpy
import pytest

import chainer

import chainer_lars
from tests import forked
from tests import lars_reference as ref


EXAMPLES = int(os.environ.get('CHAINER_LARS_FUZZ_EXAMPLES', '30'))
FACES = ['hook', 'hook-per-param', 'lars', 'lars-per-rule']
#: No two of these broadcast together: a mismatch is always an error.
SHAPES = [(5,), (6,), (2, 7), (4, 3), (0,)]
DTYPES = [numpy.float16, numpy.float32, numpy.float64]
CPU_KINDS = ['plain', 'swapped', 'strided', 'fortran', 'read-only', 'mmap',
             'bytes']
#: The emulated ElementwiseKernel of Chainer's MomentumSGD takes only
#: C-contiguous arrays: other layouts would have no reference there.
GPU_KINDS = ['plain']
#: Relative and absolute tolerance of one update in each dtype.
TOL = {numpy.dtype(numpy.float16): (2e-2, 2e-2),
       numpy.dtype(numpy.float32): (1e-4, 1e-5),
       numpy.dtype(numpy.float64): (1e-9, 1e-12)}
HOOK_HYPER = ('threshold', 'weight_decay', 'eps', 'trust_coefficient')
LARS_HYPER = ('lr', 'momentum', 'weight_decay', 'trust_coefficient', 'eps')


#: Changes made to an array object in place (CPU only: CuPy's arrays have
#: none of them), to the twin's as well.
IN_PLACE = ['resize', 'fortran strides', 'byte order', 'read-only']


def change_in_place(a, how):
    """Changes ``a`` in place: its buffer reallocated (the values kept),
    Fortran strides over the same memory, the other byte order (the values
    kept) or the writeable flag off; where NumPy allows it."""
    if how == 'resize' and a.flags.owndata and a.flags.writeable:
        shape = a.shape
        a.resize((a.size * 64 + 4096,), refcheck=False)
        a.resize(shape, refcheck=False)
    elif how == 'fortran strides' and a.ndim == 2 and a.flags.c_contiguous:
        a.strides = (a.itemsize, a.shape[0] * a.itemsize)
    elif how == 'byte order' and a.flags.writeable:
        a[...] = a.byteswap()
        a.dtype = a.dtype.newbyteorder('S')
    elif how == 'read-only':
        a.flags.writeable = False


def _run_worker(face, device):
    code = ('from tests.test_fuzz import worker; worker({!r}, {!r}, '
            '{})'.format(face, device, EXAMPLES))
    returncode, stdout, stderr = forked.run(code, timeout=3600)
    assert returncode == 0, (
        'the fuzz worker failed or crashed (status {}); its last lines:\n'
        '{}\n{}'.format(returncode, stdout[-4000:], stderr[-8000:]))
    ran = [line.split() for line in stdout.splitlines()
           if line.startswith('examples: ')]
    assert ran, stdout
    # Hypothesis calls the test at least once an example. The 30 default
    # examples make 57 to 85 updates (the fewest with CHAINER_LARS_NUMBA=0),
    # 48 to 75 of them compared with the twin's (the others raise, as the
    # twin does): fewer than one for every two examples, and the fuzz has
    # stopped checking results. A few examples may all raise by chance.
    examples, compared = int(ran[-1][1]), int(ran[-1][5])
    assert examples >= EXAMPLES and compared >= (
        EXAMPLES // 2 if EXAMPLES >= 20 else 1), ran[-1]


@pytest.mark.parametrize('face', FACES)
def test_fuzz_cpu(face):
    _run_worker(face, 'cpu')


@pytest.mark.emulated
@pytest.mark.parametrize('face', FACES)
def test_fuzz_emulated_gpu(face):
    _run_worker(face, 'emulated')


# The worker: everything below runs in the forked process.

#: The updates made, and those whose results compare() checked against the
#: twin's (the others raised an error, checked as such).
COUNTS = {'updates': 0, 'compared': 0}


class _Model(chainer.Link):

    def __init__(self, arrays):
        super(_Model, self).__init__()
        with self.init_scope():
            for i, a in enumerate(arrays):
                setattr(self, 'p{}'.format(i), chainer.Parameter(a))


class _Maker(object):

    """Arrays of a kind from float64 values; each call a new one."""

    def __init__(self, xp, folder):
        self.xp, self.folder, self.count = xp, folder, 0

    def __call__(self, kind, values, dtype):
        xp, a = self.xp, values.astype(dtype)
        if xp is not numpy:
            return xp.asarray(a)
        if kind == 'swapped':
            return a.astype(a.dtype.newbyteorder('S'))
        if kind == 'strided':
            big = numpy.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype)
            view = big[..., ::2]
            view[...] = a
            return view
        if kind == 'fortran':
            return numpy.asfortranarray(a)
        if kind == 'read-only':
            a.flags.writeable = False
        elif kind == 'mmap':
            self.count += 1
            path = os.path.join(self.folder, '{}.npy'.format(self.count))
            numpy.save(path, a)
            return numpy.load(path, mmap_mode='r')
        elif kind == 'bytes':
            return numpy.frombuffer(bytes(a.tobytes()), a.dtype).reshape(
                a.shape)
        return a


def _host(a):
    return None if a is None else numpy.array(chainer.backend.CpuDevice(
    ).send(a) if not isinstance(a, numpy.ndarray) else a, copy=True)


class _ReferenceHook(object):

    """The float64 formula on the twin: the hook's new gradient written in
    place (as Chainer's GradientLARS), or for LARS ``r (g + wd w)`` set as
    a new gradient that ``MomentumSGD`` then steps with."""

    name = 'Reference'
    call_for_each_param = False
    timing = 'pre'

    def __init__(self, face, hyper):
        self.face, self.hyper = face, hyper

    def __call__(self, optimizer):
        self.grads = [(p, p.grad) for p in optimizer.target.params()]
        for param in optimizer.target.params():
            rule = param.update_rule
            if (rule is None or not rule.enabled or param.array is None
                    or param.grad is None):
                continue
            w, g = _host(param.array), _host(param.grad)
            h = self.hyper
            with numpy.errstate(all='ignore'):
                if self.face.startswith('hook'):
                    new = ref.hook_gradient(
                        w, g, h['threshold'], h['weight_decay'], h['eps'],
                        h['trust_coefficient'])
                else:
                    new = ref.lars_step(
                        w, g, 0.0, 1.0, 0.0, h['weight_decay'],
                        h['trust_coefficient'], h['eps'])[1]
            if self.face.startswith('hook'):
                param.grad[...] = param.device.send(
                    new.astype(param.grad.dtype))
            else:
                param._set_grad_without_check(param.device.send(
                    new.astype(param.grad.dtype)))


def _valid(name, value):
    if not numpy.isfinite(value):
        return False
    if name == 'trust_coefficient':
        return value > 0
    if name == 'momentum':
        return 0 <= value < 1
    return value >= 0


class _Example(object):

    """One model under test and its twin, changed alike."""

    def __init__(self, face, xp, data, folder):
        from hypothesis import strategies as st
        self.face, self.xp, self.data, self.st = face, xp, data, st
        self.make = _Maker(xp, folder)
        self.kinds = CPU_KINDS if xp is numpy else GPU_KINDS
        rng = numpy.random.RandomState(data.draw(st.integers(0, 2 ** 16)))
        values = [rng.standard_normal(s) for s in SHAPES[:3]]
        self.hyper = {'lr': 0.1, 'momentum': 0.9, 'threshold': 1e-2,
                      'weight_decay': 1e-3, 'eps': 1e-9,
                      'trust_coefficient': 1.0}
        self.ours = _Model([self.make('plain', v, numpy.float32)
                            for v in values])
        self.twin = _Model([self.make('plain', v, numpy.float32)
                            for v in values])
        if xp is not numpy:
            self.ours.to_device('@cupy:0')
            self.twin.to_device('@cupy:0')
        self.ref_hook = _ReferenceHook(face, self.hyper)
        self.theirs = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
        self.theirs.setup(self.twin)
        self.theirs.add_hook(self.ref_hook)
        if face.startswith('hook'):
            self.opt = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
            self.opt.setup(self.ours)
            self.hook = chainer_lars.GradientLARS(
                threshold=1e-2, weight_decay=1e-3, eps=1e-9,
                multi_tensor=face == 'hook')
            self.opt.add_hook(self.hook)
        else:
            self.opt = chainer_lars.LARS(
                lr=0.1, momentum=0.9, weight_decay=1e-3,
                trust_coefficient=1.0, eps=1e-9,
                multi_tensor=face == 'lars')
            self.opt.setup(self.ours)
            self.hook = None
        self.log = []
        self.bad_hyper = set()
        for p in self.pairs():
            self.fresh_grad(*p)

    def pairs(self):
        return list(zip(self.ours.params(), self.twin.params()))

    def say(self, *words):
        self.log.append(' '.join(map(str, words)))
        print(self.log[-1], file=sys.stderr, flush=True)

    def fresh_grad(self, p, q, kind='plain'):
        values = numpy.random.RandomState(len(self.log)).standard_normal(
            p.shape)
        dtype = p.dtype
        for param in (p, q):
            param.grad = self.make(kind, values, dtype)

    def draw(self, strategy):
        return self.data.draw(strategy)

    def change(self):
        st = self.st
        what = self.draw(st.sampled_from(
            ['array', 'grad', 'no grad', 'rule', 'hook', 'hyper']
            + (['in place'] if len(self.kinds) > 1 else [])))
        k = self.draw(st.integers(0, 2))
        p, q = self.pairs()[k]
        if what == 'array':
            shape = self.draw(st.sampled_from(SHAPES + [p.shape]))
            dtype = self.draw(st.sampled_from(DTYPES))
            kind = self.draw(st.sampled_from(self.kinds))
            self.say('array', k, shape, numpy.dtype(dtype).name, kind)
            values = numpy.random.RandomState(k).standard_normal(shape)
            p.array = self.make(kind, values, dtype)
            q.array = self.make(kind, values, dtype)
        elif what == 'grad' and p.array is not None:
            kind = self.draw(st.sampled_from(self.kinds))
            self.say('grad', k, kind)
            try:
                self.fresh_grad(p, q, kind)
            except (TypeError, ValueError) as e:  # Chainer's setter
                self.say('  refused by Chainer:', type(e).__name__)
        elif what == 'in place':
            target = self.draw(st.sampled_from(['array', 'grad']))
            how = self.draw(st.sampled_from(IN_PLACE))
            self.say('in place', k, target, how)
            for param in (p, q):
                a = param.array if target == 'array' else param.grad
                if a is not None:
                    change_in_place(a, how)
        elif what == 'no grad':
            self.say('no grad', k)
            p.grad = q.grad = None
        elif what == 'rule':
            p.update_rule.enabled = q.update_rule.enabled = (
                not p.update_rule.enabled)
            self.say('rule', k, 'enabled' if p.update_rule.enabled
                     else 'disabled')
        elif what == 'hook':
            self.toggle_hook(p)
        else:
            self.change_hyper()

    def toggle_hook(self, p):
        if self.hook is not None:
            if 'GradientLARS' in self.opt._hookable._pre_update_hooks:
                self.say('hook removed')
                self.opt.remove_hook('GradientLARS')
                self.theirs.remove_hook('Reference')
            else:
                self.say('hook added')
                self.opt.add_hook(self.hook)
                self.theirs.add_hook(self.ref_hook)
        else:
            # A rule hook takes the parameter off the batched path.
            hooks = p.update_rule._hookable._pre_update_hooks
            if 'noop' in hooks:
                self.say('rule hook removed')
                p.update_rule.remove_hook('noop')
            else:
                self.say('rule hook added')
                p.update_rule.add_hook(lambda rule, param: None,
                                       name='noop')

    def change_hyper(self):
        st = self.st
        names = (list(HOOK_HYPER) if self.hook is not None
                 else list(LARS_HYPER))
        name = self.draw(st.sampled_from(names))
        value = self.draw(st.one_of(
            st.floats(0.0, 1.0), st.sampled_from(
                [-1.0, float('nan'), float('inf'), 0.0, 1e-3, 0.999])))
        direct = self.hook is None and self.draw(st.booleans())
        self.say('hyper', name, value, 'direct' if direct else '')
        valid = _valid(name, value)
        owner = self.hook if self.hook is not None else self.opt
        if direct:
            setattr(self.opt.hyperparam, name, value)
            if not valid:
                self.bad_hyper.add(name)
        else:
            old = getattr(owner, name)
            try:
                setattr(owner, name, value)
            except (TypeError, ValueError):
                assert not valid, (name, value)
                now = getattr(owner, name)
                assert now == old or now != now and old != old  # NaN kept
                return
            assert valid, (name, value)
        if valid:
            self.bad_hyper.discard(name)
            if name in ('lr', 'momentum'):
                setattr(self.theirs, name, value)
            self.hyper[name] = value

    def arrays(self, model, negate_v=False):
        out = []
        for p in model.params():
            state = p.update_rule.state if p.update_rule else None
            v = None if not state else state.get('v')
            v = _host(v)
            if v is not None and negate_v:
                v = -v
            out.append((_host(p.array), _host(p.grad), v))
        return out

    def update(self):
        COUNTS['updates'] += 1
        before = self.arrays(self.ours)
        ours = theirs = None
        try:
            self.opt.update()
        except Exception as e:
            ours = e
        if self.bad_hyper:
            # LARS refuses it at the update (or an array first); the twin
            # has no such check.
            # No error only where no rule would take a step.
            assert isinstance(ours, ValueError) or self.justified(ours) or (
                ours is None and not any(
                    p.update_rule.enabled for p in self.ours.params())), ours
            self.same_exactly(before)
            for name in self.bad_hyper:
                setattr(self.opt.hyperparam, name, self.hyper[name])
            self.bad_hyper.clear()
            self.say('  refused:', ours)
            self.sync()
            return
        lars = self.hook is None
        self.ref_hook.grads = []
        try:
            self.theirs.update()
        except Exception as e:
            theirs = e
        if lars:  # the reference hook set new gradients: the old back
            for q, g in self.ref_hook.grads:
                q._set_grad_without_check(g)
        self.say('  ours:', type(ours).__name__, ours, '| twin:',
                 type(theirs).__name__, theirs)
        if theirs is None:
            assert ours is None, ''.join(traceback.format_exception(ours))
        else:
            assert ours is not None, (
                'no error where Chainer raised {!r}'.format(theirs))
            # Where several parameters are wrong, the twin (its reference
            # hook first, then MomentumSGD) may meet another one first.
            assert type(ours) is type(theirs) or isinstance(
                ours, type(theirs)) or self.justified(ours), ''.join(
                    traceback.format_exception(ours))
            mine = any('chainer_lars' in f.filename and 'testing' not in
                       f.filename for f in
                       traceback.extract_tb(ours.__traceback__))
            if self.face == 'lars' or (self.hook is not None and mine):
                self.same_exactly(before)
            if lars or mine or any(p.dtype == numpy.float16
                                   for p in self.ours.params()):
                # The twin stops half-way (its reference hook after some
                # parameters, its MomentumSGD within one); LARS per rule
                # after the parameters before the one named; the hook's
                # float16 delegates rescale in their rules, those not
                # reached are not rescaled.
                self.sync()
                return
        self.compare()
        self.sync()

    def justified(self, error):
        """Whether ``error`` names a parameter that has the problem."""
        message = str(error)
        for k, p in enumerate(self.ours.params()):
            if not message.startswith('/p{}: '.format(k)):
                continue
            state = p.update_rule.state or {}
            arrays = [a for a in [p.grad, state.get('v')] if a is not None]
            if isinstance(error, TypeError):
                return any(a.dtype != p.dtype for a in arrays)
            return any(a.size != p.size for a in arrays)
        return False

    def same_exactly(self, before):
        for k, (x, y) in enumerate(zip(before, self.arrays(self.ours))):
            for name, a, b in zip(('w', 'g', 'v'), x, y):
                if a is None and b is not None:
                    # Zeros for a missing gradient or state, made by
                    # Chainer's GradientMethod.update and UpdateRule.update
                    # before anything else.
                    assert not b.any(), (k, name)
                    continue
                assert (a is None) == (b is None), (k, name)
                if a is not None:
                    assert a.dtype == b.dtype and a.shape == b.shape, (k, name)
                    assert a.tobytes() == b.tobytes(), (
                        'array {} {} changed by a failed update'.format(
                            k, name))

    def compare(self):
        COUNTS['compared'] += 1
        lars = self.hook is None
        mine = self.arrays(self.ours)
        twin = self.arrays(self.twin, negate_v=lars)
        for k, (x, y) in enumerate(zip(mine, twin)):
            # The least precise of a parameter's arrays rounds the step.
            rtol, atol = max(TOL[a.dtype.newbyteorder('=')] for a in x + y
                             if a is not None)
            for name, a, b in zip(('w', 'g', 'v'), x, y):
                assert (a is None) == (b is None), (k, name)
                if a is None:
                    continue
                assert a.shape == b.shape, (k, name, a.shape, b.shape)
                numpy.testing.assert_allclose(
                    a.astype(numpy.float64), b.astype(numpy.float64),
                    rtol=rtol, atol=atol, equal_nan=True,
                    err_msg='array {} {}'.format(k, name))

    def sync(self):
        """The twin takes our values where it can hold them (a read-only
        array was written by neither), so each update starts alike."""
        lars = self.hook is None
        for p, q in self.pairs():
            if p.grad is not None and q.grad is None:
                # Zeros that our refused update allocated, as Chainer does.
                q._set_grad_without_check(p.grad.copy())
            pairs = [(p.array, q.array), (p.grad, q.grad)]
            sp, sq = p.update_rule.state, q.update_rule.state
            if sp and sq and 'v' in sp and 'v' in sq:
                pairs.append((-sp['v'] if lars else sp['v'], sq['v']))
            elif sq and not sp:  # made by the twin's failed update only
                q.update_rule._state = None
            elif sp and not sq:  # made by our failed update only
                q.update_rule._state = {
                    'v': -sp['v'] if lars else sp['v'].copy()}
            for a, b in pairs:
                if (a is not None and b is not None and a.shape == b.shape
                        and getattr(b.flags, 'writeable', True)):
                    b[...] = a.astype(b.dtype) if self.xp is numpy else (
                        self.xp.asarray(a).astype(b.dtype))


def worker(face, device, examples):
    """Runs ``examples`` examples; prints each step before running it (a
    crash leaves the case that made it last)."""
    from hypothesis import given, settings, HealthCheck
    from hypothesis import strategies as st
    from chainer_lars.testing import emulated_cupy
    import contextlib

    count = [0]

    @settings(max_examples=examples, deadline=None, database=None,
              derandomize='CHAINER_LARS_FUZZ_EXAMPLES' not in os.environ,
              suppress_health_check=list(HealthCheck), print_blob=True,
              report_multiple_bugs=False)
    @given(st.data())
    def fuzz(data):
        count[0] += 1
        print('-- example', file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as folder:
            xp = numpy if device == 'cpu' else emulated_cupy
            example = _Example(face, xp, data, folder)
            for step in range(data.draw(st.integers(1, 4))):
                for _ in range(data.draw(st.integers(0, 3))):
                    example.change()
                example.say('update', step)
                example.update()
            del example

    context = (emulated_cupy.installed() if device == 'emulated'
               else contextlib.nullcontext())
    # Chainer's float16 steps may overflow; ours must not warn, but of
    # float16 steps that round away (tests/test_lifetime.py).
    warnings.simplefilter('ignore')
    warnings.filterwarnings('error', module='chainer_lars')
    warnings.filterwarnings('ignore', 'LARS: the step of .* rounded away',
                            RuntimeWarning)
    with context:
        fuzz()
    print('examples: {} updates: {updates} compared: {compared}'.format(
        count[0], **COUNTS))
