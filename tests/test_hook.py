import copy
import gc
import inspect
import math
import os
import pickle
import re
import weakref

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy
import pytest

import chainer
from chainer import functions as F
from chainer import optimizer_hooks
from chainer import optimizers
from chainer import testing

import chainer_lars
from tests import lars_reference as ref
from tests import numba_util
from tests.lars_reference import PATHS


def setup(hook, dtype=numpy.float32, optimizer=None, seed=0, **fill_kw):
    model = ref.Net(dtype)
    ref.fill(model, seed, **fill_kw)
    opt = optimizer or optimizers.MomentumSGD(lr=0.1)
    opt.setup(model)
    if hook is not None:
        opt.add_hook(hook)
    return model, opt


def test_paths_are_those_of_namedparams():
    model, _ = setup(None)
    assert sorted(path for path, _ in model.namedparams()) == sorted(PATHS)


@pytest.mark.parametrize('kwargs', [
    {},
    {'weight_decay': 5e-4},
    {'threshold': 0.0, 'weight_decay': 1e-2, 'eps': 0.0},
    {'threshold': 1e3},  # every array below the threshold: r = 1
])
def test_same_as_chainer_hook_step_by_step(kwargs):
    ours, opt_ours = setup(chainer_lars.GradientLARS(**kwargs))
    theirs, opt_theirs = setup(optimizer_hooks.GradientLARS(**kwargs))
    for step in range(4):
        x, t = ref.batch(step)
        opt_ours.update(ref.loss_fn(ours, x, t))
        opt_theirs.update(ref.loss_fn(theirs, x, t))
        a, b = ref.snapshot(ours), ref.snapshot(theirs)
        # Both compute in float32 with a different order of operations.
        for path in PATHS:
            testing.assert_allclose(a[path], b[path], rtol=1e-5, atol=1e-6)


def test_defaults_match_chainer():
    ours = chainer_lars.GradientLARS()
    theirs = optimizer_hooks.GradientLARS()
    assert (ours.threshold, ours.weight_decay, ours.eps) == (
        theirs.threshold, theirs.weight_decay, theirs.eps)
    assert ours.trust_coefficient == 1.0  # the ratio of Chainer's hook
    assert ours.name == theirs.name == 'GradientLARS'
    assert ours.timing == 'pre'


def test_chainer_s_own_test_case_passes():
    # The case of Chainer 7.8.1's test of its hook, on this one: one array
    # above the threshold, one below it, SGD(lr=1), threshold 1e-2 and
    # weight decay 0.2 given as Chainer's test gives them.
    w = [numpy.arange(6, dtype=numpy.float32).reshape(2, 3),
         numpy.arange(6, dtype=numpy.float32).reshape(2, 3) * 1e-4]
    g = numpy.arange(3, -3, -1, dtype=numpy.float32).reshape(2, 3)
    target = chainer.ChainList(*[chainer.Link() for _ in w])
    for link, array in zip(target, w):
        with link.init_scope():
            link.param = chainer.Parameter(array.copy())
        link.param.grad = g.copy()
    opt = optimizers.SGD(lr=1)
    opt.setup(target)
    opt.add_hook(chainer_lars.GradientLARS(threshold=1e-2,
                                           weight_decay=0.2))
    opt.update()
    w_norm, g_norm = numpy.linalg.norm(w[0]), numpy.linalg.norm(g)
    rate = w_norm / (1e-9 + g_norm + 0.2 * w_norm)
    testing.assert_allclose(target[0].param.array,
                            w[0] - rate * (g + 0.2 * w[0]), rtol=1e-6)
    testing.assert_allclose(target[1].param.array,
                            w[1] - (g + 0.2 * w[1]), rtol=1e-6)


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('kwargs', [
    {},
    {'weight_decay': 1e-3, 'trust_coefficient': 1e-3},
    {'weight_decay': 1e-1, 'eps': 0.0, 'threshold': 0.0},
    {'trust_coefficient': 2.5, 'threshold': 3.0},
])
def test_gradient_against_reference(dtype, kwargs):
    hook = chainer_lars.GradientLARS(**kwargs)
    model, opt = setup(hook, dtype)
    before_w, before_g = ref.snapshot(model), ref.snapshot(model, 'grad')
    hook(opt)
    after = ref.snapshot(model, 'grad')
    tol = 1e-6 if dtype == numpy.float32 else 1e-12
    for path in PATHS:
        expected = ref.hook_gradient(before_w[path], before_g[path], **kwargs)
        testing.assert_allclose(after[path], expected, rtol=tol, atol=tol)


def test_threshold_is_strict():
    w = numpy.array([3.0, 4.0], numpy.float32)  # ||w|| = 5
    for threshold, expect_adapted in [(5.0, False), (4.999, True)]:
        link = chainer.Link()
        with link.init_scope():
            link.p = chainer.Parameter(w.copy())
        link.p.grad = numpy.array([1.0, 0.0], numpy.float32)
        opt = optimizers.SGD(lr=1.0)
        opt.setup(link)
        chainer_lars.GradientLARS(threshold=threshold)(opt)
        expected = (5.0 / (1.0 + 1e-9)) if expect_adapted else 1.0
        testing.assert_allclose(link.p.grad, [expected, 0.0], rtol=1e-6)


def test_exclusion_lists_act_independently():
    kwargs = dict(threshold=0.0, weight_decay=0.1, eps=0.0,
                  trust_coefficient=0.5)
    hook = chainer_lars.GradientLARS(
        exclude_from_weight_decay=ref.EXCLUDE_FROM_WEIGHT_DECAY,
        exclude_from_layer_adaptation=ref.EXCLUDE_FROM_LAYER_ADAPTATION,
        **kwargs)
    model, opt = setup(hook)
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    hook(opt)
    after = ref.snapshot(model, 'grad')
    for path, (uses_wd, adapt) in ref.EXCLUDED_FLAGS.items():
        expected = ref.hook_gradient(
            w[path], g[path], uses_weight_decay=uses_wd,
            uses_adaptation=adapt, **kwargs)
        testing.assert_allclose(after[path], expected, rtol=1e-6, atol=1e-7)
    # An array excluded from adaptation keeps its weight decay exactly.
    conv1_w = ref.hook_gradient(w['/conv1/W'], g['/conv1/W'],
                                uses_adaptation=False, **kwargs)
    hook2 = chainer_lars.GradientLARS(
        exclude_from_layer_adaptation=['/conv1/W'], **kwargs)
    model2, opt2 = setup(hook2)
    hook2(opt2)
    testing.assert_allclose(model2.conv1.W.grad, conv1_w, rtol=1e-6)
    testing.assert_allclose(
        conv1_w, g['/conv1/W'] + 0.1 * w['/conv1/W'], rtol=1e-12)


def test_trust_coefficient_scales_the_ratio():
    grads = []
    for eta in [1.0, 0.25]:
        hook = chainer_lars.GradientLARS(trust_coefficient=eta)
        model, opt = setup(hook)
        hook(opt)
        grads.append(ref.snapshot(model, 'grad'))
    for path in ['/conv1/W', '/fc/W']:
        testing.assert_allclose(grads[1][path], 0.25 * grads[0][path],
                                rtol=1e-6)


@pytest.mark.parametrize('lr', [0.1, 1e-4, 0.0])
def test_clip_divides_by_lr_and_caps_at_one(lr):
    kwargs = dict(trust_coefficient=0.02, weight_decay=1e-3)
    hook = chainer_lars.GradientLARS(clip=True, **kwargs)
    model, opt = setup(hook, optimizer=optimizers.MomentumSGD(lr=lr))
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    hook(opt)
    for path in PATHS:
        expected = ref.hook_gradient(w[path], g[path], clip_lr=lr, **kwargs)
        testing.assert_allclose(dict(model.namedparams())[path].grad,
                                expected, rtol=1e-6, atol=1e-8)
        # The effective step min(r, lr) never exceeds the unclipped one.
        unclipped = ref.hook_gradient(w[path], g[path], **kwargs)
        assert numpy.all(lr * numpy.abs(expected)
                         <= numpy.abs(unclipped) * (1 + 1e-12))


def test_clip_follows_a_changed_lr():
    hook = chainer_lars.GradientLARS(clip=True, trust_coefficient=0.02)
    model, opt = setup(hook, optimizer=optimizers.MomentumSGD(lr=0.5))
    opt.lr = 0.01
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    hook(opt)
    expected = ref.hook_gradient(w['/fc/W'], g['/fc/W'], clip_lr=0.01,
                                 trust_coefficient=0.02)
    testing.assert_allclose(model.fc.W.grad, expected, rtol=1e-6)


def test_clip_needs_a_rule_with_lr():
    model, opt = setup(chainer_lars.GradientLARS(clip=True),
                       optimizer=optimizers.Adam())
    with pytest.raises(TypeError, match="clip=True.*no hyperparameter 'lr'"):
        opt.update()


