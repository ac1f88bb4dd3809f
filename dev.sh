#!/usr/bin/env bash
# The commands a developer needs, on a fresh Debian machine or any other:
#
#   bash dev.sh mnist [ARGS...]          train the MNIST example in .venv
#   bash dev.sh chainermn [-n N] [ARGS...]
#                                        the ChainerMN MNIST example on N
#                                        processes (default 2) of this machine
#   bash dev.sh venv [EXTRAS]            only make .venv, with the examples'
#                                        packages and the extras named (e.g.
#                                        test,mpi); then 'source
#                                        .venv/bin/activate'
#   bash dev.sh test [TOX ARGS...]       the whole test suite, through tox
#   bash dev.sh docs [SPHINX ARGS...]    build the docs into docs/_build/html
#   bash dev.sh --help                   this text
#
# mnist and chainermn run in the caller's directory, so relative paths in
# ARGS (-o, --resume, --dataset-root) are the caller's, as when the script
# is run directly; test runs tox in the repository.
#
# Chainer 7.8.1 imports unchanged on Python 3.9 to 3.11 (test also runs
# an env of 3.12 with numpy 2, through chainer_lars_compat); the Pythons are looked
# for on PATH (python3.11, ...), then among pyenv's versions, then python3.
#
# Environment:
#   CHAINER_LARS_LATEST_PIP=1   the newest pip from PyPI in every venv, tox's
#                               included, instead of the one each comes with
#   CHAINER_LARS_EMULATED_IN,   the tox envs (comma-separated) that run
#   CHAINER_LARS_INTEGRATION_IN, each group of tests of tests/conftest.py
#   CHAINER_LARS_EXAMPLES_IN,   (test: the emulated and integration groups
#   CHAINER_LARS_ISOLATED_IN,   in the newest Python's env, examples in
#   CHAINER_LARS_DOCS_IN        the oldest's, isolated in the oldest's and
#                               the numpy 2 one, docs in docs; empty: every
#                               env)
#   CHAINER_LARS_HEARTBEAT      seconds between test's progress lines while
#                               tox runs envs in parallel (default 30)
#   CHAINER_LARS_TOX_PARALLEL   how many tox envs test runs at a time
#                               (default auto: one per core; 1: one at a
#                               time, with their output live); envs named
#                               with -e run one at a time
#   OPENBLAS_NUM_THREADS,       BLAS threads of each env while test runs
#   OMP_NUM_THREADS             envs in parallel (default 1)
#   CHAINER_LARS_TERMINAL       set by chainermn for the trainer, whose
#                               --progress auto takes it over isatty: 1 if
#                               dev.sh's output is a terminal, else 0
#   CHAINER_DATASET_ROOT        where Chainer caches data sets; for mnist,
#                               chainermn and test it defaults to
#                               ../shared/datasets next to the checkout when
#                               that folder holds MNIST (else Chainer's own
#                               cache, ~/.chainer/dataset)
#   CI                          set (and not false or 0), as hosted CI
#                               services and .ci/run set it: test fails
#                               where the test run changed the checkout
#                               (elsewhere it warns), and the tests that
#                               need the real MNIST fail where none can be
#                               had (elsewhere they skip)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=$root/.venv

# Both names: pip 26 reads build constraints only from PIP_BUILD_CONSTRAINT,
# older pips apply PIP_CONSTRAINT to builds too. Either one also replaces a
# constraint file set in a global pip configuration.
export PIP_CONSTRAINT="$root/constraints.txt"
export PIP_BUILD_CONSTRAINT="$root/constraints.txt"

