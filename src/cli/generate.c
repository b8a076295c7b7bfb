// `spes generate`: sample text from a model, streaming each token to stdout as it comes.
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/threads.h"
#include "base/timer.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "eval/generate.h"
#include "model/hf_config.h"
#include "model/hf_import.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes generate --model DIR [--tokenizer T] (--prompt TEXT | --prompt_file F) [options]\n"
            "\n"
            "  --model DIR            model directory (checkpoint step, export, upcycle or HF OLMoE/Qwen3-MoE)\n"
            "  --tokenizer T          tokenizer.json, a directory holding one, or 'bytes' (default: the\n"
            "                         model directory when it holds a tokenizer.json)\n"
            "  --max_new_tokens N     default 128 (bounded by the model's max_position_embeddings)\n"
            "  --temperature T        0 = greedy; default 0.8\n"
            "  --top_k K              keep the K most likely tokens (0 = all; default 50)\n"
            "  --top_p P              nucleus sampling mass (1 = off; default 0.95)\n"
            "  --min_p P              keep tokens at least P times as likely as the top one (0 = off, default)\n"
            "  --repetition_penalty R divide the logit of every token of the prompt and output so far by R\n"
            "                         (multiply where negative), greedy too (1 = off, default)\n"
            "                         A model directory with a generation_config.json gives, as for\n"
            "                         transformers' generate, every one of these not given here:\n"
            "                         greedy unless its do_sample is true, then its temperature, top_k,\n"
            "                         top_p and min_p (absent: 1, 50, 1, none), its repetition_penalty,\n"
            "                         and its max_new_tokens (or max_length less the prompt; absent: 128).\n"
            "                         stderr says which, and which keys of the file we do not follow.\n"
            "  --seed N               sampling seed (default 0)\n"
            "  --no_stop              keep going after an EOS token (generation_config.json's eos_token_id\n"
            "                         when the model directory has that file, else config.json's)\n"
            "  --no_cache             recompute the whole sequence per token (slow; for comparison)\n"
            "  --print_ids            print token ids (one line) instead of text\n"
            "  --threads N            CPU threads (default: all cores)\n" CLI_DEVICE_HELP);
}

typedef struct {
    const Tokenizer *tok;
    const ModelConfig *cfg;   // its eos ids are not printed
    bool print_ids;
} Stream;

// stdout is the command's output: a full disk under it (`> out.txt`) is an error, not a
// silent exit 0 with the text cut short.
static int flush_stdout(void) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        return spes_fail("cannot write the generated text to stdout: %s", errno ? strerror(errno) : "write error");
    return SPES_OK;
}

// Writes each token's bytes as soon as it is chosen (byte-level BPE: a multi-byte character
// may span tokens; the terminal reassembles it).
static int stream_token(void *user, int32_t token) {
    Stream *s = user;
    if (s->print_ids) {
        printf("%d ", token);
        return flush_stdout();
    }
    if (model_config_is_eos(s->cfg, token)) return SPES_OK;
    char *text = NULL;
    size_t len = 0;
    uint32_t id = (uint32_t)token;
    SPES_TRY(tokenizer_decode(s->tok, &id, 1, &text, &len));
    fwrite(text, 1, len, stdout);
    free(text);
    return flush_stdout();
}

// Which of the settings a generation_config.json may give the command line gave: those win.
typedef struct {
    bool temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens;
} GivenFlags;

