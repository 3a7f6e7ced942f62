#!/bin/bash
# The GPU check: everything a GPU machine can tell that this project's CI cannot, in one run from the repository's
# root:   bash bench/gpu_check.sh          (on a machine with an NVIDIA GPU; at most about 10 minutes, each part cut
#                                           at its own limit)
#         bash bench/gpu_check.sh quick    (all of it small, on the CPU: to try the script before a GPU is at hand)
# Prints, and keeps under $OUT (default /tmp/gpu-check): the machine; bench/gpu_bench.py on resnet50 (fp32, tf32,
# bf16; CPU and device decoding, steady and whole); where --decode device's input stage spends its time
# (bench/device_profile.py); CUDA results against CPU results (bench/gpu_exact.py); stats and compare against
# extract --pool avg (bench/gather_bench.py); the test suite with the default device (CUDA there) under
# pytest-xdist, its failures listed. bench/gpu_decoders.py (each JPEG decoder alone) and bench/preprocess_bench.py
# (a decode worker's core) are run by hand where those figures are wanted. Wheels the machine lacks (PyAV, open_clip_torch...) may wait
# in $WHEELS (default bench/whl/): they are installed into /tmp/site first. nvImageCodec's wheel
# (nvidia-nvimgcodec-cu13, with nvidia-nvjpeg) may be cut to the Python that runs it (its other builds and codecs out)
# to fit a transfer limit.
set -u
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
WHEELS=${WHEELS:-bench/whl}
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl >/dev/null 2>&1 \
    || echo "the wheels in $WHEELS did not install"
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HOOKCLI_OFFLINE=1
export LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # nvJPEG's wheel, for nvImageCodec
{
  nvidia-smi -L 2>/dev/null
  echo "cores: $(nproc)"
  python3 -c "import sys, torch, torchvision; print('python', sys.version.split()[0], 'torch', torch.__version__,
'torchvision', torchvision.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
} 2>&1 | tee "$OUT/machine.txt"
if [ "${1:-}" = quick ]; then
  IMAGES=64 UNIQUE=32 JPEGS=32 BATCH=16 PHOTOS=4 GATHER=64 SUITE=60 DEVICE=cpu WORKERS=2 PRECISIONS=fp32,bf16
else
  IMAGES=8192 UNIQUE=2048 JPEGS=2048 BATCH=256 PHOTOS=16 GATHER=2048 SUITE=220 DEVICE=cuda WORKERS=16 PRECISIONS=fp32,tf32,bf16
fi
echo "=== bench/gpu_bench.py"
timeout 110 python3 bench/gpu_bench.py --models resnet50 --images $IMAGES --unique $UNIQUE --batch-size $BATCH --device $DEVICE \
  --precisions $PRECISIONS 2>&1 | tee "$OUT/gpu_bench.txt"
echo "=== bench/device_profile.py (--decode device)"
timeout 60 python3 bench/device_profile.py --images $JPEGS --batch-size $BATCH --device $DEVICE --repeat 4 --skip gather \
  --out "$OUT" 2>&1 | tee "$OUT/device_profile.txt"
echo "=== CUDA against CPU"
timeout 80 python3 bench/gpu_exact.py --device $DEVICE --photos $PHOTOS 2>&1 | tee "$OUT/exact.txt"
echo "=== stats and compare against extract --pool avg"
timeout 80 python3 bench/gather_bench.py --photos $GATHER --batch-size 128 --repeat 1 2>&1 | tee "$OUT/gather.txt"
echo "=== the suite, default device"
if python3 -c "import xdist" 2>/dev/null; then parallel="-n $WORKERS"; else parallel=""; fi
if python3 -c "import pytest_timeout" 2>/dev/null; then parallel="$parallel --timeout 100"; fi
# SIGINT at the limit: pytest stops and still lists the failures it has seen
timeout -s INT -k 10 $SUITE python3 -m pytest -q $parallel -p no:cacheprovider -p no:benchmark --tb=short -o addopts="-rfE" \
  --junitxml="$OUT/junit.xml" tests > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | cut -c1-200 | head -60
tail -1 "$OUT/pytest.txt"
