#!/usr/bin/env bash
# The two commands a developer needs, on a fresh Debian machine or any other:
#
#   bash dev.sh mnist [ARGS...]   train the MNIST example in .venv
#   bash dev.sh test [TOX ARGS]   the whole test suite, through tox
#
# Chainer 7.8.1 imports on Python 3.9 to 3.11 only; the Pythons are looked
# for on PATH (python3.11, ...), then among pyenv's versions, then python3.
#
# Environment:
#   CHAINER_LARS_LATEST_PIP=1   the newest pip from PyPI in every venv, tox's
#                               included, instead of the one each comes with
#   CHAINER_DATASET_ROOT        where Chainer caches data sets; for mnist it
#                               defaults to ../shared/datasets when that
#                               folder holds MNIST
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"

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

no_python="no Python 3.9, 3.10 or 3.11 found (Chainer 7.8.1 needs one): \
install one, e.g. 'pyenv install 3.11' or Debian's python3.11 and python3.11-venv"

# Prints the newest Python Chainer can use.
best_python() {
    python_for 3.11 || python_for 3.10 || python_for 3.9 || die "$no_python"
}

# Makes the venv $1 with Python $2 unless a working one is there. Its pip
# is the one that Python bundles, unless CHAINER_LARS_LATEST_PIP=1.
make_venv() {
    local venv=$1 python=$2
    if ! "$venv/bin/python" -c 'import sys; assert (3, 9) <= sys.version_info < (3, 12)' \
            2>/dev/null; then
        say "creating $venv with $python"
        rm -rf "$venv"
        # Debian's own Python has venv in a package of its own.
        "$python" -m venv "$venv" \
            || { apt_install python3-venv && rm -rf "$venv" && "$python" -m venv "$venv"; } \
            || die "cannot create $venv with $python (on Debian: apt-get install python3-venv)"
    fi
    if [ "${CHAINER_LARS_LATEST_PIP:-}" = 1 ]; then
        "$venv/bin/python" -m pip install -q -U pip
    fi
}

cmd_mnist() {
    local script=examples/mnist/train_mnist.py python stamp shared_data
    [ -f "$script" ] || die "$script does not exist (yet) in $root"
    python=$(best_python)
    make_venv .venv "$python"
    # An editable install: only a change of the packaging files needs another.
    stamp=$(cat setup.cfg pyproject.toml constraints.txt | cksum)
    if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
        say "installing chainer-lars[examples] into .venv (the first time takes minutes)"
        .venv/bin/python -m pip install -q -e '.[examples]'
        echo "$stamp" > .venv/.installed
    fi
    shared_data="$root/../shared/datasets"
    if [ -z "${CHAINER_DATASET_ROOT:-}" ] \
            && [ -f "$shared_data/pfnet/chainer/mnist/train.npz" ]; then
        export CHAINER_DATASET_ROOT
        CHAINER_DATASET_ROOT=$(cd "$shared_data" && pwd)
        say "using the MNIST copy in $CHAINER_DATASET_ROOT"
    fi
    exec .venv/bin/python "$script" "$@"
}

cmd_test() {
    local version python newest="" path="" envs=() arg
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
    if ! command -v mpiexec >/dev/null; then
        apt_install openmpi-bin libopenmpi-dev \
            || say "warning: no mpiexec and cannot install Open MPI: MPI tests will skip"
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
        set -- -e "$(IFS=,; echo "${envs[*]},lint")" "$@"
    fi
    # tox finds each env's Python by name (python3.9, ...) on PATH.
    PATH="$path$PATH" exec .tox/.bootstrap/bin/tox "$@"
}

case ${1:-} in
    mnist) shift; cmd_mnist "$@" ;;
    test) shift; cmd_test "$@" ;;
    *) say "usage: bash dev.sh mnist [ARGS...] | bash dev.sh test [TOX ARGS...]"; exit 2 ;;
esac
