"""The multi-tensor paths against the per-array ones and the reference.

Each case runs the same training twice, with ``multi_tensor=True`` and
``False``, and requires the two to agree bit for bit after every update:
weights, gradients (which the update rewrites), momentum buffers, every
rule's ``t``, the optimizer's ``t`` and ``epoch``, and what ``observe()``
reports. Where the numbers are simple enough, they are also checked
against the float64 reference of ``tests/lars_reference.py``.
"""

import copy
import io
import pickle
import warnings

import numpy
import pytest

import chainer
import chainer.links as L
from chainer import optimizers
from chainer import serializers
from chainer import testing

import chainer_lars
from tests import lars_reference as ref
from tests import numba_util


@pytest.fixture(autouse=True)
def compiled_loops():
    """The CPU executor's batched path needs Numba: skipped without it,
    failed where it is required (tests/numba_util.py)."""
    numba_util.require_numba()


class Mixed(chainer.Chain):

    """float32 and float16 links side by side."""

    def __init__(self):
        super(Mixed, self).__init__()
        with self.init_scope():
            self.a = L.Linear(6, 5, initialW=ref._init(numpy.float32))
            self.h = L.Linear(6, 5, initialW=ref._init(numpy.float16),
                              initial_bias=ref._init(numpy.float16))

    def forward(self, x):
        half = self.h(chainer.functions.cast(x, numpy.float16))
        return self.a(x) + chainer.functions.cast(half, numpy.float32)


def state_of(model, opt):
    """Everything an update may change, as bytes and ints."""
    state = {'t': opt.t, 'epoch': opt.epoch}
    for path, p in model.namedparams():
        rule = p.update_rule
        entry = [None if p.array is None else p.array.tobytes(),
                 None if p.grad is None else p.grad.tobytes()]
        if rule is not None:
            entry.append(rule.t)
            if rule.state:
                entry.extend(sorted((k, v.tobytes())
                                    for k, v in rule.state.items()))
            master = rule._fp32_param
            if master is not None and master.array is not None:
                entry.append(master.array.tobytes())
        state[path] = entry
    state['loss_scale'] = opt._loss_scale
    return state


def batched_paths(opt):
    """The paths the optimizer's plan batches (multi_tensor=True)."""
    plan = ref.plan_of(opt)
    return sorted(path for group in plan.groups for path in group.paths)


def run_both(make, steps, step_fn, mixed16=False, **lars_kwargs):
    """Runs ``steps`` updates with and without multi_tensor, comparing
    bit for bit, ``observe()`` included: ``mixed16`` too (the float16
    weights, their gradients, masters and momentum) where the docs say
    so (Numba 0.68 or newer, :func:`tests.lars_reference.exact_mixed16`);
    with older Numba, the float16 parameters as
    :func:`tests.lars_reference.assert_mixed16_close` and their
    observations to 1e-6, the rest bit for bit.

    ``make()`` returns a fresh model; ``step_fn(model, opt, step)`` makes
    one update. Returns the two (model, optimizer) pairs.

    """
    runs = []
    for multi_tensor in (True, False):
        model = make()
        opt = chainer_lars.LARS(multi_tensor=multi_tensor, **lars_kwargs)
        opt.setup(model)
        runs.append((model, opt))
    for step in range(steps):
        states = []
        for model, opt in runs:
            step_fn(model, opt, step)
            states.append((state_of(model, opt), opt.observe()))
        where = 'after update {}'.format(step)
        if mixed16:
            ref.assert_mixed16_close(runs[0][0].h, runs[1][0].h, ('v',))
        if mixed16 and not ref.exact_mixed16():
            for state in (states[0][0], states[1][0]):
                del state['/h/W'], state['/h/b']
            for path in states[0][1]:
                numpy.testing.assert_allclose(
                    states[0][1][path], states[1][1][path], rtol=1e-6,
                    err_msg=where)
        else:
            assert states[0][1] == states[1][1], where
        assert states[0][0] == states[1][0], where
    return runs


def net(dtype=numpy.float32):
    def make():
        model = ref.Net(dtype)
        ref.fill(model, 0)
        return model
    return make


def train_step(dtype=numpy.float32):
    def step_fn(model, opt, step):
        x, t = ref.batch(step, dtype=dtype)
        opt.update(ref.loss_fn(model, x, t))
    return step_fn


