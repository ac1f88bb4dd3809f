"""No input corrupts memory: arrays replaced between updates, read-only
memory, and cached tables, each run in a process of its own (a crash is a
failure, not the end of the run; tests/forked.py)."""

import re
import textwrap

import numpy
import pytest

from tests import forked
from tests import optimizer_of


_PRELUDE = '''
import mmap, os, sys
import numpy as np
import chainer, chainer_lars
from chainer_lars import engine, layout as L

def model(n=4, dtype=np.float32):
    p = chainer.Parameter(np.ones(n, dtype)); m = chainer.Link()
    with m.init_scope():
        m.w = p
    return m, p

def snapshot(*arrays):
    return [None if a is None else np.array(a, copy=True) for a in arrays]

def same(before, *arrays):
    return all((a is None and b is None) or (
        a.dtype == b.dtype and a.shape == b.shape
        and np.array_equal(a, b, equal_nan=True))
        for a, b in zip(before, arrays))

class InRecord(np.ndarray):
    """Its ``dtype``, read in ``cpu.Record()``, runs ``then()`` first, once."""
    then = None

    @property
    def dtype(self):
        for f in (sys._getframe(1), sys._getframe(2)):  # (a listcomp's)
            if InRecord.then and isinstance(f.f_locals.get('self'),
                                            engine.cpu.Record):
                then, InRecord.then = InRecord.then, None
                then()
        return np.ndarray.dtype.__get__(self)

def outcome(fn, *arrays):
    """Prints the error of fn() and whether the arrays kept their values."""
    before = snapshot(*arrays)
    try:
        fn()
    except Exception as e:
        print('ERROR', type(e).__name__, str(e).replace(chr(10), ' '))
    else:
        print('OK')
    print('UNCHANGED' if same(before, *arrays) else 'CHANGED')
'''


def run_case(code, emulated=False):
    """``(returncode, stdout, stderr)`` of ``code`` after the prelude."""
    source = _PRELUDE
    if emulated:
        source += ('from chainer_lars.testing import emulated_cupy\n'
                   '_installed = emulated_cupy.installed()\n'
                   '_installed.__enter__()\n')
    source += textwrap.dedent(code)
    return forked.run(source, timeout=300)


def lines(code, emulated=False):
    rc, out, err = run_case(code, emulated)
    assert rc == 0, 'the case crashed or failed (status {}):\n{}'.format(
        rc, err[-3000:])
    return out.splitlines()


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('size', [8, 2, 1000000])
def test_a_resized_weight_is_refused_as_chainer_refuses_it(multi_tensor,
                                                           size):
    """The momentum buffer keeps the old size: Chainer's MomentumSGD raises
    ValueError (operands could not be broadcast); so does LARS, naming the
    parameter, before anything moves."""
    out = lines('''
        m, p = model()
        o = chainer_lars.LARS(lr=0.1, multi_tensor={mt}); o.setup(m)
        p.grad = np.full(4, .5, np.float32); o.update()
        p.array = np.ones({n}, np.float32)
        p.grad = np.full({n}, .5, np.float32)
        v = p.update_rule.state['v']
        outcome(o.update, p.array, p.grad, v)
        ref, q = model()
        s = chainer.optimizers.MomentumSGD(lr=0.1); s.setup(ref)
        q.grad = np.full(4, .5, np.float32); s.update()
        q.array = np.ones({n}, np.float32)
        q.grad = np.full({n}, .5, np.float32)
        outcome(s.update)
    '''.format(mt=multi_tensor, n=size))
    assert lines_error(out[0]) == lines_error(out[2]) == 'ValueError'
    assert '/w' in out[0] and 'momentum' in out[0]
    assert out[1] == 'UNCHANGED'


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_resize_refused_after_other_weights_keeps_them_or_steps_them(
        multi_tensor):
    """The second of two weights resized: the batched path moves neither
    and counts no rule's ``t``; multi_tensor=False steps one rule at a
    time, as Chainer's MomentumSGD does, so the first has stepped and
    both rules' ``t`` counted, as in MomentumSGD (docs/optimizer.rst)."""
    out = lines('''
        def two(opt):
            m = chainer.Link()
            with m.init_scope():
                m.a = chainer.Parameter(np.ones(4, np.float32))
                m.b = chainer.Parameter(np.ones(4, np.float32))
            opt.setup(m)
            for p in m.params():
                p.grad = np.full(4, .5, np.float32)
            opt.update()
            m.b.array = np.ones(6, np.float32)
            m.b.grad = np.full(6, .5, np.float32)
            m.a.grad = np.full(4, .5, np.float32)
            outcome(opt.update, m.a.array)
            print(opt.t, [p.update_rule.t for p in m.params()])
        two(chainer_lars.LARS(lr=0.1, multi_tensor={mt}))
        two(chainer.optimizers.MomentumSGD(lr=0.1))
    '''.format(mt=multi_tensor))
    assert lines_error(out[0]) == lines_error(out[3]) == 'ValueError'
    assert '/b' in out[0] and 'momentum' in out[0]
    assert out[4:] == ['CHANGED', '2 [2, 2]']
    assert out[1:3] == (['UNCHANGED', '2 [1, 1]'] if multi_tensor
                        else out[4:])


@pytest.mark.parametrize('emulated', [
    False, pytest.param(True, marks=pytest.mark.emulated)])
@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_an_update_after_a_refused_resize_is_an_undisturbed_one(
        multi_tensor, face, emulated):
    """A weight resized (its state keeps the old size) is refused; given
    its size back, the next update is the one a run without the resize
    makes (``t`` aside: the optimizer's counts the refused update, as
    Chainer's does), and ``observe()`` meanwhile reports the update
    applied last. The per-rule path had kept the plan whose checks failed
    half built, and used it: ValueError 'not enough values to unpack',
    and an IndexError in ``observe()``."""
    out = lines('''
        def run(resize):
            m, p = model()
            if {emulated}:
                m.to_device('@cupy:0')
            xp = p.device.xp
            o = chainer_lars.{face}(multi_tensor={mt}); o.setup(m)
            p.grad = xp.full(4, .5, np.float32); o.update()
            first = o.observe()
            if resize:
                w = p.array
                p.array = xp.ones(6, np.float32)
                p.grad = xp.full(6, .5, np.float32)
                outcome(o.update)
                # What was applied last: the first update's.
                print('OBSERVED', o.observe() == first != {{}})
                p.array = w.copy()
            p.grad = xp.full(4, .25, np.float32); o.update()
            print(repr(chainer.backend.CpuDevice().send(p.array).tolist()))
        run(False)
        run(True)
    '''.format(mt=multi_tensor, face=face, emulated=emulated), emulated)
    assert lines_error(out[1]) == 'ValueError' and '/w' in out[1]
    assert out[2] == 'UNCHANGED'
    assert out[3] == 'OBSERVED True'
    assert out[4] == out[0]


