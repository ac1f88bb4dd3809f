"""``examples/mnist/results.py --check``: the READMEs' tables against runs.

The runs are fake: a log with the last epoch's test accuracy is all that
the table is made of.
"""

import argparse
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import REPO_ROOT
from tests import conftest
from tests import pythonpath


OPTIMIZERS = ('momentum', 'momentum-lars', 'lars')
HEADER = ['batch size', 'momentum', 'momentum-lars', 'lars']


@pytest.fixture(scope='module')
def results():
    return importlib.import_module('examples.mnist.results')


def write_runs(out, accuracies, epoch=1):
    """Writes a log per run; ``accuracies[batchsize, optimizer, seed]``."""
    for (batchsize, optimizer, seed), accuracy in accuracies.items():
        run = os.path.join(out, 'b{}-{}-s{}'.format(batchsize, optimizer,
                                                    seed))
        os.makedirs(run, exist_ok=True)
        log = [{'epoch': e, 'validation/main/accuracy': accuracy}
               for e in range(1, epoch + 1)]
        with open(os.path.join(run, 'log'), 'w') as f:
            json.dump(log, f)


ACCURACIES = {
    (128, 'momentum', 0): 0.9844, (128, 'momentum', 1): 0.9838,
    (128, 'momentum-lars', 0): 0.9871, (128, 'momentum-lars', 1): 0.9877,
    (128, 'lars', 0): 0.9872, (128, 'lars', 1): 0.9868,
    (8192, 'momentum', 0): 0.098, (8192, 'momentum', 1): 0.098,
    (8192, 'momentum-lars', 0): 0.9802, (8192, 'momentum-lars', 1): 0.9818,
    (8192, 'lars', 0): 0.9824, (8192, 'lars', 1): 0.9788,
}

ROWS = [
    ['128', '98.41 (98.38-98.44)', '98.74 (98.71-98.77)',
     '98.70 (98.68-98.72)'],
    ['8192', '9.80 (9.80-9.80)', '98.10 (98.02-98.18)',
     '98.06 (97.88-98.24)'],
]

MARKDOWN = """# Results

Some text.

| batch size | momentum | momentum-lars | lars |
|---:|---:|---:|---:|
| 128 | 98.41 (98.38-98.44) | 98.74 (98.71-98.77) | 98.70 (98.68-98.72) |
| 8192 | 9.80 (9.80-9.80) | 98.10 (98.02-98.18) | 98.06 (97.88-98.24) |

| other | table |
|---|---|
| a | b |
"""

RST = """Results
=======

Text::

    a literal block

==========  ===================  ===================  ===================
batch size             momentum        momentum-lars                 lars
==========  ===================  ===================  ===================
       128  98.41 (98.38-98.44)  98.74 (98.71-98.77)  98.70 (98.68-98.72)
      8192     9.80 (9.80-9.80)  98.10 (98.02-98.18)  98.06 (97.88-98.24)
==========  ===================  ===================  ===================

=======  ==
variant  ms
=======  ==
floor    20
=======  ==
"""


def argv(out, *files):
    return ['--batchsizes', '128', '8192', '--seeds', '0', '1',
            '--epoch', '1', '--out', out, '--check'] + list(files)


@pytest.fixture
def runs(tmp_path):
    out = str(tmp_path / 'runs')
    write_runs(out, ACCURACIES)
    return out


def write(tmp_path, name, text):
    path = str(tmp_path / name)
    with open(path, 'w') as f:
        f.write(text)
    return path


def test_table_of_the_runs(results, runs):
    args = argparse.Namespace(
        batchsizes=[128, 8192], optimizers=list(OPTIMIZERS), seeds=[0, 1])
    logs = {key: [{'epoch': 1, 'test/main/accuracy': value}]
            for key, value in ACCURACIES.items()}
    assert results.table(logs, args) == (HEADER, ROWS)


