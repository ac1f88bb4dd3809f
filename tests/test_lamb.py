"""LAMB against Algorithm 2 written out in float64 (tests/lamb_reference.py),
update by update: before each update the arrays as stored are read, and
the reference's one step from them is what the update must leave, within
the rounding of the dtype. The GPU path is in tests/test_gpu.py."""

import copy
import io
import itertools
import math
import pickle
import sys

import numpy
import pytest

import chainer
from chainer import optimizer_hooks
from chainer import optimizers
from chainer import serializers

import chainer_lars
from chainer_lars import cpu
from tests import lamb_reference as ref
from tests import lars_reference
from tests import numba_util
from tests.lars_reference import EXCLUDED_FLAGS
from tests.lars_reference import EXCLUDE_FROM_LAYER_ADAPTATION
from tests.lars_reference import EXCLUDE_FROM_WEIGHT_DECAY
from tests.lars_reference import Net


DTYPES = [numpy.float16, numpy.float32, numpy.float64]
#: Relative tolerance of one update, by dtype (of the largest value).
RTOL = {numpy.float16: 4e-3, numpy.float32: 2e-6, numpy.float64: 1e-12}
#: Relative tolerance of a step, beside the rounding of the weight.
STEP_RTOL = {numpy.float16: 1e-2, numpy.float32: 1e-5, numpy.float64: 1e-10}
HYPER = ('alpha', 'beta1', 'beta2', 'eps', 'eta', 'weight_decay_rate')
CASES = [
    dict(),
    dict(alpha=0.05, beta1=0.8, beta2=0.99, eps=1e-3, eta=0.5,
         weight_decay_rate=0.1,
         exclude_from_weight_decay=EXCLUDE_FROM_WEIGHT_DECAY,
         exclude_from_layer_adaptation=EXCLUDE_FROM_LAYER_ADAPTATION),
]


def _model(dtype=numpy.float32, seed=0):
    model = Net(dtype)
    lars_reference.fill(model, seed)
    return model


def _set_grads(model, seed, scale=1.0, loss_scale=None):
    """Random gradients (times ``loss_scale``, as backward leaves them)."""
    rng = numpy.random.RandomState(seed)
    for _, param in sorted(model.namedparams()):
        g = rng.standard_normal(param.shape) * scale
        if loss_scale is not None:
            g *= loss_scale
        param.grad = g.astype(param.dtype)
        param._loss_scale = loss_scale


def _before(model, loss_scale=None):
    """``{path: (w, g unscaled, m, v, t)}`` in float64, as stored."""
    out = {}
    for path, p in model.namedparams():
        rule, f = p.update_rule, lambda a: numpy.array(a, numpy.float64)
        zeros = numpy.zeros(p.shape)
        state = rule.state or {}
        out[path] = (f(p.array), f(p.grad) / (loss_scale or 1.0),
                     f(state.get('m', zeros)), f(state.get('v', zeros)),
                     rule.t)
    return out


def _hyper(opt):
    return {name: getattr(opt, name) for name in HYPER}


def _check(model, before, hyper, flags=None, rtol=2e-6):
    """Each array, its ``m`` and ``v`` are the reference's step from
    ``before``; returns the reference ratios."""
    ratios = {}
    for path, p in model.namedparams():
        w, g, m, v, t = before[path]
        uses_wd, adapt = (flags or {}).get(path, (True, True))
        expected = ref.lamb_step(w, g, m, v, t + 1, uses_weight_decay=uses_wd,
                                 uses_adaptation=adapt, dtype=p.dtype,
                                 **hyper)
        assert p.update_rule.t == t + 1, path
        actual = (p.array, p.update_rule.state['m'],
                  p.update_rule.state['v'])
        for name, a, e in zip('wmv', actual, expected):
            numpy.testing.assert_allclose(
                numpy.asarray(a, numpy.float64), e, rtol=rtol,
                atol=rtol * numpy.abs(e).max(), err_msg=path + ' ' + name)
        _check_step(p.array, w, expected[0], path)
        ratios[path] = expected[3]
    return ratios


