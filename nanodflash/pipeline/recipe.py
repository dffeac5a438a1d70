"""train_tiny.py's recipe: every flag, once: its default, its allowed range and what it does; and the --full
and --smoke presets.

    python train_tiny.py --help                   # every flag, with these descriptions and defaults
    from nanodflash.pipeline import recipe        # e.g. recipe.GAMMA.default in a notebook

Each flag is a constant of its own, a `Flag(name, default, check, help)` record (recipe.GAMMA.default is the
default gamma); `flags()` gathers them for flags.py, in --help's order. A flag given on the command line wins
over its default and over a preset.
"""

from dataclasses import dataclass

from ..store.checkpoint import DRAFTER_KINDS
from ..tools.cli import MAX_COUNT, MAX_SEED, floats, ints
from ..tools.step_timing import N_CALLS


@dataclass(frozen=True)
class Flag:
    name: str                     # --name on the command line
    default: object
    check: object                 # argparse type= (tools/cli.py): refuses a value out of range; None: text
    help: str
    choices: tuple = None


def flags():
    """{name: Flag} of every flag below, in the order they are defined (--help's)."""
    return {f.name: f for f in globals().values() if isinstance(f, Flag)}


# ----------------------------------------------------------------------------- run folders and tokenizer
OUT = "out"              # run folder of a default run
FULL_OUT = "out_full"    # run folder of a --full run
SMOKE_OUT = "out_smoke"  # run folder of a --smoke run: toy checkpoints must never stand in for out/'s
SEED = Flag("seed", 1337, ints(0, MAX_SEED), "random seed; seeds every stage")
VOCAB_SIZE = Flag("vocab_size", 1024, ints(258, 65536), "BPE vocabulary size, <|endoftext|> and <|mask|> "
                  "included")

# ----------------------------------------------------------------------------- target
N_LAYER = Flag("n_layer", 12, ints(1, 64), "target depth: deep and narrow, so verifying a block costs about "
               "one forward")
N_EMBD = Flag("n_embd", 128, ints(2, 4096), "target width (the drafter shares it)")
N_HEAD = Flag("n_head", 4, ints(1, 2048), "attention heads of target and drafter; must divide --n_embd into "
              "an even head size")
SEQ_LEN = Flag("seq_len", 128, ints(2, 4096), "target training window in tokens")
TARGET_STEPS = Flag("target_steps", 480, ints(1, MAX_COUNT), "target optimisation steps")
TARGET_BATCH = Flag("target_batch", 8, ints(1, 4096), "sequences per target step")
TARGET_LR = Flag("target_lr", 2e-3, floats(0, 1, low_open=True), "target peak learning rate")

# ----------------------------------------------------------------------------- target-generated data
N_SEQS = Flag("n_seqs", 1024, ints(1, MAX_COUNT), "short sequences for the drafter: a corpus prompt + the "
              "target's continuation")
PROMPT_LEN = Flag("prompt_len", 16, ints(1, 4096), "corpus tokens per prompt")
GEN_LEN = Flag("gen_len", 96, ints(1, 4096), "tokens the target generates per short sequence")
LONG_SEQS = Flag("long_seqs", 96, ints(0, MAX_COUNT), "long target-generated sequences (0 = none), so the "
                 "drafter also learns late positions")
LONG_GEN_LEN = Flag("long_gen_len", 480, ints(1, 4096), "tokens the target generates per long sequence")
GEN_TEMPERATURE = Flag("gen_temperature", 0.7, floats(0), "0 = greedy continuations only; > 0: some short "
                       "ones sampled at this temperature, as users sample")
GEN_GREEDY_FRAC = Flag("gen_greedy_frac", 0.75, floats(0, 1), "with --gen_temperature > 0: the share of "
                       "short continuations kept greedy (sampled τ up, greedy τ about the same); long ones "
                       "are always greedy")
GEN_BATCH = Flag("gen_batch", 256, ints(1, 4096), "sequences generated in parallel (one KV cache per batch)")

# ----------------------------------------------------------------------------- drafter
DRAFTER = Flag("drafter", "dflash2", None, "dflash2: DFlash + in-block convolutions and a top-K selector; "
               "dflash: DFlash 1", choices=tuple(sorted(DRAFTER_KINDS)))
DRAFT_LAYERS = Flag("draft_layers", 2, ints(1, 64), "drafter depth")
BLOCK_SIZE = Flag("block_size", 16, ints(2, 256), "draft block B: the anchor + B-1 masked slots, drafted in "
                  "one pass")
SELECTOR_TOP_K = Flag("selector_top_k", 16, ints(1, 1024), "DFlash 2: candidates per slot its selector "
                      "chooses among (docs/design.md)")
SELECTOR_RANK = Flag("selector_rank", 64, ints(1, 4096), "DFlash 2: rank of the selector's predecessor x "
                     "candidate term")
