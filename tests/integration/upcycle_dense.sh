#!/usr/bin/env bash
# `spes upcycle` of a tiny dense Qwen3 written by transformers (tests/ref/upcycle_check.py):
# with zero noise the MoE gives the dense logits (transformers) and loss (ours) for every
# router init; noise changes about the requested fraction; Llama (no QK-norm) is refused.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv torch transformers safetensors
require_spes
run_ref_check upcycle_check.py
