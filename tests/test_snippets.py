"""Every Python snippet of the READMEs and docs/ trains on the real MNIST.

The snippets are read from the files themselves. Of each, the optimizer
set-up runs as written (imports, plain assignments, the optimizer and hook
constructors, ``setup`` and ``add_hook``; whatever needs a trainer, data
or MPI is left out, ``create_multi_node_optimizer(opt, comm)`` is ``opt``,
as it is on one process), with a fresh MLP of Chainer's MNIST example,
500 units a layer where the example has 1,000, as the link each
``setup`` names; then every optimizer so set up trains that MLP for 300
updates of batch 128 and must reach 90 % test accuracy. (At 500 units a
training costs 2.5 times less, and the snippets reach 91.7 % (``LAMB()``)
to 95.2 %, against 93.1 % to 95.8 % at 1,000; the snippet of 0.1.0 that
does not train stays near 10 %.) The
snippets of one docs page share their names, as in Sphinx's doctest
builder, which runs them as written on their own small data.
"""

import ast
import os
import re
import subprocess
import sys
import types

import pytest

from tests import pythonpath
from tests import REPO_ROOT
from tests import benchmark
from tests import conftest


UPDATES = 300
ACCURACY = 90.0  # %, what "trains" means on the first page
UNITS = 500  # a layer of the MLP (the example's has 1,000)

# Names a snippet may use without defining: the command line of the
# trainer it is cut from, and ChainerMN's communicator of one process.
_GIVEN = {'args': types.SimpleNamespace(batchsize=128),
          'comm': types.SimpleNamespace(size=1, rank=0, intra_rank=0)}
# Statements using these need a trainer, a dataset or MPI: left out.
_CONTEXT = {'trainer', 'train', 'test', 'epochs', 'device',
            'chainermn', 'iterator', 'updater', 'x', 't'}
# A listing that is a whole trainer, run by the test named.
_ELSEWHERE = {'examples/README.md': 'tests/test_examples.py'}


def _rst_blocks(text):
    """``(line, code)`` of each ``code-block:: python`` and ``testcode``."""
    lines = text.split('\n')
    for i, line in enumerate(lines):
        if not re.match(r'\s*\.\. (code-block|code|sourcecode):: python\s*$'
                        r'|\s*\.\. testcode::', line):
            continue
        indent = len(line) - len(line.lstrip())
        body, j = [], i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j])
                                  - len(lines[j].lstrip()) > indent):
            body.append(lines[j])
            j += 1
        body = [b for b in body]
        while body and not body[-1].strip():
            body.pop()
        strip = min((len(b) - len(b.lstrip()) for b in body if b.strip()),
                    default=0)
        yield i + 1, ''.join(b[strip:] + '\n' for b in body)


def _md_blocks(text):
    for m in re.finditer(r'^```python\n(.*?)^```', text, re.M | re.S):
        yield text.count('\n', 0, m.start()) + 1, m.group(1)


def _files():
    names = ['README.rst']
    names += sorted('docs/' + n for n in os.listdir(
        os.path.join(REPO_ROOT, 'docs')) if n.endswith('.rst'))
    for folder, _, files in sorted(os.walk(os.path.join(
            REPO_ROOT, 'examples'))):
        names += [os.path.relpath(os.path.join(folder, n), REPO_ROOT)
                  for n in files if n == 'README.md']
    return names


def snippets():
    """``{file: [(line, code)]}`` of the Python snippets, in file order."""
    found = {}
    for name in _files():
        with open(os.path.join(REPO_ROOT, name)) as f:
            text = f.read()
        blocks = _md_blocks(text) if name.endswith('.md') else \
            _rst_blocks(text)
        found[name] = [(line, code) for line, code in blocks if code]
    return {name: blocks for name, blocks in found.items() if blocks}


def _dotted(node):
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else base + '.' + node.attr
    return node.id if isinstance(node, ast.Name) else None


def _calls(node):
    return [_dotted(n.func) or '' for n in ast.walk(node)
            if isinstance(n, ast.Call)]


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _optimizer_call(name):
    return name.startswith(('chainer_lars.', 'chainer.optimizers.',
                            'optimizers.'))


