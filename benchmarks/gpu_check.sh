#!/usr/bin/env bash
# The GPU check of chainer-lars: the one script to run when a GPU is lent.
# Within a budget of 345 s (--budget), everything it runs writes into OUTDIR:
#
#  1. the timings, alone on the GPU, first:
#     - benchmarks/gpu_floor.py: LARS and LAMB against their byte floors
#       on ResNet-50's and BERT-large's arrays, float32 and mixed16, host
#       against GPU time, and the hook in a mixed16 training loop against
#       MomentumSGD alone (issue 46's targets, as ratios; floor.txt);
#     - benchmarks/train_loop.py --other: the update in a training loop,
#       this tree against the library before the lighter engine (issue
#       45's check), both in one process, interleaved, when that tree is
#       in BEFORE (engine.txt, engine.json);
#     - benchmarks/gpu_peers.py: one update of ours beside Chainer's,
#       PyTorch's, timm's and apex's optimizers, one process per framework
#       (peers.md, peers.json);
#     - a short bench_lars.py run (ResNet-50, float32 and mixed16, weight
#       decay on: the per-array paths and Chainer's hook beside ours;
#       bench_gpu.txt) and paper_model.py on it;
#  2. then side by side: the gpu tests (pytest_gpu.txt), compute-sanitizer
#     (memcheck, racecheck, synccheck) over a part of tests/test_gpu.py
#     (sanitize_*.txt), and the MNIST example in mixed16 (mnist_*.txt);
#  3. from the start, on the CPU, where MNIST is carried: the study's
#     check that a trial repeats on another machine (reproduce.txt; not
#     done within its limit, it is reported and not judged).
#
#   benchmarks/gpu_check.sh [--archive FILE] [--budget SECONDS] [--rehearse]
#                           OUTDIR [DEVICE]
#
# OUTDIR: a new or empty folder (one that holds files is refused, as an
# earlier check's would mix with this one's). DEVICE: 0 (default),
# @cupy:0, ... --archive FILE: at the end, OUTDIR as
# a .tar.gz at FILE, with summary.txt, floor.txt and peers.md copied
# beside it (the lent machine returns at most 8 files from $OUT, so keep
# OUTDIR outside $OUT). --rehearse: the same steps on the CPU with tiny
# sizes (device @numpy; the gpu tests only skip), to check the script
# itself where there is no GPU; its numbers mean nothing.
#
# On the lent machine (Python 3.12, numpy 2, CuPy 14, PyTorch, timm, no
# Chainer) it needs from outside the repository only the Chainer wheel in
# .whl/ (and, optionally, MNIST in .whl/datasets). Chainer is taken as
# installed if it imports; else with compat/ (numpy 2 shims for Chainer
# 7.8.1's import) on PYTHONPATH; else the wheel is installed into
# $CHAINER_SITE (default /tmp/site) and both go on PYTHONPATH. Building
# the wheel, in the repo root, on a machine with a registry:
#
#   printf 'setuptools<81\n' > /tmp/bc.txt
#   PIP_CONSTRAINT=/tmp/bc.txt PIP_BUILD_CONSTRAINT=/tmp/bc.txt \
#     pip wheel --no-deps -w .whl chainer==7.8.1
#   mkdir -p .whl/datasets && cp -r ../shared/datasets/pfnet .whl/datasets/
#   mkdir -p .whl/before && git archive 229bc30 chainer_lars |
#     tar -x -C .whl/before && git rev-parse 229bc30 > .whl/before/COMMIT
#
# and the run (carry [".whl"], timeout_s 420):
#
#   bash benchmarks/gpu_check.sh --archive $OUT/gpu_check.tar.gz /tmp/gc 0
#
# Environment: PYTHON (default python3), COMPAT (default compat/), WHEELS
# (default .whl/), CHAINER_SITE, MNIST_ROOT (default .whl/datasets),
# REPRODUCE (a study JSON; empty skips it), BEFORE (the tree to time the
# training loop against, default .whl/before; empty skips it), BENCH=0
# (no bench_lars.py), SANITIZE= (no compute-sanitizer); limits in whole
# seconds, each cut to what the budget has left, 0 to skip that step on
# purpose: FLOOR_TIMEOUT (90), ENGINE_TIMEOUT (120), PEERS_TIMEOUT (150),
# BENCH_TIMEOUT (60), TEST_TIMEOUT (150), SANITIZE_TIMEOUT (the three
# tools together, shared 60:25:15 in turn; default all the side-by-side
# steps have), TRAIN_TIMEOUT (90), REPRODUCE_TIMEOUT (480);
# PARALLEL_RESERVE (140), the seconds the timings leave for the
# side-by-side steps (a --budget under what the timings that run need
# with it is a usage error, but for --rehearse); extra arguments: FLOOR_ARGS, ENGINE_ARGS (to
# train_loop.py), PEERS_ARGS, BENCH_ARGS, MNIST_ARGS.
# Exit status: 0 when every step that ran passed and none was cut for
# lack of time (summary.txt lists what did not run, and why: skipped on
# purpose, or absent), 1 otherwise, 2 for a usage error (a limit that is
# not whole seconds among them). Speed targets missed do not fail the
# check: their ratios are printed (floor.txt, peers.md).