@pytest.mark.parametrize('dynamic', [False, True])
def test_loss_scaling_equals_unscaled_run(dynamic):
    kwargs = dict(weight_decay=1e-3, trust_coefficient=0.5)
    plain, opt_plain = setup(chainer_lars.GradientLARS(**kwargs))
    scaled, opt_scaled = setup(chainer_lars.GradientLARS(**kwargs))
    if dynamic:
        opt_scaled.loss_scaling(interval=1)
    else:
        opt_scaled.loss_scaling(scale=2.0 ** 12)
    for step in range(6):
        x, t = ref.batch(step)
        opt_plain.update(ref.loss_fn(plain, x, t))
        opt_scaled.update(ref.loss_fn(scaled, x, t))
    if dynamic:
        assert opt_scaled._loss_scale >= 32  # it really scaled
    a, b = ref.snapshot(plain), ref.snapshot(scaled)
    for path in PATHS:
        testing.assert_allclose(a[path], b[path], rtol=1e-5, atol=1e-6)


def test_chainer_hook_is_wrong_under_loss_scaling():
    # Documents the defect this package fixes: Chainer's hook runs before
    # the rule divides the gradient by the loss scale S, so its ratio is
    # ||w|| / (S ||g|| + ...) and its weight-decay term is off by S.
    plain, opt_plain = setup(optimizer_hooks.GradientLARS(weight_decay=0.1))
    scaled, opt_scaled = setup(optimizer_hooks.GradientLARS(weight_decay=0.1))
    opt_scaled.loss_scaling(scale=1024.0)
    x, t = ref.batch(0)
    opt_plain.update(ref.loss_fn(plain, x, t))
    opt_scaled.update(ref.loss_fn(scaled, x, t))
    assert not numpy.allclose(plain.fc.W.array, scaled.fc.W.array,
                              rtol=1e-3)


def _sgd(link, fp32_update):
    """``SGD(lr=0.1)`` on ``link``, with master copies where asked."""
    opt = optimizers.SGD(lr=0.1).setup(link)
    if fp32_update:
        opt.use_fp32_update()
    return opt


def _fp16_link(w, g):
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.asarray(w, numpy.float16))
    link.p.grad = numpy.asarray(g, numpy.float16)
    return link


@pytest.mark.parametrize('fp32_update', [False, True])
def test_fp16_norms_do_not_overflow(fp32_update):
    # Sum of squares 64 * 64 * 8**2 = 262144 > 65504, the float16 maximum.
    rng = numpy.random.RandomState(0)
    w = numpy.full((64, 64), 8.0) * rng.choice([-1, 1], (64, 64))
    g = rng.standard_normal((64, 64))
    link = _fp16_link(w, g)
    w16, g16 = link.p.array.copy(), link.p.grad.copy()
    opt = optimizers.SGD(lr=0.01)
    opt.setup(link)
    if fp32_update:
        opt.use_fp32_update()
    opt.add_hook(chainer_lars.GradientLARS(weight_decay=1e-4))
    opt.update()
    expected = w16 - 0.01 * ref.hook_gradient(w16, g16, weight_decay=1e-4)
    assert numpy.all(numpy.isfinite(link.p.array))
    testing.assert_allclose(link.p.array, expected, rtol=2e-3, atol=2e-3)


