"""Token-id parity of `spes tokenize --dump_ids` with Hugging Face `tokenizers` (the Rust
implementation, PyPI wheel).

For every tokenizer (the shipped dolma2.json and gpt-neox-olmo.json, a Qwen2-style tokenizer
built here from dolma2's vocab with NFC + Qwen2's split regex + ByteLevel, and a "behaviours"
tokenizer exercising every Split behaviour, Digits and ByteLevel add_prefix_space) and every input
(Tiny Shakespeare, a generated Unicode stress text, and smaller stress documents), the ids must be
identical, our decode of them equals HF's decode, and decode(encode(x)) == x for tokenizers
that leave the text alone (no normalizer, no added prefix space).

Invalid UTF-8: HF's Python API only takes str, so it cannot be asked about bytes that are not
UTF-8; ours refuses them with an error naming the byte offset, which is checked here.

usage: tokenizer_parity.py SPES_BIN DATA_DIR WORK_DIR
"""
import functools
import json
import os
import random
import subprocess
import sys
import unicodedata


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2_style(base):
    t = json.loads(json.dumps(base))
    t["normalizer"] = {"type": "NFC"}
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    t["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    t["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return t


def ignore_merges(base):
    """Llama-3 style: a word found whole in the vocab skips the merges."""
    t = json.loads(json.dumps(base))
    t["model"]["ignore_merges"] = True
    return t


def empty_matches(base):
    """Split patterns that can match the empty string, under every behaviour; Digits runs."""
    t = json.loads(json.dumps(base))
    steps = [{"type": "Split", "pattern": {"Regex": pat}, "behavior": beh, "invert": inv}
             for pat, beh, inv in ((r"x*", "MergedWithNext", True), (r"(?=[A-Z])", "MergedWithPrevious", False),
                                   (r"\d*", "Contiguous", False), (r"\s*", "Isolated", False),
                                   (r"[aeiou]?", "Removed", False))]
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps + [
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return t


def behaviours(base):
    t = json.loads(json.dumps(base))
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "e"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\p{P}"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\s"}, "behavior": "Contiguous", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"[aeiou]+"}, "behavior": "Isolated", "invert": True},
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    return t


# Snippets of many scripts and edge cases (also the benchmark's Unicode corpus).
STRESS_PIECES = [
    "Hello, world! It's John's book; they'll say we've done what I'd do. IT'S LOUD. 'ſ 'S 'K ",
    "Ünïcödé façade naïve café — «quotes» „Anführung“ ‘single’ “double” … ",
    "Ελληνικά κείμενα, Русский текст с ёлками, Українська мова ґ, Հայերեն, ქართული ",
    "עברית עם ניקוד: שָׁלוֹם, العربية: مَرْحَبًا بِالعالم، فارسی: سلام ",
    "हिन्दी देवनागरी क्षत्रिय, বাংলা ভাষা, தமிழ் எழுத்து, ไทย ภาษาไทยไม่มีช่องว่าง, ລາວ, မြန်မာ, ខ្មែរ ",
    "中文汉字没有空格分词，日本語のひらがなとカタカナ、한국어 한글 문장입니다. ",
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪🇯🇵 ❤️‍🔥 🧑🏿‍💻 #️⃣ 1️⃣ ",
    "Combining: e\u0301 a\u0308 o\u0302\u0323 n\u0303 A\u030a \u1100\u1161\u11a8 \u1112\u1161\u11ab =\u0338 <\u0338 ",
    "Digits: 1234567890123456789012345678901234567890 ١٢٣٤٥٦٧٨٩٠ ०१२३४५६७८९ ½ ⅔ Ⅻ 3.14159e-10 0x1F ",
    "Whitespace:\t\ttabs\n\nnewlines\r\nCRLF\r\n\r\nmore\x0bvt\x0cff\u0085nel\u00a0nbsp\u1680ogham",
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000",
    "\u180emongolian\u200bzwsp\ufeffbom\u200czwnj\u200dzwj ",
    "Special: a<|endoftext|>b <|endoftext|> x<|endoftext|>\u0338 <|fim_prefix|>mid<|pad|> <|padding|>",
    "|||IP_ADDRESS||| |||EMAIL_ADDRESS|||x|||PHONE_NUMBER||| <extra_id_1> <|extra_id_0|> ",
    "spaces:  two   three    four" + " " * 30 + "thirty" + " " * 7 + "\n" + " " * 25 + "end ",
    "Code: def f(x):\n    return x**2  # comment\n\tif (a && b) { c->d[i] += 1; }\n",
    "URL https://example.com/a?b=c&d=e#frag email a.b@c.de ... !!! ??? --- ___ *** ",
    "Controls: \x01\x02\x1b[31m\x7f end ",
    "Private use \ue000 and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐀𝐁𝐂 🜁 𓀀 ",
    "Mixed3D4d 42nd 1st ABCdefGHI camelCaseWord snake_case_word kebab-case-word ",
]