set -u -o pipefail

usage() {
    echo "usage: $0 [--archive FILE] [--budget SECONDS] [--rehearse] OUTDIR [DEVICE]" >&2
    exit 2
}

archive=
budget=345
rehearse=0
while [ $# -gt 0 ]; do
    case $1 in
        --archive) [ $# -ge 2 ] || usage; archive=$2; shift 2 ;;
        --archive=*) archive=${1#--archive=}; shift ;;
        --budget) [ $# -ge 2 ] || usage; budget=$2; shift 2 ;;
        --budget=*) budget=${1#--budget=}; shift ;;
        --rehearse) rehearse=1; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        --) shift; break ;;
        -?*) echo "$0: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case $budget in
    ''|*[!0-9]*) echo "$0: --budget takes whole seconds, not '$budget'" >&2; exit 2 ;;
esac
budget=$((10#$budget))  # 090 is 90 s, not octal
if [ -z "$1" ]; then
    echo "$0: OUTDIR is empty" >&2
    exit 2
fi
for var in FLOOR_TIMEOUT ENGINE_TIMEOUT PEERS_TIMEOUT BENCH_TIMEOUT \
        TEST_TIMEOUT SANITIZE_TIMEOUT TRAIN_TIMEOUT REPRODUCE_TIMEOUT \
        PARALLEL_RESERVE; do
    case ${!var-} in
        *[!0-9]*)
            echo "$0: $var takes whole seconds (0 skips its step), not '${!var}'" >&2
            exit 2 ;;
        ?*) printf -v "$var" '%d' "$((10#${!var}))" ;;  # 090 is not octal
    esac
done
# The least budget under which no step that runs is cut (a cut fails the
# check): the byte floors keep the reserve of the side-by-side steps and
# 60 s, the other timings the reserve; each needs 10 s of its own. Not
# for a rehearsal, which may cut steps on purpose, to check the cuts.
need=60 why="the steps need"
reserve=${PARALLEL_RESERVE:-140}
[ $rehearse = 1 ] && reserve=60
if [ $rehearse = 1 ]; then
    :
elif [ "${FLOOR_TIMEOUT:-1}" != 0 ]; then
    need=$((reserve + 70))
    why="the byte floors need (10 s, keeping $((reserve + 60)) s for the later steps; FLOOR_TIMEOUT=0 skips them)"
