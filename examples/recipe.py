"""The LARS recipe: what to copy into your own trainer.

The optimizers (``make_optimizer``, mixed precision included), the rule
for the peak learning rate (``default_lr``), the schedule (``schedule``),
the loss-scaling state in snapshots (``loss_scale_state``) and the
observation of the trust ratios (``observe_trust_ratios``): the lines this
project is about.
The rest of the examples' shared code is glue around them:
``examples/cli.py`` (the flags and their checks), ``examples/data.py``,
``examples/training.py`` (Chainer's trainer and its reports) and
``examples/plots.py``.
"""

import functools
import math
import re

import chainer
import chainer.functions as F

import chainer_lars


# Parameters matched by these regular expressions (biases, BatchNorm's beta
# and gamma) get neither weight decay nor layer adaptation, as in the
# large-batch recipes.
EXCLUDE = ('/b$', '/beta$', '/gamma$')
# Every parameter: the nesterov baseline adapts none.
ALL = ('',)

# The learning-rate rules (see --help and examples/mnist/README.md).
MOMENTUM_LR_PER_256 = 0.1
LARS_STEP_PER_256 = 0.005
ADAM_ALPHA_PER_256 = 0.001
LAMB_STEP_PER_256 = 0.01
REFERENCE_BATCHSIZE = 256
# The optimizers with a trust coefficient, and its default.
LARS_LIKE = ('lars', 'momentum-lars')
TRUST_COEFFICIENT = 0.02
# The optimizers whose rate is Adam's alpha (--lr sets it; their lr is the
# rate after bias correction), and --momentum their beta1.
ADAM_LIKE = ('adam', 'lamb')


def default_lr(optimizer, batchsize, trust_coefficient):
    """The peak learning rate for a batch size, when --lr is not given.

    MomentumSGD scales linearly with the batch size (Goyal et al., 2017).
    With LARS, each adapted layer moves by ``lr * trust_coefficient`` times
    its weight norm, whatever the scale of its gradient; that product, the
    relative step, is scaled with the square root of the batch size
    (Krizhevsky, 2014; Hoffer et al., 2017), and ``lr`` follows from the
    trust coefficient. ``lr`` itself is the rate of the parameters excluded
    from adaptation (biases, BatchNorm's beta and gamma). Adam's ``alpha``
    and LAMB's (the step of an adapted layer relative to its weight norm)
    are scaled with the square root of the batch size too.
    """
    scale = batchsize / REFERENCE_BATCHSIZE
    if optimizer in ('momentum', 'nesterov'):
        return MOMENTUM_LR_PER_256 * scale
    if optimizer in ADAM_LIKE:
        return math.sqrt(scale) * (ADAM_ALPHA_PER_256 if optimizer == 'adam'
                                   else LAMB_STEP_PER_256)
    return LARS_STEP_PER_256 * math.sqrt(scale) / trust_coefficient


def adam_settings(args):
    """--beta2 and --eps where given: otherwise Adam's and LAMB's own
    defaults stand."""
    return {name: getattr(args, name) for name in ('beta2', 'eps')
            if getattr(args, name, None) is not None}


def make_optimizer(args, model, comm=None):
    """Sets up the optimizer chosen by --optimizer on the model.

    Returns the optimizer and the object whose ``observe()`` gives the trust
    ratios (``None`` for the baselines). With a ChainerMN communicator
    ``comm`` the optimizer is multi-node: it averages the gradients over
    the processes before the actual optimizer, its hooks and its update
    rules see them, so LARS takes the norms of the global batch's gradient.
    """
    if args.optimizer == 'lars':
        actual = lars = chainer_lars.LARS(
            lr=args.lr, momentum=args.momentum,
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            nesterov=args.nesterov,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE)
    elif args.optimizer == 'nesterov':
        # Nesterov momentum through the same LARS update with every
        # parameter excluded from layer adaptation: the same weight decay
        # and exclusions as lars --nesterov, the trust ratio the only
        # difference.
        actual = chainer_lars.LARS(
            lr=args.lr, momentum=args.momentum,
            weight_decay=args.weight_decay, nesterov=True,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=ALL)
        lars = None
    elif args.optimizer == 'lamb':
        actual = lars = chainer_lars.LAMB(
            alpha=args.lr, beta1=args.momentum,
            weight_decay_rate=args.weight_decay,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE, **adam_settings(args))
    elif args.optimizer == 'adam':
        # Chainer's Adam, its weight decay decoupled (AdamW's), taken off
        # the excluded parameters below.
        actual = chainer.optimizers.Adam(
            alpha=args.lr, beta1=args.momentum,
            weight_decay_rate=args.weight_decay, **adam_settings(args))
        lars = None
    else:
        actual = chainer.optimizers.MomentumSGD(
            lr=args.lr, momentum=args.momentum)
        lars = None
    if comm is None:
        optimizer = actual
    else:
        # Imported here: the single-process trainers run without MPI.
        import chainermn
        optimizer = chainermn.create_multi_node_optimizer(actual, comm)
    optimizer.setup(model)
    if args.dtype != 'float32':
        # Mixed precision: the loss scaled (dynamically unless
        # --loss-scale), the update made on float32 master copies of the
        # float16 arrays.
        optimizer.loss_scaling(scale=args.loss_scale)
        optimizer.use_fp32_update()
    if args.optimizer == 'momentum-lars':
        lars = chainer_lars.GradientLARS(
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE)
        optimizer.add_hook(lars)
    elif args.optimizer in ('momentum', 'adam'):
        # The baselines: weight decay on the weights only, through
        # per-parameter hooks (Chainer's WeightDecay has no exclusion
        # list) or Adam's per-rule hyperparameter.
        for path, param in model.namedparams():
            excluded = any(re.search(pattern, path) for pattern in EXCLUDE)
            if args.optimizer == 'adam' and excluded:
                param.update_rule.hyperparam.weight_decay_rate = 0.0
            elif args.optimizer == 'momentum' and not excluded:
                param.update_rule.add_hook(
                    chainer.optimizer_hooks.WeightDecay(args.weight_decay))
    return optimizer, lars


