#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: what a user's `generate` gives on a 7B
# checkpoint from files. A llama2-7b of LAYERS layers (32) written by `ptqkit synth` into
# /dev/shm, exported as GPTQ W4A16, GGUF Q4_K_M (both RTN) and bitsandbytes NF4, then
# `generate --prompt-ids 1,2,3 --max-tokens 256 --ignore-eos --device cuda` of each and of the
# f16 original, twice: the load (PTQKIT_LOAD_PROFILE=1 says where it went) and tok/s. The
# benchmark page's "What `generate` gives on a 7B checkpoint, and how long it loads".
set -euo pipefail
source "$(dirname "$0")/device-env.sh"
P=.device/bin/ptqkit
M=/dev/shm/l7b
/usr/bin/time -f "synth: %e s" $P -q synth --preset llama2-7b --layers "${LAYERS:-32}" --output $M --force
q() {   # name, then quantize's arguments
  local name=$1; shift
  /usr/bin/time -f "export $name: %e s" $P -q quantize --model $M --dataset random --set calibration.samples=4 \
    --set calibration.seq_len=128 -o "$M-$name" --force "$@"
  du -sh "$M-$name" | cut -f1 | sed "s/^/  $name on disk: /"
}
q gptq --scheme W4A16 --format gptq --set quantization.method=rtn
q q4km --scheme Q4_K_M --set quantization.method=rtn
q nf4 --scheme NF4
for m in "" -gptq -q4km -nf4; do
  for i in 1 2; do
    name=f16$m
    PTQKIT_LOAD_PROFILE=1 $P generate --model "$M$m" --prompt-ids 1,2,3 --max-tokens 256 --ignore-eos --device cuda \
      --json "$out/generate-$name-$i.json" > /dev/null 2> "$out/generate-$name-$i.log"
    echo "$name #$i: $(grep -E 'generated in|load' "$out/generate-$name-$i.log" | tr '\n' ' ')"
  done
done
rm -rf $M $M-gptq $M-q4km $M-nf4
