
import pytest

from chainer_lars import ratio


# (w_norm, g_norm, keyword arguments, the ratio worked out by hand)
CASES = [
    # eta * ||w|| / (eps + ||g|| + wd * ||w||)
    (3.0, 4.0, dict(), 0.75),
    (3.0, 4.0, dict(eps=1.0), 0.6),
    (2.0, 1.0, dict(weight_decay=0.5), 1.0),
    (2.0, 1.0, dict(weight_decay=0.5, trust_coefficient=0.5), 0.5),
    (5.0, 2.0, dict(weight_decay=0.1, trust_coefficient=0.01), 0.02),
    # ||w|| must exceed the threshold strictly.
    (5.0, 0.5, dict(threshold=5.0), 1.0),
    (5.0, 0.5, dict(threshold=4.9), 10.0),
    (0.0, 4.0, dict(), 1.0),
    # A zero denominator gives 1, not a division by 0.
    (2.0, 0.0, dict(), 1.0),
    # The optimizer form also needs ||g|| > 0.
    (3.0, 0.0, dict(eps=1.0), 3.0),
    (3.0, 0.0, dict(eps=1.0, require_grad=True), 1.0),
    # LARC clipping: min(r / lr, 1).
    (3.0, 4.0, dict(clip_lr=0.5), 1.0),
    (3.0, 4.0, dict(clip_lr=0.75), 1.0),
    (3.0, 4.0, dict(clip_lr=1.5), 0.5),
    (3.0, 4.0, dict(clip_lr=0.0), 1.0),
    # Clipping applies only to a ratio that is applied.
    (3.0, 4.0, dict(threshold=3.0, clip_lr=1.5), 1.0),
]


def _full(kwargs):
    full = dict(weight_decay=0.0, eps=0.0, trust_coefficient=1.0,
                threshold=0.0, require_grad=False, clip_lr=None)
    full.update(kwargs)
    return full


@pytest.mark.parametrize('w_norm,g_norm,kwargs,expected', CASES)
def test_trust_ratio_by_hand(w_norm, g_norm, kwargs, expected):
    full = _full(kwargs)
    got = ratio.trust_ratio(
        w_norm, g_norm, full['weight_decay'], full['eps'],
        full['trust_coefficient'], full['threshold'], full['require_grad'],
        full['clip_lr'])
    assert got == pytest.approx(expected, rel=1e-15)


def test_a_negative_clip_lr_means_no_clipping():
    # As in CUDA_TRUST_RATIO, so that compiled callers pass a float.
    assert ratio.trust_ratio(3.0, 4.0, 0.0, 0.0, 1.0, clip_lr=-1.0) == 0.75
    assert ratio.trust_ratio(3.0, 4.0, 0.0, 0.0, 1.0, clip_lr=1.5) == 0.5
