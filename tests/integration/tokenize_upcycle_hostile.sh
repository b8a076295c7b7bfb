#!/usr/bin/env bash
# Hostile inputs to `spes tokenize`, `spes upcycle` and `spes eval --task` that are valid
# JSON / valid flags but odd; each once crashed, hung, took gigabytes or gave a silently wrong
# result. Each must now be refused with a message naming what and where (exit 1), or work:
#   tokenize: a vocab id of 2^31 (24 GB, 16 s), added tokens whose ids HF replaces (other ids
#             than HF, silently), --processes 1000000 with one file (1 GB of worker slots),
#             an output prefix holding an earlier run's shards (stale ones left mixed in), a
#             broken tokenizer_config.json (EOS silently taken by convention instead);
#   upcycle:  tie_word_embeddings "yes" (read as untied), --num_experts 65536 (a quadratic hang),
#             a config error naming a deleted temporary file instead of the dense config.json;
#   eval:     doc ids at or above the unconditional offset (0 documents scored, exit 0), a
#             primary_metric we do not compute (no primary_score, no word).
# Only python3's standard library is needed (the dense model is written by hand).
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
command -v python3 >/dev/null || { echo "SKIPPED: python3 not found"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

ok()   { echo "ok   $1"; }
bad()  { echo "FAIL $1"; shift; printf '%s\n' "$@" | tail -5; fail=1; }

# expect_refusal <label> <message fragment> <command...>: exit 1 and the fragment in the output.
expect_refusal() {
  local label=$1 want=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -eq 1 ] && grep -qF -- "$want" <<<"$out"; then ok "$label: $(grep -F -- "$want" <<<"$out" | tail -1 | cut -c1-160)"
  else bad "$label: exit $rc (want 1 and \"$want\")" "$out"; fi
}

# A byte-level tokenizer.json: the 256 byte symbols (id = byte), "he" = 256, then $1 (python
# statements editing `t`).
tokenizer() {
  python3 - "$1" <<'EOF'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
sym = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {sym[b]: b for b in range(256)}
vocab["he"] = 256
t = {"added_tokens": [], "normalizer": None,
     "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
     "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
     "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
               "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
               "merges": [["h", "e"]]}}
def added(content, id):
    return {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}
exec(sys.argv[1])
print(json.dumps(t))
EOF
}

# --- tokenize --------------------------------------------------------------------------------
# vm_limit KB: the address-space limit of a case (none under ASan, whose shadow memory cannot be
# mapped under any such limit; the cases' other checks still hold there).
vm_limit() { [ -n "${SPES_ASAN:-}" ] || echo "ulimit -v $1;"; }
printf 'hello <|endoftext|> world' >"$dir/text.txt"
tokenizer 't["model"]["vocab"]["far"] = 2**31 + 5' >"$dir/far.json"
expect_refusal "vocab id 2^31+5" 'vocab entry "far" has id 2147483653; ids above 16777215 are not supported' \
  bash -c "$(vm_limit 4000000) timeout 20 '$SPES_BIN' tokenize --dump_ids '$dir/text.txt' --tokenizer_name_or_path '$dir/far.json'"

# HF gives "<|endoftext|>" id 257 (the next after the 257-entry vocab) whatever the file says.
tokenizer 't["added_tokens"] = [added("<|endoftext|>", 300)]' >"$dir/gap.json"
expect_refusal "added token id HF replaces" \
  'added_tokens[0] "<|endoftext|>" has id 300, but Hugging Face tokenizers gives it id 257' \
  timeout 20 "$SPES_BIN" tokenize --dump_ids "$dir/text.txt" --tokenizer_name_or_path "$dir/gap.json"
