"""Chainer's trainer, assembled from the recipe and the reports.

``train`` runs a trainer in one process or, with ChainerMN, in many; the
reports are an evaluator that weights each batch by its size (and each
ChainerMN process's part of the data by its size), the log, the
plots (``examples/plots.py``) and the snapshots.
"""

import contextlib
import gc
import math
import os
import re
import select
import shlex
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions

from examples import cli
from examples import logs
from examples import plots
from examples import recipe


def train(args, device, optimizer, lars, train_iter, test, comm=None,
          validation=None, n_examples=None):
    """Trains ``optimizer.target`` by Chainer's trainer, with the recipe.

    ``optimizer`` and ``lars`` are ``make_optimizer``'s. The trainer runs
    ``train_iter`` for --epoch epochs under the recipe's schedule, evaluates
    on ``test`` as --test says, and on ``validation`` (``data.hold_out``'s
    set, or None) at each ``evaluation_trigger``, and reports, plots and
    snapshots (``report``). With a ChainerMN communicator ``comm``, the
    evaluation is over every process's part of the test and validation
    sets (``over_all_shards``), the training loss and accuracy are
    averaged over the processes, and rank 0 alone reports and writes;
    ``n_examples`` is then the number of examples of the whole training
    set, of which ``train_iter`` has this process's shard.
    """
    model = optimizer.target
    n_train = len(train_iter.dataset)
    if comm is None:
        settings = {'examples': n_train}
    else:
        settings = {'examples': n_train, 'processes': comm.size}

    # With ChainerMN, in every process; where one stops, all stop.
    def check():
        if comm is None:
            cli.check_batchsize(args, n_train)
        else:
            cli.check_batchsize(args, n_examples, processes=comm.size)
        cli.check_iterations(args, n_train)
        cli.check_resume(args, **settings)
    cli.stop_together(comm, check)
    updater = training.updaters.StandardUpdater(
        train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # Every process counts the same iterations: ChainerMN's shards are of
    # equal length.
    iterations_per_epoch = n_train / args.batchsize
    trainer.extend(recipe.schedule(args, n_train))
    scaling = None
    if args.dtype != 'float32':
        scaling = recipe.loss_scale_state(trainer, optimizer)
    evaluators = []
    if args.test != 'never':
        evaluators.append((Evaluator(
            chainer.iterators.SerialIterator(test, args.batchsize,
                                             repeat=False, shuffle=False),
            model, device=device), logs.TEST, test_trigger(args),
            args.test == 'each-epoch'))
    if validation is not None:
        evaluators.append((Evaluator(
            chainer.iterators.SerialIterator(validation, args.batchsize,
                                             repeat=False, shuffle=False),
            model, device=device), logs.VALIDATION, evaluation_trigger(args),
            True))
    if comm is not None:
        import chainermn
        evaluators = [(over_all_shards(e, comm), n, t, b)
                      for e, n, t, b in evaluators]
        # Rank 0 reports the training loss and accuracy of the global
        # batch, not of its shard.
        averaged = ('main/loss', 'main/accuracy')
        trainer.extend(_unwrap_variables(averaged))
        for key in averaged:
            trainer.extend(
                chainermn.extensions.ObservationAggregator(comm, key))
        # Before the evaluators (and the snapshot) that use them.
        trainer.extend(average_batch_norm(model, comm),
                       trigger=evaluation_trigger(args),
                       priority=training.PRIORITY_WRITER + 1)
    # The name is the prefix of the keys: test/main/accuracy is the test
    # set's, val/main/accuracy the validation set's (examples/logs.py).
    for evaluator, name, trigger, before in evaluators:
        trainer.extend(evaluator, name=name, trigger=trigger,
                       call_before_training=before)
    # After the ObservationAggregators: every process sees the same loss,
    # and they stop together.
    divergence = Divergence(args.out, say=comm is None or comm.rank == 0)
    trainer.extend(divergence)
    trainer.stop_trigger = divergence.stop_trigger(trainer.stop_trigger)

    # The parameters, and so the trust ratios, are the same in every
    # process: report and save on rank 0 only.
    if comm is None or comm.rank == 0:
        ratio_keys = recipe.observe_trust_ratios(
            trainer, lars, model, iterations_per_epoch, args.eval_every)
        report(trainer, args, ratio_keys, divergence,
               plots.run_title(args, None if comm is None else comm.size),
               scaling, **settings)

    if args.resume is not None:
        cli.stop_together(comm, lambda: cli.load_snapshot(args, trainer))
    if comm is not None and comm.rank == 0:
        warn_of_no_update(args, lars, trainer.updater.iteration,
                          recipe.iterations(args, n_train),
                          iterations_per_epoch)

    old = cli.OldRun(args.out) if args.overwrite and (
        comm is None or comm.rank == 0) else None
    if old is not None:
        def remove_old_run(trainer):  # after the first update
            old.remove()
        trainer.extend(remove_old_run, trigger=(1, 'iteration'))
        old.set_aside()
    if comm is not None and comm.rank != 0:
        # Chainer's Trainer makes its folder in every process, and rank 0
        # alone writes --out: the others' (on other machines too) is the
        # null device, which makedirs leaves as it is, which nothing can
        # be written under, and which no killed process leaves behind.
        trainer.out = os.devnull
    try:
        interruption = Interruption(
            args, trainer, say=comm is None or comm.rank == 0,
            cleanup=None if old is None else old.restore,
            processes=None if comm is None else comm.size)
        # The warnings held are shown before Interruption's last words
        # (the command that resumes the run).
        with closed_output_ignored(args.out), interruption, \
                divergence.held_warnings():
            trainer.run()
    except BaseException:  # before the first update: the old run back
        if old is not None:
            old.restore()
        raise
    if divergence.found is not None:
        if divergence.say:
            cli.say('stopped: the run diverged (see above); the log and the '
                    'plots in {} show it'.format(args.out))
        sys.exit(1)


def warn_of_no_update(args, lars, iteration, iterations, per_epoch=None):
    """With ChainerMN: says where the run, at ``iteration`` of its
    ``iterations``, has one left. ChainerMN's first ``update()`` of a start
    or a --resume copies rank 0's parameters to every process and takes
    no step (examples/chainermn/README.md): that run trains nothing, and
    logs no trust ratio (of ``lars``, ``make_optimizer``'s), where the
    single-process trainer's would. A new run of ``per_epoch`` 1 writes
    its first snapshot after that update alone, with no optimizer state:
    --resume refuses it, which it says too."""
    if (per_epoch == 1 and iteration == 0 and args.snapshots
            and iterations > 1):
        cli.say(
            "warning: one iteration an epoch, which ChainerMN spends in "
            "epoch 1 copying rank 0's parameters to every process (its "
            'first update takes no step): snapshot_iter_1 holds no '
            'optimizer state, and --resume refuses it (resume a later '
            'snapshot); give a smaller --batchsize for more iterations an '
            'epoch')
    if iterations - iteration != 1:
        return
    cli.say(
        "warning: this run has 1 iteration{}, which ChainerMN spends "
        "copying rank 0's parameters to every process (the first update "
        'of a start or a --resume takes no step): it trains nothing{}{}'
        .format(' left' if iteration else '',
                '' if lars is None else ' and logs no trust ratios',
                '' if args.resume is not None
                else '; give a larger --epoch or a smaller --batchsize'))


@contextlib.contextmanager
def closed_output_ignored(out):
    """Standard output that closes during the training (``| head``, a
    terminal's pager quit) stops no run: the training goes on, writing
    its log, snapshots and plots in ``out`` as ever, its console output
    dropped, and one line on stderr says so. Python's ``BrokenPipeError``
    ended the run with a traceback: a long run would be lost for a
    glance at its first lines (examples/README.md)."""
    stream = sys.stdout
    guard = sys.stdout = _SurvivingOutput(stream, out)
    try:
        yield
    finally:
        if not guard.closed_under_us:  # else what follows writes to it too
            sys.stdout = stream


class _SurvivingOutput(object):

    """``stream`` (standard output), whose writes once its reader has
    gone are dropped, with one line on stderr (``closed_output_ignored``)."""

    def __init__(self, stream, out):
        self._stream = stream
        self._out = out
        self.closed_under_us = False

    def write(self, text):
        if not self.closed_under_us:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def flush(self):
        if not self.closed_under_us:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed()

    def _closed(self):
        self.closed_under_us = True
        try:
            # What is still buffered, and Python's flush at exit, go to
            # the null device, not to a closed pipe (another traceback).
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # not a file
            pass
        cli.say('standard output was closed (its reader ended, as | head '
                'does): the training goes on without it, and writes its '
                'log, snapshots and plots in {}'.format(self._out))

    def __getattr__(self, name):
        return getattr(self._stream, name)


class Interrupted(KeyboardInterrupt):

    """Raised in the main thread by ``Interruption`` at SIGINT (Ctrl-C)
    or SIGTERM; ``signal`` is which."""

    def __init__(self, signum):
        super(Interrupted, self).__init__(signal.Signals(signum).name)
        self.signal = signum


@contextlib.contextmanager
def quiet_interrupt():
    """Ctrl-C before the training (reading the data, building the model,
    loading --resume): one line and status 130, as ``Interruption``
    gives during the training, not a traceback. Once the training has
    begun, a second Ctrl-C while the first is said ends with 130 and no
    more; where ChainerMN's except hook is set (a job of several
    processes, all of which it ends; or CHAINERMN_FORCE_ABORT_ON_EXCEPTION
    set), it is left to that hook."""
    Interruption.began = False
    try:
        yield
    except KeyboardInterrupt:
        chainermn_hook = sys.modules.get('chainermn.global_except_hook')
        if sys.excepthook is getattr(chainermn_hook, '_global_except_hook',
                                     None):
            raise
        if not Interruption.began:
            cli.say('interrupted before the training began: run the '
                    'command again')
        sys.exit(130)


class Interruption(object):

    """Ctrl-C or SIGTERM during ``trainer.run()``: one line, no traceback,
    status 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

    The line says where the run stopped and, where this run wrote a
    snapshot (or was resumed from one), the command that continues it:
    the same command with ``--resume`` (``resume_command``); where there
    is none, it says so. SIGTERM is what ``kill`` and job schedulers
    send, and what Open MPI's ``mpiexec`` turns Ctrl-C into: it sends
    each process SIGTERM, then SIGKILL a second later
    (``odls_base_sigkill_timeout``). Python acts on a signal between two
    of its operations, so a single long one (a float16 matrix product on
    the CPU takes minutes, a collective waits for another process) would
    hold it back: a watcher thread sees the signal at once
    (``signal.set_wakeup_fd``), and if the run has not begun to stop
    within ``GRACE`` seconds of SIGINT, or ``TERM_GRACE`` of SIGTERM
    (before the SIGKILL), it says the same and calls ``cleanup`` (what
    the run's ``except`` would have done: --overwrite's
    ``OldRun.restore``), then ends the process ``GRACE`` seconds after
    the signal. ``say``: this process prints (ChainerMN's rank 0);
    ``processes``: ChainerMN's number, for ``resume_command``. The
    handlers are this object's from ``__enter__`` to ``__exit__`` only,
    and only where they were Python's defaults; a signal once the run
    has ended, whole, stops nothing.
    """

    GRACE = 3.0
    TERM_GRACE = 0.2
    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    began = False  # set by __enter__, unset by quiet_interrupt

    def __init__(self, args, trainer, say=True, cleanup=None,
                 processes=None):
        self._args = args
        self._processes = processes
        self._trainer = trainer
        self._say = say
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._stopping = False
        self._raised = None  # the signal the main thread acted on
        self._handlers = {}

    def __enter__(self):
        Interruption.began = True
        self._start = time.time()
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        try:
            self._previous = signal.set_wakeup_fd(self._write)
        except ValueError:  # not the main thread: no watcher, no handlers
            self._previous = None
            os.close(self._read)
            return self
        for signum in self.SIGNALS:
            # Not where the caller has its own handler, or ignores the
            # signal (a job started in the background ignores SIGINT).
            if signal.getsignal(signum) in (signal.SIG_DFL,
                                            signal.default_int_handler):
                self._handlers[signum] = signal.signal(signum, self._handle)
        # Python drops an exception raised in a weakref callback or a
        # __del__ (Chainer and matplotlib run them all the time), printing
        # "Exception ignored": the signal is raised again after the update,
        # and not printed where it was dropped.
        self._unraisable = sys.unraisablehook
        sys.unraisablehook = self._dropped
        if self._handlers and hasattr(self._trainer, 'extend'):
            def raise_again(trainer):
                if self._raised is not None:  # the first was dropped
                    raise Interrupted(self._raised)
            self._trainer.extend(raise_again, name='Interruption',
                                 trigger=(1, 'iteration'), priority=1000)
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def _handle(self, signum, frame):
        if getattr(self._trainer, '_done', False):
            # trainer.run() has returned, whole: nothing left to stop (it
            # would raise in the handlers' restoring, with a traceback).
            return
        self._raised = signum
        raise Interrupted(signum)

    def _dropped(self, unraisable):
        if not isinstance(unraisable.exc_value, Interrupted):
            self._unraisable(unraisable)

    def __exit__(self, kind, value, tb):
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)
        if self._previous is not None:  # (else none of them was set)
            signal.set_wakeup_fd(self._previous)
            sys.unraisablehook = self._unraisable
        os.close(self._write)  # the watcher reads the end and returns
        if not isinstance(value, KeyboardInterrupt):
            return False
        self._stop()
        # A snapshot being written when the signal came holds an open
        # zip file: let it go now, without the warning Python would
        # print at exit.
        hook, sys.unraisablehook = sys.unraisablehook, lambda _: None
        try:
            traceback.clear_frames(tb)
            gc.collect()
        finally:
            sys.unraisablehook = hook
        sys.exit(128 + getattr(value, 'signal', signal.SIGINT))

    def _watch(self):
        signum, said, end = None, None, None
        while True:
            now = time.time()
            deadline = min(t for t in (said, end, math.inf)
                           if t is not None)
            try:
                ready, _, _ = select.select(
                    [self._read], [], [],
                    None if deadline == math.inf else max(0, deadline - now))
                byte = os.read(self._read, 1) if ready else None
            except (OSError, ValueError):
                break
            now = time.time()  # the graces count from the signal
            if byte == b'':  # the run ended
                break
            if byte is not None:
                if byte[0] not in self._handlers:  # not ours to act on
                    continue
                if signum is None:
                    signum = byte[0]
                    said = now + (self.GRACE if signum == signal.SIGINT
                                  else self.TERM_GRACE)
                    end = now + self.GRACE
                elif byte[0] == signal.SIGTERM and said is not None:
                    said = min(said, now + self.TERM_GRACE)  # SIGKILL next
                continue
            if said is not None:  # the grace is over: say it, if still to
                said = None
                if (self._raised is None and self._stop()
                        and self._cleanup is not None):
                    self._cleanup()
                continue  # until __exit__ closes the pipe, or the end
            # The run is stuck (in a long call, or the main thread's
            # Interrupted was dropped and no update has ended since): end it.
            if (self._raised is not None and self._stop()
                    and self._cleanup is not None):
                self._cleanup()
            os._exit(128 + signum)
        os.close(self._read)

    def _stop(self):
        """Says where the run stopped, once; whether this call said it."""
        with self._lock:
            if self._stopping:
                return False
            self._stopping = True
        if self._say:
            sys.stdout.write('\n')
            cli.say(self.message())
        return True

    def message(self):
        updater = self._trainer.updater
        # Of the updates done: mid-update the iterator is a batch ahead.
        batches = updater.get_iterator('main')
        where = 'interrupted at iteration {} (epoch {:.2f} of {})'.format(
            updater.iteration, updater.iteration * batches.batch_size
            / len(batches.dataset), self._args.epoch)
        snapshot = self.snapshot()
        if snapshot is None:
            why = ('--snapshots 0 writes none' if not self._args.snapshots
                   else 'the first is written at the end of epoch 1')
            return '{}; no snapshot to resume from ({}): run the command ' \
                'again with --overwrite to start over'.format(where, why)
        return '{}; to continue from {}, run: {}'.format(
            where, snapshot, resume_command(snapshot,
                                            processes=self._processes))

    def snapshot(self):
        """The latest snapshot this run wrote in --out, else the one it
        was resumed from, else None."""
        out = self._args.out
        found = []
        try:
            names = os.listdir(out)
        except OSError:
            names = []
        for name in names:
            iteration = cli.snapshot_iteration(name)
            path = os.path.join(out, name)
            if iteration is not None and (
                    os.stat(path).st_mtime >= self._start - 1):
                found.append((iteration, path))
        if found:
            return max(found)[1]
        return self._args.resume


