#!/usr/bin/env python3
"""Quality benchmark driver (`make bench-quality`, bench/quality/run.sh): SPES peers against
centralised training and the fedavg baseline at an equal token budget, over several seeds, on
the demo corpus and on Tiny Shakespeare (byte tokenizer), plus ablations.

Every run starts from the config `spes demo` writes (its model, optimizer, schedule), changed
only by command-line overrides, so the benchmark trains the model the demo trains:
  centralised  one `spes train`, all experts, P*B sequences per step, P*t threads;
  spes         `spes server` (expert merging as the demo sets it) + P `spes train` peers,
               B sequences per step each, t threads each (the demo's: cores / P, at least 1),
               syncing every K steps;
  fedavg       `spes server --mode fedavg` + P peers with using_dilico (every tensor trainable,
               every tensor averaged), B sequences per step each.
So the three see the same number of tokens: steps * P * B * seq_len.
Each final model is scored with `spes eval` exactly as `spes demo` scores its models
(validation loss over up to 100k held-out tokens in windows of 128, batch 8; the demo's recall
and held-out-sums questions on the demo corpus). The validation curve comes from the trainers'
own evaluator (every eval_interval steps, on the synced model for peers).

Writes OUT/results.jsonl (one line per run) and prints progress; bench/quality/report.py turns
it into the table and the SVG. Python standard library only.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

SEQ = 128                  # model.max_sequence_length of the demo config
MERGE_ALPHA = 0.3          # the demo server's merge strength (src/cli/demo.c start_server)
MERGE_TOPK = 4
RUN_TIMEOUT_S = 3600       # one training run; far above any expected time, so nothing hangs


def log(msg):
    print(msg, flush=True)


class RunFailed(Exception):
    pass


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return f"(no {path})"


# ---------------------------------------------------------------------------------------------
# Data: the demo corpus through `spes demo` itself, Tiny Shakespeare through `spes tokenize`.

def prepare_demo(spes, out, experts, experts_per_peer, train_docs):
    """`spes demo --inputs_only` writes train.bin, val.bin, the question files and demo.yaml and
    stops before training (its own corpus writer and question writer, no copy of them here).
    Written afresh by every invocation (a few seconds): an output folder reused with a newer
    binary would otherwise keep an older demo.yaml, whose settings every run here inherits.
    The model has `experts` experts per layer (the runs here state their own topology on the
    command line; the demo's peer count only has to give every expert the same owners)."""
    d = os.path.join(out, "demo")
    logf = os.path.join(out, "demo_inputs.log")
    with open(logf, "w") as f:
        rc = subprocess.call([spes, "demo", "--peers", str(experts // experts_per_peer), "--experts_per_peer", str(experts_per_peer),
                              "--experts", str(experts), "--steps", "2",
                              "--sync_steps", "2", "--batch", "1", "--threads_per_peer", "1", "--inputs_only",
                              "--train_docs", str(train_docs), "--out", d], stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RunFailed(f"spes demo (writing the corpus) failed:\n{tail(logf)}")
    # spes eval names a task after its directory: one directory per question set.
    tasks = []
    for name in ("recall", "arithmetic"):
        os.makedirs(os.path.join(d, "tasks", name), exist_ok=True)
        dst = os.path.join(d, "tasks", name, name + ".jsonl")
        shutil.copyfile(os.path.join(d, name + ".jsonl"), dst)
        tasks.append(dst)
    return {"name": "demo", "config": os.path.join(d, "demo.yaml"), "train": os.path.join(d, "train.bin"),
            "val": os.path.join(d, "val.bin"), "tasks": tasks}


def prepare_shakespeare(spes, out, text_path, held_out=32 * 1024):
    """The last 32 KiB of the text held out (as tests/integration/train_shakespeare.sh does),
    each part tokenized with the built-in byte tokenizer."""
    d = os.path.join(out, "shakespeare")
    os.makedirs(d, exist_ok=True)
    with open(text_path, "rb") as f:
        text = f.read()
    if len(text) < 4 * held_out:
        raise RunFailed(f"{text_path}: {len(text)} bytes, too short for a {held_out}-byte held-out split")
    paths = {}
    for split, part in (("train", text[:-held_out]), ("val", text[-held_out:])):
        final = os.path.join(d, split + ".npy")
        paths[split] = final
        if os.path.exists(final):
            continue
        with open(os.path.join(d, split + ".txt"), "wb") as f:
            f.write(part)
        prefix = os.path.join(d, split + "_")
        logf = os.path.join(d, f"tokenize_{split}.log")
        with open(logf, "w") as f:
            rc = subprocess.call([spes, "tokenize", "--file_glob", os.path.join(d, split + ".txt"),
                                  "--tokenizer_name_or_path", "bytes", "--output_prefix", prefix, "--dtype", "uint16"],
                                 stdout=f, stderr=subprocess.STDOUT)
        shards = sorted(p for p in os.listdir(d) if p.startswith(split + "_") and p.endswith(".npy"))
        if rc != 0 or len(shards) != 1:
            raise RunFailed(f"spes tokenize {split}: exit {rc}, shards {shards}:\n{tail(logf)}")
        os.rename(os.path.join(d, shards[0]), final)
    return {"name": "shakespeare", "train": paths["train"], "val": paths["val"], "tasks": []}


def curve_val_file(corpus, out, tokens):
    """The first `tokens` validation tokens (uint16), for the trainers' periodic evaluation:
    the curve needs a cheap figure every few rounds, the final score uses the full eval."""
    path = os.path.join(out, corpus["name"], "curve_val.bin")
    with open(corpus["val"], "rb") as f:     # from this invocation's val file, as the corpus
        data = f.read(2 * tokens)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


# ---------------------------------------------------------------------------------------------
# One run: its processes, command lines (the "config generator": every setting is an override
# of the demo's config) and scores.

class Shape:
    def __init__(self, a):
        self.steps, self.batch, self.peers, self.threads = a.steps, a.batch, a.peers, a.threads
        self.threads_per_peer, self.eval_threads = a.threads_per_peer, a.eval_threads
        self.experts_per_peer = a.experts_per_peer


def common_overrides(shape, corpus, curve_val, eval_interval, seed):
    return [f"--max_duration={shape.steps}", f"--scheduler.t_warmup={max(shape.steps // 10, 1)}",
            f"--save_interval_unsharded={shape.steps}", "--save_num_unsharded_checkpoints_to_keep=1",
            "--try_load_latest_save=false", f"--console_log_interval={max(shape.steps // 10, 1)}",
            f"--data.paths=[{corpus['train']}]",
            f"--evaluators=[{{label: val, type: lm, data: {{paths: [{curve_val}]}}}}]",
            f"--eval_interval={eval_interval}", f"--seed={6198 + seed}"]


def start(cmd, logf):
    f = open(logf, "w")
    try:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        f.close()


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_all(procs, logs, deadline):
    """Waits for every process; on the first failure stops the others and raises."""
    while True:
        running = 0
        for p, lf in zip(procs, logs):
            rc = p.poll()
            if rc is None:
                running += 1
            elif rc != 0:
                for q in procs:
                    stop(q)
                raise RunFailed(f"{' '.join(p.args[:3])} ... exited {rc}; {lf}:\n{tail(lf)}")
        if running == 0:
            return
        if time.monotonic() > deadline:
            for q in procs:
                stop(q)
            raise RunFailed(f"run did not finish within {RUN_TIMEOUT_S}s; logs: {logs}")
        time.sleep(0.2)


def server_port(logf, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", open(logf, errors="replace").read())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc)
    raise RunFailed(f"spes server did not start:\n{tail(logf)}")


def data_seed(peer, seed):
    """The demo's data seeds (6198 + 1000 * peer; the centralised run 6198) for seed 0, shifted for
    the others, so every (peer, seed) reads its own order."""
    return 6198 + 1000 * peer + 17 * seed


def train_central(spes, shape, base, overrides, rundir, seed, batch=None):
    """One `spes train` on all experts; batch: sequences per step (default peers x batch)."""
    save = os.path.join(rundir, "central")
    batch = batch or shape.peers * shape.batch
    cmd = [spes, "train", base, "--using_spes=false", f"--global_train_batch_size={batch}",
           f"--device_train_microbatch_size={batch}", f"--save_folder={save}",
           f"--threads={shape.threads}", f"--data.seed={data_seed(0, seed)}"] + overrides
    logf = os.path.join(rundir, "central.log")
    wait_all([start(cmd, logf)], [logf], time.monotonic() + RUN_TIMEOUT_S)
    return save


def train_peers(spes, shape, base, overrides, rundir, seed, mode, sync_steps, server_flags, peer_flags):
    """A parameter server and P peers; returns peer 0's save folder (every peer holds the
    aggregate after the last sync, which is the final step: steps % sync_steps == 0)."""
    slog = os.path.join(rundir, "server.log")
    scmd = [spes, "server", "--total_peers", str(shape.peers), "--host", "127.0.0.1", "--port", "0",
            "--mode", mode] + (["--num_train_experts_per_node", str(shape.experts_per_peer)] if mode == "spes" else [])
    server = start(scmd + server_flags, slog)
    try:
        port = server_port(slog, server)
        procs, logs = [], []
        for p in range(shape.peers):
            cmd = [spes, "train", base, f"--spes_config.peer_id={p}", f"--spes_config.num_peers={shape.peers}",
                   f"--spes_config.num_train_experts_per_node={shape.experts_per_peer}",
                   f"--spes_config.server_addr=127.0.0.1:{port}", f"--spes_config.sync_steps={sync_steps}",
                   f"--data.seed={data_seed(p, seed)}",
                   f"--global_train_batch_size={shape.batch}", f"--device_train_microbatch_size={shape.batch}",
                   f"--save_folder={os.path.join(rundir, f'peer{p}')}", f"--threads={shape.threads_per_peer}"]
            if mode == "fedavg":
                cmd.append("--using_dilico=true")
            logs.append(os.path.join(rundir, f"peer{p}.log"))
            procs.append(start(cmd + overrides + peer_flags, logs[-1]))
        wait_all(procs, logs, time.monotonic() + RUN_TIMEOUT_S)
    finally:
        stop(server)
    return os.path.join(rundir, "peer0")


SYNC_LINE = re.compile(r"sync step (\d+): .*? up ([\d.]+) MB, down ([\d.]+) MB")


def bytes_per_peer(rundir, peers):
    """Sync traffic of one peer over the run, mean over the peers: the sum of every round's
    upload and download as its log states them ("sync step N: ... up A MB, down B MB", 10 kB
    resolution per round), and the number of rounds. What a better setting costs on the wire."""
    totals, rounds = [], []
    for p in range(peers):
        up = down = 0.0
        n = 0
        with open(os.path.join(rundir, f"peer{p}.log"), errors="replace") as f:
            for m in SYNC_LINE.finditer(f.read()):
                up += float(m.group(2))
                down += float(m.group(3))
                n += 1
        totals.append((up + down) * 1e6)
        rounds.append(n)
    return {"bytes_per_peer": round(sum(totals) / peers), "rounds": max(rounds)}


def curve(metrics_path, tokens_per_step):
    """(tokens, validation ce) of every evaluation the trainer logged."""
    points = []
    with open(metrics_path) as f:
        for line in f:
            r = json.loads(line)
            if "eval" in r and "ce" in r:   # lm evaluators (downstream ones report accuracies)
                points.append([r["step"] * tokens_per_step, r["ce"]])
    return points


def score(spes, ckpt, corpus, threads, rundir):
    """The demo's evaluation (src/cli/demo.c evaluate_checkpoint) through `spes eval`."""
    outp = os.path.join(rundir, "eval.json")
    cmd = [spes, "eval", "--model", ckpt, "--tokens", corpus["val"], "--max_tokens", "100000", "--seq", str(SEQ),
           "--batch", "8", "--tokenizer", "bytes", "--threads", str(threads), "--no_progress", "--output", outp]
    for t in corpus["tasks"]:
        cmd += ["--task", t]
    logf = os.path.join(rundir, "eval.log")
    wait_all([start(cmd, logf)], [logf], time.monotonic() + RUN_TIMEOUT_S)
    with open(outp) as f:
        r = json.load(f)
    s = {"val_loss": r["perplexity"]["loss"], "val_tokens": r["perplexity"]["tokens"]}
    for name, t in r.get("tasks", {}).items():
        s[name + "_acc"] = t["acc_raw"]
    return s


# ---------------------------------------------------------------------------------------------
# What runs: the three methods, then the ablations (SPES with one setting changed).

def variants(a, server_has_outer):
    """(method, variant, sync_steps, merge on, decayed aux loss on, extra server flags[, extra peer
    flags]). The main comparison uses the demo's settings; each ablation changes one of them;
    --variant adds one more SPES row with any peer and server flags (an experiment)."""
    base = a.sync_steps
    out = [("centralised", "main", base, False, False, []),
           ("spes", "main", base, True, True, []),
           ("fedavg", "main", base, False, False, [])]
    out = [v for v in out if v[0] in a.methods]
    if a.variant:
        out.append((a.variant_method, a.variant, a.variant_sync or base, a.variant_method == "spes" and a.variant_merge,
                    a.variant_method == "spes", shlex.split(a.variant_server_flags), shlex.split(a.variant_peer_flags)))
    if a.ablations:
        out += [("spes", "no_merge", base, False, True, []),
                ("spes", "no_decayed_aux", base, True, False, [])]
        out += [("spes", f"sync{k}", k, True, True, []) for k in a.sync_ablation if k != base]
        if server_has_outer:
            out.append(("spes", "outer_nesterov", base, True, True,
                        ["--outer_lr", str(a.outer_lr), "--outer_momentum", str(a.outer_momentum)]))
        # The peers' learning rate and AdamW beta1 as the centralised run's, and the demo as it was
        # before issue #28 (sync every 25 steps, f32 payloads, both as centralised): what the new
        # defaults gained.
        out.append(("spes", "lr_scale1", base, True, True, [], ["--spes_config.lr_scale=1"]))
        out.append(("spes", "beta1_central", base, True, True, [], ["--spes_config.beta1=null"]))
        # Expert ownership rotating between the peers (spes server --expert_rotation_steps), on
        # the merge cadence: every 100 steps at the demo's 2000.
        out.append(("spes", "rotate_experts", base, True, True,
                    ["--expert_rotation_steps", str(merge_interval(a.steps, base))]))
        out.append(("spes", "before28", a.before_sync, True, True, [],
                    ["--spes_config.lr_scale=1", "--spes_config.beta1=null", "--spes_config.payload_dtype=f32"]))
    return out


def merge_interval(steps, sync_steps):
    """The demo's (src/cli/demo.c demo_merge_interval): every second round, but at most 20 merges
    over the run, as a multiple of sync_steps."""
    rounds = -(-(steps // 20) // sync_steps)
    return max(2 * sync_steps, rounds * sync_steps)


def run_one(spes, a, shape, corpus, curve_val, method, variant, sync_steps, merge, decayed, extra_server, seed,
            peer_extra=()):
    peer_extra = list(peer_extra)
    rundir = os.path.join(a.out, "runs", f"{corpus['name']}_{method}_{variant}_s{seed}")
    shutil.rmtree(rundir, ignore_errors=True)
    os.makedirs(rundir)
    # Curves only for the main comparison (every few rounds); ablations are scored at the end.
    if variant == "main":
        every = max(sync_steps, (shape.steps // a.curve_points) // sync_steps * sync_steps)
    else:
        every = shape.steps
    ov = common_overrides(shape, corpus, curve_val, every, seed)
    t0 = time.monotonic()
    # --variant_central_batch: the variant's centralised run takes this many sequences a step (e.g. one
    # peer's 8: one peer training alone), so it sees that many tokens, not the others' P x B.
    central_batch = a.variant_central_batch if (variant == a.variant and method == "centralised") else None
    if method == "centralised":
        save = train_central(spes, shape, corpus["config"], ov + peer_extra, rundir, seed, central_batch)
    else:
        server_flags = []
        if method == "spes" and merge:
            server_flags += ["--merge_interval", str(merge_interval(shape.steps, sync_steps)), "--merge_alpha_start", str(MERGE_ALPHA),
                             "--merge_decay_steps", str(max(shape.steps // 2, 1)), "--merge_topk", str(MERGE_TOPK)]
        server_flags += extra_server   # after the merge flags: a variant may change them (the last one counts)
        peer_flags = [f"--spes_config.using_decayed_aux_loss={'true' if decayed else 'false'}"]
        # The peers state the outer optimizer they expect in Hello; the server refuses other values.
        for flag, key in (("--outer_lr", "outer_lr"), ("--outer_momentum", "outer_momentum")):
            if flag in extra_server:
                peer_flags.append(f"--spes_config.{key}={extra_server[extra_server.index(flag) + 1]}")
        peer_flags += peer_extra
        save = train_peers(spes, shape, corpus["config"], ov, rundir, seed, "spes" if method == "spes" else "fedavg",
                           sync_steps, server_flags, peer_flags)
    train_s = time.monotonic() - t0
    tokens_per_step = (central_batch or shape.peers * shape.batch) * SEQ   # every method, all peers together
    r = {"corpus": corpus["name"], "method": method, "variant": variant, "seed": seed, "steps": shape.steps,
         **({"batch": central_batch} if central_batch else {}),
         "sync_steps": sync_steps if method != "centralised" else None, "merge": merge, "decayed_aux": decayed,
         "server_flags": extra_server, "tokens": shape.steps * tokens_per_step, "train_seconds": round(train_s, 1),
         "curve": curve(os.path.join(save, "metrics.jsonl"), tokens_per_step)}
    if peer_extra:
        r["peer_flags"] = peer_extra
    if method == "spes" and merge:
        r["merge_interval"] = merge_interval(shape.steps, sync_steps)
        if "--merge_interval" in extra_server:
            r["merge_interval"] = int(extra_server[extra_server.index("--merge_interval") + 1])
    if method != "centralised":
        r.update(bytes_per_peer(rundir, shape.peers))
    r.update(score(spes, os.path.join(save, f"step{shape.steps}"), corpus, shape.eval_threads, rundir))
    # Checkpoints are large next to what the report needs; logs and metrics stay.
    for root, dirs, _ in os.walk(rundir):
        for d in list(dirs):
            if re.fullmatch(r"step\d+", d):
                shutil.rmtree(os.path.join(root, d))
                dirs.remove(d)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spes", required=True, help="the spes binary")
    ap.add_argument("--data", required=True, help="folder holding tinyshakespeare.txt ($SPES_TEST_DATA)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpora", default="demo,shakespeare")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the main comparison")
    ap.add_argument("--ablation_seeds", type=int, default=2,
                    help="seeds of each ablation (the first ones of the main runs, paired with them)")
    ap.add_argument("--steps", type=int, default=2000,
                    help="the demo's length (docs/quality.md keeps the 1000- and 300-step tables)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step on one peer")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--experts_per_peer", type=int, default=2,
                    help="experts each SPES peer trains; the model has peers x this many per layer")
    ap.add_argument("--experts", type=int, default=0,
                    help="experts per layer (default peers x experts_per_peer); fewer makes each expert's owners "
                         "several peers (replicas, docs/sync.md)")
    ap.add_argument("--sync_steps", type=int, default=10, help="the demo's (spes demo --sync_steps)")
    ap.add_argument("--sync_ablation", default="5,25")
    ap.add_argument("--before_sync", type=int, default=25, help="sync_steps of the 'before28' row (the old demo)")
    ap.add_argument("--threads_per_peer", type=int, default=0,
                    help="threads of each peer (default: spes demo's, max(1, cores / peers))")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of the centralised run (default: spes demo's baseline's, peers x threads_per_peer)")
    ap.add_argument("--train_docs", type=int, default=20000)
    ap.add_argument("--curve_points", type=int, default=6)
    ap.add_argument("--curve_val_tokens", type=int, default=16384)
    ap.add_argument("--no-ablations", dest="ablations", action="store_false")
    ap.add_argument("--only", default="",
                    help="comma list of variants to run (e.g. 'main,outer_nesterov'); default: every one")
    ap.add_argument("--methods", default="centralised,spes,fedavg",
                    help="which of the main comparison's methods run (an experiment may reuse another run's baseline)")
    ap.add_argument("--first_seed", type=int, default=0, help="skip the seeds below this one")
    ap.add_argument("--variant", default="", help="name of one more run (an experiment), with the flags below")
    ap.add_argument("--variant_method", default="spes", choices=("spes", "fedavg", "centralised"))
    ap.add_argument("--variant_sync", type=int, default=0, help="its sync_steps (default --sync_steps)")
    ap.add_argument("--variant_peer_flags", default="", help="config overrides for its trainers, e.g. "
                    "'--optimizer.learning_rate=6e-3'")
    ap.add_argument("--variant_server_flags", default="", help="flags for its server, e.g. '--outer_lr 1.5'")
    ap.add_argument("--variant_central_batch", type=int, default=0,
                    help="with --variant_method centralised: its sequences per step (default peers x batch); "
                    "e.g. --batch: one peer training alone")
    ap.add_argument("--variant_no_merge", dest="variant_merge", action="store_false")
    ap.add_argument("--outer_lr", type=float, default=0.7)
    ap.add_argument("--outer_momentum", type=float, default=0.9)
    a = ap.parse_args()
    # spes demo's thread counts (src/cli/demo.c): each peer cores / peers (at least 1), the
    # baseline the peers' together, the evaluation every core (the demo's own process). The same
    # counts, not only the same settings: OpenBLAS's sgemm can change its last bits with the
    # thread count (seen at 2 against 4 threads on an AMD EPYC), and then the demo's runs and
    # these are no longer the same runs.
    cores = len(os.sched_getaffinity(0))
    if a.threads_per_peer <= 0:
        a.threads_per_peer = max(1, cores // a.peers)
    if a.threads <= 0:
        a.threads = a.peers * a.threads_per_peer
    a.eval_threads = cores
    a.sync_ablation = [int(k) for k in a.sync_ablation.split(",") if k]
    a.methods = [m for m in a.methods.split(",") if m]
    for k in [a.sync_steps, a.before_sync] + a.sync_ablation + ([a.variant_sync] if a.variant_sync else []):
        if k <= 0 or a.steps % k:
            sys.exit(f"bench-quality: sync_steps {k} must divide steps {a.steps} (the final model is a synced one)")
    os.makedirs(a.out, exist_ok=True)
    data_dir = os.path.join(a.out, "data")
    os.makedirs(data_dir, exist_ok=True)
    shape = Shape(a)

    corpora = []
    experts = a.experts or a.peers * a.experts_per_peer   # per layer
    demo = prepare_demo(a.spes, data_dir, experts, a.experts_per_peer, a.train_docs)
    for name in a.corpora.split(","):
        if name == "demo":
            corpora.append(demo)
        elif name == "shakespeare":
            ts = prepare_shakespeare(a.spes, data_dir, os.path.join(a.data, "tinyshakespeare.txt"))
            ts["config"] = demo["config"]      # the demo's model and optimizer on Shakespeare bytes
            corpora.append(ts)
        else:
            sys.exit(f"bench-quality: unknown corpus '{name}' (demo, shakespeare)")

    help_text = subprocess.run([a.spes, "server", "--help"], capture_output=True, text=True).stdout
    has_outer = "--outer_lr" in help_text
    plan = variants(a, has_outer)
    if a.only:
        wanted = a.only.split(",")
        unknown = [w for w in wanted if w not in {v[1] for v in plan}]
        if unknown:
            sys.exit(f"bench-quality: --only: unknown variant(s) {','.join(unknown)}")
        plan = [v for v in plan if v[1] in wanted or v[1] == a.variant]
    tokens = a.steps * a.peers * a.batch * SEQ
    mains = sum(v[1] == "main" for v in plan)
    log(f"bench-quality: {len(corpora)} corpora x {a.seeds} seeds x {mains} methods, ablations {len(plan) - mains} x "
        f"{min(a.seeds, a.ablation_seeds)} seeds; {a.steps} steps, "
        f"{tokens} tokens per run ({a.peers} peers x {a.batch} x {SEQ} per step; centralised {a.peers * a.batch} x {SEQ})")
    if not has_outer:
        log("bench-quality: `spes server` has no --outer_lr: the outer-optimizer ablation is not run")
    results_path = os.path.join(a.out, "results.jsonl")
    with open(results_path + ".tmp", "w") as res:
        res.write(json.dumps({"meta": {"steps": a.steps, "batch": a.batch, "peers": a.peers, "experts_per_peer": a.experts_per_peer, "experts": experts, "seq": SEQ,
                                       "seeds": a.seeds, "ablation_seeds": min(a.seeds, a.ablation_seeds),
                                       "sync_steps": a.sync_steps, "tokens": tokens, "train_docs": a.train_docs,
                                       "threads": a.threads, "threads_per_peer": a.threads_per_peer,
                                       "outer_measured": has_outer,
                                       "merge": {"alpha": MERGE_ALPHA, "topk": MERGE_TOPK}}}) + "\n")
        t_all = time.monotonic()
        for corpus in corpora:
            cv = curve_val_file(corpus, data_dir, a.curve_val_tokens)
            for seed in range(a.seeds):
                for method, variant, k, merge, decayed, extra, *peer_extra in plan:
                    if variant != "main" and variant != a.variant and seed >= a.ablation_seeds:
                        continue
                    if seed < a.first_seed:
                        continue
                    r = run_one(a.spes, a, shape, corpus, cv, method, variant, k, merge, decayed, extra, seed,
                                peer_extra[0] if peer_extra else ())
                    res.write(json.dumps(r) + "\n")
                    res.flush()
                    accs = " ".join(f"{n}={r[n]:.3f}" for n in ("recall_acc", "arithmetic_acc") if n in r)
                    if "bytes_per_peer" in r:
                        accs += f" bytes/peer={r['bytes_per_peer'] / 1e6:.1f}MB rounds={r['rounds']}"
                    log(f"  {corpus['name']:11s} {method:11s} {variant:15s} seed {seed}: val_loss={r['val_loss']:.4f} "
                        f"{accs} ({r['train_seconds']:.0f}s, total {time.monotonic() - t_all:.0f}s)")
    os.replace(results_path + ".tmp", results_path)
    log(f"bench-quality: results in {results_path} ({time.monotonic() - t_all:.0f}s)")


if __name__ == "__main__":
    try:
        main()
    except RunFailed as e:
        sys.exit(f"bench-quality: {e}")