def _set_up(statement):
    """The statements of the optimizer set-up, with the link to replace,
    or ``None`` for a statement left out."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        if any(a.name.split('.')[0] == 'chainermn'
               for a in statement.names):
            return None
        return statement, None
    if isinstance(statement, ast.Assign):
        value = statement.value
        # On one process the multi-node optimizer is the actual one.
        if (isinstance(value, ast.Call) and _dotted(value.func)
                == 'chainermn.create_multi_node_optimizer'):
            statement.value = value = value.args[0]
        calls = _calls(value)
        if _names(value) & _CONTEXT:
            return None
        if all(c.startswith('math.') or _optimizer_call(c) for c in calls):
            return statement, None
        return None
    if isinstance(statement, ast.Expr) and isinstance(
            statement.value, ast.Call):
        method = _dotted(statement.value.func) or ''
        if method.endswith('.setup') and not _names(statement) & _CONTEXT:
            arg = statement.value.args[0]
            return statement, arg.id if isinstance(arg, ast.Name) else None
        if method.endswith('.add_hook'):
            return statement, None
    return None


def _model(bench):
    """A fresh MLP of ``UNITS`` units a layer, initialised as
    ``bench.make_model`` initialises the example's."""
    import chainer.links as L
    import numpy
    numpy.random.seed(0)
    return L.Classifier(bench.MLP(n_units=UNITS))


def _cases():
    cases = []
    for name, blocks in snippets().items():
        if name in _ELSEWHERE:
            continue
        cases.append(pytest.param(name, id=name))
    return cases


def in_ci():
    """Whether ``CI`` is set to something true, as hosted CI services and
    ``.ci/run`` set it."""
    return os.environ.get('CI', '') not in ('', '0', 'false', 'False',
                                            'FALSE')


@pytest.fixture(scope='module')
def loaded():
    """``(first_contact, data)``, or the reason no MNIST can be had.

    MNIST is read where the trainers read it (``first_contact.load_mnist``:
    ``CHAINER_DATASET_ROOT``, else Chainer's cache, downloaded there the
    first time where the network allows).
    """
    bench = benchmark('first_contact')
    try:
        return bench, bench.load_mnist()
    except bench.MnistMissing as e:
        return None, str(e)


def test_mnist_can_be_read(loaded):
    """Says once why the snippets cannot train: fails in CI, skips
    elsewhere (the snippets' tests then skip, pointing here)."""
    bench, data = loaded
    if bench is None:
        if in_ci():
            pytest.fail(data)
        pytest.skip(data)
    assert len(data[0]) == len(data[1]) and len(data[2]) == len(data[3])


@pytest.fixture
def mnist(loaded):
    if loaded[0] is None:
        pytest.skip('no MNIST: test_mnist_can_be_read says why')
    return loaded


def set_up(blocks, make_model):
    """Runs the set-up of each of ``blocks`` (one page's snippets, sharing
    their names); returns ``[(line, optimizer, link)]``, one per ``setup``
    call, the link a fresh one from ``make_model()``."""
    namespace = dict(_GIVEN)
    exec('import math', namespace)
    made = []
    for line, code in blocks:
        for statement in ast.parse(code).body:
            kept = _set_up(statement)
            if kept is None:
                continue
            statement, link = kept
            if link is not None:
                namespace[link] = make_model()
            exec(compile(ast.Module([statement], []), '<snippet>', 'exec'),
                 namespace)
            if link is not None:
                owner = statement.value.func.value
                made.append((line, eval(compile(ast.Expression(owner),
                                                '<snippet>', 'eval'),
                                        namespace), namespace[link]))
    return made


def test_every_file_with_snippets_is_covered():
    covered = snippets()
    assert 'README.rst' in covered
    for name, test in _ELSEWHERE.items():
        assert name in covered
        with open(os.path.join(REPO_ROOT, test)) as f:
            assert name in f.read(), (name, test)


def test_a_snippet_that_does_not_train_fails(mnist):
    # The README's hook snippet of version 0.1.0: the check must see it.
    bench, data = mnist
    [(_, optimizer, link)] = set_up([(1, '''
import chainer
import chainer_lars
optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
optimizer.setup(model)
optimizer.add_hook(chainer_lars.GradientLARS(weight_decay=5e-4))
''')], lambda: _model(bench))
    accuracy = bench.train(link, optimizer, data, UPDATES)
    assert not accuracy >= ACCURACY


@pytest.mark.parametrize('name', _cases())
def test_snippets_train(mnist, name):
    bench, data = mnist
    made = set_up(snippets()[name], lambda: _model(bench))
    assert made, '{}: no snippet sets up an optimizer'.format(name)
    for line, optimizer, link in made:
        accuracy = bench.train(link, optimizer, data, UPDATES)
        assert accuracy >= ACCURACY, (
            '{}, the snippet at line {}: {!r} reached {:.2f} % after {} '
            'updates (at least {} % expected)'.format(
                name, line, optimizer, accuracy, UPDATES, ACCURACY))