KWARGS = dict(lr=0.5, momentum=0.9, weight_decay=1e-3,
              trust_coefficient=0.02, eps=1e-6)


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('kwargs', [
    KWARGS,
    dict(KWARGS, nesterov=True),
    dict(KWARGS, weight_decay=0.0, eps=0.0),
    dict(KWARGS, exclude_from_weight_decay=['/b$', 'bn1'],
         exclude_from_layer_adaptation=['/conv1/b', 'gamma']),
])
def test_training_equals_per_rule_path(dtype, kwargs):
    (model, opt), _ = run_both(net(dtype), 5, train_step(dtype), **kwargs)
    assert batched_paths(opt) == sorted(p for p, _ in model.namedparams())


def set_grads(model, step):
    """Gradients that depend only on the step, as the reference draws them.
    """
    rng = numpy.random.RandomState(100 + step)
    for path, p in sorted(model.namedparams()):
        p.grad = rng.standard_normal(p.shape).astype(p.dtype)


def set_grads_step(model, opt, step):
    set_grads(model, step)
    opt.update()


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('nesterov', [False, True])
def test_against_reference(dtype, nesterov):
    kwargs = dict(KWARGS, nesterov=nesterov,
                  exclude_from_weight_decay=['/b$'],
                  exclude_from_layer_adaptation=['bn1'])
    (model, opt), _ = run_both(net(dtype), 4, set_grads_step, **kwargs)
    flags = {path: (not path.endswith('/b'), 'bn1' not in path)
             for path, _ in model.namedparams()}
    reference = ref.Net(dtype)
    ref.fill(reference, 0)
    w = ref.snapshot(reference)
    v = {path: 0.0 for path in w}
    for step in range(4):
        rng = numpy.random.RandomState(100 + step)
        for path, p in sorted(reference.namedparams()):
            g = rng.standard_normal(p.shape).astype(dtype)
            w[path], v[path] = ref.lars_step(
                w[path], g, v[path], lr=0.5, momentum=0.9,
                weight_decay=1e-3, trust_coefficient=0.02, eps=1e-6,
                nesterov=nesterov, uses_weight_decay=flags[path][0],
                uses_adaptation=flags[path][1])
    tol = 1e-5 if dtype == numpy.float32 else 1e-12
    for path, p in model.namedparams():
        testing.assert_allclose(p.array, w[path], rtol=tol, atol=tol)


def test_hyperparameters_set_on_one_rule():
    def step_fn(model, opt, step):
        if step == 1:
            model.fc.W.update_rule.hyperparam.lr = 2.0
            model.bn1.beta.update_rule.hyperparam.momentum = 0.5
            model.conv1.W.update_rule.hyperparam.nesterov = True
        if step == 3:
            opt.lr = 0.1  # a schedule: the rules without their own follow
            model.conv1.W.update_rule.hyperparam.weight_decay = 0.0
        train_step()(model, opt, step)

    (model, opt), _ = run_both(net(), 5, step_fn, **KWARGS)
    assert model.fc.W.update_rule.hyperparam.lr == 2.0
    assert model.fc.b.update_rule.hyperparam.lr == 0.1


def test_reference_with_a_rule_of_its_own():
    def step_fn(model, opt, step):
        model.fc.W.update_rule.hyperparam.lr = 2.0
        model.fc.W.update_rule.hyperparam.trust_coefficient = 0.1
        set_grads_step(model, opt, step)

    (model, _), _ = run_both(net(), 3, step_fn, **KWARGS)
    start = ref.Net()
    ref.fill(start, 0)
    w, v = ref.snapshot(start)['/fc/W'], 0.0
    shape = model.fc.W.shape
    for step in range(3):
        rng = numpy.random.RandomState(100 + step)
        grads = {path: rng.standard_normal(p.shape).astype(numpy.float32)
                 for path, p in sorted(start.namedparams())}
        assert grads['/fc/W'].shape == shape
        w, v = ref.lars_step(w, grads['/fc/W'], v, lr=2.0, momentum=0.9,
                             weight_decay=1e-3, trust_coefficient=0.1,
                             eps=1e-6)
    testing.assert_allclose(model.fc.W.array, w, rtol=1e-5, atol=1e-6)


def test_disabled_rule_is_left_alone():
    def step_fn(model, opt, step):
        model.fc.b.update_rule.enabled = step < 2 or step >= 4
        train_step()(model, opt, step)

    (model, opt), _ = run_both(net(), 6, step_fn, **KWARGS)
    assert model.fc.b.update_rule.t == 4
    assert model.fc.W.update_rule.t == 6


