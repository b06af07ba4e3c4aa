#!/bin/bash
# accuracy_table.sh — the rows of docs/accuracy.md's quantization table: quantizes the default
# model in each configuration and measures perplexity on the evaluation text, one command per
# row (printed before it runs, so each row can be rerun by hand). Results go to
# $OUT_DIR/results.tsv (config, INT8 block fraction, PPL line) and logs beside it.
#
# usage: scripts/accuracy_table.sh [ROW ...]     (default: every row)
# env:   COMET (build/comet), MODEL (the default GGUF), CALIB (data/mobydick.txt),
#        EVAL (data/austen/prideprejudice.txt), CTX (2048), WINDOWS (eval windows; empty =
#        all), CALIB_WINDOWS (128), CALIB_CACHE (calibration statistics shared by the rows;
#        default $OUT_DIR/calib<windows>.bin), TAU (2), THREADS (all), OUT_DIR (models/acc)
set -u
COMET=${COMET:-build/comet}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
CALIB=${CALIB:-data/mobydick.txt}
EVAL=${EVAL:-data/austen/prideprejudice.txt}
CTX=${CTX:-2048}
WINDOWS=${WINDOWS:-}
CALIB_WINDOWS=${CALIB_WINDOWS:-128}
THREADS=${THREADS:-}
OUT_DIR=${OUT_DIR:-models/acc}
CALIB_CACHE=${CALIB_CACHE:-$OUT_DIR/calib$CALIB_WINDOWS.bin}
TAU=${TAU:-2}
mkdir -p "$OUT_DIR"

ppl_opts="--text $EVAL --ctx $CTX${WINDOWS:+ --max-windows $WINDOWS}${THREADS:+ --threads $THREADS}"
q_opts="--model $MODEL --calib $CALIB --calib-windows $CALIB_WINDOWS --calib-cache $CALIB_CACHE --tau $TAU${THREADS:+ --threads $THREADS}"

declare -A Q P
# name -> quantize options ("" = no quantization) ; perplexity extra options
Q[fp]="";                                            P[fp]=""
Q[fp_kv4]="";                                        P[fp_kv4]="--kv-bits 4"    # Hadamard rotation (default)
Q[fp_kv4_norot]="";                                  P[fp_kv4_norot]="--kv-bits 4 --kv-rotation none"
Q[fp_kv4g16]="";                                     P[fp_kv4g16]="--kv-bits 4 --kv-group 16"
Q[fp_kv4g16_norot]="";                               P[fp_kv4g16_norot]="--kv-bits 4 --kv-group 16 --kv-rotation none"
Q[w8a8]="--wbits 8 --abits 8 --block 0 --kv-bits 16 --wmethod rtn --no-reorder"
Q[w4a16_rtn]="--abits 16 --kv-bits 16 --wmethod rtn --no-reorder"
Q[w4a16_gptq]="--abits 16 --kv-bits 16 --wmethod gptq"
Q[w4a4_naive]="--int8-budget 0 --no-reorder --kv-bits 16 --wmethod rtn"
Q[w4a4_reorder]="--int8-budget 0 --kv-bits 16 --wmethod rtn"
Q[w4ax_rtn]="--kv-bits 16 --wmethod rtn"
Q[w4ax_gptq]="--kv-bits 16 --wmethod gptq"
Q[w4axkv4_gptq]="--kv-bits 4 --wmethod gptq"
Q[w4axkv4_norot_gptq]="--kv-bits 4 --kv-rotation none --wmethod gptq"
Q[w4a16kv4_gptq]="--abits 16 --kv-bits 4 --wmethod gptq"
Q[w4axkv4g16_gptq]="--kv-bits 4 --kv-group 16 --wmethod gptq"
Q[w4axkv4g16_b32_gptq]="--block 32 --kv-bits 4 --kv-group 16 --wmethod gptq"
Q[w4a8_gptq]="--abits 8 --kv-bits 16 --wmethod gptq"
Q[w4a8kv4_gptq]="--abits 8 --kv-bits 4 --wmethod gptq"
ORDER="fp fp_kv4 w4axkv4_gptq w4a16_gptq w4ax_gptq w4a16_rtn w4ax_rtn w8a8 w4a16kv4_gptq w4a4_reorder w4a4_naive fp_kv4_norot fp_kv4g16 fp_kv4g16_norot w4axkv4_norot_gptq w4axkv4g16_gptq w4axkv4g16_b32_gptq w4a8_gptq w4a8kv4_gptq"

rows=${*:-$ORDER}
for r in $rows; do
    [ -n "${Q[$r]+x}" ] || { echo "unknown row $r (rows: $ORDER)" >&2; exit 2; }
    model=$MODEL
    if [ -n "${Q[$r]}" ]; then
        model="$OUT_DIR/$r"
        cmd="$COMET quantize $q_opts ${Q[$r]} --out $model"
        echo "+ $cmd"
        $cmd 2> "$OUT_DIR/$r.quantize.log" || { echo "quantize failed: $OUT_DIR/$r.quantize.log" >&2; continue; }
    fi
    cmd="$COMET perplexity --model $model $ppl_opts ${P[$r]:-}"
    echo "+ $cmd"
    line=$($cmd 2> "$OUT_DIR/$r.ppl.log" | tail -1)
    frac=$(grep -o 'overall [0-9.]*% of blocks' "$OUT_DIR/$r.quantize.log" 2>/dev/null | head -1)
    printf '%s\t%s\t%s\n' "$r" "${frac:-}" "$line" | tee -a "$OUT_DIR/results.tsv"
done
