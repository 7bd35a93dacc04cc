#!/usr/bin/env bash
# scripts/gpu-nccl.sh - the plugin under real NCCL, measured in one run on a GPU machine:
#   1. does NCCL load the tuner from our library (its log line)?
#   2. CollNet with the tuner (and, with COLLNET_NOTUNER=1, without), against NCCL's ring over
#      the plugin;
#   3. NCCL's Socket transport against the plugin over each provider; over shm twice: on device
#      memory (shm-direct: NCCL's buffers in GPU memory, registered with FI_HMEM_CUDA, which
#      needs libfabric with CUDA) and host-staged (shm-staged), each checked to be what it says;
#   4. with STREAMS set, FABRICOLL_NET_STREAMS values over the IP provider.
# Every case is `plugin-tests/nccl_torch.py --mps --sweep MIN:MAX` (AllReduce float sum, ranks on
# GPU 0 as separate NCCL hosts); the cases alternate inside each repetition, and the tables give
# per-size medians over the repetitions and ratios of bandwidth (reference time / case time).
# Needs python3 with torch+CUDA and the built library (scripts/build.sh, carried to the machine:
# it has no network). Without a GPU it says SKIP and exits 0 (1 under FABRICOLL_TEST_STRICT=1).
#
# The defaults are sized for a run of about 4 minutes (8 cases, 2 repetitions, ~14 s a case on
# an H200): the cases that decide something. Environment (defaults in brackets):
#   REPS [2]  SWEEP [1K:256M]  RANKS [2]  COLLNET_RANKS [2 4]  COLLNET_NOTUNER [0]
#   PROVIDERS [GPU_PROVIDERS, else net tcp]: the first is also CollNet's and the streams' provider
#   STREAMS [none]: FABRICOLL_NET_STREAMS values besides the default's (2026-11-27: no gain)
#   GLOO [1]: also time PyTorch's gloo backend on the same CUDA tensors
#   CASE_TIMEOUT [90] seconds per case; GPU_DEADLINE [225] seconds: no new case after it
#   OUT [target/gpu-nccl]  logs.tgz (every case's log) and summary.txt
#   FABRICOLL_GPU_RELEASE [target/release]: where the library is (scripts/gpu-tests.sh sets it)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
reps=${REPS:-2}
sweep=${SWEEP:-1K:256M}
ranks=${RANKS:-2}
cn_ranks=${COLLNET_RANKS:-2 4}
providers=${PROVIDERS:-${GPU_PROVIDERS:-net tcp}}
streams=${STREAMS:-}
notuner=${COLLNET_NOTUNER:-0}
ip=${providers%% *}
case_timeout=${CASE_TIMEOUT:-90}
deadline=${GPU_DEADLINE:-225}
out=${OUT:-target/gpu-nccl}
lib=${FABRICOLL_GPU_RELEASE:-target/release}/libnccl-net-fabricoll.so
mkdir -p "$out"

if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP: gpu-nccl.sh needs python3 with torch and a CUDA device"
  [ "${FABRICOLL_TEST_STRICT:-0}" = 1 ] && exit 1
  exit 0
fi
[ -f "$lib" ] || { echo "gpu-nccl.sh: $lib missing: run scripts/build.sh" >&2; exit 1; }
python3 -c 'import torch; print("# torch", torch.__version__, "nccl", torch.cuda.nccl.version())' | tee "$out/summary.txt"

# case name -> nccl_torch.py arguments, and the environment of the case
declare -A args envs
cases=()
add() { cases+=("$1"); args[$1]=$2; envs[$1]=${3:-}; }
add "socket-np$ranks" "--socket --ranks $ranks"
[ "${GLOO:-1}" = 1 ] && add "gloo-np$ranks" "--gloo --ranks $ranks"
for p in $providers; do
  if [ "$p" = shm ]; then
    add "shm-direct-np$ranks" "--provider shm --ranks $ranks --gdr on"
    add "shm-staged-np$ranks" "--provider shm --ranks $ranks --gdr off"
  else
    add "$p-np$ranks" "--provider $p --ranks $ranks"
  fi
done
for s in $streams; do
  add "$ip-streams$s-np$ranks" "--provider $ip --ranks $ranks" "FABRICOLL_NET_STREAMS=$s"
done
for r in $cn_ranks; do
  add "ring-np$r" "--provider $ip --ranks $r"
  add "collnet-tuner-np$r" "--provider $ip --ranks $r --collnet --tuner on"
  [ "$notuner" = 1 ] && add "collnet-notuner-np$r" "--provider $ip --ranks $r --collnet --tuner off"
