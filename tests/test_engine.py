"""The engine: plans, groups, runs and observations, and the import graph."""

import ast
import copy
import functools
import gc
import io
import os
import pickle
import warnings
import weakref

import numpy
import pytest

import chainer
from chainer import optimizers

import chainer_lars
from chainer_lars import engine
from chainer_lars import fused
from chainer_lars import layout as L
from tests import lars_reference as ref
from tests import numba_util


CPU = chainer.get_device('@numpy')


def _model():
    model = ref.Net()
    ref.fill(model, 0)
    chainer_lars.LARS().setup(model)
    return model


def _plan(params):
    return engine.Plan(params, functools.partial(
        fused._depends, ('v',), [], []))


@pytest.mark.parametrize('change', [
    'nothing', 'array', 'rule', 'state', 'disabled', 'parameter',
    'rule hook'])
def test_a_plan_holds_while_the_parameters_stay_put(change):
    model = _model()
    chainer_lars.LARS().setup(model).update()  # the rules' states
    plan = _plan(list(model.params()))
    param = model.fc.W
    if change == 'array':
        param.array = param.array.copy()
    elif change == 'rule':
        param.update_rule = copy.copy(param.update_rule)
    elif change == 'state':
        param.update_rule.state['v'] = param.update_rule.state['v'].copy()
    elif change == 'disabled':
        param.update_rule.enabled = False
    elif change == 'parameter':
        with model.fc.init_scope():
            model.fc.W = chainer.Parameter(param.array)
    elif change == 'rule hook':
        param.update_rule.add_hook(lambda rule, param: None, name='h')
    assert plan.matches(list(model.params())) == (change == 'nothing')


def test_a_copy_of_a_plan_cache_is_empty():
    cache = engine.PlanCache()
    model = _model()
    cache.get(model, list(model.params()), _plan)
    assert len(cache.plans()) == 1
    assert copy.deepcopy(cache).plans() == []
    assert pickle.loads(pickle.dumps(cache)).plans() == []


def test_a_plan_cache_keeps_a_plan_while_its_owner_lives():
    cache = engine.PlanCache()
    model = _model()
    params = list(model.params())
    plan = cache.get(model, params, _plan)
    assert cache.get(model, params, None) is plan
    held = weakref.ref(params[0].array)
    del model, params, plan
    gc.collect()
    assert cache.plans() == [] and held() is None


def test_groups_by_device_and_dtype_and_key():
    arrays = [numpy.ones(3, numpy.float32), numpy.ones(3, numpy.float64),
              numpy.ones(4, numpy.float32), numpy.ones(2, numpy.float32)]
    plan = engine.Plan(arrays, lambda arrays: ([arrays], ()))
    for k, a in enumerate(arrays[:3]):
        plan.add(None, CPU, L.RESCALE, '/p{}'.format(k), a, None, a, (),
                 (k != 1, k != 2))
    plan.add('/q', CPU, L.RESCALE, '/q', arrays[3], None, arrays[3])
    groups = plan.finish(arrays).groups
    assert plan.where == [[0, 2], [1], [3]]
    assert [g.paths for g in groups] == [['/p0', '/p2'], ['/p1'], ['/q']]
    assert all(g.rows.shape == (len(g), len(L.COLUMNS)) for g in groups)
    assert [(g.uses_wd.tolist(), g.adapt.tolist()) for g in groups] == [
        ([1, 1], [1, 0]), ([0], [1]), ([1], [1])]


def test_settings_are_filled_when_their_values_change():
    plan = engine.Plan([numpy.ones(3)], lambda arrays: ([arrays], ()))
    plan.add(None, CPU, L.STEP, '/w', None, None, numpy.ones(3),
             (numpy.zeros(3),))
    group, = plan.finish().groups
    filled = []

    def fill(group, key):
        filled.append(key)
        group.rows[:, L.LR] = key[0]
        group.rows[:, L.LOSS_SCALE] = key[1]

    for key in [(0.5, 1.0), (0.5, 1.0), (0.25, 1.0), (0.25, 8.0)]:
        engine.settings(group, key, fill)
    assert filled == [(0.5, 1.0), (0.25, 1.0), (0.25, 8.0)]
    assert group.scaled and group.rows[0, L.LR] == 0.25

    def refuse(group, key):
        raise ValueError('refused')

    with pytest.raises(ValueError, match='^refused$'):
        engine.settings(group, (1.0, 1.0), refuse)
    assert group.key is None  # filled again at the next update
    engine.settings(group, (0.25, 8.0), fill)
    assert filled[-1] == (0.25, 8.0)


