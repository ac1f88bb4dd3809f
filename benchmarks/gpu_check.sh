#!/usr/bin/env bash
# The GPU check of chainer-lars: the `gpu` tests, the GPU benchmark, the
# MNIST example trained in mixed16 and float32 (352 updates each) and
# compute-sanitizer over the kernels' tests, in about 5 minutes (294 s on
# an H200), with everything they print kept in OUTDIR.
#
#   benchmarks/gpu_check.sh OUTDIR [DEVICE]        (DEVICE: 0, @cupy:0, ...)
#
# Works on a machine where chainer and cupy are installed, and on one whose
# Python has CuPy but no Chainer (the lent device machine: Python 3.12,
# numpy 2, CuPy 14): there it installs the Chainer wheel carried in .whl/
# into $CHAINER_SITE (default /tmp/site) and puts .whl/ (which must hold a
# copy of shared/gpu/sitecustomize.py, the numpy-2 shims Chainer needs at
# import) and that folder on PYTHONPATH. Building the wheel, in the repo
# root, on a machine with a registry:
#
#   mkdir -p .whl && cp ../shared/gpu/sitecustomize.py .whl/
#   printf 'setuptools<81\n' > /tmp/bc.txt
#   PIP_CONSTRAINT=/tmp/bc.txt PIP_BUILD_CONSTRAINT=/tmp/bc.txt \
#     pip wheel --no-deps -w .whl chainer==7.8.1
#
# The MNIST runs read Chainer's MNIST cache under MNIST_ROOT (default
# .whl/datasets, carried with the wheel: mkdir -p .whl/datasets && cp -r
# ../shared/datasets/pfnet .whl/datasets/, 11 MB); without it they are
# skipped, and the summary says so.
#
# Environment: PYTHON (default python3), CHAINER_SITE, TEST_TIMEOUT (120 s),
# BENCH_TIMEOUT (240 s), BENCH_ARGS (extra arguments for bench_lars.py),
# MNIST_ROOT, TRAIN_TIMEOUT (120 s a run), MNIST_ARGS (extra flags for
# train_mnist.py; on a CPU, where float16 has no BLAS: MNIST_ARGS='-u 50
# -e 1' TRAIN_TIMEOUT=900).
# With MNIST there, beside the GPU work, on the CPU with one BLAS thread:
# examples/mnist/study.py --reproduce of REPRODUCE (default the BatchNorm
# model's best LARS trial at 16384), the study's check of a trial on
# another machine (REPRODUCE_TIMEOUT, default 480 s; REPRODUCE= skips it).
# After the MNIST runs, compute-sanitizer (memcheck, racecheck, synccheck)
# runs a part of tests/test_gpu.py (SANITIZE_TIMEOUT, default 150 s a tool;
# SANITIZE= skips it).
# After the benchmark, benchmarks/paper_model.py prints each variant's
# measured time as a fraction of the H200 paper model (paper_model.txt).
# Exit status: 0 when CUDA was available and the tests, the benchmark and
# the MNIST runs passed, else 1 (see OUTDIR/summary.txt).

set -u -o pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 OUTDIR [DEVICE]" >&2
    exit 2