def test_fp16_master_copy_is_used():
    # After the first update the float32 master copy differs from the float16
    # weights; the ratio must be computed from the master copy.
    link = _fp16_link(numpy.linspace(-1, 1, 101), numpy.ones(101))
    opt = optimizers.SGD(lr=1e-3)
    opt.setup(link)
    opt.use_fp32_update()
    opt.add_hook(chainer_lars.GradientLARS(weight_decay=1e-2))
    opt.update()
    master = link.p.update_rule._fp32_param.array.astype(numpy.float64)
    g = numpy.random.RandomState(1).standard_normal(101)
    link.p.grad = g.astype(numpy.float16)
    opt.update()
    expected = master - 1e-3 * ref.hook_gradient(
        master, g.astype(numpy.float16), weight_decay=1e-2)
    testing.assert_allclose(link.p.update_rule._fp32_param.array, expected,
                            rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_fp16_under_loss_scaling_equals_unscaled_run(fp32_update):
    runs = []
    for scale in [None, 2.0 ** 10]:
        model, opt = setup(chainer_lars.GradientLARS(weight_decay=1e-3),
                           dtype=numpy.float16)
        if fp32_update:
            opt.use_fp32_update()
        if scale:
            opt.loss_scaling(scale=scale)
        for step in range(3):
            x, t = ref.batch(step, dtype=numpy.float16)
            opt.update(ref.loss_fn(model, x, t))
        runs.append(ref.snapshot(model))
    for path in PATHS:
        assert numpy.all(numpy.isfinite(runs[1][path]))
        testing.assert_allclose(runs[0][path], runs[1][path], rtol=1e-2,
                                atol=1e-3)


def test_removed_hook_leaves_fp16_parameters_alone():
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = optimizers.SGD(lr=0.1)
    opt.setup(link)
    opt.add_hook(chainer_lars.GradientLARS(threshold=0.0))
    opt.update()
    opt.remove_hook('GradientLARS')
    w = link.p.array.astype(numpy.float64)
    link.p.grad = numpy.array([0.5, 0.5], numpy.float16)
    opt.update()
    testing.assert_allclose(link.p.array, w - 0.1 * 0.5, rtol=1e-3)


def test_removing_the_hook_after_a_skipped_update_stops_it():
    # Dynamic loss scaling skips an update with a non-finite gradient: the
    # rules never run, and the float16 delegates were left armed, so the
    # next update was rescaled once more after the hook was removed.
    link = _fp16_link([1.0, 2.0], [numpy.inf, 0.5])
    opt = optimizers.SGD(lr=0.1)
    opt.setup(link)
    opt.loss_scaling(interval=1)
    hook = chainer_lars.GradientLARS(threshold=0.0)  # the user keeps it
    opt.add_hook(hook)
    with pytest.warns(UserWarning, match='Non finite'):
        opt.update()
    assert link.p.array.tolist() == [1.0, 2.0]  # skipped
    opt.remove_hook('GradientLARS')
    link.p.grad = numpy.array([0.5, 0.5], numpy.float16)
    opt.update()
    testing.assert_allclose(link.p.array, [1.0 - 0.05, 2.0 - 0.05],
                            rtol=1e-3)


def test_update_after_a_skipped_one_is_rescaled_once():
    link = _fp16_link([1.0, 2.0], [numpy.inf, 0.5])
    opt = optimizers.SGD(lr=0.1)
    opt.setup(link)
    opt.loss_scaling(interval=1)
    opt.add_hook(chainer_lars.GradientLARS(threshold=0.0))
    with pytest.warns(UserWarning, match='Non finite'):
        opt.update()
    g = numpy.array([0.5, 0.5])
    link.p.grad = g.astype(numpy.float16)
    opt.update()
    # r = ||w|| / (eps + ||g||) = sqrt(5) / sqrt(0.5), applied once.
    step = 0.1 * math.sqrt(5.0) / (1e-9 + math.sqrt(0.5)) * g
    testing.assert_allclose(link.p.array, numpy.array([1.0, 2.0]) - step,
                            rtol=1e-3)


def test_a_direct_call_rescales_float16_in_the_next_update_too():
    # hook(optimizer) rewrites the float32 gradients at once and defers the
    # float16 ones into the update that follows, which rescales both.
    model = ref.Net(numpy.float16)
    ref.fill(model, 0)
    with model.init_scope():
        model.wide = chainer.Parameter(numpy.array([3.0, 4.0], numpy.float32))
    model.wide.grad = numpy.array([1.0, 0.0], numpy.float32)
    opt = optimizers.SGD(lr=0.1)
    opt.setup(model)
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    chainer_lars.GradientLARS()(opt)
    opt.update()
    for path, param in model.namedparams():
        expected = w[path] - 0.1 * ref.hook_gradient(w[path], g[path])
        testing.assert_allclose(param.array, expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_a_direct_call_steps_as_the_registered_hook(fp32_update):
    """hook(optimizer) before each update: a tied float16 array, listed
    twice, is rescaled twice as when the hook is registered, and a second
    hook, registered, leaves the direct call's delegate armed."""
    def run(direct, other):
        model = chainer.Chain()
        w = numpy.random.RandomState(0).uniform(0.5, 1.5, (8, 8))
        with model.init_scope():
            model.l0 = chainer.links.Linear(8, 8, initialW=w)
            model.again = model.l0  # tied: its arrays listed twice
        for p in model.params():
            p.array = p.array.astype(numpy.float16)
        opt = optimizers.MomentumSGD(lr=0.1, momentum=0.0).setup(model)
        if fp32_update:
            opt.use_fp32_update()
        hook = chainer_lars.GradientLARS(weight_decay=0.5)
        if not direct:
            opt.add_hook(hook)
        if other:  # registered, after; its decay only
            opt.add_hook(chainer_lars.GradientLARS(
                weight_decay=0.25, exclude_from_layer_adaptation=['.']),
                name='other')
        for step in range(2):
            model.l0.W.grad = (numpy.random.RandomState(step).standard_normal(
                (8, 8)) * 10).astype(numpy.float16)
            model.l0.b.grad = numpy.ones(8, numpy.float16)
            if direct:
                hook(opt)
            opt.update()
        return model.l0.W.array

    for other in (False, True):
        testing.assert_allclose(run(True, other), run(False, other),
                                rtol=0, atol=2e-3)


def test_a_direct_call_before_a_skipped_update_is_not_carried_further():
    # hook(optimizer) arms the float16 delegate for the next update only:
    # when dynamic loss scaling skips that one (the rules never run), the
    # update after it, where the hook is not called, is a plain SGD step.
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = optimizers.SGD(lr=0.1)
    opt.setup(link)
    opt.loss_scaling(interval=1)
    chainer_lars.GradientLARS(threshold=0.0)(opt)  # armed for t = 1
    link.p.grad = numpy.array([numpy.inf, 0.5], numpy.float16)
    with pytest.warns(UserWarning, match='Non finite'):
        opt.update()  # skipped; t = 1
    assert link.p.array.tolist() == [1.0, 2.0]
    link.p.grad = numpy.array([0.5, 0.5], numpy.float16)
    opt.update()  # t = 2: the delegate armed for t = 1 does nothing
    assert opt.t == 2
    # Rescaled, it would move by 0.1 * sqrt(5) / sqrt(0.5) * 0.5 = 0.158.
    testing.assert_allclose(link.p.array, [1.0 - 0.05, 2.0 - 0.05],
                            rtol=1e-3)


def test_hook_pickles():
    hook = chainer_lars.GradientLARS(
        threshold=0.1, weight_decay=1e-3, eps=0.0, trust_coefficient=0.5,
        clip=True, exclude_from_weight_decay=['/b$'],
        exclude_from_layer_adaptation=['gamma'], multi_tensor=False)
    copied = pickle.loads(pickle.dumps(hook))
    assert repr(copied) == repr(hook) == (
        "GradientLARS(threshold=0.1, weight_decay=0.001, eps=0.0, "
        "trust_coefficient=0.5, clip=True, exclude_from_weight_decay="
        "('/b$',), exclude_from_layer_adaptation=('gamma',), "
        "multi_tensor=False)")


def _copy(obj, how):
    if how == 'pickle':
        return pickle.loads(pickle.dumps(obj))
    return copy.deepcopy(obj)


def _delegates(model):
    return [(path, h) for path, p in model.namedparams()
            for h in p.update_rule._hookable._pre_update_hooks.values()]


@pytest.mark.parametrize('how', ['pickle', 'deepcopy'])
@pytest.mark.parametrize('dtype,fp32_update', [
    (numpy.float32, False), (numpy.float16, False), (numpy.float16, True)])
def test_copied_optimizer_continues_like_the_original(how, dtype,
                                                      fp32_update):
    # As Chainer's TestOptimizerPickable: copy after an update, then update
    # the original and the copy alike and compare.
    hook = chainer_lars.GradientLARS(weight_decay=1e-3,
                                     exclude_from_layer_adaptation=['/b$'])
    model, opt = setup(hook, dtype)
    if fp32_update:
        opt.use_fp32_update()
    opt.loss_scaling(interval=1)
    x, t = ref.batch(0, dtype=dtype)
    opt.update(ref.loss_fn(model, x, t))

    other = _copy(opt, how)
    other_hook = other._hookable._pre_update_hooks['GradientLARS']
    assert other_hook is not hook and other.target is not model
    # Each copied rule holds a delegate of the copied hook, and only that.
    for path, delegate in _delegates(other.target):
        assert delegate.hook() is other_hook, path
    if dtype == numpy.float16:
        assert len(_delegates(other.target)) == len(PATHS)

    # Independent: updating the copy leaves the original alone.
    before = ref.snapshot(model)
    x, t = ref.batch(1, dtype=dtype)
    other.update(ref.loss_fn(other.target, x, t))
    after = ref.snapshot(model)
    assert all(before[p].tobytes() == after[p].tobytes() for p in PATHS)
    opt.update(ref.loss_fn(model, x, t))
    for step in range(2, 4):
        x, t = ref.batch(step, dtype=dtype)
        opt.update(ref.loss_fn(model, x, t))
        other.update(ref.loss_fn(other.target, x, t))

    assert other.t == opt.t == 4
    assert other._loss_scale == opt._loss_scale
    ref.assert_same_momentum_state(other.target, model, fp32_update)
    # One delegate per float16 rule still: none was added by the copy.
    if dtype == numpy.float16:
        assert len(_delegates(other.target)) == len(PATHS)
    assert sorted(other_hook.observe()) == sorted(PATHS)
    assert other_hook.observe() == hook.observe()


@pytest.fixture
def emulated_gpu():
    """The CPU emulation of a CUDA device: fails without a C++ compiler,
    as every emulated test does."""
    from chainer_lars.testing import cuda_emulator
    from chainer_lars.testing import emulated_cupy
    cuda_emulator.compiler()  # EmulatorError: 'no C++ compiler found ...'
    with emulated_cupy.installed() as xp:
        yield xp


def _set_grads(xp, model, step):
    rng = numpy.random.RandomState(100 + step)
    for _, param in sorted(model.namedparams()):
        param.grad = xp.asarray(
            rng.standard_normal(param.shape).astype(param.dtype))


@pytest.mark.parametrize('how', ['pickle', 'deepcopy'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_copy_on_gpu_makes_its_own_tables(emulated_gpu, how, multi_tensor):
    xp = emulated_gpu
    model = ref.Net()
    ref.fill(model, 0)
    model.to_device('@cupy:0')
    opt = optimizers.MomentumSGD(lr=0.1).setup(model)
    hook = chainer_lars.GradientLARS(weight_decay=1e-3,
                                     multi_tensor=multi_tensor)
    opt.add_hook(hook)
    _set_grads(xp, model, 0)
    opt.update()

    def tables(hook):
        # Both paths keep their device buffers in the plan's groups (of
        # one array each with multi_tensor=False).
        plan = ref.plan_of(hook)
        return None if plan is None else plan.groups[0].state

    assert tables(hook) is not None
    other = _copy(opt, how)
    other_hook = other._hookable._pre_update_hooks['GradientLARS']
    assert tables(other_hook) is None and other_hook.observe() == {}
    for step in (1, 2):
        _set_grads(xp, model, step)
        opt.update()
        _set_grads(xp, other.target, step)
        other.update()
    assert tables(other_hook) is not None
    assert tables(other_hook) is not tables(hook)
    ours = dict(model.namedparams())
    for path, param in other.target.namedparams():
        assert isinstance(param.array, xp.ndarray)
        assert (param.array.get().tobytes()
                == ours[path].array.get().tobytes()), path
    assert other_hook.observe() == hook.observe()


@pytest.mark.parametrize('how', ['pickle', 'deepcopy'])
def test_copy_of_a_hook_starts_without_observations(how):
    hook = chainer_lars.GradientLARS()
    _, opt = setup(hook)
    opt.update()
    assert hook.observe()
    assert _copy(hook, how).observe() == {}


def test_two_hooks_on_one_model_keep_their_own_delegates():
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = optimizers.SGD(lr=0.1)
    opt.setup(link)
    first = chainer_lars.GradientLARS(threshold=0.0)
    second = copy.deepcopy(first)
    second.trust_coefficient = 0.5  # its effect is seen in the step
    opt.add_hook(first)
    opt.add_hook(second, name='second')
    opt.update()
    names = list(link.p.update_rule._hookable._pre_update_hooks)
    assert names == ['chainer_lars.GradientLARS',
                     'chainer_lars.GradientLARS#2']
    # Both ran, in order: ||r * g|| = ||w|| after the first (r = sqrt(5) /
    # sqrt(0.5)), and the second's ratio of 0.5 * ||w|| / ||w|| halves it.
    r = math.sqrt(5.0) / math.sqrt(0.5)
    step = 0.1 * 0.5 * r * 0.5
    testing.assert_allclose(link.p.array, [1.0 - step, 2.0 - step],
                            rtol=1e-3)
    # Each hook observed its own ratio, of the gradient it was handed.
    (r1, w1, g1), = first.observe().values()
    (r2, w2, g2), = second.observe().values()
    testing.assert_allclose([r1, w1, g1], [r, math.sqrt(5.0), math.sqrt(0.5)],
                            rtol=1e-6)
    testing.assert_allclose([r2, w2, g2], [0.5, math.sqrt(5.0),
                                           math.sqrt(5.0)], rtol=1e-3)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_a_new_hook_takes_over_the_delegates_of_a_removed_one(fp32_update):
    # A sweep that makes a new hook for each setting (removing the last):
    # each float16 rule keeps one delegate, the new hook's, and the removed
    # hooks are freed; they piled up, one a rule per hook, each called at
    # every update.
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = _sgd(link, fp32_update)
    olds = []
    for trust_coefficient in [1.0, 0.5, 0.25]:
        if olds:
            opt.remove_hook('GradientLARS')
        hook = chainer_lars.GradientLARS(
            threshold=0.0, trust_coefficient=trust_coefficient)
        opt.add_hook(hook)
        link.p.grad = numpy.asarray([0.5, 0.5], numpy.float16)
        before = link.p.array.astype(numpy.float64)
        opt.update()
        # The step is this hook's: ||r * g|| = trust_coefficient * ||w||.
        testing.assert_allclose(
            numpy.linalg.norm(before - link.p.array),
            0.1 * trust_coefficient * numpy.linalg.norm(before), rtol=1e-2)
        olds.append(weakref.ref(hook))
        del hook
    delegates = list(link.p.update_rule._hookable._pre_update_hooks.items())
    assert [n for n, _ in delegates] == ['chainer_lars.GradientLARS']
    assert delegates[0][1].hook() is olds[-1]()
    del delegates
    gc.collect()
    assert [old() for old in olds[:-1]] == [None, None]
    # Beside a second hook, re-made in turn: one delegate each, in the
    # optimizer's order of the hooks (each rescales what the last left).
    opt.add_hook(chainer_lars.GradientLARS(threshold=0.0), name='second')
    for _ in range(3):
        opt.remove_hook('GradientLARS')
        opt.add_hook(chainer_lars.GradientLARS(threshold=0.0))
        opt.update()
        owners = [d.hook() for d in
                  link.p.update_rule._hookable._pre_update_hooks.values()]
        assert owners == list(opt._hookable._pre_update_hooks.values())


def test_an_update_retried_after_a_failure_rescales_once():
    """A later hook failed after this one armed its float16 delegates; the
    update retried at the same t (the failing hook removed) armed them a
    second time, and the gradient was rescaled twice."""
    def run(fail):
        link = _fp16_link([1.0, 2.0], [0.5, 0.5])
        opt = optimizers.Adam().setup(link)  # rules without 'lr'
        opt.add_hook(chainer_lars.GradientLARS(threshold=0.0,
                                               weight_decay=0.5))
        if fail:
            opt.add_hook(chainer_lars.GradientLARS(clip=True), name='clip')
            with pytest.raises(TypeError, match="no hyperparameter 'lr'"):
                opt.update()
            opt.remove_hook('clip')
        opt.update()
        return link.p.grad  # rescaled, as Adam's step hardly shows it

    assert run(True).tobytes() == run(False).tobytes()


def test_two_hooks_compose_on_master_copies_after_the_first_update():
    """With use_fp32_update(), from t = 2 (the masters made), both hooks
    handed the rule a gradient rescaled from the raw one: the second's
    replaced the first's. The second now rescales the first's."""
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = optimizers.SGD(lr=0.1).setup(link)
    opt.use_fp32_update()
    opt.add_hook(chainer_lars.GradientLARS(threshold=0.0,
                                           trust_coefficient=0.5), name='x')
    opt.add_hook(chainer_lars.GradientLARS(
        weight_decay=0.5, exclude_from_layer_adaptation=['.']), name='y')
    g = numpy.array([0.5, 0.5])
    for _ in range(3):
        link.p.grad = g.astype(numpy.float16)
        master = link.p.update_rule._fp32_param
        w = (link.p.array if master is None else master.array).astype(
            numpy.float64)
        opt.update()
        # x: r = 0.5 ||w|| / ||g||; then y adds 0.5 w.
        step = 0.1 * (0.5 * numpy.linalg.norm(w) / numpy.linalg.norm(g) * g
                      + 0.5 * w)
        testing.assert_allclose(
            w - link.p.update_rule._fp32_param.array, step, rtol=1e-3)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_a_hook_re_added_rescales_in_its_new_place(fp32_update):
    """x removed and added again runs after y: its float16 delegate, made
    first, ran first (float16: x then y; mixed16: y's handed gradient
    replaced x's)."""
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = _sgd(link, fp32_update)
    x = chainer_lars.GradientLARS(threshold=0.0, trust_coefficient=0.5)
    opt.add_hook(x, name='x')
    opt.add_hook(chainer_lars.GradientLARS(
        weight_decay=0.5, exclude_from_layer_adaptation=['.']), name='y')
    opt.update()
    opt.remove_hook('x')
    opt.add_hook(x, name='x')
    held = link.p.update_rule._fp32_param if fp32_update else link.p
    w = held.array.astype(numpy.float64)
    g = numpy.array([0.5, 0.5])
    link.p.grad = g.astype(numpy.float16)
    opt.update()
    g = g + 0.5 * w  # y, then x: r = 0.5 ||w|| / ||g||
    step = 0.1 * 0.5 * numpy.linalg.norm(w) / numpy.linalg.norm(g) * g
    testing.assert_allclose(w - held.array, step,
                            rtol=1e-4 if fp32_update else 1e-2)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_a_rule_hook_on_float16_adds_to_the_rescaled_gradient(fp32_update):
    # Chainer's hook, an optimizer hook, rescales before the rules' own
    # hooks run: a rule's WeightDecay adds to r * g, in float16 too (where
    # ours rescales in the rule, before that rule's other hooks).
    rng = numpy.random.RandomState(0)
    link = _fp16_link(rng.standard_normal(12), rng.standard_normal(12))
    opt = _sgd(link, fp32_update)
    hook = chainer_lars.GradientLARS()
    opt.add_hook(hook)
    link.p.update_rule.add_hook(optimizer_hooks.WeightDecay(0.5))
    for step in range(3):
        g = rng.standard_normal(12).astype(numpy.float16)
        link.p.grad = g.copy()
        w = (link.p.update_rule._fp32_param.array if step and fp32_update
             else link.p.array).astype(numpy.float64)
        opt.update()
        r = hook.observe()['/p'][0]
        after = (link.p.update_rule._fp32_param.array if fp32_update
                 else link.p.array)
        expected = w - 0.1 * (r * g.astype(numpy.float64) + 0.5 * w)
        testing.assert_allclose(after, expected,
                                rtol=1e-5 if fp32_update else 3e-3,
                                atol=1e-6 if fp32_update else 3e-3)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_an_optimizer_hook_after_it_on_float16_is_refused(fp32_update):
    # Its change of the float16 gradients would be lost (under master
    # copies) or rescaled (in the rule): refused before any array moves.
    link = _fp16_link([1.0, 2.0], [0.5, 0.5])
    opt = _sgd(link, fp32_update)
    opt.add_hook(chainer_lars.GradientLARS())
    opt.add_hook(optimizer_hooks.WeightDecay(0.5), name='decay')
    for t in range(2):  # the first update, then one with master copies
        w = link.p.array.copy()
        with pytest.raises(ValueError, match=(
                r'GradientLARS rescales float16 gradients in their update '
                r'rules, so the changes of the pre-update hooks registered '
                r'after it \(decay\) would be lost or rescaled: register '
                r'them before GradientLARS')):
            opt.update()
        assert opt.t == t and (link.p.array == w).all()
        opt.remove_hook('decay')
        opt.update()
        opt.add_hook(optimizer_hooks.WeightDecay(0.5), name='decay')
    # Registered before it, or in float32, a hook is taken.
    opt.remove_hook('GradientLARS')
    opt.add_hook(chainer_lars.GradientLARS())
    opt.update()
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.ones(2, numpy.float32))
    link.p.grad = numpy.ones(2, numpy.float32)
    opt = optimizers.SGD(lr=0.1).setup(link)
    opt.add_hook(chainer_lars.GradientLARS())
    opt.add_hook(optimizer_hooks.WeightDecay(0.5))
    opt.update()


@pytest.mark.parametrize('dtype', ['float32', 'float16', 'mixed16'])
def test_one_instance_registered_twice_is_refused(dtype):
    # Called twice, it would rescale float32 gradients twice and float16
    # ones once (one delegate a rule): refused before any array moves.
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.array([1.0, 2.0], numpy.dtype(
            'f' if dtype == 'float32' else 'e')))
    link.p.grad = numpy.full(2, 0.5, link.p.dtype)
    opt = optimizers.MomentumSGD(lr=0.1).setup(link)
    if dtype == 'mixed16':
        opt.use_fp32_update()
    hook = chainer_lars.GradientLARS()
    opt.add_hook(hook)
    opt.add_hook(hook, name='again')
    w, g = link.p.array.copy(), link.p.grad.copy()
    with pytest.raises(ValueError, match=(
            r'GradientLARS: one instance is registered on the optimizer as '
            r'GradientLARS and again: register it once')):
        opt.update()
    assert opt.t == 0 and (link.p.array == w).all()
    assert (link.p.grad == g).all()
    opt.remove_hook('again')
    opt.update()
    assert opt.t == 1 and (link.p.array != w).all()


@pytest.mark.parametrize('dtype', ['float32', 'mixed16'])
def test_one_instance_on_two_optimizers_acts_as_two(dtype):
    # A GAN's generator and discriminator under one hook: each optimizer
    # gets what an instance of its own gives, bit for bit.
    def run(shared):
        rng = numpy.random.RandomState(0)
        links, opts = [], []
        hook = chainer_lars.GradientLARS(weight_decay=1e-3)
        for k in range(2):
            link = _fp16_link(rng.standard_normal(6), [0.0] * 6)
            if dtype == 'float32':
                link.p.array = link.p.array.astype(numpy.float32)
            opt = optimizers.MomentumSGD(lr=0.1).setup(link)
            if dtype == 'mixed16':
                opt.use_fp32_update()
            opt.add_hook(hook if shared else copy.deepcopy(hook))
            links.append(link)
            opts.append(opt)
        for step in range(3):
            for link, opt in zip(links, opts):
                link.p.grad = rng.standard_normal(6).astype(link.p.dtype)
                opt.update()
        return [link.p.array for link in links]
    for a, b in zip(run(True), run(False)):
        assert a.dtype == b.dtype and (a == b).all()


def test_a_float16_array_swapped_to_big_endian_under_masters_is_updated():
    # Chainer uses no master copy for '>f2' (not == float16): the hook then
    # rescales that array as it is, and the other keeps its master.
    rng = numpy.random.RandomState(0)
    link = chainer.Link()
    with link.init_scope():
        link.a = chainer.Parameter(rng.standard_normal(6).astype(
            numpy.float16))
        link.b = chainer.Parameter(rng.standard_normal(6).astype(
            numpy.float16))
    opt = optimizers.SGD(lr=0.1).setup(link)
    opt.use_fp32_update()
    opt.add_hook(chainer_lars.GradientLARS())
    for step in range(3):
        for p in (link.a, link.b):
            p.grad = rng.standard_normal(6).astype(p.dtype)
        if step == 2:  # after backward: the gradient stays native
            link.b.array = link.b.array.astype('>f2')
        master = link.a.update_rule._fp32_param
        w_a = (link.a.array if master is None
               else master.array).astype(numpy.float64)
        w_b, g_a, g_b = link.b.array.copy(), link.a.grad, link.b.grad
        opt.update()
    testing.assert_allclose(
        link.a.update_rule._fp32_param.array,
        w_a - 0.1 * ref.hook_gradient(w_a, g_a), rtol=1e-6, atol=1e-7)
    assert link.b.array.dtype == numpy.dtype('>f2')
    testing.assert_allclose(
        link.b.array, w_b - 0.1 * ref.hook_gradient(w_b, g_b), rtol=1e-2,
        atol=1e-3)


def test_the_plan_lasts_across_mixed16_updates():
    # Chainer's fp32 update assigns each float16 weight anew from its
    # master at every update: the plan follows the masters, so it is
    # built once they exist, not at every update.
    hook = chainer_lars.GradientLARS()
    model, opt = setup(hook, dtype=numpy.float16)
    opt.use_fp32_update()
    for step in range(4):
        x, t = ref.batch(step, dtype=numpy.float16)
        opt.update(ref.loss_fn(model, x, t))
        plans = hook._plans.plans()
        if step == 1:  # the masters made at the first update
            plan, = plans
            assert any(group.mixed16 for group in plan.groups)
    assert len(plans) == 1 and plans[0] is plan


def test_registered_on_a_single_update_rule():
    model, opt = setup(None)
    hook = chainer_lars.GradientLARS(
        weight_decay=1e-2, exclude_from_weight_decay=['^/b$'])
    model.fc.W.update_rule.add_hook(hook)
    model.fc.b.update_rule.add_hook(
        chainer_lars.GradientLARS(weight_decay=1e-2,
                                  exclude_from_weight_decay=['^/b$']))
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    opt.update()
    # MomentumSGD's first step from v = 0 is w - lr * g.
    for path, uses_wd in [('/fc/W', True), ('/fc/b', False)]:
        expected = w[path] - 0.1 * ref.hook_gradient(
            w[path], g[path], weight_decay=1e-2, uses_weight_decay=uses_wd)
        testing.assert_allclose(dict(model.namedparams())[path].array,
                                expected, rtol=1e-6, atol=1e-7)
    # Parameters without the hook took a plain step.
    testing.assert_allclose(model.conv1.W.array,
                            w['/conv1/W'] - 0.1 * g['/conv1/W'], rtol=1e-6)


def test_uninitialized_missing_grad_and_zero_size_are_left_alone():
    link = chainer.Chain()
    with link.init_scope():
        link.lazy = chainer.links.Linear(None, 3)
        link.empty = chainer.Parameter(numpy.zeros((0, 4), numpy.float32))
        link.nograd = chainer.Parameter(numpy.ones(3, numpy.float32))
        link.ok = chainer.Parameter(numpy.ones(3, numpy.float32))
    link.empty.grad = numpy.zeros((0, 4), numpy.float32)
    link.ok.grad = numpy.full(3, 2.0, numpy.float32)
    opt = optimizers.SGD(lr=0.1)
    opt.setup(link)
    hook = chainer_lars.GradientLARS(weight_decay=0.1, eps=0.0)
    hook(opt)  # warnings are errors in this suite
    assert link.lazy.W.array is None
    assert link.nograd.grad is None
    assert link.empty.grad.shape == (0, 4)
    testing.assert_allclose(link.ok.grad, ref.hook_gradient(
        numpy.ones(3), numpy.full(3, 2.0), weight_decay=0.1, eps=0.0),
        rtol=1e-6)


@pytest.mark.parametrize('threshold', [0.0, 1e-2])
@pytest.mark.parametrize('weight_decay', [0.0, 0.1])
@pytest.mark.parametrize('w_value,g_value', [(0.0, 0.0), (1.0, 0.0),
                                             (0.0, 1.0)])
def test_zero_norms_with_zero_eps_are_finite(threshold, weight_decay,
                                             w_value, g_value):
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.full(4, w_value, numpy.float32))
    link.p.grad = numpy.full(4, g_value, numpy.float32)
    opt = optimizers.SGD(lr=1.0)
    opt.setup(link)
    kwargs = dict(threshold=threshold, weight_decay=weight_decay, eps=0.0)
    expected = ref.hook_gradient(link.p.array, link.p.grad, **kwargs)
    chainer_lars.GradientLARS(**kwargs)(opt)
    assert numpy.all(numpy.isfinite(link.p.grad))
    testing.assert_allclose(link.p.grad, expected, rtol=1e-6)


@pytest.mark.parametrize('bad', [numpy.nan, numpy.inf])
def test_non_finite_gradient_does_not_spread(bad):
    hook = chainer_lars.GradientLARS(weight_decay=1e-3)
    model, opt = setup(hook)
    model.conv1.W.grad[0, 0] = bad
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    hook(opt)
    assert not numpy.all(numpy.isfinite(model.conv1.W.grad))
    for path in PATHS[1:]:
        testing.assert_allclose(
            dict(model.namedparams())[path].grad,
            ref.hook_gradient(w[path], g[path], weight_decay=1e-3),
            rtol=1e-6, atol=1e-7)


def test_dynamic_loss_scaling_skips_overflowing_step_without_crash():
    model, opt = setup(chainer_lars.GradientLARS())
    opt.loss_scaling(interval=1)
    before = ref.snapshot(model)
    model.fc.W.grad[0, 0] = numpy.inf
    with pytest.warns(UserWarning, match='Non finite'):
        opt.update()
    after = ref.snapshot(model)
    for path in PATHS:
        testing.assert_allclose(after[path], before[path], rtol=0, atol=0)


def test_observe_after_a_refused_update_reports_the_last_applied():
    # As LARS.observe(): a refused call changes nothing, observe() too.
    hook = chainer_lars.GradientLARS(clip=True)
    model, opt = setup(hook)
    hook(opt)
    observed = hook.observe()
    assert sorted(observed) == sorted(PATHS)
    model.fc.W.update_rule.hyperparam.lr = -1.0
    with pytest.raises(ValueError, match='lr of /fc/W must be at least 0'):
        hook(opt)
    assert hook.observe() == observed
    model.fc.W.update_rule.hyperparam.lr = 0.1
    opt.loss_scaling(scale=8.0)
    opt._loss_scaling_isnan = True  # a skipped update: nothing applied
    hook(opt)
    assert hook.observe() == {}


def test_observe_reports_ratios_and_unscaled_norms():
    hook = chainer_lars.GradientLARS(weight_decay=1e-3,
                                     exclude_from_layer_adaptation=['/b$'])
    model, opt = setup(hook)
    opt.loss_scaling(scale=8.0)
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    for p in model.params():
        p._loss_scale = 8.0
        p.grad *= 8
    hook(opt)
    observed = hook.observe()
    assert sorted(observed) == sorted(PATHS)
    for path in PATHS:
        ratio, w_norm, g_norm = observed[path]
        assert w_norm == pytest.approx(ref.norm64(w[path]), rel=1e-6)
        assert g_norm == pytest.approx(ref.norm64(g[path]), rel=1e-6)
        if path.endswith('/b'):
            assert ratio == 1.0
        else:
            expected = w_norm / (1e-9 + g_norm + 1e-3 * w_norm)
            assert ratio == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize('kwargs,error,words', [
    ({'threshold': -1.0}, ValueError, 'threshold.*-1.0'),
    ({'threshold': float('nan')}, ValueError, 'threshold.*nan'),
    ({'weight_decay': -1e-4}, ValueError, 'weight_decay.*-0.0001'),
    ({'weight_decay': float('inf')}, ValueError, 'weight_decay.*inf'),
    ({'eps': -1e-9}, ValueError, 'eps'),
    ({'trust_coefficient': 0.0}, ValueError, 'trust_coefficient.*0.0'),
    ({'trust_coefficient': -1.0}, ValueError, 'trust_coefficient'),
    ({'threshold': '0.1'}, TypeError, "threshold.*'0.1'"),
    ({'weight_decay': None}, TypeError, 'weight_decay.*None'),
    ({'eps': True}, TypeError, 'eps.*True'),
    ({'clip': 1}, TypeError, 'clip.*1'),
    ({'exclude_from_weight_decay': ['(unclosed']}, ValueError,
     r'exclude_from_weight_decay.*\(unclosed'),
    ({'exclude_from_layer_adaptation': [3]}, TypeError,
     'exclude_from_layer_adaptation.*3'),
    ({'exclude_from_layer_adaptation': 3}, TypeError,
     'exclude_from_layer_adaptation.*3'),
    ({'exclude_from_weight_decay': b'/b$'}, TypeError,
     r"exclude_from_weight_decay.*b'/b\$' \(bytes\)"),
    ({'exclude_from_weight_decay': re.compile(b'/b$')}, TypeError,
     'exclude_from_weight_decay.*compiled bytes pattern'),
])
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        chainer_lars.GradientLARS(**kwargs)


@pytest.mark.parametrize('name', ['clip', 'multi_tensor'])
def test_flags_accept_numpy_bools(name):
    hook = chainer_lars.GradientLARS(**{name: numpy.bool_(True)})
    # Stored as a Python bool (clip as the attribute, multi_tensor behind it).
    assert (hook.clip if name == 'clip' else hook._multi_tensor) is True
    with pytest.raises(TypeError, match=name + r' must be a bool, not 1 '):
        chainer_lars.GradientLARS(**{name: 1})


def test_bad_assignment_is_refused_and_keeps_the_old_value():
    hook = chainer_lars.GradientLARS(weight_decay=1e-4)
    with pytest.raises(ValueError, match='weight_decay'):
        hook.weight_decay = -1.0
    assert hook.weight_decay == 1e-4


def test_a_single_string_is_one_pattern():
    hook = chainer_lars.GradientLARS(exclude_from_weight_decay='/b$')
    assert hook.exclude_from_weight_decay == ('/b$',)


def test_needs_a_set_up_optimizer():
    with pytest.raises(TypeError, match='set-up optimizer'):
        chainer_lars.GradientLARS()(optimizers.SGD())


_dtypes = st.sampled_from([numpy.float16, numpy.float32, numpy.float64])


@st.composite
def _case(draw):
    dtype = draw(_dtypes)
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1,
                                  max_side=7))
    # float16 magnitudes are bounded so that the exact result is
    # representable; wider types span many orders of magnitude.
    if dtype == numpy.float16:
        exp_w, exp_g = draw(st.integers(-2, 1)), draw(st.integers(-3, 1))
    else:
        exp_w, exp_g = draw(st.integers(-6, 6)), draw(st.integers(-8, 6))
    unit = st.floats(-1.0, 1.0, allow_nan=False, width=16)
    w = draw(hnp.arrays(numpy.float64, shape, elements=unit)) * 10.0 ** exp_w
    g = draw(hnp.arrays(numpy.float64, shape, elements=unit)) * 10.0 ** exp_g
    kwargs = dict(
        threshold=draw(st.sampled_from([0.0, 1e-2, 1.0])),
        weight_decay=draw(st.sampled_from([0.0, 1e-4, 0.1])),
        eps=draw(st.sampled_from([0.0, 1e-9])),
        trust_coefficient=draw(st.sampled_from([1.0, 1e-3, 0.5])))
    return w.astype(dtype), g.astype(dtype), kwargs


