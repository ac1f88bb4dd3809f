#!/usr/bin/env python
"""Large-batch MNIST with LARS on many processes, with ChainerMN.

The distributed counterpart of ``examples/mnist/train_mnist.py``, with the
same model, optimizers, schedule and trust-ratio report, laid out like
Chainer's own ChainerMN example: one process per device, the dataset read by
rank 0 and scattered, a multi-node optimizer and evaluator, and reports and
snapshots on rank 0. Launch it under MPI, for example on the CPU:

    mpiexec -n 2 python train_mnist.py --communicator naive

or on a machine with 8 GPUs:

    mpiexec -n 8 python train_mnist.py --device @cupy --communicator pure_nccl

``--batchsize`` is the mini-batch of each process; the global batch, whose
averaged gradient LARS sees, is ``batchsize * number of processes``, and the
learning rate follows from it. See README.md one folder up.
"""

import argparse
import math
import os
import re
import sys

import numpy

import chainer
import chainer.links as L
from chainer import training
from chainer.training import extension
from chainer.training import extensions
import chainermn

import chainer_lars

# The model, the recipe's rules and defaults and the loader are the
# single-process example's, so that the two cannot drift apart.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir, os.pardir, 'mnist'))
import train_mnist as single  # NOQA


def make_optimizer(args, model, comm):
    """Sets up the chosen optimizer on the model, averaged over processes.

    Returns the multi-node optimizer and the object whose ``observe()``
    gives the trust ratios (``None`` for the baseline). The multi-node
    wrapper averages the gradients over the processes before the actual
    optimizer, its hooks and its update rules see them, so LARS takes the
    norms of the global batch's gradient.
    """
    if args.optimizer == 'lars':
        actual = chainer_lars.LARS(
            lr=args.lr, momentum=args.momentum,
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=single.EXCLUDE,
            exclude_from_layer_adaptation=single.EXCLUDE)
        lars = actual
    else:
        actual = chainer.optimizers.MomentumSGD(
            lr=args.lr, momentum=args.momentum)
        lars = None
    optimizer = chainermn.create_multi_node_optimizer(actual, comm)
    optimizer.setup(model)
    if args.optimizer == 'momentum-lars':
        lars = chainer_lars.GradientLARS(
            weight_decay=args.weight_decay,
            trust_coefficient=args.trust_coefficient,
            exclude_from_weight_decay=single.EXCLUDE,
            exclude_from_layer_adaptation=single.EXCLUDE)
        optimizer.add_hook(lars)
    elif args.optimizer == 'momentum':
        # The baseline: weight decay on the weights only, through
        # per-parameter hooks since Chainer's WeightDecay has no exclusion
        # list.
        for path, param in model.namedparams():
            if not any(re.search(pattern, path)
                       for pattern in single.EXCLUDE):
                param.update_rule.add_hook(
                    chainer.optimizer_hooks.WeightDecay(args.weight_decay))
    return optimizer, lars


def select_device(spec, comm):
    """This process's device: the CPU, or the GPU of its rank on its node."""
    device = chainer.get_device(spec)
    if device.xp is numpy:
        return device
    if device.xp is chainer.backends.cuda.cupy:
        return chainer.get_device('@cupy:{}'.format(comm.intra_rank))
    raise ValueError('--device must be a NumPy or CuPy device for ChainerMN, '
                     'got {!r}'.format(spec))


