"""Every Python snippet of the READMEs and docs/ trains on the real MNIST.

The snippets are read from the files themselves. Of each, the optimizer
set-up runs as written (imports, plain assignments, the optimizer and hook
constructors, ``setup`` and ``add_hook``; whatever needs a trainer, data
or MPI is left out, ``create_multi_node_optimizer(opt, comm)`` is ``opt``,
as it is on one process), with a fresh MLP of Chainer's MNIST example as
the link each ``setup`` names; then every optimizer so set up trains that
MLP for 300 updates of batch 128 and must reach 90 % test accuracy. The
snippets of one docs page share their names, as in Sphinx's doctest
builder, which runs them as written on their own small data.
"""

import ast
import importlib.util
import os
import re
import types

import pytest

from tests import REPO_ROOT


UPDATES = 300
ACCURACY = 90.0  # %, what "trains" means on the first page

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


def _first_contact():
    path = os.path.join(REPO_ROOT, 'benchmarks', 'first_contact.py')
    spec = importlib.util.spec_from_file_location('first_contact', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases():
    cases = []
    for name, blocks in snippets().items():
        if name in _ELSEWHERE:
            continue
        cases.append(pytest.param(name, id=name))
    return cases


@pytest.fixture(scope='module')
def mnist():
    bench = _first_contact()
    root = bench.dataset_root()
    if root is None:
        message = ('no MNIST: set CHAINER_DATASET_ROOT to a folder holding '
                   'pfnet/chainer/mnist')
        if os.environ.get('CI'):
            pytest.fail(message)
        pytest.skip(message)
    return bench, bench.load_mnist(root)


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
''')], lambda: bench.make_model('mlp'))
    accuracy = bench.train(link, optimizer, data, UPDATES)
    assert not accuracy >= ACCURACY


@pytest.mark.parametrize('name', _cases())
def test_snippets_train(mnist, name):
    bench, data = mnist
    made = set_up(snippets()[name], lambda: bench.make_model('mlp'))
    assert made, '{}: no snippet sets up an optimizer'.format(name)
    for line, optimizer, link in made:
        accuracy = bench.train(link, optimizer, data, UPDATES)
        assert accuracy >= ACCURACY, (
            '{}, the snippet at line {}: {!r} reached {:.2f} % after {} '
            'updates (at least {} % expected)'.format(
                name, line, optimizer, accuracy, UPDATES, ACCURACY))