# The same 150 examples every run, and no database in the checkout
# (.hypothesis/); CHAINER_LARS_FUZZ_EXAMPLES: new random ones, as in
# tests/test_fuzz.py.
@hypothesis.settings(
    max_examples=150, deadline=None, database=None,
    derandomize='CHAINER_LARS_FUZZ_EXAMPLES' not in os.environ)
@hypothesis.given(_case())
@hypothesis.example((  # g = -wd w: the two terms cancel
    numpy.array([0.63330078125]), numpy.array([0.63330078125]) * -1e-4,
    dict(threshold=0.0, weight_decay=1e-4, eps=0.0, trust_coefficient=1.0)))
def test_property_finite_and_matches_reference(case):
    w, g, kwargs = case
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(w.copy())
    link.p.grad = g.copy()
    opt = optimizers.SGD(lr=1.0)
    opt.setup(link)
    hook = chainer_lars.GradientLARS(**kwargs)
    if w.dtype == numpy.float16:
        hook(link.p.update_rule, link.p)  # float16 is rescaled in the rule
    else:
        hook(opt)
    out = link.p.grad
    expected = ref.hook_gradient(w, g, **kwargs)
    assert out.dtype == w.dtype
    assert numpy.all(numpy.isfinite(out))
    tol = {numpy.float16: 4e-3, numpy.float32: 2e-6,
           numpy.float64: 1e-12}[w.dtype.type]
    # Relative to the terms' size, r (|g| + wd |w|): where g and wd w
    # cancel, r g + r wd w rounds each term, and the exact 0 is not the
    # result's scale (the signs do not change r).
    scale = float(numpy.max(ref.hook_gradient(
        numpy.abs(w), numpy.abs(g), **kwargs))) if expected.size else 0.0
    # Results below the smallest normal number are rounded to the spacing of
    # the subnormals.
    tiny = float(numpy.finfo(w.dtype).smallest_subnormal)
    testing.assert_allclose(out, expected, rtol=tol, atol=tol * scale + tiny)
    assert link.p.array.tobytes() == w.tobytes()  # the weights are read only