def test_update_rule_hooks_take_the_rule_path():
    calls = []

    def halve(rule, param):
        calls.append(param.name)
        param.grad *= 0.5

    def step_fn(model, opt, step):
        if step == 1:
            model.fc.W.update_rule.add_hook(halve, name='halve')
        train_step()(model, opt, step)

    (model, opt), _ = run_both(net(), 4, step_fn, **KWARGS)
    assert calls == ['W'] * 6  # three updates, in both runs
    assert '/fc/W' not in batched_paths(opt)
    assert '/fc/b' in batched_paths(opt)


@pytest.mark.parametrize('scale', [2.0 ** 10, 3.7])
def test_static_loss_scaling(scale):
    def step_fn(model, opt, step):
        if step == 0:
            opt.loss_scaling(scale=scale)
        train_step()(model, opt, step)

    # 3.7 is not a power of two: the division rounds, and must round as
    # UpdateRule.update's `grad /= loss_scale` does.
    run_both(net(), 4, step_fn, **KWARGS)


def test_dynamic_loss_scaling_with_a_skipped_update():
    def step_fn(model, opt, step):
        if step == 0:
            opt.loss_scaling(interval=2)
        x, t = ref.batch(step)
        if step != 2:
            opt.update(ref.loss_fn(model, x, t))
            return
        model.cleargrads()
        ref.loss_fn(model, x, t)().backward(loss_scale=opt._loss_scale)
        model.fc.W.grad[0, 0] = numpy.inf
        with pytest.warns(UserWarning, match='Non finite'):
            opt.update()

    (model, opt), _ = run_both(net(), 6, step_fn, **KWARGS)
    assert opt.t == 6
    assert model.fc.W.update_rule.t == 5  # the overflow skipped one
    assert opt._loss_scale > 1.0


def test_check_nan_in_grads_called_alone_is_chainers():
    """The public method, as Chainer's: the same warnings, in the same
    order, and the same flags, on a model with two non-finite gradients."""
    results = []
    for multi_tensor in (True, False):
        model = net()()
        opt = chainer_lars.LARS(multi_tensor=multi_tensor, **KWARGS)
        opt.setup(model)
        opt.loss_scaling(interval=2)
        set_grads(model, 0)
        model.fc.W.grad[0, 0] = numpy.nan
        model.conv1.W.grad.flat[3] = -numpy.inf
        with pytest.warns(UserWarning) as caught:
            opt.check_nan_in_grads()
        results.append(([str(w.message) for w in caught],
                        opt._loss_scaling_isnan,
                        opt._loss_scaling_isnan_ever))
        set_grads(model, 1)
        opt.check_nan_in_grads()
        assert not opt._loss_scaling_isnan
    assert results[0] == results[1]
    assert len(results[0][0]) == 2 and results[0][1:] == (True, True)


def make_mixed():
    model = Mixed()
    ref.fill(model, 0)
    return model


def fp32_update_at_first_step(opt, step, scale):
    """Turns on float32 master copies and a static loss scale at step 0."""
    if step == 0:
        opt.use_fp32_update()
        opt.loss_scaling(scale=scale)


@pytest.mark.parametrize('scale', [64.0, 3.0, None])
@pytest.mark.parametrize('nesterov', [False, True])
def test_float16_master_copies_are_batched_as_their_rules_step(scale,
                                                               nesterov):
    """Mixed16: the first update makes the masters on the rule's path; from
    the second the batched step updates master, momentum and float16
    weight bit for bit as Chainer's fp32 update of the rule does."""
    def step_fn(model, opt, step):
        if step == 0:
            opt.use_fp32_update()
            if scale is not None:
                opt.loss_scaling(scale=scale)
        train_step()(model, opt, step)

    (model, opt), _ = run_both(make_mixed, 4, step_fn, mixed16=True,
                               nesterov=nesterov, **KWARGS)
    mixed = [group for group in ref.plan_of(opt).groups
             if group.mixed16]
    assert [group.paths for group in mixed] == [['/h/W', '/h/b']]
    assert batched_paths(opt) == ['/a/W', '/a/b', '/h/W', '/h/b']
    for path, half in zip(mixed[0].paths, mixed[0].extras):
        param = dict(model.namedparams())[path]
        assert half is param.array and half.dtype == numpy.float16
        master = param.update_rule._fp32_param.array
        assert master.dtype == numpy.float32
        assert half.tobytes() == master.astype(numpy.float16).tobytes()


