import copy
import io
import pickle

import numpy
import pytest

import chainer
from chainer import optimizers
from chainer import serializers
from chainer import testing
from chainer import training

import chainer_lars
from tests import lars_reference as ref
from tests.lars_reference import PATHS


def run_reference(model_seed, steps, kwargs, flags=None, dtype=numpy.float32,
                  stored=numpy.float64):
    """Weights after ``steps`` updates, computed with the float64 reference
    (``stored``: ``w`` and ``v`` rounded to it after each step, as kept).

    Gradients of step ``k`` are those :func:`set_grads` puts in place.
    """
    model = ref.Net(dtype)
    ref.fill(model, model_seed)
    w = ref.snapshot(model)
    v = {path: numpy.zeros_like(a) for path, a in w.items()}
    flags = flags or {}
    for step in range(steps):
        grads = _grads(model, step)
        for path in w:
            uses_wd, adapt = flags.get(path, (True, True))
            w[path], v[path] = ref.lars_step(
                w[path], grads[path].astype(numpy.float64), v[path],
                uses_weight_decay=uses_wd, uses_adaptation=adapt, **kwargs)
            w[path], v[path] = (a.astype(stored).astype(numpy.float64)
                                for a in (w[path], v[path]))
    return w


def _grads(model, step):
    rng = numpy.random.RandomState(100 + step)
    return {path: rng.standard_normal(p.shape).astype(p.dtype)
            for path, p in sorted(model.namedparams())}


def set_grads(model, step):
    for path, g in _grads(model, step).items():
        dict(model.namedparams())[path].grad = g


DEFAULTS = dict(lr=0.1, momentum=0.9, weight_decay=1e-4,
                trust_coefficient=1e-3, eps=0.0)


def test_defaults_are_tensorflow_s_but_the_learning_rate():
    # TensorFlow's lr=1e-3 with its trust coefficient of 1e-3 trains next
    # to nothing; the snippets' test trains LARS() on MNIST.
    opt = chainer_lars.LARS()
    assert (opt.momentum, opt.weight_decay, opt.trust_coefficient, opt.eps,
            opt.nesterov) == (0.9, 1e-4, 1e-3, 0.0, False)
    assert opt.lr == 2.0
    assert chainer_lars.LARSRule().hyperparam.lr == 2.0


@pytest.mark.parametrize('rule, hyper', [
    (chainer_lars.LARSRule, dict(lr=0.25, momentum=0.5, weight_decay=0.0,
                                 trust_coefficient=0.5, eps=1e-3,
                                 nesterov=True)),
    (chainer_lars.LAMBRule, dict(alpha=0.25, beta1=0.5, beta2=0.75, eps=1e-3,
                                 eta=0.5, weight_decay_rate=0.1)),
])
def test_a_rule_takes_its_hyperparameters_as_chainers_rules_do(rule, hyper):
    """``MomentumSGDRule(lr=...)``, ``AdamRule(alpha=...)``: set on the
    rule's own hyperparam, ``None`` leaves the parent's. A second
    positional argument, Chainer's ``lr``, was read as the weight-decay
    flag (a multiplier of the decay): refused, the flags are keywords."""
    parent = chainer.optimizer.Hyperparameter()
    vars(parent).update({name: 0.0 for name in hyper})
    made = rule(parent, **hyper)
    assert {n: getattr(made.hyperparam, n) for n in hyper} == hyper
    assert vars(parent) == dict({name: 0.0 for name in hyper},
                                _parent=None)
    first = sorted(hyper)[0]
    assert getattr(rule(parent, **{first: None}).hyperparam, first) == 0.0
    with pytest.raises(TypeError, match='positional argument'):
        rule(parent, 0.1)
    for name in ['alpha' if rule is chainer_lars.LARSRule else 'lr',
                 '_parent']:
        with pytest.raises(TypeError, match=(
                "^{}\\(\\) got an unexpected keyword argument '{}'$".format(
                    rule.__name__, name))):
            rule(**{name: 0.1})
    made = rule(uses_weight_decay=False, uses_adaptation=False)
    assert (made.uses_weight_decay, made.uses_adaptation) == (False, False)


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('value', [None, 0.5, 'no', numpy.array(1.0)])
def test_a_rules_flags_are_checked_when_set(face, multi_tensor, value):
    """``uses_weight_decay = None`` made LAMB's weights NaN at the next
    update, 0.5 halved the decay and ``uses_adaptation = None`` left
    adaptation on; each silently. Refused when set, naming the flag."""
    model = ref.Net(numpy.float32)
    face(multi_tensor=multi_tensor).setup(model)
    rule = model.fc.W.update_rule
    for name in ('uses_weight_decay', 'uses_adaptation'):
        with pytest.raises(TypeError, match='^{} must be a bool, not '.format(
                name)):
            setattr(rule, name, value)
        assert getattr(rule, name) is True
        with pytest.raises(TypeError, match='^{} must be a bool'.format(name)):
            face._rule(**{name: value})
    rule.uses_weight_decay = numpy.bool_(False)
    assert rule.uses_weight_decay is False


def test_a_standalone_rules_error_names_an_unnamed_parameter():
    param = chainer.Parameter(numpy.ones(3, numpy.float32))
    param.grad = numpy.ones(3, numpy.float32)
    param.update_rule = chainer_lars.LARSRule(lr=-1.0)
    with pytest.raises(ValueError, match=(
            '^LARS hyperparameter lr of an unnamed parameter must be at '
            'least 0.0, got -1.0$')):
        param.update()


@pytest.mark.parametrize('kwargs', [
    DEFAULTS,
    dict(DEFAULTS, nesterov=True),
    dict(DEFAULTS, weight_decay=0.0),
    dict(DEFAULTS, weight_decay=0.05, trust_coefficient=0.02, eps=1e-3),
    dict(DEFAULTS, momentum=0.0, lr=2.0),
])
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_steps_against_reference(kwargs, dtype):
    model = ref.Net(dtype)
    ref.fill(model, 0)
    opt = chainer_lars.LARS(**kwargs)
    opt.setup(model)
    for step in range(5):
        set_grads(model, step)
        opt.update()
    expected = run_reference(0, 5, kwargs, dtype=dtype)
    tol = 1e-5 if dtype == numpy.float32 else 1e-12
    for path in PATHS:
        testing.assert_allclose(dict(model.namedparams())[path].array,
                                expected[path], rtol=tol, atol=tol)