class _HalfFirst(chainer.Chain):

    """float16 parameters first in path order, then float32 ones."""

    def __init__(self):
        super(_HalfFirst, self).__init__()
        with self.init_scope():
            self.a = chainer.links.Linear(
                6, 5, initialW=ref._init(numpy.float16),
                initial_bias=ref._init(numpy.float16))
            self.b = chainer.links.Linear(6, 5, initialW=ref._init(
                numpy.float32))


def _everything(model):
    """Arrays, gradients, rule counters and states, as bytes."""
    out = {}
    for path, p in model.namedparams():
        rule = p.update_rule
        out[path] = (p.array.tobytes(), p.grad.tobytes(), rule.t,
                     None if rule.state is None else sorted(
                         (k, v.tobytes()) for k, v in rule.state.items()))
    return out


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('make,excluded', [
    # The float32 arrays are not adapted, so need no lr; the float16 ones
    # are, and their check used to come only inside their rules, after
    # the float32 arrays were updated.
    (_HalfFirst, ['^/b/']),
    # Arrays visited before the failing one used to be rewritten already.
    (ref.Net, ['bn1', 'conv1']),
])
def test_configuration_error_changes_nothing(multi_tensor, make, excluded):
    model = make()
    ref.fill(model, 0)
    opt = optimizers.Adam()  # no hyperparameter 'lr'
    opt.setup(model)
    opt.add_hook(chainer_lars.GradientLARS(
        clip=True, weight_decay=1e-3, exclude_from_layer_adaptation=excluded,
        multi_tensor=multi_tensor))
    before = _everything(model)
    with pytest.raises(TypeError, match="clip=True.*no hyperparameter 'lr'"):
        opt.update()
    assert _everything(model) == before
    assert opt.t == 0


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('clip', [False, True])
def test_link_added_after_setup_is_skipped(multi_tensor, clip):
    model, opt = setup(chainer_lars.GradientLARS(
        clip=clip, weight_decay=0.1, multi_tensor=multi_tensor))
    with model.init_scope():
        model.extra = chainer.links.Linear(3, 3)
    model.extra.W.grad = numpy.ones((3, 3), numpy.float32)
    model.extra.b.grad = numpy.ones(3, numpy.float32)
    assert model.extra.W.update_rule is None  # as Chainer leaves it
    opt.update()
    numpy.testing.assert_array_equal(model.extra.W.grad, 1.0)
    numpy.testing.assert_array_equal(model.extra.b.grad, 1.0)
    assert '/extra/W' not in hook_paths(opt)