def test_float16_master_copies_through_an_overflow_with_dynamic_scaling():
    """Dynamic loss scaling from 2 ** 10: an infinite float16 gradient at
    the third update skips it and halves the scale; the batched mixed16
    update and Chainer's fp32 update of each rule stay equal, the loss
    scale and the skip included."""
    def step_fn(model, opt, step):
        if step == 0:
            opt.use_fp32_update()
            opt.loss_scaling(interval=1000)
            opt._loss_scale = 2.0 ** 10  # dynamic scaling starts at 1
        x, t = ref.batch(step)
        model.cleargrads()
        ref.loss_fn(model, x, t)().backward(loss_scale=opt._loss_scale)
        if step == 2:
            model.h.W.grad[0, 0] = numpy.inf
        with pytest.warns(UserWarning) if step == 2 else _no_warning():
            opt.update()

    runs = run_both(make_mixed, 5, step_fn, mixed16=True, **KWARGS)
    assert runs[0][1]._loss_scale == runs[1][1]._loss_scale
    assert [opt.t for _, opt in runs] == [5, 5]
    mixed = [g for g in ref.plan_of(runs[0][1]).groups if g.mixed16]
    assert [g.paths for g in mixed] == [['/h/W', '/h/b']]


@pytest.mark.parametrize('face', ['LARS', 'LAMB', 'hook'])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('how', ['byte order in place', 'big-endian',
                                 'float64'])
def test_a_master_copy_not_float32_is_refused_before_anything_moves(
        face, multi_tensor, how):
    """Chainer's fp32 update sets a float32 gradient on the master, which
    refuses a master of another dtype (byte order included): ``LARS``
    stepped the arrays before it, then raised in its rule. Now refused,
    naming it, before any weight, master, state or rule's ``t`` changes
    (the optimizer's ``t`` counts the update, as where Chainer's rules
    raise). ``multi_tensor=False`` is Chainer's loop over the rules: /a
    steps, then /b's rule raises, as in Chainer's ``MomentumSGD``."""
    model = chainer.Chain()
    with model.init_scope():
        model.a = chainer.Parameter(numpy.linspace(1, 2, 4).astype('e'))
        model.b = chainer.Parameter(numpy.linspace(1, 2, 4).astype('e'))
    if face == 'hook':
        opt = optimizers.MomentumSGD(lr=0.1).setup(model)
        opt.add_hook(chainer_lars.GradientLARS(multi_tensor=multi_tensor))
    else:
        opt = getattr(chainer_lars, face)(multi_tensor=multi_tensor)
        opt.setup(model)
    opt.use_fp32_update()

    def update():
        for p in model.params():
            p.grad = numpy.ones(4, 'e')
        opt.update()
    update()
    update()  # the mixed16 rows' own
    rule = model.b.update_rule
    master = rule._fp32_param.array
    if how == 'byte order in place':
        master.byteswap(inplace=True)
        with warnings.catch_warnings():  # (NumPy 2.5 deprecates it)
            warnings.simplefilter('ignore', DeprecationWarning)
            master.dtype = master.dtype.newbyteorder()
    else:
        rule._fp32_param.array = master.astype(
            '>f4' if how == 'big-endian' else numpy.float64)

    def everything():
        return [(a.dtype.str, a.tobytes()) for p in model.params() for a in (
            [p.array, p.update_rule._fp32_param.array]
            + list(p.update_rule.state.values()))] + [
                model.a.update_rule.t, rule.t, opt.t]
    before = everything()
    if face != 'hook' and not multi_tensor:
        with pytest.raises(TypeError, match='^Dtype of data and grad'):
            update()
        assert everything()[:2] != before[:2]  # /a stepped
        return
    with pytest.raises(TypeError, match=(
            r'^/b: the master copy is (>f4|float64), not float32$')):
        update()
    assert everything()[:-1] == before[:-1]
    assert opt.t == before[-1] + (face != 'hook')