def unwrap_variables(keys):
    """Replaces the reported Variables of ``keys`` by their arrays.

    ChainerMN 7.8.1's ObservationAggregator moves a Variable to the device
    ``'native'``, a ChainerX device, and so fails where Chainer is built
    without ChainerX (the pip wheel); it takes plain arrays as they are.
    Runs just before the aggregators.
    """
    @training.make_extension(
        trigger=(1, 'iteration'), priority=extension.PRIORITY_EDITOR + 1)
    def unwrap(trainer):
        for key in keys:
            value = trainer.observation.get(key)
            if isinstance(value, chainer.Variable):
                trainer.observation[key] = value.array
    return unwrap


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='chainer-lars ChainerMN example: large-batch MNIST on '
        'many processes, one per device, launched with mpiexec',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog='Batch size: --batchsize is PER PROCESS; the global batch B '
        'is batchsize times the number of processes (mpiexec -n). '
        'Learning rate: when --lr is not given, the peak rate follows the '
        'global batch B: lr = {} * B / {} for momentum (linear scaling), '
        'and lr * trust_coefficient = {} * sqrt(B / {}) for lars and '
        'momentum-lars (the per-layer step relative to the weight norm, '
        'scaled with the square root of the batch size); a given --lr is '
        'used as it is. The rate rises linearly for --warmup-epochs, then '
        'decays to 0 as (1 - progress)^decay_power.'.format(
            single.MOMENTUM_LR_PER_256, single.REFERENCE_BATCHSIZE,
            single.LARS_STEP_PER_256, single.REFERENCE_BATCHSIZE))
    parser.add_argument('--batchsize', '-b', type=int, default=1024,
                        help='Number of images in the mini-batch of EACH '
                        'PROCESS (the global batch is this times the number '
                        'of processes)')
    parser.add_argument('--epoch', '-e', type=int, default=10,
                        help='Number of sweeps over the dataset to train')
    parser.add_argument('--device', '-d', type=str, default='-1',
                        help='Device specifier. -1 or @numpy: every process '
                        'on the CPU. A CuPy specifier (@cupy, 0, @cupy:0): '
                        'one GPU per process, the one numbered by the rank '
                        'of the process on its machine (comm.intra_rank); '
                        'the number given is not used')
    parser.add_argument('--communicator', type=str,
                        help='ChainerMN communicator (default: naive on the '
                        'CPU, the only one there; pure_nccl on GPUs; flat '
                        'and non_cuda_aware also run on GPUs)')
    parser.add_argument('--out', '-o', default='result',
                        help='Directory to output the result (written by '
                        'rank 0)')
    parser.add_argument('--resume', '-r', type=str,
                        help='Resume the training from snapshot (read by '
                        'every process)')
    parser.add_argument('--optimizer',
                        choices=('lars', 'momentum-lars', 'momentum'),
                        default='lars',
                        help='lars: chainer_lars.LARS; momentum-lars: '
                        'MomentumSGD with the chainer_lars.GradientLARS '
                        'hook; momentum: MomentumSGD with WeightDecay (the '
                        'baseline)')
    parser.add_argument('--lr', type=float,
                        help='Peak learning rate (default: from the global '
                        'batch size, see below)')
    defaults = single.parse_args([])
    parser.add_argument('--warmup-epochs', type=float,
                        default=defaults.warmup_epochs,
                        help='Epochs of linear learning-rate warm-up')
    parser.add_argument('--decay-power', type=float,
                        default=defaults.decay_power,
                        help='Power of the learning-rate decay after the '
                        'warm-up')
    parser.add_argument('--momentum', type=float, default=0.9,
                        help='Momentum')
    parser.add_argument('--weight-decay', type=float,
                        default=defaults.weight_decay,
                        help='Weight decay (not applied to biases)')
    parser.add_argument('--trust-coefficient', type=float,
                        default=defaults.trust_coefficient,
                        help='LARS trust coefficient, for lars and '
                        'momentum-lars')
    parser.add_argument('--unit', '-u', type=int, default=1000,
                        help='Number of units')
    parser.add_argument('--seed', type=int, default=0,
                        help='Seed of the weights and of the shuffling')
    parser.add_argument('--dataset-root',
                        help='Folder that holds pfnet/chainer/mnist on the '
                        "machine of rank 0 (default: Chainer's dataset root, "
                        'CHAINER_DATASET_ROOT)')
    parser.add_argument('--noplot', dest='plot', action='store_false',
                        help='Disable PlotReport extension')
    args = parser.parse_args(argv)
    single.check_args(parser, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.dataset_root is not None:
        chainer.dataset.set_dataset_root(args.dataset_root)

    use_gpu = chainer.get_device(args.device).xp is not numpy
    communicator = args.communicator or ('pure_nccl' if use_gpu else 'naive')
    if not use_gpu and communicator != 'naive':
        sys.exit("Error: only the 'naive' communicator runs on the CPU; "
                 'use --communicator naive, or --device @cupy for GPUs')
    comm = chainermn.create_communicator(communicator)
    device = select_device(args.device, comm)
    device.use()

    global_batchsize = args.batchsize * comm.size
    if args.lr is None:
        args.lr = single.default_lr(args.optimizer, global_batchsize,
                                    args.trust_coefficient)

    if comm.rank == 0:
        print('==========================================')
        print('Number of processes: {}'.format(comm.size))
        print('Device: {} (communicator: {})'.format(
            '@cupy:<intra_rank>' if use_gpu else device, communicator))
        print('# Minibatch-size: {} per process, {} global'.format(
            args.batchsize, global_batchsize))
        print('# epoch: {}'.format(args.epoch))
        print('# optimizer: {}, lr {:g}, trust coefficient {:g}, weight '
              'decay {:g}, warm-up {:g} epochs'.format(
                  args.optimizer, args.lr, args.trust_coefficient,
                  args.weight_decay, args.warmup_epochs))
        print('==========================================')
        sys.stdout.flush()

    # Every process draws weights; the first update replaces them with
    # rank 0's.
    numpy.random.seed(args.seed)
    model = L.Classifier(single.MLP(784, args.unit, 10))
    model.to_device(device)
    optimizer, lars = make_optimizer(args, model, comm)

    # Only rank 0 reads the dataset; each process gets an equal shard.
    train, test = single.load_mnist() if comm.rank == 0 else (None, None)
    train = chainermn.scatter_dataset(train, comm, shuffle=True,
                                      seed=args.seed)
    test = chainermn.scatter_dataset(test, comm, shuffle=True,
                                     seed=args.seed)

    train_iter = chainer.iterators.SerialIterator(
        train, args.batchsize,
        order_sampler=chainer.iterators.ShuffleOrderSampler(
            numpy.random.RandomState(args.seed + comm.rank)))
    test_iter = chainer.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)
    updater = training.updaters.StandardUpdater(
        train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # The shards are of equal length, so every process counts the same
    # iterations.
    iterations_per_epoch = len(train) / args.batchsize
    iterations = math.ceil(args.epoch * iterations_per_epoch)
    warmup = min(round(args.warmup_epochs * iterations_per_epoch), iterations)
    trainer.extend(chainer_lars.WarmupPolynomialShift(
        'lr', warmup_count=warmup, max_count=iterations, init=args.lr,
        power=args.decay_power))

    evaluator = single.Evaluator(test_iter, model, device=device)
    trainer.extend(chainermn.create_multi_node_evaluator(evaluator, comm),
                   call_before_training=True)

    # The training loss and accuracy are averaged over the processes, so
    # that rank 0 reports those of the global batch, not of its shard.
    averaged = ('main/loss', 'main/accuracy')
    trainer.extend(unwrap_variables(averaged))
    for key in averaged:
        trainer.extend(chainermn.extensions.ObservationAggregator(comm, key))

    # The parameters, and so the trust ratios, are the same in every
    # process: report and save on rank 0 only.
    if comm.rank == 0:
        trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
        trainer.extend(extensions.observe_lr(), trigger=(1, 'iteration'),
                       call_before_training=True)
        trainer.extend(extensions.LogReport(), call_before_training=True)

        ratio_keys = []
        if lars is not None:
            # About ten observations per epoch: each one brings the norms
            # from the GPU once.
            observer = chainer_lars.TrustRatioObserver(lars)
            trainer.extend(observer, trigger=(
                max(1, int(iterations_per_epoch) // 10), 'iteration'))
            ratio_keys = [observer.key('ratio', path)
                          for path, _ in model.namedparams()
                          if path.endswith('/W')]

        if args.plot and extensions.PlotReport.available():
            # Draw into files without a display.
            import matplotlib
            matplotlib.use('Agg')
            trainer.extend(extensions.PlotReport(
                ['main/loss', 'validation/main/loss'], 'epoch',
                filename='loss.png', trigger=single.end_of_epoch),
                call_before_training=True)
            trainer.extend(extensions.PlotReport(
                ['main/accuracy', 'validation/main/accuracy'], 'epoch',
                filename='accuracy.png', trigger=single.end_of_epoch),
                call_before_training=True)
            trainer.extend(extensions.PlotReport(
                ['lr'], 'epoch', filename='lr.png',
                trigger=single.end_of_epoch),
                call_before_training=True)
            if ratio_keys:
                trainer.extend(extensions.PlotReport(
                    ratio_keys, 'epoch', filename='trust_ratio.png',
                    trigger=single.end_of_epoch,
                    postprocess=single.log_scale))

        trainer.extend(extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss',
             'main/accuracy', 'validation/main/accuracy', 'lr',
             'elapsed_time']), call_before_training=True)
        trainer.extend(extensions.ProgressBar(update_interval=10))

    if args.resume is not None:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


if __name__ == '__main__':
    main()