elif [ "${PEERS_TIMEOUT:-1}" != 0 ] \
        || { [ "${ENGINE_TIMEOUT:-1}" != 0 ] && [ -n "${BEFORE-x}" ]; } \
        || { [ "${BENCH_TIMEOUT:-1}" != 0 ] && [ "${BENCH:-1}" != 0 ]; }; then
    need=$((reserve + 10))
    why="the timings need (10 s, keeping PARALLEL_RESERVE $reserve s for the side-by-side steps)"
fi
if [ "$budget" -lt "$need" ]; then
    echo "$0: --budget $budget is under the $need s $why" >&2
    exit 2
fi
if [ -e "$1" ] && { [ ! -d "$1" ] || [ -n "$(ls -A "$1" 2>&1)" ]; }; then
    # An earlier check's files would be read as this one's (the MNIST
    # step's trainer refuses a folder that holds a run).
    echo "$0: OUTDIR $1 is not an empty folder: give a new one" >&2
    exit 2
fi
if [ $rehearse = 1 ]; then device=${2:-@numpy}; else device=${2:-0}; fi
case $archive in
    ''|/*) ;;
    *) archive=$PWD/$archive ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
cd "$root" || exit 2
: > "$out/summary.txt"
export PYTHONUNBUFFERED=1

log() { echo "[gpu_check $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$out/summary.txt"; }

# Seconds for a step: its own limit ($1), cut to what the budget leaves
# once $2 seconds are kept for what follows; 0 when under 10 are left.
limit() {
    local want=$1 left=$((budget - SECONDS - ${2:-0}))
    [ "$left" -lt "$want" ] && want=$left
    if [ "$want" -ge 10 ]; then echo "$want"; else echo 0; fi
}

# Whether step $1 is skipped on purpose: its limit variable $2 is 0
# (recorded as not run, which does not fail the check).
skipped() {
    [ "${!2:-1}" = 0 ] || return 1
    record "$1" "not run: skipped ($2=0)"
}

# Whether a timing ($1) runs: not when skipped (its limit variable $4 is
# 0), nor, recorded as cut, when the budget leaves it under 10 s of its
# limit $2 once $3 are kept for what follows; its seconds in $t.
timed() {
    skipped "$1" "$4" && return 1
    t=$(limit "$2" "$3")
    [ "$t" != 0 ] && return 0
    record "$1" "cut: no time left in the budget"
    return 1
}

# Each step's outcome, for the verdict: a number (its exit status), or
# "not run: why" (skipped on purpose, or absent), or "cut: why" (out of
# time, which fails the check).
steps=()
outcomes=()
record() { steps+=("$1"); outcomes+=("$2"); log "$1: $(describe "$2")"; }
describe() {
    case $1 in
        0) echo "passed" ;;
        124) echo "FAILED (timed out, exit status 124)" ;;
        [0-9]*) echo "FAILED (exit status $1)" ;;
        *) echo "$1" ;;
    esac
}

bg_pids=()
finish() {
    local rc=$?
    trap - EXIT
    local pid
    for pid in "${bg_pids[@]}"; do kill "$pid" 2>/dev/null; done
    if [ -n "$archive" ]; then
        mkdir -p "$(dirname "$archive")" &&
            tar -C "$(dirname "$out")" -czf "$archive" "$(basename "$out")" &&
            for f in summary.txt floor.txt peers.md; do
                [ ! -f "$out/$f" ] || cp "$out/$f" "$(dirname "$archive")/"
            done &&
            echo "[gpu_check] $out archived in $archive"
    fi
    exit $rc
}
trap finish EXIT
trap 'log "interrupted"; exit 1' INT TERM

[ $rehearse = 1 ] && log "REHEARSAL on the CPU (device $device, tiny sizes): it checks this script, not the GPU; its numbers mean nothing"
log "budget ${budget} s; output in $out"

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
compat=${COMPAT:-$root/compat}
wheels=${WHEELS:-$root/.whl}
imports_chainer() { "$py" -c 'import chainer' >/dev/null 2>&1; }
if imports_chainer; then
    log "chainer imports as installed"
else
    if [ -f "$compat/sitecustomize.py" ]; then
        export PYTHONPATH="$compat:$PYTHONPATH"
        imports_chainer && log "chainer imports with $compat on PYTHONPATH"
    else
        log "no $compat/sitecustomize.py: Chainer 7.8.1 needs its shims on numpy 2"
    fi
    if ! imports_chainer; then
        site=${CHAINER_SITE:-/tmp/site}
        wheel=$(ls "$wheels"/chainer-*.whl 2>/dev/null | head -n 1)
        if [ -z "$wheel" ]; then
            log "chainer does not import with PYTHON=$py and there is no $wheels/chainer-*.whl"
            exit 1
        fi
        log "installing $(basename "$wheel") into $site"
        "$py" -m pip install -q --no-index --no-deps --upgrade --target "$site" \
            "$wheel" 2>&1 | tee -a "$out/summary.txt"
        export PYTHONPATH="$PYTHONPATH:$site"
        if ! why=$("$py" -c 'import chainer' 2>&1); then
            echo "$why" | tail -n 5 | tee -a "$out/summary.txt"
            log "chainer still does not import (PYTHONPATH=$PYTHONPATH)"
            exit 1
        fi
        log "chainer imports from $site$( [ ! -f "$compat/sitecustomize.py" ] ||
            echo ", with $compat on PYTHONPATH")"
    fi
fi
# CuPy 14 has no cupy.cuda.cudnn, and without cuDNN Chainer warns on first
# GPU use, which the test suite turns into an error; LARS uses no cuDNN.
export CHAINER_CUDNN=0

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
"$py" - > "$out/env.txt" 2>&1 <<'EOF'
import platform
import sys

import numpy

import chainer
from chainer.backends import cuda

print('python', sys.version.replace('\n', ' '))
print('platform', platform.platform())
print('numpy', numpy.__version__, 'chainer', chainer.__version__)
for name in ('numba', 'torch', 'timm'):
    try:
        module = __import__(name)
        print(name, module.__version__)
    except Exception as e:  # the steps that need it will say so too
        print(name, 'does not import:', e)
print('cuda.available', cuda.available)
if cuda.available:
    import cupy
    print('cupy', cupy.__version__)
    # CuPy imports without a GPU too; the gpu tests skip without a device.
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        count = 0
        print('no CUDA device:', e)
    print('cuda.devices', count)
    if count:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        print('device 0', props['name'])
        print('cuda runtime', cupy.cuda.runtime.runtimeGetVersion(),
              'driver', cupy.cuda.runtime.driverGetVersion())
EOF
env_rc=$?
cat "$out/env.txt"
if [ $env_rc -ne 0 ]; then
    log "the environment check failed (env.txt)"
    exit 1
fi
if [ $rehearse = 0 ] && ! grep -q '^cuda.devices [1-9]' "$out/env.txt"; then
    log "no CUDA device for Chainer here (env.txt): the gpu tests would only skip"
    exit 1
fi

# Started first, it runs on the CPU while the GPU works: a study trial
# repeated on this machine (same, within tolerance or differs).
mnist_root=${MNIST_ROOT:-$root/.whl/datasets}
have_mnist=0
[ -f "$mnist_root/pfnet/chainer/mnist/train.npz" ] && have_mnist=1
reproduce=${REPRODUCE-examples/mnist/study/mlp-bn/lars-b16384-t2.json}
repro_pid=
if [ -z "$reproduce" ]; then
    record "study --reproduce" "not run: REPRODUCE is empty"
elif [ $have_mnist = 0 ]; then
    record "study --reproduce" "not run: no MNIST under $mnist_root"
elif skipped "study --reproduce" REPRODUCE_TIMEOUT; then
    :
else
    repro_limit=$(limit "${REPRODUCE_TIMEOUT:-480}" 15)
    log "study --reproduce $reproduce, on the CPU, in the background (${repro_limit} s)"
    OPENBLAS_NUM_THREADS=1 timeout "$repro_limit" "$py" \
        examples/mnist/study.py --reproduce "$reproduce" --device -1 \
        --dataset-root "$mnist_root" > "$out/reproduce.txt" 2>&1 &
    repro_pid=$!
    bg_pids+=("$repro_pid")
fi

# What the side-by-side steps at the end need, kept from the timings:
# $reserve (above).

# 1. The timings, one at a time, alone on the GPU.
floor_args=(--device "$device" --json "$out/floor.json")
peers_args=(--device "$device" --json "$out/peers.json" --markdown "$out/peers.md")
bench_args=(--device "$device" --models resnet50 --dtypes float32 mixed16
            --weight-decays 5e-4 --reps 10 --case-seconds 3)
engine_args=(--device "$device" --dtype float32,mixed16 --iters 65)
mnist_args=(-b 512 -e 3)
if [ $rehearse = 1 ]; then
    # float16 on the CPU: a tiny model, 15 updates (MNIST_ARGS still wins)
    mnist_args=(-b 4096 -e 1 -u 8)
    floor_args+=(--sets tiny --repeat 3 --warmup 1 --copy-mib 4 --loop-iters 7 --loop-size 2,8,4)
    peers_args+=(--sets tiny --reps 2 --warmup 1 --copy-mib 4)
    bench_args=(--device "$device" --models mlp --dtypes float32 --weight-decays 5e-4 --reps 2 --warmup 1)
    engine_args=(--device "$device" --dtype float32,mixed16 --layers 2 --width 4 --batch 2 --iters 6 --variants momentum_sgd,lars)
fi

if timed "byte floors" "${FLOOR_TIMEOUT:-90}" $((reserve + 60)) FLOOR_TIMEOUT; then
    log "byte floors and the training loop (gpu_floor.py, ${t} s)"
    # shellcheck disable=SC2086  # FLOOR_ARGS is a list of arguments
    timeout "$t" "$py" benchmarks/gpu_floor.py "${floor_args[@]}" \
        ${FLOOR_ARGS:-} 2>&1 | tee "$out/floor.txt"
    record "byte floors" "${PIPESTATUS[0]}"
fi

# The update in a training loop, this tree against the library before the
# lighter engine (issue 45), when that tree is here: train_loop.py trains
# each variant with both in one process, interleaved, momentum_sgd the
# control (two processes drift apart on a GPU more than the versions do).
before=${BEFORE-$wheels/before}
if [ -z "$before" ]; then
    record "engine before/after" "not run: BEFORE is empty"
elif [ ! -f "$before/chainer_lars/__init__.py" ]; then
    record "engine before/after" "not run: no $before/chainer_lars"
elif timed "engine before/after" "${ENGINE_TIMEOUT:-120}" "$reserve" ENGINE_TIMEOUT; then
    log "engine before/after in a training loop (train_loop.py --other $before, one process, ${t} s)"
    # shellcheck disable=SC2086  # ENGINE_ARGS is a list of arguments
    timeout "$t" "$py" benchmarks/train_loop.py --other "$before" \
        "${engine_args[@]}" --json "$out/engine.json" ${ENGINE_ARGS:-} \
        > "$out/engine.txt" 2> "$out/engine.log"
    rc=$?
    cat "$out/engine.txt"
    record "engine before/after" "$rc"
fi

if timed "peers" "${PEERS_TIMEOUT:-150}" "$reserve" PEERS_TIMEOUT; then
    log "peers (gpu_peers.py, ${t} s)"
    # Its two processes share --timeout (each writes peers.md and
    # peers.json as it ends); the rest is for the parent's start and end.
    # shellcheck disable=SC2086  # PEERS_ARGS is a list of arguments
    timeout "$t" "$py" benchmarks/gpu_peers.py "${peers_args[@]}" \
        --timeout $((t * 9 / 10)) ${PEERS_ARGS:-} 2>&1 | tee "$out/peers.txt"
    record "peers" "${PIPESTATUS[0]}"
fi

if [ "${BENCH:-1}" = 0 ]; then
    record "bench_lars.py" "not run: BENCH=0"
elif timed "bench_lars.py" "${BENCH_TIMEOUT:-60}" "$reserve" BENCH_TIMEOUT; then
    log "bench_lars.py (${t} s)"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    timeout "$t" "$py" benchmarks/bench_lars.py "${bench_args[@]}" \
        --json "$out/bench_gpu.json" ${BENCH_ARGS:-} 2>&1 |
        tee "$out/bench_gpu.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ] && grep -q ' failed: ' "$out/bench_gpu.txt"; then
        log "some benchmark variants failed (bench_gpu.txt)"
        rc=1
    fi
    record "bench_lars.py" "$rc"
    if [ -f "$out/bench_gpu.json" ]; then
        log "bench_lars.py against the paper model (paper_model.txt)"
        "$py" benchmarks/paper_model.py "$out/bench_gpu.json" \
            > "$out/paper_model.txt" 2>&1
        record "paper_model.py" "$?"
    else
        record "paper_model.py" "not run: bench_lars.py wrote no bench_gpu.json"
    fi
fi

# 2. Side by side: the tests, the sanitizer and MNIST.
end=$((budget - 10))
cap() {  # $1 cut to what is left before $end
    local left=$((end - SECONDS))
    if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}
sanitizer=$(command -v compute-sanitizer ||
    ls /usr/local/cuda*/bin/compute-sanitizer \
       /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -n 1)
