"""The LARS trust ratio, the one place where its math lives: on the host
(the CPU loops compile this very function) and for the device."""


def trust_ratio(w_norm, d_norm, weight_decay, eps, trust_coefficient,
                threshold=0.0, require_grad=False, clip_lr=None):
    """``eta ||w|| / (eps + ||d|| + wd ||w||)`` of one array, in float64.

    It is 1 unless ``w_norm > threshold``, the denominator is positive
    and, with ``require_grad``, ``d_norm > 0``: zero-initialised or tiny
    arrays are not frozen, and the result is finite for finite norms.
    ``d_norm`` is the unscaled gradient's norm; ``clip_lr`` (``None`` or
    negative: none) clips the LARC way, ``min(r / clip_lr, 1)``."""
    den = eps + d_norm + weight_decay * w_norm
    if (not w_norm > threshold or not den > 0
            or (require_grad and not d_norm > 0)):
        return 1.0
    r = trust_coefficient * w_norm / den
    if clip_lr is not None and clip_lr >= 0:
        r = 1.0 if r >= clip_lr else r / clip_lr
    return r


#: :func:`trust_ratio` in CUDA C, compute type ``C``; ``clip_lr < 0``: no clip.
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
    if (clip_lr >= (C)0) r = (r >= clip_lr) ? (C)1 : r / clip_lr;
    return r;
}
'''
