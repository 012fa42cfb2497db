#!/usr/bin/env bash
# The GPU checks in one command, from the repository root of a copy of the working tree, on a machine with one CUDA
# GPU:   bash benchmarks/gpu_check.sh
#
# Runs tests/test_cuda.py, benchmarks/bench_train.py --device cuda, benchmarks/bench_model.py (when it has a
# --device option), benchmarks/bench_predict.py --device cuda, and the training-memory checks of
# benchmarks/bench_memory.py (the probe against a real step's peak at the auto budget, an out-of-memory batch
# recovered, activation checkpointing's memory ratio with the bytes-per-pixel table), each under its own time
# limit, in under 10 minutes in all. Prints one "PASS <check>" / "FAIL <check>" / "SKIP <check>" line per check with its figures, then a summary
# line. Results (gpu_check.json, each benchmark's JSON, the test log) go to $OUT when that variable is set, else to
# benchmarks/results/. Exit status: 0 every check passed, 1 some check failed, 2 no CUDA device (nothing checked).
# PYTHON picks the interpreter (default: python3, else python).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-$(command -v python3 || command -v python)}
RESULTS=${OUT:-benchmarks/results}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$(date +%s)
TOTAL_S=${GPU_CHECK_TOTAL_S:-560}   # 10 minutes, less a margin for the untimed set-up, parsing and summary
declare -a NAMES=() STATUSES=() SECONDS_TAKEN=() FIGURES=()

remaining() { echo $((TOTAL_S - ($(date +%s) - START))); }

record() {  # record NAME STATUS SECONDS FIGURES
    NAMES+=("$1"); STATUSES+=("$2"); SECONDS_TAKEN+=("$3"); FIGURES+=("$4")
    printf '%s %s (%ss)%s\n' "$2" "$1" "$3" "${4:+: $4}"
}

run_step() {  # run_step NAME LIMIT_S LOG COMMAND...: runs under timeout (capped by the time left), sets RC, TOOK
    local name=$1 limit=$2 log=$3 left
    shift 3
    left=$(remaining)
    if [ "$left" -lt 20 ]; then
        RC=124; TOOK=0; echo "(no time left for $name)" >"$log"; return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0; t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    RC=$?; TOOK=$(( $(date +%s) - t0 ))
}

why() {  # the reason a step failed: timeout, or the last line of its log
    if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then echo "timed out"; else
        grep -v '^\s*$' "$2" | tail -n 1 | cut -c1-300; fi
}

# -- set-up: srforge importable (installed quietly if its dependencies are missing), a CUDA device present -------
if ! "$PY" -c "import srforge.train, pytest" >/dev/null 2>&1; then
    run_step "install" 150 "$RESULTS/gpu_check_install.log" "$PY" -m pip install -q -e ".[test]"
    if ! "$PY" -c "import srforge.train, pytest" >/dev/null 2>&1; then
        record "install" FAIL "$TOOK" "srforge or pytest not importable after pip install -e .[test]: $(why $RC "$RESULTS/gpu_check_install.log")"
    fi
fi
DEVICE=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>/dev/null)
TORCH=$("$PY" -c "import torch; print(torch.__version__, 'CUDA', torch.version.cuda)" 2>/dev/null)
echo "gpu_check: torch ${TORCH:-not importable}; device: ${DEVICE:-none}; results in $RESULTS"

if [ -z "$DEVICE" ]; then
    for check in test_cuda bench_train bench_model bench_predict memory_probe oom_recovery checkpointing; do
        record "$check" SKIP 0 "no CUDA device"
    done
    STATUS=2