def _check_step(actual, w, expected, path):
    """The step ``actual - w`` is the reference's, ``expected - w``, to the
    rounding of the stored weight (half its ulp) and a part of the step:
    at alpha=1e-3 a float16 step is an ulp or two, which the tolerance of
    the weights, a part of the largest, lets go unchecked."""
    dtype = actual.dtype.type
    step = numpy.asarray(actual, numpy.float64) - w
    want = expected - w
    half_ulp = numpy.spacing(numpy.abs(expected).astype(dtype)).astype(
        numpy.float64) / 2  # (halved in float64: float16's smallest stays)
    bound = half_ulp + STEP_RTOL[dtype] * abs(want)
    bad = abs(step - want) > bound
    assert not bad.any(), '{}: {} of {} steps off: {} for {}'.format(
        path, bad.sum(), bad.size, step[bad][:4], want[bad][:4])


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('dtype', DTYPES)
def test_steps_against_reference(dtype, multi_tensor, case):
    model = _model(dtype)
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor, **case).setup(model)
    flags = EXCLUDED_FLAGS if 'exclude_from_weight_decay' in case else None
    for step in range(4):
        _set_grads(model, 100 + step)
        before = _before(model)
        opt.update()
        ratios = _check(model, before, _hyper(opt), flags, RTOL[dtype])
    observed = opt.observe()
    adapted = [p for p in ratios if (flags or {}).get(p, (1, 1))[1]]
    assert sorted(observed) == sorted(adapted)
    for path in adapted:
        assert observed[path][0] == pytest.approx(ratios[path], rel=1e-2)
    # (ratio, ||w||, ||r||): the ratio is ||w|| / ||r|| before the step.
    for ratio, w_norm, r_norm in observed.values():
        assert ratio == pytest.approx(w_norm / r_norm, rel=1e-12)


@pytest.mark.parametrize('dtype', DTYPES)
def test_per_rule_and_fused_agree_bit_for_bit(dtype):
    models = [_model(dtype) for _ in range(2)]
    opts = [chainer_lars.LAMB(multi_tensor=mt, **CASES[1]).setup(model)
            for mt, model in zip((True, False), models)]
    for step in range(3):
        for model, opt in zip(models, opts):
            _set_grads(model, step)
            opt.update()
    assert_same_state(*models)
    assert opts[0].observe() == opts[1].observe()


def assert_same_state(a, b):
    theirs = dict(b.namedparams())
    for path, p in a.namedparams():
        q = theirs[path]
        assert p.array.tobytes() == q.array.tobytes(), path
        for key in ('m', 'v'):
            assert (p.update_rule.state[key].tobytes()
                    == q.update_rule.state[key].tobytes()), (path, key)
        assert p.update_rule.t == q.update_rule.t


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('eps', [1e-6, 1e-45])  # the least float32 takes
def test_zero_weights_and_zero_gradients(multi_tensor, eps):
    # ||w|| = 0: ratio 1, the array moves by alpha * r (it is not frozen);
    # g = 0 with m = v = 0 and no weight decay: r = 0, nothing moves.
    model = _model()
    model.fc.W.array[...] = 0
    opt = chainer_lars.LAMB(alpha=0.1, eps=eps, multi_tensor=multi_tensor)
    opt.setup(model)
    _set_grads(model, 1)
    model.conv1.W.grad[...] = 0
    w_conv = model.conv1.W.array.copy()
    before = _before(model)
    opt.update()
    ratios = _check(model, before, _hyper(opt))
    assert ratios['/fc/W'] == 1.0 and ratios['/conv1/W'] == 1.0
    assert numpy.abs(model.fc.W.array).max() > 0.05
    assert (model.conv1.W.array == w_conv).all()
    observed = opt.observe()
    assert observed['/fc/W'][:2] == (1.0, 0.0)
    assert observed['/conv1/W'][0] == 1.0 and observed['/conv1/W'][2] == 0
    assert all(numpy.isfinite(p.array).all() for p in model.params())


