"""Train everything DFlash needs, end to end, on a CPU: tokenizer -> target -> generated data -> drafter.

    python train_tiny.py                 # the default run (minutes on 2 CPU cores: README), writes out/
    python train_tiny.py --sampling      # then add the sampling drafter, for sampled decoding
    python train_tiny.py --full          # the longer recipe, for the best τ, writes out_full/
    python train_tiny.py --smoke         # the same pipeline at toy size, well under a minute, writes out_smoke/
    python train_tiny.py --data input.txt --out out_shakespeare

Each stage writes its checkpoint atomically with a record of what made it (its flags, and hashes of the
corpus and checkpoints it was built on); a rerun skips a stage whose checkpoint exists with the same record,
and refuses one with another record, naming each difference (`--fresh` starts over). The run folder's
run.json remembers the corpus, so sample.py and the benchmark take their prompts from it. The target and
drafter stages also save their whole state every ~45 s and at Ctrl-C, SIGTERM or SIGHUP (out/*.pt.resume),
so an interrupted run resumes where it stopped and ends with the same weights; the data stage is short and
restarts.
At the end it prints a summary: losses, per-slot accuracy, τ at the drafter's block size on validation
prompts and the speedup of speculative over plain greedy decoding measured side by side, every greedy output
checked against plain greedy decoding, and τ by position on long generations.
"""

import os
import sys
import time

import torch

from nanodflash import checkpoint as ckpt
from nanodflash.tools import baselines
from nanodflash.tools.run_record import file_hash, reusable, stage_record
from nanodflash.tools.cli import DECODE_THREADS
from nanodflash.data import check_enough, corpus_record, load_corpus, split_train_val, window_prompts
from nanodflash.gpt import GPT, GPTConfig
from nanodflash.resume import data_hash
from nanodflash.tools import pipeline_flags
from nanodflash.tools.pipeline_flags import context_window, parse_layer_ids
from nanodflash.tokenizer import load_tokenizer, special_ids, train_tokenizer
from nanodflash.train import train_target
from nanodflash.tools.summary import print_summary
from nanodflash.train_drafter import generate_mix, measure_tau, slot_accuracy, train_drafter

# ----------------------------------------------------------------------------- defaults
OUT = "out"              # run folder of a default run (--full: FULL_OUT, --smoke: SMOKE_OUT)
FULL_OUT = "out_full"    # run folder of a --full run
SMOKE_OUT = "out_smoke"  # run folder of a --smoke run, never out/: toy checkpoints must not stand in for real ones
VOCAB_SIZE = 1024        # BPE vocabulary, including <|endoftext|> and <|mask|>
# target
N_LAYER, N_EMBD, N_HEAD = 12, 128, 4   # deep, narrow: verifying a block costs little more than one forward
SEQ_LEN = 128            # training window of the target
TARGET_STEPS, TARGET_BATCH, TARGET_LR = 480, 8, 2e-3   # val loss 3.85 (550 steps: 3.64, 400: 4.09; docs/experiments.md)
# target-generated data for the drafter
N_SEQS, PROMPT_LEN, GEN_LEN = 1024, 16, 96   # short sequences: corpus prompt + the target's continuation
LONG_SEQS, LONG_GEN_LEN = 96, 480    # long ones (0 = none), so the drafter also learns late positions
GEN_TEMPERATURE = 0.7    # 0 = greedy continuations only; >0: some short ones sampled at it, as users sample
GEN_GREEDY_FRAC = 0.75   # share of the short continuations kept greedy: sampled τ up, greedy τ nearly unchanged
SOFT_WEIGHT = 0.5        # drafter loss = (1-w) CE(data token) + w CE(target distribution) (distill.py): raises sampled τ
GEN_BATCH = 256          # sequences generated in parallel (one KV cache per batch)
# drafter
DRAFTER = "dflash2"      # dflash2: DFlash + in-block convolutions and a top-K candidate selector; dflash: DFlash 1
DRAFT_LAYERS, BLOCK_SIZE = 2, 16
SELECTOR_TOP_K, SELECTOR_RANK, CONV_KERNEL = 16, 64, 2   # DFlash 2 only (docs/design.md)
TARGET_LAYER_IDS = "1,5,9"     # target layers feeding the drafter: the paper's spread over 1..L-3; "" = the rule itself
DRAFT_STEPS, DRAFT_BATCH, DRAFT_ANCHORS, DRAFT_LR = 180, 48, 4, 3e-3   # few anchors: the mask grows with their square
DRAFT_EVALS = 2          # held-out evaluations (per-slot accuracy, τ) while the drafter trains: halfway and at the end
LONG_BATCH, LONG_ANCHORS = 4, 16   # long sequences per drafter step, and blocks from each
GAMMA = 2.0              # loss decay exp(-(k-1)/gamma); the paper's 7 suits big drafters, 2 learns faster here
# sampling drafter: the drafter tuned to the target's distribution on sampled continuations, used when sampling
SAMPLING_STEPS, SAMPLING_SEQS, SAMPLING_LR = 600, 3072, 1e-3   # made by --sampling only (else sampling uses drafter.pt)
SAMPLING_TEMPERATURE = 0.7   # its continuations are sampled at this temperature (as people sample)
# summary
EVAL_PROMPTS, EVAL_NEW_TOKENS = 64, 96   # enough prompts for a τ that holds from machine to machine
EVAL_LONG_PROMPTS, EVAL_LONG_TOKENS = 3, 480   # long generations: τ by position band, speedup (0 tokens = skip)
SEED = 1337

