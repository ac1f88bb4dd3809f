"""The LARS trust ratio: the one place where the math lives.

Once per language: :func:`trust_ratio` for the host, which the CPU kernels
also compile with Numba (:mod:`chainer_lars._numba` compiles this very
function), and :data:`CUDA_TRUST_RATIO`, the same function written for the
device. A change to how the ratio is computed is made here, in both, and
nowhere else. (ChainerX arrays are rescaled through the NumPy or CuPy
arrays that share their memory, so they take one of these two.)

Both forms of LARS, the pre-update hook (Chainer's
:class:`chainer.optimizer_hooks.GradientLARS`, arXiv:1708.03888 and
arXiv:1801.03137) and the momentum optimizer (the TensorFlow LARS
optimizer), are the one formula

.. math::

    r = \\eta \\frac{\\|w\\|}{\\epsilon + \\|d\\| + \\lambda \\|w\\|}

applied only when ``||w|| > threshold`` (the hook form; the optimizer form
uses ``threshold = 0`` and also requires ``||d|| > 0``) and when the
denominator is positive; otherwise ``r = 1``. The threshold keeps
zero-initialised or tiny arrays (biases, BatchNorm beta) from being frozen by
a ratio near 0. A ratio that is applied can be clipped the LARC way,
``r <- min(r / lr, 1)``. ``d`` is the array whose step the ratio scales: the
gradient, for both forms here. What differs between the forms travels in
the settings row of each array (``threshold`` and ``require_grad`` columns of
:mod:`chainer_lars.layout`).
"""


def trust_ratio(w_norm, d_norm, weight_decay, eps, trust_coefficient,
                threshold=0.0, require_grad=False, clip_lr=None):
    """The LARS ratio of one array, from its norms (float64).

    Plain arithmetic on floats, so that Numba compiles this same function
    for the CPU kernels; :data:`CUDA_TRUST_RATIO` is its device twin.

    Args:
        w_norm (float): ``||w||``.
        d_norm (float): ``||d||``, the norm of the array the ratio scales:
            the unscaled gradient for both forms of LARS. (A sibling such
            as LAMB passes the norm of its own update here.)
        weight_decay (float): The effective weight decay of this array
            (0 when it is excluded from weight decay).
        eps (float): Added to the denominator.
        trust_coefficient (float): The paper's ``eta``.
        threshold (float): The ratio is applied only when
            ``w_norm > threshold``.
        require_grad (bool): If ``True``, also only when ``d_norm > 0``
            (the optimizer form).
        clip_lr (float or None): If given and not negative, the applied
            ratio becomes ``min(r / clip_lr, 1)`` (LARC clipping). A
            negative value means no clipping, as in the device function, so
            that compiled callers can pass it as a float.

    Returns:
        float: The ratio. Never NaN or infinite for finite norms: a zero
        denominator gives 1, since the rescaled gradient is then zero anyway.

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