def resume_command(snapshot, argv=None, processes=None):
    """The command of this run with ``--resume snapshot``, to paste.

    The script as it was started (``dev.sh`` names itself in
    ``CHAINER_LARS_LAUNCHER``; a module is run with ``-m``), its
    arguments without a --resume of their own. A ChainerMN run of
    ``processes`` processes that ``dev.sh`` did not start is given
    ``mpiexec -n N`` (the options of your own ``mpiexec``, such as a
    hostfile, are not known here: add them).
    """
    argv = list(sys.argv if argv is None else argv)
    launcher = os.environ.get('CHAINER_LARS_LAUNCHER')
    if launcher:
        command = shlex.split(launcher)
    else:
        python = 'python' if shutil.which('python') and os.path.realpath(
            shutil.which('python')) == os.path.realpath(
                sys.executable) else sys.executable
        main = sys.modules.get('__main__')
        spec = getattr(main, '__spec__', None)
        if spec is not None and spec.name:
            command = [python, '-m', spec.name]
        else:
            command = [python, argv[0]]
        if processes is not None:
            command = ['mpiexec', '-n', str(processes)] + command
    args, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == '-r' or _abbreviates(arg, '--resume') and '=' not in arg:
            skip = True
        elif _abbreviates(arg, '--overwrite'):  # refused with --resume
            continue
        elif not (_abbreviates(arg, '--resume') or arg.startswith('-r')):
            args.append(arg)  # (-rPATH and --res=PATH are left out too)
    return shlex.join(command + args + ['--resume', snapshot])