@pytest.mark.parametrize('nesterov', [False, True])
def test_exclusion_lists_act_independently(nesterov):
    kwargs = dict(DEFAULTS, weight_decay=0.05, nesterov=nesterov)
    exclusions = dict(exclude_from_weight_decay=['/b$', r'/bn\d+/'],
                      exclude_from_layer_adaptation=['/conv1/b$', 'gamma'])
    model = ref.Net()
    ref.fill(model, 0)
    opt = chainer_lars.LARS(**dict(kwargs, **exclusions))
    opt.setup(model)
    for step in range(4):
        set_grads(model, step)
        opt.update()
    flags = {'/conv1/b': (False, False), '/bn1/gamma': (False, False),
             '/bn1/beta': (False, True), '/fc/b': (False, True)}
    expected = run_reference(0, 4, kwargs, flags)
    for path in PATHS:
        testing.assert_allclose(dict(model.namedparams())[path].array,
                                expected[path], rtol=1e-5, atol=1e-6)
    rules = {path: p.update_rule for path, p in model.namedparams()}
    assert (rules['/bn1/gamma'].uses_weight_decay,
            rules['/bn1/gamma'].uses_adaptation) == (False, False)
    assert (rules['/fc/W'].uses_weight_decay,
            rules['/fc/W'].uses_adaptation) == (True, True)
    assert opt.exclude_from_layer_adaptation == ('/conv1/b$', 'gamma')


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_rule_made_after_setup_takes_the_exclusions(face, multi_tensor):
    """``param.update_rule = opt.create_update_rule()``, Chainer's way to
    give a parameter added (or a rule replaced) after ``setup`` one: only
    setup applied the lists, so such a rule decayed and adapted an
    excluded array. Now its first update does; a flag cleared by hand
    before stays cleared."""
    model = ref.Net()
    ref.fill(model, 0)
    opt = face(exclude_from_weight_decay=ref.EXCLUDE_FROM_WEIGHT_DECAY,
               exclude_from_layer_adaptation=ref.EXCLUDE_FROM_LAYER_ADAPTATION,
               multi_tensor=multi_tensor).setup(model)
    params = dict(model.namedparams())
    for path in PATHS:
        params[path].update_rule = opt.create_update_rule()
    params['/fc/W'].update_rule.uses_adaptation = False
    set_grads(model, 0)
    opt.update()
    flags = {path: (p.update_rule.uses_weight_decay,
                    p.update_rule.uses_adaptation)
             for path, p in params.items()}
    assert flags == dict(ref.EXCLUDED_FLAGS, **{'/fc/W': (True, False)})
    assert sorted(opt.observe()) == sorted(
        path for path, (_, adapt) in flags.items() if adapt)


def test_equals_momentum_sgd_with_hook():
    kwargs = dict(weight_decay=1e-3, eps=1e-9)
    a, b = ref.Net(), ref.Net()
    ref.fill(a, 0)
    ref.fill(b, 0)
    lars = chainer_lars.LARS(lr=0.05, momentum=0.9, trust_coefficient=1.0,
                             **kwargs)
    lars.setup(a)
    sgd = optimizers.MomentumSGD(lr=0.05, momentum=0.9)
    sgd.setup(b)
    sgd.add_hook(chainer_lars.GradientLARS(threshold=0.0, **kwargs))
    for step in range(5):
        x, t = ref.batch(step)
        lars.update(ref.loss_fn(a, x, t))
        sgd.update(ref.loss_fn(b, x, t))
    wa, wb = ref.snapshot(a), ref.snapshot(b)
    for path in PATHS:
        testing.assert_allclose(wa[path], wb[path], rtol=1e-5, atol=1e-6)


def test_an_all_zero_gradient_is_where_it_differs_from_the_hook():
    """Under weight decay LARS takes the ratio 1 there (both norms must be
    positive), the hook, as Chainer's, ||w|| / (wd ||w||) (docs)."""
    ratios = []
    for hooked in (False, True):
        link = _link()
        link.W.grad = numpy.zeros(6, numpy.float32)
        kwargs = dict(weight_decay=1e-2, eps=0.0)
        if hooked:
            opt = optimizers.MomentumSGD(lr=0.05).setup(link)
            hook = chainer_lars.GradientLARS(threshold=0.0, **kwargs)
            opt.add_hook(hook)
        else:
            opt = hook = chainer_lars.LARS(lr=0.05, trust_coefficient=1.0,
                                           **kwargs).setup(link)
        opt.update()
        ratios.append(hook.observe()['/W'][0])
    assert ratios == [1.0, pytest.approx(100.0)]


def _train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        x, t = ref.batch(step)
        opt.update(ref.loss_fn(model, x, t))


def _save(model, opt):
    buf = io.BytesIO()
    serializers.save_npz(buf, opt)
    model_buf = io.BytesIO()
    serializers.save_npz(model_buf, model)
    buf.seek(0)
    model_buf.seek(0)
    return buf, model_buf


@pytest.mark.parametrize('nesterov', [False, True])
def test_resume_is_bit_for_bit(nesterov):
    kwargs = dict(lr=0.2, nesterov=nesterov,
                  exclude_from_weight_decay=['/b$'])
    whole = ref.Net()
    ref.fill(whole, 0)
    opt_whole = chainer_lars.LARS(**kwargs).setup(whole)
    _train(whole, opt_whole, 6)

    first = ref.Net()
    ref.fill(first, 0)
    opt_first = chainer_lars.LARS(**kwargs).setup(first)
    _train(first, opt_first, 3)
    opt_buf, model_buf = _save(first, opt_first)

    resumed = ref.Net()
    opt_resumed = chainer_lars.LARS(**kwargs).setup(resumed)
    serializers.load_npz(model_buf, resumed)
    serializers.load_npz(opt_buf, opt_resumed)
    assert opt_resumed.t == 3
    _train(resumed, opt_resumed, 3, start=3)
    for (path, a), (_, b) in zip(sorted(whole.namedparams()),
                                 sorted(resumed.namedparams())):
        assert a.array.tobytes() == b.array.tobytes(), path
        assert (a.update_rule.state['v'].tobytes()
                == b.update_rule.state['v'].tobytes()), path