tokenizer 't["added_tokens"] = [added("<|endoftext|>", 257)]' >"$dir/good.json"
ids=$(timeout 20 "$SPES_BIN" tokenize --dump_ids "$dir/text.txt" --tokenizer_name_or_path "$dir/good.json" 2>&1 | tr '\n' ' ')
want="256 108 108 111 32 257 32 119 111 114 108 100 "
py=${SPES_VENV_PY:-.venv/bin/python}
if [ -x "$py" ] && "$py" -c "import tokenizers" 2>/dev/null; then   # HF's own ids, when it is there
  want=$("$py" -c "import sys; from tokenizers import Tokenizer
print(' '.join(map(str, Tokenizer.from_file(sys.argv[1]).encode(open(sys.argv[2]).read(), add_special_tokens=False).ids)) + ' ')" \
    "$dir/good.json" "$dir/text.txt")
fi
if [ "$ids" = "$want" ]; then ok "consistent added token: ids $ids"; else bad "consistent added token: got '$ids' want '$want'"; fi

# A tokenizer directory whose tokenizer_config.json is broken: its eos_token (<|im_end|>) was
# read as absent and EOS taken by convention (<|endoftext|>), silently; AutoTokenizer refuses it.
mkdir -p "$dir/tokdir"
tokenizer 't["added_tokens"] = [added("<|endoftext|>", 257), added("<|im_end|>", 258)]' >"$dir/tokdir/tokenizer.json"
printf '{"eos_token": "<|im_end|>",\n' >"$dir/tokdir/tokenizer_config.json"
expect_refusal "broken tokenizer_config.json" "tokdir/tokenizer_config.json: invalid JSON at line 2" \
  timeout 20 "$SPES_BIN" tokenize --file_glob "$dir/text.txt" --tokenizer_name_or_path "$dir/tokdir" --output_prefix "$dir/eos/e_"
printf '{"eos_token": "<|im_end|>"}\n' >"$dir/tokdir/tokenizer_config.json"
timeout 20 "$SPES_BIN" tokenize --file_glob "$dir/text.txt" --tokenizer_name_or_path "$dir/tokdir" --output_prefix "$dir/eos/e_" \
  >/dev/null 2>&1 && [ "$(od -An -tu4 "$dir/eos/e_000_000001.npy" | tr -s ' \n' ' ' | awk '{print $NF}')" = 258 ] &&
  ok "tokenizer_config.json eos_token <|im_end|> = 258 ends the document" || bad "EOS from tokenizer_config.json"

# --processes far above the file count: one worker slot per file, not per process (the
# 1000000 slots were a 1 GB shared mapping, refused under this 700 MB limit; a CUDA build
# starts at ~300 MB of address space, and OpenBLAS spins for ever when its buffer allocation
# fails, so the limit cannot be much tighter).
printf '{"text": "hello"}\n' >"$dir/one.jsonl"
out=$(bash -c "$(vm_limit 700000) timeout 30 '$SPES_BIN' tokenize --file_glob '$dir/one.jsonl' --tokenizer_name_or_path bytes \
  --output_prefix '$dir/out/p_' --processes 1000000" 2>&1)
if [ $? -eq 0 ] && [ "$(ls "$dir/out")" = "p_000_000001.npy" ] && [ "$(wc -c <"$dir/out/p_000_000001.npy")" -eq 24 ]; then
  ok "--processes 1000000 with one file"
else bad "--processes 1000000 with one file" "$out"; fi

# A second run into the prefix of an earlier one: it overwrote shard 000 and left shard 001
# of the earlier run, which a training glob then mixed in; refused before any work now.
printf '{"text": "world"}\n' >"$dir/two.jsonl"
timeout 30 "$SPES_BIN" tokenize --file_glob "$dir/*.jsonl" --tokenizer_name_or_path bytes --output_prefix "$dir/runs/r_" \
  --processes 2 >/dev/null 2>&1 || bad "first run into runs/r_"
expect_refusal "output prefix holding an earlier run's shards" "runs/r_000_000001.npy" \
  timeout 30 "$SPES_BIN" tokenize --file_glob "$dir/two.jsonl" --tokenizer_name_or_path bytes --output_prefix "$dir/runs/r_"
[ "$(ls "$dir/runs" | tr '\n' ' ')" = "r_000_000001.npy r_001_000001.npy " ] || bad "earlier shards changed: $(ls "$dir/runs")"

# --- upcycle ---------------------------------------------------------------------------------
# dense <dir> <json of config overrides>: a tiny dense Qwen3 (vocab 300, hidden 8, 2 layers).
dense() {
  python3 - "$1" "$2" <<'EOF'
import json, os, struct, sys, random
d, over = sys.argv[1], json.loads(sys.argv[2])
c = {"model_type": "qwen3", "vocab_size": 300, "hidden_size": 8, "intermediate_size": 4, "num_hidden_layers": 2,
     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 32,
     "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "eos_token_id": 0}
c.update(over)
V, H, I, hd = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["head_dim"]
shapes = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H], "lm_head.weight": [V, H]}
for l in range(c["num_hidden_layers"]):
  p = "model.layers.%d." % l
  shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                 p + "self_attn.q_proj.weight": [2 * hd, H], p + "self_attn.k_proj.weight": [hd, H],
                 p + "self_attn.v_proj.weight": [hd, H], p + "self_attn.o_proj.weight": [H, 2 * hd],
                 p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                 p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I]})