def hook_paths(opt):
    hook, = [h for name, h in opt._hookable._pre_update_hooks.items()
             if isinstance(h, chainer_lars.GradientLARS)]
    return hook.observe()


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('weight_decay', [0.0, 1e-3])
def test_non_native_byte_order_equals_native(multi_tensor, weight_decay):
    grads = []
    for byteorder in ('=', 'S'):
        model, opt = setup(None)
        for p in model.params():
            dtype = p.dtype.newbyteorder(byteorder)
            p.array, p.grad = p.array.astype(dtype), p.grad.astype(dtype)
        hook = chainer_lars.GradientLARS(weight_decay=weight_decay,
                                         multi_tensor=multi_tensor)
        hook(opt)
        grads.append({path: p.grad.astype(numpy.float32).tobytes()
                      for path, p in model.namedparams()})
    assert grads[0] == grads[1]


@pytest.mark.parametrize('numba', [False, True])
def test_huge_gradients_do_not_overflow_the_norm(monkeypatch, numba):
    from chainer_lars import cpu
    if not numba:
        monkeypatch.setattr(cpu, '_jit_module', None)
    else:
        numba_util.require_numba()
    # ||g|| = 3e20 * 10: its square overflows float32 (3.4e38).
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.ones(100, numpy.float32))
    link.p.grad = numpy.full(100, 3e20, numpy.float32)
    opt = optimizers.SGD(lr=1.0)
    opt.setup(link)
    chainer_lars.GradientLARS(weight_decay=0.0)(opt)
    expected = ref.hook_gradient(numpy.ones(100), numpy.full(100, 3e20))
    testing.assert_allclose(link.p.grad, expected, rtol=1e-6)
    assert numpy.all(link.p.grad > 0)


