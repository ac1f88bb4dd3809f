"""The LARS trust ratio: the one place where the math lives.

:func:`trust_ratio` on the host (the CPU loops compile this very function
with Numba) and :data:`CUDA_TRUST_RATIO`, its twin for the device: a change
to the ratio is made here, in both, and nowhere else. Both forms of LARS,
the hook (Chainer's, arXiv:1708.03888 and arXiv:1801.03137) and the
momentum optimizer (TensorFlow's), are the one formula

.. math::

    r = \\eta \\frac{\\|w\\|}{\\epsilon + \\|d\\| + \\lambda \\|w\\|}

applied only when ``||w|| > threshold`` and the denominator is positive
(the optimizer form: ``threshold = 0``, and ``||d|| > 0`` required), else
``r = 1``, so that zero-initialised or tiny arrays are not frozen by a
ratio near 0; an applied ratio can be clipped the LARC way,
``r <- min(r / lr, 1)``. The forms differ only in the ``threshold`` and
``require_grad`` columns of each array's settings
(:mod:`chainer_lars.layout`).
"""


def trust_ratio(w_norm, d_norm, weight_decay, eps, trust_coefficient,
                threshold=0.0, require_grad=False, clip_lr=None):
    """The LARS ratio of one array from its norms, in float64.

    Args:
        w_norm (float): ``||w||``.
        d_norm (float): ``||d||``, the norm of what the ratio scales (the
            unscaled gradient, for both forms).
        weight_decay (float): This array's (0 where it is excluded).
        eps (float): Added to the denominator.
        trust_coefficient (float): The paper's ``eta``.
        threshold (float): ``r = 1`` unless ``w_norm > threshold``.
        require_grad (bool): ``r = 1`` unless ``d_norm > 0`` too.
        clip_lr (float or None): LARC clipping, ``min(r / clip_lr, 1)``;
            ``None`` or negative (as compiled callers pass it): none.

    Returns:
        float: The ratio; 1 for a zero denominator, so never NaN or
        infinite for finite norms.

    """
    den = eps + d_norm + weight_decay * w_norm
    if (not w_norm > threshold or not den > 0
            or (require_grad and not d_norm > 0)):
        return 1.0
    r = trust_coefficient * w_norm / den
    if clip_lr is not None and clip_lr >= 0:
        r = 1.0 if r >= clip_lr else r / clip_lr
    return r


#: :func:`trust_ratio` for the device, for a compute type ``C`` (float or
#: double); ``clip_lr < 0`` means no clipping. Kept beside the host version
#: so that the two cannot drift.
CUDA_TRUST_RATIO = r'''
template <typename C>
__device__ __forceinline__ C chainer_lars_trust_ratio(
        C w_norm, C g_norm, C weight_decay, C eps, C trust_coefficient,
        C threshold, int require_grad, C clip_lr) {
    C den = eps + g_norm + weight_decay * w_norm;
    if (!(w_norm > threshold) || !(den > (C)0)
            || (require_grad && !(g_norm > (C)0))) {
        return (C)1;
    }
    C r = trust_coefficient * w_norm / den;
    if (clip_lr >= (C)0) {
        r = (r >= clip_lr) ? (C)1 : r / clip_lr;
    }
    return r;
}
'''