def test_old_logs_read_as_new_ones(results, tmp_path):
    """Logs written before the test set was named test/ (Chainer's
    validation/ was the test set's, val/ the held-out split's) read with
    today's names, and so make the same tables and figures."""
    old = [{'epoch': 1, 'main/loss': 0.5, 'validation/main/accuracy': 0.97,
            'validation/main/loss': 0.1, 'val/main/accuracy': 0.96}]
    (tmp_path / 'log').write_text(json.dumps(old))
    assert results.read_log(str(tmp_path)) == [
        {'epoch': 1, 'main/loss': 0.5, 'test/main/accuracy': 0.97,
         'test/main/loss': 0.1, 'val/main/accuracy': 0.96}]
    # Today's logs are read as they are.
    new = [{'epoch': 1, 'test/main/accuracy': 0.97,
            'val/main/accuracy': 0.96}]
    (tmp_path / 'log').write_text(json.dumps(new))
    assert results.read_log(str(tmp_path)) == new


@pytest.mark.parametrize('name,text', [('README.md', MARKDOWN),
                                       ('README.rst', RST)])
def test_check_passes_on_the_same_table(results, runs, tmp_path, capsys,
                                        name, text):
    path = write(tmp_path, name, text)
    assert results.main(argv(runs, path)) == 0
    assert 'the table matches' in capsys.readouterr().out


@pytest.mark.parametrize('name,text', [('README.md', MARKDOWN),
                                       ('README.rst', RST)])
def test_check_fails_on_a_changed_cell_and_prints_the_diff(
        results, runs, tmp_path, capsys, name, text):
    path = write(tmp_path, name, text.replace('98.06 (97.88-98.24)',
                                              '97.99 (97.87-98.21)'))
    assert results.main(argv(runs, path)) == 1
    out = capsys.readouterr().out
    assert 'the table differs' in out
    diff = out.splitlines()
    assert any(line.startswith('-') and '97.99 (97.87-98.21)' in line
               for line in diff)
    assert any(line.startswith('+') and '98.06 (97.88-98.24)' in line
               for line in diff)


def test_check_fails_when_one_of_the_files_differs(results, runs, tmp_path):
    good = write(tmp_path, 'README.rst', RST)
    bad = write(tmp_path, 'README.md', MARKDOWN.replace('| 128 |', '| 256 |'))
    assert results.main(argv(runs, good, bad)) == 1
    assert results.main(argv(runs, good)) == 0


def test_check_fails_on_a_missing_row(results, runs, tmp_path, capsys):
    lines = [line for line in MARKDOWN.splitlines()
             if not line.startswith('| 8192 ')]
    path = write(tmp_path, 'README.md', '\n'.join(lines))
    assert results.main(argv(runs, path)) == 1
    assert '+| 8192 | 9.80' in capsys.readouterr().out


def test_check_fails_without_a_table(results, runs, tmp_path, capsys):
    path = write(tmp_path, 'README.md', '# Results\n\nNo table yet.\n')
    assert results.main(argv(runs, path)) == 1
    out = capsys.readouterr().out
    assert 'no table with the header' in out
    assert '| 8192 | 9.80 (9.80-9.80) |' in out


def test_check_needs_every_run_and_runs_nothing(results, runs, tmp_path,
                                                capsys):
    path = write(tmp_path, 'README.md', MARKDOWN)
    os.remove(os.path.join(runs, 'b8192-lars-s1', 'log'))
    before = sorted(os.listdir(runs))
    assert results.main(argv(runs, path)) == 2
    err = capsys.readouterr().err
    assert ('python -m examples.mnist.train_mnist --batchsize 8192 '
            '--optimizer lars --epoch 1 --seed 1') in err
    assert sorted(os.listdir(runs)) == before
    # A run with fewer epochs than asked for is missing too.
    write_runs(runs, {(8192, 'lars', 1): 0.9788})
    assert results.main(argv(runs, path)[:-1] + ['--epoch', '2', '--check',
                                                 path]) == 2