def test_exclusions_act_independently():
    model = _model()
    opt = chainer_lars.LAMB(
        weight_decay_rate=0.5, exclude_from_weight_decay=['/b$'],
        exclude_from_layer_adaptation=['/fc/']).setup(model)
    flags = {path: (p.update_rule.uses_weight_decay,
                    p.update_rule.uses_adaptation)
             for path, p in model.namedparams()}
    assert flags['/fc/W'] == (True, False)  # decayed, not adapted
    assert flags['/conv1/b'] == (False, True)  # adapted, not decayed
    assert flags['/fc/b'] == (False, False)
    _set_grads(model, 3)
    before = _before(model)
    opt.update()
    ratios = _check(model, before, _hyper(opt), flags)
    assert ratios['/fc/W'] == 1.0 and ratios['/conv1/b'] != 1.0
    assert sorted(opt.observe()) == ['/bn1/beta', '/bn1/gamma', '/conv1/W',
                                     '/conv1/b']


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_eta_and_alpha_schedules_and_rule_values(multi_tensor):
    model = _model()
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    for step, (alpha, eta) in enumerate([(1e-3, 0.1), (1e-3, 1.0),
                                         (2e-2, 0.5), (0.0, 1.0)]):
        opt.alpha, opt.eta = alpha, eta
        _set_grads(model, step)
        before = _before(model)
        opt.update()
        _check(model, before, _hyper(opt))
    # A rule's own value, read from its hyperparameter.
    rule = model.fc.W.update_rule
    rule.hyperparam.beta1 = 0.5
    _set_grads(model, 9)
    before = _before(model)
    opt.update()
    others = {p: b for p, b in before.items() if p != '/fc/W'}
    _check_subset(model, others, _hyper(opt))
    _check_subset(model, {'/fc/W': before['/fc/W']},
                  dict(_hyper(opt), beta1=0.5))


def _check_subset(model, before, hyper):
    for path, (w, g, m, v, t) in before.items():
        p = dict(model.namedparams())[path]
        expected = ref.lamb_step(w, g, m, v, t + 1, **hyper)[0]
        numpy.testing.assert_allclose(p.array, expected, rtol=2e-6,
                                      atol=1e-7, err_msg=path)


def test_warmup_shift_drives_eta():
    model = _model()
    opt = chainer_lars.LAMB(alpha=0.01).setup(model)
    shift = chainer_lars.WarmupPolynomialShift(
        'eta', warmup_count=2, max_count=4, init=1.0, end=0.0,
        optimizer=opt)
    shift.initialize(None)
    etas = []
    for step in range(4):
        etas.append(opt.eta)
        _set_grads(model, step)
        before = _before(model)
        opt.update()
        _check(model, before, _hyper(opt))
        shift(None)
    assert etas == [0.5, 1.0, 1.0, 0.25]


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('dtype', DTYPES)
@lars_reference.ROUNDS_AWAY  # in float16
def test_static_loss_scale_is_divided_out(dtype, multi_tensor):
    model = _model(dtype)
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    opt.loss_scaling(scale=2.0 ** 8)
    for step in range(2):
        _set_grads(model, step, scale=0.1, loss_scale=2.0 ** 8)
        before = _before(model, 2.0 ** 8)
        opt.update()
        _check(model, before, _hyper(opt), rtol=RTOL[dtype])


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_dynamic_loss_scale_skips_an_overflow(multi_tensor):
    model = _model(numpy.float16)
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    opt.loss_scaling(interval=1000)
    opt._loss_scale = 2.0 ** 10
    # Gradients near 1: v, stored in float16, holds their squares.
    _set_grads(model, 0, loss_scale=2.0 ** 10)
    opt.update()
    arrays = {p: (a.array.copy(), a.update_rule.state['m'].copy())
              for p, a in model.namedparams()}
    scale = opt._loss_scale
    assert scale == 2.0 ** 11
    _set_grads(model, 1, loss_scale=scale)
    model.fc.W.grad[0, 0] = numpy.inf
    with pytest.warns(UserWarning, match='Non finite'):
        opt.update()
    assert opt._loss_scale == scale / 2
    for path, p in model.namedparams():
        assert (p.array == arrays[path][0]).all(), path
        assert (p.update_rule.state['m'] == arrays[path][1]).all(), path
        assert p.update_rule.t == 1  # the bias corrections skip it too
    _set_grads(model, 2, loss_scale=scale / 2)
    before = _before(model, scale / 2)
    opt.update()
    _check(model, before, _hyper(opt), rtol=RTOL[numpy.float16])


def _save(*objects):
    bufs = []
    for obj in objects:
        buf = io.BytesIO()
        serializers.save_npz(buf, obj)
        buf.seek(0)
        bufs.append(buf)
    return bufs


