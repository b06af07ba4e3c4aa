#!/bin/bash
# ab_table.sh BASE1.log NEW1.log BASE2.log NEW2.log -- the A/B table of ab.sh from four
# bench_gemm logs (their "model layer N K M int8% ours_us ..." rows).
set -o pipefail
[ $# -eq 4 ] || { echo "usage: ab_table.sh BASE1 NEW1 BASE2 NEW2" >&2; exit 2; }
rows() { awk '$1 ~ /^LLaMA/ {print $1 "_" $2 "_M" $5 "_" $6 "%", $7}' "$1" | sort; }
echo "| case | base us | new us | base us | new us | new / base |"
echo "|---|---|---|---|---|---|"
join <(rows "$1") <(rows "$2") | join - <(rows "$3") | join - <(rows "$4") |
    awk '{r = ($3 + $5) / ($2 + $4); s += log(r); n++;
          printf "| %s | %s | %s | %s | %s | %.3f |\n", $1, $2, $3, $4, $5, r}
         END {if (n) printf "\ngeomean new / base over %d cases: %.4f\n", n, exp(s / n);
              else {print "no common cases" > "/dev/stderr"; exit 1}}'
