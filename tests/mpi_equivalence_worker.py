"""N ChainerMN ranks on 1/N of each batch against one process on all of it.

Run under ``mpiexec -n N`` (``tests/test_chainermn.py`` does so). Each rank
trains a small float64 MLP through ``chainermn.create_multi_node_optimizer``
on its slice of every global batch, and, in the same process, trains a
plain optimizer on the whole global batch as the reference. With equal
slices the mean of the ranks' mean gradients is the mean gradient of the
whole batch, so if the LARS hook or rule runs after ChainerMN's all-reduce,
the two runs must agree to rounding, parameters and trust-ratio norms alike.

Rank 0 writes what was measured, per case, as JSON to ``--out``; the test
makes the assertions. Every warning is an error here, as in the test suite.

"""

import argparse
import json
import warnings

import numpy

import chainer
import chainer.functions as F
import chainer.links as L
import chainermn

import chainer_lars


GLOBAL_BATCH = 12  # divisible by 2 and 3 ranks
N_IN, N_HIDDEN, N_OUT = 6, 5, 3
STEPS = 4  # real updates, after the one that only broadcasts
ROOT_SEED = 100  # rank r builds its model from ROOT_SEED + r


class MLP(chainer.Chain):

    """A two-layer float64 perceptron with fixed initial parameters.

    ``l2``'s bias starts at zero, so the first update takes the ``r = 1``
    branch (``||w|| = 0``, or below the hook's threshold) for it.

    """

    def __init__(self, seed):
        super(MLP, self).__init__()
        rng = numpy.random.RandomState(seed)
        with chainer.using_config('dtype', numpy.float64), self.init_scope():
            self.l1 = L.Linear(
                N_IN, N_HIDDEN,
                initialW=rng.normal(scale=0.5, size=(N_HIDDEN, N_IN)),
                initial_bias=rng.normal(scale=0.1, size=N_HIDDEN))
            self.l2 = L.Linear(
                N_HIDDEN, N_OUT,
                initialW=rng.normal(scale=0.5, size=(N_OUT, N_HIDDEN)),
                initial_bias=0)

    def forward(self, x):
        return self.l2(F.tanh(self.l1(x)))


def loss_fun(model):
    def loss(x, t):
        return F.softmax_cross_entropy(model(x), t)
    return loss


EXCLUDE_WD = ['/b$']
EXCLUDE_ADAPT = ['/l2/b$']


def hook_case(loss_scale=None, clip=False):
    def make():
        optimizer = chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9)
        hook = chainer_lars.GradientLARS(
            weight_decay=5e-3, trust_coefficient=0.5 if clip else 1.0,
            clip=clip, exclude_from_weight_decay=EXCLUDE_WD,
            exclude_from_layer_adaptation=EXCLUDE_ADAPT)
        return optimizer, hook, loss_scale
    return make


def lars_case(nesterov=False):
    def make():
        optimizer = chainer_lars.LARS(
            lr=0.5, momentum=0.9, weight_decay=5e-3, trust_coefficient=0.1,
            nesterov=nesterov, exclude_from_weight_decay=EXCLUDE_WD,
            exclude_from_layer_adaptation=EXCLUDE_ADAPT)
        return optimizer, None, None
    return make


CASES = {
    'hook': hook_case(),
    'hook_loss_scaled_clip': hook_case(loss_scale=128.0, clip=True),
    'lars': lars_case(),
    'lars_nesterov': lars_case(nesterov=True),
}


def build(make, seed, comm=None):
    """A model and its optimizer (multi-node when ``comm`` is given)."""
    model = MLP(seed)
    optimizer, hook, loss_scale = make()
    if comm is not None:
        optimizer = chainermn.create_multi_node_optimizer(optimizer, comm)
    optimizer.setup(model)
    if hook is not None:
        optimizer.add_hook(hook)
    if loss_scale is not None:
        optimizer.loss_scaling(scale=loss_scale)
    observer = hook if hook is not None else optimizer
    return model, optimizer, observer


def params_of(model):
    return {path: p.array.copy() for path, p in model.namedparams()}


def max_abs_diff(a, b):
    return max(float(numpy.max(numpy.abs(a[k] - b[k]))) for k in a)


