import re

import pytest

from chainer_lars import exclusions
from tests import lars_reference as ref
from tests.lars_reference import PATHS


def test_no_lists_exclude_nothing():
    rules = exclusions.ExclusionRules()
    assert rules.exclude_from_weight_decay == ()
    assert rules.exclude_from_layer_adaptation == ()
    assert all(rules.lookup(path) == (True, True) for path in PATHS)


def test_the_two_lists_act_independently():
    rules = exclusions.ExclusionRules(
        exclude_from_weight_decay=ref.EXCLUDE_FROM_WEIGHT_DECAY,
        exclude_from_layer_adaptation=ref.EXCLUDE_FROM_LAYER_ADAPTATION)
    flags = {path: rules.lookup(path) for path in PATHS}
    assert flags == ref.EXCLUDED_FLAGS


def test_patterns_are_searched_not_matched():
    rules = exclusions.ExclusionRules(exclude_from_layer_adaptation=['bn'])
    assert rules.lookup('/predictor/bn1/gamma') == (True, False)
    anchored = exclusions.ExclusionRules(
        exclude_from_layer_adaptation=['^bn'])
    assert anchored.lookup('/predictor/bn1/gamma') == (True, True)


def test_lookup_gives_both_flags():
    rules = exclusions.ExclusionRules(exclude_from_weight_decay='/b$',
                                      exclude_from_layer_adaptation='gamma')
    assert rules.lookup('/fc/b') == (False, True)
    assert rules.lookup('/bn/gamma') == (True, False)
    assert rules.lookup('/fc/W') == (True, True)


def test_a_single_pattern_is_a_list_of_one():
    rules = exclusions.ExclusionRules(
        exclude_from_weight_decay='/b$',
        exclude_from_layer_adaptation=re.compile('gamma'))
    assert [p.pattern for p in rules.exclude_from_weight_decay] == ['/b$']
    assert [p.pattern for p in rules.exclude_from_layer_adaptation] == [
        'gamma']


@pytest.mark.parametrize('kwargs,error,words', [
    ({'exclude_from_weight_decay': ['(']}, ValueError,
     r"exclude_from_weight_decay item 0 is not a valid .*'\('"),
    ({'exclude_from_layer_adaptation': 3}, TypeError,
     'exclude_from_layer_adaptation must be a list .*3 \\(int\\)'),
    # Iterated, bytes would give ints: the error named 47 for b'/b$'.
    ({'exclude_from_weight_decay': b'/b$'}, TypeError,
     r"exclude_from_weight_decay must be a list .*b'/b\$' \(bytes\)"),
    ({'exclude_from_weight_decay': [b'/b$']}, TypeError,
     r"exclude_from_weight_decay item 0 .*b'/b\$' \(bytes\)"),
    # A compiled bytes pattern cannot search a path: refused now, not at
    # the first update.
    ({'exclude_from_layer_adaptation': re.compile(b'gamma')}, TypeError,
     r"exclude_from_layer_adaptation item 0 .*compiled bytes pattern"),
])
def test_bad_lists_name_the_argument(kwargs, error, words):
    with pytest.raises(error, match=words):
        exclusions.ExclusionRules(**kwargs)


class Owner(exclusions.ExclusionProperties):

    def __init__(self, **kwargs):
        self._rules = exclusions.ExclusionRules(**kwargs)


def test_properties_give_the_patterns_as_tuples_of_strings():
    owner = Owner(exclude_from_weight_decay=['/b$'],
                  exclude_from_layer_adaptation=['gamma', 'beta'])
    assert owner.exclude_from_weight_decay == ('/b$',)
    assert owner.exclude_from_layer_adaptation == ('gamma', 'beta')


def test_the_lists_cannot_be_changed_in_place():
    # Appending to a list that was a copy did nothing, silently.
    owner = Owner(exclude_from_weight_decay=['/b$'])
    with pytest.raises(AttributeError):
        owner.exclude_from_weight_decay.append('gamma')
    with pytest.raises(AttributeError):
        owner.exclude_from_weight_decay = ['gamma']
    assert owner.exclude_from_weight_decay == ('/b$',)