mnist_dtypes=${MNIST_DTYPES:-mixed16}
# Whether a side-by-side step cannot run here, whatever the time: no
# compute-sanitizer ($1 sanitizer) or no MNIST ($1 MNIST), or skipped on
# purpose; recorded as not run, which does not fail the check.
not_runnable() {
    case $1 in
        sanitizer)
            if [ -z "${SANITIZE-1}" ]; then
                record "compute-sanitizer" "not run: SANITIZE is empty"
            elif [ -z "$sanitizer" ]; then
                record "compute-sanitizer" "not run: compute-sanitizer not found"
            else
                skipped "compute-sanitizer" SANITIZE_TIMEOUT
            fi ;;
        MNIST)
            if [ $have_mnist = 0 ]; then
                record "MNIST" "not run: no MNIST under $mnist_root"
            else
                skipped "MNIST" TRAIN_TIMEOUT
            fi ;;
    esac
}
if [ $((end - SECONDS)) -lt 20 ]; then
    skipped "gpu tests" TEST_TIMEOUT ||
        record "gpu tests" "cut: no time left in the budget"
    not_runnable sanitizer ||
        record "compute-sanitizer" "cut: no time left in the budget"
    if ! not_runnable MNIST; then
        for dtype in $mnist_dtypes; do
            record "MNIST $dtype" "cut: no time left in the budget"
        done
    fi