def loss_scale_state(trainer, optimizer):
    """Saves the loss-scaling state and master copies in snapshots, which
    Chainer's optimizers do not (``LARS`` does); returns the extension,
    which counts the skipped updates. In every process of a ChainerMN run.
    """
    state = chainer_lars.LossScaleState(optimizer)
    trainer.extend(state)
    return state


def loss_function(args):
    """L.Classifier's loss: softmax cross entropy, with --label-smoothing.

    Chainer 7.8.1's ``softmax_cross_entropy`` has no label smoothing; with
    ``eps`` > 0 the target is ``1 - eps`` on the label and ``eps`` spread
    evenly over all the classes (Szegedy et al., 2016).
    """
    eps = args.label_smoothing
    if not eps:
        return F.softmax_cross_entropy
    return functools.partial(smoothed_cross_entropy, eps=eps)


def smoothed_cross_entropy(y, t, eps):
    """The mean over the batch of ``-sum_k q_k log softmax(y)_k``, where
    ``q = (1 - eps) onehot(t) + eps / K``."""
    log_p = F.log_softmax(y)
    n, k = y.shape
    nll = -F.select_item(log_p, t)
    uniform = -F.sum(log_p, axis=1) / k
    return F.sum((1 - eps) * nll + eps * uniform) / n


def iterations(args, n_train):
    """The updates of --epoch epochs of ``n_train`` examples, counted
    exactly: the last, a part of an epoch's batch, is one (ceil, in
    integers: in floats, 15 epochs of 50,000 at 3,000 gave 251 of 250)."""
    return -(-args.epoch * n_train // args.batchsize)


def schedule(args, n_train):
    """The recipe's schedule: linear warm-up, then polynomial decay to 0,
    of the rate (Adam's and LAMB's ``alpha``), over the run's
    :func:`iterations`."""
    count = iterations(args, n_train)
    # A warm-up of the whole run ends at its last update: the run counts
    # its part of an update as one (ceil), which round would leave out.
    warmup = count if args.warmup_epochs >= args.epoch else min(
        round(args.warmup_epochs * n_train / args.batchsize), count)
    return chainer_lars.WarmupPolynomialShift(
        'alpha' if args.optimizer in ADAM_LIKE else 'lr',
        warmup_count=warmup, max_count=count, init=args.lr,
        power=args.decay_power)


def observe_trust_ratios(trainer, lars, model, iterations_per_epoch,
                         every=None):
    """Reports the trust ratio and norms of each weight; returns ratio keys.

    About ten observations per epoch, at most one an iteration, and with
    ``every`` (--eval-every) one at each evaluation (every ``every``
    iterations and each epoch's end), so that each line of the log has
    some: each one brings the norms from the GPU once. Biases and
    BatchNorm parameters are not adapted, so only the weights (``/W``)
    are reported.
    """
    if lars is None:
        return []
    observer = chainer_lars.TrustRatioObserver(lars, pattern='/W$')
    interval = max(1, int(iterations_per_epoch) // 10)

    def trigger(trainer):  # stateless: a resumed run observes alike
        updater = trainer.updater
        return updater.iteration % interval == 0 or bool(every and (
            updater.iteration % every == 0 or updater.is_new_epoch))
    trainer.extend(observer, trigger=trigger)
    return [observer.key('ratio', path) for path in parameter_paths(model)
            if path.endswith('/W')]


def parameter_paths(link, prefix=''):
    """The paths of the parameters of ``link``, in the order it defines them.

    ``namedparams()`` lists a Chain's children in the order of a set (for
    the CIFAR ResNet, ``fc/W`` second); the attributes of a link are in
    the order its ``__init__`` set them, which is the order of the layers
    in the models here.
    """
    for name, value in vars(link).items():
        if name in link._params:
            yield prefix + '/' + name
        elif (isinstance(link, chainer.Chain) and name in link._children):
            yield from parameter_paths(value, prefix + '/' + name)
    if isinstance(link, chainer.ChainList):
        for i, child in enumerate(link):
            yield from parameter_paths(child, '{}/{}'.format(prefix, i))