# -- misuse, refused when it happens -----------------------------------------

@pytest.mark.parametrize('kwargs', [{}, {'timing': 'pre'}, {'name': 'lars'},
                                    {'name': 'lars', 'timing': 'pre'}])
def test_the_class_as_a_hook_is_refused_before_anything_changes(kwargs):
    # Chainer's add_hook takes a class (it is callable); its first call,
    # GradientLARS(optimizer) before the update, refuses it.
    model, opt = setup(None)
    opt.add_hook(chainer_lars.GradientLARS, **kwargs)
    x, t = ref.batch(0)
    before = ref.snapshot(model)
    with pytest.raises(TypeError, match=(
            r'^GradientLARS was registered as a class: register an '
            r'instance, add_hook\(chainer_lars.GradientLARS\(\)\) with the '
            r'parentheses$')):
        opt.update(ref.loss_fn(model, x, t))
    after = ref.snapshot(model)
    for path in PATHS:
        numpy.testing.assert_array_equal(before[path], after[path])


def test_post_timing_is_refused_at_the_end_of_the_first_update():
    # Chainer's add_hook gives a hook no way to see its timing: the first
    # update, made without the rescaling, ends with the error.
    model, opt = setup(None)
    opt.add_hook(chainer_lars.GradientLARS(), timing='post')
    x, t = ref.batch(0)
    with pytest.raises(ValueError, match="^GradientLARS rescales the "
                       "gradients before the update: .*not 'post'"):
        opt.update(ref.loss_fn(model, x, t))
    assert opt.t == 1


@pytest.mark.parametrize('on_rule', [False, True])
def test_post_timing_under_a_name_is_refused_at_the_first_call(on_rule):
    model, opt = setup(None)
    hook = chainer_lars.GradientLARS()
    registry = model.fc.W.update_rule if on_rule else opt
    registry.add_hook(hook, name='lars', timing='post')
    with pytest.raises(ValueError, match="not 'post'"):
        hook(*((model.fc.W.update_rule, model.fc.W) if on_rule else (opt,)))


def test_the_hook_on_lars_is_refused():
    model = ref.Net(numpy.float32)
    lars = chainer_lars.LARS()
    lars.setup(model)
    with pytest.raises(TypeError, match=(
            '^GradientLARS on a chainer_lars.LARS optimizer would adapt '
            'the rates twice: use LARS alone')):
        lars.add_hook(chainer_lars.GradientLARS())
    assert not lars._hookable._pre_update_hooks
    # On a rule: refused there, before an update steps the other rules.
    hook = chainer_lars.GradientLARS()
    rule = model.fc.W.update_rule
    with pytest.raises(TypeError, match='adapt the rates twice'):
        rule.add_hook(hook, name='lars')
    assert not rule._hookable._pre_update_hooks
    # Registered past the add_hooks (Chainer's own): refused when called.
    with pytest.raises(TypeError, match='adapt the rates twice'):
        hook(rule, model.fc.W)
    with pytest.raises(TypeError, match='adapt the rates twice'):
        hook(lars)


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
def test_chainers_own_hook_on_lars_or_lamb_is_refused(face):
    """A script moving from MomentumSGD with Chainer's GradientLARS to
    LARS that kept the hook's line adapted the rates twice, silently."""
    opt = face().setup(ref.Net(numpy.float32))
    with pytest.raises(TypeError, match=(
            '^GradientLARS on a chainer_lars.{} optimizer would adapt the '
            'rates twice'.format(face.__name__))):
        opt.add_hook(chainer.optimizer_hooks.GradientLARS())
    assert not opt._hookable._pre_update_hooks


@pytest.mark.parametrize('name', ['exclude_from_weight_decay',
                                  'exclude_from_layer_adaptation'])
@pytest.mark.parametrize('make', [chainer_lars.GradientLARS,
                                  chainer_lars.LARS])
def test_assigning_an_exclusion_list_says_to_pass_it_to_the_constructor(
        name, make):
    obj = make(**{name: ['/b$']})
    with pytest.raises(AttributeError, match=(
            r'^{0} is fixed when the {1} is made .*: pass it to the '
            r"constructor, {1}\(\.\.\., {0}=\['/W\$'\]\)$".format(
                name, make.__name__))):
        setattr(obj, name, ['/W$'])
    assert getattr(obj, name) == ('/b$',)


@pytest.mark.parametrize('make', [chainer_lars.GradientLARS,
                                  chainer_lars.LARS, chainer_lars.LAMB])
def test_assigning_multi_tensor_says_to_pass_it_to_the_constructor(make):
    """``opt.multi_tensor = False`` after construction set an attribute
    that nothing read: the update stayed batched, silently."""
    obj = make(multi_tensor=False)
    assert obj.multi_tensor is False and 'multi_tensor=False' in repr(obj)
    with pytest.raises(AttributeError, match=(
            r'^multi_tensor is fixed when the {0} is made \(its plans are '
            r'made for it\): pass it to the constructor, {0}\(\.\.\., '
            r'multi_tensor=True\)$'.format(make.__name__))):
        obj.multi_tensor = True
    assert obj.multi_tensor is False and make().multi_tensor is True


def test_registration_attributes_read_as_plain_values_elsewhere():
    assert chainer_lars.GradientLARS.name == 'GradientLARS'
    assert chainer_lars.GradientLARS.timing == 'pre'
    assert dict(inspect.getmembers(chainer_lars.GradientLARS))[
        'timing'] == 'pre'


class _SizedRule(optimizers.momentum_sgd.MomentumSGDRule):

    def __len__(self):  # a rule that tests false, e.g. one counting states
        return 0