def test_resume_with_fp32_master_is_bit_for_bit():
    def make():
        model = ref.Net(numpy.float16)
        opt = chainer_lars.LARS(lr=0.5, weight_decay=1e-3)
        opt.setup(model)
        opt.use_fp32_update()
        return model, opt

    def train(model, opt, steps, start=0):
        for step in range(start, start + steps):
            x, t = ref.batch(step, dtype=numpy.float16)
            opt.update(ref.loss_fn(model, x, t))

    whole, opt_whole = make()
    ref.fill(whole, 0)
    train(whole, opt_whole, 4)
    first, opt_first = make()
    ref.fill(first, 0)
    train(first, opt_first, 2)
    opt_buf, model_buf = _save(first, opt_first)
    resumed, opt_resumed = make()
    serializers.load_npz(model_buf, resumed)
    serializers.load_npz(opt_buf, opt_resumed)
    train(resumed, opt_resumed, 2, start=2)
    for (path, a), (_, b) in zip(sorted(whole.namedparams()),
                                 sorted(resumed.namedparams())):
        assert a.array.tobytes() == b.array.tobytes(), path
        assert (a.update_rule._fp32_param.array.tobytes()
                == b.update_rule._fp32_param.array.tobytes()), path


def test_snapshot_without_master_copy_still_loads():
    model = ref.Net(numpy.float16)
    ref.fill(model, 0)
    opt = chainer_lars.LARS().setup(model)  # no use_fp32_update
    opt.update()
    buf = io.BytesIO()
    serializers.save_npz(buf, opt)
    buf.seek(0)
    other = chainer_lars.LARS().setup(ref.Net(numpy.float16))
    other.use_fp32_update()
    serializers.load_npz(buf, other)
    assert all(p.update_rule._fp32_param is None
               for p in other.target.params())


@pytest.mark.parametrize('how', ['pickle', 'deepcopy'])
@pytest.mark.parametrize('dtype,fp32_update', [
    (numpy.float32, False),
    pytest.param(numpy.float16, False, marks=ref.ROUNDS_AWAY),
    (numpy.float16, True)])
def test_copied_optimizer_continues_like_the_original(how, dtype,
                                                      fp32_update):
    # As Chainer's TestOptimizerPickable: copy after an update, then update
    # the original and the copy alike and compare.
    model = ref.Net(dtype)
    ref.fill(model, 0)
    opt = chainer_lars.LARS(lr=0.5, nesterov=True,
                            exclude_from_weight_decay=['/b$']).setup(model)
    if fp32_update:
        opt.use_fp32_update()
    x, t = ref.batch(0, dtype=dtype)
    opt.update(ref.loss_fn(model, x, t))
    if how == 'pickle':
        other = pickle.loads(pickle.dumps(opt))
    else:
        other = copy.deepcopy(opt)
    assert other.target is not model
    assert other.exclude_from_weight_decay == ('/b$',)
    assert other.observe() == {}  # no update made by the copy yet
    for step in range(1, 4):
        x, t = ref.batch(step, dtype=dtype)
        opt.update(ref.loss_fn(model, x, t))
        other.update(ref.loss_fn(other.target, x, t))
    assert other.t == opt.t == 4
    ref.assert_same_momentum_state(other.target, model, fp32_update)
    assert other.observe() == opt.observe()


@pytest.mark.emulated
@pytest.mark.parametrize('how', ['pickle', 'deepcopy'])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_copy_on_gpu_makes_its_own_tables(how, multi_tensor):
    from chainer_lars.testing import cuda_emulator
    from chainer_lars.testing import emulated_cupy
    cuda_emulator.compiler()  # EmulatorError: 'no C++ compiler found ...'
    with emulated_cupy.installed() as xp:
        model = ref.Net()
        ref.fill(model, 0)
        model.to_device('@cupy:0')
        opt = chainer_lars.LARS(lr=0.5, multi_tensor=multi_tensor)
        opt.setup(model)

        def step(opt, k):
            for path, g in _grads(opt.target, k).items():
                dict(opt.target.namedparams())[path].grad = xp.asarray(g)
            opt.update()

        step(opt, 0)
        other = (pickle.loads(pickle.dumps(opt)) if how == 'pickle'
                 else copy.deepcopy(opt))
        rules = [p.update_rule for p in other.target.params()]
        assert all(r._plan is None and not r._observed for r in rules)
        assert ref.plan_of(other) is None
        for k in (1, 2):
            step(opt, k)
            step(other, k)
        ours = dict(model.namedparams())
        if multi_tensor:
            # The batched path keeps its device buffers in the plan's
            # groups.
            assert ref.plan_of(other) is not None
            assert ref.plan_of(other) is not ref.plan_of(opt)
        for path, param in other.target.namedparams():
            if not multi_tensor:
                assert param.update_rule._plan.groups[0].state is not None
            assert (param.array.get().tobytes()
                    == ours[path].array.get().tobytes()), path
        assert other.observe() == opt.observe()


