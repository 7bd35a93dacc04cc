# plugin-tests/harness_lib.sh - sourced by run.sh and neuron_run.sh: what every harness run's
# result becomes.
#   harness_counts PROG LABEL OUT RC LOG
#       sets p and f from the last "PROG: N passed, M failed" line of OUT; a run that printed no
#       such line, or exited non-zero without a failure, counts as one failure, said as
#       "FAIL LABEL ..." (the run's stderr or output is in LOG).

harness_counts() {
  local prog=$1 label=$2 out=$3 rc=$4 log=$5 line
  line=$(printf '%s\n' "$out" | grep -E "^$prog: [0-9]+ passed, [0-9]+ failed\$" | tail -1)
  if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E "s/^$prog: ([0-9]+) passed, ([0-9]+) failed\$/\\1/")
    f=$(echo "$line" | sed -E "s/^$prog: ([0-9]+) passed, ([0-9]+) failed\$/\\2/")
  else
    # no summary: the program itself died or was killed by timeout
    echo "FAIL $label exited with $rc without a summary (timeout is ${RUN_TIMEOUT:-?} s); see $log"
    p=0
    f=1
  fi
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $label exited with $rc although it reported no failure; see $log"
    f=1
  fi
}