def stress_text(seed):
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        p = rng.choice(STRESS_PIECES)
        if rng.random() < 0.3:
            p = "".join(rng.sample(p, len(p)))   # shuffled characters: odd combinations
        out.append(p)
        if rng.random() < 0.1:
            out.append(rng.choice(["\n", "\r\n", " ", "\t", "  \n  ", ""]))
    # Long words and runs: cache limits (255 bytes), the heap merge (> 64 bytes), deep regex
    # backtracking over long whitespace.
    out.append(" " + "a" * 300 + " " + "ab" * 200 + " " + "9" * 1000 + " " + "é" * 200 + "\n")
    out.append(" " * 5000 + "x" + "\n" * 3000 + "\t " * 2000 + "y" + "\u3000" * 500 + "z ")
    return "".join(out)


def write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def ours(spes, tok_path, text_path, decoded_path=None):
    cmd = [spes, "tokenize", "--dump_ids", text_path, "--tokenizer_name_or_path", tok_path]
    if decoded_path:
        cmd += ["--dump_decoded", decoded_path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return [int(x) for x in r.stdout.split()], ""


@functools.lru_cache(maxsize=None)
def leaves_text_alone(tok_path):
    spec = json.load(open(tok_path, encoding="utf-8"))
    return not spec.get("normalizer") and '"add_prefix_space": true' not in json.dumps(spec["pre_tokenizer"])


def compare(name, tok, spes, tok_path, text_path, work):
    text = open(text_path, encoding="utf-8", newline="").read()
    want = tok.encode(text, add_special_tokens=False).ids
    decoded_path = os.path.join(work, "decoded.txt")
    got, err = ours(spes, tok_path, text_path, decoded_path)
    if got is None:
        print(f"FAIL {name}: spes failed: {err}")
        return False
    if got != want:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        ctx = tok.decode(want[max(0, i - 5):i + 5])
        print(f"FAIL {name}: ids differ at {i} (ours {len(got)} ids, HF {len(want)}): ours {got[i:i + 8]} "
              f"HF {want[i:i + 8]} near {ctx!r}")
        return False
    # Our decoder must agree with HF's; and where nothing alters the text (no normalizer, no
    # added prefix space), decoding must give the input back byte for byte.
    decoded = open(decoded_path, "rb").read()
    if decoded != tok.decode(want, skip_special_tokens=False).encode("utf-8"):
        print(f"FAIL {name}: our decode differs from HF's decode of the same ids")
        return False
    if leaves_text_alone(tok_path) and decoded != text.encode("utf-8"):
        print(f"FAIL {name}: decode(encode(x)) != x")
        return False
    print(f"ok   {name}: {len(want)} ids identical, decode matches")
    return True


def main():
    from tokenizers import Tokenizer   # here, so the benchmark can import STRESS_PIECES without it

    spes, data, work = sys.argv[1], sys.argv[2], sys.argv[3]
    tok_dir = os.path.join(data, "tokenizers")
    dolma2 = json.load(open(os.path.join(tok_dir, "dolma2.json"), encoding="utf-8"))
    neox = json.load(open(os.path.join(tok_dir, "gpt-neox-olmo.json"), encoding="utf-8"))
    tokenizers = {"dolma2": os.path.join(tok_dir, "dolma2.json"), "gpt-neox-olmo": os.path.join(tok_dir, "gpt-neox-olmo.json")}
    for name, t in (("qwen2-style", qwen2_style(dolma2)), ("behaviours", behaviours(neox)),
                    ("ignore-merges", ignore_merges(dolma2)), ("empty-matches", empty_matches(neox))):
        tokenizers[name] = os.path.join(work, name + ".json")
        json.dump(t, open(tokenizers[name], "w", encoding="utf-8"), ensure_ascii=False)

    inputs = {"tinyshakespeare": os.path.join(data, "tinyshakespeare.txt")}
    inputs["stress"] = os.path.join(work, "stress.txt")
    write(inputs["stress"], stress_text(1234))
    for k in range(3):   # small documents: edges at the very start and end of a text
        inputs[f"doc{k}"] = os.path.join(work, f"doc{k}.txt")
        write(inputs[f"doc{k}"], stress_text(k)[k * 37:k * 37 + 200 + 97 * k])
    inputs["edge"] = os.path.join(work, "edge.txt")
    write(inputs["edge"], "\u0338<|endoftext|>e\u0301 '")

    ok = True
    for tname, tpath in tokenizers.items():
        hf = Tokenizer.from_file(tpath)
        for iname, ipath in inputs.items():
            if iname == "tinyshakespeare" and tname in ("behaviours", "ignore-merges", "empty-matches"):
                continue   # keeps the test fast; the variants are about the stress text
            ok &= compare(f"{tname}/{iname}", hf, spes, tpath, ipath, work)

    # Invalid UTF-8 (HF cannot be asked): ours must refuse, naming the byte offset.
    bad = os.path.join(work, "invalid.bin")
    with open(bad, "wb") as f:
        f.write(b"valid text \xff\xfe then \xc3\x28 and a lone surrogate \xed\xa0\x80")
    for tname in ("dolma2", "gpt-neox-olmo"):
        got, err = ours(spes, tokenizers[tname], bad)
        if got is not None or "not valid UTF-8 at byte 11" not in err:
            print(f"FAIL {tname}/invalid-utf8: expected a refusal naming byte 11, got {err or got}")
            ok = False
        else:
            print(f"ok   {tname}/invalid-utf8: refused ({err.splitlines()[-1]})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