say() { echo "dev.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

# Installs Debian packages where we may; fails elsewhere.
apt_install() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
    say "installing $* with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Prints the executable of a working Python of version $1 (such as 3.11).
python_for() {
    local version=$1 pyenv_root candidate
    pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    for candidate in "python$version" \
            $(printf '%s\n' "$pyenv_root/versions/$version".*/bin/"python$version" \
                | sort -rV) \
            python3; do
        "$candidate" -c "import sys
assert '%d.%d' % sys.version_info[:2] == '$version'
print(sys.executable)" 2>/dev/null && return 0
    done
    return 1
}

no_python="no Python 3.9, 3.10 or 3.11 found (dev.sh makes its envs with one, \
where Chainer 7.8.1 imports as it is): install one, e.g. 'pyenv install 3.11' \
or Debian's python3.11 and python3.11-venv; on Python 3.12 or newer, install \
with pip and chainer_lars_compat instead (README.rst, \"Installation\")"

# Prints the newest Python Chainer can use.
best_python() {
    python_for 3.11 || python_for 3.10 || python_for 3.9 || die "$no_python"
}

# Makes the venv $1 with Python $2 unless a working one is there; one of
# another Python is replaced only where dev.sh made it (its .dev.sh): a
# user's own is never removed. Its pip is the one that Python bundles,
# unless CHAINER_LARS_LATEST_PIP=1.
make_venv() {
    local venv=$1 python=$2
    if ! "$venv/bin/python" -c 'import sys; assert (3, 9) <= sys.version_info < (3, 12)' \
            2>/dev/null; then
        if [ -e "$venv" ] && [ ! -e "$venv/.dev.sh" ] \
                && [ "${venv#.tox/}" = "$venv" ]; then  # .tox: all dev.sh's
            die "$venv is there, not a Python 3.9-3.11 venv that dev.sh made, \
and dev.sh makes its own there: move it away (or remove it), then run the \
command again (your own venv of Python 3.12 or newer: README.rst, \"Installation\")"
        fi
        say "creating $venv with $python"
        rm -rf "$venv"
        # Debian's own Python has venv in a package of its own.
        "$python" -m venv "$venv" \
            || { apt_install python3-venv && rm -rf "$venv" && "$python" -m venv "$venv"; } \
            || die "cannot create $venv with $python (on Debian: apt-get install python3-venv)"
        : > "$venv/.dev.sh"
    fi
    if [ "${CHAINER_LARS_LATEST_PIP:-}" = 1 ]; then
        "$venv/bin/python" -m pip install -q -U pip
    fi
}

# Makes .venv and installs chainer-lars into it, editable, with the extras
# $1 (comma-separated) and those installed before; only a change of the
# packaging files needs another install.
ensure_venv() {
    local want=$1 python stamp have="" extras
    python=$(best_python)
    make_venv "$venv" "$python"
    stamp=$(cat "$root/setup.cfg" "$root/pyproject.toml" "$root/constraints.txt" | cksum)
    if [ "$(sed -n 1p "$venv/.installed" 2>/dev/null)" = "$stamp" ]; then
        have=$(sed -n 2p "$venv/.installed")
    fi
    extras=$(printf '%s\n' ${have//,/ } ${want//,/ } | sort -u | paste -sd, -)
    if [ "$extras" != "$have" ]; then
        say "installing chainer-lars[$extras] into $venv (the first time takes minutes)"
        "$venv/bin/python" -m pip install -q -e "$root[$extras]"
        printf '%s\n%s\n' "$stamp" "$extras" > "$venv/.installed"
    fi
}

# CHAINER_DATASET_ROOT, unless set: the MNIST copy next to the checkout.
default_dataset_root() {
    local shared_data="$root/../shared/datasets"
    if [ -z "${CHAINER_DATASET_ROOT:-}" ] \
            && [ -f "$shared_data/pfnet/chainer/mnist/train.npz" ]; then
        export CHAINER_DATASET_ROOT
        CHAINER_DATASET_ROOT=$(cd "$shared_data" && pwd)
        say "using the MNIST copy in $CHAINER_DATASET_ROOT"
    fi
}

# Whether CI is set to something true, as hosted CI services set it.
in_ci() {
    case ${CI:-} in ''|0|false|False|FALSE) return 1 ;; esac
}

# The check that a test run leaves the checkout as it was (no test may
# write outside its temporary folder). checkout_before records the moment
# and git's view of the checkout into the files $1 and $1.git;
# checkout_changes prints, one a line, the files of the checkout written
# since (created or changed, ignored ones such as result/ included) and the
# tracked ones removed: a comparison of before and after, so that the files
# a developer had already changed or added count only if the run touched
# them. The tools' own caches are left out: tox's envs, the venv, Python's
# bytecode, pytest's and Hypothesis's caches, the package's egg-info and
# setuptools' build folder (tox's packaging may write both).
checkout_before() {
    : > "$1"
    git -C "$root" status --porcelain=v1 --untracked-files=no 2>/dev/null \
        > "$1.git" || true
}

checkout_changes() {
    local stamp=$1
    {
        find "$root" \( -path "$root/.git" -o -path "$root/.tox" \
                -o -path "$root/.venv" -o -path "$root/build" \
                -o -name __pycache__ \
                -o -name .pytest_cache -o -name .hypothesis \
                -o -name '*.egg-info' \) -prune \
            -o \( -type f -o -type l \) -newer "$stamp" -print 2>/dev/null \
            | sed "s|^$root/||" || true
        git -C "$root" status --porcelain=v1 --untracked-files=no 2>/dev/null \
            | grep -vxF -f "$stamp.git" | sed -n 's/^\(D.\|.D\) //p' || true
    } | sort -u
}

# Says which files the test run changed in the checkout; fails in CI.
check_checkout() {
    local changed
    changed=$(checkout_changes "$1")
    rm -f "$1" "$1.git"
    [ -n "$changed" ] || return 0
    say "the test run changed the checkout (a test wrote outside its temporary folder):"
    printf '%s\n' "$changed" | sed 's/^/dev.sh:     /' >&2
    if in_ci; then
        say "error: the checkout must be as it was (CI is set)"
        return 1
    fi
    say "warning: not an error outside CI (CI=true), in case you changed them yourself"
}

# Open MPI's mpiexec, and mpicc to build mpi4py: installed where we may.
ensure_mpi() {
    if ! command -v mpiexec >/dev/null || ! command -v mpicc >/dev/null; then
        apt_install openmpi-bin libopenmpi-dev || true
    fi
    command -v mpiexec >/dev/null \
        || die "no mpiexec: install Open MPI (on Debian, as root: apt-get install openmpi-bin libopenmpi-dev)"
    command -v mpicc >/dev/null \
        || say "warning: no mpicc, which building mpi4py needs (on Debian: libopenmpi-dev)"
}

cmd_venv() {
    local extras=examples${1:+,$1} extra
    [ $# -le 1 ] || die "usage: bash dev.sh venv [EXTRA,...]"
    for extra in ${extras//,/ }; do
        case $extra in
            test|examples|mpi|cuda12|nvrtc|lint|docs) ;;
            cuda13) die "the extra 'cuda13' needs Python 3.12+ and numpy 2; .venv is Python 3.9 to 3.11 with numpy<2: use cuda12 (README.rst, Installation)" ;;
            *) die "unknown extra '$extra' (test, examples, mpi, cuda12, nvrtc, lint, docs)" ;;
        esac
    done
    case ,$extras, in *,mpi,*) ensure_mpi ;; esac
    ensure_venv "$extras"
    say "ready: 'source $venv/bin/activate' puts its python (and pip) first on PATH;"
    say "or run $venv/bin/python directly"
}