def test_fp32_master_copy_against_reference():
    model = _model(numpy.float16)
    opt = chainer_lars.LAMB(**dict(CASES[1], alpha=0.01)).setup(model)
    opt.use_fp32_update()
    for step in range(3):
        _set_grads(model, step, scale=1e-2)
        before = _before(model)
        for path, p in model.namedparams():
            master = p.update_rule._fp32_param
            if master is not None:
                before[path] = (numpy.array(master.array, numpy.float64),
                                ) + before[path][1:]
        opt.update()
        for path, p in model.namedparams():
            w, g, m, v, t = before[path]
            uses_wd, adapt = EXCLUDED_FLAGS[path]
            expected = ref.lamb_step(
                w, g, m, v, t + 1, uses_weight_decay=uses_wd,
                uses_adaptation=adapt, **_hyper(opt))
            rule = p.update_rule
            assert rule.state['v'].dtype == numpy.float32
            for name, a, e in zip('wmv', (rule._fp32_param.array,
                                          rule.state['m'], rule.state['v']),
                                  expected):
                numpy.testing.assert_allclose(
                    a, e, rtol=2e-6, atol=2e-6 * numpy.abs(e).max(),
                    err_msg=path + ' ' + name)
            assert (p.array == rule._fp32_param.array.astype(
                numpy.float16)).all()


@pytest.mark.parametrize('scale', [64.0, 3.0, None])
def test_mixed16_batched_agrees_with_the_rule_path(scale):
    # From the second update the masters are batched (a mixed16 group):
    # gradient divided by the loss scale on the fly, master and moments
    # stepped in float32, the float16 weight the master rounded; as
    # Chainer's fp32 update of each rule does it.
    models = [_model(numpy.float16) for _ in range(2)]
    opts = [chainer_lars.LAMB(multi_tensor=mt, **dict(CASES[1], alpha=0.01))
            .setup(model) for mt, model in zip((True, False), models)]
    for opt in opts:
        opt.use_fp32_update()
        if scale is not None:
            opt.loss_scaling(scale=scale)
    for step in range(4):
        for model, opt in zip(models, opts):
            _set_grads(model, step, loss_scale=scale)
            opt.update()
        lars_reference.assert_mixed16_close(*models, states=('m', 'v'))
        observed = [opt.observe() for opt in opts]
        assert sorted(observed[0]) == sorted(observed[1])
        for path, row in observed[0].items():
            numpy.testing.assert_allclose(row, observed[1][path], rtol=1e-6)
    mixed = [g for g in lars_reference.plan_of(opts[0]).groups if g.mixed16]
    assert sorted(p for g in mixed for p in g.paths) == sorted(
        p for p, _ in models[0].namedparams())


@pytest.mark.parametrize('multi_tensor, fp32', [
    (True, False), (False, False), (True, True)])
def test_resume_is_bit_for_bit(multi_tensor, fp32):
    def make():
        model = _model(numpy.float16 if fp32 else numpy.float32)
        opt = chainer_lars.LAMB(multi_tensor=multi_tensor,
                                **dict(CASES[1], alpha=0.01)).setup(model)
        if fp32:
            opt.use_fp32_update()
        opt.loss_scaling(interval=2)
        opt._loss_scale = 2.0 ** 4
        return model, opt

    def train(model, opt, steps):
        for step in steps:
            x, t = lars_reference.batch(step, dtype=model.fc.W.dtype)
            opt.update(lars_reference.loss_fn(model, x, t))

    whole, opt_whole = make()
    train(whole, opt_whole, range(6))
    first, opt_first = make()
    train(first, opt_first, range(3))
    model_buf, opt_buf = _save(first, opt_first)
    resumed, opt_resumed = make()
    serializers.load_npz(model_buf, resumed)
    serializers.load_npz(opt_buf, opt_resumed)
    assert opt_resumed.t == 3
    assert opt_resumed._loss_scale == opt_first._loss_scale
    train(resumed, opt_resumed, range(3, 6))
    assert_same_state(whole, resumed)
    if fp32:
        theirs = dict(resumed.namedparams())
        for path, p in whole.namedparams():
            assert (p.update_rule._fp32_param.array.tobytes() == theirs[
                path].update_rule._fp32_param.array.tobytes()), path
    assert opt_resumed._loss_scale == opt_whole._loss_scale


@pytest.mark.parametrize('key', ['m', 'v'])
def test_a_replaced_moment_buffer_is_the_one_updated(key):
    # The plan knows both state buffers by identity: a buffer replaced
    # between updates (a snapshot loaded into a new array, say) is read
    # and written, the old one left alone, as on the per-rule path.
    models = [_model() for _ in range(2)]
    opts = [chainer_lars.LAMB(multi_tensor=mt).setup(model)
            for mt, model in zip((True, False), models)]
    for step in range(3):
        for model, opt in zip(models, opts):
            if step == 2:
                state = model.fc.W.update_rule.state
                old = state[key]
                state[key] = old.copy()
                kept = old.copy()
            _set_grads(model, step)
            opt.update()
            if step == 2:
                assert (old == kept).all()
                assert not (state[key] == kept).all()
        assert_same_state(*models)