def _abbreviates(arg, name):
    """Whether ``arg`` is the flag ``name`` as argparse reads it: whole,
    or a prefix (an ambiguous one was refused), with ``=VALUE`` or not."""
    head = arg.split('=', 1)[0]
    return len(head) > 2 and head.startswith('--') and name.startswith(head)


def _unwrap_variables(keys):
    """Replaces the reported Variables of ``keys`` by their arrays.

    ChainerMN 7.8.1's ObservationAggregator moves a Variable to the device
    ``'native'``, a ChainerX device, and so fails where Chainer is built
    without ChainerX (the pip wheel); it takes plain arrays as they are.
    Runs just before the aggregators.
    """
    @training.make_extension(
        trigger=(1, 'iteration'), priority=training.PRIORITY_EDITOR + 1)
    def unwrap(trainer):
        for key in keys:
            value = trainer.observation.get(key)
            if isinstance(value, chainer.Variable):
                trainer.observation[key] = value.array
    return unwrap


class Divergence(training.Extension):

    """Stops a run whose training loss is no longer finite, and says so.

    At the first update whose ``main/loss`` is NaN or infinite it prints
    one line at once (``say``: this process prints); the trainer then
    stops at the end of that epoch (``stop_trigger``), so that the log,
    the evaluation and the plots, which mark a non-finite epoch, show the
    divergence, and ``train`` exits with status 1. A diverged model stays
    diverged: the epochs after would only add NaN.
    """

    trigger = 1, 'iteration'
    priority = training.PRIORITY_EDITOR - 1

    def __init__(self, out, say=True):
        self.out = out
        self.say = say
        self.found = None  # (iteration, epoch_detail, loss)
        self._held = []  # the warnings of the update (held_warnings)
        self._show = None

    @contextlib.contextmanager
    def held_warnings(self):
        """Holds the RuntimeWarnings (NumPy's invalid value, overflow)
        of each update until its loss is known: shown where it is finite,
        dropped where it is not (this line says it clearly; NumPy's
        "invalid value encountered in subtract" came first) and from then
        on (the diverged model's evaluation)."""
        self._show = show = warnings.showwarning

        def hold(message, category, *args, **kwargs):
            if issubclass(category, RuntimeWarning):
                self._held.append((message, category, args, kwargs))
            else:
                show(message, category, *args, **kwargs)
        warnings.showwarning = hold
        try:
            yield
        finally:
            warnings.showwarning = show
            self._release()

    def _release(self):
        held, self._held = self._held, []
        if self.found is None and self._show is not None:
            for message, category, args, kwargs in held:
                self._show(message, category, *args, **kwargs)

    def __call__(self, trainer):
        if self.found is not None:
            self._held = []
            return
        loss = trainer.observation.get('main/loss')
        if loss is None:
            self._release()
            return
        loss = float(chainer.as_array(loss))
        if math.isfinite(loss):
            self._release()
            return
        self._held = []
        updater = trainer.updater
        self.found = updater.iteration, updater.epoch_detail, loss
        if self.say:
            cli.say('the training loss is {} at iteration {} (epoch {:.2f}): '
                    'the run diverged (try a smaller --lr); it stops at '
                    'the end of this epoch, and the log and the plots in {} '
                    'mark it'.format(loss, updater.iteration,
                                     updater.epoch_detail, self.out))

    def stop_trigger(self, trigger):
        """The trainer's stop trigger ``trigger``, or the end of the epoch
        in which the run diverged."""
        divergence = self

        class Stop(object):
            def __call__(self, trainer):
                return trigger(trainer) or (
                    divergence.found is not None
                    and trainer.updater.is_new_epoch)

            def __getattr__(self, name):
                # The rest is the trigger's (the progress bar's
                # get_training_length, serialize).
                return getattr(trigger, name)

        return Stop()


