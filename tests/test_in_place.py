"""Arrays changed in place under the engine's tables, each case in a
subprocess against a float64 reference: a crash fails the case, not the run.

The engine knows its arrays by stamps of NumPy's array header (address,
dtype, flags, size), so a buffer reallocated by ``resize``, strides, dtype
or byte order set on the same object, or a writeable flag turned off all
reach the checks again: each case gives the reference result or the error
NumPy or Chainer would raise, before anything is written.
"""

import textwrap

import pytest

from tests.test_safety import lines


_CASE = '''
import gc, weakref
from tests import lars_reference as ref

FACE, MT, DEVICE, SUB = {face!r}, {mt!r}, {device!r}, {sub!r}
rng = np.random.RandomState(0)
m = chainer.Link()
with m.init_scope():
    m.a = chainer.Parameter(rng.standard_normal((3, 4)).astype(np.float32))
    m.b = chainer.Parameter(rng.standard_normal(5).astype(np.float32))
if DEVICE == 'emulated':
    m.to_device('@cupy:0')
params = [m.a, m.b]
KW = dict(weight_decay=1e-3)
if FACE == 'lars':
    o = chainer_lars.LARS(lr=0.5, momentum=0.9, trust_coefficient=0.02,
                          multi_tensor=MT, **KW)
    o.setup(m)
else:
    o = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    o.setup(m)
    HOOK = chainer_lars.GradientLARS(multi_tensor=MT, **KW)
    o.add_hook(HOOK)

def fill(seed):
    r = np.random.RandomState(seed)
    for p in params:
        p.grad = p.device.send(r.standard_normal(p.shape).astype(p.dtype))

class Sub(np.ndarray):
    pass

def owned(a):  # a subclass that owns its buffer, as np.memmap's do
    b = Sub(a.shape, a.dtype)
    b[...] = a
    return b

if SUB:  # weights and momentum buffers of an ndarray subclass
    for p in params:
        p.array = owned(p.array)
    fill(0)
    o.update()
    for p in params:
        p.update_rule.state['v'] = owned(p.update_rule.state['v'])

def expected():
    """The float64 reference of the next update, from the arrays now."""
    out = []
    for p in params:
        w, g = p.array, p.grad
        v = p.update_rule.state['v']
        if FACE == 'lars':
            w_new, _ = ref.lars_step(w, g, v, 0.5, 0.9, 1e-3, 0.02, 0.0)
        else:
            g_new = ref.hook_gradient(w, g, weight_decay=1e-3)
            w_new = np.asarray(w, np.float64) + (0.9 * v - 0.1 * g_new)
        out.append((w_new, np.abs(w_new - np.asarray(w, np.float64)).max()))
    return out

def check(mutate, reuse_grads=False):
    fill(1)
    o.update()  # the plan, groups and tables are built
    if not reuse_grads:
        fill(2)
    mutate()
    want = expected()
    outcome(o.update, *[p.array for p in params], *[
        p.update_rule.state['v'] for p in params])
    errors = [np.abs(np.asarray(p.array, np.float64) - w).max() / step
              for p, (w, step) in zip(params, want)]
    print('ERROR/STEP', '%.2g' % max(errors))
'''


FACES = [(face, mt) for face in ('lars', 'hook') for mt in (True, False)]
MUTATIONS = {
    'weight resized (reallocated) and back': '''
        def mutate():
            w = m.a.array
            w.resize((4000,), refcheck=False)
            w.resize((3, 4), refcheck=False)
            w[...] = np.linspace(-1, 1, 12).reshape(3, 4)
    ''',
    'weight strides set to Fortran order': '''
        def mutate():
            m.a.array.strides = (4, 12)
    ''',
    'gradient strides set, the same gradient objects': '''
        def mutate():
            m.a.grad.strides = (4, 12)
    ''',
    'gradient byte order set, the same gradient objects': '''
        def mutate():
            g = m.b.grad
            g[...] = g.byteswap()
            g.dtype = g.dtype.newbyteorder('>')
    ''',
}


# A subclass (np.memmap, np.matrix, a user's) is not stamped: the tables
# must not take its address, or a change in place went unseen.
SUBCLASS = pytest.mark.parametrize('sub', [False, True],
                                   ids=['ndarray', 'subclass'])


@SUBCLASS
@pytest.mark.parametrize('face, mt', FACES)
@pytest.mark.parametrize('mutation', sorted(MUTATIONS))
def test_an_array_changed_in_place_gives_the_reference_step(face, mt,
                                                            mutation, sub):
    reuse = 'same gradient objects' in mutation
    out = lines(_CASE.format(face=face, mt=mt, device='cpu', sub=sub)
                + textwrap.dedent(MUTATIONS[mutation]) + (
        'check(mutate, reuse_grads={})\n'.format(reuse)))
    assert out[:2] == ['OK', 'CHANGED'], out
    assert float(out[2].split()[1]) < 1e-5, out