CONV_KERNEL = Flag("conv_kernel_size", 2, ints(0, 256), "DFlash 2: taps of the in-block convolutions; 1 = "
                   "none mixing across slots, 0 = no convolutions: the selector alone")
TARGET_LAYER_IDS = Flag("target_layer_ids", "1,5,9", None, "comma-separated target layers (0-indexed) "
                        "feeding the drafter, spread over 1..L-3; empty = the paper's rule")
DRAFT_STEPS = Flag("draft_steps", 180, ints(1, MAX_COUNT), "drafter optimisation steps")
DRAFT_BATCH = Flag("draft_batch", 48, ints(1, 4096), "sequences per drafter step")
DRAFT_ANCHORS = Flag("draft_anchors", 4, ints(1, 256), "blocks (random anchors) per sequence per step: few, "
                     "as the attention mask grows with their square")
DRAFT_LR = Flag("draft_lr", 3e-3, floats(0, 1, low_open=True), "drafter peak learning rate")
DRAFT_EVALS = 2          # held-out checks (slot accuracy, τ) while the drafter trains: halfway, at the end
LONG_BATCH = Flag("long_batch", 8, ints(0, 4096), "long sequences per drafter step: τ late in a long "
                  "generation holds with 8, not 4")
LONG_ANCHORS = Flag("long_anchors", 32, ints(1, 256), "blocks from each long sequence per step: 32 hold τ "
                    "past token 240 on held-out text")
GAMMA = Flag("gamma", 2.0, floats(0, low_open=True), "loss decay, weights exp(-(k-1)/gamma); the paper's is "
             "7: 2 learned slot 1 faster in short probes (docs/log.md)")
SOFT_WEIGHT = Flag("soft_weight", 0.5, floats(0, 1), "drafter loss = (1-w) CE(data token) + w CE(target's "
                   "next-token distribution): raises sampled τ")

# ----------------------------------------------------------------------------- sampling drafter
SAMPLING = Flag("sampling", True, None, "train the sampling drafter too (drafter_sampling.pt: the drafter "
                "tuned on sampled continuations, which sample.py and the benchmark sample with); "
                "--no-sampling: greedy decoding only, a few minutes less (a later run without it adds just "
                "this stage)")
SAMPLING_STEPS = Flag("sampling_steps", 250, ints(1, MAX_COUNT), "with --sampling: fine-tuning steps of the "
                      "sampling drafter")
SAMPLING_SEQS = Flag("sampling_seqs", 1024, ints(1, MAX_COUNT), "with --sampling: continuations sampled at "
                     "--sampling_temperature for the sampling drafter, in data_sampled.pt")
SAMPLING_LR = Flag("sampling_lr", 1e-3, floats(0, 1, low_open=True), "sampling drafter peak learning rate")
SAMPLING_TEMPERATURE = Flag("sampling_temperature", 0.7, floats(0, low_open=True), "temperature the sampling "
                            "drafter's continuations are sampled at, as people sample")

# ----------------------------------------------------------------------------- step costs and summary
CALIBRATE_CALLS = Flag("calibrate_calls", N_CALLS, ints(0, 1001), "timed calls per block size of the step "
                       "costs block_size=\"auto\" weighs drafts by (costs.json, "
                       "nanodflash/tools/calibrate.py; the median counts); 0 = no table: auto uses the "
                       "default costs")
EVAL_PROMPTS = Flag("eval_prompts", 64, ints(1, 10000), "validation prompts of the summary: enough for a τ "
                    "that holds from machine to machine")
EVAL_NEW_TOKENS = Flag("eval_new_tokens", 96, ints(2, 4096), "tokens generated per summary prompt")
EVAL_LONG_PROMPTS = Flag("eval_long_prompts", 3, ints(1, 10000), "prompts of the summary's long generations "
                         "(τ by position band, speedup)")
EVAL_LONG_TOKENS = Flag("eval_long_tokens", 480, ints(0, 4096), "tokens per long generation (0 = skip them)")

# --full: a deeper, better-trained target and drafter for more minutes; each flag left at its default takes
# the value here
FULL = dict(n_layer=24, target_layer_ids="1,11,21", target_steps=700, target_batch=16, n_seqs=3072,
            long_seqs=347, long_batch=4, long_anchors=16, draft_steps=2000, eval_long_prompts=16,
            sampling_steps=600, sampling_seqs=3072)

# --smoke: the same pipeline at toy sizes, well under a minute; each flag left at its default takes the value
# here
SMOKE = dict(vocab_size=300, n_layer=2, n_embd=32, n_head=2, seq_len=64, target_steps=30, target_batch=8,
             n_seqs=32, prompt_len=8, gen_len=40, draft_steps=30, draft_batch=4, draft_anchors=4,
             target_layer_ids="", block_size=8, sampling_steps=20, sampling_seqs=16, eval_prompts=3,
             eval_new_tokens=24, long_seqs=8, long_gen_len=56, long_batch=2, long_anchors=4,
             eval_long_prompts=2, eval_long_tokens=56, calibrate_calls=3)