def evaluation_trigger(args):
    """Each epoch's end, and every --eval-every iterations if given.

    Stateless, so that --resume continues it exactly; the log follows it,
    so that each evaluation of the validation set is a line of the log.
    """
    every = args.eval_every

    def trigger(trainer):
        updater = trainer.updater
        return updater.is_new_epoch or bool(
            every and updater.iteration % every == 0)
    return trigger


def test_trigger(args):
    """When --test evaluates the test set: each epoch, or the last only.

    ``None`` is the evaluator's own trigger, each epoch, before training
    too; ``end`` fires once, after the last update.
    """
    if args.test == 'each-epoch':
        return None

    def trigger(trainer):
        updater = trainer.updater
        return updater.is_new_epoch and updater.epoch >= args.epoch
    return trigger


# -- The reports -----------------------------------------------------------

class Evaluator(extensions.Evaluator):

    """Chainer's Evaluator, with each batch weighted by its size.

    Chainer's Evaluator takes the plain mean of the values reported for each
    batch, so that a short last batch counts as much as a full one: with
    10,000 test images in batches of 8192, the last 1808 images would make
    half of the result. This one weights what the model reports for a batch
    by the number of its examples, so that ``test/main/accuracy`` is the
    accuracy on the whole test set.
    """

    def __init__(self, iterator, target, **kwargs):
        super(Evaluator, self).__init__(iterator, target, **kwargs)
        self.eval_func = self._weighted
        # key: [correct predictions, examples] of the evaluation under way
        self._counts = {}

    def evaluate(self):
        """Chainer's means, the accuracy counted: in 16 bits each batch's
        accuracy is a float16 mean, which rounds (k / 8192 needs 13 bits;
        the log said 0.10460380859375 of 10,000 images), and even float64
        weights would not give k / 10000 back exactly."""
        self._counts = {}
        result = super(Evaluator, self).evaluate()
        for key, (correct, examples) in self._counts.items():
            result[key] = correct / examples
        return result

    def _weighted(self, *in_arrays, **in_dict):
        # Evaluator.evaluate gives each batch a fresh observation.
        observation = chainer.reporter.get_current_reporter().observation
        target = self._targets['main']
        target(*in_arrays, **in_dict)
        first = in_arrays[0] if in_arrays else next(iter(in_dict.values()))
        for key, value in observation.items():
            observation[key] = (value, len(first))
        correct = _correct_predictions(target, in_arrays, in_dict)
        if correct is not None:
            for key in observation:
                if key.endswith('/accuracy'):
                    counts = self._counts.setdefault(key, [0, 0])
                    counts[0] += correct
                    counts[1] += len(first)


