#!/usr/bin/env python
"""Large-batch MNIST or CIFAR with LARS on many processes, with ChainerMN.

The distributed counterpart of ``examples/mnist/train_mnist.py`` (the MLP on
MNIST) and ``examples/cifar/train_cifar.py`` (the ResNet on CIFAR-10/100),
with the same models, optimizers, schedule and reports, laid out like
Chainer's own ChainerMN example: one process per device, the dataset read by
rank 0 and scattered, a multi-node optimizer and evaluator, and reports and
snapshots on rank 0. Launch it under MPI, as a file (from the repository root
or from its own folder) or as a module from the root, for example on the CPU:

    mpiexec -n 2 python examples/chainermn/mnist/train_mnist.py
    mpiexec -n 2 python train_mnist.py      # in examples/chainermn/mnist
    mpiexec -n 2 python -m examples.chainermn.mnist.train_mnist

or on a machine with 8 GPUs:

    mpiexec -n 8 python -m examples.chainermn.mnist.train_mnist \\
        --device @cupy:0 --communicator pure_nccl --dataset cifar10

``--batchsize`` is the mini-batch of each process; the global batch, whose
averaged gradient LARS sees, is ``batchsize * number of processes``, and the
learning rate follows from it. See README.md one folder up.
"""

import functools
import os
import sys
import warnings

import numpy

# This package before Chainer: it filters CuPy's warning that NCCL is
# missing, which Chainer's import sets off (examples/__init__.py).
if not __package__:  # run as a file: examples/README.md
    import _examples_path  # NOQA
import examples  # NOQA

import chainer
import chainer.links as L
import chainermn
from chainermn import global_except_hook
from chainermn import nccl as chainermn_nccl

from examples import cli
from examples import data
from examples import recipe
from examples import training
from examples.cifar import train_cifar
from examples.mnist import train_mnist


# The epoch and the warm-up default to the single-process example's for
# the dataset.
DEFAULTS = dict(batchsize=1024, epoch=None, warmup_epochs=None)

# ChainerMN 7.8.1's create_communicator's names, but 'dummy', which does
# not communicate (it measures the cost of packing the gradients).
COMMUNICATORS = ('naive', 'flat', 'non_cuda_aware', 'pure_nccl')

HELP = dict(
    batchsize='Number of images in the mini-batch of EACH PROCESS (the '
    'global batch is this times the number of processes)',
    epoch='Number of sweeps over the dataset to train (default: the '
    "single-process example's, {} for MNIST, {} for CIFAR)".format(
        train_mnist.DEFAULTS['epoch'], train_cifar.DEFAULTS['epoch']),
    warmup_epochs='Epochs of linear learning-rate warm-up (default: the '
    "single-process example's, {} for MNIST, {} for CIFAR)".format(
        train_mnist.DEFAULTS['warmup_epochs'],
        train_cifar.DEFAULTS['warmup_epochs']),
    device='Device specifier. -1 or @numpy: every process on the CPU. A '
    'CuPy specifier (0, @cupy:0): one GPU per process, the one numbered by '
    'the rank of the process on its machine (comm.intra_rank), or the one '
    'it sees where each sees its own (CUDA_VISIBLE_DEVICES); the number '
    'given only has to name a GPU of the machine (0 always does)',
    out='Directory to output the result, written by rank 0 (default: '
    'result; with --resume, the folder of its snapshot, where the run goes '
    'on)',
    dtype=cli.dtype_help('MNIST: -u 50; CIFAR: --depth 8'),
    resume='Resume the training from a snapshot (read by every process), '
    'with the same flags but --out, --snapshots, --device, --dataset-root, '
    '--progress and --communicator, and the same number of processes',
    lr="Peak learning rate, Adam's and LAMB's alpha (default: from the "
    'global batch size, see below)',
    dataset_root="Chainer's dataset root on the machine of rank 0, the folder "
    'that holds pfnet/chainer/<dataset> (default: CHAINER_DATASET_ROOT, or '
    '~/.chainer/dataset)')


