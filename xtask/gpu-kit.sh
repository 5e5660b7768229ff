#!/usr/bin/env bash
# For a lent GPU machine that has no Rust toolchain: builds here, into target/gpu-kit/, the
# stripped release binaries that `xtask gpu-check --prebuilt` needs (the CLI and xtask with
# `cuda`, the GPU test binaries) and writes run.sh beside them:
#   xtask/gpu-kit.sh [EXPORT_DIR ...]     (here; the exports travel in the kit, compressed)
#   bash target/gpu-kit/run.sh            (there, from the repository root; carry target/gpu-kit)
# run.sh runs gpu-check (GPU tests, corpus models against the CPU under the default and the
# fused pipeline, bench cuda), then trains each export 30 steps on the GPU under both pipelines.
# Logs go to $OUT (the device tool's folder) or /tmp/gpu-kit-out.
set -euo pipefail
cd "$(dirname "$0")/.."
kit=target/gpu-kit
rm -rf "$kit"
mkdir -p "$kit"
cargo build --release -p tracepass-cli -p xtask --features tracepass-cli/cuda
cargo test --release -p tracepass-runtime --features cuda --no-run --message-format=json \
    --test cuda --test cuda_model_ops --test cuda_nvrtc >"$kit/build.json"
strip -o "$kit/tracepass" target/release/tracepass
strip -o "$kit/xtask" target/release/xtask
for exe in $(grep -o '"executable":"[^"]*"' "$kit/build.json" | cut -d'"' -f4); do
    name=$(basename "$exe")
    strip -o "$kit/${name%-*}" "$exe"
done
rm "$kit/build.json"
# compressed, so that the kit and an export fit the 64 MiB that travels to a lent machine
tar -C "$kit" -cf - tracepass xtask cuda cuda_model_ops cuda_nvrtc | xz -T2 -6 >"$kit/bin.tar.xz"
(cd "$kit" && rm tracepass xtask cuda cuda_model_ops cuda_nvrtc)
# the export package's models build nanoGPT from Thunder's copy of Karpathy's model.py (MIT),
# a file of torch alone: it travels (Thunder itself is not there), when this machine's
# TRACEPASS_PYTHON has Thunder
nanogpt=$("${TRACEPASS_PYTHON:-python3}" -c \
    'import importlib.util as u; print(u.find_spec("thunder.tests.nanogpt_model").origin)' 2>/dev/null || true)
if [ -f "$nanogpt" ]; then
    mkdir -p "$kit/py/thunder/tests"
    touch "$kit/py/thunder/__init__.py" "$kit/py/thunder/tests/__init__.py"
    cp "$nanogpt" "$kit/py/thunder/tests/nanogpt_model.py"
fi
# each export named on the command line: its traces and data, not its parameters (random
# floats do not compress, and the repository and kit must fit the 64 MiB that travels);
# run.sh makes them there from the model's own initialisation with PyTorch
for d in "$@"; do
    mkdir -p "$kit/exports/$(basename "$d")"
    cp "$d"/*.trace "$d"/export.json "$d"/data.safetensors "$kit/exports/$(basename "$d")/"
done
cat >"$kit/run.sh" <<'RUN'
#!/usr/bin/env bash
set -uo pipefail
kit=target/gpu-kit
out=${OUT:-/tmp/gpu-kit-out}
mkdir -p "$out"
nvidia-smi -L
nvidia-smi --query-gpu=driver_version,compute_cap,memory.total --format=csv,noheader
[ -x "$kit/xtask" ] || xz -dc "$kit/bin.tar.xz" | tar -C "$kit" -xf -
# cudarc opens libnvrtc.so, libcublas.so and libnccl.so (wheels ship libnccl.so.2 and
# libnvrtc.so.13 only): link each under its plain name and add the folders it lives in
libs=/tmp/gpu-kit-libs
mkdir -p "$libs"
dirs=""
for lib in nvrtc cublas nccl; do
    f=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /opt /usr/lib -name "lib$lib.so*" \
        -not -name "*.a" 2>/dev/null | head -1)
    if [ -n "$f" ]; then
        ln -sf "$f" "$libs/lib$lib.so"
        dirs="$dirs:$(dirname "$f")"
        echo "lib$lib: $f"
    else
        echo "lib$lib: not found"
    fi
done
export LD_LIBRARY_PATH="$libs$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PTXAS=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || true)
export PTXAS
timeout "${GPU_CHECK_SECONDS:-330}" "$kit/xtask" gpu-check --prebuilt "$kit" 2>&1 \
    | tee "$out/gpu-check.log"
echo "gpu-check exit: ${PIPESTATUS[0]}"
fused="remat,ddp(world_size=1),fuse-elementwise,sort-waits"
for d in "$kit"/exports/*/; do
    [ -f "$d/forward.trace" ] || continue
    # the parameters from the model's own initialisation, and PyTorch eager's steps/s on the
    # GPU with them: torch alone is needed there. The export subpackage is self-contained and
    # runs as a package of its own (`tracepass` itself needs its native module, not built
    # there).
    echo "### $d (PyTorch eager, cuda)"
    py=/tmp/gpu-kit-py
    mkdir -p "$py" && rm -rf "$py/tracepass_export" && cp -r python/tracepass/export "$py/tracepass_export"
    PYTHONPATH="$py:$PWD/$kit/py" timeout 120 python3 -m tracepass_export.bench_torch "$d" --ranks 1 \
        --device cuda --init-params --warmup 5 --steps 30 >"$out/$(basename "$d")-torch.log" 2>&1
    echo "exit $?"
    grep -v -i warn "$out/$(basename "$d")-torch.log" | tail -3
    for p in default fused; do
        args=(train --device cuda --model "$d" --steps 30 --metrics)
        [ "$p" = fused ] && args+=(--passes "$fused")
        echo "### $d ($p)"
        timeout 45 "$kit/tracepass" "${args[@]}" >"$out/$(basename "$d")-$p.log" 2>&1
        echo "exit $?"
        tail -25 "$out/$(basename "$d")-$p.log"
    done
done
RUN
chmod +x "$kit/run.sh" "$0"
du -sh "$kit"
