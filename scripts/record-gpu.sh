#!/usr/bin/env bash
# Record a scheduler trace from a real vLLM server on a GPU, load it with `vllm bench
# serve`, then replay the trace against the reference. Runs unchanged on any machine with
# vLLM (0.32 or 0.33) and dualbudget installed in the current Python environment:
#
#   scripts/record-gpu.sh MODEL '{"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 3}' [OUT]
#   scripts/record-gpu.sh --preset FAMILY [OUT]
#
# A preset names a model family served with speculative decoding and the KV cache
# groups vLLM builds for it (docs/reference.md, the deployment table):
#   gpt-oss-eagle3   openai/gpt-oss-20b + an EAGLE3 drafter, K 3: sliding-window + full
#                    attention groups (hybrid coordinator); one GPU
#   deepseek-mtp     deepseek-ai/DeepSeek-V3.1 with its MTP module, K 1: one MLA group;
#                    tensor parallel 8 by default
#   qwen3-next-mtp   Qwen/Qwen3-Next-80B-A3B-Instruct with its MTP module, K 2: Mamba
#                    (gated delta net) + full attention groups, mamba_cache_mode align
#                    under prefix caching; tensor parallel 4 by default. On Hopper its
#                    gated delta net prefill runs FlashInfer's kernel, which saves the
#                    prompt's Mamba state inside a prefill chunk in a block it reserves
#                    (mamba_prefill_checkpoint_blocks 1 in the header);
#                    ADDITIONAL_CONFIG='{"gdn_prefill_backend": "triton"}' records
#                    Triton's, which does not.
# MODEL, SPECULATIVE_CONFIG and ADDITIONAL_CONFIG (vLLM's --additional-config JSON) in
# the environment override a preset's.
#
# Knobs (environment): TENSOR_PARALLEL_SIZE (1, or the preset's), PORT (8011), MAX_NUM_BATCHED_TOKENS (2048), MAX_NUM_SEQS (64),
# NUM_PROMPTS (200), INPUT_LEN (512), OUTPUT_LEN (256), PREFIX_LEN (256, a prefix every
# prompt shares, so that requests hit the prefix cache), REQUEST_RATE (inf),
# VLLM (the vLLM command, default `vllm`), PYTHON (default python3).
# vLLM's defaults throughout: async scheduling as vLLM resolves it (on for model-based
# drafters; the recorder then records vLLM's AsyncScheduler), prefix caching on (the
# trace carries vLLM's block hashes, docs/traces.md) and requests that stop on EOS (no
# --ignore-eos).
set -euo pipefail
usage="usage: record-gpu.sh MODEL SPECULATIVE_CONFIG_JSON [OUT.ndjson] | --preset FAMILY [OUT.ndjson]"
tp=1
additional='{}'
if [[ ${1:-} == --preset ]]; then
  case ${2:?$usage} in
    gpt-oss-eagle3)
      model=openai/gpt-oss-20b
      speculative='{"method": "eagle3", "model": "RedHatAI/gpt-oss-20b-speculator.eagle3", "num_speculative_tokens": 3}' ;;
    deepseek-mtp)
      model=deepseek-ai/DeepSeek-V3.1 tp=8
      speculative='{"method": "mtp", "num_speculative_tokens": 1}' ;;
    qwen3-next-mtp)
      model=Qwen/Qwen3-Next-80B-A3B-Instruct tp=4
      speculative='{"method": "mtp", "num_speculative_tokens": 2}' ;;
    *) echo "record-gpu.sh: unknown preset '$2' (gpt-oss-eagle3, deepseek-mtp, qwen3-next-mtp)" >&2
       exit 2 ;;
  esac
  model=${MODEL:-$model} speculative=${SPECULATIVE_CONFIG:-$speculative}
  out=$(realpath -m "${3:-dualbudget-trace-$2.ndjson}")
else
  model=${1:?$usage}
  speculative=${2:?$usage}
  out=$(realpath -m "${3:-dualbudget-trace.ndjson}")
fi
tp=${TENSOR_PARALLEL_SIZE:-$tp}
additional=${ADDITIONAL_CONFIG:-$additional}
port=${PORT:-8011}
vllm=${VLLM:-vllm}
python=${PYTHON:-python3}

export DUALBUDGET_TRACE=$out DUALBUDGET_TRACE_SOURCE=engine
"$python" -m vllm.entrypoints.openai.api_server \
  --model "$model" --port "$port" \
  --speculative-config "$speculative" \
  --tensor-parallel-size "$tp" \
  --additional-config "$additional" \
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