// Appends one item to the comma-separated note of the settings taken from the file.
static void note_add(char *note, size_t cap, const char *fmt, ...) {
    size_t n = strlen(note);
    if (n > 0 && n + 2 < cap) {
        memcpy(note + n, ", ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + n, cap - n, fmt, ap);
    va_end(ap);
}

// transformers' generate takes every setting it is not given from the model directory's
// generation_config.json, and those the file lacks from GenerationConfig's global defaults
// (do_sample false, temperature 1, top_k 50, top_p 1), so a file without do_sample (our
// export's, built from config.json, or OLMoE's own) means greedy. We do the same, so that a
// directory gives the same text here as in transformers; without the file our own sampling
// defaults stay (a checkpoint of `spes train` has none unless its load_path had one).
// transformers' max_length default (20) is not taken: it warns that this is no model's setting.
static int apply_generation_config(const char *model_dir, const HfGenerationSettings *s, GivenFlags given,
                                   int n_prompt, GenerateOptions *opt) {
    if (!s->found) return SPES_OK;
    SamplingParams *sp = &opt->sampling;
    const char *unset = " (transformers' default; not in the file)";
    char note[512] = "";
    bool greedy_from_file = false;
    if (!given.temperature && s->do_sample == 1) {
        sp->temperature = s->temperature >= 0 ? (float)s->temperature : 1.0f;
        if (sp->temperature == 0)
            return spes_fail("%s/generation_config.json: \"temperature\" 0 with \"do_sample\" true: transformers "
                             "refuses it too (greedy is do_sample false); give --temperature", model_dir);
        note_add(note, sizeof note, "do_sample true, temperature %g%s", (double)sp->temperature,
                 s->temperature >= 0 ? "" : unset);
    } else if (!given.temperature) {
        sp->temperature = 0;
        greedy_from_file = true;
        note_add(note, sizeof note, "greedy (do_sample %s)",
                 s->do_sample == 0 ? "false" : "absent: transformers' default is false");
    }
    if (sp->temperature > 0 && !given.top_k) {
        sp->top_k = s->top_k >= 0 ? s->top_k : 50;
        note_add(note, sizeof note, "top_k %d%s", sp->top_k, s->top_k >= 0 ? "" : unset);
    }
    if (sp->temperature > 0 && !given.top_p) {
        sp->top_p = s->top_p >= 0 ? (float)s->top_p : 1.0f;
        note_add(note, sizeof note, "top_p %g%s", (double)sp->top_p, s->top_p >= 0 ? "" : unset);
        // transformers' top_p 0 keeps the most likely token alone; our sampler reads 0 as no cut.
        if (s->top_p == 0) {
            sp->top_p = 1.0f;
            sp->top_k = 1;
            note_add(note, sizeof note, "that is top_k 1, the most likely token alone, as transformers keeps it");
        }
    }
    if (sp->temperature > 0 && !given.min_p && s->min_p >= 0) {
        sp->min_p = (float)s->min_p;
        note_add(note, sizeof note, "min_p %g", (double)sp->min_p);
    }
    // A logits processor in transformers, not a warper: greedy decoding takes it too.
    if (!given.repetition_penalty && s->repetition_penalty >= 0) {
        sp->repetition_penalty = (float)s->repetition_penalty;
        note_add(note, sizeof note, "repetition_penalty %g", (double)sp->repetition_penalty);
    }
    if (greedy_from_file && (given.top_k || given.top_p || given.min_p))
        note_add(note, sizeof note, "--top_k, --top_p and --min_p unused (give --temperature to sample)");
    if (!given.max_new_tokens && s->max_new_tokens > 0) {
        opt->max_new_tokens = s->max_new_tokens;
        note_add(note, sizeof note, "max_new_tokens %d", opt->max_new_tokens);
    } else if (!given.max_new_tokens && s->max_length > 0) {
        // max_length counts the prompt; transformers refuses a prompt that fills it.
        if (s->max_length <= n_prompt)
            return spes_fail("%s/generation_config.json: \"max_length\" %d leaves no room after the prompt's %d "
                             "tokens (transformers refuses it too); give --max_new_tokens", model_dir, s->max_length,
                             n_prompt);
        opt->max_new_tokens = s->max_length - n_prompt;
        note_add(note, sizeof note, "max_new_tokens %d (max_length %d less the prompt's %d tokens)",
                 opt->max_new_tokens, s->max_length, n_prompt);
    }
    if (note[0]) fprintf(stderr, "generate: from %s/generation_config.json: %s\n", model_dir, note);
    // Keys that would make transformers decode otherwise: said, not refused (the text is still the
    // model's, decoded as the note above says; a Hub model's num_beams should not make it unusable).
    bool sampled_keys = sp->temperature > 0 && s->not_followed_sampling[0];
    if (s->not_followed[0] || sampled_keys)
        fprintf(stderr, "generate: %s/generation_config.json: not implemented here, so transformers' generate would "
                "decode otherwise: %s%s%s\n", model_dir, s->not_followed, s->not_followed[0] && sampled_keys ? ", " : "",
                sampled_keys ? s->not_followed_sampling : "");
    return SPES_OK;
}

// The prompt as the start of the output; a long one only by its end (what the continuation
// follows), cut at a UTF-8 character boundary.
#define ECHO_PROMPT_MAX 2048
static void echo_prompt(const char *prompt, size_t len) {
    if (len <= ECHO_PROMPT_MAX) {
        fwrite(prompt, 1, len, stdout);
        return;
    }
    size_t from = len - ECHO_PROMPT_MAX / 2;
    while (from < len && ((unsigned char)prompt[from] & 0xC0) == 0x80) from++;
    printf("[... %zu bytes of the prompt not shown ...]", from);
    fwrite(prompt + from, 1, len - from, stdout);
}

int cmd_generate(int argc, char **argv) {
    static const struct option options[] = {
        {"model", required_argument, 0, 'm'},          {"tokenizer", required_argument, 0, 't'},
        {"prompt", required_argument, 0, 'p'},         {"prompt_file", required_argument, 0, 'P'},
        {"max_new_tokens", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 'T'},
        {"top_k", required_argument, 0, 'k'},          {"top_p", required_argument, 0, 'q'},
        {"min_p", required_argument, 0, 'M'},          {"repetition_penalty", required_argument, 0, 'R'},
        {"seed", required_argument, 0, 's'},           {"no_stop", no_argument, 0, 'S'},
        {"no_cache", no_argument, 0, 'C'},             {"print_ids", no_argument, 0, 'I'},
        {"threads", required_argument, 0, 'j'},        {"help", no_argument, 0, 'h'},
        {"device", required_argument, 0, 'D'},         {"precision", required_argument, 0, 'X'},
        {0, 0, 0, 0}};
    const char *model_dir = NULL, *tok_path = NULL, *prompt = NULL, *prompt_file = NULL;
    const char *device = NULL, *precision = NULL;
    GenerateOptions opt = {.max_new_tokens = 128,
                           .sampling = {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .min_p = 0.0f,
                                        .repetition_penalty = 1.0f},
                           .seed = 0,
                           .stop_at_eos = true,
                           .use_cache = true};
    GivenFlags given = {0};
    bool print_ids = false;
    int threads = 0, c, status = SPES_OK;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tok_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'P': prompt_file = optarg; break;
        case 'n':
            status = cli_int("max_new_tokens", optarg, 1, 1 << 24, &opt.max_new_tokens);
            given.max_new_tokens = true;
            break;
        case 'T':
            status = cli_float("temperature", optarg, 0.0, 100.0, &opt.sampling.temperature);
            given.temperature = true;
            break;
        case 'k':
            status = cli_int("top_k", optarg, 0, 1 << 30, &opt.sampling.top_k);
            given.top_k = true;
            break;
        case 'q':
            status = cli_float("top_p", optarg, 0.0, 1.0, &opt.sampling.top_p);
            given.top_p = true;
            break;
        case 'M':
            status = cli_float("min_p", optarg, 0.0, 1.0, &opt.sampling.min_p);
            given.min_p = true;
            break;
        case 'R':
            // transformers refuses 0 (RepetitionPenaltyLogitsProcessor: strictly positive)
            status = cli_float("repetition_penalty", optarg, 1e-6, 1e6, &opt.sampling.repetition_penalty);
            given.repetition_penalty = true;
            break;
        case 's': status = cli_u64("seed", optarg, &opt.seed); break;
        case 'S': opt.stop_at_eos = false; break;
        case 'C': opt.use_cache = false; break;
        case 'I': print_ids = true; break;
        case 'j': status = cli_int("threads", optarg, 1, 4096, &threads); break;
        case 'D': device = optarg; break;
        case 'X': precision = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status != SPES_OK) return cli_report_error();
    if (!tok_path) tok_path = cli_default_tokenizer(model_dir);
    if (model_dir && !tok_path) {
        fprintf(stderr, "spes: generate: %s holds no tokenizer.json; name one with --tokenizer (a file, a directory "
                        "holding one, or 'bytes')\n", model_dir);
        return 2;
    }
    if (!model_dir || (!prompt == !prompt_file) || optind < argc) {
        usage(stderr);
        return 2;
    }
    threads_set(threads);
    uint8_t *file_text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (prompt_file && file_read_all(prompt_file, &file_text, &prompt_len) != SPES_OK) return cli_report_error();
    if (prompt_file) prompt = (const char *)file_text;

    Tokenizer *tok = NULL;
    TokenEncoder *enc = NULL;
    IdBuffer ids = {0};
    Model m;
    bool model_loaded = false;
    int32_t *prompt_ids = NULL, *out = NULL;
    status = tokenizer_load(tok_path, &tok);
    if (status == SPES_OK) status = tokenizer_encoder_new(tok, &enc);
    if (status == SPES_OK) status = tokenizer_encode(enc, prompt, prompt_len, &ids);
    if (status == SPES_OK && ids.len == 0) status = spes_fail("the prompt encodes to no tokens");
    if (status == SPES_OK) status = cli_load_model(model_dir, device, precision, &m);
    model_loaded = status == SPES_OK;
    // transformers' generate stops at generation_config.json's eos ids when the file exists, and
    // takes the settings it is not given from it.
    HfGenerationSettings settings;
    if (status == SPES_OK) status = hf_generation_config_read(model_dir, &m.cfg, &settings, NULL, NULL);
    if (status == SPES_OK) status = apply_generation_config(model_dir, &settings, given, (int)ids.len, &opt);
    if (status == SPES_OK) {
        prompt_ids = spes_malloc(ids.len * sizeof(int32_t));
        // No more than max_seq_len tokens are ever produced (a file's max_new_tokens may be 2^31).
        int out_cap = opt.max_new_tokens < m.cfg.max_seq_len ? opt.max_new_tokens : m.cfg.max_seq_len;
        out = spes_malloc((size_t)out_cap * sizeof(int32_t));
        if (!prompt_ids || !out) status = SPES_ERR;
    }
    int n_out = 0;
    double start = now_seconds();
    // Refused before the prompt is echoed (a 50 MB prompt used to be printed first).
    if (status == SPES_OK && ids.len >= (size_t)m.cfg.max_seq_len)
        status = spes_fail("the prompt has %zu tokens (%zu bytes); the model's max_seq_len is %d", ids.len, prompt_len,
                           m.cfg.max_seq_len);
    for (size_t i = 0; status == SPES_OK && i < ids.len; i++)
        if (ids.ids[i] >= (uint32_t)m.cfg.vocab_size)
            status = spes_fail("the prompt's token %zu has id %u, outside the model's vocabulary of %d: is %s the "
                               "tokenizer this model was trained with?", i, ids.ids[i], m.cfg.vocab_size, tok_path);
    if (status == SPES_OK) {
        for (size_t i = 0; i < ids.len; i++) prompt_ids[i] = (int32_t)ids.ids[i];
        Stream stream = {.tok = tok, .cfg = &m.cfg, .print_ids = print_ids};
        if (!print_ids) {
            echo_prompt(prompt, prompt_len);
            status = flush_stdout();
        }
        if (status == SPES_OK)
            status = generate_tokens(&m, prompt_ids, (int)ids.len, &opt, stream_token, &stream, out, &n_out);
        printf("\n");   // also after a failure: the error is said on a line of its own
        if (status == SPES_OK) status = flush_stdout();
    }
    double seconds = now_seconds() - start;
    if (status == SPES_OK)
        fprintf(stderr, "generate: %d prompt tokens, %d new tokens in %.2f s (%.1f tok/s%s)\n", (int)ids.len, n_out,
                seconds, n_out / (seconds > 0 ? seconds : 1e-9), opt.use_cache ? "" : ", no KV cache");
    free(prompt_ids);
    free(out);
    free(file_text);
    id_buffer_free(&ids);
    if (model_loaded) cli_free_model(&m);
    tokenizer_encoder_free(enc);
    tokenizer_free(tok);
    return status == SPES_OK ? 0 : cli_report_error();
}