def test_observe_reports_rows_that_had_an_update_and_are_asked_for():
    weights = [numpy.full(4, k + 1.0, numpy.float32) for k in range(3)]
    plan = engine.Plan(weights, lambda arrays: ([arrays], ()))
    for k, w in enumerate(weights):
        plan.add(None, CPU, L.RESCALE, '/p{}'.format(k), None, None, w)
    group, = plan.finish().groups
    group.rows[:, L.ADAPT] = 1
    group.rows[:, L.TRUST_COEFFICIENT] = 1
    grads = [numpy.ones(4, numpy.float32), None,
             numpy.ones(4, numpy.float32)]
    assert engine.update(plan, [grads]) == [[1]]
    observed = engine.observe(group.last)
    assert sorted(observed) == ['/p0', '/p2']
    assert observed['/p2'] == pytest.approx((3.0, 6.0, 2.0))
    assert sorted(engine.observe(group.last, [1, 1, 0])) == ['/p0']


def test_both_faces_share_one_executor_per_device():
    opt = optimizers.MomentumSGD(lr=0.1).setup(_model())
    hook = chainer_lars.GradientLARS()
    hook(opt)
    lars = chainer_lars.LARS().setup(_model())
    lars.update()
    executors = {g.executor for p in (ref.plan_of(hook), ref.plan_of(lars))
                 for g in p.groups}
    assert executors == {engine.executor_for(CPU)}


@pytest.mark.parametrize('face', ['hook', 'lars'])
def test_the_per_array_paths_check_only_the_arrays_that_changed(
        face, monkeypatch):
    """The hook's per-array plan reads the stamps of all its groups in one
    compiled call, LARS's per-rule path stamps and steps in one. An array
    is checked when its plan is made and again only where its stamp
    changed; a gradient in another buffer is taken as it is (its stamp
    says what the check would). The steps stay those of the
    multi-tensor path."""
    numba_util.require_numba()  # the stamps are read by the compiled loop
    jit = chainer_lars.cpu._jit()
    checked, calls = [], []
    real = chainer_lars.checks.addressed
    monkeypatch.setattr(chainer_lars.checks, 'addressed',
                        lambda path, *a, **k: checked.append(path) or real(
                            path, *a, **k))
    for name in ('restamp', 'restamp_update'):
        monkeypatch.setattr(jit, name, lambda *a, _f=getattr(jit, name),
                            _n=name: calls.append(_n) or _f(*a))
    models = [ref.Net(), ref.Net()]
    for model, multi_tensor in zip(models, (False, True)):
        ref.fill(model, 0)
        if face == 'hook':
            opt = optimizers.MomentumSGD(lr=0.01).setup(model)
            opt.add_hook(chainer_lars.GradientLARS(multi_tensor=multi_tensor))
        else:
            opt = chainer_lars.LARS(multi_tensor=multi_tensor).setup(model)
        model.opt = opt
    paths = sorted(p for p, _ in models[0].namedparams())
    rng = numpy.random.RandomState(0)
    grads = {p: rng.standard_normal(a.shape).astype(a.dtype)
             for p, a in models[0].namedparams()}
    for model in models:
        for path, param in model.namedparams():
            param.grad = grads[path].copy()
    for step, change in enumerate([None, 'grad', None, 'weight']):
        for model in models:
            param = dict(model.namedparams())[paths[1]]
            if change == 'grad':  # another buffer, the same values
                param.grad = param.grad.copy()
            elif change == 'weight':  # reallocated in place
                shape = param.array.shape
                param.array.resize((4000,), refcheck=False)
                param.array.resize(shape, refcheck=False)
            del checked[:], calls[:]
            model.opt.update()
            if model is models[0]:
                first = sorted(checked), list(calls)
        # LARS's per-rule path: one call a rule; the hook's plan: one.
        one_call = (['restamp_update'] * len(paths) if face == 'lars'
                    else ['restamp'])
        if step == 0:
            assert first == (paths, one_call), step
        elif change == 'weight':
            assert first[0] == [paths[1]], step
        else:
            assert first == ([], one_call), step
    for (path, a), (_, b) in zip(sorted(models[0].namedparams()),
                                 sorted(models[1].namedparams())):
        numpy.testing.assert_array_equal(a.array, b.array, err_msg=path)