rng, header, blob = random.Random(0), {}, b""
for name, shape in shapes.items():
    n = 1
    for s in shape: n *= s
    data = struct.pack("<%df" % n, *(rng.gauss(0, 0.3) for _ in range(n)))
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
    blob += data
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
os.makedirs(d, exist_ok=True)
json.dump(c, open(os.path.join(d, "config.json"), "w"))
open(os.path.join(d, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + blob)
EOF
}
dense "$dir/tied_yes" '{"tie_word_embeddings": "yes"}'
expect_refusal "tie_word_embeddings \"yes\"" 'tied_yes/config.json: "tie_word_embeddings" must be true or false' \
  timeout 20 "$SPES_BIN" upcycle --dense "$dir/tied_yes" --out "$dir/tied_moe" --num_experts 2 --top_k 1

# A bad dense key is named in the dense config.json (it named a deleted /tmp copy).
dense "$dir/gqa" '{"num_attention_heads": 2, "num_key_value_heads": 3}'
out=$(timeout 20 "$SPES_BIN" upcycle --dense "$dir/gqa" --out "$dir/gqa_moe" --num_experts 2 --top_k 1 2>&1)
if [ $? -eq 1 ] && grep -qF "gqa/config.json: model config: n_heads (2) must be a multiple of n_kv_heads (3)" <<<"$out" &&
   ! grep -q "/tmp/spes_upcycle_config" <<<"$out"; then ok "GQA heads that do not divide: $(tail -1 <<<"$out" | cut -c1-150)"
else bad "GQA heads that do not divide" "$out"; fi

dense "$dir/dense" '{}'
out=$(timeout 60 "$SPES_BIN" upcycle --dense "$dir/dense" --out "$dir/moe_max" --num_experts 65536 --top_k 1 2>&1)
if [ $? -eq 0 ] && grep -q '"num_experts": 65536' "$dir/moe_max/config.json"; then ok "--num_experts 65536 in under 60 s"
else bad "--num_experts 65536 (timed out or failed)" "$out"; fi
rm -rf "$dir/moe_max"

# --- eval --task -----------------------------------------------------------------------------
timeout 60 "$SPES_BIN" upcycle --dense "$dir/dense" --out "$dir/moe" --num_experts 2 --top_k 1 >/dev/null 2>&1 ||
  bad "upcycle of the tiny dense model"
req() { printf '{"request_type": "loglikelihood", "doc_id": %s, "idx": %s, "label": 0, "request": {"context": "Q: a", "continuation": " %s"}}\n' "$@"; }
{ req 2000000 0 yes; req 2000000 1 no; } >"$dir/high_ids.jsonl"
expect_refusal "doc ids above the unconditional offset" \
  'doc_id 2000000 is at or above the unconditional doc_id offset 1000000, but its document (doc_id 1000000) is not in the file' \
  timeout 60 "$SPES_BIN" eval --model "$dir/moe" --tokenizer bytes --task "$dir/high_ids.jsonl" --no_progress
{ req 0 0 yes; req 0 1 no; } >"$dir/fine.jsonl"
out=$(timeout 60 "$SPES_BIN" eval --model "$dir/moe" --tokenizer bytes --task "$dir/fine.jsonl" --no_progress 2>&1)
if [ $? -eq 0 ] && grep -q "docs=1 " <<<"$out"; then ok "a well-formed task scores its document"; else bad "well-formed task" "$out"; fi

# A primary_metric spes eval does not compute is named in a warning (the results have no
# primary_score for it).
mkdir -p "$dir/task_pm"
cp "$dir/fine.jsonl" "$dir/task_pm/requests.jsonl"
echo '{"task_name": "pm", "task_config": {"primary_metric": "acc_bogus"}}' >"$dir/task_pm/config.json"
out=$(timeout 60 "$SPES_BIN" eval --model "$dir/moe" --tokenizer bytes --task "$dir/task_pm" --no_progress 2>&1)
if [ $? -eq 0 ] && grep -qF 'primary_metric "acc_bogus" (config.json) is not a metric spes eval computes' <<<"$out"; then
  ok "unknown primary_metric named"; else bad "unknown primary_metric" "$out"; fi

exit $fail