# --full: the longer recipe, a deeper, better-trained target and drafter for more minutes (docs/experiments.md);
# each flag left at its default takes the value here
FULL = dict(n_layer=24, target_layer_ids="1,11,21", target_steps=700, target_batch=16, n_seqs=3072, long_seqs=347,
            draft_steps=2000, eval_long_prompts=16)

# --smoke: the same pipeline at toy sizes (each flag left at its default takes the value here)
SMOKE = dict(vocab_size=300, n_layer=2, n_embd=32, n_head=2, seq_len=64, target_steps=30, target_batch=8,
             n_seqs=32, prompt_len=8, gen_len=40, draft_steps=30, draft_batch=4, draft_anchors=4, target_layer_ids="",
             block_size=8, sampling_steps=20, sampling_seqs=16, eval_prompts=3, eval_new_tokens=24, long_seqs=8,
             long_gen_len=56, long_batch=2, long_anchors=4, eval_long_prompts=2, eval_long_tokens=56)


def parse_args(argv=None):
    """The flags (nanodflash/tools/pipeline_flags.py), with this file's constants as their defaults."""
    return pipeline_flags.parse_args(argv, sys.modules[__name__])


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        torch.set_num_threads(1)         # toy models: thread sync costs more than it saves
    torch.manual_seed(args.seed)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise FileNotFoundError(f"--out {args.out} is a file, not a run folder")
    os.makedirs(args.out, exist_ok=True)
    path = {k: os.path.join(args.out, f) for k, f in
            dict(run=ckpt.RUN, tok=ckpt.TOKENIZER, target=ckpt.TARGET, data=ckpt.DATA, drafter=ckpt.DRAFTER,
                 sampled=ckpt.SAMPLED_DATA, sampling=ckpt.SAMPLING_DRAFTER).items()}
    if args.fresh:                       # also the baselines trained on the old target (nanodflash.tools.baselines)
        for f in [*path.values(), *(os.path.join(args.out, b) for b in (baselines.AR, baselines.NOFEAT))]:
            if os.path.exists(f):
                os.remove(f)
        for f in [path["target"], path["drafter"], path["sampling"],
                  *(os.path.join(args.out, b) for _, b in baselines.KINDS.values())]:
            ckpt.discard_resume(f)       # the state of stages interrupted mid-way
    t_start = time.perf_counter()
    text = load_corpus(args.data)
    corpus = corpus_record(args.data, text)

    # 1. tokenizer; run.json holds its record and the corpus
    run = {"corpus": corpus, "made_by": stage_record("tokenizer", args, corpus=corpus["sha256"])}
    saved = ckpt.read_run(args.out)
    if reusable("tokenizer", path["tok"], saved, run["made_by"]):
        tok = load_tokenizer(path["tok"])
    else:
        t0 = time.perf_counter()
        tok = train_tokenizer(text, args.vocab_size, path["tok"])
        ckpt.write_run(args.out, run)
        print(f"[tokenizer] {tok.n_vocab} tokens trained in {time.perf_counter() - t0:.1f}s -> {path['tok']}")
    ids = torch.tensor(tok.encode_ordinary(text), dtype=torch.long)
    train_ids, val_ids = split_train_val(ids)
    check_enough(train_ids, args.seq_len, "train")
    check_enough(val_ids, args.seq_len, "validation")
    print(f"[data] corpus {len(text):,} chars -> {ids.numel():,} tokens ({train_ids.numel():,} train, {val_ids.numel():,} val)")
    _, mask_id = special_ids(tok)

    # 2. target
    made_by = stage_record("target", args, corpus=corpus["sha256"], tokenizer=file_hash(path["tok"]))
    target, ck = ckpt.load_target(path["target"], args.device) if os.path.exists(path["target"]) else (None, {})
    if reusable("target", path["target"], ck, made_by):
        target_hist = ck["history"]
    else:
        cfg = GPTConfig(vocab_size=tok.n_vocab, n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_head,
                        n_embd=args.n_embd, mlp_hidden=3 * args.n_embd, max_seq_len=context_window(args.seq_len))
        target = GPT(cfg).to(args.device)
        print(f"[target] {sum(p.numel() for p in target.parameters()) / 1e6:.2f}M parameters: {cfg}")
        target_hist = train_target(target, train_ids, val_ids, args.target_steps, args.target_batch, args.seq_len,
                                   args.target_lr, eval_every=max(1, args.target_steps // 5), seed=args.seed,
                                   resume=ckpt.resume_path(path["target"]))
        ckpt.save_target(path["target"], target, path["tok"], target_hist, made_by)
    target.eval()

    # 3. target-generated data: continuations of prompts from the train split (short, and long ones) and held-out
    #    ones from the val split
    T = args.gen_temperature
    parts = {"train": (train_ids, args.n_seqs, args.gen_len, args.seed, args.gen_greedy_frac, T),
             "val": (val_ids, max(4, args.n_seqs // 16), args.gen_len, args.seed + 1, args.gen_greedy_frac, T)}
    if args.long_seqs:                   # greedy: sampled long sequences cost late greedy τ
        parts["train_long"] = (train_ids, args.long_seqs, args.long_gen_len, args.seed + 3, 1.0, T)
    made_by = stage_record("data", args, parts=sorted(parts), corpus=corpus["sha256"], target=target.fingerprint())
    data = ckpt.read(path["data"], "generated data") if os.path.exists(path["data"]) else None
    if not reusable("data", path["data"], data, made_by):
        t0 = time.perf_counter()
        data = {"prompt_len": args.prompt_len, "gen_temperature": args.gen_temperature,
                "gen_greedy_frac": args.gen_greedy_frac}
        for k, (source, n, gen_len, seed, greedy_frac, temperature) in parts.items():
            data[k] = generate_mix(target, source, n, greedy_frac, seed, dict(
                prompt_len=args.prompt_len, gen_len=gen_len, temperature=temperature, batch_size=args.gen_batch))
        n_tok = sum(data[k].numel() for k in parts)
        print(f"[data] generated {n_tok:,} tokens ({', '.join(parts)}) in {time.perf_counter() - t0:.1f}s -> {path['data']}")
        ckpt.atomic_save({**data, "made_by": made_by}, path["data"])
    data_id = data_hash(*(data[k] for k in sorted(parts)))

    # 4. drafter
    prompts = window_prompts(val_ids, args.eval_prompts, args.prompt_len, args.seed + 2)
    made_by = stage_record("drafter", args, target=target.fingerprint(), data=data_id)
    ck = ckpt.read(path["drafter"], "drafter") if os.path.exists(path["drafter"]) else {}
    if reusable("drafter", path["drafter"], ck, made_by):
        drafter, ck = ckpt.load_drafter(path["drafter"], target, args.device)
        draft_hist = ck["history"]
    else:
        cls = ckpt.DRAFTER_KINDS[args.drafter]
        extra = {} if args.drafter == "dflash" else dict(selector_top_k=args.selector_top_k, conv_kernel_size=
                                                        args.conv_kernel_size, selector_rank=args.selector_rank)
        dcfg = cls.config_class.for_target(target.config, mask_id, n_layer=args.draft_layers, block_size=args.block_size,
                                           **extra)
        if args.target_layer_ids:
            dcfg.target_layer_ids = parse_layer_ids(args.target_layer_ids, target.config.n_layer)
        drafter = cls(dcfg, target).to(args.device)
        print(f"[drafter] {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters: {dcfg}")
        min_anchor = data["prompt_len"] - 1           # blocks predict target-generated tokens only

        def eval_fn(d):
            acc = slot_accuracy(d, data["val"], min_anchor=min_anchor)
            slots = {f"acc{k + 1}": a for k, a in enumerate(acc["slot_acc"][:3])}       # held-out per-slot accuracy
            return {**slots, "expected_tau": acc["expected_tau"], "tau": measure_tau(d, prompts[:4], args.eval_new_tokens)}
        draft_hist = train_drafter(drafter, data["train"], args.draft_steps, args.draft_batch, args.draft_anchors,
                                   args.draft_lr, min_anchor=min_anchor, gamma=args.gamma, seed=args.seed,
                                   eval_fn=eval_fn, eval_every=max(1, args.draft_steps // DRAFT_EVALS),
                                   resume=ckpt.resume_path(path["drafter"]), soft_weight=args.soft_weight,
                                   long_seqs=data.get("train_long") if args.long_seqs else None,
                                   long_batch=args.long_batch, long_anchors=args.long_anchors)
        ckpt.save_drafter(path["drafter"], drafter, draft_hist, made_by)

    # 4b. with --sampling: the sampling drafter, a copy of the drafter tuned to the target's distribution on
    #     sampled continuations (data_sampled.pt), its own stage so that greedy-only runs never pay for it
    sampler = sampling_stage(args, path, target, drafter, train_ids, corpus) if args.sampling else None

    # 5. summary
    torch.set_num_threads(DECODE_THREADS)
    if ckpt.is_toy_run(args.out):
        print("\n" + ckpt.TOY_RUN)
    print_summary(target, drafter, data, prompts, args.eval_new_tokens, args.eval_long_tokens,
                  args.eval_long_prompts, target_hist, draft_hist, DECODE_THREADS, sampler)
    print(f"total wall time {time.perf_counter() - t_start:.0f}s; checkpoints in {args.out}/")
    out = "" if args.out == OUT else f" --out {args.out}"
    print(f"next: python sample.py{out} | python -m nanodflash.tools.bench --out {args.out} (τ at every block size, "
          "sampling, baselines)" + ("" if args.sampling else " | python train_tiny.py --sampling (a drafter tuned "
                                    "for sampled decoding; the run's other flags too)"))


def sampling_stage(args, path, target, drafter, train_ids, corpus):
    """Sampled continuations (data_sampled.pt), then the drafter fine-tuned on them (drafter_sampling.pt); each
    reused when its record matches, like every stage."""
    made_by = stage_record("sampled data", args, corpus=corpus["sha256"], target=target.fingerprint())
    data = ckpt.read(path["sampled"], "sampled data") if os.path.exists(path["sampled"]) else None
    if not reusable("sampled data", path["sampled"], data, made_by):
        t0 = time.perf_counter()
        seqs = generate_mix(target, train_ids, args.sampling_seqs, 0.0, args.seed + 5, dict(
            prompt_len=args.prompt_len, gen_len=args.gen_len, temperature=args.sampling_temperature,
            batch_size=args.gen_batch))
        data = {"prompt_len": args.prompt_len, "train_sampled": seqs, "made_by": made_by}
        print(f"[sampled data] generated {seqs.numel():,} tokens at T={args.sampling_temperature} in "
              f"{time.perf_counter() - t0:.1f}s -> {path['sampled']}")
        ckpt.atomic_save(data, path["sampled"])
    made_by = stage_record("sampling drafter", args, drafter=data_hash(*drafter.state_dict().values()),
                           data=data_hash(data["train_sampled"]))
    ck = ckpt.read(path["sampling"], "sampling drafter") if os.path.exists(path["sampling"]) else {}
    if reusable("sampling drafter", path["sampling"], ck, made_by):
        return ckpt.load_drafter(path["sampling"], target, args.device)[0]
    sampler = type(drafter)(drafter.config, target).to(args.device)
    sampler.load_state_dict(drafter.state_dict())
    hist = train_drafter(sampler, data["train_sampled"], args.sampling_steps, args.draft_batch, args.draft_anchors,
                         args.sampling_lr, min_anchor=data["prompt_len"] - 1, gamma=args.gamma, seed=args.seed + 5,
                         resume=ckpt.resume_path(path["sampling"]), soft_weight=1.0, log_name="sampling drafter")
    ckpt.save_drafter(path["sampling"], sampler, hist, made_by)
    return sampler


def cli(argv=None):
    """main() with clear one-line errors instead of stack traces, and a resume hint on Ctrl-C."""
    try:
        main(argv)
    except KeyboardInterrupt:
        print("\ninterrupted: finished stages are saved, and the stage in progress as of its last step; "
              "rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