def _run_here(tmp_path, home, args, env=None):
    """Runs ``python args`` with ``home`` as the home folder, no
    CHAINER_DATASET_ROOT, no CI, and downloads sent to a closed local
    port (they fail at once and never leave the machine)."""
    environment = dict(os.environ, HOME=str(home), PYTHONPATH=pythonpath(),
                       PYTHONWARNINGS='ignore')
    for name in ('CHAINER_DATASET_ROOT', 'CI', 'no_proxy', 'NO_PROXY'):
        environment.pop(name, None)
    for name in ('http_proxy', 'https_proxy', 'HTTP_PROXY', 'HTTPS_PROXY'):
        environment[name] = 'http://127.0.0.1:9'
    environment.update(env or {})
    return subprocess.run(
        [sys.executable] + args, cwd=str(tmp_path), env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        universal_newlines=True, timeout=600)


def _pytest_here(tmp_path, home, select, env=None):
    return _run_here(tmp_path, home, [
        '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
        os.path.join(REPO_ROOT, 'tests', 'test_snippets.py'), '-k', select],
        env)


def test_mnist_is_read_from_chainers_cache(tmp_path):
    """A user who ran ``bash dev.sh mnist`` has MNIST in Chainer's cache,
    ~/.chainer/dataset, and no CHAINER_DATASET_ROOT: the benchmark and
    the snippets' tests read it there (a tiny one here)."""
    home = tmp_path / 'home'
    conftest._write_mnist(str(home / '.chainer' / 'dataset'))
    result = _run_here(tmp_path, home, ['-c', (
        'import runpy; bench = runpy.run_path({!r}); '
        'print([len(a) for a in bench["load_mnist"]()])'.format(
            os.path.join(REPO_ROOT, 'benchmarks', 'first_contact.py')))])
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == '[{0}, {0}, {1}, {1}]' \
        .format(*conftest.MNIST_SIZES)
    result = _pytest_here(tmp_path, home, 'mnist_can_be_read')
    assert result.returncode == 0, result.stdout
    assert '1 passed' in result.stdout, result.stdout


@pytest.mark.parametrize('ci', ['true', None])
def test_no_mnist_says_so_once_fails_in_ci_skips_elsewhere(tmp_path, ci):
    home = tmp_path / 'home'
    home.mkdir()
    result = _pytest_here(
        tmp_path, home, 'mnist_can_be_read or does_not_train',
        env={'CI': ci} if ci else None)
    said = 'no MNIST in the dataset root {}'.format(
        home / '.chainer' / 'dataset')
    if ci:
        assert result.returncode == 1, result.stdout
        assert '1 failed, 1 skipped' in result.stdout, result.stdout
        assert said in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert '2 skipped' in result.stdout, result.stdout
    # Chainer's cache is as it was: the failed download left nothing.
    assert not (home / '.chainer' / 'dataset' / 'pfnet').exists()


@pytest.mark.parametrize('page,name', [('docs/optimizer.rst', 'lars'),
                                       ('docs/lamb.rst', 'lamb')])
def test_a_page_s_recipe_is_the_trainer_s(page, name):
    """The recipe block of each optimizer's page (the one that sets
    ``batchsize``) builds, on the MNIST trainer's MLP with BatchNorm, the
    optimizer that the trainer's defaults build at that batch size: the
    same hyperparameters and the same parameters excluded. It calls no
    ``setup``, so ``test_snippets_train`` does not train it; the trainer's
    runs at that batch size (``examples/mnist/README.md``) do."""
    import importlib

    import chainer.links as L
    import numpy

    from examples import recipe
    train_mnist = importlib.import_module('examples.mnist.train_mnist')
    [code] = [code for _, code in snippets()[page]
              if re.search(r'^batchsize = ', code, re.M)]
    namespace = {}
    exec('import chainer_lars\n' + code, namespace)
    documented = namespace['optimizer']
    args = train_mnist.parse_args(
        ['--optimizer', name, '-b', str(namespace['batchsize']),
         '--model', 'mlp-bn', '--unit', '8'], paths=False)
    models = []
    for _ in range(2):
        numpy.random.seed(0)
        models.append(L.Classifier(train_mnist.MLPBN(784, 8, 10)))
    trainers, _ = recipe.make_optimizer(args, models[0])
    documented.setup(models[1])
    assert type(documented) is type(trainers)
    got, expected = (o.hyperparam.get_dict() for o in (documented, trainers))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), (page, key)
    flags = [{path: (p.update_rule.uses_weight_decay,
                     p.update_rule.uses_adaptation)
              for path, p in m.namedparams()} for m in models]
    assert flags[1] == flags[0], page
    # Both lists exclude something, and not everything.
    assert {True, False} <= {f for pair in flags[0].values() for f in pair}
