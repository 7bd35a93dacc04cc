#!/usr/bin/env bash
# scripts/baselines/wait-quiet.sh [MAX_S=180] [BUSY_PCT=15] [QUIET_S=3] - wait for an idle machine
# before a measurement: returns 0 once the whole machine (every CPU, from /proc/stat) has been
# less than BUSY_PCT per cent busy for QUIET_S consecutive seconds, or 1 after MAX_S seconds
# (the caller measures anyway and marks the run as taken on a busy machine). One line on stderr
# says which. Run it between measurements, never during one.
max=${1:-180} pct=${2:-15} need=${3:-3}
# busy and total jiffies of all CPUs: user nice system irq softirq steal, plus idle iowait
sample() { awk '$1 == "cpu" { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6; exit }' /proc/stat; }
read -r b0 t0 < <(sample)
calm=0 busy=0
for ((waited = 1; waited <= max; waited++)); do
  sleep 1
  read -r b1 t1 < <(sample)
  busy=$(((b1 - b0) * 100 / ((t1 - t0) > 0 ? (t1 - t0) : 1)))
  b0=$b1 t0=$t1
  if [ "$busy" -lt "$pct" ]; then calm=$((calm + 1)); else calm=0; fi
  if [ "$calm" -ge "$need" ]; then
    echo "# wait-quiet: quiet after ${waited}s (last second ${busy}% busy)" >&2
    exit 0
  fi
done
echo "# wait-quiet: still busy after ${max}s (last second ${busy}% busy): measuring anyway" >&2
exit 1