cmd_mnist() {
    local script=$root/examples/mnist/train_mnist.py
    [ -f "$script" ] || die "$script does not exist (yet)"
    ensure_venv examples
    default_dataset_root
    # The trainer's Ctrl-C message gives the command to resume: this one.
    export CHAINER_LARS_LAUNCHER
    CHAINER_LARS_LAUNCHER="bash $(printf %q "$0") mnist"
    exec "$venv/bin/python" "$script" "$@"
}

cmd_chainermn() {
    local script=$root/examples/chainermn/mnist/train_mnist.py n=2 flags=()
    [ -f "$script" ] || die "$script does not exist (yet)"
    if [ "${1:-}" = -n ]; then
        [ $# -ge 2 ] || die "-n needs a number of processes"
        n=$2
        shift 2
    fi
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "-n must be a number of processes (1 or more), got '$n'"
    ensure_mpi
    ensure_venv examples,mpi
    default_dataset_root
    export CHAINER_LARS_LAUNCHER
    CHAINER_LARS_LAUNCHER="bash $(printf %q "$0") chainermn -n $n"
    case $(mpiexec --version 2>&1) in
        *'Open MPI'*|*OpenRTE*)
            # Open MPI refuses to run as root, and to start more processes
            # than there are cores, unless told.
            if [ "$(id -u)" = 0 ]; then
                flags+=(--allow-run-as-root)
            fi
            if [ "$n" -gt "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" ]; then
                flags+=(--oversubscribe)
            fi
            ;;
    esac
    # Open MPI gives each rank a pseudo-terminal, where the trainer's
    # --progress auto would see a terminal even when this script writes
    # to a file, and put the bar's escape codes into it: say whether the
    # output is one (the trainer's own --progress, if given, still wins).
    export CHAINER_LARS_TERMINAL=0
    if [ -t 1 ]; then
        CHAINER_LARS_TERMINAL=1
    fi
    exec mpiexec -n "$n" ${flags[@]+"${flags[@]}"} "$venv/bin/python" "$script" "$@"
}