@pytest.mark.parametrize('dynamic', [False, True])
def test_loss_scaling_equals_unscaled_run(dynamic):
    plain, scaled = ref.Net(), ref.Net()
    ref.fill(plain, 0)
    ref.fill(scaled, 0)
    opt_plain = chainer_lars.LARS(lr=0.5).setup(plain)
    opt_scaled = chainer_lars.LARS(lr=0.5).setup(scaled)
    if dynamic:
        opt_scaled.loss_scaling(interval=1)
    else:
        opt_scaled.loss_scaling(scale=2.0 ** 12)
    _train(plain, opt_plain, 6)
    _train(scaled, opt_scaled, 6)
    a, b = ref.snapshot(plain), ref.snapshot(scaled)
    for path in PATHS:
        testing.assert_allclose(a[path], b[path], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('fp32_update', [False, True])
def test_fp16_against_reference(fp32_update):
    kwargs = dict(DEFAULTS, lr=1.0, weight_decay=1e-3)
    model = ref.Net(numpy.float16)
    ref.fill(model, 0)
    opt = chainer_lars.LARS(**kwargs)
    opt.setup(model)
    if fp32_update:
        opt.use_fp32_update()
    start = ref.snapshot(model)
    for step in range(3):
        set_grads(model, step)
        opt.update()
    # Without masters, w and v are kept in float16 after each step.
    expected = run_reference(0, 3, kwargs, dtype=numpy.float16,
                             stored=numpy.float32 if fp32_update
                             else numpy.float16)
    for path in PATHS:
        actual = dict(model.namedparams())[path].array
        assert actual.dtype == numpy.float16
        testing.assert_allclose(actual, expected[path], rtol=5e-3,
                                atol=5e-3)
        # The three steps move the weights by 1e-2 at most, two ulps or so
        # of 1, within the tolerance above: the steps themselves, to an ulp
        # (a rounding the other way) and 1e-2 of the step.
        step = actual.astype(numpy.float64) - start[path]
        want = expected[path] - start[path]
        ulp = numpy.spacing(numpy.maximum(
            abs(start[path]), abs(expected[path])).astype(numpy.float16))
        bad = abs(step - want) > ulp + 1e-2 * abs(want)
        assert not bad.any(), '{}: {} of {} steps off: {} for {}'.format(
            path, bad.sum(), bad.size, step[bad][:4], want[bad][:4])
        if fp32_update:
            rule = dict(model.namedparams())[path].update_rule
            assert rule.state['v'].dtype == numpy.float32
            testing.assert_allclose(rule._fp32_param.array, expected[path],
                                    rtol=1e-5, atol=1e-5)


def test_fp16_norms_do_not_overflow():
    link = chainer.Link()
    with link.init_scope():
        link.p = chainer.Parameter(numpy.full((64, 64), 8.0, numpy.float16))
    link.p.grad = numpy.full((64, 64), 4.0, numpy.float16)
    opt = chainer_lars.LARS(lr=1.0, weight_decay=0.0, momentum=0.0,
                            trust_coefficient=1e-3)
    opt.setup(link)
    opt.update()
    # ||w|| = 512, ||g|| = 256 (their squares, 2^18 and 2^16, overflow
    # float16): the ratio is 1e-3 * 2 and the step 0.002 * 4 = 0.008, about
    # two float16 ulps of 8, which the weight keeps to half an ulp.
    (ratio, w_norm, g_norm), = opt.observe().values()
    assert (w_norm, g_norm) == (512.0, 256.0)
    assert ratio == pytest.approx(2e-3, rel=1e-12)
    step = 8.0 - link.p.array.astype(numpy.float64)
    half_ulp = numpy.spacing(numpy.float16(8.0 - 0.008)) / 2
    testing.assert_allclose(step, numpy.full((64, 64), 0.008), rtol=0,
                            atol=half_ulp)


def test_zero_norms_give_ratio_one():
    link = chainer.Link()
    with link.init_scope():
        link.zero_w = chainer.Parameter(numpy.zeros(3, numpy.float32))
        link.zero_g = chainer.Parameter(numpy.ones(3, numpy.float32))
        link.empty = chainer.Parameter(numpy.zeros((0,), numpy.float32))
    link.zero_w.grad = numpy.full(3, 2.0, numpy.float32)
    link.zero_g.grad = numpy.zeros(3, numpy.float32)
    link.empty.grad = numpy.zeros((0,), numpy.float32)
    opt = chainer_lars.LARS(lr=0.1, momentum=0.0, weight_decay=0.5)
    opt.setup(link)
    opt.update()
    testing.assert_allclose(link.zero_w.array, numpy.full(3, -0.2))
    testing.assert_allclose(link.zero_g.array, numpy.full(3, 1.0 - 0.05))
    assert link.empty.array.shape == (0,)


def test_hyperparameters_are_settable_attributes():
    model = ref.Net()
    ref.fill(model, 0)
    opt = chainer_lars.LARS(**DEFAULTS).setup(model)
    set_grads(model, 0)
    opt.update()
    opt.lr = 0.3
    opt.trust_coefficient = 2e-3
    opt.weight_decay = 1e-3
    opt.momentum = 0.5
    assert model.fc.W.update_rule.hyperparam.lr == 0.3
    set_grads(model, 1)
    opt.update()
    # By hand: the first step with the defaults, the second with the new
    # values.
    w0 = ref.snapshot(_fresh(0))
    g0, g1 = _grads(model, 0), _grads(model, 1)
    for path in PATHS:
        w1, v1 = ref.lars_step(w0[path], g0[path], 0.0, **DEFAULTS)
        w2, _ = ref.lars_step(w1, g1[path], v1, lr=0.3, momentum=0.5,
                              weight_decay=1e-3, trust_coefficient=2e-3,
                              eps=0.0)
        testing.assert_allclose(dict(model.namedparams())[path].array, w2,
                                rtol=1e-5, atol=1e-6)


def _fresh(seed):
    model = ref.Net()
    ref.fill(model, seed)
    return model


def test_chainer_shift_extension_drives_lr(tmp_path):
    model = ref.Net()
    x, t = ref.batch(0, n=8)
    dataset = chainer.datasets.TupleDataset(x, t)
    it = chainer.iterators.SerialIterator(dataset, 4)
    classifier = chainer.links.Classifier(model)
    opt = chainer_lars.LARS(lr=1.0).setup(classifier)
    updater = training.updaters.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (3, 'iteration'), out=str(tmp_path))
    trainer.extend(training.extensions.ExponentialShift('lr', 0.5),
                   trigger=(1, 'iteration'))
    trainer.run()
    assert opt.lr == pytest.approx(0.125)