@pytest.mark.parametrize('flag', ['enabled', '_use_fp32_update'])
def test_a_rule_that_tests_false_is_still_watched_for_its_flags(flag):
    """The plan's flags were ``r and flags(r)``: a rule of ``len`` 0 stood
    for its own flags, so disabling it kept the plan, and the hook went
    on rescaling its gradient."""
    model = chainer.links.Linear(3, 4)
    opt = optimizers.MomentumSGD(lr=0.1)
    opt.create_update_rule = lambda: _SizedRule(opt.hyperparam)
    opt.setup(model)
    hook = chainer_lars.GradientLARS(threshold=0.0)
    opt.add_hook(hook)
    for p in model.params():
        p.grad = numpy.ones_like(p.array)
    opt.update()
    assert sorted(hook.observe()) == ['/W', '/b']
    plan, = hook._plans.plans()
    if flag == 'enabled':
        model.b.update_rule.enabled = False
    else:  # float32: the flag changes only the plan's key
        model.b.update_rule.use_fp32_update()
    for p in model.params():
        p.grad = numpy.ones_like(p.array)
    opt.update()
    assert hook._plans.plans()[0] is not plan  # made again
    if flag == 'enabled':  # left alone, as Chainer's hook leaves it
        assert sorted(hook.observe()) == ['/W']
        assert (model.b.grad == 1.0).all()


# -- mixed16: the masters' gradients rescaled in one batched pass ----------

def _mixed16_runs(multi_tensor, steps=5, overflow=3, xp=numpy, send=None):
    """Two MomentumSGD runs of a float16 model with float32 masters and
    dynamic loss scaling: the hook on the optimizer (the batched pass from
    the second update, once the masters are made), and a hook on each rule
    (called in the rule, after it divides out the loss scale, on the
    master: the per-rule path). An infinite gradient at ``overflow``."""
    runs = []
    for on_rules in (False, True):
        model = ref.Net(numpy.float16)
        ref.fill(model, 0)
        if send is not None:
            send(model)
        opt = optimizers.MomentumSGD(lr=0.05).setup(model)
        opt.use_fp32_update()
        opt.loss_scaling(interval=1000)
        opt._loss_scale = 2.0 ** 10  # dynamic scaling starts at 1
        kwargs = dict(weight_decay=1e-3, trust_coefficient=0.5)
        if on_rules:
            for param in model.params():
                param.update_rule.add_hook(chainer_lars.GradientLARS(
                    **kwargs))
        else:
            hook = chainer_lars.GradientLARS(multi_tensor=multi_tensor,
                                             **kwargs)
            opt.add_hook(hook)
        runs.append((model, opt))
    for step in range(steps):
        for model, opt in runs:
            rng = numpy.random.RandomState(step)
            for _, param in sorted(model.namedparams()):
                g = (rng.standard_normal(param.shape) * 1e-2
                     * opt._loss_scale).astype(numpy.float16)
                if step == overflow and param is model.fc.W:
                    g[0, 0] = numpy.inf
                param.grad = xp.asarray(g)
                param._loss_scale = opt._loss_scale
            with pytest.warns(UserWarning, match='Non finite') if (
                    step == overflow) else _quiet():
                opt.update()
    return runs, hook


class _quiet(object):

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_mixed16_masters_gradients_are_rescaled_as_in_their_rules(
        multi_tensor):
    """The batched pass equals the hook in each rule, bit for bit on the
    CPU, through an overflow that dynamic scaling skips; the rule then
    makes its own fp32 update (Chainer's), and observe() reports the
    batched rows."""
    runs, hook = _mixed16_runs(multi_tensor)
    (a, opt_a), (b, opt_b) = runs
    # Doubled at each update until the overflow halved it.
    assert opt_a._loss_scale == opt_b._loss_scale == 2.0 ** 12 * 2 ** 1e-3
    plan = ref.plan_of(hook)
    assert all(g.mixed16 for g in plan.groups)
    assert sorted(p for g in plan.groups for p in g.paths) == sorted(PATHS)
    theirs = dict(b.namedparams())
    for path, p in a.namedparams():
        q = theirs[path]
        for x, y in ((p.array, q.array),
                     (p.update_rule._fp32_param.array,
                      q.update_rule._fp32_param.array),
                     (p.update_rule.state['v'], q.update_rule.state['v'])):
            assert x.tobytes() == y.tobytes(), path
    assert sorted(hook.observe()) == sorted(PATHS)


@pytest.mark.parametrize('face', ['hook(rule, param)', 'LARS per rule'])
def test_observe_follows_strided_and_contiguous_gradients(face):
    """A strided gradient is updated through a copy, observed from the
    copy; the next contiguous one through the plan's compiled record,
    observed from the table, not from the earlier copy."""
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.arange(1., 9., dtype='f'))
    if face == 'LARS per rule':
        opt = chainer_lars.LARS(lr=0.1, weight_decay=0.,
                                multi_tensor=False).setup(link)
    else:
        opt = optimizers.SGD(lr=0.).setup(link)
        hook = chainer_lars.GradientLARS(weight_decay=0.)
    for k, scale in enumerate([1., 2., 3., 4., 5.]):
        grad = numpy.full(16 if k % 2 == 0 else 8, scale, 'f')
        link.p.grad = grad[::2] if k % 2 == 0 else grad
        assert link.p.grad.flags.c_contiguous == (k % 2 == 1)
        if face == 'LARS per rule':
            opt.update()
            observed = opt.observe()
        else:
            hook(link.p.update_rule, link.p)
            observed = hook.observe()
        ratio, w_norm, g_norm = observed['/p']
        assert g_norm == pytest.approx(scale * math.sqrt(8), rel=1e-6)


@pytest.mark.parametrize('listings', [1, 2, 3])
@pytest.mark.parametrize('fp32_update', [True, False])
@pytest.mark.parametrize('rule_hook', [False, True])
def test_a_float16_parameter_listed_twice_is_rescaled_for_each_listing(
        listings, fp32_update, rule_hook):
    # One link under several names lists its parameters that many times:
    # Chainer's hook rescales such a gradient once a listing, then the
    # optimizer steps it once a listing with the gradient rescaled so.
    # The mixed16 rule's delegate was armed once: its later steps took
    # the gradient unadapted (the weights moved 5 times as far). A rule
    # hook's new gradient stays its own (plain float16 lost it so). The
    # reference: Chainer's hook, in float16 too.
    def run(dtype, hook=chainer_lars.GradientLARS):
        model = chainer.Chain()
        with model.init_scope():
            model.l0 = chainer.links.Linear(8, 8, initialW=numpy.random.
                                            RandomState(0).uniform(
                                                0.5, 1.5, (8, 8)))
            for k in range(1, listings):
                setattr(model, 'again{}'.format(k), model.l0)
        for p in model.params():
            p.array = p.array.astype(dtype)
        opt = optimizers.MomentumSGD(lr=0.1, momentum=0.0).setup(model)
        if dtype == numpy.float16 and fp32_update:
            opt.use_fp32_update()
        opt.add_hook(hook(weight_decay=1e-3))
        if rule_hook:  # assigns a new gradient
            model.l0.W.update_rule.add_hook(_DoubledGradient())
        before = model.l0.W.array.astype(numpy.float64)
        for step in range(2):
            model.l0.W.grad = (numpy.random.RandomState(step).standard_normal(
                (8, 8)) * 10).astype(dtype)
            model.l0.b.grad = numpy.ones(8, dtype)
            opt.update()
        return model.l0.W.array.astype(numpy.float64) - before

    ours = run(numpy.float16)
    chainers = run(numpy.float16, optimizer_hooks.GradientLARS)
    numpy.testing.assert_allclose(ours, chainers, rtol=1e-2, atol=5e-3)
    assert numpy.linalg.norm(chainers) > 0.5


class _DoubledGradient(object):

    name, timing = 'doubled', 'pre'

    def __call__(self, rule, param):
        param.grad = param.grad * 2


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_tied_parameters_under_loss_scaling_step_as_unscaled(multi_tensor):
    """Tied parameters (views of one array) are rescaled one at a time, as
    Chainer steps them; under a loss scale each is unscaled first: the
    weights and observe() are those of the run without it, bit for bit."""
    def run(scale):
        base = numpy.linspace(-1, 1, 12).astype(numpy.float32)
        link = chainer.Link()
        with link.init_scope():
            link.p = chainer.Parameter(base[:6])
            link.q = chainer.Parameter(base[6:])
        assert link.p.array.base is base  # tied: one buffer
        opt = optimizers.MomentumSGD(lr=0.1).setup(link)
        if scale is not None:
            opt.loss_scaling(scale=scale)
        hook = chainer_lars.GradientLARS(weight_decay=1e-2,
                                         multi_tensor=multi_tensor)
        opt.add_hook(hook)
        x = numpy.random.RandomState(0).uniform(-1, 1, (2, 6)).astype(
            numpy.float32)
        for _ in range(3):
            opt.update(lambda: F.sum(link.p * x[0]) + F.sum(link.q * x[1]))
        return base, hook.observe()
    base, seen = run(None)
    scaled, scaled_seen = run(8.0)
    numpy.testing.assert_array_equal(scaled, base)
    assert scaled_seen == seen and sorted(seen) == ['/p', '/q']