REFUSED = {
    'weight dtype set to int32': ('''
        def mutate():
            m.a.array.dtype = np.int32
    ''', 'TypeError', '/a'),
    'weight made read-only': ('''
        def mutate():
            m.a.array.flags.writeable = False
    ''', 'ValueError', 'read-only'),
    'momentum buffer made read-only': ('''
        def mutate():
            m.b.update_rule.state['v'].flags.writeable = False
    ''', 'ValueError', 'read-only'),
    'gradient made read-only, the same objects': ('''
        def mutate():
            m.b.grad.flags.writeable = False
    ''', None, 'read-only'),
}


@SUBCLASS
@pytest.mark.parametrize('face, mt', FACES)
@pytest.mark.parametrize('mutation', sorted(REFUSED))
def test_an_array_changed_in_place_is_refused_before_anything_moves(
        face, mt, mutation, sub):
    code, error, words = REFUSED[mutation]
    reuse = 'same objects' in mutation
    out = lines(_CASE.format(face=face, mt=mt, device='cpu', sub=sub)
                + textwrap.dedent(code) + (
        'check(mutate, reuse_grads={})\n'.format(reuse)))
    if 'gradient' in mutation and face == 'lars':
        # LARS writes a gradient only to divide out a loss scale: a
        # read-only one is read as MomentumSGD reads it.
        assert out[:2] == ['OK', 'CHANGED'], out
        assert float(out[2].split()[1]) < 1e-5, out
        return
    if face == 'hook' and 'gradient' not in mutation and 'dtype' not in (
            mutation):
        # The hook writes neither weights nor the optimizer's buffer:
        # Chainer's MomentumSGD raises as NumPy does, after the hook.
        assert out[0] == 'ERROR ValueError output array is read-only', out
        return
    if not mt and 'momentum' in mutation:
        # LARS(multi_tensor=False) is Chainer's loop over the rules: /a
        # steps, then /b raises, as in Chainer's MomentumSGD.
        assert out[0].startswith('ERROR ValueError /b: the momentum'), out
        return
    assert out[0].startswith('ERROR ' + (error or 'ValueError')), out
    assert words in out[0], out
    assert out[1] == 'UNCHANGED', out


DEVICES = ['cpu', pytest.param('emulated', marks=pytest.mark.emulated)]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('face, mt', FACES)
def test_no_gradient_is_kept_after_the_update(face, mt, device):
    out = lines(_CASE.format(face=face, mt=mt, device=device, sub=False)
                + textwrap.dedent('''
        fill(1)
        o.update()
        fill(2)
        held = [weakref.ref(p.grad) for p in params]
        o.update()
        m.cleargrads()
        gc.collect()
        print([r() is None for r in held])
    '''), emulated=device == 'emulated')
    assert out == ['[True, True]'], out


def test_the_hook_keeps_no_deleted_float16_parameter():
    """A hook kept across runs holds no parameter of a model whose
    optimizer is gone, the last one's included (its plans go with their
    owners)."""
    out = lines('''
        import gc, weakref
        hook = chainer_lars.GradientLARS()
        refs = []
        for k in range(3):
            p = chainer.Parameter(np.ones(4, np.float16))
            m = chainer.Link()
            with m.init_scope():
                m.w = p
            o = chainer.optimizers.MomentumSGD(lr=0.1)
            o.setup(m)
            o.add_hook(hook)
            p.grad = np.ones(4, np.float16)
            o.update()
            refs.append(weakref.ref(p))
            del p, m, o
        gc.collect()
        print([r() is None for r in refs], len(hook._singles.plans()),
              len(hook._plans.plans()))
    ''')
    assert out == ['[True, True, True] 0 0'], out


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('face', ['lars', 'hook'])
def test_a_skipped_update_is_not_observed(face, device):
    """After an overflow under dynamic loss scaling the update is skipped:
    observe() reports nothing for it (not the hook's ratio 0 and infinite
    norm, nor LARS's last real update), so TrustRatioObserver logs no
    made-up ratio."""
    out = lines(_CASE.format(face=face, mt=True, device=device, sub=False)
                + textwrap.dedent('''
        observer = o if FACE == 'lars' else HOOK
        o.loss_scaling(interval=1000)
        fill(1)
        o.update()
        print(sorted(observer.observe()))
        fill(2)
        m.b.grad[0] = np.inf
        o.update()
        print(observer.observe())
        fill(3)
        o.update()
        print(sorted(observer.observe()))
    '''), emulated=device == 'emulated')
    assert out == ["['/a', '/b']", '{}', "['/a', '/b']"], out