@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
@pytest.mark.parametrize('read_only', ['state', 'gradient'])
def test_a_rule_on_the_per_rule_path_is_checked_before_the_others_move(
        face, read_only):
    """A rule with a hook of its own takes the per-rule path beside the
    batched ones; what that path writes (its state, and its gradient,
    which Chainer's rule divides by the loss scale in place) is checked
    before the batched arrays move, as theirs are. A read-only one was
    refused after they had stepped (the gradient by NumPy, unnamed)."""
    out = lines('''
        def link():
            m = chainer.Link()
            with m.init_scope():
                m.a = chainer.Parameter(np.arange(1., 5., dtype=np.float32))
                m.b = chainer.Parameter(np.arange(2., 6., dtype=np.float32))
            return m
        def run(refuse):
            m = link()
            o = chainer_lars.{face}(); o.setup(m); o.loss_scaling(scale=8.0)
            m.b.update_rule.add_hook(lambda rule, param: None, name='noop')
            for i in range(3):
                for p in (m.a, m.b):
                    p.grad = np.cos(np.arange(4.) + i).astype(np.float32)
                    p._loss_scale = 8.0  # as backward(loss_scale=8) sets it
                if i == 1 and refuse:
                    name = o._rule.STATES[0]
                    a = (m.b.update_rule.state[name] if '{ro}' == 'state'
                         else m.b.grad)
                    a.flags.writeable = False
                    outcome(o.update, m.a.array, m.b.array)
                    a.flags.writeable = True
                o.update()
            print(repr(m.a.array.tolist()), repr(m.b.array.tolist()))
        run(False)
        run(True)
    '''.format(face=face, ro=read_only))
    names = {'state': {'LARS': 'momentum buffer', 'LAMB': 'first moment'},
             'gradient': {'LARS': 'gradient', 'LAMB': 'gradient'}}
    assert out[1] == ('ERROR ValueError /b: the {} is read-only (output '
                      'array is read-only)'.format(names[read_only][face]))
    assert out[2] == 'UNCHANGED'
    assert out[3] == out[0]


def lines_error(line):
    return line.split()[1] if line.startswith('ERROR') else None


READ_ONLY = {
    'flag': '''
        w = np.ones(4, np.float32); w.flags.writeable = False
    ''',
    'mmap': '''
        path = os.path.join({tmp!r}, 'w.npy')  # the test's tmp_path
        np.save(path, np.ones(4, np.float32))
        w = np.load(path, mmap_mode='r')
    ''',
    'frombuffer': '''
        data = bytes(np.ones(4, np.float32).tobytes())
        w = np.frombuffer(data, np.float32)
    ''',
}


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('memory', sorted(READ_ONLY))
def test_read_only_weights_are_refused_as_numpy_refuses_them(multi_tensor,
                                                             memory,
                                                             tmp_path):
    out = lines(READ_ONLY[memory].format(tmp=str(tmp_path)) + '''
        m, p = model()
        o = chainer_lars.LARS(lr=0.1, multi_tensor={mt}); o.setup(m)
        p.grad = np.full(4, .5, np.float32); o.update()
        p.array = w
        p.grad = np.full(4, .5, np.float32)
        outcome(o.update, p.array, p.grad, p.update_rule.state['v'])
        print(np.frombuffer(data, np.float32).tolist()
              if 'data' in globals() else 'no bytes')
        m, q = model()
        s = chainer.optimizers.MomentumSGD(lr=0.1); s.setup(m)
        q.array = w.copy(); q.array.flags.writeable = False
        q.grad = np.full(4, .5, np.float32)
        outcome(s.update)
    '''.format(mt=multi_tensor))
    assert lines_error(out[0]) == lines_error(out[3]) == 'ValueError'
    assert '/w' in out[0] and 'read-only' in out[0]
    assert out[1] == 'UNCHANGED'
    assert out[2] in ('no bytes', str([1.0] * 4))


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_the_hook_refuses_a_read_only_gradient(multi_tensor):
    out = lines('''
        m, p = model()
        p.array[:] = [1, 2, 3, 4]
        o = chainer.optimizers.MomentumSGD(lr=0.1); o.setup(m)
        o.add_hook(chainer_lars.GradientLARS(multi_tensor={mt}))
        g = np.full(4, .5, np.float32); g.flags.writeable = False
        p.grad = g
        outcome(o.update, p.array, p.grad)
        m, q = model()
        q.array[:] = [1, 2, 3, 4]
        s = chainer.optimizers.MomentumSGD(lr=0.1); s.setup(m)
        s.add_hook(chainer.optimizer_hooks.GradientLARS())
        q.grad = g
        outcome(s.update)
    '''.format(mt=multi_tensor))
    assert lines_error(out[0]) == lines_error(out[2]) == 'ValueError'
    assert '/w' in out[0] and 'read-only' in out[0]
    assert out[1] == 'UNCHANGED'


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_the_hook_refuses_a_read_only_float16_gradient_before_all_moves(
        multi_tensor):
    """A float16 parameter without a master copy, rescaled later in its
    rule, beside a float32 one the hook rescales at once: the float16
    gradient is checked first, so that the float32 gradient and weight
    keep their values too."""
    out = lines('''
        m = chainer.Link()
        with m.init_scope():
            m.a = chainer.Parameter(np.array([3, 4], np.float32))
            m.b = chainer.Parameter(np.array([1, 2, 3], np.float16))
        m.a.grad = np.array([1, 0], np.float32)
        g = np.full(3, .5, np.float16); g.flags.writeable = False
        m.b.grad = g
        o = chainer.optimizers.SGD(lr=0.1); o.setup(m)
        o.add_hook(chainer_lars.GradientLARS(multi_tensor={mt}))
        outcome(o.update, m.a.array, m.a.grad, m.b.array, m.b.grad)
    '''.format(mt=multi_tensor))
    assert lines_error(out[0]) == 'ValueError'
    assert '/b' in out[0] and 'read-only' in out[0]
    assert out[1] == 'UNCHANGED'


@pytest.mark.emulated
def test_the_hook_and_a_step_on_the_same_gpu_arrays_keep_their_words():
    """The same gradients under two ops, one plan each: the step must get
    the momentum buffers' pointers, not the hook's zeros."""
    out = lines('''
        device = chainer.get_device('@cupy:0')
        xp = device.xp
        with chainer.using_device(device):
            w = xp.asarray(np.linspace(1, 2, 300, dtype=np.float32))
            g = xp.asarray(np.linspace(-1, 1, 300, dtype=np.float32))
            v = xp.zeros(300, np.float32)
        plans = []
        for op in (L.RESCALE, L.STEP):
            plan = engine.Plan([w], lambda arrays: ([arrays], ()))
            plan.add(None, device, op, '/w', None, None, w,
                     (v,) if op == L.STEP else ())
            group, = plan.finish().groups
            group.rows[:, L.LR] = 0.5
            group.rows[:, L.MOMENTUM] = 0.9
            group.rows[:, L.ADAPT] = 0.0
            plans.append(plan)
        w0, g0 = w.get(), g.get()
        for plan in plans:
            engine.update(plan, [[g]])
        print(np.allclose(v.get(), 0.5 * g0), np.allclose(w.get(),
                                                          w0 - 0.5 * g0))
    ''', emulated=True)
    assert out == ['True True']


