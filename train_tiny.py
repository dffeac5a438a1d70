"""Train everything DFlash needs, end to end, on a CPU: tokenizer -> target -> generated data -> drafter.

    python train_tiny.py                 # the default run (minutes on 2 CPU cores: README), writes out/
    python train_tiny.py --no-sampling   # greedy decoding only: no sampling drafter, a few minutes less
    python train_tiny.py --full          # the longer recipe, for the best τ, writes out_full/
    python train_tiny.py --smoke         # the same pipeline at toy size, well under a minute, in out_smoke/
    python train_tiny.py --data input.txt --out out_shakespeare

Each stage writes its checkpoint atomically with a record of what made it (its flags, and hashes of the
corpus and checkpoints it was built on); a rerun skips a stage whose checkpoint exists with the same record,
and refuses one with another record, naming each difference (`--fresh` starts over). The run folder's
run.json remembers the corpus, so sample.py and the benchmark take their prompts from it. The target and
drafter stages also save their whole state every ~45 s and at Ctrl-C, SIGTERM or SIGHUP (out/*.pt.resume),
so an interrupted run resumes where it stopped and ends with the same weights; the data stage is short and
restarts. Then the step costs block_size="auto" weighs drafts by are timed once on this machine (costs.json).
At the end it prints a summary: losses, per-slot accuracy, τ at the drafter's block size on validation
prompts and the speedup of speculative over plain greedy decoding measured side by side, every greedy output
checked against plain greedy decoding, and τ by position on long generations.
"""

import os
import sys
import time
from typing import NamedTuple

import torch

from nanodflash.ext.plain_batch import generate_mix
from nanodflash.ext.step_costs import calibration, describe, prices_batches, use_table
from nanodflash.gpt import GPT, GPTConfig
from nanodflash.pipeline import flags, recipe
from nanodflash.pipeline.record import file_hash, reusable, stage_record
from nanodflash.pipeline.summary import Summary, record_headline
from nanodflash.store import checkpoint as ckpt
from nanodflash.store import run_folder
from nanodflash.store.data import check_enough, corpus_record, load_corpus, split_train_val, window_prompts
from nanodflash.store.resume import data_hash, resume_file
from nanodflash.store.tokenizer import load_tokenizer, special_ids, train_tokenizer
from nanodflash.tools import baselines
from nanodflash.tools.calibrate import MAX_THREADS, calibrate, run_text
from nanodflash.tools.cli import decode_threads
from nanodflash.tools.evaluate import measure_tau, slot_accuracy
from nanodflash.train import DraftTraining, train_drafter, train_target

# The recipe, every flag's default with the --full and --smoke presets, is nanodflash/pipeline/recipe.py.


class Split(NamedTuple):
    """The corpus' token ids: the target trains on `train`; evaluations and prompts come from `val`."""
    train: torch.Tensor
    val: torch.Tensor


class Generation(NamedTuple):
    """One part of data.pt: prompts from `source`, each continued by the target."""
    source: torch.Tensor      # token ids the prompts are cut from
    n_seqs: int               # sequences
    gen_len: int              # tokens the target generates per sequence
    seed: int                 # picks the prompts and seeds the sampled continuations
    greedy_frac: float        # share of the continuations that are greedy
    temperature: float        # temperature of the others


def run_paths(args):
    """The paths of the run folder's files, by stage (the folder made if need be). --fresh first removes
    them, their resume files, and the baselines trained on the old target (nanodflash.tools.baselines)."""
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise FileNotFoundError(f"--out {args.out} is a file, not a run folder")
    os.makedirs(args.out, exist_ok=True)
    path = {k: os.path.join(args.out, f) for k, f in
            dict(run=run_folder.RUN, tok=run_folder.TOKENIZER, target=run_folder.TARGET, data=run_folder.DATA,
                 drafter=run_folder.DRAFTER, sampled=run_folder.SAMPLED_DATA,
                 sampling=run_folder.SAMPLING_DRAFTER).items()}
    if args.fresh:
        for f in [*path.values(), *(os.path.join(args.out, b) for b in (baselines.AR, baselines.NOFEAT))]:
            if os.path.exists(f):
                os.remove(f)
        for f in [path["target"], path["drafter"], path["sampling"],
                  *(os.path.join(args.out, b) for _, b in baselines.KINDS.values())]:
            ckpt.discard_resume(f)       # the state of stages interrupted mid-way
    return path