def _imports():
    """Module -> the modules of the package (not testing/) it imports."""
    root = os.path.dirname(chainer_lars.__file__)
    graph = {}
    for name in os.listdir(root):
        if not name.endswith('.py') or name == '__init__.py':
            continue
        with open(os.path.join(root, name)) as f:
            tree = ast.parse(f.read())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == (
                    'chainer_lars'):
                deps.update(a.name for a in node.names)
        graph[name[:-3]] = deps
    return graph


class _Tied(chainer.Chain):

    def __init__(self, tie):
        super(_Tied, self).__init__()
        with self.init_scope():
            # More than one block of the kernels (cuda.CHUNK elements):
            # their norms come from a launch of their own.
            self.a = chainer.links.Linear(96, 96)
            self.b = chainer.links.Linear(96, 96)
        rng = numpy.random.RandomState(0)
        for p in (self.a.W, self.b.W):
            p.array[...] = rng.uniform(0.5, 1.5, p.shape)
        if tie == 'listed twice':  # one Parameter in both links
            self.b.W = self.a.W
        elif tie == 'one array':
            self.b.W.array = self.a.W.array
        elif tie == 'a view':  # the view is listed first
            self.a.W.array = self.b.W.array.T


@pytest.mark.parametrize('device,face,tie', [
    (device, face, tie) for device in ('cpu', 'emulated')
    for face in ('lars', 'lamb', 'hook')
    for tie in ('listed twice', 'one array', 'a view')
    # MomentumSGD's own kernel, under the hook, takes no transposed view
    # on the emulated device (its ElementwiseKernel: contiguous arrays).
    if (device, face, tie) != ('emulated', 'hook', 'a view')])
def test_tied_parameters_are_stepped_one_after_another(device, face, tie):
    # Chainer steps a parameter listed twice, or two that share memory,
    # one after the other in params() order; one batched launch stepped
    # them from the same norms (and one row after a later parameter's).
    import contextlib
    from chainer_lars.testing import emulated_cupy

    def run(multi_tensor):
        on_device = device == 'emulated' and multi_tensor is not None
        xp = emulated_cupy if on_device else numpy
        model = _Tied(tie)
        if on_device:
            model.to_device('@cupy:0')
            if tie != 'listed twice':  # to_device copies: tie them again
                model = _retie(model, tie)
        if face == 'hook':  # multi_tensor None: Chainer's hook, on the CPU
            opt = optimizers.MomentumSGD(lr=0.1).setup(model)
            opt.add_hook(chainer.optimizer_hooks.GradientLARS(
                weight_decay=1e-3, eps=0.0) if multi_tensor is None else
                chainer_lars.GradientLARS(weight_decay=1e-3, eps=0.0,
                                          multi_tensor=multi_tensor))
        else:
            opt = (chainer_lars.LARS(lr=1.0, multi_tensor=multi_tensor)
                   if face == 'lars' else chainer_lars.LAMB(
                       alpha=0.1, multi_tensor=multi_tensor)).setup(model)
        for step in range(3):
            for k, (_, p) in enumerate(sorted(model.namedparams())):
                p.grad = xp.asarray(numpy.random.RandomState(
                    10 * step + k).standard_normal(p.shape).astype('f'))
            opt.update()
        return [chainer.get_device('@numpy').send(p.array)
                for _, p in sorted(model.namedparams())]

    with (emulated_cupy.installed() if device == 'emulated'
          else contextlib.nullcontext()):
        batched, each = run(True), run(False)
    if face == 'hook':  # each array's own group either way: Chainer's hook
        each = run(None)
    for path, a, b in zip(['/a/W', '/a/b', '/b/W', '/b/b'], batched, each):
        if face == 'hook':
            numpy.testing.assert_allclose(
                a, b, rtol=1e-5, atol=1e-5, err_msg=path)
        else:
            assert a.tobytes() == b.tobytes(), path
    assert not numpy.array_equal(batched[0], _Tied(tie).a.W.array)


@pytest.mark.parametrize('face', ['lars', 'lamb'])
@pytest.mark.parametrize('case', ['tied', 'rule hook', 'Adam rule',
                                  'float16 states'])