@pytest.mark.parametrize('dtype', ['>f2', '>f4'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_read_only_input_of_another_layout_is_read_not_written(
        multi_tensor, dtype):
    """Found by tests/test_fuzz.py: the native copy of a byte-swapped,
    read-only gradient was written back after the step, which Chainer's
    MomentumSGD never writes (float16: the NumPy passes; float32: the
    engine's copies for the compiled loop)."""
    import numpy as np
    import chainer
    import chainer_lars
    results = []
    for optimizer in (chainer_lars.LARS(lr=0.1, momentum=0.0,
                                        weight_decay=0.0,
                                        trust_coefficient=1.0,
                                        multi_tensor=multi_tensor),
                      chainer.optimizers.SGD(lr=0.1)):
        p = chainer.Parameter(np.linspace(1, 2, 5).astype(dtype))
        link = chainer.Link()
        with link.init_scope():
            link.w = p
        optimizer.setup(link)
        g = np.linspace(-1, 1, 5).astype(dtype)
        g.flags.writeable = False
        p.grad = g
        optimizer.update()
        assert p.grad is g and g.tolist() == np.linspace(
            -1, 1, 5).astype(dtype).tolist()
        results.append(p.array.astype(np.float64))
    # LARS with momentum 0 is SGD with the ratio: ||w|| / ||g||.
    w0, g0 = np.linspace(1, 2, 5), np.linspace(-1, 1, 5)
    r = np.linalg.norm(w0) / np.linalg.norm(g0)
    rtol = 2e-3 if dtype == '>f2' else 1e-5
    np.testing.assert_allclose(results[0], w0 - 0.1 * r * g0, rtol=rtol)
    np.testing.assert_allclose(results[1], w0 - 0.1 * g0, rtol=rtol)


def test_the_hook_refuses_an_empty_gradient_of_a_weight_that_is_not():
    """As Chainer's GradientLARS does (g += wd w cannot broadcast)."""
    import numpy as np
    import chainer
    import chainer_lars
    hook = chainer_lars.GradientLARS()
    p = chainer.Parameter(np.ones(5, np.float32))
    p.name = 'w'
    p._set_grad_without_check(np.zeros(0, np.float32))
    rule = chainer.optimizers.SGD().create_update_rule()
    with pytest.raises(ValueError, match=re.escape(
            'w: the gradient has shape (0,) but the weight (5,)')):
        hook(rule, p)


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_refused_hyperparameter_leaves_no_trace_in_the_settings(
        multi_tensor):
    """Found by tests/test_fuzz.py: the rows were filled with the refused
    value, and the next update, back at the old values, used them."""
    import numpy as np
    import chainer
    import chainer_lars
    w0, g0 = np.linspace(1, 2, 5), np.linspace(-1, 1, 5)
    p = chainer.Parameter(w0.astype(np.float32))
    link = chainer.Link()
    with link.init_scope():
        link.w = p
    opt = chainer_lars.LARS(lr=0.1, momentum=0.0, weight_decay=0.0,
                            trust_coefficient=1.0, multi_tensor=multi_tensor)
    opt.setup(link)
    p.grad = g0.astype(np.float32)
    opt.update()
    opt.update()  # the batched path's rows are filled from the second
    w1 = p.array.astype(np.float64)
    opt.hyperparam.lr = -1.0
    with pytest.raises(ValueError, match='lr'):
        opt.update()
    assert p.array.tolist() == w1.astype(np.float32).tolist()
    opt.hyperparam.lr = 0.1
    opt.update()
    r = np.linalg.norm(w1) / np.linalg.norm(g0)
    np.testing.assert_allclose(p.array, w1 - 0.1 * r * g0, rtol=1e-5)


MISALIGNED_FACES = {
    'lars': 'chainer_lars.LARS(lr=0.1, multi_tensor={mt})',
    'lamb': 'chainer_lars.LAMB(alpha=0.01, multi_tensor={mt})',
    'hook': 'chainer.optimizers.MomentumSGD(lr=0.1)',
}


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('face', sorted(MISALIGNED_FACES))
@pytest.mark.parametrize('where', ['weight', 'state', 'gradient'])
@pytest.mark.parametrize('dtype', ['float32', 'float64'])
def test_a_misaligned_array_is_updated_as_its_aligned_copy(
        multi_tensor, face, where, dtype):
    """NumPy computes on arrays whose address is not a multiple of their
    item size (a buffer read at an offset); the compiled loops must not
    take their address. A misaligned weight or state crashed the process
    (the copy the loop was given instead was the array itself)."""
    out = lines('''
        def misaligned(a):
            b = np.frombuffer(bytearray(a.nbytes + 1), a.dtype, offset=1)
            b = b.reshape(a.shape)
            b[...] = a
            return b

        def run(where):
            m, p = model(5, np.{dtype})
            p.array[:] = [1, -2, 3, -4, 5]
            o = {face}; o.setup(m)
            if {hook}:
                o.add_hook(chainer_lars.GradientLARS(multi_tensor={mt}))
            p.grad = np.linspace(-1, 1, 5).astype(np.{dtype}); o.update()
            flags = []
            for _ in range(2):
                p.grad = np.linspace(-.5, 2, 5).astype(np.{dtype})
                if where == 'weight':
                    p.array = misaligned(p.array)
                    flags.append(p.array.flags.aligned)
                elif where == 'state':
                    state = p.update_rule.state
                    for k in list(state):
                        state[k] = misaligned(state[k])
                        flags.append(state[k].flags.aligned)
                elif where == 'gradient':
                    p.grad = misaligned(p.grad)
                    flags.append(p.grad.flags.aligned)
                o.update()
            return flags, [p.array.tolist()] + [
                v.tolist() for v in p.update_rule.state.values()]

        flags, got = run({where!r})
        print(flags)
        _, expected = run(None)
        print(got == expected, got[0] != [1, -2, 3, -4, 5])
    '''.format(dtype=dtype, face=MISALIGNED_FACES[face].format(
        mt=multi_tensor), hook=face == 'hook', mt=multi_tensor, where=where))
    assert 'True' not in out[0] and 'False' in out[0]  # all misaligned
    assert out[1] == 'True True'


@pytest.mark.parametrize('face', ['lars', 'lamb'])
@pytest.mark.parametrize('state', ['read-only', 'strided', 'float64 master',
                                   'float16 master'])
def test_a_mixed16_row_off_the_batched_path_is_checked_before_any_moves(
        face, state):
    """A master or its state that the batched pass cannot take (here /a's)
    sends that row to its rule: a read-only state or a master of another
    dtype (Chainer's rule cannot give it a float32 gradient) is refused
    before /b steps, as Chainer's loop refuses it before any rule runs; a
    strided state steps as the batched pass would."""
    out = lines('''
        def run(odd):
            m = chainer.Link()
            with m.init_scope():
                m.a = chainer.Parameter(np.linspace(-1, 1, 4, dtype='e'))
                m.b = chainer.Parameter(np.linspace(1, 2, 4, dtype='e'))
            o = ({face!r} == 'lars' and chainer_lars.LARS(lr=0.1)
                 or chainer_lars.LAMB(alpha=0.01))
            o.setup(m); o.use_fp32_update()
            for g in (.5, .25):
                for p in (m.a, m.b):
                    p.grad = np.full(4, g, np.float16)
                o.update()
            state, master = m.a.update_rule.state, m.a.update_rule._fp32_param
            if odd and {state!r}.endswith('master'):
                master.array = master.array.astype({state!r}.split()[0])
            for k in list(state) if odd and 'master' not in {state!r} else ():
                if {state!r} == 'read-only':
                    state[k] = np.broadcast_to(state[k][:1], (4,))
                else:
                    b = np.zeros(8, np.float32); b[::2] = state[k]
                    state[k] = b[::2]
            for p in (m.a, m.b):
                p.grad = np.full(4, .5, np.float16)
            outcome(o.update, m.a.array, m.b.array,
                    m.b.update_rule._fp32_param.array)
            return [p.array.tolist() for p in (m.a, m.b)]

        print(run(True) == run(False))
    '''.format(face=face, state=state))
    if state == 'read-only':
        assert out[0].startswith('ERROR ValueError /a: the '), out
        assert out[0].endswith('is read-only (output array is read-only)')
        assert out[1] == 'UNCHANGED', out
    elif 'master' in state:
        assert out[0] == ('ERROR TypeError /a: the master copy is {}, not '
                          'float32'.format(state.split()[0])), out
        assert out[1] == 'UNCHANGED', out
    else:
        assert out[:2] == ['OK', 'CHANGED'], out
        assert out[4] == 'True', out


@pytest.mark.parametrize('emulated', [
    False, pytest.param(True, marks=pytest.mark.emulated)])
@pytest.mark.parametrize('dtype', ['float32', 'mixed16'])
@pytest.mark.parametrize('face', ['LARS', 'LAMB', 'hook'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_gradient_of_another_shape_and_the_same_size_is_refused(
        multi_tensor, face, dtype, emulated):
    """Chainer lets ``grad_var.array`` take another shape; its MomentumSGD
    then raises (operands could not be broadcast). The batched paths
    compared only the gradient's size with the weight's and stepped (the
    hook rescaled) a (3, 2) gradient into a (2, 3) weight; now it is
    refused, named, and the batched paths change nothing. (Mixed16 with
    multi_tensor=False takes Chainer's own path, which refused it.)"""
    out = lines('''
        def on_host(m):
            return [np.array(chainer.backend.CpuDevice().send(a)) for a in (
                m.a.array, m.w.array, m.a.grad, m.w.grad)]

        def run(make, hook):
            m = chainer.Link()
            with m.init_scope():
                m.a = chainer.Parameter(np.ones(4, {dtype!r}))
                m.w = chainer.Parameter(
                    np.arange(6, dtype={dtype!r}).reshape(2, 3) + 1)
            if {emulated}:
                m.to_device('@cupy:0')
            xp = m.w.device.xp
            o = make(); o.setup(m)
            if {mixed16}:
                o.use_fp32_update()
            if hook:
                o.add_hook(hook)
            for shape in ((2, 3), (3, 2)):
                m.a.grad = xp.full(4, .5, {dtype!r})
                m.w.grad = xp.ones((2, 3), {dtype!r})
                m.w.grad_var.array = xp.arange(
                    6, dtype={dtype!r}).reshape(shape)
                before = on_host(m)
                outcome(o.update)
                print('UNCHANGED' if same(before, *on_host(m)) else 'CHANGED')

        face = {face!r}
        if face == 'hook':
            run(lambda: chainer.optimizers.MomentumSGD(lr=0.1),
                chainer_lars.GradientLARS(multi_tensor={mt}))
        else:
            run(lambda: getattr(chainer_lars, face)(multi_tensor={mt}), None)
        run(lambda: chainer.optimizers.MomentumSGD(lr=0.1), None)
    '''.format(mt=multi_tensor, face=face, emulated=emulated,
               dtype='float16' if dtype == 'mixed16' else dtype,
               mixed16=dtype == 'mixed16'), emulated)
    ours, chainers = out[:6], out[6:]
    assert ours[:3] == chainers[:3] == ['OK', 'UNCHANGED', 'CHANGED'], out
    assert ours[3] == (
        # Chainer's own, a mixed16 rule's (its master gets the gradient):
        'ERROR ValueError Shape of data and grad mismatch grad: (3, 2) != '
        'data: (2, 3)' if dtype == 'mixed16' and not multi_tensor
        and face != 'hook' else
        'ERROR ValueError /w: the gradient has shape (3, 2) but the weight '
        '(2, 3): operands could not be broadcast together'), out
    assert chainers[3].startswith('ERROR '), out  # (emulated: a TypeError)
    # The batched paths move nothing; one rule at a time, /a has stepped
    # when /w is refused, as in Chainer's loop (the hook: checked first).
    assert ours[5] == ('UNCHANGED' if multi_tensor or face == 'hook'
                       else chainers[5]), out


@pytest.mark.parametrize('face', ['LARS', 'LAMB', 'hook'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_numpy_scalar_gradient_of_a_0d_weight(multi_tensor, face):
    """Chainer takes a NumPy scalar as a 0-d parameter's gradient. LARS and
    LAMB step it as the 0-d array it equals (it had no address: an
    AttributeError after the batched rows had moved); the hook, which
    rescales gradients in place, refuses it as read-only before anything
    moves, as it did (Chainer's own hook rebinds a local and leaves it
    unscaled)."""
    out = lines('''
        def run(scalar):
            m = chainer.Link()
            with m.init_scope():
                m.s = chainer.Parameter(np.full((), 2, np.float32))
                m.w = chainer.Parameter(np.ones(4, np.float32))
            if {face!r} == 'hook':
                o = chainer.optimizers.SGD(lr=0.1); o.setup(m)
                o.add_hook(chainer_lars.GradientLARS(multi_tensor={mt}))
            else:
                o = getattr(chainer_lars, {face!r})(multi_tensor={mt})
                o.setup(m)
            for g in (1.0, 0.5):
                m.w.grad = np.full(4, g, np.float32)
                m.s.grad = np.full((), g, np.float32)
                m.s.grad_var.array = np.float32(g) if scalar else m.s.grad
                outcome(o.update, m.s.array, m.w.array)
            print(repr([m.s.array.tolist(), m.w.array.tolist()]))

        run(True)
        run(False)
    '''.format(mt=multi_tensor, face=face))
    if face == 'hook':
        for k in (0, 2):
            assert out[k] == ('ERROR ValueError /s: the gradient is '
                              'read-only (output array is read-only)'), out
            assert out[k + 1] == 'UNCHANGED', out
    else:
        assert out[:5] == ['OK', 'CHANGED', 'OK', 'CHANGED', out[9]], out


@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_weight_set_to_none_beside_its_gradient_is_left_untouched(
        multi_tensor, face):
    """``param.array = None`` leaves the old gradient in place: the rule
    leaves it untouched, as an uninitialized one (its
    ``t`` counted, as Chainer counts that one's), and the others step as
    they would without it. It raised an AttributeError that named no
    parameter, after the batched rows had moved (Chainer's MomentumSGD
    raises a TypeError there, after the parameters before it moved)."""
    out = lines('''
        def run(drop):
            m = chainer.Link()
            with m.init_scope():
                m.a = chainer.Parameter(np.linspace(1, 2, 3, dtype='f'))
                m.b = chainer.Parameter(np.ones(4, 'f'))
            o = getattr(chainer_lars, {face!r})(multi_tensor={mt})
            o.setup(m)
            for g in (1.0, 0.5):
                m.a.grad, m.b.grad = np.full(3, g, 'f'), np.full(4, g, 'f')
                if g == 0.5 and drop:
                    m.b.array = None
                    m.b.grad_var.array = np.full(4, g, 'f')
                o.update()
            print(repr([m.a.array.tolist(), m.b.update_rule.t, o.t]))

        run(True)
        run(False)
    '''.format(mt=multi_tensor, face=face))
    assert out[0] == out[1], out


@pytest.mark.parametrize('emulated', [
    False, pytest.param(True, marks=pytest.mark.emulated)])
@pytest.mark.parametrize('which', ['weight', 'state', 'all'])
@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_an_array_reshaped_in_place_is_refused_as_chainer_refuses_it(
        multi_tensor, face, which, emulated):
    """``a.shape = (3, 2)`` on a (2, 3) weight or state keeps the object
    and its memory: the stamps missed it (they held the size) and stepped
    a (3, 2) weight with a (2, 3) state, where Chainer's MomentumSGD
    raises. The stamps hold the shape now: refused, named, before anything
    moves; all of a row's arrays reshaped alike step as before. (On a GPU
    a state reshaped in place is not noticed, nor a weight whose gradient
    keeps the old shape: the kernels read each array whole.)"""
    if emulated and which == 'state':
        pytest.skip('a state reshaped in place is not noticed on a GPU')
    out = lines('''
        def run(make, which):
            m = chainer.Link()
            with m.init_scope():
                m.w = chainer.Parameter(
                    np.arange(6, dtype='f').reshape(2, 3) + 1)
            if {emulated}:
                m.to_device('@cupy:0')
            xp = m.w.device.xp
            o = make(); o.setup(m)
            for _ in range(2):
                m.w.grad = xp.ones((2, 3), 'f'); o.update()
            states = list(m.w.update_rule.state.values())
            if which in ('weight', 'all'):
                m.w.array.shape = (3, 2)
            for s in states if which in ('state', 'all') else ():
                s.shape = (3, 2)
            m.w.grad = xp.full(m.w.shape, .5, 'f')
            before = np.array(chainer.backend.CpuDevice().send(m.w.array))
            outcome(o.update)
            after = chainer.backend.CpuDevice().send(m.w.array)
            print('UNCHANGED' if (before == after).all() else 'CHANGED')
            print(repr(after.ravel().tolist()))

        make = lambda: getattr(chainer_lars, {face!r})(multi_tensor={mt})
        run(make, {which!r})
        run(make, None)  # not reshaped: the reference of 'all'
        if not {emulated}:  # (the emulated ElementwiseKernel's error)
            run(lambda: chainer.optimizers.MomentumSGD(), {which!r})
    '''.format(mt=multi_tensor, face=face, which=which,
               emulated=emulated), emulated)
    state = 'momentum buffer' if face == 'LARS' else 'first moment'
    if which == 'all':
        assert out[0] == 'OK' and out[2] == 'CHANGED', out
        assert out[3] == out[7], out  # the same step, flat
    else:
        shapes = ('(2, 3)', '(3, 2)')[::1 if which == 'weight' else -1]
        assert out[0] == ('ERROR ValueError /w: the {} has shape {} but '
                          'the weight {}: operands could not be broadcast '
                          'together'.format(state, *shapes)), out
        assert out[2] == 'UNCHANGED', out
    if not emulated:
        assert lines_error(out[8]) == (None if which == 'all'
                                       else 'ValueError'), out


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_the_hook_refuses_a_tied_weights_gradient_before_any_moves(
        multi_tensor):
    """Tied weights are rescaled one by one after the batched groups; a
    gradient of theirs the hook cannot take (read-only: it is written in
    place) is refused before the others are rescaled."""
    import numpy as np
    import chainer
    import chainer_lars
    link = chainer.Link()
    with link.init_scope():
        link.a = chainer.Parameter(np.linspace(1, 2, 5).astype(np.float32))
        link.b = chainer.Parameter(np.linspace(1, 2, 7).astype(np.float32))
        link.c = chainer.Parameter(link.b.array)  # tied with b
    opt = chainer.optimizers.MomentumSGD(lr=0.1).setup(link)
    opt.add_hook(chainer_lars.GradientLARS(multi_tensor=multi_tensor))
    for p in link.params():
        p.grad = np.linspace(-1, 1, p.size).astype(np.float32)
    link.c.grad.flags.writeable = False
    before = {name: (p.array.copy(), p.grad.copy())
              for name, p in link.namedparams()}
    with pytest.raises(ValueError, match=re.escape(
            '/c: the gradient is read-only')):
        opt.update()
    for name, p in link.namedparams():
        assert (p.array == before[name][0]).all()
        assert (p.grad == before[name][1]).all()


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('scale', [None, 8.0, 3.0])
def test_a_read_only_float16_gradient_is_read_under_fp32_update(
        monkeypatch, face, multi_tensor, scale):
    """Under use_fp32_update() the float16 gradient is only read (the
    rescaled or unscaled copy is its master's): read-only, it steps as a
    writeable one, unchanged, as with Chainer's optimizers (the hook
    refused it from the second update on the CPU), in the batched pass
    (LARS and LAMB under a loss scale gave it to its rule)."""
    import numpy as np
    import chainer
    from chainer_lars import fused
    calls, update = [], fused.FusedRule.update
    monkeypatch.setattr(fused.FusedRule, 'update', lambda rule, param: (
        calls.append(param), update(rule, param))[1])
    results = []
    for writeable in (True, False):
        link = chainer.Link()
        with link.init_scope():
            link.a = chainer.Parameter(np.linspace(1, 2, 5).astype(np.float16))
        opt = optimizer_of(face, link, multi_tensor)
        opt.use_fp32_update()
        for step in range(3):
            g = np.linspace(-1, 1, 5).astype(np.float16) * (step + 1)
            expected, g.flags.writeable = g.copy(), writeable
            link.a.grad = g
            link.a._loss_scale = scale
            del calls[:]
            opt.update()
            assert link.a.grad is g and (g == expected).all()
        # (the first update: the rule makes its master; then the batches)
        assert len(calls) == (face != 'hook' and not multi_tensor)
        results.append(link.a.array.copy())
    assert results[0].tolist() == results[1].tolist()


@pytest.mark.parametrize('face', ['hook', 'LARS'])
def test_a_buffer_moved_after_a_refused_update_is_not_written(face):
    """A plan made, then the update refused before the compiled call (its
    stamps not yet taken), then a weight's buffer moved in place: the
    stamps were taken from the moved array at the next update, matched,
    and the loop wrote through the table's address of the freed buffer."""
    out = lines('''
        from chainer import optimizer as co
        m = chainer.Link()
        with m.init_scope():
            m.p0 = chainer.Parameter(np.ones(8, np.float32))
            m.p1 = chainer.Parameter(np.ones(6, np.float32))
        if {hook}:
            o = chainer.optimizers.SGD(lr=0.1).setup(m)
            o.add_hook(chainer_lars.GradientLARS())
        else:
            o = chainer_lars.LARS(lr=0.1, momentum=0.0).setup(m)
        for p in m.params():
            p.grad = np.ones(p.shape, p.dtype)
        o.update()
        m.p0.array = m.p0.array.copy()  # a new plan at the next update
        if {hook}:  # refused by the hook: a gradient of another shape
            m.p1.array = np.ones(5, np.float16)
        else:  # refused by its row: a value the first checks do not see
            hp = co.Hyperparameter(o.hyperparam)
            hp.lr = -1.0
            m.p1.update_rule.hyperparam = co.Hyperparameter(hp)
        outcome(o.update)
        if {hook}:
            m.p1.grad = None
        else:
            hp.lr = 0.1
        a = m.p0.array
        a.resize((1 << 16,), refcheck=False)
        a.resize((8,), refcheck=False)  # moved, the same object
        a[...] = np.arange(1, 9)
        junk = [np.full(8, 7.0, np.float32) for _ in range(64)]
        p0 = a.copy()
        m.p0.grad = np.ones(8, np.float32)
        o.update()
        print(all((j == 7.0).all() for j in junk))
        print(np.linalg.norm(p0), (o if not {hook} else
              o._hookable._pre_update_hooks['GradientLARS']).observe()[
                  '/p0'][1])
        print(np.abs(p0 - m.p0.array).max() > 0)
    '''.format(hook=face == 'hook'))
    assert out[0].startswith('ERROR ValueError'), out
    assert out[2:] == ['True', out[3], 'True'], out
    norm, observed = map(float, out[3].split())
    assert observed == pytest.approx(norm, rel=1e-6)


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
@pytest.mark.parametrize('how', ['byteorder', 'strides'])
def test_a_refusal_among_changed_groups_leaves_every_table_as_stamped(
        face, how):
    """Two groups changed in place, the second refused: the first had its
    table made again (a 0 address: its weight now takes the copy route)
    while the record kept its old stamps; the first set back as it was
    stamped, the next update ran the loop on address 0 (a crash)."""
    out = lines('''
        m = chainer.Link()
        with m.init_scope():
            m.p0 = chainer.Parameter(np.ones((4, 4), np.float32))
            m.p1 = chainer.Parameter(np.ones(6, np.float64))
        if '{face}' == 'hook':
            o = chainer.optimizers.SGD(lr=0.1).setup(m)
            o.add_hook(chainer_lars.GradientLARS())
        elif '{face}' == 'LARS':
            o = chainer_lars.LARS(lr=0.1, momentum=0.0).setup(m)
        else:
            o = chainer_lars.LAMB(alpha=0.01).setup(m)

        def grads():
            for p in m.params():
                p.grad = np.ones(p.shape, p.dtype)
        for _ in range(2):
            grads()
            o.update()
        a = m.p0.array
        if '{how}' == 'byteorder':
            a.dtype = np.dtype('>f4')  # in place: not native
        else:
            a.strides = (4, 16)  # in place: not C-contiguous
        m.p1.array.dtype = np.int64  # refused
        grads()
        outcome(o.update)
        if '{how}' == 'byteorder':
            a.dtype = np.dtype('<f4')
        else:
            a.strides = (16, 4)
        m.p1.array.dtype = np.float64
        grads()
        before = a.copy()
        o.update()
        print(np.abs(before - a).max() > 0)
    '''.format(face=face, how=how))
    assert out[0].startswith('ERROR TypeError only floating-point'), out
    assert out[1:] == ['UNCHANGED', 'True'], out


@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
def test_a_dtype_set_in_place_is_noticed_though_at_a_stamped_address(face):
    """The stamps hold the dtype object's address: a weight's native dtype
    object, not NumPy's own, freed by setting the dtype in place, gave its
    address to the big-endian one set next, every stamp matched, and the
    compiled loop read big-endian bytes as native. The update equals the
    one of the same change without that dtype object."""
    out = lines('''
        def model():
            m = chainer.Link()
            with m.init_scope():
                m.p = chainer.Parameter(np.linspace(1, 2, 16).astype('f4'))
            if '{face}' == 'LARS':
                return m, chainer_lars.LARS(lr=0.1, momentum=0.0).setup(m)
            return m, chainer_lars.LAMB(alpha=0.01).setup(m)

        def step(m, o, change=lambda: None):
            m.p.grad = np.linspace(-1, 1, 16).astype(np.float32)
            change()
            o.update()
        results = []
        for own in (False, True):
            m, o = model()
            step(m, o)
            a = m.p.array
            if own:  # native, but not NumPy's object: stamped
                a.dtype = np.dtype('f4').newbyteorder('S').newbyteorder('S')
            step(m, o)

            def change():
                if own:
                    a.dtype = np.dtype('f4')  # the stamped object freed
                    z = np.dtype('f4').newbyteorder('S')  # at its address?
                    a.byteswap(inplace=True)
                    a.dtype = z
                else:
                    a.byteswap(inplace=True)
                    a.dtype = a.dtype.newbyteorder('S')
            step(m, o, change)
            results.append(a.astype(np.float64))
        print(np.allclose(results[0], results[1], rtol=1e-6))
    '''.format(face=face))
    assert out == ['True'], out


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
def test_an_arrays_own_code_moving_another_groups_buffer_is_not_written(
        face):
    """A row of another layout (an ndarray subclass) is updated on a copy
    written back with its ``__setitem__``. That code moved another group's
    buffer in place (the same object), and that group's compiled loop ran
    next, on the address taken before the move: freed memory (a crash).
    Every group's loop now runs before any copy is written back."""
    out = lines('''
        N = 1 << 24  # a buffer of its own (mmap): unmapped when it moves
        hook = {hook}

        class Moving(np.ndarray):
            victim = None

            def __setitem__(self, key, value):
                np.ndarray.__setitem__(self, key, value)
                v, Moving.victim = Moving.victim, None
                if v is not None:
                    kept = v.copy()
                    v.resize((4 * N,), refcheck=False)
                    v.resize((N,), refcheck=False)
                    v[...] = kept  # the values it had, at another address

        def run(moving):
            m = chainer.Link()
            with m.init_scope():
                m.p0 = chainer.Parameter(np.ones(4, np.float32))
                m.p1 = chainer.Parameter(np.linspace(
                    1, 2, N).astype(np.float32 if hook else np.float64))
            if hook:  # a group per parameter
                o = chainer.optimizers.SGD(lr=0.1).setup(m)
                o.add_hook(chainer_lars.GradientLARS(multi_tensor=False))
            else:  # a group per dtype
                o = getattr(chainer_lars, '{face}')().setup(m)
            for i in range(3):
                sub = (lambda a: a.view(Moving)) if moving and i else (
                    lambda a: a)
                m.p0.grad = sub(np.full(4, 0.5, np.float32))
                m.p1.grad = np.full(N, 0.25, m.p1.dtype)
                if not hook:
                    m.p0.array = sub(np.array(m.p0.array))
                Moving.victim = (m.p1.grad if hook else m.p1.array
                                 ) if i == 2 else None
                o.update()
            return [np.array(a) for a in (m.p0.array, m.p1.array)]

        moved = run(True)
        moved_it, plain = Moving.victim is None, run(False)
        print(all(np.array_equal(a, b) for a, b in zip(moved, plain)))
        print(moved_it, np.abs(plain[1] - np.linspace(1, 2, N)).max() > 0)
    '''.format(hook=face == 'hook', face=face))
    assert out == ['True', 'True True'], out


@pytest.mark.parametrize('how', ['shrunk', 'float16', 'int32'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_copy_is_checked_as_made_after_an_arrays_own_code_ran(
        multi_tensor, how):
    """The hook's rows of another layout are checked before any group runs,
    then copied after the loops. An ndarray subclass's ``__setitem__``
    (another row's copy written back) shrank a later row's gradient in
    place between the two (or made it float16 of the same shape, half the
    bytes): its copy went to the loop as if of the weight's size and dtype
    (a heap corrupted). A shrunk one is refused, naming the parameter, and
    so is one made int32 in place; a float16 one is copied as float32, as
    the loop reads it. (``LARS`` and ``LAMB`` step such arrays in their
    rules.)"""
    out = lines('''
        N = 1 << 16

        class Moving(np.ndarray):
            victim = None

            def __setitem__(self, key, value):
                np.ndarray.__setitem__(self, key, value)
                v, Moving.victim = Moving.victim, None
                if v is not None and '{how}' == 'int32':  # (N,) still
                    v.dtype = np.int32
                elif v is not None:
                    v.resize((N // 2,), refcheck=False)
                    if '{how}' == 'float16':  # (N,) again, 2 bytes each
                        v.dtype = np.float16

        def owning(value, n):  # a subclass instance that owns its buffer
            a = np.ndarray.__new__(Moving, (n,), np.float32)
            a[...] = value
            return a

        m = chainer.Link()
        with m.init_scope():
            m.p0 = chainer.Parameter(np.ones(4, np.float32))
            m.p1 = chainer.Parameter(np.linspace(1, 2, N).astype(np.float32))
        o = chainer.optimizers.SGD(lr=0.1).setup(m)
        o.add_hook(chainer_lars.GradientLARS(multi_tensor={multi_tensor}))
        m.p0.grad, m.p1.grad = owning(0.5, 4), owning(0.25, N)
        Moving.victim = m.p1.grad
        outcome(o.update, m.p1.array)
        print(Moving.victim is None, m.p1.grad.dtype, m.p1.grad.shape,
              bool(np.isfinite(m.p1.array).all()))
        print(o._hookable._pre_update_hooks['GradientLARS'].observe().get(
            '/p1', (0, 0, 0))[2])
    '''.format(multi_tensor=multi_tensor, how=how))
    if how == 'int32':
        assert out[:2] == [
            'ERROR TypeError only floating-point arrays (float16, float32, '
            'float64) are updated; the gradient of /p1 is int32',
            'UNCHANGED'], out
    elif how == 'shrunk':
        assert out[0].startswith(
            'ERROR ValueError /p1: the gradient has shape'), out
        assert out[2] == 'True float32 (32768,) True', out
    else:  # the weight stepped with what the gradient holds now
        assert out[:2] == ['OK', 'CHANGED'], out
        assert out[2] == 'True float16 (65536,) True', out
        # 0.25 as float32 bytes: float16 0 and 1.625 (not 0.25, then past
        # the copy's end, as the loop read it)
        assert float(out[3]) == pytest.approx(1.625 * (2 ** 15) ** 0.5,
                                              rel=1e-6)


@pytest.mark.parametrize('moved', ['gradient', 'weight'])
@pytest.mark.parametrize('face', ['hook', 'hook-per-array', 'LARS', 'LAMB'])
def test_an_arrays_property_moving_a_taken_buffer_is_not_written(face, moved):
    """A gradient of another layout (an ndarray subclass) is checked after
    the addresses are taken; its ``shape`` property moved a taken buffer
    in place, and the compiled loop wrote the freed address (a crash). The
    addresses are taken again after the checks: a moved weight is taken
    where it is now, a moved gradient refused by name before any array
    changes."""
    out = lines('''
        import gc
        N = 1 << 24  # a buffer of its own (mmap): unmapped when it moves
        blocks = []  # (where mremap would grow it in place)

        class Moving(np.ndarray):
            victim = None

            @property
            def shape(self):
                if sys._getframe(1).f_code.co_name == 'addressed':
                    v, Moving.victim = Moving.victim, None
                    if v is not None:  # moved in place, the same object
                        old, kept = v.ctypes.data, v.copy()
                        while v.ctypes.data == old:
                            v.resize((4 * N,), refcheck=False)
                            v.resize((N,), refcheck=False)
                            blocks.append(np.ones(4 * N, np.float32))
                        v[...] = kept  # the values it had, elsewhere
                return np.ndarray.shape.__get__(self)

        def run(moving):
            m = chainer.Link()
            with m.init_scope():
                m.p0 = chainer.Parameter(np.ones(4, np.float32))
                m.p1 = chainer.Parameter(np.linspace(
                    1, 2, N).astype(np.float32))
            if '{face}'.startswith('hook'):
                o = chainer.optimizers.SGD(lr=0.1).setup(m)
                o.add_hook(chainer_lars.GradientLARS(
                    multi_tensor='{face}' == 'hook'))
            else:
                o = getattr(chainer_lars, '{face}')().setup(m)
            for i in range(3):
                m.p0.grad = np.full(4, 0.5, np.float32)
                if moving and i == 2:
                    m.p0.grad = m.p0.grad.view(Moving)
                m.p1.grad = np.full(N, 0.25, np.float32)
                Moving.victim = getattr(m.p1, '{array}') if moving and (
                    i == 2) else None
                before = [np.array(a) for a in (m.p0.array, m.p1.array)]
                outcome(o.update, m.p0.array, m.p1.array)
            return before, [np.array(a) for a in (m.p0.array, m.p1.array)]

        before, moved = run(True)
        print(Moving.victim is None, gc.isenabled())
        plain = run(False)[1]
        print(all(np.array_equal(a, b) for a, b in zip(moved, plain)),
              all(np.array_equal(a, b) for a, b in zip(moved, before)))
    '''.format(face=face, array='grad' if moved == 'gradient' else 'array'))
    assert out[:4] == ['OK', 'CHANGED'] * 2, out
    if moved == 'gradient':
        assert out[4:6] == [
            'ERROR RuntimeError /p1: an array moved or changed in memory '
            'during the checks', 'UNCHANGED'], out
        assert out[6] == 'True True', out
        assert out[-1] == 'False True', out
    else:  # stepped as if nothing moved
        assert out[4:7] == ['OK', 'CHANGED', 'True True'], out
        assert out[-1] == 'True False', out


@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
def test_no_collection_runs_code_between_taken_addresses_and_loops(face):
    """A collection inside an update of several groups ran ``gc.callbacks``
    (or a finalizer) after the addresses were taken; code there that moved
    a gradient in place made a loop write freed memory (a crash). No
    collection runs inside an update now, and the collector is left as
    the user had it."""
    out = lines('''
        import gc
        N = 1 << 24  # a buffer of its own (mmap): unmapped when it moves
        victim = []

        def callback(phase, info):
            f = sys._getframe(1)
            while victim and phase == 'start' and f is not None:
                if f.f_code is engine.update.__code__ and (
                        'gptrs' in f.f_locals):  # (addresses taken)
                    v = victim.pop()
                    kept = v.copy()
                    v.resize((4 * N,), refcheck=False)
                    v.resize((N,), refcheck=False)
                    v[...] = kept  # the values it had, elsewhere
                f = f.f_back

        def run(moving):
            m = chainer.Link()
            with m.init_scope():  # two groups: two dtypes, or a hook's two
                m.p0 = chainer.Parameter(np.ones(4, np.float64))
                m.p1 = chainer.Parameter(np.linspace(
                    1, 2, N).astype(np.float32))
            if '{face}' == 'hook':
                o = chainer.optimizers.SGD(lr=0.1).setup(m)
                o.add_hook(chainer_lars.GradientLARS(multi_tensor=False))
            else:
                o = getattr(chainer_lars, '{face}')().setup(m)
            for i in range(3):
                m.p0.grad = np.full(4, 0.5, np.float64)
                m.p1.grad = np.full(N, 0.25, np.float32)
                if moving and i == 2:
                    victim.append(m.p1.grad)
                    gc.set_threshold(1, 1, 1)  # a collection at each object
                o.update()
                gc.set_threshold(700, 10, 10)
            return [np.array(a) for a in (m.p0.array, m.p1.array)]

        gc.callbacks.append(callback)
        moved = run(True)
        print(len(victim), gc.isenabled())
        gc.disable()
        plain = run(False)
        print(all(np.array_equal(a, b) for a, b in zip(moved, plain)),
              gc.isenabled())
    '''.format(face=face))
    assert out == ['1 True', 'True False'], out


@pytest.mark.parametrize('when', ['build', 'refresh', 'unchanged'])
@pytest.mark.parametrize('face', ['hook', 'LARS', 'LAMB'])
def test_a_weight_moved_between_its_table_and_its_stamp_is_refused(
        face, when):
    """A CPU table takes the weights' addresses, then the plan's record
    stamps them; code between the two (an ndarray subclass weight's
    ``dtype`` property, as the record reads it, or as the checks of a
    group made again read it) moved another weight: the stamp took the
    new address, the table kept the freed one, and the loop wrote it. The
    record now refuses a stamp that is not what its table took, naming
    the parameter, before any array changes; the update after it is
    made on a plan built again."""
    out = lines('''
        N = 1 << 24  # a buffer of its own (mmap): unmapped when it moves
        kept = []

        def relocate(v):  # in place, the same object, until it moves
            old, values = v.ctypes.data, v.copy()
            while v.ctypes.data == old:
                v.resize((4 * N,), refcheck=False)
                v.resize((N,), refcheck=False)
                kept.append(np.ones(4 * N, np.float32))  # (mremap's room)
            v[...] = values

        class Moving(np.ndarray):
            victim, where = None, 'Record' if '{when}' != 'unchanged' else (
                'addressed')

            @property
            def dtype(self):
                for f in (sys._getframe(1), sys._getframe(2)):  # (listcomp)
                    if Moving.victim is not None and Moving.where in (
                            f.f_code.co_name, type(f.f_locals.get('self'))
                            .__name__):
                        v, Moving.victim = Moving.victim, None
                        relocate(v)
                        print('moved', flush=True)
                return np.ndarray.dtype.__get__(self)

        m = chainer.Link()
        with m.init_scope():  # p0 and p2 a group; p1 (float64) another
            m.p0 = chainer.Parameter(np.ones(4, np.float32).view(Moving))
            m.p2 = chainer.Parameter(np.ones(N, np.float32))
            m.p1 = chainer.Parameter(np.linspace(1, 2, N).copy())
        if '{face}' == 'hook':
            o = chainer.optimizers.SGD(lr=0.1).setup(m)
            o.add_hook(chainer_lars.GradientLARS())
        else:
            o = getattr(chainer_lars, '{face}')().setup(m)
        at = {at}  # the batched plan's first update, or one after it
        for i in range(4):
            m.p0.grad = np.full(4, 0.5, np.float32)
            m.p2.grad = np.full(N, 0.5, np.float32)
            m.p1.grad = np.full(N, 0.25)
            if i == at and '{when}' != 'build':  # made again: p2 moved
                relocate(m.p2.array)
            Moving.victim = m.p1.array if i == at else None
            outcome(o.update, m.p0.array, m.p1.array, m.p2.array)
        print(np.isfinite(m.p1.array).all())
    '''.format(face=face, when=when, at=(face != 'hook') + (when != 'build')))
    at = (face != 'hook') + (when != 'build')
    assert out == ['OK', 'CHANGED'] * at + [
        'moved', 'ERROR RuntimeError /p1: an array moved or changed in '
        'memory during the checks', 'UNCHANGED'] + ['OK', 'CHANGED'] * (
            3 - at) + ['True'], out


@pytest.mark.skipif(
    numpy.lib.NumpyVersion(numpy.__version__) >= '2.0.0',
    reason="NumPy 2 has no ndarray.data assignment, the only way found to "
    "put a buffer back at its old address")
@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
def test_a_refused_record_leaves_no_old_stamps_to_match(face):
    """A weight moved before an update (its table taken again), then moved
    back, freeing the new buffer, by code inside the new record: the new
    record is refused, and the record it replaces would match every array
    again beside a table that holds the freed buffer (the next update
    wrote there, or crashed). The replaced record matches no array: the
    next update builds the tables again. (The hook only reads the weight,
    from memory that may be in use again: the values it reads are not a
    reliable witness.)"""
    out = lines('''
        N = 1 << 24
        first = bytearray(4 * N)  # p2's buffer, kept alive throughout

        def back():
            values = np.array(m.p2.array)
            m.p2.array.data = first  # the other one freed
            m.p2.array[...] = values
            print('back', flush=True)

        m = chainer.Link()
        with m.init_scope():
            m.p0 = chainer.Parameter(np.ones(4, np.float32).view(InRecord))
            w = np.frombuffer(bytearray(4 * N), np.float32)
            w.data = first  # (its flags as after the moves below)
            m.p2 = chainer.Parameter(w)
            m.p1 = chainer.Parameter(np.linspace(1, 2, 8))
        m.p2.array[...] = 1
        if '{face}' == 'hook':
            o = chainer.optimizers.SGD(lr=0.1).setup(m)
            o.add_hook(chainer_lars.GradientLARS())
        else:
            o = chainer_lars.{face}().setup(m)
        for i in range(5):
            m.p0.grad = np.full(4, 0.5, np.float32)
            m.p2.grad = np.full(N, 0.5, np.float32)
            m.p1.grad = np.full(8, 0.25)
            if i == {at}:  # (the hook's plan is made at the first update)
                values = np.array(m.p2.array)
                m.p2.array.data = bytearray(4 * N)  # its only reference
                m.p2.array[...] = values
                InRecord.then = back
            outcome(o.update, m.p2.array)
        print(np.isfinite(m.p2.array).all(), (m.p2.array < 1).all())
    '''.format(face=face, at=1 if face == 'hook' else 2))
    at = 1 if face == 'hook' else 2
    assert out == ['OK', 'CHANGED'] * at + [
        'back', 'ERROR RuntimeError /p2: an array moved or changed in memory '
        'during the checks', 'UNCHANGED'] + ['OK', 'CHANGED'] * (4 - at) + [
            'True True'], out


@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
def test_a_weight_reshaped_between_its_table_and_its_stamp_is_refused(face):
    """A weight reshaped in place (the same size and address) by code run
    between its table and its stamp kept its states of the old shape, and
    every later update matched the stamps: it stepped where Chainer
    refuses the states' shape. The record compares the shapes too."""
    out = lines('''
        m = chainer.Link()
        with m.init_scope():
            m.p0 = chainer.Parameter(np.ones(4, np.float32).view(InRecord))
            m.p2 = chainer.Parameter(np.ones((4, 4), np.float32))
        o = chainer_lars.{face}().setup(m)
        for i in range(4):
            m.p0.grad = np.full(4, 0.5, np.float32)
            m.p2.grad = np.full(m.p2.shape, 0.5, np.float32)
            if i == 1:
                InRecord.then = lambda a=m.p2.array: setattr(a, 'shape', (16,))
            outcome(o.update, m.p2.array.ravel())  # (a view: its values)
    '''.format(face=face))
    states = 'momentum buffer' if face == 'LARS' else 'first moment'
    assert out[:4] == ['OK', 'CHANGED', 'ERROR RuntimeError /p2: an array '
                       'moved or changed in memory during the checks',
                       'UNCHANGED'], out
    assert out[4].startswith('ERROR ValueError /p2: the {} has shape (4, 4) '
                             'but the weight (16,)'.format(states)), out