def no_run(*args, **kwargs):
    raise AssertionError('a run was started')


def files(folder):
    """Each file under ``folder``, and when it last changed."""
    return {os.path.join(top, name): os.stat(os.path.join(top, name))
            .st_mtime_ns for top, _, names in os.walk(folder)
            for name in names}


@pytest.mark.parametrize('task', [[], ['--check'], ['--same-as', '.']])
@pytest.mark.parametrize('recorded', [True, False])
def test_runs_of_another_epoch_are_refused(results, tmp_path, capsys,
                                           monkeypatch, task, recorded):
    """Runs of 2 epochs read as done at --epoch 1, and their last epoch's
    accuracy was the cell of a table "after 1 epoch". <out>/flags records
    --epoch; in an --out whose file does not (none, or one written before
    results.py recorded it), a log of more epochs than --epoch shows it."""
    monkeypatch.setattr(results, 'run_process', no_run)
    out = str(tmp_path / 'runs')
    write_runs(out, {(8192, 'lars', 0): 0.98, (8192, 'momentum', 0): 0.5},
               epoch=2)
    argv = ['--batchsizes', '8192', '--optimizers', 'lars', 'momentum',
            '--seeds', '0', '--out', out, '--noplot']
    if recorded:
        # At their own --epoch they are done: nothing runs, and the
        # table is theirs.
        assert results.main(argv + ['--epoch', '2']) == 0
        with open(os.path.join(out, 'results.md')) as f:
            assert f.read().startswith('Test accuracy (%) of the MNIST MLP '
                                       'after 2 epochs, ')
        with open(os.path.join(out, 'flags')) as f:
            assert f.read() == '--epoch 2\n'
    before = files(out)
    with pytest.raises(SystemExit) as e:
        results.main(argv + ['--epoch', '1'] + task)
    assert e.value.code == 2
    message = capsys.readouterr().err.splitlines()[-1]
    if recorded:
        assert message.endswith(
            'error: --out {}: its runs were made with --epoch 2 ({}), not '
            '--epoch 1; give another --out, or --epoch 2'.format(
                out, os.path.join(out, 'flags'))), message
    else:
        assert message.endswith(
            'error: --out {}: its run b8192-momentum-s0 has 2 epochs, more '
            'than --epoch 1: its runs were made with another --epoch; give '
            'another --out, or --epoch 2'.format(out)), message
    assert files(out) == before


def test_flags_files_without_the_epoch_are_read(results, tmp_path,
                                                monkeypatch):
    """A <out>/flags of before --epoch was recorded holds the flags
    alone: they are compared as before, and the runs' logs tell the
    epochs."""
    monkeypatch.setattr(results, 'run_process', no_run)
    out = str(tmp_path / 'runs')
    write_runs(out, {(8192, 'lars', 0): 0.98})
    write(tmp_path, os.path.join('runs', 'flags'), '--unit 8\n')
    argv = ['--batchsizes', '8192', '--optimizers', 'lars', '--epoch', '1',
            '--out', out, '--noplot']
    assert results.main(argv + ['--flags=--unit 8']) == 0
    with open(os.path.join(out, 'flags')) as f:
        assert f.read() == '--epoch 1 --unit 8\n'
    with pytest.raises(SystemExit):
        results.main(argv + ['--flags=--unit 16'])


@pytest.mark.parametrize('epoch, says', [(1, 'after 1 epoch, '),
                                         (10, 'after 10 epochs, ')])
