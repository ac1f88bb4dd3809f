"""What the faces hold, count and say: nothing of a model kept alive once
its optimizer is gone, ``t`` counted once, float16 steps that round away
warned of, and misuses refused in our words."""

import copy
import gc
import linecache
import pickle
import warnings
import weakref

import numpy
import pytest

import chainer
from chainer import optimizers

import chainer_lars
from tests import lars_reference as ref


def _faces():
    return {
        'hook': lambda: (optimizers.MomentumSGD(lr=0.01),
                         chainer_lars.GradientLARS(weight_decay=1e-3)),
        'hook per array': lambda: (
            optimizers.MomentumSGD(lr=0.01),
            chainer_lars.GradientLARS(multi_tensor=False)),
        'lars': lambda: (chainer_lars.LARS(lr=0.5), None),
        'lars per rule': lambda: (chainer_lars.LARS(multi_tensor=False),
                                  None),
        'lamb': lambda: (chainer_lars.LAMB(alpha=0.01), None),
    }


def _train(face, dtype, steps=3, hook=None):
    """A model trained ``steps`` updates; returns it, its optimizer and the
    hook (``hook``: the one to register, kept by the caller)."""
    model = ref.Net(numpy.float16 if dtype != 'float32' else numpy.float32)
    ref.fill(model, 0)
    opt, made = _faces()[face]()
    hook = hook or made
    opt.setup(model)
    if hook is not None:
        opt.add_hook(hook)
    if dtype == 'mixed16':
        opt.use_fp32_update()
        opt.loss_scaling()
    with warnings.catch_warnings():  # the float16 steps' own warning
        warnings.simplefilter('ignore', RuntimeWarning)
        for step in range(steps):
            x, t = ref.batch(step, dtype=model.fc.W.dtype)
            opt.update(ref.loss_fn(model, x, t))
    return model, opt, hook


def _arrays(model):
    """Weak references to every parameter, array, gradient, state buffer
    and master copy of ``model``."""
    held = []
    for param in model.params():
        rule = param.update_rule
        held += [param, param.array, param.grad]
        held += [a for a in (rule.state or {}).values()]
        if rule._fp32_param is not None:
            held += [rule._fp32_param, rule._fp32_param.array]
    return [weakref.ref(a) for a in held if a is not None]


