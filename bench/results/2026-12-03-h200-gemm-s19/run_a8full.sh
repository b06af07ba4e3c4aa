#!/bin/bash
cd /tmp/acc
P="--text data/austen/prideprejudice.txt --ctx 2048 --max-windows 49"
for kv in 4 16; do
  echo "FULL w4a8 kv$kv block/block: $(build/comet perplexity --model models/acc128/w4a8kv${kv}_gptq_block $P 2>&1 | tail -1)" >> acc.txt
done
echo done4 >> acc.txt
