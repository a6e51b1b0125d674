#!/usr/bin/env bash
# Sixth H200 call: graphs, streams, threads, torch.compile, 64-bit offsets; compute-sanitizer.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:benchmark tests/test_gpu.py -k "graph or stream or thread or compile or offsets" tests/test_robustness.py 2>&1 | tail -8 | tee $OUT/robust.txt
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool python3 bench/sanitize_case.py > $OUT/sanitizer_$tool.txt 2>&1; grep -E "rel err|SUMMARY|Race reported" $OUT/sanitizer_$tool.txt | sort | uniq -c | head -20
done