# Sphinx into .venv (the docs extra), then the HTML into docs/_build/html;
# the arguments go to sphinx-build (-W: warnings as errors, as tox -e docs).
cmd_docs() {
    ensure_venv docs
    cd "$root"
    "$venv/bin/python" -m sphinx -b html "$@" docs docs/_build/html
    say "built: open $root/docs/_build/html/index.html"
}

# While tox runs its envs in parallel (and holds their output back until
# each ends), prints when each env starts, when its pytest session ends,
# and every CHAINER_LARS_HEARTBEAT seconds (default 30) how far each one
# is: its tests done of those collected, and the test running once it has
# run longer than that (from the files that
# tests/progress.py writes into $1), or that it waits, installs or runs.
# $1/tox.out is tox's own output, which says when an env ended; $2... are
# the envs. An env has started once tox has cleared its log folder after
# $1/start was touched (before tox began: this script's Python may start
# after tox has cleared the first envs' folders).
progress_monitor() {
    exec .tox/.bootstrap/bin/python - "$@" <<'PY'
import os, re, sys, time
folder, envs = sys.argv[1], sys.argv[2:]
interval = float(os.environ.get('CHAINER_LARS_HEARTBEAT') or 30)
start = os.stat(os.path.join(folder, 'start')).st_mtime
parent = os.getppid()
started, finished, ended = set(), set(), {}


def say(text):
    print('dev.sh: ' + text, file=sys.stderr, flush=True)


def progress(env):
    try:
        with open(os.path.join(folder, env)) as f:
            # the test's node id, the fifth word, may hold spaces
            return f.read().strip().split(None, 4)
    except OSError:
        return None


def tox_ended():
    try:
        with open(os.path.join(folder, 'tox.out'), errors='replace') as f:
            text = f.read()
    except OSError:
        return {}
    return dict(re.findall(r'^(\S+): (OK|FAIL|SKIP)', text, re.M))


def state(env):
    if env in ended:
        return 'done ({})'.format(ended[env])
    words = progress(env)
    if words is None:
        return 'running' if env in started else 'waiting'
    if words[0] == 'collecting':
        return 'collecting tests'
    if words[0] == 'finished':
        return 'pytest done, {} tests, {} failed'.format(words[2], words[3])
    done, total, failed = map(int, words[:3])
    text = '{}/{} tests ({:.0%}){}'.format(
        done, total, done / total if total else 0,
        ', {} failed'.format(failed) if failed else '')
    # The test running now, once it has run longer than a heartbeat: the
    # percentage counts tests, and one can take minutes.
    if len(words) > 4:
        running = time.time() - float(words[3])
        if running >= interval:
            minutes, seconds = divmod(int(running), 60)
            text += ', running {} for {}'.format(
                words[4], '{} min {:02d} s'.format(minutes, seconds)
                if minutes else '{} s'.format(seconds))
    return text


beat = start
while os.getppid() == parent:
    time.sleep(min(1.0, interval))
    ended.update(tox_ended())
    for env in envs:
        log = os.path.join('.tox', env, 'log')
        if env not in started and (progress(env) is not None or (
                os.path.isdir(log) and os.stat(log).st_mtime >= start)):
            started.add(env)
            say('{}: started'.format(env))
        words = progress(env)
        if words and words[0] == 'finished' and env not in finished:
            finished.add(env)
            say('{}: pytest done: {} tests, {} failed'.format(
                env, words[2], words[3]))
    if time.time() - beat >= interval:
        beat = time.time()
        minutes, seconds = divmod(int(beat - start), 60)
        say('{} min {:02d} s: {}'.format(minutes, seconds, '; '.join(
            '{} {}'.format(env, state(env)) for env in envs)))
PY
}