else
    log "gpu tests, compute-sanitizer and MNIST, side by side ($((end - SECONDS)) s left)"
    tests_pid=
    if ! skipped "gpu tests" TEST_TIMEOUT; then
        timeout "$(cap "${TEST_TIMEOUT:-150}")" "$py" -m pytest -m gpu -q -rs \
            -p no:cacheprovider --junitxml="$out/pytest_gpu.xml" tests \
            > "$out/pytest_gpu.txt" 2>&1 &
        tests_pid=$!
        bg_pids+=("$tests_pid")
    fi

    # memcheck (a read or write outside an array) on the tests at the
    # sizes around a block's threads and chunk, strided, the mixed16 row
    # and batched update, zero weights and a skipped update; racecheck and
    # synccheck (the reductions' shared memory and barriers) on fewer.
    # CuPy's pool is off (tests/conftest.py), so each array is its own
    # allocation. On the H100 (measured/gpu_h100_check.txt) memcheck took
    # 92 s over 41 tests and racecheck 30 s over 12, beside the gpu tests
    # and MNIST: the selections are about half of those, and the three
    # tools share SANITIZE_TIMEOUT (default: all the side-by-side steps
    # have) 60:25:15 in turn, what one leaves going to the next. Each
    # tool's outcome (passed, errors found, tests failed, checked
    # nothing, or cut for time) is a line of sanitize.status.
    sanitize_pid=
    if ! not_runnable sanitizer; then
        : > "$out/sanitize.status"
        (
            rc=0
            cut=0
            san_end=$((SECONDS + $(cap "${SANITIZE_TIMEOUT:-$end}")))
            weights=100
            for check in \
                "memcheck|60|cuda and (every_size or (strided and float32) or strided_float16 or zero_weight or skipped_update or (mixed16_batched and dynamic))" \
                "racecheck|25|cuda and ((every_size and float32) or (mixed16_batched and dynamic))" \
                "synccheck|15|cuda and every_size and float32"; do
                tool=${check%%|*}
                rest=${check#*|}
                weight=${rest%%|*}
                left=$(cap $((san_end - SECONDS)))
                t=$((left * weight / weights))
                weights=$((weights - weight))
                if [ "$t" -lt 10 ]; then
                    echo "$tool: cut: no time left (${left} s for it and the tools after it)" >> "$out/sanitize.status"
                    cut=1
                    continue
                fi
                CHAINER_LARS_NO_MEMORY_POOL=1 timeout "$t" \
                    "$sanitizer" --tool "$tool" --error-exitcode 99 \
                    "$py" -m pytest -m gpu -q -p no:cacheprovider \
                    tests/test_gpu.py -k "${rest#*|}" \
                    > "$out/sanitize_$tool.txt" 2>&1
                r=$?
                case $r in
                    0) what=passed
                       # A run whose tests all skipped checked nothing.
                       grep -q ' passed' "$out/sanitize_$tool.txt" ||
                           { what="FAILED: checked nothing (no test passed)"; r=1; } ;;
                    124) what="cut: not done within its ${t} s"; cut=1 ;;
                    99) what="FAILED: the sanitizer reported errors" ;;
                    *) what="FAILED: exit status $r" ;;
                esac
                echo "$tool: $what; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY| passed| failed| skipped' "$out/sanitize_$tool.txt" | tr '\n' ' ')(exit status $r, limit ${t} s)" >> "$out/sanitize.status"
                case $r in 0|124) ;; *) rc=$r ;; esac
            done
            # A tool that failed outranks one cut for time.
            [ "$rc" = 0 ] && [ $cut = 1 ] && rc=124
            exit $rc
        ) &
        sanitize_pid=$!
        bg_pids+=("$sanitize_pid")
    fi

    mnist_pids=()
    mnist_run=0
    if ! not_runnable MNIST; then
        mnist_run=1
        for dtype in $mnist_dtypes; do
            # shellcheck disable=SC2086  # MNIST_ARGS is a list of arguments
            timeout "$(cap "${TRAIN_TIMEOUT:-90}")" "$py" \
                examples/mnist/train_mnist.py --device "$device" \
                --dtype "$dtype" "${mnist_args[@]}" --dataset-root "$mnist_root" \
                --out "$out/mnist_$dtype" --snapshots 0 ${MNIST_ARGS:-} \
                > "$out/mnist_$dtype.txt" 2>&1 &
            mnist_pids+=($!)
            bg_pids+=($!)
        done
    fi

    if [ -n "$tests_pid" ]; then
        wait "$tests_pid"
        rc=$?
        log "gpu tests: $(tail -n 1 "$out/pytest_gpu.txt")"
        if [ $rehearse = 0 ] && grep '^SKIPPED' "$out/pytest_gpu.txt" |
                grep -qv 'counted by the emulator'; then
            # The tests that count transfers on the emulated device skip on a
            # GPU by design; any other skip is worth a look.
            log "some gpu tests were skipped on a machine with a GPU (pytest_gpu.txt)"
        fi
        record "gpu tests" "$rc"
    fi

    if [ -n "$sanitize_pid" ]; then
        wait "$sanitize_pid"
        rc=$?
        while read -r line; do log "compute-sanitizer $line"; done \
            < "$out/sanitize.status"
        if [ "$rc" = 124 ]; then
            record "compute-sanitizer" "cut: a tool was not done in its time (sanitize.status)"
        else
            record "compute-sanitizer" "$rc"
        fi
    fi

    i=0
    for dtype in $( [ $mnist_run = 1 ] && echo "$mnist_dtypes"); do
        wait "${mnist_pids[$i]}"
        rc=$?
        i=$((i + 1))
        "$py" - "$out/mnist_$dtype/log" "$dtype" 2>&1 <<'EOF' |