# The flags of one dataset's model, with their defaults: the MLP's of
# --dataset mnist, the ResNet's of cifar10 and cifar100.
MODEL_FLAGS = {'unit': 1000, 'depth': 20, 'batchnorm': 'per-process'}
MLP_FLAGS = ('unit',)


def check_model_flags(parser, args):
    """Refuses a flag of the other dataset's model where given, and sets
    the defaults of those not given. ``args.unused`` names the flags that
    this run's model does not use: a snapshot does not record them, and a
    resume does not compare them (``cli.check_resume``), where an older
    snapshot recorded them."""
    mnist = args.dataset == 'mnist'
    args.unused = tuple(name for name in MODEL_FLAGS
                        if (name in MLP_FLAGS) != mnist)
    for name in args.unused:
        value = getattr(args, name)
        if value is None:
            continue
        if mnist:
            parser.error('--{} {}: the MLP of --dataset mnist has no {} '
                         '(--{} is for --dataset cifar10 and cifar100, the '
                         'ResNet)'.format(name, value, dict(
                             depth='depth', batchnorm='BatchNorm')[name],
                             name))
        parser.error('--{} {}: the ResNet of --dataset {} has no hidden '
                     'units to set (--{} is for --dataset mnist, the MLP)'
                     .format(name, value, args.dataset, name))
    for name, value in MODEL_FLAGS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def parse_args(argv=None):
    parser = cli.parser(
        'chainer-lars ChainerMN example: large-batch MNIST or CIFAR on many '
        'processes, one per device, launched with mpiexec', DEFAULTS,
        epilog='Batch size: --batchsize is PER PROCESS; the global batch B '
        'is batchsize times the number of processes (mpiexec -n). '
        + cli.lr_rule('the global batch B') + ' A given --lr is used as '
        'it is.', helps=HELP,
        # A usage error of the flags is every process's: rank 0 says it.
        silent=cli.launcher_rank() not in (None, 0))
    parser.add_argument('--dataset', choices=('mnist', 'cifar10', 'cifar100'),
                        default='mnist',
                        help='mnist: the MLP of examples/mnist; cifar10, '
                        'cifar100: the ResNet of examples/cifar (default: '
                        '%(default)s)')
    # None: given or not (check_model_flags), then MODEL_FLAGS' default.
    parser.add_argument('--unit', '-u', type=int,
                        help='Number of units of the MLP, for --dataset '
                        'mnist (default: {})'.format(MODEL_FLAGS['unit']))
    parser.add_argument('--depth', type=int,
                        help='ResNet depth, 6n + 2, for --dataset cifar10 '
                        'and cifar100 (default: {})'.format(
                            MODEL_FLAGS['depth']))
    parser.add_argument('--batchnorm', choices=('per-process', 'all-reduced'),
                        help="The ResNet's BatchNorm statistics, for "
                        '--dataset cifar10 and cifar100: those of '
                        "each process's mini-batch (BatchNormalization), or "
                        'those of the global batch (chainermn.links.'
                        'MultiNodeBatchNormalization, one more all-reduce '
                        'per layer) (default: {})'.format(
                            MODEL_FLAGS['batchnorm']))
    parser.add_argument('--communicator', choices=COMMUNICATORS,
                        help='ChainerMN communicator (default: naive on the '
                        'CPU, the only one there; pure_nccl on GPUs; flat '
                        'and non_cuda_aware also run on GPUs)')
    args = cli.parse_args(parser, argv, positive=['unit'], distributed=True)
    single = train_mnist if args.dataset == 'mnist' else train_cifar
    if args.epoch is None:
        args.epoch = single.DEFAULTS['epoch']
    cli.resolve_warmup(parser.error, args,
                       single.DEFAULTS['warmup_epochs'])
    check_model_flags(parser, args)
    if args.dataset == 'mnist':
        # Each process's model, against its host's memory.
        train_mnist.check_unit(parser, args)
    else:
        # Its BatchNorm layers follow convolutions: a batch of one image
        # a process is normalised over its pixels.
        train_cifar.check_depth(parser, args.depth)

    try:
        xp = chainer.get_device(args.device).xp
    except RuntimeError:
        # A device this machine cannot use (CuPy's): said once MPI is up,
        # by every process that finds it (cli.check_machine).
        xp = None
    if xp not in (None, numpy, chainer.backends.cuda.cupy):
        parser.error('--device must be a NumPy or CuPy device for ChainerMN, '
                     'got {}'.format(args.device))
    if args.communicator is None:
        args.communicator = 'naive' if xp is numpy else 'pure_nccl'
    if xp is numpy and args.communicator != 'naive':
        parser.error("--communicator {}: only 'naive' runs on the CPU; use "
                     '--communicator naive, or --device @cupy:0 for GPUs'
                     .format(args.communicator))
    return args


