#!/bin/bash
# session 19: W4A8 (all activation blocks INT8) per block, and per token with progressive weights
cd /tmp/acc
Q="build/comet quantize --model models/SmolLM2-135M-Instruct.Q4_1.gguf --calib data/mobydick.txt --calib-windows 128 --calib-cache models/acc/calib128.bin --tau 2"
P="--text data/austen/prideprejudice.txt --ctx 2048 --max-windows 4"
for kv in 16 4; do
  out=models/acc128/w4a8kv${kv}_gptq_block
  $Q --abits 8 --kv-bits $kv --wmethod gptq --out $out > $out.qlog 2>&1
  echo "w4a8 kv$kv block/block: $(build/comet perplexity --model $out $P 2>&1 | tail -1)" >> acc.txt
  out=models/acc128/w4a8kv${kv}_gptq_prog15
  COMET_X_ASCALE=prog15 COMET_X_WSCALE=prog15 $Q --abits 8 --kv-bits $kv --wmethod gptq --out $out > $out.qlog 2>&1
  echo "w4a8 kv$kv wprog15/a-per-token: $(COMET_X_ASCALE=prog15 build/comet perplexity --model $out $P 2>&1 | tail -1)" >> acc.txt
done
echo done3 >> acc.txt