def test_a_read_only_float16_weight_is_replaced_as_chainers_rule_does():
    """Chainer's fp32 update assigns the float16 weight anew from the
    master: a read-only float16 array put in its place is no error, and
    the batched path hands that parameter to its rule."""
    def step_fn(model, opt, step):
        if step == 0:
            opt.use_fp32_update()
        if step == 2:
            frozen = model.h.W.array.copy()
            frozen.flags.writeable = False
            model.h.W.array = frozen
        train_step()(model, opt, step)
        if step == 2:
            assert model.h.W.array is not frozen
            assert model.h.W.array.flags.writeable

    (model, opt), _ = run_both(make_mixed, 4, step_fn, mixed16=True,
                               **KWARGS)
    # Writeable again from the rule's assignment, it is batched again.
    mixed = [g for g in ref.plan_of(opt).groups if g.mixed16]
    assert [g.paths for g in mixed] == [['/h/W', '/h/b']]


class _no_warning(object):

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_parameters_added_after_setup():
    def make():
        model = ref.Net()
        ref.fill(model, 0)
        with model.init_scope():
            # Initialised by the first forward pass, after setup().
            model.lazy = L.Linear(None, 3, initialW=0.25)
        return model

    def step_fn(model, opt, step):
        if step == 1:
            with model.init_scope():
                model.extra = L.Linear(3, 3, initialW=0.5, initial_bias=0.1)
        if step == 3:
            # Only a rule makes Chainer update a parameter added late.
            for p in model.extra.params():
                p.update_rule = opt.create_update_rule()
        x, t = ref.batch(step)

        def loss():
            h = model(x)
            h = h + model.lazy(x)
            if hasattr(model, 'extra'):
                h = h + model.extra(h)
            return chainer.functions.softmax_cross_entropy(h, t)
        opt.update(loss)

    (model, opt), _ = run_both(make, 5, step_fn, **KWARGS)
    assert model.extra.W.update_rule.t == 2
    assert model.lazy.W.update_rule.t == 5
    assert '/extra/W' in batched_paths(opt)
    assert '/lazy/W' in batched_paths(opt)


def test_replaced_arrays_and_odd_gradients():
    def step_fn(model, opt, step):
        set_grads(model, step)
        if step == 1:
            model.fc.W.array = model.fc.W.array.copy()
        if step == 2:
            # Not contiguous: this gradient takes the rule path this time.
            model.conv1.W.grad = numpy.asfortranarray(model.conv1.W.grad)
        opt.update()

    run_both(net(), 4, step_fn, **KWARGS)


@pytest.mark.parametrize('scale', [8.0, 3.7])
def test_strided_gradients_are_left_unscaled_under_a_static_loss_scale(
        scale):
    """A strided gradient is stepped through a contiguous copy, which the
    step divides the loss scale out of: the copy is written back, so that
    the gradient is left unscaled, as Chainer's rule (``grad /=
    loss_scale``) and the per-rule path leave it."""
    def step_fn(model, opt, step):
        if step == 0:
            opt.loss_scaling(scale=scale)
        rng = numpy.random.RandomState(100 + step)
        for path, p in sorted(model.namedparams()):
            g = rng.standard_normal(p.shape).astype(p.dtype) * p.dtype.type(
                scale)
            if path in ('/conv1/W', '/fc/b'):  # every other element
                g = numpy.repeat(g[..., None], 2, axis=-1)[..., 0]
                assert not g.flags.c_contiguous
            p.grad = g
            p._loss_scale = scale  # as backward(loss_scale=...) sets it
        unscaled = {path: p.grad / p.dtype.type(scale)
                    for path, p in model.namedparams()}
        opt.update()
        for path, p in model.namedparams():
            assert p.grad.tobytes() == unscaled[path].tobytes(), path

    (model, opt), _ = run_both(net(), 3, step_fn, **KWARGS)
    assert not model.conv1.W.grad.flags.c_contiguous
    assert '/conv1/W' in batched_paths(opt)