def test_a_float16_parameter_of_its_rule_keeps_the_plan_in_mixed16(
        face, case):
    # A parameter its rule steps (tied, or not batchable) gets a new float16
    # array at every update from Chainer's fp32 update: the plan follows
    # its master instead, or it would be built again at every update.
    # 'float16 states': use_fp32_update() after updates in float16 (or on
    # loading such a run's snapshot): the rules keep their float16 states
    # with the masters, as Chainer's do, and step every array themselves.
    def run(multi_tensor):
        model = chainer.Sequential(*[chainer.links.Linear(
            8, 8, initialW=numpy.linspace(-1, 1, 64).reshape(8, 8) * k)
            for k in (1, 2, 3)])
        if case == 'tied':
            model.append(model[0])  # one link twice: W and b listed twice
        for p in model.params():
            p.array = p.array.astype(numpy.float16)
        opt = (chainer_lars.LARS if face == 'lars' else chainer_lars.LAMB)(
            multi_tensor=multi_tensor).setup(model)
        if case == 'rule hook':
            model[0].W.update_rule.add_hook(lambda rule, param: None)
        elif case == 'Adam rule':
            model[0].W.update_rule = optimizers.Adam().setup(
                chainer.Link()).create_update_rule()
        builds = []
        build = opt._build_plan
        opt._build_plan = lambda params: builds.append(1) or build(params)
        for step in range(8):
            if step == (2 if case == 'float16 states' else 0):
                opt.use_fp32_update()
            for k, p in enumerate(model.params()):
                p.grad = numpy.full_like(p.array, 0.01 * (k + step + 1))
            opt.update()
            if step == (3 if case == 'float16 states' else 1):
                del builds[:]  # the first update makes the masters
        return builds, opt, [p.array for p in model.params()]

    builds, opt, batched = run(True)
    assert builds == []
    plan, = opt._plans.plans()
    assert [len(g) for g in plan.groups] == {
        'tied': [4], 'float16 states': []}.get(case, [5])
    assert len(plan.others) == {'tied': 4, 'float16 states': 6}.get(case, 1)
    if case == 'float16 states':
        states = [r.state for r in map(engine.UPDATE_RULE, plan.others)]
        assert {s.dtype for d in states for s in d.values()} == {
            numpy.dtype(numpy.float16)}
        for a, b in zip(batched, run(False)[2]):
            assert a.tobytes() == b.tobytes()


def _retie(model, tie):
    if tie == 'one array':
        model.b.W.array = model.a.W.array
    else:
        model.a.W.array = model.b.W.array.T
    return model


def _npz(obj):
    saved = io.BytesIO()
    chainer.serializers.save_npz(saved, obj)
    return saved.getvalue()


class _Layouts(chainer.Chain):

    def __init__(self, layout, dtype):
        super(_Layouts, self).__init__()
        rng = numpy.random.RandomState(0)
        with chainer.using_config('compute_mode', 'cudnn_fast' if layout
                                  else 'default'), chainer.using_config(
                                      'dtype', numpy.dtype(dtype)):
            with self.init_scope():  # W: out, kh, kw, in in memory
                self.conv = chainer.links.Convolution2D(
                    5, 6, 3, initialW=rng.uniform(-1, 1, (6, 5, 3, 3)))
                self.fc = chainer.links.Linear(
                    6, 4, initialW=rng.uniform(-1, 1, (4, 6)))
        assert (self.conv.W.layout is not None) == layout

    def semantic(self, path, a):  # an array of path in its semantic order
        param = dict(self.namedparams())[path]
        return chainer.memory_layouts._transpose_array(a, param.layout, None)


@pytest.mark.parametrize('device,face,dtype', [
    pytest.param(device, face, dtype, marks=[pytest.mark.gpu] * (
        device == 'cuda')) for device in ('cpu', 'emulated', 'cuda')
    for face in ('lars', 'lamb', 'hook')
    for dtype in ('float32', 'float16', 'mixed16')
    if device == 'cpu' or dtype != 'float16'])
