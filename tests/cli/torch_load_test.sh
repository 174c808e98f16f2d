#!/usr/bin/env bash
# dtrain's checkpoints are PyTorch's models (issue 13): scripts/torch_load.py loads each model
# kind's checkpoint into the PyTorch module of the same names with a strict load_state_dict, and
# PyTorch's test loss and accuracy on the same data equal `dtrain eval`'s (1e-7 relative: float32
# forward passes in two libraries). Models: an MLP with a preset, LayerNorm and dropout; a small
# CNN on Fashion-MNIST (conv with stride and padding, both pools) and a layer list without a
# conv; a tied GPT with default heads (keys config.json omits) and an untied one with 2 heads, on
# text with a held-out fraction and with a test file. Skipped (77) without python3-torch, or without Fashion-MNIST.
set -euo pipefail
BIN=$1 SRC=$2
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || { echo "skip: python3-torch is not installed"; exit 77; }
FM=/usr/share/datasets/fashion-mnist
[[ -r $FM/train-images-idx3-ubyte.gz ]] || { echo "skip: no Fashion-MNIST in $FM"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# compare NAME CONFIG [--set ...]: train 30 steps, then dtrain eval against torch_load.py --eval.
compare() {
  local name=$1 cfg=$2
  shift 2
  "$BIN" run "$cfg" "$@" --set train.max_steps=30 --out "$dir/$name" --log-level warn --no-progress >/dev/null
  local ckpt="$dir/$name/checkpoints/$(cat "$dir/$name/checkpoints/latest")"
  local ours theirs
  ours=$("$BIN" eval "$cfg" "$@" --checkpoint "$dir/$name" --log-level warn)
  theirs=$(/usr/bin/python3 "$SRC/scripts/torch_load.py" "$ckpt" --eval)
  same "$name" "$ours" "$theirs"
}

# same NAME OURS THEIRS: dtrain eval's and torch_load.py --eval's JSON agree.
same() {
  local name=$1 ours=$2 theirs=$3
  echo "$name: dtrain $ours"
  echo "$name: torch  $theirs"
  /usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rel = abs(a["test_loss"] - b["test_loss"]) / abs(b["test_loss"])
assert rel < 1e-7, f"test_loss differs: {rel:.3g} relative"
assert abs(a["test_accuracy"] - b["test_accuracy"]) < 1e-9, "test_accuracy differs"
print(f"  equal: test_loss {rel:.2g} relative, test_accuracy {a['test_accuracy']}")
PY
}

# Fashion-MNIST, SGD with momentum, 1 thread: the two image models' common part.
FMDATA="data:
  format: idx
  train: {images: $FM/train-images-idx3-ubyte.gz, labels: $FM/train-labels-idx1-ubyte.gz}
  test: {images: $FM/t10k-images-idx3-ubyte.gz, labels: $FM/t10k-labels-idx1-ubyte.gz}
  batch_size: 64
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
runtime: {threads: 1}"

cat >"$dir/mlp.yaml" <<EOF
seed: 5
model: {complexity: simple, layer_norm: true, dropout: 0.1, activation: gelu}
$FMDATA
EOF
compare mlp "$dir/mlp.yaml"

cat >"$dir/cnn.yaml" <<EOF
seed: 6
model:
  type: sequential
  layers:
    - {conv2d: {out_channels: 4, kernel: 3, padding: 1}}
    - relu
    - {max_pool2d: 2}
    - {conv2d: {out_channels: 6, kernel: 3, stride: 2, padding: 1}}
    - tanh
    - {avg_pool2d: {kernel: 3, stride: 2}}
    - flatten
    - {dropout: 0.2}
    - {linear: 16}
    - layer_norm
    - sigmoid
    - {linear: 10}
$FMDATA
EOF
compare cnn "$dir/cnn.yaml"

# A layer list on images without a conv2d: the input is still [1, 28, 28] (the script took the
# first Linear's width for it: a strict load failed, or the pool saw flat rows).
cat >"$dir/pool.yaml" <<EOF
seed: 8
model:
  type: sequential
  layers: [layer_norm, {max_pool2d: 2}, flatten, {linear: 16}, relu, {linear: 10}]
$FMDATA
EOF
compare pool "$dir/pool.yaml"

# Text: 40 KB of varied English-like lines, and a separate test file.
/usr/bin/python3 - "$dir" <<'PY'
import random, sys
r = random.Random(7)
words = "the a hacker kludge byte frob grok cruft wizard daemon kernel hack bogus hairy".split()
for name, n in (("train.txt", 4000), ("test.txt", 400)):
    with open(f"{sys.argv[1]}/{name}", "w") as f:
        for _ in range(n // 10):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(3, 9))) + ".\n")
PY
cat >"$dir/gpt.yaml" <<EOF
seed: 8
model: {type: gpt, n_layer: 2, n_embd: 16, block_size: 16}
data: {format: text, train: {path: $dir/train.txt}, test_fraction: 0.15, batch_size: 8}
optimizer: {type: adamw, lr: 1.0e-2, weight_decay: 0.1, weight_decay_on: matrices}
runtime: {threads: 1}
EOF
compare gpt_tied "$dir/gpt.yaml"
sed -e "s|test_fraction: 0.15|test: {path: $dir/test.txt}|" "$dir/gpt.yaml" >"$dir/gpt_test_file.yaml"
compare gpt_untied "$dir/gpt_test_file.yaml" --set model.tie_embeddings=false --set model.n_head=2 \
  --set model.dropout=0.1
# The default test_fraction (config.json records -1: "the format's default", 0.1 for text).
sed -e "s|, test_fraction: 0.15||" "$dir/gpt.yaml" >"$dir/gpt_default_split.yaml"
compare gpt_default_split "$dir/gpt_default_split.yaml"
# A list naming a file twice (again through a glob) and a glob matching a folder: dtrain reads the
# file once and leaves the folder out, and so does --eval (it read the file twice, or crashed).
mkdir -p "$dir/corpus/sub"
cp "$dir/train.txt" "$dir/corpus/a.txt"
cp "$dir/test.txt" "$dir/corpus/b.txt"
sed -e "s|path: $dir/train.txt|path: [$dir/corpus/a.txt, \"$dir/corpus/*\"]|" "$dir/gpt.yaml" \
  >"$dir/gpt_glob.yaml"
compare gpt_glob "$dir/gpt_glob.yaml"

# A sharded checkpoint (fsdp on 2 ranks, the tied GPT): its folder and a shard are refused with the
# way out, its consolidation loads and evaluates as `dtrain eval` of the folder does.
"$BIN" run "$dir/gpt.yaml" --set distributed.world_size=2 --set distributed.strategy=fsdp \
  --set train.max_steps=10 --out "$dir/fsdp" --log-level warn --no-progress >/dev/null
shards="$dir/fsdp/checkpoints/$(cat "$dir/fsdp/checkpoints/latest")"
for p in "$shards" "$shards/rank-0.safetensors"; do
  if msg=$(/usr/bin/python3 "$SRC/scripts/torch_load.py" "$p" 2>&1); then
    echo "a shard was loaded: $msg"
    exit 1
  fi
  echo "$msg"
  grep -q "^error: .*run \`dtrain checkpoint consolidate $shards -o FILE.safetensors\`" <<<"$msg"
done
"$BIN" checkpoint consolidate "$dir/fsdp" -o "$dir/fsdp.safetensors" >/dev/null
same gpt_fsdp "$("$BIN" eval "$dir/gpt.yaml" --checkpoint "$dir/fsdp" --log-level warn)" \
  "$(/usr/bin/python3 "$SRC/scripts/torch_load.py" "$dir/fsdp.safetensors" --eval)"

# A checkpoint without a test split: --eval says so, as dtrain eval does (it was a traceback).
"$BIN" run "$dir/gpt.yaml" --set data.test_fraction=0 --set train.max_steps=2 --out "$dir/notest" \
  --log-level warn --no-progress >/dev/null
if msg=$(/usr/bin/python3 "$SRC/scripts/torch_load.py" "$dir/notest/checkpoints/step-2.safetensors" \
  --eval 2>&1); then
  echo "evaluated without a test set: $msg"
  exit 1
fi
echo "$msg"
grep -q "^--eval: no test set to evaluate" <<<"$msg"

# The listing names every tensor and says the load was strict.
out=$(/usr/bin/python3 "$SRC/scripts/torch_load.py" "$dir/gpt_untied/checkpoints/$(cat "$dir/gpt_untied/checkpoints/latest")")
grep -qP '^lm_head\.weight\t\[256, 16\]$' <<<"$out"
grep -qP '^transformer\.h\.1\.attn\.c_attn\.weight\t\[48, 16\]$' <<<"$out"
grep -q '^loaded strictly into GPT' <<<"$out"
echo ok