def _correct_predictions(target, in_arrays, in_dict):
    """How many of the batch a ``Classifier`` with Chainer's accuracy
    predicted right (as ``F.accuracy`` counts them), or None."""
    if not (isinstance(target, L.Classifier)
            and target.compute_accuracy and target.y is not None
            and target.accfun is F.accuracy):
        return None
    key = target.label_key
    t = in_arrays[key] if isinstance(key, int) else in_dict[key]
    y = target.y.array
    return int((y.argmax(axis=1).reshape(t.shape) == t).sum())


def over_all_shards(evaluator, comm):
    """Makes ``evaluator`` (an ``Evaluator``) report its means over the
    whole dataset, of which each ChainerMN process evaluates a shard.

    ChainerMN's ``create_multi_node_evaluator`` averages the processes'
    means with equal weights, exact only for shards of one length, which
    ``scatter_dataset`` makes by letting neighbouring shards share an
    example (10,000 test images on 3 processes: 2 of them counted
    twice). The shards here are the dataset's parts
    (``force_equal_length=False``), and each process's mean, itself
    weighted by the size of each batch, is weighted by the number of its
    examples: every example counts once. A process whose shard is empty
    reports nothing, and is not counted.
    """
    evaluate = evaluator.evaluate
    size = len(evaluator.get_iterator('main').dataset)

    def evaluate_all():
        means = {key: float(value) for key, value in evaluate().items()}
        shards = comm.mpi_comm.allgather((size, means))
        keys = sorted(set().union(*(means for _, means in shards)))
        return {key: sum(n * means[key] for n, means in shards
                         if key in means)
                / sum(n for n, means in shards if key in means)
                for key in keys}
    evaluator.evaluate = evaluate_all
    return evaluator