#: The communicators that need NCCL (CuPy's) on every machine.
NCCL_COMMUNICATORS = ('non_cuda_aware', 'pure_nccl')


def check_nccl(args):
    """Stops with a usage error where --communicator needs NCCL and CuPy
    cannot load it on this machine (ChainerMN's own refusal is a
    traceback from every process)."""
    if (args.communicator in NCCL_COMMUNICATORS
            and not getattr(chainermn_nccl, '_available', True)):
        cli.usage_error(
            "--communicator {}: needs NCCL, which CuPy cannot load on this "
            "machine (CuPy's installation guide; with CUDA 12, pip install "
            "'nvidia-nccl-cu12>=2.16.5,<3'), or give --communicator "
            'flat'.format(args.communicator))


def communicator(args):
    """ChainerMN's communicator, once every process has checked that its
    machine can run the flags (``cli.check_machine``, where an MPI
    launcher started the processes; else ``parse_args`` did) and has the
    NCCL that --communicator needs."""
    try:
        if cli.launcher_rank() is not None:
            from mpi4py import MPI
            cli.stop_together(MPI.COMM_WORLD, lambda: (
                cli.check_machine(args), check_nccl(args)))
        else:
            check_nccl(args)
        return chainermn.create_communicator(args.communicator)
    except ImportError as e:  # mpi4py: one line, as the usage errors
        cli.rank_0_says(
            '{}: ChainerMN cannot start ({}): install Open MPI and mpi4py, '
            'as examples/chainermn/README.md says\n'.format(
                os.path.basename(sys.argv[0]), str(e).split(':')[0]), 1)


def visible_gpus(args):
    """The GPUs this process sees, in CUDA's numbering, each by its UUID
    and PCI bus (None on the CPU): a scheduler may show each process a
    GPU of its own, numbered 0 in every process (CUDA_VISIBLE_DEVICES)."""
    if chainer.get_device(args.device).xp is numpy:
        return None
    runtime = chainer.backends.cuda.cupy.cuda.runtime
    return [(runtime.getDeviceProperties(i)['uuid'],
             runtime.deviceGetPCIBusId(i))
            for i in range(runtime.getDeviceCount())]


def gpu_of(intra_rank, seen):
    """The GPU of the process ``intra_rank`` of its machine (its number
    in CUDA's numbering of that process), where ``seen[r]`` lists the
    GPUs (``visible_gpus``) that the machine's process ``r`` sees: a GPU
    each, taken in the order of the ranks, each process the first free
    one it sees, or one that another gives up for one of its others (so
    that every process has one where they can). All processes see all
    GPUs: process ``r`` takes GPU ``r``; each sees its own: GPU 0."""
    owner = {}  # GPU -> the process that takes it

    def take(rank, tried):
        for gpu in sorted(seen[rank], key=lambda gpu: gpu in owner):
            if gpu not in tried:
                tried.add(gpu)
                if gpu not in owner or take(owner[gpu], tried):
                    owner[gpu] = rank
                    return True
        return False
    if not all([take(rank, set()) for rank in range(len(seen))]):
        cli.usage_error(
            '{} processes on this machine, which see {} GPUs in all, '
            'cannot each take a GPU of its own: one process per GPU'.format(
                len(seen), len(set().union(*seen))))
    gpu, = [gpu for gpu, rank in owner.items() if rank == intra_rank]
    return seen[intra_rank].index(gpu)