def test_cleared_gradients_and_optimizer_hooks_as_chainer_does():
    """Chainer's update gives a cleared gradient zeros before the hooks,
    lists the parameters again after them, and keeps what they did: a
    gradient replaced, a gradient cleared, a parameter added, a rule
    disabled; the batched update (one listing when there are no hooks)
    must do the same."""
    seen = []

    def hook(opt):
        model = opt.target
        seen.append(float(abs(model.fc.b.grad).sum()))
        model.conv1.W.grad = model.conv1.W.grad * 0.5  # a new array
        step = opt.t
        model.fc.b.update_rule.enabled = step != 2
        if step == 3:
            model.conv1.b.cleargrad()  # the update skips it
        if step == 4:
            with model.init_scope():
                model.late = L.Linear(2, 2, initialW=0.5, initial_bias=0.1)
            # Not updated from now on: Chainer lists after the hooks.
            removed.append(model.spare)
            del model.spare

    def make():
        model = net()()
        with model.init_scope():
            model.spare = L.Linear(3, 2, initialW=0.25, initial_bias=0.5)
        return model

    removed = []

    def step_fn(model, opt, step):
        set_grads(model, step)
        if step == 1:
            model.fc.b.cleargrad()  # zeros before the hook sees it
        if step == 2:
            opt.add_hook(hook, name='replace')
        if step == 5:
            opt.remove_hook('replace')
            model.fc.W.cleargrad()
        opt.update()

    (model, opt), _ = run_both(make, 7, step_fn, **KWARGS)
    assert seen[0::2] == seen[1::2]  # both runs' hooks saw the same
    assert model.late.W.grad is not None  # reallocated after the update
    assert model.fc.b.update_rule.t == 6
    assert [link.W.update_rule.t for link in removed] == [4, 4]
    assert removed[0].W.array.tobytes() == removed[1].W.array.tobytes()


def test_flags_changed_on_a_rule_rebuild_the_plan():
    def step_fn(model, opt, step):
        rule = model.fc.W.update_rule
        rule.uses_weight_decay = step not in (1, 2)
        rule.uses_adaptation = step != 3
        set_grads_step(model, opt, step)

    (model, opt), _ = run_both(net(), 5, step_fn, **KWARGS)
    assert '/fc/W' in batched_paths(opt)


def test_non_native_byte_order_equals_native():
    def make(byteorder):
        def build():
            model = ref.Net()
            ref.fill(model, 0)
            for p in model.params():
                p.array = p.array.astype(p.dtype.newbyteorder(byteorder))
            return model
        return build

    results = []
    for byteorder in ('=', 'S'):
        (model, _), _ = run_both(make(byteorder), 3, set_grads_step,
                                 **KWARGS)
        results.append({path: p.array.astype(numpy.float32).tobytes()
                        for path, p in model.namedparams()})
    assert results[0] == results[1]


def test_snapshots_are_the_per_rule_paths_and_load_into_it():
    (model, opt), (model2, opt2) = run_both(net(), 3, train_step(),
                                            **KWARGS)
    files = []
    for o in (opt, opt2):
        buf = io.BytesIO()
        serializers.save_npz(buf, o)
        files.append(dict(numpy.load(io.BytesIO(buf.getvalue()))))
    assert sorted(files[0]) == sorted(files[1])
    for key in files[0]:
        assert files[0][key].tobytes() == files[1][key].tobytes(), key

    # A batched run resumed by the per-rule path, and the other way round,
    # continue exactly like the uninterrupted runs.
    for source, target_multi in ((opt, False), (opt2, True)):
        buf = io.BytesIO()
        serializers.save_npz(buf, source)
        model_buf = io.BytesIO()
        serializers.save_npz(model_buf, source.target)
        resumed = ref.Net()
        opt3 = chainer_lars.LARS(multi_tensor=target_multi, **KWARGS)
        opt3.setup(resumed)
        buf.seek(0)
        model_buf.seek(0)
        serializers.load_npz(model_buf, resumed)
        serializers.load_npz(buf, opt3)
        for step in range(3, 5):
            train_step()(resumed, opt3, step)
            train_step()(source.target, source, step)
        state = state_of(resumed, opt3)
        expected = state_of(source.target, source)
        assert state == expected


@pytest.mark.parametrize('how', ['deepcopy', 'pickle'])
def test_copies_continue_alone(how):
    model = ref.Net()
    ref.fill(model, 0)
    opt = chainer_lars.LARS(**KWARGS).setup(model)
    train_step()(model, opt, 0)
    train_step()(model, opt, 1)
    if how == 'deepcopy':
        other = copy.deepcopy(opt)
    else:
        other = pickle.loads(pickle.dumps(opt))
    before = state_of(model, opt)
    train_step()(other.target, other, 2)
    assert state_of(model, opt) == before  # the original is untouched
    train_step()(model, opt, 2)
    assert state_of(other.target, other) == state_of(model, opt)


# -- the hook ----------------------------------------------------------------