def _faces():
    """Each face, made with the given lists, to the point it warns: its
    first update (a hook registered on the optimizer)."""
    import chainer
    import chainer_lars

    def optimizer(cls):
        def face(model, **lists):
            opt = cls(**lists).setup(model)
            x, t = ref.batch(0)
            opt.update(ref.loss_fn(model, x, t))
            opt.update(ref.loss_fn(model, x, t))  # once
        return face

    def hook(model, **lists):
        opt = chainer.optimizers.MomentumSGD(lr=0.01).setup(model)
        opt.add_hook(chainer_lars.GradientLARS(**lists))
        x, t = ref.batch(0)
        opt.update(ref.loss_fn(model, x, t))
        opt.update(ref.loss_fn(model, x, t))  # once
    return {'LARS': optimizer(chainer_lars.LARS),
            'LAMB': optimizer(chainer_lars.LAMB), 'GradientLARS': hook}


@pytest.mark.parametrize('face', sorted(_faces()))
def test_a_list_that_matches_no_path_is_warned_of_once(face):
    # PyTorch's names ('bias', 'LayerNorm') match none of Chainer's paths
    # (/fc/b, /bn/beta): the list excluded nothing without a word.
    model = ref.Net()
    with pytest.warns(UserWarning) as record:
        _faces()[face](model, exclude_from_weight_decay=['bias', 'LayerNorm'],
                       exclude_from_layer_adaptation=['/b$'])
    assert len(record) == 1, [str(w.message) for w in record]
    assert str(record[0].message) == (
        "{}: exclude_from_weight_decay=['bias', 'LayerNorm'] matches no "
        'parameter path (such as {}): it excludes nothing'.format(
            face, ', '.join(sorted(PATHS)[:3])))
    assert record[0].filename == __file__  # the user's line


@pytest.mark.parametrize('face', sorted(_faces()))
def test_a_list_any_of_whose_patterns_matches_is_not_warned_of(
        face, recwarn):
    # One list for many models, some patterns for layers this one lacks:
    # one pattern that matches is enough.
    _faces()[face](ref.Net(), exclude_from_weight_decay=[
        '/b$', '/ln/gamma$', 'no such layer'],
        exclude_from_layer_adaptation=[])
    assert not [w for w in recwarn if 'matches no' in str(w.message)]


def test_a_list_of_parameters_added_after_setup_is_not_warned_of():
    # A head added between setup() and the first update, its rule given by
    # hand: the list is checked at the update, against every path.
    import chainer
    import chainer_lars
    model = chainer.Chain()
    with model.init_scope():
        model.body = chainer.links.Linear(3, 2)
    opt = chainer_lars.LARS(exclude_from_layer_adaptation=['/head/'])
    opt.setup(model)
    _add_head(model, opt)
    _step(model, opt)
    assert not model.head.W.update_rule.uses_adaptation


def _add_head(model, opt):
    """A layer added after setup(), its rules made by the optimizer."""
    import chainer
    with model.init_scope():
        model.head = chainer.links.Linear(2, 2)
    for param in model.head.params():
        param.update_rule = opt.create_update_rule()


def _step(model, opt):
    for param in model.params():
        param.grad = param.array * 0 + 1
    opt.update()


@pytest.mark.parametrize('created', [False, True])
@pytest.mark.parametrize('face', ['LARS', 'LAMB'])
def test_a_rule_made_by_hand_before_the_first_update_keeps_its_flags(
        face, created):
    # The lists are checked at the first update; the rules placed then are
    # only those create_update_rule() made (a rule made by hand beside one
    # it made for a layer added after setup() lost its flags).
    import chainer
    import chainer_lars
    model = chainer.Chain()
    with model.init_scope():
        model.fc = chainer.links.Linear(3, 2)
    opt = getattr(chainer_lars, face)(exclude_from_weight_decay=['/b$'],
                                      exclude_from_layer_adaptation=['/b$'])
    opt.setup(model)
    hand = getattr(chainer_lars, face + 'Rule')(opt.hyperparam)
    model.fc.b.update_rule = hand
    if created:
        _add_head(model, opt)
    _step(model, opt)
    assert (hand.uses_weight_decay, hand.uses_adaptation) == (True, True)
    assert model.fc.W.update_rule is not hand
    if created:
        rule = model.head.b.update_rule
        assert (rule.uses_weight_decay, rule.uses_adaptation) == (
            False, False)