def select_device(args, comm, gpus):
    """This process's device: the CPU, or a GPU of its machine, one per
    process (``gpu_of``); ``gpus``: every process's ``(inter_rank,
    intra_rank, visible_gpus(args))``."""
    device = chainer.get_device(args.device)
    if device.xp is numpy:
        return device
    seen = [gpu for node, _, gpu in sorted(gpus) if node == comm.inter_rank]
    return chainer.get_device('@cupy:{}'.format(
        gpu_of(comm.intra_rank, seen)))


def load_on_rank0(args, comm):
    """``(train, test, validation)`` on rank 0, ``None`` on the others.

    Where rank 0 stops (the dataset is missing, --validation leaves no
    training images), it says why and every rank exits with its status,
    rather than wait for it in the first collective.
    """
    loaded, stop, status = (None, None, None), None, None
    if comm.rank == 0:
        try:
            train, test = (data.load_mnist() if args.dataset == 'mnist'
                           else data.load_cifar(args.dataset))
            train, validation = data.hold_out(args, train)
            loaded = train, test, validation
        except SystemExit as e:
            stop = e
        status = 0 if stop is None else (
            stop.code if isinstance(stop.code, int) else 1)
    # bcast_obj takes None on every rank but the root.
    status = comm.bcast_obj(status, root=0)
    if stop is not None:
        raise stop
    if status:
        sys.exit(status)
    return loaded


def main(argv=None):
    args = parse_args(argv)
    # Chainer's links make their arrays in chainer.config.dtype; a closed
    # standard output (| true) stops no run, even before the training.
    with chainer.using_config('dtype', cli.DTYPES[args.dtype]), \
            training.closed_output_ignored(args.out):
        run(args)