def test_observe_reports_adapted_arrays():
    model = ref.Net()
    ref.fill(model, 0)
    opt = chainer_lars.LARS(exclude_from_layer_adaptation=['/b$'],
                            **DEFAULTS).setup(model)
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    opt.update()
    observed = opt.observe()
    assert sorted(observed) == sorted(p for p in PATHS
                                      if not p.endswith('/b'))
    for path, (ratio, w_norm, g_norm) in observed.items():
        assert w_norm == pytest.approx(ref.norm64(w[path]), rel=1e-6)
        assert g_norm == pytest.approx(ref.norm64(g[path]), rel=1e-6)
        assert ratio == pytest.approx(
            1e-3 * w_norm / (g_norm + 1e-4 * w_norm), rel=1e-6)


@pytest.mark.parametrize('kwargs,error,words', [
    ({'lr': -0.1}, ValueError, 'lr.*-0.1'),
    ({'lr': float('inf')}, ValueError, 'lr.*inf'),
    ({'momentum': 1.0}, ValueError, 'momentum.*1.0'),
    ({'momentum': -0.1}, ValueError, 'momentum'),
    ({'weight_decay': -1e-4}, ValueError, 'weight_decay'),
    ({'eps': -1.0}, ValueError, 'eps'),
    ({'eps': float('nan')}, ValueError, 'eps.*nan'),
    ({'trust_coefficient': 0.0}, ValueError, 'trust_coefficient'),
    ({'lr': '0.1'}, TypeError, "lr.*'0.1'"),
    ({'nesterov': 'yes'}, TypeError, "nesterov.*'yes'"),
    ({'exclude_from_weight_decay': ['[']}, ValueError,
     r'exclude_from_weight_decay.*\['),
    ({'exclude_from_layer_adaptation': [None]}, TypeError,
     'exclude_from_layer_adaptation.*None'),
    ({'exclude_from_weight_decay': b'/b$'}, TypeError,
     r"exclude_from_weight_decay.*b'/b\$' \(bytes\)"),
])
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        chainer_lars.LARS(**kwargs)


def test_bad_assignment_is_refused():
    opt = chainer_lars.LARS()
    with pytest.raises(ValueError, match='momentum'):
        opt.momentum = 1.5
    assert opt.momentum == 0.9


def test_non_finite_gradient_stays_in_its_array():
    model = ref.Net()
    ref.fill(model, 0)
    opt = chainer_lars.LARS(**DEFAULTS).setup(model)
    model.fc.W.grad[0, 0] = numpy.inf
    w, g = ref.snapshot(model), ref.snapshot(model, 'grad')
    opt.update()
    for path in PATHS:
        if path == '/fc/W':
            continue
        expected, _ = ref.lars_step(w[path], g[path], 0.0, **DEFAULTS)
        testing.assert_allclose(dict(model.namedparams())[path].array,
                                expected, rtol=1e-6, atol=1e-7)


def test_non_native_byte_order_equals_native():
    results = []
    for byteorder in ('=', 'S'):
        model = ref.Net()
        ref.fill(model, 0)
        for p in model.params():
            dtype = p.dtype.newbyteorder(byteorder)
            p.array, p.grad = p.array.astype(dtype), p.grad.astype(dtype)
        opt = chainer_lars.LARS(**DEFAULTS).setup(model)
        for step in range(3):
            opt.update()
        results.append({path: p.array.astype(numpy.float32).tobytes()
                        for path, p in model.namedparams()})
    assert results[0] == results[1]


#: What FusedMethod.update forks (chainer_lars/fused.py says so where it
#: starts): the source of each function in Chainer 7.8.1, hashed.
FORKED = {
    'GradientMethod.update': 'df931d703b8fb4b1',
    'Optimizer.check_nan_in_grads': '2e45e45f9dfccf9c',
    'GradientMethod.reallocate_cleared_grads': 'f107f1d08450b649',
}


@pytest.mark.parametrize('name', sorted(FORKED))
def test_the_forked_chainer_functions_are_those_it_was_written_from(name):
    import hashlib
    import inspect

    from chainer import optimizer
    cls, attr = name.split('.')
    source = inspect.getsource(getattr(getattr(optimizer, cls), attr))
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert digest == FORKED[name], (
        'Chainer {} changed {}: LARS.update, check_nan_in_grads and '
        'reallocate_cleared_grads fork it; compare them with the new '
        'source and update FORKED'.format(chainer.__version__, name))


def _link(dtype=numpy.float32):
    link = chainer.Link()
    with link.init_scope():
        link.W = chainer.Parameter(numpy.arange(1, 7, dtype=dtype))
    link.W.grad = numpy.ones(6, dtype)
    return link


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_an_integer_parameter_is_refused_before_anything_moves(multi_tensor):
    link = _link(numpy.int32)
    opt = chainer_lars.LARS(lr=0.1, multi_tensor=multi_tensor).setup(link)
    with pytest.raises(TypeError, match=r'floating-point.*W.* int32'):
        opt.update()
    numpy.testing.assert_array_equal(link.W.array, numpy.arange(1, 7))


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('where, name, value, words', [
    ('optimizer', 'lr', -1.0, 'lr must be at least 0.0, got -1.0'),
    ('rule', 'trust_coefficient', float('nan'),
     'trust_coefficient of .*W must be finite'),
    ('optimizer', 'momentum', 1.0, 'momentum must be less than 1.0'),
    ('optimizer', 'nesterov', 2.0, 'nesterov must be a bool, not 2.0'),
    ('optimizer', 'lr', '0.1', "lr must be a real number, not '0.1'"),
    ('optimizer', 'lr', numpy.array([0.1, 0.2]),
     r'lr must be a real number, not array\(\[0.1, 0.2\]\)'),
    ('rule', 'weight_decay', -0.5, 'weight_decay of .*W must be at least'),
    ('rule', 'lr', '0.1', "lr of .*W must be a real number, not '0.1'"),
    ('rule', 'momentum', [0.9, 0.8],
     r'momentum of .*W must be a real number, not \[0.9, 0.8\] \(list\)'),
])
def test_hyperparameters_set_under_the_optimizer_are_checked(
        multi_tensor, where, name, value, words):
    link = _link()
    opt = chainer_lars.LARS(lr=0.1, multi_tensor=multi_tensor).setup(link)
    opt.add_hook(chainer.optimizer_hooks.WeightDecay(0.5))
    opt.update()  # checked once with good values
    before, t = link.W.array.copy(), opt.t
    hyperparam = (opt.hyperparam if where == 'optimizer'
                  else link.W.update_rule.hyperparam)
    setattr(hyperparam, name, value)
    link.W.grad = numpy.ones(6, numpy.float32)
    with pytest.raises((ValueError, TypeError),
                       match='LARS hyperparameter ' + words):
        opt.update()
    numpy.testing.assert_array_equal(link.W.array, before)
    if where == 'optimizer':
        # The optimizer's own values: before the hooks, before t counts.
        assert opt.t == t
        numpy.testing.assert_array_equal(link.W.grad, 1.0)
    setattr(hyperparam, name, getattr(chainer_lars.LARS(), name))
    opt.update()  # a good value is taken again