fi
out=$1
device=${2:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root" || exit 2

log() { echo "[gpu_check $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$out/summary.txt"; }

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c 'import chainer' >/dev/null 2>&1; then
    site=${CHAINER_SITE:-/tmp/site}
    wheel=$(ls "$root"/.whl/chainer-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        log "chainer is not importable and there is no .whl/chainer-*.whl"
        exit 1
    fi
    [ -f "$root/.whl/sitecustomize.py" ] ||
        log "warning: no .whl/sitecustomize.py; Chainer 7.8.1 needs it on numpy 2"
    log "installing $(basename "$wheel") into $site"
    "$py" -m pip install -q --no-index --no-deps --target "$site" "$wheel" \
        2>&1 | tee -a "$out/summary.txt"
    export PYTHONPATH="$root/.whl:$site:$PYTHONPATH"
    if ! "$py" -c 'import chainer' 2>&1 | tee -a "$out/summary.txt"; then
        log "chainer still does not import from $site"
        exit 1
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
try:
    import numba
    print('numba', numba.__version__)
except Exception as e:  # chainer_lars needs it: the tests will say so too
    print('numba does not import:', e)
print('cuda.available', cuda.available)
if cuda.available:
    import cupy
    # CuPy imports without a GPU too; the gpu tests skip without a device.
    print('cuda.devices', cupy.cuda.runtime.getDeviceCount())
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print('cupy', cupy.__version__, 'device 0', props['name'])
    print('cuda runtime', cupy.cuda.runtime.runtimeGetVersion(),
          'driver', cupy.cuda.runtime.driverGetVersion())
EOF
env_rc=$?
cat "$out/env.txt"
if [ $env_rc -ne 0 ] || ! grep -q '^cuda.devices [1-9]' "$out/env.txt"; then
    log "no CUDA device for Chainer here (see env.txt); the gpu tests would only skip"
    exit 1
fi

# Started first, it runs on the CPU while the GPU works: a study trial
# repeated on this machine (same, within tolerance or differs).
mnist_root=${MNIST_ROOT:-$root/.whl/datasets}
reproduce=${REPRODUCE-examples/mnist/study/mlp-bn/lars-b16384-t2.json}
repro_pid=
if [ -n "$reproduce" ] && [ -f "$mnist_root/pfnet/chainer/mnist/train.npz" ]; then
    log "study --reproduce $reproduce, on the CPU, in the background"
    OPENBLAS_NUM_THREADS=1 timeout "${REPRODUCE_TIMEOUT:-480}" "$py" \
        examples/mnist/study.py --reproduce "$reproduce" --device -1 \
        --dataset-root "$mnist_root" > "$out/reproduce.txt" 2>&1 &
    repro_pid=$!
fi

log "gpu tests"
timeout "${TEST_TIMEOUT:-120}" "$py" -m pytest -m gpu -q -rs \
    -p no:cacheprovider --junitxml="$out/pytest_gpu.xml" tests \
    2>&1 | tee "$out/pytest_gpu.txt"
tests_rc=${PIPESTATUS[0]}
log "gpu tests exit status $tests_rc"
# The tests that count transfers on the emulated device skip on a GPU by
# design ("counted by the emulator"); any other skip is worth a look.
if grep '^SKIPPED' "$out/pytest_gpu.txt" | grep -qv 'counted by the emulator'; then
    log "some gpu tests were skipped on a machine with a GPU (see pytest_gpu.txt)"
fi

log "benchmark on device $device"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
# float32 and mixed16 (float16 weights with float32 masters, the way large
# batches are trained on GPUs): the mixed16 LARS update against float32's.
timeout "${BENCH_TIMEOUT:-240}" "$py" benchmarks/bench_lars.py \
    --device "$device" --reps 20 --case-seconds 8 --dtypes float32 mixed16 \
    --json "$out/bench_gpu.json" \
    ${BENCH_ARGS:-} 2>&1 | tee "$out/bench_gpu.txt"
bench_rc=${PIPESTATUS[0]}
if grep -q ' failed: ' "$out/bench_gpu.txt"; then
    log "some benchmark variants failed (see bench_gpu.txt)"
    [ $bench_rc -eq 0 ] && bench_rc=1
fi
log "benchmark exit status $bench_rc"
if [ -f "$out/bench_gpu.json" ]; then
    "$py" benchmarks/paper_model.py "$out/bench_gpu.json" 2>&1 |
        tee "$out/paper_model.txt"
    log "fractions of the paper model: paper_model.txt"
fi

# The MNIST example, 3 epochs of batch 512 (352 updates): the test
# accuracy, the time, and what the loss scaler did, from each run's log.
train_rc=0
if [ ! -f "$mnist_root/pfnet/chainer/mnist/train.npz" ]; then
    log "no MNIST under $mnist_root: the MNIST runs are skipped"
else
    for dtype in mixed16 float32; do
        log "MNIST example, --dtype $dtype, on device $device"
        # shellcheck disable=SC2086  # MNIST_ARGS is a list of arguments
        timeout "${TRAIN_TIMEOUT:-120}" "$py" examples/mnist/train_mnist.py \
            --device "$device" --dtype "$dtype" -b 512 -e 3 \
            --dataset-root "$mnist_root" --out "$out/mnist_$dtype" \
            --snapshots 0 ${MNIST_ARGS:-} > "$out/mnist_$dtype.txt" 2>&1
        rc=$?
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
        log "MNIST --dtype $dtype exit status $rc (output: mnist_$dtype.txt)"
        [ "$rc" -eq 0 ] || train_rc=$rc
    done
fi

# compute-sanitizer over the kernels' tests, while the reproduce runs on:
# memcheck (a read or write outside an array) on the tests at the sizes
# around a block's threads and chunk, strided and mixed16; racecheck and
# synccheck (the reductions' shared memory and barriers) on a few. CuPy's
# pool is off (tests/conftest.py), so each array is its own allocation.
sanitize_rc=0
sanitizer=$(command -v compute-sanitizer ||
    ls /usr/local/cuda*/bin/compute-sanitizer \
       /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -n 1)
if [ -z "${SANITIZE-1}" ]; then
    log "compute-sanitizer: skipped (SANITIZE=)"
elif [ -z "$sanitizer" ]; then
    log "compute-sanitizer: not found; the kernels' memory checks are not run"
else
    for check in \
        "memcheck|cuda and (every_size or strided or mixed16 or zero_weight or fp32_update or skipped_update)" \
        "racecheck|cuda and ((every_size and float32) or mixed16_batched)" \
        "synccheck|cuda and every_size and float32"; do
        tool=${check%%|*}
        log "compute-sanitizer --tool $tool on: ${check#*|}"
        CHAINER_LARS_NO_MEMORY_POOL=1 timeout "${SANITIZE_TIMEOUT:-150}" \
            "$sanitizer" --tool "$tool" --error-exitcode 99 \
            "$py" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py \
            -k "${check#*|}" > "$out/sanitize_$tool.txt" 2>&1
        rc=$?
        # A run whose tests all skipped checked nothing.
        grep -q ' passed' "$out/sanitize_$tool.txt" || [ "$rc" -ne 0 ] || rc=1
        log "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY| passed| failed| skipped' "$out/sanitize_$tool.txt" | tr '\n' ' ') (exit status $rc; sanitize_$tool.txt)"
        [ "$rc" -eq 0 ] || sanitize_rc=$rc
    done
fi

repro_rc=0
if [ -n "$repro_pid" ]; then
    log "waiting for study --reproduce"
    wait "$repro_pid"
    repro_rc=$?
    log "study --reproduce $reproduce: $(tail -n 1 "$out/reproduce.txt") (exit status $repro_rc; reproduce.txt)"
fi

if [ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ $train_rc -eq 0 ] &&
        [ $sanitize_rc -eq 0 ] && [ $repro_rc -eq 0 ]; then
    log "GPU check passed"
    exit 0
fi
log "GPU check FAILED (tests $tests_rc, benchmark $bench_rc, MNIST $train_rc, sanitizer $sanitize_rc, reproduce $repro_rc)"
exit 1