def max_rel_diff_norms(observed, reference):
    """Largest relative difference of ``||w||`` and ``||g||`` per path."""
    if set(observed) != set(reference):
        return float('inf')
    worst = 0.0
    for path, (_, w_norm, g_norm) in observed.items():
        _, w_ref, g_ref = reference[path]
        for x, y in ((w_norm, w_ref), (g_norm, g_ref)):
            worst = max(worst, abs(x - y) / max(abs(y), 1e-300))
    return worst


def local_grad_norms(model, x, t):
    """``||g||`` per path of this rank's own (not yet averaged) gradient."""
    clone = model.copy(mode='copy')
    clone.cleargrads()
    loss_fun(clone)(x, t).backward()
    return {path: float(numpy.linalg.norm(p.grad))
            for path, p in clone.namedparams()}


def run_case(name, make, comm, data):
    xs, ts = data
    n, rank = comm.size, comm.rank
    lo = rank * GLOBAL_BATCH // n
    hi = (rank + 1) * GLOBAL_BATCH // n

    reference, ref_optimizer, ref_observer = build(make, ROOT_SEED)
    model, optimizer, observer = build(make, ROOT_SEED + rank, comm)
    initial_root = params_of(reference)

    # ChainerMN's first update computes a gradient but only broadcasts rank
    # 0's parameters: no step, and the hook must not have run.
    optimizer.update(loss_fun(model), xs[0][lo:hi], ts[0][lo:hi])
    result = {
        'broadcast_max_abs_diff': max_abs_diff(params_of(model), initial_root),
        'observed_after_broadcast': len(observer.observe()),
        'param_max_abs_diff': [],
        'norm_max_rel_diff': [],
        'local_vs_global_min_rel_gap': [],
        'moved_max_abs': max_abs_diff(params_of(model), initial_root),
    }
    for step in range(1, STEPS + 1):
        local = local_grad_norms(model, xs[step][lo:hi], ts[step][lo:hi])
        optimizer.update(loss_fun(model), xs[step][lo:hi], ts[step][lo:hi])
        ref_optimizer.update(loss_fun(reference), xs[step], ts[step])

        observed, expected = observer.observe(), ref_observer.observe()
        result['param_max_abs_diff'].append(
            max_abs_diff(params_of(model), params_of(reference)))
        result['norm_max_rel_diff'].append(
            max_rel_diff_norms(observed, expected))
        # How far this rank's own gradient norm is from the averaged one:
        # the hook or rule can only have matched the reference if it saw the
        # averaged gradient, that is, if it ran after the all-reduce.
        result['local_vs_global_min_rel_gap'].append(min(
            abs(local[path] - g_ref) / g_ref
            for path, (_, _, g_ref) in expected.items()))
    result['moved_max_abs'] = max_abs_diff(params_of(model), initial_root)
    result['observed_paths'] = sorted(observer.observe())
    result['final_params'] = {k: v.tolist()
                              for k, v in params_of(model).items()}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', required=True,
                        help='JSON file that rank 0 writes the results to')
    parser.add_argument('--case', action='append', choices=sorted(CASES),
                        help='Case to run (repeatable); all by default')
    args = parser.parse_args()
    warnings.simplefilter('error')

    comm = chainermn.create_communicator('naive')
    rng = numpy.random.RandomState(1234)
    xs = rng.normal(size=(STEPS + 1, GLOBAL_BATCH, N_IN))
    ts = rng.randint(0, N_OUT, size=(STEPS + 1, GLOBAL_BATCH)).astype(
        numpy.int32)

    results = {}
    for name in args.case or sorted(CASES):
        per_rank = comm.gather_obj(run_case(name, CASES[name], comm, (xs, ts)))
        if comm.rank == 0:
            final = [r.pop('final_params') for r in per_rank]
            results[name] = {
                'ranks': per_rank,
                # Every rank applies the same averaged gradient to the same
                # parameters: they must agree bitwise.
                'ranks_max_abs_diff': max(
                    max_abs_diff({k: numpy.asarray(v) for k, v in f.items()},
                                 {k: numpy.asarray(v)
                                  for k, v in final[0].items()})
                    for f in final),
            }
    if comm.rank == 0:
        with open(args.out, 'w') as f:
            json.dump({'size': comm.size, 'steps': STEPS, 'cases': results},
                      f, indent=1, sort_keys=True)


if __name__ == '__main__':
    main()