@pytest.mark.parametrize('how', ['deepcopy', 'pickle'])
def test_a_copy_continues_like_the_original(how):
    model = _model()
    opt = chainer_lars.LAMB(**CASES[1]).setup(model)
    _set_grads(model, 0)
    opt.update()
    other = (copy.deepcopy(opt) if how == 'deepcopy'
             else pickle.loads(pickle.dumps(opt)))
    assert other.target is not model
    for step in range(1, 3):
        for o in (opt, other):
            _set_grads(o.target, step)
            o.update()
        assert_same_state(model, other.target)
    assert other.observe() == opt.observe()


@pytest.mark.parametrize('kwargs, error, words', [
    ({'beta1': 1.0}, ValueError, 'beta1 must be less than 1'),
    ({'beta1': -0.1}, ValueError, 'beta1 must be at least 0'),
    ({'beta2': 1.0}, ValueError, 'beta2 must be less than 1'),
    ({'beta2': float('nan')}, ValueError, 'beta2 must be finite'),
    ({'alpha': -1e-3}, ValueError, 'alpha must be at least 0'),
    ({'alpha': float('nan')}, ValueError, 'alpha must be finite'),
    ({'eps': -1e-8}, ValueError, 'eps must be greater than 0'),
    ({'eps': 0.0}, ValueError, 'eps must be greater than 0'),  # 0 / 0
    ({'eps': float('nan')}, ValueError, 'eps must be finite'),
    ({'weight_decay_rate': -0.1}, ValueError, 'weight_decay_rate'),
    ({'weight_decay_rate': float('nan')}, ValueError,
     'weight_decay_rate must be finite'),
    ({'eta': -1.0}, ValueError, 'eta must be at least 0'),
    ({'alpha': '0.1'}, TypeError, "alpha.*'0.1'"),
    ({'multi_tensor': 1}, TypeError, 'multi_tensor'),
    ({'exclude_from_weight_decay': ['[']}, ValueError,
     r'exclude_from_weight_decay.*\['),
])
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        chainer_lars.LAMB(**kwargs)


