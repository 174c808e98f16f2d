#!/usr/bin/env bash
# README's by-hand numpy reader (scripts/read_checkpoint.py) reads what dtrain writes: the tensor
# table and metadata of a checkpoint, and one tensor's values. Skipped (77) without numpy.
set -euo pipefail
BIN=$1 SRC=$2
/usr/bin/python3 -c 'import numpy' 2>/dev/null || { echo "skip: python3-numpy is not installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$BIN" run "$SRC/configs/smoke.yaml" --set train.max_steps=5 --out "$dir/run" --log-level warn >/dev/null
file="$dir/run/checkpoints/$(cat "$dir/run/checkpoints/latest")"
out=$(/usr/bin/python3 "$SRC/scripts/read_checkpoint.py" "$file")
echo "$out"
grep -qP '^layers\.0\.weight\tfloat32\t\[64, 16\]$' <<<"$out"
grep -qP '^optim\.exp_avg_sq\.layers\.4\.bias\tfloat32\t\[4\]$' <<<"$out"
grep -qP '^__metadata__\.step\t5$' <<<"$out"
grep -qP '^__metadata__\.format\tdtrain-checkpoint$' <<<"$out"
vals=$(/usr/bin/python3 "$SRC/scripts/read_checkpoint.py" "$file" layers.4.bias)
echo "$vals"
grep -qE '^\[ *-?[0-9.e+-]+( +-?[0-9.e+-]+){3} *\]$' <<<"$vals"
# One flipped bit in the last tensor's data: the reader verifies dtrain's CRC-32 table, as
# dtrain's loads do, and refuses the file with exit 1.
cp "$file" "$dir/bad.safetensors"
size=$(stat -c %s "$dir/bad.safetensors")
/usr/bin/python3 - "$dir/bad.safetensors" $((size - 3)) <<'PY'
import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x10]))
PY
if bad=$(/usr/bin/python3 "$SRC/scripts/read_checkpoint.py" "$dir/bad.safetensors" 2>&1); then
  echo "a corrupt file was read: $bad"; exit 1
fi
echo "$bad"
grep -q "fails its CRC-32 check" <<<"$bad"
# The step in the header edited (same length): the header's own CRC-32 refuses it.
sed 's/"step":"5"/"step":"6"/' "$file" >"$dir/edited.safetensors"
cmp -s "$file" "$dir/edited.safetensors" && { echo "the edit did not apply"; exit 1; }
if bad=$(/usr/bin/python3 "$SRC/scripts/read_checkpoint.py" "$dir/edited.safetensors" 2>&1); then
  echo "an edited header was read: $bad"; exit 1
fi
grep -q "header fails its CRC-32 check" <<<"$bad"
# A folder is refused with the way out, not a traceback: a run's or checkpoints folder names its
# newest file, a sharded checkpoint (its manifest.json) the consolidation.
refused() {  # refused FOLDER TEXT: the reader fails on FOLDER, naming TEXT
  local out
  if out=$(/usr/bin/python3 "$SRC/scripts/read_checkpoint.py" "$1" 2>&1); then
    echo "a folder was read: $out"
    exit 1
  fi
  echo "$out"
  grep -qF "$2" <<<"$out"
}
refused "$dir/run" "is a folder, not a checkpoint file: read $file (the newest checkpoint"
refused "$dir/run/checkpoints" "is a folder, not a checkpoint file: read $file (the newest"
"$BIN" run "$SRC/configs/smoke.yaml" --set train.max_steps=2 --set distributed.world_size=2 \
  --set distributed.strategy=fsdp --out "$dir/sharded" --log-level warn >/dev/null
shards="$dir/sharded/checkpoints/$(cat "$dir/sharded/checkpoints/latest")"
refused "$dir/sharded" "run \`dtrain checkpoint consolidate $shards -o FILE.safetensors\`"
refused "$shards" "run \`dtrain checkpoint consolidate $shards -o FILE.safetensors\`"
# What is no checkpoint file is one line, not a traceback (a YAML file's first 8 bytes read as a
# header length of ~2e18 went to f.read unchecked: MemoryError).
refused "$SRC/configs/smoke.yaml" "is not a safetensors file (a header length of"
refused /dev/null "is not a safetensors file (0 bytes, shorter than the 8-byte header length)"
refused "$dir/none.safetensors" "cannot read '$dir/none.safetensors': No such file or directory"
head -c 1000 "$file" >"$dir/cut.safetensors"
refused "$dir/cut.safetensors" "is not a safetensors file (a header length of"
size=$(stat -c %s "$file")
head -c $((size - 8)) "$file" >"$dir/short.safetensors"
refused "$dir/short.safetensors" "(truncated?)"
if out=$(/usr/bin/python3 "$SRC/scripts/read_checkpoint.py" "$file" nosuch 2>&1); then
  echo "an unknown tensor was printed: $out"; exit 1
fi
grep -qF "has no tensor 'nosuch'; it has: layers.0.weight, " <<<"$out"
echo ok
