#!/bin/sh
# The long fuzz runs (tests/fuzz/README.md): each target's 10 million executions split into
# units of -runs=UNIT_RUNS, each unit an independent libFuzzer process started from the target's
# committed corpus (tests/fuzz/corpus/TARGET), run JOBS at a time until SECONDS have passed.
# A unit still running at the deadline is stopped by -max_total_time and its executions so far
# are counted. One line per unit goes to OUT/units.txt:
#   TARGET UNIT EXECUTIONS SECONDS done|partial|crash COV FT
# and a crashing input to OUT/crash-* (libFuzzer's artifact). Units already listed in
# OUT/units.txt as done are skipped, so a second call with the same OUT goes on.
#
#   tests/fuzz/long_run.sh BINDIR OUT SECONDS JOBS UNIT_RUNS TARGET:UNITS...
#
# BINDIR holds the fuzz_TARGET binaries (make fuzz builds them) and their tok_data.
set -eu
BIN=$1 OUT=$2 SECONDS_TOTAL=$3 JOBS=$4 UNIT_RUNS=$5
shift 5
mkdir -p "$OUT"
touch "$OUT/units.txt"
DEADLINE=$(( $(date +%s) + SECONDS_TOTAL ))
QUEUE=$OUT/queue.txt
: > "$QUEUE"
# interleave the targets' units so that every target advances
i=0
more=1
while [ $more = 1 ]; do
    more=0
    for spec in "$@"; do
        t=${spec%%:*} n=${spec#*:}
        if [ "$i" -lt "$n" ]; then
            more=1
            grep -q "^$t $i [0-9]* [0-9]* done" "$OUT/units.txt" || echo "$t $i" >> "$QUEUE"
        fi
    done
    i=$((i + 1))
done

unit() { # TARGET UNIT
    t=$1 u=$2
    left=$(( DEADLINE - $(date +%s) ))
    [ "$left" -gt 5 ] || return 0
    work=$OUT/work/$t.$u
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/tmp"
    cp "tests/fuzz/corpus/$t/"* "$work/corpus/"
    case $t in tokenize|chat) len=8192 ;; *) len=65536 ;; esac
    start=$(date +%s)
    status=done
    TMPDIR=$work/tmp "$BIN/fuzz_$t" -runs="$UNIT_RUNS" -max_total_time="$left" -max_len=$len -seed=$((u * 7919 + 1)) \
        -print_final_stats=1 -artifact_prefix="$OUT/crash-$t-$u-" "$work/corpus" > "$work/log" 2>&1 || status=crash
    secs=$(( $(date +%s) - start ))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
    [ -n "$runs" ] || runs=$(grep -o '^#[0-9]*' "$work/log" | tail -n 1 | tr -d '#')
    [ "$status" = crash ] || [ "${runs:-0}" -ge "$UNIT_RUNS" ] || status=partial
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/log" | tail -n 1 | awk '{ print $2, $4 }')
    echo "$t $u ${runs:-0} $secs $status ${cov:-0 0}" >> "$OUT/units.txt"
    [ "$status" = crash ] && cp "$work/log" "$OUT/crash-$t-$u.log"
    rm -rf "$work"
}
export BIN OUT DEADLINE UNIT_RUNS
while read -r t u; do echo "$t $u"; done < "$QUEUE" | \
    xargs -P "$JOBS" -L 1 sh -c "$(sed -n '/^unit() {/,/^}/p' "$0"); unit \"\$@\"" unit
# per target: executions and units
awk '{ runs[$1] += $3; n[$1]++; if ($5 == "done") d[$1]++; if ($5 == "crash") c[$1]++ }
     END { for (t in runs) printf "%s executions %d units %d done %d crashes %d\n", t, runs[t], n[t], d[t], c[t] }' "$OUT/units.txt" | sort
