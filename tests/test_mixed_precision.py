"""Mixed precision end to end: the loss-scaling state in snapshots, and runs
in float16 that stop, resume and skip updates as uninterrupted ones do.

The library's part runs a small trainer of its own (float16 weights, float32
master copies, dynamic or static loss scaling) on the CPU and on the
emulated GPU; the examples' part runs the trainers with ``--dtype`` on
conftest.py's tiny datasets.
"""

import io
import os
import re
import warnings

import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import optimizers
from chainer import serializers
from chainer import training
from chainer.training import extensions

import chainer_lars
from chainer_lars import fused
from chainer_lars.testing import emulated_cupy


# -- The library: a small float16 trainer ----------------------------------

N, BATCH, EPOCHS = 48, 16, 3  # 3 updates an epoch, 9 in all


def dataset(x_scale=1.0):
    """Inputs in float16 and labels from a fixed linear teacher;
    ``x_scale`` makes the gradients large enough to overflow float16
    under a large loss scale."""
    random = numpy.random.RandomState(1)
    x = random.randn(N, 12)
    t = (x @ random.randn(12, 4)).argmax(axis=1).astype(numpy.int32)
    return chainer.datasets.TupleDataset(
        (x * x_scale).astype(numpy.float16), t)


def make_optimizer(face):
    if face in ('lars', 'lars-per-rule'):
        # multi_tensor=False: Chainer's own GradientMethod.update.
        return chainer_lars.LARS(lr=0.5, trust_coefficient=0.02,
                                 exclude_from_layer_adaptation=['/b$'],
                                 multi_tensor=face == 'lars')
    return optimizers.MomentumSGD(lr=0.05)


def trainer_for(face, out, scale=None, initial=None, x_scale=1.0,
                device='@numpy', state=None):
    """A trainer of a float16 MLP; ``scale``: a static loss scale, else
    dynamic scaling from ``initial`` (Chainer's 1 if None). Its log has,
    after every update, the loss, the scale of the next update and the
    number of updates the first weight's rule made (``rule_t``: the
    others were skipped). ``state``: add LossScaleState (default: for
    Chainer's optimizers only; LARS saves its state itself)."""
    numpy.random.seed(0)
    with chainer.using_config('dtype', numpy.float16):
        model = L.Classifier(chainer.Sequential(
            L.Linear(12, 16), F.relu, L.Linear(16, 4)))
    model.to_device(device)
    optimizer = make_optimizer(face)
    optimizer.setup(model)
    if face == 'momentum-lars':
        optimizer.add_hook(chainer_lars.GradientLARS(
            trust_coefficient=0.02, exclude_from_layer_adaptation=['/b$']))
    optimizer.loss_scaling(scale=scale)
    if initial is not None:
        optimizer._loss_scale = initial
    optimizer.use_fp32_update()
    iterator = chainer.iterators.SerialIterator(dataset(x_scale), BATCH,
                                                shuffle=False)
    target = chainer.get_device(device)

    # The model is on its device already (the updater's to_gpu does not
    # take the emulated one): the batches are sent there.
    @chainer.dataset.converter()
    def to_device(batch, _):
        return chainer.dataset.concat_examples(batch, device=target)
    updater = training.updaters.StandardUpdater(iterator, optimizer,
                                                converter=to_device)
    trainer = training.Trainer(updater, (EPOCHS, 'epoch'), out=out)
    if state or state is None and face not in ('lars', 'lars-per-rule'):
        trainer.extend(chainer_lars.LossScaleState(optimizer))

    @training.make_extension(trigger=(1, 'iteration'),
                             priority=training.PRIORITY_WRITER)
    def scale(trainer):
        chainer.report({'scale': optimizer._loss_scale,
                        'rule_t': optimizer.target.predictor[0].W
                        .update_rule.t})
    trainer.extend(scale)
    trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
    return trainer


