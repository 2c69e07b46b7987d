#!/usr/bin/env bash
# Record a scheduler trace from a real vLLM server on a GPU, load it with `vllm bench
# serve`, then replay the trace against the reference. Runs unchanged on any machine with
# vLLM (0.32 or 0.33) and dualbudget installed in the current Python environment:
#
#   scripts/record-gpu.sh MODEL '{"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 3}' [OUT]
#
# Knobs (environment): PORT (8011), MAX_NUM_BATCHED_TOKENS (2048), MAX_NUM_SEQS (64),
# NUM_PROMPTS (200), INPUT_LEN (512), OUTPUT_LEN (256), PREFIX_LEN (256, a prefix every
# prompt shares, so that requests hit the prefix cache), REQUEST_RATE (inf),
# VLLM (the vLLM command, default `vllm`), PYTHON (default python3).
# vLLM's defaults throughout: async scheduling as vLLM resolves it (on for model-based
# drafters; the recorder then records vLLM's AsyncScheduler), prefix caching on (the
# trace carries vLLM's block hashes, docs/traces.md) and requests that stop on EOS (no
# --ignore-eos).
set -euo pipefail
model=${1:?usage: record-gpu.sh MODEL SPECULATIVE_CONFIG_JSON [OUT.ndjson]}
speculative=${2:?usage: record-gpu.sh MODEL SPECULATIVE_CONFIG_JSON [OUT.ndjson]}
out=$(realpath -m "${3:-dualbudget-trace.ndjson}")
port=${PORT:-8011}
vllm=${VLLM:-vllm}
python=${PYTHON:-python3}

export DUALBUDGET_TRACE=$out DUALBUDGET_TRACE_SOURCE=engine
"$python" -m vllm.entrypoints.openai.api_server \
  --model "$model" --port "$port" \
  --speculative-config "$speculative" \
  --scheduler-cls dualbudget.integration.recorder.RecordingScheduler \
  --max-num-batched-tokens "${MAX_NUM_BATCHED_TOKENS:-2048}" \
  --max-num-seqs "${MAX_NUM_SEQS:-64}" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT

for _ in $(seq 600); do
  if "$python" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
    break
  fi
  kill -0 "$server" 2>/dev/null || { echo "record-gpu.sh: the server exited" >&2; exit 1; }
  sleep 1
done

"$vllm" bench serve --backend vllm --model "$model" --port "$port" \
  --dataset-name random --random-input-len "${INPUT_LEN:-512}" \
  --random-prefix-len "${PREFIX_LEN:-256}" \
  --random-output-len "${OUTPUT_LEN:-256}" --num-prompts "${NUM_PROMPTS:-200}" \
  --request-rate "${REQUEST_RATE:-inf}"

# SIGINT lets the engine shut down, which closes the trace with its end line.
kill -INT "$server"
wait "$server" || true
trap - EXIT
"$python" -m dualbudget replay "$out"