def average_batch_norm(model, comm):
    """An extension that averages the running means and variances of
    ``model``'s ``BatchNormalization`` links over ChainerMN's processes,
    in one all-reduce, as timm's ``distribute_bn`` does before it
    evaluates.

    Each process's statistics are those of its own batches. Averaged,
    every process evaluates its part of the data with the same model,
    and the snapshot (rank 0's) holds the model the log's test and
    validation results are of. ``MultiNodeBatchNormalization``'s are
    the global batch's already, the same in every process. (ChainerMN's
    ``AllreducePersistent`` does the same in one all-reduce an array,
    each of which MPI reads from GPU memory.)
    """
    links = [link for link in model.links()
             if isinstance(link, chainer.links.BatchNormalization)]

    def average_statistics(trainer):
        if not links:
            return
        arrays = [array for link in links
                  for array in (link.avg_mean, link.avg_var)]
        xp = chainer.backend.get_array_module(arrays[0])
        # Through the host: ChainerMN hands a GPU array's address to MPI,
        # which need not read GPU memory (pure_nccl, non_cuda_aware).
        mean = xp.asarray(comm.allreduce(chainer.backend.CpuDevice().send(
            xp.concatenate([a.ravel().astype(xp.float32) for a in arrays])))
            / comm.size)
        offset = 0
        for array in arrays:
            array[...] = mean[offset:offset + array.size].reshape(array.shape)
            offset += array.size
    return average_statistics


def end_of_epoch(trainer):
    """The plots' trigger, stateless so that --resume continues them exactly.

    PlotReport's default IntervalTrigger is not saved in snapshots, and a
    resumed one fires at once, adding a point in the middle of an epoch.
    """
    return trainer.updater.is_new_epoch


def report(trainer, args, ratio_keys, divergence=None, title=None,
           scaling=None, **settings):
    """Adds the snapshots, the log, the plots and the printed report.

    ``ratio_keys`` are the trust ratios to draw
    (``recipe.observe_trust_ratios``); the plots are titled ``title`` and
    mark where the ``Divergence`` extension ``divergence`` found the run
    diverged; ``scaling``, the ``chainer_lars.LossScaleState`` of a float16
    or mixed16 run, gives the loss scale and the skipped updates to log and
    draw; ``settings`` go into the snapshots with the flags
    ``cli.check_resume`` compares.
    """
    if args.snapshots:
        trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
        trainer.extend(keep_latest_snapshots(args.snapshots))
    trainer.extend(cli.RunSettings(cli.run_settings(args, **settings)))
    observe = extensions.observe_lr()
    if args.optimizer in recipe.ADAM_LIKE:
        # The scheduled rate, alpha: their lr is alpha after bias
        # correction, undefined before the first update.
        observe = extensions.observe_value('lr', lambda trainer: (
            trainer.updater.get_optimizer('main').alpha))
    trainer.extend(observe, trigger=(1, 'iteration'),
                   call_before_training=True)
    columns = []
    if scaling is not None:
        trainer.extend(report_loss_scale(scaling), call_before_training=True)
        columns = ['loss_scale', 'skipped_updates']
    trainer.extend(extensions.LogReport(
        trigger=(evaluation_trigger(args) if args.eval_every
                 else (1, 'epoch'))), call_before_training=True)

    if args.plot and extensions.PlotReport.available():
        # Draw into files without a display.
        import matplotlib
        matplotlib.use('Agg')
        held_out = ['val/main/'] if args.validation else []
        trainer.extend(EpochPlot(
            [k + 'loss' for k in ['main/', 'test/main/'] + held_out], 'epoch',
            last=[k + 'loss' for k in held_out],
            filename='loss.png', trigger=end_of_epoch,
            postprocess=plots.epoch_axes(
                'loss (softmax cross entropy{}, log scale)'.format(
                    ' with label smoothing {:g}'.format(args.label_smoothing)
                    if args.label_smoothing else ''), log=True,
                title=title, divergence=divergence)),
            call_before_training=True)
        trainer.extend(EpochPlot(
            [k + 'accuracy' for k in ['main/', 'test/main/'] + held_out],
            'epoch', last=[k + 'accuracy' for k in held_out],
            filename='accuracy.png', trigger=end_of_epoch,
            postprocess=plots.epoch_axes(
                'accuracy (%)', percent=True, title=title,
                divergence=divergence)),
            call_before_training=True)
        # Adam's and LAMB's scheduled rate is alpha, as the title says.
        trainer.extend(plots.IterationPlot(
            'lr', 'lr.png', 'alpha' if args.optimizer in recipe.ADAM_LIKE
            else 'learning rate', title=title, divergence=divergence))
        if ratio_keys:
            trainer.extend(plots.TrustRatioHeatmap(
                ratio_keys, title=title, every=args.eval_every,
                iterations_per_epoch=settings['examples'] / args.batchsize),
                trigger=end_of_epoch)
        if scaling is not None:
            trainer.extend(plots.LossScalePlot(scaling, title=title))

    printed = ['epoch', 'main/loss', 'test/main/loss',
               'main/accuracy', 'test/main/accuracy', 'lr'] + columns
    if args.validation:
        printed[5:5] = ['val/main/accuracy']
    if args.test == 'never':  # no test columns, always empty
        printed = [key for key in printed if not key.startswith('test/')]
    if args.eval_every:  # several lines an epoch
        printed[1:1] = ['iteration']
    progress = args.progress
    if progress == 'auto':
        # The bar moves the cursor with escape codes: in a log file, lines.
        progress = 'bar' if output_is_terminal() else 'lines'
    # PrintReport clears the bar with an escape code before each line.
    trainer.extend(extensions.PrintReport(
        printed + ['elapsed_time'],
        out=CurrentOutput() if progress == 'bar' else PlainOutput()),
        call_before_training=True)
    if progress == 'bar':
        # Minutes an update in 16 bits on the CPU: every update.
        trainer.extend(ProgressBar(
            update_interval=1 if cli.slow_precision(args) else 10))
    elif progress == 'lines':
        trainer.extend(ProgressLines())
    if progress != 'none' and cli.slow_precision(args):
        trainer.extend(Heartbeat())  # a line while an update runs