def test_caption_and_commands_read_as_written(results, epoch, says):
    """The commands of results.md name each run's folder: the trainer's
    default --out takes one run, and the second command pasted was
    refused as holding another run."""
    args = argparse.Namespace(
        batchsizes=[128], optimizers=['lars'], seeds=[0, 1], epoch=epoch,
        device='-1', flags=[], out='results_mnist')
    logs = {(128, 'lars', seed): [{'epoch': epoch,
                                   'test/main/accuracy': 0.98}]
            for seed in (0, 1)}
    md, rst = results.tables(logs, args)
    assert md.startswith('Test accuracy (%) of the MNIST MLP ' + says)
    for seed, tail in ((0, ''), (1, ' --seed 1')):
        command = ('python -m examples.mnist.train_mnist --batchsize 128 '
                   '--optimizer lars --epoch {}{} -o results_mnist/'
                   'b128-lars-s{}'.format(epoch, tail, seed))
        assert command + '\n' in md and '    ' + command + '\n' in rst


@pytest.mark.parametrize('path', [os.path.join('examples', 'mnist',
                                               'README.md')])
def test_the_readmes_have_a_table_that_check_can_read(results, path):
    """Each README's results table is one the parser finds, with a row per
    batch size of the sweep; whether the numbers are right is what
    ``results.py --check`` says, after the runs."""
    path = os.path.join(REPO_ROOT, path)
    with open(path) as f:
        lines = f.read().splitlines()
    parse = (results.rst_tables if path.endswith('.rst')
             else results.markdown_tables)
    tables = [cells for _, _, cells in parse(lines) if cells[0] == HEADER]
    assert tables, path
    assert [row[0] for row in tables[0][1:]] == ['128', '8192', '16384']
    for row in tables[0][1:]:
        assert len(row) == len(HEADER)


def test_list_flags_take_spaces_or_commas(results, runs, tmp_path):
    path = write(tmp_path, 'README.md', MARKDOWN)
    assert results.main(['--batchsizes', '128,8192', '--seeds', '0,1',
                         '--optimizers', 'momentum,momentum-lars', 'lars',
                         '--epoch', '1', '--out', runs, '--check',
                         path]) == 0


def test_help_shows_the_defaults_of_the_list_flags(results, capsys):
    with pytest.raises(SystemExit):
        results.main(['--help'])
    out = ' '.join(capsys.readouterr().out.split())
    assert 'Batch sizes (default: 128 8192 16384)' in out
    assert 'once per seed (default: 0)' in out
    assert 'momentum, momentum-lars, lars (default: all' in out


@pytest.mark.parametrize('flags,message', [
    (['--seeds', '-1'], '--seeds -1: must be an integer, at least 0'),
    (['--batchsizes', '128,0'], '--batchsizes 0: must be an integer, at '
                                'least 1'),
    (['--optimizers', 'sgd'], '--optimizers sgd: choose from'),
    (['--epoch', '0'], 'argument --epoch/-e: must be an integer, at least 1'),
    (['--out', '{tmp}/file'], '--out {tmp}/file: not a folder'),
    (['--out', '{tmp}/file/x'], '--out {tmp}/file/x: {tmp}/file is not a '
                                'folder'),
])
def test_bad_flags_stop_before_any_run(results, tmp_path, capsys, flags,
                                       message):
    (tmp_path / 'file').write_text('mine')
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    argv = ['--batchsizes', '32', '--epoch', '1', '--out',
            str(tmp_path / 'out')]
    with pytest.raises(SystemExit) as e:
        results.main(argv + flags)
    assert e.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file']
    assert (tmp_path / 'file').read_text() == 'mine'


def curve_logs(args, bad):
    """Logs of 3 epochs (a diverged run's: 2, as the trainer stops it);
    ``bad(batchsize, optimizer, seed)``: whether the run diverges, at
    epoch 1."""
    logs = {}
    for batchsize in args.batchsizes:
        for optimizer in args.optimizers:
            for seed in args.seeds:
                diverges = bad(batchsize, optimizer, seed)
                logs[batchsize, optimizer, seed] = [
                    {'epoch': e,
                     'main/loss': float('nan') if diverges and e else 1.0,
                     'test/main/accuracy': 0.098 if diverges and e
                     else 0.5 + e / 10 + seed / 100}
                    for e in range(2 if diverges else 3)]
    return logs