def test_bad_assignment_is_refused():
    opt = chainer_lars.LAMB()
    with pytest.raises(ValueError, match='beta2'):
        opt.beta2 = 1.0
    assert opt.beta2 == 0.999


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('name, value', [('beta2', 1.0), ('eps', 0.0)])
def test_values_set_under_the_optimizer_fail_before_anything_moves(
        multi_tensor, name, value):
    model = _model()
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    _set_grads(model, 0)
    opt.update()
    kept = {path: [a.array.copy()] + [a.update_rule.state[k].copy()
                                      for k in 'mv']
            for path, a in model.namedparams()}
    setattr(model.fc.W.update_rule.hyperparam, name, value)
    _set_grads(model, 1)
    with pytest.raises(ValueError,
                       match='LAMB hyperparameter {} of /fc/W'.format(name)):
        opt.update()
    assert opt.t == 1
    for path, p in model.namedparams():
        assert p.update_rule.t == 1, path
        now = [p.array] + [p.update_rule.state[k] for k in 'mv']
        for key, a, b in zip('wmv', now, kept[path]):
            assert (a == b).all(), (path, key)


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('value, words', [
    ('0.5', r"beta1 of /fc/W must be a real number, not '0.5' \(str\)"),
    ((0.9, 0.8), r'beta1 of /fc/W must be a real number, not \(0.9, 0.8\)'),
    (numpy.array([0.9, 0.8]), r'beta1 of /fc/W must be a real number'),
])
def test_a_rules_value_of_the_wrong_type_is_named(multi_tensor, value,
                                                  words):
    """Checked as the optimizer's attribute checks it: a str was read as
    a number and trained with, a sequence failed in NumPy unnamed; also
    after a good value of the rule's own was taken."""
    model = _model()
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    rule = model.fc.W.update_rule
    rule.hyperparam.beta1 = 0.5
    _set_grads(model, 0)
    opt.update()
    w = {p: a.array.copy() for p, a in model.namedparams()}
    rule.hyperparam.beta1 = value
    _set_grads(model, 1)
    with pytest.raises(TypeError, match='^LAMB hyperparameter ' + words):
        opt.update()
    for path, p in model.namedparams():
        assert (p.array == w[path]).all(), path
    rule.hyperparam.beta1 = 0.5
    opt.update()  # taken again


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_an_integer_parameter_is_refused_naming_no_other_optimizer(
        multi_tensor):
    model = _model()
    model.fc.b.array = numpy.zeros(model.fc.b.shape, numpy.int32)
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    _set_grads(model, 0)
    for _ in range(2):  # the first update, and the next
        with pytest.raises(TypeError, match='int32') as e:
            opt.update()
        assert 'LARS' not in str(e.value) and '/fc/b' in str(e.value)


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_the_optimizers_own_values_fail_before_the_hooks_and_t(
        multi_tensor):
    model = _model()
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    opt.add_hook(optimizer_hooks.WeightDecay(0.5))
    _set_grads(model, 0)
    opt.update()
    w = {p: a.array.copy() for p, a in model.namedparams()}
    opt.hyperparam.alpha = -1.0
    _set_grads(model, 1)
    g = {p: a.grad.copy() for p, a in model.namedparams()}
    with pytest.raises(ValueError, match='^LAMB hyperparameter alpha must '
                       'be at least 0.0, got -1.0$'):
        opt.update()
    assert opt.t == 1
    for path, p in model.namedparams():
        assert (p.array == w[path]).all() and (p.grad == g[path]).all()
        assert p.update_rule.t == 1, path


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('first', [True, False])
def test_eps_that_rounds_to_zero_is_refused_as_by_adam(
        dtype, multi_tensor, first):
    """Before the hooks change a gradient and before ``t`` counts, at the
    first update and when set later (on the optimizer or its
    hyperparameter); float64 arrays hold it."""
    model = _model(dtype)
    opt = chainer_lars.LAMB(multi_tensor=multi_tensor).setup(model)
    opt.add_hook(optimizer_hooks.WeightDecay(0.5))
    if dtype == numpy.float16:
        opt.use_fp32_update()  # mixed16
    if first:
        opt.eps = 1e-50
    else:
        _set_grads(model, 0)
        opt.update()
        opt.hyperparam.eps = 1e-50
    _set_grads(model, 1)
    before = {p: (a.array.copy(), a.grad.copy(), a.update_rule.t)
              for p, a in model.namedparams()}
    t = opt.t
    with pytest.raises(ValueError, match=r'^eps of LAMB optimizer is too '
                       r'small for float32 \(1e-50\), at /\S+$'):
        opt.update()
    assert opt.t == t
    for path, p in model.namedparams():
        w, g, rule_t = before[path]
        assert (p.array == w).all() and (p.grad == g).all(), path
        assert p.update_rule.t == rule_t, path
    opt.eps = 1e-8  # taken again
    opt.update()
    assert opt.t == t + 1


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_eps_that_rounds_to_zero_in_float32_is_taken_in_float64(
        multi_tensor):
    """And refused, before the hooks and ``t``, once the model is cast to
    float32 with the same hyperparameters."""
    model = _model(numpy.float64)
    opt = chainer_lars.LAMB(eps=1e-50, multi_tensor=multi_tensor)
    opt.setup(model)
    _set_grads(model, 0)
    opt.update()  # float64 holds it
    calls = []
    opt.add_hook(lambda o: calls.append(o.t), name='count')
    for p in model.params():
        p.array, p.grad = p.array.astype('f'), p.grad.astype('f')
        for key in ('m', 'v'):
            p.update_rule.state[key] = p.update_rule.state[key].astype('f')
    with pytest.raises(ValueError, match='too small for float32'):
        opt.update()
    assert opt.t == 1 and not calls
    assert all(p.update_rule.t == 1 for p in model.params())


def test_eps_too_small_for_a_lazily_initialised_link_is_refused_in_time():
    """A link made with ``in_size=None`` (Chainer's MNIST style) has no
    dtype until the loss function runs: the check before it passed, and
    the rule's own update refused eps after the hooks and t had counted,
    so the first real step took the bias corrections of t = 2."""
    model = chainer.Sequential(chainer.links.Linear(None, 2, nobias=True))
    opt = chainer_lars.LAMB(eps=1e-50).setup(model)
    calls = []
    opt.add_hook(lambda o: calls.append(o.t), name='count')
    x = numpy.ones((1, 3), numpy.float32)

    def loss():
        return chainer.functions.sum(model(x))
    with pytest.raises(ValueError, match=r'^eps of LAMB optimizer is too '
                       r'small for float32 \(1e-50\), at /0/W$'):
        opt.update(loss)
    rules = [p.update_rule for p in model.params()]
    assert opt.t == 0 and not calls and [r.t for r in rules] == [0]
    opt.eps = 1e-6
    opt.update(loss)
    assert opt.t == 1 and calls == [0] and [r.t for r in rules] == [1]