else
    # -- tests/test_cuda.py --------------------------------------------------------------------------------------
    run_step "test_cuda" 200 "$RESULTS/test_cuda.log" "$PY" -m pytest -n 0 -s -q -p no:cacheprovider tests/test_cuda.py
    # -o: with -s a test's print can follow pytest's progress dot on the same line (".FIGURE ...").
    FIG=$(grep -o 'FIGURE .*' "$RESULTS/test_cuda.log" | sed 's/^FIGURE //' | paste -sd ';' -)
    SUMMARY=$(grep -E '[0-9]+ (passed|failed|errors?|skipped)' "$RESULTS/test_cuda.log" | tail -n 1)
    # A skipped test on a GPU machine means torch did not see the device under pytest: not a pass.
    if [ "$RC" -eq 0 ] && [[ "$SUMMARY" == *passed* ]] && [[ "$SUMMARY" != *skipped* ]]; then record "test_cuda" PASS "$TOOK" "$SUMMARY; $FIG"
    else record "test_cuda" FAIL "$TOOK" "${SUMMARY:-$(why $RC "$RESULTS/test_cuda.log")}; $(grep -E '^(FAILED|ERROR) ' "$RESULTS/test_cuda.log" | paste -sd ';' -); $FIG"; fi

    # -- bench_train --device cuda --------------------------------------------------------------------------------
    run_step "bench_train" 120 "$RESULTS/bench_train.log" \
        "$PY" benchmarks/bench_train.py --device cuda --scans 96 --out "$RESULTS/bench_train.json"
    if [ "$RC" -eq 0 ]; then
        FIG=$("$PY" - "$RESULTS/bench_train.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
w = r.get("welllog_budget_step") or {}
print(f"batch 16 size-grouped vs batch 1 {r['grouped16_vs_batch1']:.2f}x (goal >= 3x); "
      f"trainer vs bare {r['trainer_vs_bare']:.2f}x (goal >= {r['trainer_goal']}x); "
      + "; ".join(f"{x['strategy']} {x['real_px_per_s']:,.0f} px/s" for x in r["rows"])
      + (f"; welllog budget {w['scans']} x 640 x 4800: {w['seconds_per_step']:.3f} s/step, peak {w['peak_gib']:.1f} GiB"
         if w else ""))
ok = r["grouped16_vs_batch1"] >= 3 and r["trainer_vs_bare"] >= r["trainer_goal"]
sys.exit(0 if ok else 3)
EOF
)
        case $? in 0) record "bench_train" PASS "$TOOK" "$FIG" ;; *) record "bench_train" FAIL "$TOOK" "goal missed: $FIG" ;; esac
    else
        record "bench_train" FAIL "$TOOK" "$(why $RC "$RESULTS/bench_train.log")"
    fi

    # -- bench_model (only if it has a CUDA option) ---------------------------------------------------------------
    if "$PY" benchmarks/bench_model.py --help 2>/dev/null | grep -q -- '--device'; then
        run_step "bench_model" 60 "$RESULTS/bench_model.log" \
            "$PY" benchmarks/bench_model.py --device cuda --batch 4 --heights 480 640 --widths 3200 6400 \
            --out "$RESULTS/bench_model.json"
        if [ "$RC" -eq 0 ]; then record "bench_model" PASS "$TOOK" "$(grep -iE 'ratio|x of plain|per step|GFLOP' "$RESULTS/bench_model.log" | tail -n 3 | paste -sd ';' -)"
        else record "bench_model" FAIL "$TOOK" "$(why $RC "$RESULTS/bench_model.log")"; fi
    else
        record "bench_model" SKIP 0 "benchmarks/bench_model.py has no --device option"
    fi

    # -- bench_predict --device cuda -----------------------------------------------------------------------------
    run_step "bench_predict" 90 "$RESULTS/bench_predict.log" \
        "$PY" benchmarks/bench_predict.py --device cuda --n 12 --repeats 1 --out "$RESULTS/bench_predict.json"
    if [ "$RC" -eq 0 ]; then record "bench_predict" PASS "$TOOK" "$(grep -v '^\s*$' "$RESULTS/bench_predict.log" | tail -n 4 | paste -sd ';' -)"
    else record "bench_predict" FAIL "$TOOK" "$(why $RC "$RESULTS/bench_predict.log")"; fi

    # -- training memory: the probe against a real step at the auto budget, an out-of-memory batch recovered -------
    for check in probe oom; do
        name=$([ "$check" = probe ] && echo memory_probe || echo oom_recovery)
        run_step "$name" 90 "$RESULTS/$name.log" \
            "$PY" benchmarks/bench_memory.py --device cuda --check "$check" --out "$RESULTS/$name.json"
        case $RC in
            0) record "$name" PASS "$TOOK" "$(grep -v '^\s*$' "$RESULTS/$name.log" | tail -n 1)" ;;
            3) record "$name" FAIL "$TOOK" "goal missed: $(grep -v '^\s*$' "$RESULTS/$name.log" | tail -n 1)" ;;
            *) record "$name" FAIL "$TOOK" "$(why $RC "$RESULTS/$name.log")" ;;
        esac
    done

    # -- activation checkpointing's memory ratio on the device (and the bytes-per-pixel table) -------------------
    run_step "checkpointing" 90 "$RESULTS/bench_memory.log" \
        "$PY" benchmarks/bench_memory.py --device cuda --out "$RESULTS/bench_memory.json"
    if [ "$RC" -eq 0 ]; then
        FIG=$("$PY" - "$RESULTS/bench_memory.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
by = {(x["base_channels"], x["precision"], x["checkpointing"]): x["bytes_per_pixel"] for x in r["rows"]}
ratios = {p: by[(32, p, False)] / by[(32, p, True)] for p in ("fp32", "bf16") if (32, p, True) in by}
t = r["checkpointing_time"].get("32", {})
print("; ".join(f"base 32 {p}: {by[(32, p, False)]:,.0f} -> {by[(32, p, True)]:,.0f} B/px ({q:.2f}x, goal >= 2x)"
                for p, q in ratios.items())
      + (f"; step time with checkpointing {t['ratio']:.2f}x" if t else ""))
sys.exit(0 if ratios and min(ratios.values()) >= 2 else 3)
EOF
)
        case $? in 0) record "checkpointing" PASS "$TOOK" "$FIG" ;; *) record "checkpointing" FAIL "$TOOK" "goal missed: $FIG" ;; esac
    else
        record "checkpointing" FAIL "$TOOK" "$(why $RC "$RESULTS/bench_memory.log")"
    fi
    STATUS=0