def test_parameters_in_cudnn_layouts_train_as_in_the_standard_one(
        device, face, dtype):
    # compute_mode='cudnn_fast' keeps a convolution's W channel-last: its
    # raw array a permutation of the standard one's. Chainer's MomentumSGD
    # steps it; the faces raised RuntimeError (array of a layout).
    import contextlib
    from chainer_lars.testing import emulated_cupy

    def make(model, multi_tensor):
        hook = None
        if face == 'hook':
            opt = optimizers.MomentumSGD(lr=0.1).setup(model)
            hook = chainer_lars.GradientLARS(weight_decay=1e-3,
                                             multi_tensor=multi_tensor)
            opt.add_hook(hook)
        else:
            opt = (chainer_lars.LARS(lr=1.0, multi_tensor=multi_tensor)
                   if face == 'lars' else chainer_lars.LAMB(
                       alpha=0.1, multi_tensor=multi_tensor)).setup(model)
        if dtype == 'mixed16':  # dynamic: a NaN skips an update; static
            opt.use_fp32_update()  # under MomentumSGD, whose NaN check
            opt.loss_scaling(  # refuses layouts (Chainer's own limit)
                interval=2, scale=8.0 if face == 'hook' else None)
        return opt, hook

    def step(model, opt, xp, t, hook=None):
        for k, (path, p) in enumerate(sorted(model.namedparams())):
            g = numpy.random.RandomState(10 * t + k).standard_normal(
                p.shape).astype(p.dtype) * (opt._loss_scale or 1)
            if (dtype, t, path) == ('mixed16', 2, '/conv/W') and not hook:
                g[0, 0, 0, 0] = numpy.nan  # in the layout's gradient
            g = chainer.memory_layouts._transpose_array(g, None, p.layout)
            p._set_grad_without_check(None if (t, path) == (1, '/conv/W')
                                      else xp.asarray(
                                          numpy.ascontiguousarray(g)))
            p._loss_scale = opt._loss_scale  # as backward() sets it
        if t == 1:  # zeros for the missing gradient, its raw shape
            opt.reallocate_cleared_grads()
        before = [CPU.send(p.raw_array).copy() for p in model.params()]
        opt.update()
        skipped = [numpy.array_equal(a, CPU.send(p.raw_array))
                   for a, p in zip(before, model.params())]
        assert skipped == [(dtype, t) == ('mixed16', 2) and not hook] * 4

    def run(layout, multi_tensor):
        xp = {'cpu': numpy, 'emulated': emulated_cupy}.get(
            device, chainer.backends.cuda.cupy)
        model = _Layouts(layout, 'float32' if dtype == 'float32'
                         else 'float16')
        if device != 'cpu':
            model.to_device('@cupy:0')
        opt, hook = make(model, multi_tensor)
        # A rule's own value (optimizer.update() checks it, of the layout)
        setattr(model.conv.W.update_rule.hyperparam,
                'alpha' if face == 'lamb' else 'lr', 0.05)
        builds = []
        plans = hook or opt
        build = plans._build_plan
        plans._build_plan = lambda *a: builds.append(1) or build(*a)
        for t in range(4):
            step(model, opt, xp, t, hook)
            if t == 1:
                del builds[:]  # made: the masters, then the plan
        assert builds == []  # the plan holds
        if multi_tensor:  # the layout's array batched as the others are,
            plan, = plans._plans.plans()  # but where noted
            batched = {('hook', 'float16'): 0}.get((face, dtype), 4)
            if (layout and device == 'cpu' and dtype == 'mixed16'
                    and face != 'hook'):  # a transposed view: its rule's
                batched = 3
            assert sum(map(len, plan.groups)) == batched
            assert len(plan.others) == 4 - batched
        observed = sorted((hook or opt).observe().items())
        states = [dict(p.update_rule.state) for p in model.params()]
        snapshots = [_npz(opt), _npz(chainer_lars.LossScaleState(opt))]
        new, _ = make(model, multi_tensor)  # loads them, then steps on
        chainer.serializers.load_npz(io.BytesIO(snapshots[0]), new)
        chainer.serializers.load_npz(io.BytesIO(snapshots[1]),
                                     chainer_lars.LossScaleState(new))
        assert new._loss_scale == opt._loss_scale
        for state, param in zip(states, model.params()):
            assert sorted(state) == sorted(param.update_rule.state)
            for key, value in state.items():
                assert numpy.array_equal(*map(  # loaded: on the host
                    CPU.send, (param.update_rule.state[key], value))), key
        step(model, new, xp, 4)
        return observed, [
            model.semantic(path, chainer.get_device('@numpy').send(
                p.raw_array)) for path, p in sorted(model.namedparams())]

    with (emulated_cupy.installed() if device == 'emulated'
          else contextlib.nullcontext()), warnings.catch_warnings():
        warnings.filterwarnings(  # the NaN, plain float16 at lr 0.05
            'ignore', 'Non finite number|.* rounded away in float16')
        observed, standard = run(False, True)
        for multi_tensor in (True, False):
            seen, arrays = run(True, multi_tensor)
            assert [k for k, _ in seen] == [k for k, _ in observed]
            # Norms are sums in another order: float64 on the CPU, where
            # the steps agree to the bit; the kernels' float32 on a device.
            rtol = 1e-12 if device == 'cpu' else 1e-5
            numpy.testing.assert_allclose(
                [v for _, v in seen], [v for _, v in observed], rtol=rtol)
            for a, b in zip(arrays, standard):
                if device == 'cpu':
                    assert a.tobytes() == b.tobytes(), multi_tensor
                else:
                    numpy.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize('face', ['MomentumSGD', 'LARS', 'LAMB'])