def drawn(line):
    return [(round(x, 6), round(y, 6)) for x, y in zip(line.get_xdata(),
                                                       line.get_ydata())
            if y == y]


def test_every_curve_shows_and_a_diverged_one_says_so(results):
    """Test accuracy in %, one panel a batch size: the LARS variants'
    points coincide, so each optimizer has its own marker and its points
    are drawn side by side around each epoch; one seed: no range. A
    diverged run is not drawn from the epoch its loss stopped being
    finite, and a note says so where no point is."""
    args = argparse.Namespace(batchsizes=[128, 8192],
                              optimizers=list(OPTIMIZERS), seeds=[0])
    logs = curve_logs(args, lambda b, o, s: b == 8192 and o == 'momentum')
    figure = results.draw(logs, args)
    # No run reaches 90 %: one row, no zoom.
    first, second = figure.axes
    assert first.get_ylabel() == 'test accuracy (%)'
    assert first.get_ylim() == (0, 100)
    lines = {line.get_label(): line for line in first.get_lines()}
    markers = {name: line.get_marker() for name, line in lines.items()}
    assert len(set(markers.values())) == 3, markers
    assert not first.collections and not second.collections
    assert [t.get_text() for t in figure.legends[0].get_texts()] == list(
        OPTIMIZERS)
    assert figure._suptitle.get_text().splitlines()[0].endswith(
        'one run (seed 0), so no range')
    assert [t.get_text() for t in first.texts] == []
    note, = second.texts
    assert note.get_text().startswith('momentum: diverged in epoch 1')
    assert note.get_color() == lines['momentum'].get_color()
    momentum = [line for line in second.get_lines()
                if line.get_label() == 'momentum'][0]
    dodge = results.DODGE
    assert drawn(momentum) == [(-dodge, 50.0)]
    assert drawn(lines['momentum-lars']) == [(0, 50.0), (1, 60.0),
                                             (2, 70.0)]
    assert drawn(lines['lars']) == [(dodge, 50.0), (1 + dodge, 60.0),
                                    (2 + dodge, 70.0)]
    import matplotlib.pyplot as plt
    plt.close(figure)


def test_seeds_are_a_mean_and_a_range_that_the_title_names(results):
    args = argparse.Namespace(batchsizes=[8192], optimizers=['lars'],
                              seeds=[0, 1, 2])
    logs = curve_logs(args, lambda b, o, s: s == 2)
    figure = results.draw(logs, args)
    axes, = figure.axes
    line, = axes.get_lines()[:1]
    # Seeds 0 and 1 (seed 2 diverged at epoch 1): accuracies 50, 51 at
    # epoch 0 with seed 2's 52; then 60, 61; 70, 71.
    assert drawn(line) == [(0, 51.0), (1, 60.5), (2, 70.5)]
    # The bars: from the lowest to the highest seed.
    bars, = axes.collections
    ends = sorted(round(y, 6) for segment in bars.get_segments()
                  for _, y in segment)
    assert ends == [50, 52, 60, 61, 70, 71]
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [
        'lars']
    assert figure._suptitle.get_text().splitlines()[0].endswith(
        'mean of 3 seeds (0, 1, 2); bars: their range')
    assert [t.get_text().splitlines()[0] for t in axes.texts] == [
        'lars: 1 of 3 seeds diverged']
    import matplotlib.pyplot as plt
    plt.close(figure)