def test_the_hook_is_refused():
    model = _model()
    opt = chainer_lars.LAMB().setup(model)
    with pytest.raises(TypeError, match=(
            '^GradientLARS on a chainer_lars.LAMB optimizer would adapt '
            'the rates twice: use LAMB alone')):
        opt.add_hook(chainer_lars.GradientLARS())
    hook = chainer_lars.GradientLARS()
    rule = model.fc.W.update_rule
    with pytest.raises(TypeError, match='LAMB alone'):
        rule.add_hook(hook, timing='pre')
    assert not rule._hookable._pre_update_hooks
    with pytest.raises(TypeError, match='adapt the rates twice'):
        hook(model.fc.W.update_rule, model.fc.W)
    with pytest.raises(TypeError, match='LAMB alone'):
        hook(opt)


def test_names_and_lr_are_adam_s():
    lamb, adam = chainer_lars.LAMB(), optimizers.Adam()
    for name in HYPER:
        assert hasattr(adam, name) and hasattr(lamb, name), name
    assert (lamb.alpha, lamb.beta1, lamb.beta2, lamb.eta,
            lamb.weight_decay_rate) == (adam.alpha, adam.beta1, adam.beta2,
                                        adam.eta, adam.weight_decay_rate)
    with pytest.raises(RuntimeError, match='not been started'):
        lamb.lr
    lamb.t = adam.t = 7
    assert lamb.alpha_t == adam.alpha_t
    assert lamb.lr == lamb.alpha_t == (
        1e-3 * math.sqrt(1 - 0.999 ** 7) / (1 - 0.9 ** 7))
    model = _model()
    lamb.setup(model)
    _set_grads(model, 0)
    lamb.update()
    rule = model.fc.W.update_rule
    assert rule.lr == rule.alpha_t == pytest.approx(
        1e-3 * math.sqrt(1 - 0.999) / (1 - 0.9), rel=1e-15)
    # Read only, as Adam's; on Python 3.11+ the error names the one set.
    for obj, name in itertools.product([lamb, rule], ['alpha_t', 'lr']):
        with pytest.raises(AttributeError, match=(
                None if sys.version_info < (3, 11) else "'{}'".format(name))):
            setattr(obj, name, 0.1)


def test_without_adaptation_it_is_adam_without_eps():
    # Ratio 1 everywhere, eps too small to add, no weight decay: Adam's
    # step exactly (Adam folds the bias corrections into alpha_t; LAMB's
    # eps would sit inside them; LAMB refuses eps=0).
    models = [_model(numpy.float64) for _ in range(2)]
    lamb = chainer_lars.LAMB(alpha=0.01, eps=1e-300,
                             exclude_from_layer_adaptation=['.'])
    adam = optimizers.Adam(alpha=0.01, eps=0.0)
    for model, opt in zip(models, (lamb, adam)):
        opt.setup(model)
        for step in range(3):
            _set_grads(model, step)
            opt.update()
    theirs = dict(models[1].namedparams())
    for path, p in models[0].namedparams():
        numpy.testing.assert_allclose(p.array, theirs[path].array,
                                      rtol=1e-13, err_msg=path)


def test_numpy_passes_equal_the_compiled_loop(monkeypatch):
    numba_util.require_numba()
    models = [_model(numpy.float32) for _ in range(2)]
    opts = [chainer_lars.LAMB(**CASES[1]).setup(m) for m in models]
    for step in range(2):
        for k, (model, opt) in enumerate(zip(models, opts)):
            if k:
                monkeypatch.setattr(cpu, '_jit', lambda: None)
            _set_grads(model, step, loss_scale=4.0)
            opt.update()
            monkeypatch.undo()
    theirs = dict(models[1].namedparams())
    for path, p in models[0].namedparams():
        for a, b in ((p.array, theirs[path].array),
                     (p.update_rule.state['v'],
                      theirs[path].update_rule.state['v'])):
            numpy.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7,
                                          err_msg=path)


