# Shell helpers for the benchmark scripts (sourced, not run): a summary.json field, the last JSON
# line of `dtrain bench gemm`, the OpenBLAS kernels dtrain runs, and the header line every
# benchmark prints first (date, cores, load, kernels). Expects BIN (the dtrain binary).

# summary_field FILE KEY: one key of a summary.json.
summary_field() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# last_json KEY: KEY of the last line on stdin, a JSON object (dtrain bench gemm's).
last_json() {
  python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])[sys.argv[1]])' "$1"
}

# The OpenBLAS kernel set dtrain runs here ("SkylakeX", "Haswell", ...): the peers get the same
# through OPENBLAS_CORETYPE, as Debian's PyTorch loads the same OpenBLAS (README "Benchmarks").
blas_core() {
  "$BIN" bench gemm --iters 3 | last_json blas_core
}

# bench_header WHAT: "<UTC time> <cores> cores, load <1 5 15 min>, OpenBLAS kernels <core>, WHAT".
bench_header() {
  echo "$(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OpenBLAS kernels" \
    "$(blas_core), $1"
}

# have_torch: whether Debian's python3 has PyTorch (the peers need it).
have_torch() {
  /usr/bin/python3 -c 'import torch' 2>/dev/null
}
