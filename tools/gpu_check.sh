#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with CUDA, CuPy and PyTorch (docs/gpu.md): build the
# kernels, run the CuPy backend's tests (marker gpu), then the MNIST epoch bench with ggopt on
# its CuPy backend beside PyTorch on CUDA. Logs and the bench's JSON go to $OUT (default
# ./gpu-check). Usage: bash tools/gpu_check.sh [MNIST_DIR]
set -u -o pipefail
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
MNIST=${1:-${GGOPT_BENCH_MNIST:-}}
nvidia-smi -L 2>&1 | tee "$OUT/gpu.txt"
python3 -c "import sys, numpy, cupy, torch; print(sys.version.split()[0], 'numpy', numpy.__version__,
'cupy', cupy.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
    2>&1 | tee -a "$OUT/gpu.txt"
start=$(date +%s)
python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
timeout 240 python3 -m pytest -m gpu tests/backend/test_cupy.py -q -p no:cacheprovider \
    -o addopts="" -rf 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
if [ -n "$MNIST" ]; then
    for arch in fc cnn; do
        GGOPT_BENCH_DEVICE=cuda GGOPT_BENCH_MNIST="$MNIST" timeout 150 python3 -m pytest \
            "bench/bench_mnist.py::test_mnist_epoch" -k "$arch" -q -p no:cacheprovider \
            -o addopts="" --benchmark-json="$OUT/mnist_$arch.json" \
            --benchmark-columns=min,median,max 2>&1 | tee "$OUT/mnist_$arch.log" | tail -25
    done
fi