def test_repr_and_exports():
    assert 'LAMB' in chainer_lars.__all__
    assert 'LAMBRule' in chainer_lars.__all__
    text = repr(chainer_lars.LAMB(exclude_from_weight_decay=['/b$']))
    assert text.startswith('LAMB(alpha=0.001, beta1=0.9, beta2=0.999, '
                           'eps=1e-06, eta=1.0, weight_decay_rate=0.0, ')
    assert "exclude_from_weight_decay=('/b$',)" in text
    assert isinstance(chainer_lars.LAMB().create_update_rule(),
                      chainer_lars.LAMBRule)
    assert not isinstance(chainer_lars.LAMB(), chainer_lars.LARS)


def test_observe_before_setup_says_what_to_do():
    with pytest.raises(RuntimeError, match=r'^LAMB.observe\(\) reports'):
        chainer_lars.LAMB().observe()


def test_snapshot_holds_t_moments_and_loss_scale():
    # Under Chainer's keys, and the loss-scaling state Chainer leaves out.
    model = _model()
    opt = chainer_lars.LAMB().setup(model)
    opt.loss_scaling(interval=5)
    _set_grads(model, 0)
    opt.update()
    buf = _save(opt)[0]
    keys = set(numpy.load(buf).keys())
    assert {'t', 'conv1/W/t', 'conv1/W/m', 'conv1/W/v', 'loss_scale',
            'loss_scaling_is_dynamic'} <= keys, keys


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_skipped_update_is_not_counted_in_the_bias_corrections(
        multi_tensor):
    # The optimizer's t counts the skipped update, its rules' t do not:
    # the next step is the one of a run that never had the overflow (with
    # weight decay and a large eps, the corrections change its direction).
    def run(skip):
        model = _model(numpy.float32)
        opt = chainer_lars.LAMB(alpha=0.05, eps=1e-2, weight_decay_rate=0.1,
                                multi_tensor=multi_tensor).setup(model)
        opt.loss_scaling(interval=1000)  # dynamic; the grads are unscaled
        for seed in (0, 1, 2) if skip else (0, 2):
            _set_grads(model, seed)
            if seed == 1:
                model.fc.W.grad[0, 0] = numpy.inf
                with pytest.warns(UserWarning, match='Non finite'):
                    opt.update()
            else:
                opt.update()
        assert {p.update_rule.t for p in model.params()} == {2}
        assert opt.t == (3 if skip else 2)
        return {path: p.array.copy() for path, p in model.namedparams()}
    skipped, plain = run(True), run(False)
    for path in plain:
        numpy.testing.assert_array_equal(skipped[path], plain[path], path)


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('t, error, says', [
    (-1, ValueError, 'must be at least 0, got -1'),
    (-0.5, TypeError, r'must be an int, not -0\.5 \(float\)'),
    (1.5, TypeError, r'must be an int, not 1\.5 \(float\)')])
def test_a_rules_step_count_not_a_count_is_refused(multi_tensor, t, error,
                                                   says):
    """``rule.t = -1`` made the next step's bias correction ``1 - beta**0``,
    0: every weight NaN, without an error (Chainer's ``Adam`` refuses a
    step count of 0 in its ``lr``); ``rule.t = 1.5`` gave corrections of a
    step that never is. It is refused before the hooks, ``t`` and any
    weight move, at every update, on either path."""
    m = chainer.Link()
    with m.init_scope():
        m.p = chainer.Parameter(numpy.linspace(1, 2, 6, dtype='f'))
        m.q = chainer.Parameter(numpy.linspace(1, 2, 3, dtype='f'))
    opt = chainer_lars.LAMB(alpha=0.01, multi_tensor=multi_tensor).setup(m)
    opt.add_hook(optimizer_hooks.WeightDecay(0.1))
    for p in m.params():
        p.grad = numpy.ones(p.shape, 'f')
    opt.update()
    m.q.update_rule.t = t  # the second parameter: /p would step first
    for p in m.params():
        p.grad = numpy.ones(p.shape, 'f')
    before = [a.copy() for p in m.params() for a in (p.array, p.grad)]
    for _ in range(2):
        with pytest.raises(error, match='^the step count t of /q ' + says):
            opt.update()
    assert all(numpy.array_equal(a, b) for a, b in zip(before, [
        a for p in m.params() for a in (p.array, p.grad)]))
    assert opt.t == 1 and m.p.update_rule.t == 1 and m.q.update_rule.t == t
    with pytest.raises(error, match='^the step count t of /q ' + says):
        m.q.update()  # alone: the rule refuses it before its step
    numpy.testing.assert_array_equal(m.q.array, before[2])
    m.q.update_rule.enabled = False  # a rule not stepped is not refused
    opt.update()
    assert opt.t == 2 and m.p.update_rule.t == 2