def tokenizer_stage(args, path, text, corpus):
    """1. The BPE tokenizer; run.json holds its record and the corpus. -> tokenizer, the corpus' ids split."""
    run = {"corpus": corpus, "made_by": stage_record("tokenizer", args, corpus=corpus["sha256"])}
    if reusable("tokenizer", path["tok"], run_folder.read_run(args.out), run["made_by"]):
        tok = load_tokenizer(path["tok"])
    else:
        t0 = time.perf_counter()
        tok = train_tokenizer(text, args.vocab_size, path["tok"])
        run_folder.write_run(args.out, run)
        print(f"[tokenizer] {tok.n_vocab} tokens trained in {time.perf_counter() - t0:.1f}s -> {path['tok']}")
    ids = torch.tensor(tok.encode_ordinary(text), dtype=torch.long)
    split = Split(*split_train_val(ids))
    check_enough(split.train, args.seq_len, "train")
    check_enough(split.val, args.seq_len, "validation")
    print(f"[data] corpus {len(text):,} chars -> {ids.numel():,} tokens ({split.train.numel():,} train, "
          f"{split.val.numel():,} val)")
    return tok, split


def target_stage(args, path, tok, split, corpus):
    """2. The target, trained on the train split. -> target (in eval mode), its training history."""
    made_by = stage_record("target", args, corpus=corpus["sha256"], tokenizer=file_hash(path["tok"]))
    found = os.path.exists(path["target"])
    target, ck = ckpt.load_target(path["target"], args.device) if found else (None, {})
    if reusable("target", path["target"], ck, made_by):
        hist = ck["history"]
    else:
        cfg = GPTConfig(vocab_size=tok.n_vocab, n_layer=args.n_layer, n_head=args.n_head,
                        n_kv_head=args.n_head, n_embd=args.n_embd, mlp_hidden=3 * args.n_embd,
                        max_seq_len=flags.context_window(args.seq_len))
        target = GPT(cfg).to(args.device)
        print(f"[target] {sum(p.numel() for p in target.parameters()) / 1e6:.2f}M parameters: {cfg}")
        hist = train_target(target, split.train, split.val, args.target_steps, args.target_batch,
                            args.seq_len, args.target_lr, eval_every=max(1, args.target_steps // 5),
                            seed=args.seed, resume=resume_file(ckpt.resume_path(path["target"])))
        ckpt.save_target(path["target"], target, path["tok"], hist, made_by)
    return target.eval(), hist


def data_stage(args, path, target, split, corpus):
    """3. The drafter's data: the target's continuations of prompts from the train split (short ones, and long
    ones) and held-out ones from the val split. -> data.pt's dict, a hash of its sequences."""
    T, frac = args.gen_temperature, args.gen_greedy_frac
    parts = {"train": Generation(split.train, args.n_seqs, args.gen_len, args.seed, frac, T),
             "val": Generation(split.val, max(4, args.n_seqs // 16), args.gen_len, args.seed + 1, frac, T)}
    if args.long_seqs:                   # greedy: sampled long sequences cost late greedy τ
        parts["train_long"] = Generation(split.train, args.long_seqs, args.long_gen_len, args.seed + 3,
                                         greedy_frac=1.0, temperature=T)
    made_by = stage_record("data", args, parts=sorted(parts), corpus=corpus["sha256"],
                           target=ckpt.fingerprint(target))
    data = ckpt.read(path["data"], "generated data") if os.path.exists(path["data"]) else None
    if not reusable("data", path["data"], data, made_by):
        t0 = time.perf_counter()
        data = {"prompt_len": args.prompt_len, "gen_temperature": T, "gen_greedy_frac": frac}
        for k, g in parts.items():
            data[k] = generate_mix(target, g.source, g.n_seqs, g.greedy_frac, g.seed, dict(
                prompt_len=args.prompt_len, gen_len=g.gen_len, temperature=g.temperature,
                batch_size=args.gen_batch))
        n_tok = sum(data[k].numel() for k in parts)
        print(f"[data] generated {n_tok:,} tokens ({', '.join(parts)}) in {time.perf_counter() - t0:.1f}s -> "
              f"{path['data']}")
        ckpt.atomic_save({**data, "made_by": made_by}, path["data"])
    return data, data_hash(*(data[k] for k in sorted(parts)))


def drafter_stage(args, path, target, data, data_id, prompts, mask_id):
    """4. The drafter, trained on the target's continuations; evaluated on held-out data and `prompts`
    (recipe.DRAFT_EVALS times) as it trains. -> drafter, its training history."""
    made_by = stage_record("drafter", args, target=ckpt.fingerprint(target), data=data_id)
    ck = ckpt.read(path["drafter"], "drafter") if os.path.exists(path["drafter"]) else {}
    if reusable("drafter", path["drafter"], ck, made_by):
        drafter, ck = ckpt.load_drafter(path["drafter"], target, args.device)
        return drafter, ck["history"]
    cls = ckpt.DRAFTER_KINDS[args.drafter]
    extra = {} if args.drafter == "dflash" else dict(selector_top_k=args.selector_top_k,
                                                     conv_kernel_size=args.conv_kernel_size,
                                                     selector_rank=args.selector_rank)
    dcfg = cls.config_class.for_target(target.config, mask_id, n_layer=args.draft_layers,
                                       block_size=args.block_size, **extra)
    if args.target_layer_ids:
        dcfg.target_layer_ids = flags.parse_layer_ids(args.target_layer_ids, target.config.n_layer)
    drafter = cls(dcfg, target).to(args.device)
    print(f"[drafter] {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters: {dcfg}")
    min_anchor = data["prompt_len"] - 1           # blocks predict target-generated tokens only

    def eval_fn(d):
        acc = slot_accuracy(d, data["val"], min_anchor=min_anchor)
        slots = {f"acc{k + 1}": a for k, a in enumerate(acc["slot_acc"][:3])}    # held-out per-slot accuracy
        tau = measure_tau(d, prompts[:4], args.eval_new_tokens)
        return {**slots, "expected_tau": acc["expected_tau"], "tau": tau}
    how = DraftTraining(steps=args.draft_steps, batch_size=args.draft_batch, n_anchors=args.draft_anchors,
                        lr=args.draft_lr, min_anchor=min_anchor, gamma=args.gamma, seed=args.seed,
                        soft_weight=args.soft_weight, long_batch=args.long_batch,
                        long_anchors=args.long_anchors,
                        eval_every=max(1, args.draft_steps // recipe.DRAFT_EVALS))
    long_seqs = data.get("train_long") if args.long_seqs else None
    hist = train_drafter(drafter, data["train"], how, long_seqs=long_seqs, eval_fn=eval_fn,
                         resume=resume_file(ckpt.resume_path(path["drafter"])))
    ckpt.save_drafter(path["drafter"], drafter, hist, made_by)
    return drafter, hist


def sampling_stage(args, path, target, drafter, split, corpus):
    """4b. Unless --no-sampling: sampled continuations (data_sampled.pt), then the drafter fine-tuned on them
    (drafter_sampling.pt), its own stage so that greedy-only runs never pay for it. Each is reused when its
    record matches, like every stage. -> the sampling drafter."""
    made_by = stage_record("sampled data", args, corpus=corpus["sha256"], target=ckpt.fingerprint(target))
    data = ckpt.read(path["sampled"], "sampled data") if os.path.exists(path["sampled"]) else None
    if not reusable("sampled data", path["sampled"], data, made_by):
        t0 = time.perf_counter()
        seqs = generate_mix(target, split.train, args.sampling_seqs, 0.0, args.seed + 5, dict(
            prompt_len=args.prompt_len, gen_len=args.gen_len, temperature=args.sampling_temperature,
            batch_size=args.gen_batch))
        data = {"prompt_len": args.prompt_len, "train_sampled": seqs, "made_by": made_by}
        print(f"[sampled data] generated {seqs.numel():,} tokens at T={args.sampling_temperature} in "
              f"{time.perf_counter() - t0:.1f}s -> {path['sampled']}")
        ckpt.atomic_save(data, path["sampled"])
    made_by = stage_record("sampling drafter", args,
                           drafter=data_hash(*ckpt.qwen3_state_dict(drafter).values()),
                           data=data_hash(data["train_sampled"]))
    ck = ckpt.read(path["sampling"], "sampling drafter") if os.path.exists(path["sampling"]) else {}
    if reusable("sampling drafter", path["sampling"], ck, made_by):
        return ckpt.load_drafter(path["sampling"], target, args.device)[0]
    sampler = type(drafter)(drafter.config, target).to(args.device)
    sampler.load_state_dict(drafter.state_dict())
    how = DraftTraining(steps=args.sampling_steps, batch_size=args.draft_batch, n_anchors=args.draft_anchors,
                        lr=args.sampling_lr, min_anchor=data["prompt_len"] - 1, gamma=args.gamma,
                        seed=args.seed + 5, soft_weight=1.0, log_name="sampling drafter")
    hist = train_drafter(sampler, data["train_sampled"], how,
                         resume=resume_file(ckpt.resume_path(path["sampling"])))
    ckpt.save_drafter(path["sampling"], sampler, hist, made_by)
    return sampler


def calibrate_stage(args, target, drafter, sampler, tok):
    """4c. The thread counts to decode with and the step costs block_size="auto" weighs drafts by, timed on
    this machine into costs.json (nanodflash/tools/calibrate.py); kept while the machine (its key but the
    thread count, which the calibration chooses) and the target it timed stay the same, and while it prices
    batches (step_costs.prices_batches). -> the seconds it took (0 when kept or skipped)."""
    use_table(drafter, run_folder.read_costs(args.out))
    kept = calibration(drafter)
    if args.calibrate_calls == 0 or (kept is not None and kept.get("target") == ckpt.fingerprint(target)
                                     and prices_batches(kept)):
        print(f"[calibrate] {'skipped (--calibrate_calls 0)' if kept is None else 'found a table, skipping'}")
        seconds = 0.0
    else:
        entry = calibrate(target, drafter, args.calibrate_calls, text=run_text(tok, args.out),
                          max_threads=1 if args.smoke else MAX_THREADS)     # toy models: one thread
        print(f"[calibrate] {describe(entry['key'])}: {entry['seconds']:.0f}s -> "
              f"{run_folder.write_costs(args.out, entry)}")
        seconds = entry["seconds"]
    for d in (drafter, sampler):
        if d is not None:
            use_table(d, run_folder.read_costs(args.out))
    return seconds


def summary_stage(args, target, drafter, sampler, data, prompts, target_hist, draft_hist, calibrated):
    """5. The summary (nanodflash/pipeline/summary.py), plain and speculative decoding each at the thread
    count the calibration chose (cli.decode_threads); its headline (greedy and sampled τ, repetition,
    speedup) goes into run.json, where sample.py reads it."""
    threads = decode_threads(drafter)
    if run_folder.is_toy_run(args.out):
        print("\n" + run_folder.TOY_RUN)
    rows = Summary(target=target, drafter=drafter, data=data, prompts=prompts,
                   new_tokens=args.eval_new_tokens, long_tokens=args.eval_long_tokens,
                   long_prompts=args.eval_long_prompts,
                   target_hist=target_hist, draft_hist=draft_hist, threads=threads,
                   calibrate_seconds=calibrated,
                   sampler=sampler).print()
    record_headline(args.out, rows)


def parse_args(argv=None):
    """The flags (nanodflash/pipeline/flags.py), with this file's docstring as their --help."""
    return flags.parse_args(argv, description=__doc__)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        torch.set_num_threads(1)         # toy models: thread sync costs more than it saves
    torch.manual_seed(args.seed)
    path = run_paths(args)
    t_start = time.perf_counter()
    text = load_corpus(args.data)
    corpus = corpus_record(args.data, text)

    tok, split = tokenizer_stage(args, path, text, corpus)
    target, target_hist = target_stage(args, path, tok, split, corpus)
    data, data_id = data_stage(args, path, target, split, corpus)
    prompts = window_prompts(split.val, args.eval_prompts, args.prompt_len, args.seed + 2)
    drafter, draft_hist = drafter_stage(args, path, target, data, data_id, prompts, special_ids(tok)[1])
    sampler = sampling_stage(args, path, target, drafter, split, corpus) if args.sampling else None
    calibrated = calibrate_stage(args, target, drafter, sampler, tok)
    summary_stage(args, target, drafter, sampler, data, prompts, target_hist, draft_hist, calibrated)

    print(f"total wall time {time.perf_counter() - t_start:.0f}s; checkpoints in {args.out}/")
    out = "" if args.out == recipe.OUT else f" --out {args.out}"
    more = "" if args.sampling else (" | python train_tiny.py (without --no-sampling: adds a drafter tuned "
                                     "for sampled decoding; the run's other flags too)")
    print(f"next: python sample.py{out} | python -m nanodflash.tools.bench --out {args.out} (τ at every "
          "block size, sampling, baselines)" + more)


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
