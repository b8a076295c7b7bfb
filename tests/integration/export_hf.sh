#!/usr/bin/env bash
# `spes export` / import against Hugging Face transformers (tests/ref/export_import_check.py):
# exports of both formats (fp32, sharded, bf16) load with AutoModelForCausalLM and give the
# source logits; our logits and eval loss match transformers'; directories written by
# transformers (sharded, bf16) import; missing / mis-shaped tensors are named.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv torch transformers safetensors
require_spes
run_ref_check export_import_check.py
