"""The engine: plans, groups, runs and observations, and the import graph."""

import ast
import copy
import os
import pickle

import numpy
import pytest

import chainer
from chainer import optimizers

import chainer_lars
from chainer_lars import engine
from chainer_lars import layout as L
from tests import lars_reference as ref


CPU = chainer.get_device('@numpy')


def _model():
    model = ref.Net()
    ref.fill(model, 0)
    chainer_lars.LARS().setup(model)
    return model


def _plan(model):
    return engine.Plan(list(model.params()), lambda rules: [
        r.enabled for r in rules], states=True)


@pytest.mark.parametrize('change', [
    'nothing', 'array', 'rule', 'state', 'disabled', 'parameter'])
def test_a_plan_holds_while_the_parameters_stay_put(change):
    model = _model()
    chainer_lars.LARS().setup(model).update()  # the rules' states
    plan = _plan(model)
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
    assert plan.matches(list(model.params())) == (change == 'nothing')


def test_a_copy_of_a_plan_cache_is_empty():
    cache = engine.PlanCache()
    cache.plan = _plan(_model())
    assert copy.deepcopy(cache).plan is None
    assert pickle.loads(pickle.dumps(cache)).plan is None


def test_groups_by_device_and_dtype_and_key():
    plan = engine.Plan([], list)
    arrays = [numpy.ones(3, numpy.float32), numpy.ones(3, numpy.float64),
              numpy.ones(4, numpy.float32), numpy.ones(2, numpy.float32)]
    for k, a in enumerate(arrays[:3]):
        plan.add(None, CPU, '/p{}'.format(k), a, None, a, (),
                 (k != 1, k != 2))
    plan.add('/q', CPU, '/q', arrays[3], None, arrays[3])
    groups = plan.finish(arrays).groups
    assert plan.where == [[0, 2], [1], [3]]
    assert [g.paths for g in groups] == [['/p0', '/p2'], ['/p1'], ['/q']]
    assert all(g.rows.shape == (len(g), len(L.COLUMNS)) for g in groups)
    assert [g.static.tolist() for g in groups] == [
        [[1, 1], [1, 0]], [[0], [1]], [[1], [1]]]


def test_a_group_of_one_is_kept_while_its_arrays_are():
    w, v = numpy.ones(3, numpy.float32), numpy.zeros(3, numpy.float32)
    one = engine.group_of_one(None, CPU, '/w', w, (v,))
    assert engine.group_of_one(one, CPU, '/w', w, (v,)) is one
    assert engine.group_of_one(one, CPU, '/w', w.copy(), (v,)) is not one
    assert engine.group_of_one(one, CPU, '/w', w, (v.copy(),)) is not one


def test_observe_reports_rows_that_had_an_update_and_are_asked_for():
    weights = [numpy.full(4, k + 1.0, numpy.float32) for k in range(3)]
    group = engine.Group(CPU, numpy.float32)
    for k, w in enumerate(weights):
        group.add('/p{}'.format(k), None, None, w)
    group.prepare()
    group.rows[:, L.ADAPT] = 1
    group.rows[:, L.TRUST_COEFFICIENT] = 1
    grads = [numpy.ones(4, numpy.float32), None,
             numpy.ones(4, numpy.float32)]
    assert engine.run(group, grads, L.RESCALE) == [1]
    observed = engine.observe(group)
    assert sorted(observed) == ['/p0', '/p2']
    assert observed['/p2'] == pytest.approx((3.0, 6.0, 2.0))
    assert sorted(engine.observe(group, [1, 1, 0])) == ['/p0']


def test_both_faces_share_one_executor_per_device():
    opt = optimizers.MomentumSGD(lr=0.1).setup(_model())
    hook = chainer_lars.GradientLARS()
    hook(opt)
    lars = chainer_lars.LARS().setup(_model())
    lars.update()
    executors = {g.executor for p in (hook._plans.plan, lars._plans.plan)
                 for g in p.groups}
    assert executors == {engine.executor_for(CPU)}


@pytest.mark.parametrize('face', ['hook', 'lars'])
def test_the_per_array_paths_check_only_the_arrays_that_changed(
        face, monkeypatch):
    """The hook's per-array plan stamps all its groups in one call and
    LARS's per-rule path stamps and steps in one: each checks again
    exactly the arrays whose stamps changed, and the steps stay those of
    the multi-tensor path."""
    if chainer_lars.cpu.backend() != 'numba':
        pytest.skip('stamps are read by the compiled loop')
    checked, stamped = [], []
    real = chainer_lars.checks.addressed
    monkeypatch.setattr(chainer_lars.checks, 'addressed',
                        lambda path, *a, **k: checked.append(path) or real(
                            path, *a, **k))
    # A group's own stamps are read where the one call found a change.
    executor = type(chainer_lars.cpu.executor)
    changed = executor.changed
    monkeypatch.setattr(executor, 'changed', lambda self, group, grads: (
        stamped.extend(group.paths) or changed(self, group, grads)))
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
    for step, change in enumerate([None, None, paths[-1], None, paths[1]]):
        for model in models:
            if change is not None:  # another buffer, the same values
                param = dict(model.namedparams())[change]
                param.grad = param.grad.copy()
            del checked[:], stamped[:]
            model.opt.update()
            if model is models[0]:
                first = sorted(checked), sorted(stamped)
        want = [] if change is None else [change]
        assert first == ((paths, paths) if step == 0 else (want, want)), step
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


def test_the_modules_import_each_other_without_a_cycle():
    graph = _imports()
    assert graph['layout'] == set()
    assert graph['engine'] >= {'cpu', 'cuda', 'layout'}
    for low in ('cpu', 'cuda', '_numba', 'ratio', 'layout'):
        assert not graph[low] & {'engine', 'hook', 'optimizer'}, low
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