def test_runs_above_90_percent_get_a_zoomed_row(results):
    """The last epoch's means are the table's cells, and where they are
    above 90 % a second row zooms on them: 98.0 and 98.2 differ there."""
    args = argparse.Namespace(batchsizes=[128, 8192],
                              optimizers=list(OPTIMIZERS), seeds=[0, 1])
    keys = [(b, o, s) for b in args.batchsizes for o in OPTIMIZERS
            for s in args.seeds]
    # 10 % at epoch 0; at epoch 1 98.02 % and 98.12 % at batch 8192,
    # 98.44 % and 98.54 % at 128.
    logs = {key: [{'epoch': e, 'main/loss': 0.1,
                   'test/main/accuracy': 0.1 + e * (
                       (0.8802 if key[0] == 8192 else 0.8844)
                       + key[2] / 1000)} for e in range(2)]
            for key in keys}
    figure = results.draw(logs, args)
    whole, _, zoom, _ = figure.axes
    assert whole.get_ylim() == (0, 100)
    # From the lowest last mean (98.07) to the highest (98.49), rounded
    # out to whole points, the lowest less a point.
    assert zoom.get_ylim() == (97, 99)
    assert zoom.get_ylabel() == 'test accuracy (%), zoomed'
    _, rows = results.table(logs, args)
    means = [float(cell.split()[0]) for cell in rows[0][1:]]
    last = [round(bars.lines[0].get_ydata()[-1], 2)
            for bars in zoom.containers]
    assert last == means
    import matplotlib.pyplot as plt
    plt.close(figure)


@pytest.mark.parametrize('batchsizes', [[8192], [128, 8192],
                                        [128, 8192, 16384]])
@pytest.mark.parametrize('seeds', [[0], [0, 1, 2, 3, 4]])
def test_the_title_and_the_legend_fit_in_the_figure(results, batchsizes,
                                                    seeds):
    """With one batch size the figure was 4 inches wide and its title, a
    line of 107 characters, lost both ends; the title now wraps to the
    figure, above the panels' titles."""
    args = argparse.Namespace(batchsizes=batchsizes,
                              optimizers=list(OPTIMIZERS), seeds=seeds)
    figure = results.draw(curve_logs(args, lambda b, o, s: False), args)
    figure.draw_without_rendering()
    inside = figure.bbox
    title = figure._suptitle.get_window_extent()
    legend = figure.legends[0].get_window_extent()
    for box in (title, legend):
        assert (inside.x0 <= box.x0 and box.x1 <= inside.x1
                and inside.y0 <= box.y0 and box.y1 <= inside.y1), (
            box, inside)
    for axes in figure.axes:
        assert axes.title.get_window_extent().y1 <= title.y0
    import matplotlib.pyplot as plt
    plt.close(figure)


# A commit hash in prose: 7 to 40 hex digits, with a digit and a letter.
_HASH = re.compile(r'\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b')


@pytest.mark.parametrize('path', ['README.rst',
                                  os.path.join('examples', 'mnist',
                                               'README.md'),
                                  os.path.join('examples', 'chainermn',
                                               'README.md')])
def test_readmes_keep_commit_hashes_to_one_line(path):
    with open(os.path.join(REPO_ROOT, path)) as f:
        lines = [line for line in f if _HASH.search(line)]
    assert len(lines) <= 1, lines


@pytest.mark.parametrize('path', [os.path.join('examples', 'mnist',
                                               'README.md')])
def test_readmes_say_what_to_expect_on_another_machine(results, path):
    """Next to the results table: the figures are not digits to match."""
    path = os.path.join(REPO_ROOT, path)
    with open(path) as f:
        lines = f.read().splitlines()
    parse = (results.rst_tables if path.endswith('.rst')
             else results.markdown_tables)
    last = [last for _, last, cells in parse(lines)
            if cells[0] == HEADER][0]
    after = ' '.join(' '.join(lines[last:last + 8]).split())
    assert 'On another machine expect' in after.replace(
        'machine, expect', 'machine expect')
    assert 'within about 0.2 point' in after