def run_hook_both(make, steps, step_fn, optimizer=None, **hook_kwargs):
    runs = []
    for multi_tensor in (True, False):
        model = make()
        opt = (optimizer or (lambda: optimizers.MomentumSGD(lr=0.05)))()
        opt.setup(model)
        hook = chainer_lars.GradientLARS(multi_tensor=multi_tensor,
                                         **hook_kwargs)
        opt.add_hook(hook)
        runs.append((model, opt, hook))
    for step in range(steps):
        states = []
        for model, opt, hook in runs:
            step_fn(model, opt, step)
            states.append((state_of(model, opt), hook.observe()))
        where = 'after update {}'.format(step)
        assert states[0][0] == states[1][0], where
        assert states[0][1] == states[1][1], where
    return runs


HOOK_CASES = [
    dict(),
    dict(weight_decay=1e-3, trust_coefficient=0.5, eps=0.0,
         exclude_from_weight_decay=['/b$', 'bn1'],
         exclude_from_layer_adaptation=['/conv1/b', 'gamma']),
    dict(clip=True, trust_coefficient=0.02, weight_decay=1e-4),
    dict(threshold=0.0, weight_decay=0.1),
]


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('kwargs', HOOK_CASES)
@pytest.mark.parametrize('scale', [None, 3.7])
def test_hook_equals_per_array_path(dtype, kwargs, scale):
    def step_fn(model, opt, step):
        if step == 0 and scale:
            opt.loss_scaling(scale=scale)
        train_step(dtype)(model, opt, step)

    (model, _, hook), _ = run_hook_both(net(dtype), 4, step_fn, **kwargs)
    group, = ref.plan_of(hook).groups  # every array in one group
    assert sorted(group.paths) == sorted(p for p, _ in model.namedparams())


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('kwargs', HOOK_CASES)
def test_hook_against_reference(dtype, kwargs):
    model = ref.Net(dtype)
    ref.fill(model, 0)
    opt = optimizers.MomentumSGD(lr=0.05).setup(model)
    hook = chainer_lars.GradientLARS(**kwargs)
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    for p in model.params():
        p.grad *= p.dtype.type(8)
        p._loss_scale = 8.0
    hook(opt)
    flags = {path: hook._rules.lookup(path) for path in w}
    reference_kwargs = {k: v for k, v in kwargs.items()
                        if not k.startswith('exclude') and k != 'clip'}
    tol = 1e-6 if dtype == numpy.float32 else 1e-12
    for path, p in model.namedparams():
        expected = 8 * ref.hook_gradient(
            w[path], g[path], clip_lr=0.05 if kwargs.get('clip') else None,
            uses_weight_decay=flags[path][0], uses_adaptation=flags[path][1],
            **reference_kwargs)
        testing.assert_allclose(p.grad, expected, rtol=tol, atol=tol * 8)
        ratio, w_norm, g_norm = hook.observe()[path]
        assert w_norm == pytest.approx(ref.norm64(w[path]), rel=1e-6)
        assert g_norm == pytest.approx(ref.norm64(g[path]), rel=1e-6)


def test_hook_on_mixed_dtypes_and_a_link_added_after_setup():
    def step_fn(model, opt, step):
        fp32_update_at_first_step(opt, step, 32.0)
        if step == 1:
            with model.init_scope():
                model.extra = L.Linear(5, 5, initialW=0.5, initial_bias=0.1)
        x, t = ref.batch(step)

        def loss():
            h = model(x)
            if hasattr(model, 'extra'):
                h = h + model.extra(h)
            return chainer.functions.softmax_cross_entropy(h, t)
        opt.update(loss)
        if hasattr(model, 'extra'):
            # No update rule: Chainer does not update it, nor do we rescale
            # its gradient.
            assert model.extra.W.update_rule is None

    (model, opt, hook), _ = run_hook_both(
        make_mixed, 4, step_fn, weight_decay=1e-3, clip=True,
        trust_coefficient=0.02)
    assert sorted(hook.observe()) == ['/a/W', '/a/b', '/h/W', '/h/b']


def test_hook_observe_keeps_the_ratio_that_was_applied():
    model = ref.Net()
    ref.fill(model, 0)
    opt = optimizers.MomentumSGD(lr=0.05).setup(model)
    hook = chainer_lars.GradientLARS(clip=True, trust_coefficient=0.02)
    opt.add_hook(hook)
    opt.update()
    before = hook.observe()
    opt.lr = 1e-4  # a schedule that runs before the observer
    assert hook.observe() == before