def test_repr_shows_the_settings():
    opt = chainer_lars.LARS(lr=0.5, exclude_from_weight_decay=['/b$'])
    assert repr(opt) == (
        "LARS(lr=0.5, momentum=0.9, weight_decay=0.0001, "
        "trust_coefficient=0.001, eps=0.0, nesterov=False, "
        "exclude_from_weight_decay=('/b$',), "
        "exclude_from_layer_adaptation=(), multi_tensor=True)")


def test_observe_before_setup_says_what_to_do():
    with pytest.raises(RuntimeError, match=(
            r'^LARS.observe\(\) reports the last update: call '
            r'optimizer.setup\(link\) and update\(\) first')):
        chainer_lars.LARS().observe()


@pytest.mark.parametrize('face, name, good, bad, words', [
    ('LARS', 'lr', 0.5, -1.0, 'LARS hyperparameter lr of /l1/W must be at '
     'least 0.0, got -1.0'),
    ('LARS', 'momentum', 0.5, 1.0, 'LARS hyperparameter momentum of /l1/W '
     'must be less than 1.0, got 1.0'),
    ('LAMB', 'beta2', 0.9, 1.0, 'LAMB hyperparameter beta2 of /l1/W must be '
     'less than 1.0, got 1.0'),
    ('LAMB', 'eps', 1e-7, 1e-60, r'eps of LAMB optimizer is too small for '
     r'float32 \(1e-60\), at /l1/W'),
])
@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('first', [True, False])  # before the states exist
@pytest.mark.parametrize('lossfun', [False, True])
def test_a_rules_own_values_fail_before_the_hooks_and_t(
        face, name, good, bad, words, multi_tensor, first, lossfun):
    """Values set on one rule's hyperparameter are refused before the
    pre-update hooks change a gradient and before any ``t`` counts, on
    the per-rule path (the first update, multi_tensor=False) and the
    batched one; a good value checked before is checked again once it
    changes. ``update(lossfun)`` is refused before the loss function
    runs: the batched path computed new gradients first."""
    model = chainer.Chain()
    with model.init_scope():
        model.l1 = chainer.links.Linear(3, 4)
        model.l2 = chainer.links.Linear(4, 2)
    opt = getattr(chainer_lars, face)(multi_tensor=multi_tensor)
    opt.setup(model)
    opt.add_hook(chainer.optimizer_hooks.WeightDecay(0.5))
    rng = numpy.random.RandomState(0)

    def set_grads():
        for p in model.params():
            p.grad = rng.standard_normal(p.shape).astype(numpy.float32)
    if not first:
        setattr(model.l1.W.update_rule.hyperparam, name, good)
        for _ in range(2):
            set_grads()
            opt.update()
    setattr(model.l1.W.update_rule.hyperparam, name, bad)
    set_grads()
    before = [(p.array.copy(), p.grad.copy(), p.update_rule.t)
              for p in model.params()]
    t, calls = opt.t, []

    def loss():
        calls.append(1)
        x = numpy.ones((2, 3), numpy.float32)
        return chainer.functions.sum(model.l2(model.l1(x)))
    with pytest.raises(ValueError, match=words):
        opt.update(*[loss] if lossfun else [])
    assert opt.t == t and calls == []
    for p, (w, g, rule_t) in zip(model.params(), before):
        assert (p.array == w).all() and (p.grad == g).all()
        assert p.update_rule.t == rule_t
    # Set right again, the next update runs as if nothing had happened.
    setattr(model.l1.W.update_rule.hyperparam, name, good)
    opt.update()
    assert opt.t == t + 1


@pytest.mark.parametrize('face', ['LARS', 'hook'])
@pytest.mark.parametrize('bad, ratio', [(numpy.nan, 1.0), (numpy.inf, 0.0)])
def test_a_gradient_not_finite_gives_the_documented_ratio(face, bad, ratio):
    """Without dynamic loss scaling (docs/optimizer.rst, docs/hook.rst): a
    NaN norm gives r = 1, the plain step for the array's other elements,
    an infinite one r = 0; no other array is touched."""
    model = chainer.Chain()
    with model.init_scope():
        model.a = chainer.Parameter(numpy.ones(3, numpy.float32))
        model.b = chainer.Parameter(numpy.full(3, 2.0, numpy.float32))
    if face == 'LARS':
        opt = chainer_lars.LARS(lr=2.0, momentum=0.0, weight_decay=0.0)
        opt.setup(model)
    else:
        opt = chainer.optimizers.SGD(lr=2.0).setup(model)
        opt.add_hook(chainer_lars.GradientLARS(threshold=0.0))
    model.a.grad = numpy.array([bad, 1.0, 1.0], numpy.float32)
    model.b.grad = numpy.ones(3, numpy.float32)
    owner = opt if face == 'LARS' else opt._hookable._pre_update_hooks[
        'GradientLARS']
    with numpy.errstate(invalid='ignore'):
        opt.update()
    assert owner.observe()['/a'][0] == ratio
    assert numpy.isnan(model.a.array[0])
    numpy.testing.assert_allclose(model.a.array[1:], 1.0 - 2.0 * ratio,
                                  rtol=1e-6)
    # b: the trust coefficient (LARS's 1e-3, the hook's 1) * ||w|| / ||g||
    r_b = (1e-3 if face == 'LARS' else 1.0) * 2.0
    numpy.testing.assert_allclose(model.b.array, 2.0 - 2.0 * r_b,
                                  rtol=1e-5)