cmd_test() {
    local version python newest="" path="" envs=() order arg jobs journal status \
        work monitor before stack
    cd "$root"
    default_dataset_root
    for version in 3.11 3.10 3.9; do
        if python=$(python_for "$version"); then
            say "Python $version: $python"
            newest=${newest:-$python}
            path+="$(dirname "$python"):"
            envs+=("py${version/./}-cpu")
        else
            say "Python $version: not found, so no py${version/./}-cpu"
        fi
    done
    [ -n "$newest" ] || die "$no_python"
    # Python 3.12 with numpy 2: Chainer through chainer_lars_compat.
    if python=$(python_for 3.12); then
        say "Python 3.12: $python"
        path+="$(dirname "$python"):"
        stack=py312-numpy2
    elif in_ci; then
        die "no Python 3.12, which the py312-numpy2 env needs (CI is set): install one, e.g. 'pyenv install 3.12'"
    else
        say "Python 3.12: not found, so no py312-numpy2 (CI fails without it)"
        stack=
    fi
    if ! command -v mpiexec >/dev/null; then
        apt_install openmpi-bin libopenmpi-dev \
            || say "warning: no mpiexec and cannot install Open MPI: MPI tests will skip"
    fi
    # The emulated GPU tests compile the CUDA kernels with a C++20 compiler.
    if ! command -v "${CXX:-g++}" >/dev/null && ! command -v c++ >/dev/null; then
        apt_install g++ \
            || say "warning: no C++ compiler and cannot install g++: the emulated GPU tests will fail"
    fi

    make_venv .tox/.bootstrap "$newest"
    .tox/.bootstrap/bin/python -m pip install -q tox
    if [ "${CHAINER_LARS_LATEST_PIP:-}" = 1 ]; then
        export VIRTUALENV_DOWNLOAD=1
    fi

    # Our env list unless the caller names envs.
    for arg in "$@"; do
        case $arg in
            --) break ;;
            -e|-e?*|--env|--env=*) envs=() ;;
        esac
    done
    if [ ${#envs[@]} -gt 0 ]; then
        # The envs of the newest and the oldest Python of 3.9 to 3.11, and
        # 3.12 with numpy 2: each runs the library's tests, which may differ
        # by Python and numpy, and the groups of tests/conftest.py that the
        # variables below give it; the groups that differ by neither run
        # once, split between the two so that each takes about as long
        # (the emulated GPU and the tools in the newest's, the example
        # trainers in the oldest's, which a script is likeliest to break
        # on). A Python between the two (3.10: 3.11's numpy and Numba)
        # adds nothing they do not test: tox -e py310-cpu runs it. The
        # longest first, so that in parallel none waits for a slot at the
        # end.
        order=("${envs[0]}")
        if [ ${#envs[@]} -gt 1 ]; then
            order+=("${envs[${#envs[@]}-1]}")
        fi
        if [ ${#envs[@]} -gt 2 ]; then
            say "not run: ${envs[*]:1:${#envs[@]}-2} (between ${envs[${#envs[@]}-1]} and ${envs[0]}; tox -e runs it)"
        fi
        [ -z "$stack" ] || order+=("$stack")
        set -- -e "$(IFS=,; echo "${order[*]},docs,lint")" "$@"
        export CHAINER_LARS_EMULATED_IN=${CHAINER_LARS_EMULATED_IN-${envs[0]}}
        export CHAINER_LARS_INTEGRATION_IN=${CHAINER_LARS_INTEGRATION_IN-${envs[0]}}
        export CHAINER_LARS_EXAMPLES_IN=${CHAINER_LARS_EXAMPLES_IN-${envs[${#envs[@]}-1]}}
        export CHAINER_LARS_ISOLATED_IN=${CHAINER_LARS_ISOLATED_IN-${envs[${#envs[@]}-1]}${stack:+,$stack}}
        export CHAINER_LARS_DOCS_IN=${CHAINER_LARS_DOCS_IN-docs}
    fi
    # tox finds each env's Python by name (python3.9, ...) on PATH.
    export PATH="$path$PATH"
    jobs=${CHAINER_LARS_TOX_PARALLEL:-auto}
    before=$(mktemp)
    checkout_before "$before"
    status=0
    if [ ${#envs[@]} -eq 0 ] || [ "$jobs" = 0 ] || [ "$jobs" = 1 ]; then
        if [ ${#envs[@]} -gt 0 ]; then
            say "running the tox envs one at a time, their output live: about twice as long as two at a time"
        fi
        .tox/.bootstrap/bin/tox "$@" || status=$?
        check_checkout "$before" || [ "$status" != 0 ] || status=1
        return "$status"
    fi
    # Our env list: $jobs envs at a time (auto: one per core), which on 2
    # cores takes about half the time of one at a time. tox then shows only
    # a failing env's output, so that of the others follows, env by env.
    # One BLAS thread an env: with an env per core, OpenBLAS's threads
    # would spin on each other's cores.
    export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS-1}
    export OMP_NUM_THREADS=${OMP_NUM_THREADS-1}
    say "running the tox envs $jobs at a time (auto: one per core; CHAINER_LARS_TOX_PARALLEL=1: one at a time)"
    say "this takes about 6 minutes on 2 idle cores once its envs are made, 7 the first time, longer on slower cores"
    say "(an AMD EPYC: 5 min 52 s, and 6 min 44 s from a fresh clone, installs included; README.rst), and leaves 2.2 GB in .tox;"
    say "a line every ${CHAINER_LARS_HEARTBEAT:-30} s says how far each env is; tox says OK or FAILED as each ends"
    journal=$(mktemp)
    work=$(mktemp -d)
    # The pytest sessions write their progress there (tests/progress.py);
    # tox passes CHAINER_* on.
    export CHAINER_LARS_PROGRESS=$work
    touch "$work/start"
    progress_monitor "$work" "${order[@]}" docs lint &
    monitor=$!
    .tox/.bootstrap/bin/tox p -p "$jobs" --parallel-no-spinner \
        --result-json "$journal" "$@" | tee "$work/tox.out" || status=$?
    kill "$monitor" 2>/dev/null || true
    wait "$monitor" 2>/dev/null || true
    rm -rf "$work"
    .tox/.bootstrap/bin/python - "$journal" <<'PY' || true
import json, sys
with open(sys.argv[1]) as f:
    envs = json.load(f).get('testenvs', {})
# Only the envs that ran (the journal also lists .pkg and the envs of the
# config that were not asked for, without a result).
envs = {name: env for name, env in envs.items() if 'result' in env}
passed = [name for name, env in envs.items()
          if env.get('result', {}).get('success')]
for name in passed:
    for command in envs[name].get('test', []):
        print('== {}: {}'.format(name, ' '.join(command['command'])))
        sys.stdout.write(command['output'] + command['err'])
for name, env in envs.items():
    result = env.get('result', {})
    print('dev.sh: {}: {} in {:.0f} s'.format(
        name, 'OK' if result.get('success') else 'FAILED (its output is above)',
        result.get('duration', 0)))
PY
    rm -f "$journal"
    check_checkout "$before" || [ "$status" != 0 ] || status=1
    return "$status"
}

case ${1:-} in
    mnist) shift; cmd_mnist "$@" ;;
    chainermn) shift; cmd_chainermn "$@" ;;
    venv) shift; cmd_venv "$@" ;;
    test) shift; cmd_test "$@" ;;
    docs) shift; cmd_docs "$@" ;;
    -h|--help|help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" ;;
    *) [ -z "${1:-}" ] || say "error: unknown command '$1'"
       say "usage: bash dev.sh mnist [ARGS...] | bash dev.sh chainermn [-n N] [ARGS...]"
       say "       | bash dev.sh venv [EXTRAS] | bash dev.sh test [TOX ARGS...]"
       say "       | bash dev.sh docs [SPHINX ARGS...] | bash dev.sh --help"
       exit 2 ;;
esac