class EpochPlot(extensions.PlotReport):

    """Chainer's PlotReport at each epoch's end, whose ``last`` keys (the
    validation set's, which --eval-every evaluates within the epoch too)
    are drawn as the evaluation at the epoch's end, as the log has it:
    PlotReport draws the mean of all of the epoch's evaluations, which
    lagged the log's by most of an epoch.

    It records and saves what PlotReport does, and draws as it does but
    for the legend, which the postprocess places: PlotReport adds one
    beside the axes after the postprocess, with no say in where, and the
    picture widened for it by up to two thirds.
    """

    default_name = 'PlotReport'  # the snapshots' names of the extensions

    def __init__(self, *args, last=(), **kwargs):
        super(EpochPlot, self).__init__(*args, **kwargs)
        self._last = last

    def __call__(self, trainer):
        # Chainer 7.8.1's PlotReport.__call__, its summary by key.
        import matplotlib.pyplot as plt
        observation = trainer.observation
        for key in self._last:
            if key in observation:
                self._summary._summaries.pop(key, None)
        self._summary.add({key: observation[key] for key in self._y_keys
                           if key in observation})
        if not (trainer.is_before_training or self._trigger(trainer)):
            return
        summary = self._summary
        means = summary.compute_mean()
        self._init_summary()
        x = getattr(trainer.updater, self._x_key)  # epoch or iteration
        for key in self._y_keys:
            if key in means:
                self._data[key].append((x, float(means[key])))
        figure, axes = plt.subplots()
        axes.set_xlabel(self._x_key)
        if self._grid:
            axes.grid()
        for key in self._y_keys:
            if self._data[key]:
                xs, ys = zip(*self._data[key])
                axes.plot(xs, ys, marker=self._marker, label=key)
        if axes.has_data():
            if self._postprocess is not None:
                self._postprocess(figure, axes, summary)
            figure.savefig(os.path.join(trainer.out, self._file_name),
                           bbox_inches='tight')
        plt.close(figure)


def output_is_terminal():
    """Whether standard output is a terminal, for --progress auto.

    ``CHAINER_LARS_TERMINAL`` (1 or 0), where set, says it instead of
    ``isatty``: under Open MPI's ``mpiexec`` every rank writes to a
    pseudo-terminal, whatever ``mpiexec``'s own output is, so
    ``dev.sh chainermn`` sets it from its own (``cli.parse_args`` has
    checked its value).
    """
    said = os.environ.get(cli.TERMINAL_VARIABLE)
    if said:
        return said == '1'
    return sys.stdout.isatty()


class CurrentOutput(object):

    """Standard output, whatever ``sys.stdout`` is at each write (Chainer's
    reports keep the stream they were given: ``closed_output_ignored``
    changes it under them)."""

    def write(self, text):
        return sys.stdout.write(text)

    def flush(self):
        sys.stdout.flush()


class PlainOutput(CurrentOutput):

    """Standard output without the escape code with which ``PrintReport``
    clears the progress bar before each line, for a run without the bar."""

    def write(self, text):
        if text != '\033[J':
            sys.stdout.write(text)


class ProgressBar(extensions.ProgressBar):

    """Chainer's progress bar, whose speed and time left are measured
    from the start of the training. Chainer's measures from its own first
    draw, which has no earlier time to measure from: it showed ``inf
    iters/sec. Estimated time to finish: 0:00:00.`` until the next draw
    (with the defaults, a minute)."""

    def initialize(self, trainer):
        updater = trainer.updater
        # Chainer 7.8.1's record of (iteration, epoch, time) of its draws,
        # from which it takes the speed; its stream, sys.stdout when made.
        self._pbar._recent_timing.append(
            (updater.iteration, updater.epoch_detail, time.time()))
        self._pbar._out = CurrentOutput()