def run(args):
    comm = communicator(args)
    # An exception that one process does not survive ends the job
    # (MPI_Abort, after its traceback), rather than leave the others
    # waiting for it in a collective; usage errors (SystemExit) stop every
    # process as cli.stop_together stops them. One process has no one to
    # wait: its errors end it as Python ends it (its Ctrl-C before the
    # training, as training.quiet_interrupt does).
    if comm.size > 1:
        with warnings.catch_warnings():  # (added already: the
            warnings.simplefilter('ignore')  # CHAINERMN_FORCE_ABORT_...)
            global_except_hook.add_hook()
    # Each check in every process; where one stops, all stop, and what
    # every process found alike is said once (cli.stop_together).
    cli.stop_together(comm, lambda: cli.check_rank0_paths(args, comm))
    global_batchsize = args.batchsize * comm.size
    dtype = comm.bcast_obj(args.dtype if comm.rank == 0 else None)
    gpus = comm.mpi_comm.allgather(
        (comm.inter_rank, comm.intra_rank, visible_gpus(args)))

    def prepare():
        if args.dtype != dtype:  # CHAINER_DTYPE, set on one machine
            here = os.environ.get('CHAINER_DTYPE')
            cli.usage_error(
                '--dtype: this process would train in {} ({}) and rank 0 '
                'in {}: give --dtype, or pass the variable to every '
                'process (mpiexec -x CHAINER_DTYPE)'.format(
                    args.dtype, 'CHAINER_DTYPE={}'.format(here) if here
                    else 'CHAINER_DTYPE unset here', dtype))
        if args.validation and args.validation < comm.size:
            cli.usage_error(
                '--validation {}: fewer images than the {} processes, '
                'each of which evaluates its share of them: give at '
                'least {}'.format(args.validation, comm.size, comm.size))
        device = select_device(args, comm, gpus)
        args.lr = cli.derived_lr(cli.usage_error, args, global_batchsize)
        cli.check_resume(args, processes=comm.size)
        return device
    device = cli.stop_together(comm, prepare)
    device.use()
    if comm.rank == 0:
        cli.warn_of_slow_precision(args)

    if comm.rank == 0:
        lines = [
            'Number of processes: {}'.format(comm.size),
            'Device: {} (communicator: {})'.format(
                'one GPU per process' if device.xp is not numpy else device,
                args.communicator),
            '# Minibatch-size: {} per process, {} global'.format(
                args.batchsize, global_batchsize)]
        if args.dataset != 'mnist':
            lines.append('# dataset: {}, ResNet-{}, BatchNorm statistics {}'
                         .format(args.dataset, args.depth, args.batchnorm))
        cli.print_banner(args, *lines, batch=global_batchsize)

    # Every process draws weights; the first update replaces them with
    # rank 0's.
    numpy.random.seed(args.seed)
    if args.dataset == 'mnist':
        def build():
            try:
                model = L.Classifier(train_mnist.MLP(784, args.unit, 10),
                                     lossfun=recipe.loss_function(args))
                model.to_device(device)
            except MemoryError:  # NumPy's and CuPy's out-of-memory errors
                cli.usage_error(train_mnist.too_large(args, device))
            return model
        # Every rank stops if one cannot hold its model, rather than wait
        # for it in the first collective.
        model = cli.stop_together(comm, build)
    else:
        batchnorm = L.BatchNormalization
        if args.batchnorm == 'all-reduced':
            batchnorm = functools.partial(
                chainermn.links.MultiNodeBatchNormalization, comm=comm)
        n_class = 10 if args.dataset == 'cifar10' else 100

        def build():
            try:
                model = L.Classifier(train_cifar.ResNet(
                    args.depth, n_class, batchnorm),
                    lossfun=recipe.loss_function(args))
                for link in model.links():
                    # ChainerMN 7.8.1 starts the running variance at 0
                    # (Chainer's BatchNormalization at 1): the test and
                    # validation losses of the first epochs were huge.
                    if isinstance(link, (
                            chainermn.links.MultiNodeBatchNormalization)):
                        link.avg_var[...] = 1
                model.to_device(device)
            except MemoryError:  # NumPy's and CuPy's out-of-memory errors
                cli.usage_error(
                    '--depth {}: the model does not fit in memory (on {}); '
                    'give a smaller --depth'.format(args.depth, device))
            return model
        model = cli.stop_together(comm, build)
    optimizer, lars = recipe.make_optimizer(args, model, comm)

    # Only rank 0 reads the dataset; each process gets a shard.
    train, test, validation = load_on_rank0(args, comm)
    # The whole training set's size: equal shards may share examples.
    n_examples = comm.bcast_obj(len(train) if comm.rank == 0 else None)
    # The training shards are of one length (every process runs the same
    # updates), neighbours sharing an example where need be; the test
    # and validation sets are split into parts, each example in one
    # (training.over_all_shards).
    if args.validation:
        validation = chainermn.scatter_dataset(
            validation, comm, shuffle=True, seed=args.seed,
            force_equal_length=False)
    train = chainermn.scatter_dataset(train, comm, shuffle=True,
                                      seed=args.seed)
    test = chainermn.scatter_dataset(test, comm, shuffle=True,
                                     seed=args.seed, force_equal_length=False)

    # Each process shuffles (and augments) its shard by its own random
    # state.
    random_state = numpy.random.RandomState(args.seed + comm.rank)
    if args.dataset != 'mnist':
        train = chainer.datasets.TransformDataset(
            train, data.Augment(random_state))
    train_iter = chainer.iterators.SerialIterator(
        train, args.batchsize,
        order_sampler=chainer.iterators.ShuffleOrderSampler(random_state))
    training.train(args, device, optimizer, lars, train_iter, test, comm,
                   validation=validation if args.validation else None,
                   n_examples=n_examples)


if __name__ == '__main__':
    with training.quiet_interrupt():
        main()
