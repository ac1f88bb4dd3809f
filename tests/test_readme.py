"""README.rst reads in the order a new user needs it: what chainer-lars
is, then the set-up (run, test, install) with measured times, then the
snippets, then the theory and the figures; and every long command says
beside it how long it takes."""

import os
import re

import pytest

from tests import REPO_ROOT


with open(os.path.join(REPO_ROOT, 'README.rst')) as f:
    README = f.read()

SECTIONS = ['What LARS is for', 'Quick start', 'Installation', 'Usage',
            'Results', 'Documentation']

# The commands of the README that take more than a minute or two: where
# it shows them to run (a literal block), and where it names them as the
# source of a figure (inline).
LONG = ['bash dev.sh mnist', 'bash dev.sh test', 'bash dev.sh docs',
        'python examples/mnist/train_mnist.py -b 128']
LONG_INLINE = ['python benchmarks/first_contact.py']
# Those whose figures moved from the README to the docs, with the file
# that names them now.
MOVED_INLINE = [('docs/benchmarks.rst', 'benchmarks/bench_lars.py --models'),
                ('docs/benchmarks.rst', 'benchmarks/gpu_check.sh')]

DURATION = re.compile(
    r'\b\d+(\.\d+)? ?(s|min|minutes?|seconds?|h|hours?)\b')


def _titles(text):
    lines = text.split('\n')
    return [lines[i] for i in range(len(lines) - 1)
            if lines[i].strip() and re.fullmatch(r'=+', lines[i + 1])
            and len(lines[i + 1]) == len(lines[i])]


def _paragraphs(text):
    """The paragraphs (literal blocks apart, with the text they follow),
    as ``(prose, literal block)`` pairs."""
    pairs = []
    for block in re.split(r'\n\s*\n', text):
        if block.startswith('    ') and pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + block + '\n')
        else:
            pairs.append((block, ''))
    return pairs


def test_sections_in_the_order_a_new_user_needs():
    titles = _titles(README)
    assert titles[0] == 'chainer-lars'
    assert titles[1:] == SECTIONS


def test_set_up_before_the_snippets_and_the_theory():
    first = README.index
    set_up = first('\n    bash dev.sh mnist\n')
    assert set_up < first('\n    bash dev.sh test\n') < first(
        '\n    pip install .') < first('.. code-block:: python') < first(
        '**What** ``lr``') < first('**Mixed precision.**') < first(
        '.. begin-results')


@pytest.mark.parametrize('name, command', [
    ('README.rst', c) for c in LONG + LONG_INLINE] + MOVED_INLINE)
def test_every_long_command_says_how_long_it_takes(name, command):
    """Where the README shows the command to run (a literal block), the
    paragraph before or after the block gives a duration; where it (or
    the page its figure moved to) names one as the source of a figure,
    its paragraph does."""
    with open(os.path.join(REPO_ROOT, name)) as f:
        pairs = _paragraphs(f.read())
    found = 0
    for k, (prose, block) in enumerate(pairs):
        if command in block:
            found += 1
            after = pairs[k + 1][0] if k + 1 < len(pairs) else ''
            assert DURATION.search(prose) or DURATION.search(after), (
                command, prose, after)
        elif command not in LONG and command in ' '.join(prose.split()):
            found += 1
            assert DURATION.search(prose), (command, prose)
    assert found, command


def _rst_files():
    for folder in ('', 'docs', 'examples', 'benchmarks'):
        for name in sorted(os.listdir(os.path.join(REPO_ROOT, folder))):
            if name.endswith('.rst'):
                yield os.path.join(folder, name)


@pytest.mark.parametrize('name', list(_rst_files()))
def test_every_heading_starts_a_section(name):
    """A heading right below a paragraph's last line is read by docutils
    as more of that paragraph: the section and its title vanish from the
    page, its underline printed as dashes, and no build warns."""
    with open(os.path.join(REPO_ROOT, name)) as f:
        lines = f.read().split('\n')
    for k in range(2, len(lines)):
        underline, title, above = lines[k], lines[k - 1], lines[k - 2]
        if (re.fullmatch(r'([=\-~^"])\1{2,}', underline)
                and title.strip() and len(underline) >= len(title)
                and not title.startswith(' ') and above.strip()
                and not re.fullmatch(r'([=\-~^"])\1{2,}', above)):
            pytest.fail('{}:{}: the heading {!r} has no blank line above '
                        'it'.format(name, k, title))