class ProgressLines(training.Extension):

    """What Chainer's progress bar shows, as a plain line every
    ``interval`` seconds (checked after each update), for output that is
    not a terminal: how far the run is, its speed and the time left."""

    trigger = 1, 'iteration'
    priority = training.PRIORITY_READER

    def __init__(self, interval=30.0):
        self._interval = interval
        self._start = None  # (time, iteration, done) when training starts
        self._last = None

    @staticmethod
    def _done(trainer):
        length, unit = trainer.stop_trigger.get_training_length()
        updater = trainer.updater
        # The last batch may end past the last epoch: the run is done.
        done = min(updater.iteration if unit == 'iteration'
                   else updater.epoch_detail, length)
        return done, length, unit

    def initialize(self, trainer):
        self._last = time.time()
        self._start = (self._last, trainer.updater.iteration,
                       self._done(trainer)[0])

    def __call__(self, trainer):
        now = time.time()
        if now - self._last < self._interval:
            return
        self._last = now
        done, length, unit = self._done(trainer)
        iteration = trainer.updater.iteration
        since, first, done_first = self._start
        elapsed = max(now - since, 1e-9)
        line = '  iteration {}, {} {:.2f} of {} ({:.1%}), {:.2f} ' \
            'iterations/s'.format(iteration, unit, done, length,
                                  done / length,
                                  (iteration - first) / elapsed)
        if done_first < done < length:
            # (rounded up: 0.9 s left is not "about 0 s")
            left = math.ceil((length - done) * elapsed / (done - done_first))
            minutes, seconds = divmod(left, 60)
            line += ', about {} left'.format(
                '{} min {:02d} s'.format(minutes, seconds) if minutes
                else '{} s'.format(seconds))
        print(line, flush=True)


class Heartbeat(training.Extension):

    """Prints a line every ``interval`` seconds while an update (or an
    evaluation) runs longer than that, so that a slow run (float16 on the
    CPU: minutes an update) shows it is alive. A thread prints it: NumPy
    releases Python's lock during a matrix product."""

    trigger = 1, 'iteration'
    priority = training.PRIORITY_READER

    def __init__(self, interval=10.0):
        self._interval = interval
        self._since = time.time()
        self._iteration = 0
        self._done = threading.Event()
        self._thread = None

    def initialize(self, trainer):
        self._since = time.time()
        self._iteration = trainer.updater.iteration
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._beat, args=(trainer,), daemon=True)
            self._thread.start()

    def __call__(self, trainer):
        self._since = time.time()
        self._iteration = trainer.updater.iteration

    def _beat(self, trainer):
        while not self._done.wait(self._interval):
            running = time.time() - self._since
            if running >= self._interval:
                print('  ... {:.0f} s since update {} of the run, still '
                      'computing (float16 on the CPU: minutes an update)'
                      .format(running, self._iteration), flush=True)

    def finalize(self):
        self._done.set()


def report_loss_scale(scaling):
    """Reports, at the end of each epoch (and before training), the loss
    scale of the next update and the updates skipped so far, from
    ``scaling``, a ``chainer_lars.LossScaleState``: reported once per
    epoch, the log's means are those values."""
    @training.make_extension(trigger=(1, 'epoch'),
                             priority=training.PRIORITY_WRITER)
    def loss_scale(trainer):
        chainer.report({'loss_scale': scaling.loss_scale,
                        'skipped_updates': scaling.skipped_updates})
    return loss_scale


def keep_latest_snapshots(n):
    """Removes all but the ``n`` latest snapshots in the output directory,
    and the temporary folders of snapshots a killed run left there.

    Chainer's own ``snapshot(n_retains=n)`` orders the files by their
    modification times alone, which are equal for files written within one
    clock tick, and then by name, where ``snapshot_iter_10`` comes before
    ``snapshot_iter_9``; here the iteration breaks ties. Chainer's writer
    saves each snapshot in a folder ``tmpsnapshot_iter_N...`` and then
    moves it out: such a folder is left only by a run killed while it
    wrote. Runs after the snapshot (priority -100) of each epoch.
    """
    @training.make_extension(trigger=(1, 'epoch'), priority=-200)
    def remove_older_snapshots(trainer):
        found = []
        for name in os.listdir(trainer.out):
            path = os.path.join(trainer.out, name)
            iteration = cli.snapshot_iteration(name)
            if iteration is not None:
                found.append((os.stat(path).st_mtime, iteration, path))
            elif re.match(r'tmpsnapshot_iter_\d', name) and all(
                    cli.snapshot_iteration(inside) is not None
                    for inside in _listed(path)):  # nothing else
                shutil.rmtree(path, ignore_errors=True)
        for _, _, path in sorted(found)[:-n]:
            os.remove(path)
    return remove_older_snapshots


def _listed(path):
    """The names in the folder ``path``, or [''] where it is none."""
    try:
        return os.listdir(path)
    except OSError:
        return ['']