def test_the_defaults_spread_is_that_of_the_tables():
    """"0.35 over the five of the table above" was stale: the five-seed
    table gives lars (the defaults) 97.80-98.27, a spread of 0.47."""
    with open(os.path.join(REPO_ROOT, 'examples', 'mnist', 'README.md')) as f:
        text = ' '.join(f.read().split())
    five = re.search(r'--seeds 0 1 2 3 4 \| batch size \| momentum-lars \| '
                     r'lars \|[-:| ]*\| 8192 \| [^|]* \| [0-9.]+ \(([0-9.]+)'
                     r'-([0-9.]+)\) \|', text)
    three = re.search(r'\| none \(the defaults\) \| [0-9.]+ \(([0-9.]+)-'
                      r'([0-9.]+)\) \|', text)
    spread = [float(m.group(2)) - float(m.group(1)) for m in (three, five)]
    assert ("seeds ({:.2f} point over these three; {:.2f} over the five of "
            "the five-seed table above, `lars` {}-{})".format(
                spread[0], spread[1], five.group(1), five.group(2))) in text


# -- The trainer's end: failed, or stopped with results.py -----------------

def test_a_failed_trainer_shows_the_end_of_its_output(results, tmp_path,
                                                      monkeypatch):
    """The reason is in <out>/<run>.stdout; results.py showed a
    CalledProcessError traceback instead."""
    def failing(argv, stdout):
        stdout.write('\n'.join('line {}'.format(i) for i in range(30))
                     + '\nError: the reason\n')
        stdout.flush()
        return 2
    monkeypatch.setattr(results, 'run_process', failing)
    out = str(tmp_path / 'runs')
    with pytest.raises(SystemExit) as exc:
        results.main(['--batchsizes', '16', '--optimizers', 'lars',
                      '--epoch', '1', '--out', out])
    message = exc.value.code
    assert isinstance(message, str), message
    path = os.path.join(out, 'b16-lars-s0.stdout')
    assert 'status 2' in message and path in message
    shown = message.split(path, 1)[1].splitlines()[1:]
    assert shown[-1].strip() == 'Error: the reason'
    assert len(shown) == results.TAIL


def children(pid):
    found = []
    for name in os.listdir('/proc'):
        try:
            with open('/proc/{}/stat'.format(name)) as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found.append(int(name))
    return found


def running(pid):
    """Whether ``pid`` runs (a zombie, waiting to be reaped, does not)."""
    try:
        with open('/proc/{}/stat'.format(pid)) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads /proc')
def test_sigterm_stops_the_trainer_too(results, tmp_path):
    """kill -TERM results.py: its trainer ran on, writing into the run's
    folder; now it stops with it, and the run is not done (a restart
    runs it again)."""
    root = str(tmp_path / 'datasets')
    conftest._write_mnist(root)
    out = str(tmp_path / 'runs')
    env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONWARNINGS='ignore')
    errors = tmp_path / 'stderr'
    with open(str(errors), 'w') as stderr:
        parent = subprocess.Popen(
            [sys.executable, os.path.join('examples', 'mnist', 'results.py'),
             '--batchsizes', '16', '--optimizers', 'lars', '--epoch',
             '100000', '--noplot', '--out', out, '--dataset-root', root],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    trainer, log = [], os.path.join(out, 'b16-lars-s0', 'log')
    try:
        deadline = time.time() + 120
        # Until the trainer has logged an epoch: well under way.
        while time.time() < deadline and not os.path.exists(log):
            assert parent.poll() is None, errors.read_text()
            time.sleep(0.2)
        trainer = children(parent.pid)
        assert len(trainer) == 1 and os.path.exists(log)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 143
        deadline = time.time() + 10
        while running(trainer[0]) and time.time() < deadline:
            time.sleep(0.1)
        assert not running(trainer[0])
    finally:
        for pid in trainer:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    with open(log) as f:
        epochs = json.load(f)[-1]['epoch']
    time.sleep(1)
    with open(log) as f:
        assert json.load(f)[-1]['epoch'] == epochs  # nothing writes it
    args = argparse.Namespace(epoch=100000)
    assert not results.done(results.read_log(os.path.dirname(log)), args)
    assert not os.path.exists(os.path.join(out, 'results.md'))
