"""Peak memory of examples/mnist/train_mnist.py's run, by phase.

Each configuration runs in a fresh subprocess: the trainer's own
``main`` (its flags' checks, the data, the model drawn, ``make_optimizer``,
``training.train`` with Chainer's Trainer), stopped after --updates
iterations (``--test never``, ``--noplot``). Linux's VmHWM is reset
(/proc/self/clear_refs 5) once the data is loaded and again once the model
is drawn, so that each phase's peak is read apart; both are given above
the process's RSS once the data is loaded (interpreter, modules, data).

    python benchmarks/mnist_memory.py OUT.json [--grid NAME]

(run from the repository root; NAME: float32, mixed16 or float16)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def status(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024


def reset_peak():
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')


def child(updates, argv):
    import chainer
    from examples import data
    from examples import recipe
    from examples.mnist import train_mnist as mnist
    found = {}
    hold_out = data.hold_out
    make_optimizer = recipe.make_optimizer

    def loaded(*a, **k):
        result = hold_out(*a, **k)
        found['base'] = status('VmRSS')
        found['load_peak'] = status('VmHWM')
        reset_peak()
        return result

    def drawn(*a, **k):
        found['drawn'] = status('VmHWM') - found['base']
        reset_peak()
        return make_optimizer(*a, **k)

    class Trainer(chainer.training.Trainer):
        def __init__(self, updater, stop_trigger=None, *a, **k):
            super(Trainer, self).__init__(
                updater, (updates, 'iteration'), *a, **k)

    data.hold_out = loaded
    recipe.make_optimizer = drawn
    chainer.training.Trainer = Trainer
    start = time.time()
    mnist.main(argv)
    found['trained'] = status('VmHWM') - found['base']
    found['seconds'] = time.time() - start
    print(json.dumps(found))


def measure(unit, model, dtype, optimizer, batch, updates):
    with tempfile.TemporaryDirectory() as out:
        argv = ['-u', str(unit), '--model', model, '--dtype', dtype,
                '--optimizer', optimizer, '-b', str(batch), '-e', '1',
                '--test', 'never', '--noplot', '--out', out]
        result = subprocess.run(
            [sys.executable, __file__, '--child', str(updates)] + argv,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            universal_newlines=True)
    if result.returncode:
        raise RuntimeError(result.stderr)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    found.update(unit=unit, model=model, dtype=dtype, optimizer=optimizer,
                 batchsize=batch, updates=updates)
    return found


OPTIMIZERS = ('lars', 'momentum-lars', 'lamb', 'adam', 'momentum')
MODELS = ('mlp', 'mlp-bn')


def grid(name):
    if name == 'float32':
        for unit in (2000, 4000):
            for batch in (256, 8192):
                for model in MODELS:
                    for opt in OPTIMIZERS:
                        yield unit, model, 'float32', opt, batch, 2
        for model in MODELS:
            for opt in OPTIMIZERS:
                yield 8000, model, 'float32', opt, 256, 2
            for opt in ('lars', 'lamb'):
                yield 8000, model, 'float32', opt, 8192, 2
    elif name == 'mixed16':
        # NumPy's float16 matmul has no BLAS: small batches, or a small
        # model at a large one.
        for unit in (2000, 4000, 8000):
            for model in MODELS:
                for opt in OPTIMIZERS:
                    if unit == 8000 or opt in ('lars', 'lamb'):
                        yield unit, model, 'mixed16', opt, 16, 2
        for model in MODELS:
            for opt in ('lars', 'lamb'):
                yield 1000, model, 'mixed16', opt, 2048, 2
    elif name == 'float16':
        for model in MODELS:
            for opt in ('lars', 'lamb'):
                yield 8000, model, 'float16', opt, 16, 2
                yield 1000, model, 'float16', opt, 2048, 2
    else:
        raise ValueError(name)


def main():
    if sys.argv[1] == '--child':
        sys.path.insert(0, os.getcwd())
        child(int(sys.argv[2]), sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out', help='the JSON file (configurations already '
                        'in it are not run again)')
    parser.add_argument('--grid', default='float32',
                        choices=('float32', 'mixed16', 'float16'))
    args = parser.parse_args()
    path, name = args.out, args.grid
    results = []
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    done = {tuple(r[k] for k in ('unit', 'model', 'dtype', 'optimizer',
                                 'batchsize')) for r in results}
    for config in grid(name):
        if config[:5] in done:
            continue
        found = measure(*config)
        print(json.dumps(found), flush=True)
        results.append(found)
        with open(path, 'w') as f:
            json.dump(results, f, indent=1)


if __name__ == '__main__':
    main()