def test_the_users_hooks_see_layouts_as_chainers_update_shows_them(face):
    # Only the faces' own reads take raw arrays: a hook of the user's that
    # reads a layout's array is refused, as under Chainer's update.
    model = _Layouts(True, 'float32')
    opt = getattr(optimizers if face == 'MomentumSGD' else chainer_lars,
                  face)()
    opt.setup(model)
    seen = []

    def hook(optimizer):
        try:
            seen.append(model.conv.W.array.shape)
        except RuntimeError as e:
            seen.append(str(e))
    opt.add_hook(hook, name='reads')
    for p in model.params():
        p._set_grad_without_check(numpy.ones_like(p.raw_array))
    opt.update()
    assert seen == ['Cannot directly retrieve the underlying array from a '
                    'variable with non-standard layout.']
    assert not numpy.array_equal(model.conv.W.raw_array,
                                 _Layouts(True, 'float32').conv.W.raw_array)


def test_raw_arrays_passes_keywords_and_restores_the_flag():
    model = _Layouts(True, 'float32')

    @engine.raw_arrays
    def read(param, scale=1):
        """Reads a layout's array."""
        if scale == 0:
            raise ZeroDivisionError
        return param.array.shape

    assert read(param=model.conv.W, scale=2) == (6, 3, 3, 5)
    assert (read.__name__, read.__doc__) == (
        'read', 'Reads a layout\'s array.')
    with pytest.raises(ZeroDivisionError):
        read(model.conv.W, 0)
    with pytest.raises(RuntimeError, match='non-standard layout'):
        model.conv.W.array


def test_tied_marks_the_arrays_that_share_memory():
    a, b, c = (chainer.Parameter(numpy.ones((2, 3), numpy.float32))
               for _ in range(3))
    lazy, other = chainer.Parameter(), chainer.Parameter()
    assert engine.tied([a, b, lazy, other]) == [False] * 4
    c.array = b.array.T
    assert engine.tied([a, b, c, lazy, other]) == [
        False, True, True, False, False]
    assert engine.tied([a, b, a]) == [True, False, True]
    c.array = numpy.frombuffer(b.array.tobytes(), numpy.float32).reshape(2, 3)
    assert engine.tied([b, c]) == [False, False]  # a copy's own buffer


def test_the_modules_import_each_other_without_a_cycle():
    graph = _imports()
    assert graph['layout'] == set()
    assert graph['engine'] >= {'cpu', 'cuda', 'layout'}
    for low in ('cpu', 'cuda', '_numba', 'ratio', 'layout'):
        assert not graph[low] & {'engine', 'hook', 'fused', 'lars', 'lamb',
                                 'optimizer'}, low
    # The faces share the fused base; none imports another face.
    assert graph['lars'] >= {'fused'} and graph['lamb'] >= {'fused'}
    assert not graph['fused'] & {'hook', 'lars', 'lamb', 'optimizer'}
    done, active = set(), []

    def visit(name):
        assert name not in active, 'import cycle: {}'.format(
            ' -> '.join(active + [name]))
        if name in done or name not in graph:
            return
        active.append(name)
        for dep in graph[name]:
            visit(dep)
        active.pop()
        done.add(name)

    for name in graph:
        visit(name)