fi

PASSED=0; FAILED=0; SKIPPED=0
for s in "${STATUSES[@]}"; do
    case $s in PASS) PASSED=$((PASSED + 1)) ;; FAIL) FAILED=$((FAILED + 1)) ;; SKIP) SKIPPED=$((SKIPPED + 1)) ;; esac
done
[ "$STATUS" -eq 0 ] && [ "$FAILED" -gt 0 ] && STATUS=1
ELAPSED=$(( $(date +%s) - START ))

# gpu_check.json: one entry per check, with its figures.
"$PY" - "$RESULTS/gpu_check.json" "$DEVICE" "$TORCH" "$ELAPSED" "$STATUS" "${#NAMES[@]}" \
    "${NAMES[@]}" "${STATUSES[@]}" "${SECONDS_TAKEN[@]}" "${FIGURES[@]}" <<'EOF' || true
import json, sys
out, device, torch_version, elapsed, status, n = sys.argv[1:7]
n = int(n)
rest = sys.argv[7:]
names, statuses, seconds, figures = (rest[i * n:(i + 1) * n] for i in range(4))
checks = [{"check": a, "status": b, "seconds": int(c), "figures": d} for a, b, c, d in zip(names, statuses, seconds, figures)]
json.dump({"device": device or None, "torch": torch_version or None, "seconds": int(elapsed), "exit_status": int(status),
           "checks": checks}, open(out, "w"), indent=2)
EOF

if [ "$STATUS" -eq 2 ]; then
    echo "gpu_check: no CUDA device: nothing checked (${SKIPPED} skipped) in ${ELAPSED}s"
else
    echo "gpu_check: ${PASSED} passed, ${FAILED} failed, ${SKIPPED} skipped in ${ELAPSED}s on ${DEVICE}"
fi
exit "$STATUS"