@pytest.mark.parametrize('value', [b'/b$', bytearray(b'/b$')])
def test_an_exclusion_list_of_bytes_is_refused_whole(value):
    """Not taken item by item (each item an int)."""
    with pytest.raises(TypeError, match=(
            r'^exclude_from_weight_decay must be a list of regular '
            r'expressions \(str\), not .*\({}\)$'.format(
                type(value).__name__))):
        chainer_lars.LARS(exclude_from_weight_decay=value)


@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_disabled_rules_own_value_is_not_checked(multi_tensor):
    """It steps nothing, as Chainer's disabled rules (which read none of
    their values)."""
    link = _link()
    opt = chainer_lars.LARS(lr=0.1, multi_tensor=multi_tensor).setup(link)
    link.W.update_rule.enabled = False
    link.W.update_rule.hyperparam.lr = -1.0
    opt.update()
    assert opt.t == 1
    numpy.testing.assert_array_equal(link.W.array, numpy.arange(1, 7))


OTHER_CLASSES = {
    'LAMB in LARS': (chainer_lars.LAMB, chainer_lars.LARS, 'm and v',
                     'LAMB or Adam'),
    'Adam in LARS': (optimizers.Adam, chainer_lars.LARS, 'm and v',
                     'LAMB or Adam'),
    'LARS in LAMB': (chainer_lars.LARS, chainer_lars.LAMB, 'v',
                     'LARS or MomentumSGD'),
    'MomentumSGD in LAMB': (optimizers.MomentumSGD, chainer_lars.LAMB, 'v',
                            'LARS or MomentumSGD'),
    # No state of ours: Chainer's KeyError came after t had loaded.
    'SGD in LARS': (optimizers.SGD, chainer_lars.LARS, None, 'v'),
    'SGD in LAMB': (optimizers.SGD, chainer_lars.LAMB, None, 'm and v'),
    'RMSprop in LARS': (optimizers.RMSprop, chainer_lars.LARS, None, 'v')}


@pytest.mark.parametrize('case', sorted(OTHER_CLASSES))
def test_a_snapshot_of_another_optimizer_class_is_refused(case):
    # LAMB's v is Adam's second moment, not LARS's momentum: it loaded
    # without complaint and then stepped wrong; LARS's v into LAMB raised
    # Chainer's bare KeyError of a missing m.
    wrote, loads, held, by = OTHER_CLASSES[case]
    model = ref.Net()
    ref.fill(model, 0)
    opt = wrote().setup(model)
    for step in range(2):
        set_grads(model, step)
        opt.update()
    buf = io.BytesIO()
    serializers.save_npz(buf, opt)
    other_model = ref.Net()
    ref.fill(other_model, 1)
    other = loads().setup(other_model)
    other.loss_scaling(scale=8.0)
    set_grads(other_model, 0)
    other.update()
    before = copy.deepcopy(other)
    buf.seek(0)
    with pytest.raises(ValueError) as e:
        serializers.load_npz(buf, other)
    first = next(iter(other_model.namedparams()))[0]
    assert str(e.value) == (
        '{}: the snapshot holds {} for {}, the state of {}: load it into '
        'the optimizer class that saved it'.format(
            loads.__name__, held, first, by) if held else
        "{}: the snapshot holds no state for {}, as SGD's, or any saved "
        'before its first update: no {} to resume'.format(
            loads.__name__, first, by))
    assert (other.t, other.epoch, other._loss_scale) == (1, 0, 8.0)
    for (path, a), (_, b) in zip(sorted(before.target.namedparams()),
                                 sorted(other.target.namedparams())):
        for key, value in a.update_rule.state.items():
            assert value.tobytes() == b.update_rule.state[key].tobytes(), (
                path, key)


@pytest.mark.parametrize('updated', [False, True])
def test_a_snapshot_without_the_state_still_meets_chainers_limit(updated):
    # Before the first update no rule has a state to save, and Chainer
    # loads such a snapshot into no optimizer with a state, its own class
    # included (docs/design.rst): refused by name, before t loads (it was
    # Chainer's KeyError of the first array, after t). strict=False loads.
    buf = io.BytesIO()
    serializers.save_npz(buf, chainer_lars.LARS().setup(ref.Net()))
    other = chainer_lars.LARS().setup(ref.Net())
    if updated:
        set_grads(other.target, 0)
        other.update()
    buf.seek(0)
    with pytest.raises(ValueError, match='holds no state for /'):
        serializers.load_npz(buf, other)
    assert other.t == updated
    buf.seek(0)
    if updated:
        serializers.load_npz(buf, other, strict=False)
        assert other.t == 0


@pytest.mark.parametrize('face, key', [(chainer_lars.LARS, 'v'),
                                       (chainer_lars.LAMB, 'm')])