def run(trainer, resume=None):
    """Runs ``trainer``; returns its log (no times), its weights, the
    warnings it gave."""
    if resume is not None:
        serializers.load_npz(resume, trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        trainer.run()
    model = trainer.updater.get_optimizer('main').target
    weights = {path: chainer.backends.cuda.to_cpu(p.array)
               for path, p in model.namedparams()}
    log = [{k: v for k, v in entry.items() if k != 'elapsed_time'}
           for entry in trainer.get_extension('LogReport').log]
    return log, weights, [str(w.message) for w in caught]


def assert_same_run(a, b):
    (log_a, weights_a, _), (log_b, weights_b, _) = a, b
    assert log_a == log_b
    assert sorted(weights_a) == sorted(weights_b)
    for path in weights_a:
        assert weights_a[path].dtype == numpy.float16
        assert weights_a[path].tobytes() == weights_b[path].tobytes(), path


def check_resume(tmp_path, face, device='@numpy', **kwargs):
    """A run, and the run resumed from its snapshot of epoch 1, as if it
    had stopped there: the same log and weights."""
    whole = run(trainer_for(face, str(tmp_path / 'whole'), device=device,
                            **kwargs))
    resumed = run(trainer_for(face, str(tmp_path / 'resumed'),
                              device=device, **kwargs),
                  resume=str(tmp_path / 'whole' / 'snapshot_iter_3'))
    # The resumed log starts with the snapshot's LogReport's.
    assert_same_run(resumed, whole)
    return whole


# Overflow: from 2 ** 24 the dynamic scale comes down to one the float16
# gradients fit, skipping the first updates. (A snapshot must come after
# the first update made: Chainer 7.8.1 cannot load one written before its
# update rules made their state.)
OVERFLOW = dict(initial=2.0 ** 24, x_scale=4.0)


@pytest.mark.parametrize('face', ['lars', 'momentum-lars'])
@pytest.mark.parametrize('scaling', [
    dict(), dict(scale=256.0), OVERFLOW])
def test_float16_run_resumes_exactly(tmp_path, face, scaling):
    log, _, _ = check_resume(tmp_path, face, **scaling)
    assert all(numpy.isfinite(e['main/loss']) for e in log[-3:])
    if scaling == OVERFLOW:
        # Skipped: the first two updates; the scale then grows slowly, as
        # it does once an update has overflowed (restored on resuming).
        assert [e['rule_t'] for e in log] == [0, 0] + list(range(1, 8))
        assert [e['scale'] for e in log[:2]] == [65504.0, 32752.0]
        scales = [32752.0]
        for _ in range(7):
            scales.append(scales[-1] * 2.0 ** (1 / 1000))
        assert [e['scale'] for e in log[2:]] == scales[1:]
    elif not scaling:
        # Dynamic from 1: doubled after each update, none skipped.
        assert [e['scale'] for e in log] == [2.0 ** i for i in range(1, 10)]


def test_resume_without_the_state_is_another_run(tmp_path):
    """What LossScaleState is for: Chainer's optimizer restarts the scale
    at 1 and the master copies from the float16 weights."""
    kwargs = dict(face='momentum-lars', scale=None, state=False)
    whole = run(trainer_for(out=str(tmp_path / 'whole'), **kwargs))
    log, _, _ = run(trainer_for(out=str(tmp_path / 'resumed'), **kwargs),
                    resume=str(tmp_path / 'whole' / 'snapshot_iter_3'))
    assert log[3]['scale'] == 2.0 != whole[0][3]['scale']


@pytest.mark.parametrize('face', ['lars', 'momentum-lars'])
def test_overflow_skips_updates_as_chainer_does(tmp_path, face):
    """The same scales, skips, warnings and weights as Chainer's own
    update loop (GradientMethod.update: LARS with multi_tensor=False), and,
    while updates are skipped, as Chainer's MomentumSGD."""
    chainers = {'lars': 'lars-per-rule', 'momentum-lars': 'momentum'}
    ours = run(trainer_for(face, str(tmp_path / 'ours'), **OVERFLOW))
    theirs = run(trainer_for(chainers[face], str(tmp_path / 'chainer'),
                             **OVERFLOW))
    if face == 'lars':
        assert_same_run(ours, theirs)
        assert ours[2] == theirs[2]
    plain = run(trainer_for('momentum', str(tmp_path / 'plain'),
                            **OVERFLOW))
    skipping = [e for e in plain[0] if e['rule_t'] == 0]
    assert len(skipping) > 1
    for a, b in zip(ours[0], skipping):
        assert (a['scale'], a['rule_t']) == (b['scale'], b['rule_t'])
    assert [w for w in ours[2] if 'Non finite' in w][:len(skipping)] == [
        w for w in plain[2] if 'Non finite' in w][:len(skipping)]


def test_static_overflow_skips_nothing_as_chainer(tmp_path):
    # Chainer checks the gradients under dynamic scaling only.
    for face in ('lars', 'momentum'):
        trainer = trainer_for(face, str(tmp_path / face), scale=2.0 ** 24,
                              x_scale=64.0, state=True)
        log, _, _ = run(trainer)
        assert [e['rule_t'] for e in log] == list(range(1, 10))
        state = trainer.get_extension('LossScaleState')
        assert state.skipped_updates == 0


def test_state_records_the_skipped_updates(tmp_path):
    trainer = trainer_for('lars', str(tmp_path / 'run'), state=True,
                          **OVERFLOW)
    log, _, _ = run(trainer)
    state = trainer.get_extension('LossScaleState')
    assert state.skipped_updates == log[-1]['iteration'] - log[-1]['rule_t']
    assert state.loss_scale == log[-1]['scale']
    assert not state.last_skipped


def updated_lars(model, scale=None, dynamic=True):
    # After an update: Chainer cannot load the rules' state before one.
    lars = chainer_lars.LARS()
    lars.setup(model)
    if dynamic or scale is not None:
        lars.loss_scaling(interval=10, scale=scale)
    model.cleargrads()
    lars.update()
    return lars


@pytest.mark.parametrize('maximum', [4096.0, numpy.inf])
def test_lars_saves_and_loads_its_loss_scaling(tmp_path, maximum):
    model = L.Linear(3, 2)
    lars = updated_lars(model)
    lars._loss_scale, lars._loss_scaling_isnan_ever = 512.0, True
    lars._loss_scale_max = maximum  # inf: no maximum (Chainer's min())
    path = str(tmp_path / 'opt.npz')
    serializers.save_npz(path, lars)
    loaded = chainer_lars.LARS()
    loaded.setup(L.Linear(3, 2))
    serializers.load_npz(path, loaded)
    assert loaded._loss_scale == 512.0
    assert loaded._loss_scale_max == maximum
    assert loaded._loss_scaling_is_dynamic is True
    assert loaded._loss_scaling_isnan_ever is True
    assert loaded._loss_scaling_multiplier == 2.0 ** 0.1
    # A static scale replaces the dynamic one set up; none leaves it (a
    # float32 run resumed in mixed16: the test below).
    for scale in (8.0, None):
        serializers.save_npz(path, updated_lars(model, scale, dynamic=False))
        loaded = chainer_lars.LARS()
        loaded.setup(L.Linear(3, 2))
        loaded.loss_scaling()
        set_up = loaded._loss_scale
        serializers.load_npz(path, loaded)
        assert loaded._loss_scale == (set_up if scale is None else scale)
        assert loaded._loss_scaling_is_dynamic is (scale is None)


@pytest.mark.parametrize('damage, error, words', [
    # Chainer's NpzDeserializer names the missing key; float() of a
    # misshapen entry is refused by NumPy (its words, any version).
    ('missing', KeyError, 'loss_scale_max'),
    ('misshapen', TypeError, 'converted to Python scalars'),
])
def test_a_damaged_loss_scaling_entry_sets_none_of_it(tmp_path, damage,
                                                      error, words):
    """loss_scale is read first: it must not be set when a later entry
    fails."""
    path = str(tmp_path / 'opt.npz')
    serializers.save_npz(path, updated_lars(L.Linear(3, 2), 512.0))
    with numpy.load(path) as npz:
        arrays = {key: npz[key] for key in npz.files}
    if damage == 'missing':
        del arrays['loss_scale_max']
    else:
        arrays['loss_scaling_multiplier'] = numpy.ones(2)
    lars = chainer_lars.LARS()
    lars.setup(L.Linear(3, 2))
    lars.loss_scaling(interval=10, scale=4.0)
    before = {name: getattr(lars, name, '-')
              for name, _ in fused._LOSS_SCALING}
    with pytest.raises(error, match=words):
        fused.serialize_loss_scaling(
            lars, serializers.NpzDeserializer(arrays))
    assert {name: getattr(lars, name, '-')
            for name, _ in fused._LOSS_SCALING} == before


@pytest.mark.parametrize('key, value', [
    ('loss_scale', 0.0), ('loss_scale', -8.0), ('loss_scale', numpy.inf),
    ('loss_scale_max', numpy.nan), ('loss_scale_max', 0.0),
    ('loss_scaling_is_dynamic', numpy.nan), ('loss_scaling_is_dynamic', 2.0),
    ('loss_scaling_multiplier', -2.0), ('loss_scaling_isnan_ever', 0.5),
])
@pytest.mark.parametrize('holder', ['LARS', 'LossScaleState'])
def test_a_snapshot_of_no_loss_scaling_is_refused_before_a_load(
        tmp_path, key, value, holder):
    """A scale of 0 divided by zero in the update, a negative one was
    taken, and a NaN flag turned dynamic scaling off: refused, naming the
    entry, before the optimizer's t, states or scaling change."""
    model = L.Linear(3, 2)
    lars = updated_lars(model, 512.0)
    saved = lars if holder == 'LARS' else chainer_lars.LossScaleState(lars)
    path = str(tmp_path / 'opt.npz')
    serializers.save_npz(path, saved)
    with numpy.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays[key] = numpy.asarray(value)
    lars = chainer_lars.LARS()
    lars.setup(L.Linear(3, 2))
    lars.loss_scaling(interval=10, scale=4.0)
    lars.target.cleargrads()
    lars.update()
    loader = lars if holder == 'LARS' else chainer_lars.LossScaleState(lars)
    before = [lars.t] + [getattr(lars, n, d) for n, d in fused._LOSS_SCALING]
    states = [p.update_rule.state['v'].copy() for p in lars.target.params()]
    with pytest.raises(ValueError, match='the snapshot holds {} = {}: not '
                       'a loss scaling setting'.format(key, float(value))):
        serializers.NpzDeserializer(arrays).load(loader)
    assert [lars.t] + [getattr(lars, n, d) for n, d in fused._LOSS_SCALING
                       ] == before
    assert all((p.update_rule.state['v'] == v).all()
               for p, v in zip(lars.target.params(), states))


def test_an_old_snapshot_keeps_chainers_defaults():
    """A snapshot without the keys (tests/data, written at b8e13bc)."""
    from tests.data import make_snapshots
    model, lars = make_snapshots.setup('lars_float16_fp32_update')
    lars.loss_scaling(interval=100)
    with numpy.load(os.path.join(os.path.dirname(__file__), 'data',
                                 'lars_float16_fp32_update.npz')) as npz:
        assert not any('loss_scal' in key for key in npz.files)
        serializers.NpzDeserializer(npz, path='optimizer/').load(lars)
    assert lars.t == 3
    assert lars._loss_scale == 1.0 and lars._loss_scaling_is_dynamic
    assert lars._loss_scaling_multiplier == 2.0 ** 0.01
    assert lars._loss_scaling_isnan_ever is False


def test_loss_scale_state_takes_an_optimizer():
    with pytest.raises(TypeError, match='optimizer must be an optimizer'):
        chainer_lars.LossScaleState('lars')


# -- The same on the GPU: the emulated device, and a real one where present

@pytest.fixture(params=['emulated',
                        pytest.param('cuda', marks=pytest.mark.gpu)])
def gpu(request):
    if request.param == 'emulated':
        with emulated_cupy.installed():
            yield
    else:
        yield


class Net(chainer.Chain):

    def __init__(self):
        super(Net, self).__init__()
        with chainer.using_config('dtype', numpy.float16):
            with self.init_scope():
                self.l0 = L.Linear(6, 5)
                self.l1 = L.Linear(5, 3)


def device_run(face, steps, snapshot=None, save_after=None):
    """Forward-free updates on the GPU (the emulation has no Chainer
    forward): float16 gradients drawn per step, an inf in the first two
    (skipped under dynamic scaling from 2 ** 10), float32 master copies.
    Resumes from ``snapshot`` (a step and a file) if given; saves the run
    to ``save_after`` = (step, file). Returns the weights and the log of
    (scale, skipped updates) after each update."""
    numpy.random.seed(0)
    model = Net()
    model.to_device('@cupy:0')
    optimizer = make_optimizer(face)
    optimizer.setup(model)
    if face == 'momentum-lars':
        optimizer.add_hook(chainer_lars.GradientLARS(
            trust_coefficient=0.02, exclude_from_layer_adaptation=['/b$']))
    optimizer.loss_scaling()
    optimizer._loss_scale = 2.0 ** 10
    optimizer.use_fp32_update()
    state = chainer_lars.LossScaleState(optimizer)
    parts = {'model': model, 'optimizer': optimizer, 'state': state}
    start = 0
    if snapshot is not None:
        start, path = snapshot
        with numpy.load(path) as npz:
            for name, part in parts.items():
                serializers.NpzDeserializer(npz, path=name + '/').load(part)
    log = []
    for step in range(start, steps):
        random = numpy.random.RandomState(step)
        for path, param in sorted(model.namedparams()):
            g = random.randn(*param.shape) * 1e-2 * optimizer._loss_scale
            if step < 2 and path == '/l1/W':
                g.flat[0] = numpy.inf
            param.grad = param.device.send(g.astype(numpy.float16))
            param._loss_scale = optimizer._loss_scale
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            optimizer.update()
        state(None)
        log.append((optimizer._loss_scale, state.skipped_updates))
        if save_after is not None and step + 1 == save_after[0]:
            serializer = serializers.DictionarySerializer()
            for name, part in parts.items():
                serializer[name].save(part)
            numpy.savez(save_after[1], **serializer.target)
    weights = {path: chainer.backends.cuda.to_cpu(p.array)
               for path, p in model.namedparams()}
    return weights, log


@pytest.mark.parametrize('face', ['lars', 'momentum-lars'])
def test_device_run_resumes_exactly(gpu, tmp_path, face):
    path = str(tmp_path / 'snapshot.npz')
    weights, log = device_run(face, 6, save_after=(3, path))
    # Two skipped updates, then the slow growth after an overflow.
    assert log[:3] == [(2.0 ** 9, 1), (2.0 ** 8, 2),
                       (2.0 ** 8 * 2 ** 0.001, 2)]
    resumed, resumed_log = device_run(face, 6, snapshot=(3, path))
    assert resumed_log == log[3:]
    for path in weights:
        assert weights[path].dtype == numpy.float16
        assert resumed[path].tobytes() == weights[path].tobytes(), path


def test_loss_scale_state_loaded_after_initialize_reports_the_loaded_scale(
        tmp_path):
    """A snapshot loaded after initialize() (autoload): the next call
    reports the scale of the update it follows, the loaded one."""
    path = str(tmp_path / 'state.npz')
    saved = optimizers.SGD(lr=0.1).setup(L.Linear(3, 2))
    saved.loss_scaling(scale=512.0)
    serializers.save_npz(path, chainer_lars.LossScaleState(saved))
    optimizer = optimizers.SGD(lr=0.1).setup(L.Linear(3, 2))
    optimizer.loss_scaling(scale=4.0)
    state = chainer_lars.LossScaleState(optimizer)
    state.initialize(None)
    serializers.load_npz(path, state)
    assert state.loss_scale == 512.0
    state(None)
    assert state.last_loss_scale == 512.0


@pytest.mark.parametrize('face', ['lars', 'lamb', 'sgd'])
@pytest.mark.parametrize('dynamic', [False, True])
def test_a_snapshot_without_a_loss_scale_leaves_the_one_set_up(
        tmp_path, face, dynamic):
    """A float32 run's snapshot (no scale) resumed by a mixed16 run with
    ``loss_scaling()``: the scale set up stays (it was turned off, and
    small float16 gradients underflowed). A snapshot with a scale still
    gives its own."""
    def make(scaled, scale):
        model = L.Linear(3, 2)
        optimizer = {'lars': chainer_lars.LARS, 'lamb': chainer_lars.LAMB,
                     'sgd': optimizers.MomentumSGD}[face]().setup(model)
        if scaled and dynamic:
            optimizer.loss_scaling(interval=1000)
            optimizer._loss_scale = scale
        elif scaled:
            optimizer.loss_scaling(scale=scale)
        for p in model.params():
            p.grad = numpy.ones_like(p.array)
        optimizer.update()
        return optimizer, chainer_lars.LossScaleState(optimizer)

    for scaled in (False, True):
        path = str(tmp_path / 'snapshot{}.npz'.format(scaled))
        saved, saved_state = make(scaled, 512.0)
        serializers.save_npz(path, saved if face != 'sgd' else saved_state)
        optimizer, state = make(True, 64.0)
        before = optimizer._loss_scale  # 64, or grown by 2 ** 0.001
        serializers.load_npz(path, optimizer if face != 'sgd' else state)
        assert optimizer._loss_scale == (
            saved._loss_scale if scaled else before), scaled
        assert optimizer._loss_scaling_is_dynamic == dynamic


@pytest.mark.parametrize('face', ['lars', 'lamb', 'sgd'])
@pytest.mark.parametrize('set_up', [None, 'static'])
def test_a_snapshot_with_dynamic_scaling_restores_it_over_the_set_up(
        tmp_path, face, set_up):
    """As the docs say: a snapshot of dynamic scaling brings it back where
    the resumed run set up a static scale or none (a resume restores the
    run's loss scaling; the setup given is replaced)."""
    def make():
        model = L.Linear(3, 2)
        return {'lars': chainer_lars.LARS, 'lamb': chainer_lars.LAMB,
                'sgd': optimizers.MomentumSGD}[face]().setup(model)

    saved = make()
    saved.loss_scaling(interval=1000)
    saved._loss_scale = 512.0
    for p in saved.target.params():
        p.grad = numpy.ones_like(p.array)
    saved.update()
    path = str(tmp_path / 'snapshot.npz')
    serializers.save_npz(path, saved if face != 'sgd'
                         else chainer_lars.LossScaleState(saved))
    optimizer = make()
    if set_up == 'static':
        optimizer.loss_scaling(scale=8.0)
    serializers.load_npz(path, optimizer if face != 'sgd'
                         else chainer_lars.LossScaleState(optimizer))
    assert optimizer._loss_scale == saved._loss_scale
    assert optimizer._loss_scaling_is_dynamic is True


def test_loss_scale_state_reports_the_scale_of_the_update_it_follows():
    """Dynamic scaling doubles the scale after each update (interval 1):
    ``last_loss_scale`` is the scale the update used, ``loss_scale`` the
    next one's."""
    optimizer = optimizers.SGD(lr=0.1).setup(L.Linear(3, 2))
    optimizer.loss_scaling(interval=1)  # from 1
    state = chainer_lars.LossScaleState(optimizer)
    state.initialize(None)
    seen = []
    for _ in range(3):
        for p in optimizer.target.params():
            p.grad = numpy.ones_like(p.array)
        optimizer.update()
        state(None)
        seen.append((state.last_loss_scale, state.loss_scale,
                     state.last_skipped))
    assert seen == [(1.0, 2.0, False), (2.0, 4.0, False), (4.0, 8.0, False)]


def test_loss_scale_state_loads_no_master_of_an_uninitialized_parameter(
        tmp_path):
    """Its master would overwrite the weights the parameter is given."""
    path = str(tmp_path / 'state.npz')
    model = L.Linear(3, 2, initialW=chainer.initializers.One(numpy.float16),
                     initial_bias=chainer.initializers.Zero(numpy.float16))
    saved = optimizers.SGD(lr=0.1).setup(model)
    saved.use_fp32_update()
    for p in model.params():
        p.grad = numpy.zeros_like(p.array)
    saved.update()
    model.W.update_rule._fp32_param.array[...] = 7.0
    serializers.save_npz(path, chainer_lars.LossScaleState(saved))
    fresh = L.Linear(None, 2, initialW=chainer.initializers.One(
        numpy.float16), initial_bias=chainer.initializers.Zero(numpy.float16))
    optimizer = optimizers.SGD(lr=0.1).setup(fresh)
    optimizer.use_fp32_update()
    serializers.load_npz(path, chainer_lars.LossScaleState(optimizer))
    assert fresh.W.update_rule._fp32_param is None
    fresh(numpy.ones((1, 3), numpy.float16))  # initializes W with ones
    for p in fresh.params():
        p.grad = numpy.zeros_like(p.array)
    optimizer.update()
    assert (fresh.W.array == 1).all()


@pytest.mark.parametrize('face', ['lars', 'lamb', 'sgd'])
def test_a_master_copy_is_loaded_only_where_the_rule_uses_one(tmp_path,
                                                              face):
    """A mixed16 snapshot loaded into an optimizer without
    ``use_fp32_update()``: its master copies are left out. They were
    loaded and kept, unstepped, while the float16 weights trained; a
    later ``use_fp32_update()`` then stepped the stale copy and threw
    away every update since the resume. Now the run equals one whose
    copies are dropped by hand."""
    def make():
        model = L.Linear(3, 2)
        model.W.array = numpy.full((2, 3), 1.0, numpy.float16)
        model.b.array = numpy.full(2, 1.0, numpy.float16)
        optimizer = {'lars': lambda: chainer_lars.LARS(lr=1.0, momentum=0.0),
                     'lamb': chainer_lars.LAMB,
                     'sgd': lambda: optimizers.SGD(lr=0.1)}[face]()
        return model, optimizer.setup(model)

    def step(model, optimizer):
        for p in model.params():
            p.grad = numpy.ones_like(p.array)
        optimizer.update()

    def resume(path, saved, drop):
        model, optimizer = make()
        model.copyparams(saved)
        serializers.load_npz(path, optimizer if face != 'sgd'
                             else chainer_lars.LossScaleState(optimizer))
        loaded = [p.update_rule._fp32_param is not None
                  for p in model.params()]
        for p in model.params() if drop else ():
            p.update_rule._fp32_param = None
        for _ in range(2):
            step(model, optimizer)
        optimizer.use_fp32_update()  # Chainer makes copies of the weights
        step(model, optimizer)
        return loaded, model.W.array

    path = str(tmp_path / 'snapshot.npz')
    saved, optimizer = make()
    optimizer.use_fp32_update()
    step(saved, optimizer)
    serializers.save_npz(path, optimizer if face != 'sgd'
                         else chainer_lars.LossScaleState(optimizer))
    loaded, trained = resume(path, saved, drop=False)
    assert loaded == [False, False]
    assert trained.tobytes() == resume(path, saved, drop=True)[1].tobytes()


def _float16_linear():
    model = L.Linear(3, 2)
    model.W.array = numpy.full((2, 3), 1.0, numpy.float16)
    model.b.array = numpy.full(2, 1.0, numpy.float16)
    return model


def _make(face, model, **kwargs):
    return {'lars': lambda: chainer_lars.LARS(**kwargs),
            'lamb': lambda: chainer_lars.LAMB(**kwargs),
            'sgd': lambda: optimizers.SGD(**kwargs)}[face]().setup(model)


def _saved(face, optimizer):
    """What a snapshot of ``face`` saves: the optimizer, or for Chainer's
    SGD the LossScaleState that saves its masters."""
    return (optimizer if face != 'sgd'
            else chainer_lars.LossScaleState(optimizer))


def _step(model, optimizer, value=1.0):
    for p in model.params():
        p.grad = numpy.full_like(p.array, value)
    optimizer.update()


@pytest.mark.parametrize('strict', [True, False])
@pytest.mark.parametrize('face', ['lars', 'lamb', 'sgd'])
def test_a_snapshot_without_masters_drops_the_ones_the_optimizer_had(
        tmp_path, face, strict):
    """A float32 run's snapshot (or 0.1.0's) loaded into a mixed16 run
    that had updated: its masters were kept, and the next update, even a
    zero step, wrote the old master back over the loaded weights. Now
    Chainer makes them anew from the loaded weights; ``strict=False``
    too (it hands a missing key its current value)."""
    source = L.Linear(3, 2)
    saved = _make(face, source)
    _step(source, saved)
    path = str(tmp_path / 'float32.npz')
    serializers.save_npz(path, _saved(face, saved))
    model = _float16_linear()
    zero = {'lamb': {'alpha': 0.0}, 'lars': {'lr': 0.0, 'momentum': 0.0}
            }.get(face, {'lr': 0.0})  # (the loaded momentum would step)
    optimizer = _make(face, model, **zero)
    optimizer.use_fp32_update()
    _step(model, optimizer)  # its masters now exist
    model.copyparams(source)
    serializers.load_npz(path, _saved(face, optimizer), strict=strict)
    assert all(p.update_rule._fp32_param is None for p in model.params())
    _step(model, optimizer, 0.0)
    for p, q in zip(model.params(), source.params()):
        assert (p.array == q.array.astype(numpy.float16)).all()


@pytest.mark.parametrize('face', ['lars', 'lamb', 'sgd'])
def test_a_float32_run_keeps_no_master_of_a_mixed16_snapshot(tmp_path,
                                                             face):
    """A mixed16 snapshot resumed in float32 with ``use_fp32_update()``
    (a script that calls it whatever the dtype): the float32 weights need
    no master, yet the loaded one was kept, never stepped, saved in every
    later snapshot, and a later mixed16 resume rolled the weights back to
    it. Now it is dropped when loaded and none is saved."""
    model = _float16_linear()
    optimizer = _make(face, model)
    optimizer.use_fp32_update()
    _step(model, optimizer)
    first = str(tmp_path / 'mixed16.npz')
    serializers.save_npz(first, _saved(face, optimizer))
    float32 = L.Linear(3, 2)
    resumed = _make(face, float32)
    resumed.use_fp32_update()
    serializers.load_npz(first, _saved(face, resumed))
    assert all(p.update_rule._fp32_param is None for p in float32.params())
    _step(float32, resumed)
    second = str(tmp_path / 'float32.npz')
    serializers.save_npz(second, _saved(face, resumed))
    with numpy.load(second) as npz:
        assert not [k for k in npz.files if k.endswith('fp32_param')]


@pytest.mark.parametrize('face', ['lars', 'lamb'])
@pytest.mark.parametrize('t, error, words', [
    (-1, ValueError, 'must be at least 0, got -1'),
    (-3, ValueError, 'must be at least 0, got -3'),
    (2.5, TypeError, 'must be an int, not 2.5 (float)')])
def test_a_snapshot_of_a_negative_step_count_is_refused(tmp_path, face, t,
                                                        error, words):
    """LAMB's bias corrections of ``t <= 0`` divide by 0: the weights
    became NaN without a word (Chainer's Adam raises); refused before the
    rule loads anything, as a ``t`` that is not an integer."""
    model = L.Linear(3, 2)
    optimizer = _make(face, model)
    _step(model, optimizer)
    path = str(tmp_path / 'snapshot.npz')
    serializers.save_npz(path, optimizer)
    with numpy.load(path) as npz:
        entries = dict(npz)
    entries['W/t'] = numpy.array(t)
    numpy.savez(path, **entries)
    fresh = _make(face, L.Linear(3, 2))
    with pytest.raises(error, match=re.escape(
            "the snapshot's t of /W " + words)):
        serializers.load_npz(path, fresh)
    assert [p.update_rule.t for p in fresh.target.params()] == [0, 0]


@pytest.mark.parametrize('face', ['lars', 'lamb'])
def test_a_resume_of_lazy_links_keeps_the_masters_bit_for_bit(face):
    """A trainer loads the optimizer before the model: a lazy link's
    parameters are not initialized yet (their dtype reads float64), and
    their just-loaded masters were dropped as a float32 weight's; the
    resumed run left the uninterrupted one."""
    x = numpy.random.RandomState(0).randn(8, 4).astype(numpy.float16)
    y = numpy.arange(8, dtype=numpy.int32) % 3

    def updater():
        model = L.Classifier(L.Linear(None, 3))
        optimizer = _make(face, model)
        optimizer.use_fp32_update()
        it = chainer.iterators.SerialIterator(
            chainer.datasets.TupleDataset(x, y), 8)
        return training.updaters.StandardUpdater(it, optimizer), model

    with chainer.using_config('dtype', chainer.mixed16):
        first, model = updater()
        for _ in range(3):
            first.update()
        path = io.BytesIO()
        serializers.save_npz(path, first)
        resumed, other = updater()
        path.seek(0)
        serializers.load_npz(path, resumed)
        assert (other.predictor.W.update_rule._fp32_param.array.tobytes()
                == model.predictor.W.update_rule._fp32_param.array.tobytes())
        for _ in range(3):
            first.update()
            resumed.update()
    assert (other.predictor.W.array.tobytes()
            == model.predictor.W.array.tobytes())


def test_loss_scale_state_drops_masters_of_a_snapshot_without_it(tmp_path):
    """A snapshot of a trainer without LossScaleState holds no master copy:
    the mixed16 run's, kept, were stale against the loaded weights."""
    source = L.Linear(3, 2)
    saved = optimizers.SGD(lr=0.1).setup(source)
    _step(source, saved)
    path = str(tmp_path / 'trainer.npz')
    serializers.save_npz(path, source)  # no extension's part
    model = _float16_linear()
    optimizer = optimizers.SGD(lr=0.0).setup(model)
    optimizer.use_fp32_update()
    _step(model, optimizer)
    state = chainer_lars.LossScaleState(optimizer)
    with numpy.load(path) as npz:
        serializers.NpzDeserializer(npz, path='state/').load(state)
    assert all(p.update_rule._fp32_param is None for p in model.params())
    assert state.skipped_updates == 0