@pytest.mark.parametrize('dtype', ['float32', 'float16', 'mixed16'])
@pytest.mark.parametrize('face', sorted(_faces()))
def test_nothing_of_a_model_is_kept_once_its_optimizer_is_gone(face, dtype):
    """A hook kept across the runs of a sweep, and the copies of an
    optimizer, hold nothing of a model whose optimizer was deleted."""
    hook = chainer_lars.GradientLARS() if face.startswith('hook') else None
    model, opt, hook = _train(face, dtype, hook=hook)
    refs = _arrays(model)
    copies = [copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))]
    observed = (hook or opt).observe()
    assert observed
    del model, opt
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
    if hook is not None:
        # The last update's observations are only floats: still there.
        assert hook.observe() == observed
        _train(face, dtype, hook=hook)  # the next run of the sweep
    for other in copies:  # they go on alone
        x, t = ref.batch(9, dtype=other.target.fc.W.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', RuntimeWarning)
            other.update(ref.loss_fn(other.target, x, t))


def _rule_hooks(model):
    return [h for p in model.params()
            for h in p.update_rule._hookable._pre_update_hooks.values()]


@pytest.mark.parametrize('dtype', ['float32', 'float16', 'mixed16'])
@pytest.mark.parametrize('face', ['hook', 'hook per array'])
def test_a_model_kept_after_training_lets_the_hook_go(face, dtype):
    """A model kept for inference once its optimizer is deleted holds no
    hook: its float16 rules' delegates held the hook, and with it its
    plans and last observations (on a GPU, device buffers), for the
    model's life. A copy of the model alone carries no hook either."""
    model, opt, hook = _train(face, dtype)
    assert len(_rule_hooks(model)) == (
        0 if dtype == 'float32' else len(list(model.params())))
    copied = copy.deepcopy(model)  # while the hook lives
    gone = weakref.ref(hook)
    del opt, hook
    gc.collect()
    assert gone() is None
    for other in (model, copied, pickle.loads(pickle.dumps(model))):
        assert [h.hook() for h in _rule_hooks(other)] == [None] * len(
            _rule_hooks(model))
        # A rule's own update passes the dead delegate by: the step of
        # the same rule without it.
        plain = copy.deepcopy(other)
        for param in plain.params():
            for name in list(param.update_rule._hookable._pre_update_hooks):
                param.update_rule.remove_hook(name)
        for param, twin in zip(other.params(), plain.params()):
            param.grad = numpy.ones_like(param.array)
            twin.grad = numpy.ones_like(twin.array)
            twin._loss_scale = param._loss_scale  # (not deep-copied)
            before = param.array.copy()
            param.update()
            twin.update()
            assert (param.array != before).any()
            assert param.array.tobytes() == twin.array.tobytes()


def test_a_float16_delegate_drops_its_copy_of_the_weights_once_warned():
    """The copy of each float16 weight kept to see steps that round away
    was kept for good once the hook had warned: the delegate that warns
    drops its own at once, the others at their next call (here in the
    same update)."""
    model = _float16_model()
    opt = optimizers.MomentumSGD(lr=1e-5).setup(model)
    opt.add_hook(chainer_lars.GradientLARS())
    delegates = []
    with pytest.warns(RuntimeWarning, match='rounded away'):
        while not opt._hookable._pre_update_hooks['GradientLARS']._warned:
            assert opt.t < 5
            _step(model, opt)
            delegates = _rule_hooks(model)
            kept = [d._before is not None for d in delegates]
    assert len(delegates) == 2 and kept == [False, False]


@pytest.mark.parametrize('dtype', ['float32', 'float16', 'mixed16'])
@pytest.mark.parametrize('face', sorted(_faces()))
def test_nothing_of_a_model_is_kept_once_its_optimizer_takes_another(
        face, dtype):
    """``optimizer.setup(new_model)`` (one optimizer refitting models in
    a loop) lets the last model go at once: its arrays were kept until
    the next update, both models in memory while the new plan was built."""
    model, opt, hook = _train(face, dtype)
    refs = _arrays(model)
    before = (hook or opt).observe()
    other = ref.Net(model.fc.W.dtype)
    ref.fill(other, 1)
    opt.setup(other)
    if hook is not None:  # Chainer's setup() drops the optimizer's hooks
        opt.add_hook(hook)
    del model
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
    x, t = ref.batch(0, dtype=other.fc.W.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        opt.update(ref.loss_fn(other, x, t))  # the new model trains
    after = (hook or opt).observe()
    assert sorted(after) == sorted(before)
    assert after != before


@pytest.mark.parametrize('dtype', ['float32', 'float16', 'mixed16'])
@pytest.mark.parametrize('face', sorted(_faces()))
def test_arrays_replaced_are_let_go_at_the_next_update(face, dtype):
    """Weights and states replaced (as ``model.to_cpu()`` replaces a GPU
    model's) are held until the next update, no longer: the rules' own
    plans of the first update kept them for good under the batched path."""
    model, opt, hook = _train(face, dtype)
    old = [p.array for p in model.params()] + [
        a for p in model.params() for a in p.update_rule.state.values()]
    refs = [weakref.ref(a) for a in old]
    for param in model.params():
        param.array = param.array.copy()
        state = param.update_rule.state
        state.update({key: a.copy() for key, a in state.items()})
    del old
    x, t = ref.batch(5, dtype=model.fc.W.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        opt.update(ref.loss_fn(model, x, t))
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


@pytest.mark.parametrize('multi_tensor', [True, False])
@pytest.mark.parametrize('face', [chainer_lars.LARS, chainer_lars.LAMB])
def test_t_is_counted_once_a_rule(face, multi_tensor):
    """The batched update counts the steps of the rules it stepped; a rule
    left to its own path (a mixed16 row of a strided gradient, which its
    rule converts) counts its own, once, and sees the optimizer's t while
    it steps."""
    model = ref.Net(numpy.float16)
    ref.fill(model, 0)
    opt = face(multi_tensor=multi_tensor).setup(model)
    opt.use_fp32_update()
    seen = []
    rule = model.fc.b.update_rule
    original = rule.update_core_cpu
    rule.update_core_cpu = lambda param: seen.append(rule.t) or original(
        param)
    rng = numpy.random.RandomState(0)
    for step in range(4):
        for param in model.params():
            g = rng.standard_normal(param.shape).astype(numpy.float16)
            param.grad = g if param is not model.fc.b else numpy.repeat(
                g, 2)[::2]
        opt.update()
        assert [p.update_rule.t for p in model.params()] == [opt.t] * len(
            ref.PATHS)
    assert seen == [1, 2, 3, 4]
    if multi_tensor:  # batched once the masters were made, /fc/b left
        group, = ref.plan_of(opt).groups
        assert group.mixed16 and sorted(group.paths) == sorted(ref.PATHS)


def _float16_model(w=1.0):
    model = chainer.Link()
    with model.init_scope():
        model.w = chainer.Parameter(numpy.full(64, w, numpy.float16))
        model.b = chainer.Parameter(numpy.linspace(-1, 1, 64).astype(
            numpy.float16))
    return model


def _step(model, opt, grad=1e-2):
    for param in model.params():
        param.grad = numpy.full(param.shape, grad, param.dtype)
    opt.update()


#: Each face with steps that round away in float16, then that do not.
FLOAT16 = [
    ('LARS', lambda: chainer_lars.LARS(lr=1e-3),
     lambda: chainer_lars.LARS(lr=100.0), None),
    ('LAMB', lambda: chainer_lars.LAMB(alpha=1e-5),
     lambda: chainer_lars.LAMB(alpha=0.1), None),
    ('LARS', lambda: chainer_lars.LARS(lr=1e-3, multi_tensor=False),
     lambda: chainer_lars.LARS(lr=100.0, multi_tensor=False), None),
    ('LAMB', lambda: chainer_lars.LAMB(alpha=1e-5, multi_tensor=False),
     lambda: chainer_lars.LAMB(alpha=0.1, multi_tensor=False), None),
    ('GradientLARS', lambda: optimizers.MomentumSGD(lr=1e-5),
     lambda: optimizers.MomentumSGD(lr=0.1), chainer_lars.GradientLARS),
]


@pytest.mark.parametrize('face, small, large, hook', FLOAT16)
def test_a_float16_step_that_rounds_away_is_warned_of_once(face, small,
                                                           large, hook):
    model = _float16_model()
    opt = small().setup(model)
    if hook is not None:
        opt.add_hook(hook())
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(4):
            _step(model, opt)
    rounded = [w for w in caught if 'rounded away' in str(w.message)]
    messages = [str(w.message) for w in rounded]
    assert len(messages) == 1, messages
    assert messages[0].startswith(face + ': the step of /')
    # It points at the user's call of update(), not into the library.
    assert (rounded[0].filename, linecache.getline(
        rounded[0].filename, rounded[0].lineno).strip()) == (
            __file__, 'opt.update()')
    assert 'optimizer.use_fp32_update()' in messages[0]


@pytest.mark.parametrize('face, small, large, hook', FLOAT16)
def test_float16_steps_that_move_or_master_copies_are_not_warned_of(
        face, small, large, hook):
    for make, fp32_update in ((large, False), (small, True)):
        model = _float16_model()
        opt = make().setup(model)
        if hook is not None:
            opt.add_hook(hook())
        if fp32_update:
            opt.use_fp32_update()
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            for _ in range(4):
                _step(model, opt)


@pytest.mark.parametrize('face, small, large, hook', FLOAT16)
def test_rows_without_a_gradient_are_not_steps_that_rounded_away(
        face, small, large, hook):
    # An embedding's rows that no example used have a zero gradient and
    # stand still (no weight decay): only the rows that moved are steps.
    model = _float16_model()
    opt = large().setup(model)
    if face == 'LARS':
        opt.weight_decay = 0.0
    elif face == 'LAMB':
        opt.weight_decay_rate = 0.0
    if hook is not None:
        opt.add_hook(hook())
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        for _ in range(4):
            w = model.w.array.copy()
            for param in model.params():
                param.grad = numpy.zeros(param.shape, param.dtype)
                param.grad[:8] = 1e-2
            opt.update()
            assert (model.w.array[:8] != w[:8]).all()


@pytest.mark.parametrize('make', [chainer_lars.LARS, chainer_lars.LAMB])
def test_an_update_before_setup_says_to_call_setup(make):
    with pytest.raises(RuntimeError, match=(
            r'^{} is not set up: call optimizer.setup\(link\) first'.format(
                make.__name__))):
        make().update()


@pytest.mark.parametrize('name, words', [
    ('lr', r"'lr': its rate is alpha, as in chainer.optimizers.Adam .*"
           r"LAMB\(alpha=\.\.\.\)"),
    ('weight_decay', r"LAMB\(weight_decay_rate=\.\.\.\)"),
    ('momentum', r"LAMB\(beta1=\.\.\.\)"),
    ('nesterov', r"'nesterov'$"),
])
def test_lamb_points_to_adams_names(name, words):
    with pytest.raises(TypeError, match='^LAMB\\(\\) got an unexpected '
                       'keyword argument .*' + words):
        chainer_lars.LAMB(**{name: 0.01})


@pytest.mark.parametrize('moved', [1, 0], ids=['half moved', 'none moved'])
@pytest.mark.parametrize('face', ['LARS', 'LARS per rule', 'GradientLARS'])
def test_a_step_rounded_away_for_half_of_an_array_is_not_warned_of(face,
                                                                   moved):
    # "Most of its elements": one of two rounded away is no warning; both
    # (the control) are.
    model = chainer.Link()
    with model.init_scope():
        model.W = chainer.Parameter(numpy.ones(2, numpy.float16))
    if face == 'GradientLARS':
        opt = optimizers.MomentumSGD(lr=1e-2, momentum=0.0).setup(model)
        opt.add_hook(chainer_lars.GradientLARS(
            exclude_from_layer_adaptation=['W']))
    else:
        opt = chainer_lars.LARS(
            lr=1e-2, momentum=0.0, weight_decay=0.0,
            exclude_from_layer_adaptation=['W'],
            multi_tensor=face == 'LARS').setup(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for _ in range(3):
            model.W.grad = numpy.array([1.0 if moved else 1e-4, 1e-4],
                                       numpy.float16)
            opt.update()
    rounded = [w for w in caught if 'rounded away' in str(w.message)]
    assert model.W.array[1] == 1.0 and (model.W.array[0] < 1.0) == moved
    assert len(rounded) == (0 if moved else 1), rounded