def test_a_snapshot_missing_one_array_state_is_called_damaged(face, key):
    """Its other arrays hold the class's states: Chainer's KeyError names
    the entry (a LAMB snapshot without its first m was called LARS's)."""
    opt = face().setup(ref.Net())
    set_grads(opt.target, 0)
    opt.update()
    arrays = {}
    serializers.DictionarySerializer(arrays).save(opt)
    first = next(iter(opt.target.namedparams()))[0]
    del arrays[first[1:] + '/' + key]
    with pytest.raises(KeyError, match=first[1:] + '/' + key):
        serializers.NpzDeserializer(arrays).load(face().setup(ref.Net()))


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
def test_a_load_that_ignores_the_states_takes_t_alone(face):
    """ignore_names (t resumed, momentum fresh) loads as in Chainer; a LAMB
    snapshot with m but no v anywhere is left to Chainer's KeyError."""
    opt = face().setup(ref.Net())
    set_grads(opt.target, 0)
    opt.update()
    arrays = {}
    serializers.DictionarySerializer(arrays).save(opt)
    fresh = face().setup(ref.Net())
    serializers.NpzDeserializer(arrays, ignore_names=lambda key: key.endswith(
        ('/m', '/v'))).load(fresh)
    assert fresh.t == 1
    if face is chainer_lars.LAMB:
        for key in [k for k in arrays if k.endswith('/v')]:
            del arrays[key]
        with pytest.raises(KeyError, match='/v'):
            serializers.NpzDeserializer(arrays).load(face().setup(ref.Net()))


def test_a_snapshot_with_rules_of_other_types_or_none_loads():
    # Only this class's rules' states are looked at: a parameter whose rule
    # is Adam's (the per-rule loop takes it) holds m and v in LARS's own
    # snapshot, and a parameter added after setup has no rule at all.
    def make():
        model = chainer.Sequential(chainer.links.Linear(3, 4),
                                   chainer.links.Linear(4, 2))
        opt = chainer_lars.LARS(lr=0.1).setup(model)
        model[1].W.update_rule = optimizers.Adam().setup(
            chainer.Link()).create_update_rule()
        with model.init_scope():
            model.extra = chainer.Parameter(numpy.zeros(2, numpy.float32))
        return model, opt

    model, opt = make()
    for p in model.params():
        p.grad = numpy.ones_like(p.array)
    opt.update()
    buf = io.BytesIO()
    serializers.save_npz(buf, opt)
    buf.seek(0)
    other_model, other = make()
    serializers.load_npz(buf, other)
    assert other.t == 1
    assert (other_model[1].W.update_rule.state['m'].tobytes()
            == model[1].W.update_rule.state['m'].tobytes())
    assert (other_model[0].W.update_rule.state['v'].tobytes()
            == model[0].W.update_rule.state['v'].tobytes())


@pytest.mark.parametrize('rule, name, value', [
    (chainer_lars.LARSRule, 'momentum', 1.0),
    (chainer_lars.LARSRule, 'trust_coefficient', 0.0),
    (chainer_lars.LARSRule, 'lr', -0.1),
    (chainer_lars.LAMBRule, 'beta1', 1.0),
    (chainer_lars.LAMBRule, 'eps', 0.0),
])
def test_a_rule_on_its_own_checks_its_hyperparameters(rule, name, value):
    # Without an optimizer to check them first, the rule's rows do.
    link = _link()
    link.W.update_rule = rule()
    link.W.update()  # a good value steps
    before = link.W.array.copy()
    setattr(link.W.update_rule.hyperparam, name, value)
    with pytest.raises(ValueError, match='^{} hyperparameter {} of W '.format(
            rule._face, name)):
        link.W.update()
    numpy.testing.assert_array_equal(link.W.array, before)


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
@pytest.mark.parametrize('multi_tensor', [True, False])
def test_a_weight_reshaped_to_its_own_size_is_refused_as_chainer_does(
        face, multi_tensor):
    """A (2, 3) weight replaced by its (3, 2) transpose: MomentumSGD and
    Adam raise (operands could not be broadcast); the states, still (2, 3),
    were paired with the new elements by flat index."""
    link = chainer.Link()
    with link.init_scope():
        link.w = chainer.Parameter(numpy.arange(1, 7, dtype='f').reshape(2, 3))
    opt = face(multi_tensor=multi_tensor).setup(link)
    link.w.grad = numpy.ones((2, 3), numpy.float32)
    opt.update()
    link.w.array = link.w.array.T.copy()
    link.w.grad = numpy.ones((3, 2), numpy.float32)
    before = link.w.array.copy()
    with pytest.raises(ValueError, match=(
            r'^/w: the (momentum buffer|first moment) has shape \(2, 3\) but '
            r'the weight \(3, 2\): operands could not be broadcast')):
        opt.update()
    assert (link.w.array == before).all()


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
def test_a_snapshot_state_of_another_shape_is_refused(face, tmp_path):
    """A state of the weight's size but another shape (a damaged or
    hand-made snapshot): Chainer's optimizers raise at the update, so do
    these, before the weight moves."""
    model = ref.Net(numpy.float32)
    opt = face().setup(model)
    set_grads(model, 0)
    opt.update()
    path = str(tmp_path / 'snapshot.npz')
    serializers.save_npz(path, opt)
    with numpy.load(path) as npz:
        entries = dict(npz)
    key = '/fc/W/' + face._rule.STATES[0]
    entries[key[1:]] = entries[key[1:]].T.copy()
    numpy.savez(path, **entries)
    fresh = ref.Net(numpy.float32)
    opt = face().setup(fresh)
    serializers.load_npz(path, opt)
    set_grads(fresh, 1)
    before = fresh.fc.W.array.copy()
    with pytest.raises(ValueError, match='^/fc/W: the .* has shape'):
        opt.update()
    assert (fresh.fc.W.array == before).all()


@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
def test_a_tied_link_takes_the_exclusions_of_its_last_path(face):
    """A link under two parents: setup, the plan and GradientLARS all name
    its parameters by their last path (a rule placed once took its
    first)."""
    shared = chainer.links.Linear(3, 3)
    model = chainer.Chain()
    with model.init_scope():
        model.a = shared
        model.b = shared
    opt = face(exclude_from_weight_decay=['^/b/'],
               exclude_from_layer_adaptation=['^/b/']).setup(model)
    rule = shared.W.update_rule
    assert (rule._path, rule.uses_weight_decay, rule.uses_adaptation) == (
        '/b/W', False, False)
    for p in model.params():
        p.grad = numpy.ones_like(p.array)
    opt.update()
    assert opt.observe() == {}