done

t0=$(date +%s)
failed=0
for rep in $(seq 1 "$reps"); do
  # alternate the order: forwards on odd repetitions, backwards on even ones
  order=("${cases[@]}")
  if [ $((rep % 2)) = 0 ]; then
    order=()
    for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done
  fi
  for c in "${order[@]}"; do
    if [ $(($(date +%s) - t0)) -ge "$deadline" ]; then
      echo "# GPU_DEADLINE=${deadline}s reached in repetition $rep, before $c" | tee -a "$out/summary.txt"
      break 2
    fi
    f="$out/$c-$rep.log"
    # shellcheck disable=SC2086 # args[] and envs[] hold word lists
    env ${envs[$c]} timeout --kill-after=10 "$case_timeout" python3 plugin-tests/nccl_torch.py --lib "$lib" --mps \
      --sweep "$sweep" --timeout $((case_timeout - 10)) ${args[$c]} >"$f" 2>&1
    rc=$?
    echo "# rep $rep $c: exit $rc"
    [ "$rc" = 0 ] || { failed=$((failed + 1)); tail -5 "$f" | sed 's/^/#   /'; }
  done
done

{
  echo "# tuner lines (rank 0 of each CollNet case):"
  grep -h "tuner loaded from our library" "$out"/collnet-*-1.log 2>/dev/null | sort | uniq -c
  echo "# GDRDMA (rank 0, shm cases):"
  grep -h "channels with GDRDMA" "$out"/shm-*-1.log 2>/dev/null | sort | uniq -c
  python3 - "$out" "$ranks" "$providers" "$cn_ranks" <<'EOF'
import glob, os, re, statistics, sys
out, ranks, providers, cn_ranks = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
times = {}  # case -> size -> [us]
for f in glob.glob(os.path.join(out, "*.log")):
    case = re.sub(r"-\d+\.log$", "", os.path.basename(f))
    for line in open(f, errors="replace"):
        m = re.search(r"rank 0: sweep (\d+) ([0-9.]+)", line)
        if m:
            times.setdefault(case, {}).setdefault(int(m.group(1)), []).append(float(m.group(2)))

def table(title, ref, others, n):
    sizes = sorted(times.get(ref, {}))
    if not sizes:
        print(f"\n## {title}: no data for {ref}")
        return
    print(f"\n## {title} (median us; ratio = {ref} time / case time, > 1 = faster than {ref}; "
          f"busbw = 2(n-1)/n x bytes / time, GB/s)")
    print("%10s %12s" % ("bytes", ref) + "".join(" %22s" % o for o in others))
    for s in sizes:
        r = statistics.median(times[ref][s])
        row = "%10d %12.1f" % (s, r)
        for o in others:
            v = times.get(o, {}).get(s)
            if v:
                m = statistics.median(v)
                bw = 2 * (n - 1) / n * s / (m * 1e3)
                row += " %9.1f %5.2fx %5.2f" % (m, r / m, bw)
            else:
                row += " %22s" % "-"
        print(row)

n = int(ranks)
ip = providers[0]
streams = sorted({c.split("-")[1] for c in times if c.startswith(f"{ip}-streams")})
cases = [c for p in providers
         for c in ([f"shm-direct-np{n}", f"shm-staged-np{n}"] if p == "shm" else [f"{p}-np{n}"])]
table(f"NCCL Socket against the plugin, {n} ranks", f"socket-np{n}",
      cases + [f"{ip}-{s}-np{n}" for s in streams] + [c for c in [f"gloo-np{n}"] if c in times], n)
if "shm" in providers:
    table(f"shm: device memory registered (direct) against host-staged, {n} ranks",
          f"shm-staged-np{n}", [f"shm-direct-np{n}"], n)
if streams:
    table(f"FABRICOLL_NET_STREAMS over {ip} (default against the others), {n} ranks",
          f"{ip}-np{n}", [f"{ip}-{s}-np{n}" for s in streams], n)
for r in cn_ranks:
    table(f"CollNet against NCCL's ring over the plugin (net), {r} ranks", f"ring-np{r}",
          [c for c in (f"collnet-tuner-np{r}", f"collnet-notuner-np{r}") if c in times], int(r))
EOF
  echo "# failed cases: $failed; logs in $out/logs.tgz"
} | tee -a "$out/summary.txt"
# one archive of the case logs (the GPU machine sends back a few files, not a folder of them)
(cd "$out" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
[ "$failed" = 0 ]
