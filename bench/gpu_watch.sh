# gpu_watch.sh — sourced by bench/llamacpp_cuda.sh and bench/serving_gpu.sh: the GPU's memory
# in use at a run's peak, sampled by nvidia-smi every 250 ms while the run lasts (the machine
# runs nothing else). gpu_watch_start FILE before the run; gpu_watch_stop FILE prints the
# peak in bytes (nothing without nvidia-smi).
GPU_WATCH_PID=""
gpu_watch_start() {
    GPU_WATCH_PID=""
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 250 >"$1" 2>/dev/null &
    GPU_WATCH_PID=$!
}
gpu_watch_stop() {
    [ -n "$GPU_WATCH_PID" ] || return 0
    kill "$GPU_WATCH_PID" 2>/dev/null || true
    wait "$GPU_WATCH_PID" 2>/dev/null || true
    GPU_WATCH_PID=""
    awk '$1 ~ /^[0-9]+$/ && $1 > m {m = $1} END {if (m) printf "%.0f\n", m * 1048576}' "$1"
}