import json
import sys

with open(sys.argv[1]) as f:
    last = json.load(f)[-1]
print('mnist {}: {} updates, test accuracy {:.2%}, elapsed_time {:.1f} s, '
      'loss scale {}, skipped updates {}'.format(
          sys.argv[2], last['iteration'], last['test/main/accuracy'],
          last['elapsed_time'], last.get('loss_scale', '(none)'),
          last.get('skipped_updates', '(none)')))
EOF
            tee -a "$out/summary.txt"
        record "MNIST $dtype" "$rc"
    done
fi

if [ -n "$repro_pid" ]; then
    log "waiting for study --reproduce"
    wait "$repro_pid"
    rc=$?
    if [ "$rc" = 124 ]; then
        record "study --reproduce" "not run to the end: not done within ${repro_limit} s (not judged)"
    else
        log "study --reproduce $reproduce: $(tail -n 1 "$out/reproduce.txt")"
        record "study --reproduce" "$rc"
    fi
fi
bg_pids=()

# The verdict, after what matters most from the timings.
{
    echo
    echo "== byte floors (floor.txt)"
    # Its last table: the one printed at the end, with the targets.
    [ ! -f "$out/floor.txt" ] ||
        awk '/^device /{text=""} {text=text $0 "\n"} END{printf "%s", text}' \
            "$out/floor.txt"
    echo
    echo "== peers (peers.md)"
    cat "$out/peers.md" 2>/dev/null
    if [ -f "$out/engine.txt" ]; then
        echo
        echo "== engine before/after, training loop (engine.txt)"
        echo "other: $before$( [ ! -f "$before/COMMIT" ] ||
            echo " (commit $(head -c 12 "$before/COMMIT"))"); here: this" \
            "tree; momentum_sgd, Chainer's own update, is the control"
        cat "$out/engine.txt"
    fi
    echo
    echo "== steps"
} | tee -a "$out/summary.txt"
failed=()
not_run=()
for i in "${!steps[@]}"; do
    echo "  ${steps[$i]}: $(describe "${outcomes[$i]}")" | tee -a "$out/summary.txt"
    case ${outcomes[$i]} in
        0) ;;
        "not run"*) not_run+=("${steps[$i]}") ;;
        *) failed+=("${steps[$i]}") ;;
    esac
done
what="GPU check"
[ $rehearse = 1 ] && what="GPU check REHEARSAL (CPU)"
join() { local IFS=';'; echo "$*" | sed 's/;/, /g'; }
if [ ${#failed[@]} -eq 0 ]; then
    log "$what passed in ${SECONDS} s$( [ ${#not_run[@]} -eq 0 ] ||
        echo "; not run: $(join "${not_run[@]}")")"
    exit 0
fi
log "$what FAILED in ${SECONDS} s: $(join "${failed[@]}")"
exit 1
