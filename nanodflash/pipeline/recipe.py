"""train_tiny.py's recipe: the default of every flag, and the --full and --smoke presets.

    python train_tiny.py --help                   # every flag, with these defaults
    from nanodflash.pipeline import recipe        # e.g. recipe.GAMMA in a notebook

A flag given on the command line wins over its default and over a preset.
"""

# ----------------------------------------------------------------------------- run folders and tokenizer
OUT = "out"              # run folder of a default run
FULL_OUT = "out_full"    # run folder of a --full run
SMOKE_OUT = "out_smoke"  # run folder of a --smoke run: toy checkpoints must never stand in for out/'s
VOCAB_SIZE = 1024        # BPE vocabulary, including <|endoftext|> and <|mask|>
SEED = 1337              # seeds every stage

# ----------------------------------------------------------------------------- target
N_LAYER = 12             # target depth: deep and narrow, so verifying a block costs about one forward
N_EMBD = 128             # target width (the drafter shares it)
N_HEAD = 4               # attention heads of target and drafter
SEQ_LEN = 128            # training window of the target
TARGET_STEPS = 480       # target optimisation steps
TARGET_BATCH = 8         # sequences per target step
TARGET_LR = 2e-3         # target peak learning rate

# ----------------------------------------------------------------------------- target-generated data
N_SEQS = 1024            # short sequences for the drafter: a corpus prompt + the target's continuation
PROMPT_LEN = 16          # corpus tokens per prompt
GEN_LEN = 96             # tokens the target generates per short sequence
LONG_SEQS = 96           # long sequences (0 = none), so the drafter also learns late positions
LONG_GEN_LEN = 480       # tokens the target generates per long sequence
GEN_TEMPERATURE = 0.7    # 0 = greedy continuations only; > 0: some short ones sampled at it, as users sample
GEN_GREEDY_FRAC = 0.75   # share of short continuations kept greedy: sampled τ up, greedy τ about the same
GEN_BATCH = 256          # sequences generated in parallel (one KV cache per batch)

# ----------------------------------------------------------------------------- drafter
DRAFTER = "dflash2"      # dflash2: DFlash + in-block convolutions and a top-K selector; dflash: DFlash 1
DRAFT_LAYERS = 2         # drafter depth
BLOCK_SIZE = 16          # draft block: the anchor + 15 masked slots, drafted in one pass
SELECTOR_TOP_K = 16      # DFlash 2: candidates per slot its selector chooses among (docs/design.md)
SELECTOR_RANK = 64       # DFlash 2: rank of the selector's predecessor x candidate term
CONV_KERNEL = 2          # DFlash 2: taps of the in-block convolutions
TARGET_LAYER_IDS = "1,5,9"   # target layers feeding the drafter, spread over 1..L-3; "" = the paper's rule
DRAFT_STEPS = 180        # drafter optimisation steps
DRAFT_BATCH = 48         # sequences per drafter step
DRAFT_ANCHORS = 4        # blocks per sequence per step: few, as the attention mask grows with their square
DRAFT_LR = 3e-3          # drafter peak learning rate
DRAFT_EVALS = 2          # held-out checks (slot accuracy, τ) while the drafter trains: halfway and at the end
LONG_BATCH = 8           # long sequences per drafter step: τ late in a long generation holds with 8, not 4
LONG_ANCHORS = 32        # blocks from each long sequence per step: 32 hold τ past token 240 on held-out text
GAMMA = 2.0              # loss decay exp(-(k-1)/gamma): the paper's 7 suits big drafters, 2 learns faster
SOFT_WEIGHT = 0.5        # drafter loss = (1-w) CE(data token) + w CE(target distribution): raises sampled τ

# ----------------------------------------------------------------------------- sampling drafter
SAMPLING = True          # train it (--no-sampling: greedy decoding only); sample.py samples with it
SAMPLING_STEPS = 250     # fine-tuning steps of the drafter on sampled continuations (used when sampling)
SAMPLING_SEQS = 1024     # sampled continuations it is tuned on
SAMPLING_LR = 1e-3       # its peak learning rate
SAMPLING_TEMPERATURE = 0.7   # its continuations are sampled at this temperature, as people sample

# ----------------------------------------------------------------------------- summary
EVAL_PROMPTS = 64        # validation prompts: enough for a τ that holds from machine to machine
EVAL_NEW_TOKENS = 96     # tokens generated per summary prompt
EVAL_LONG_PROMPTS = 3    # prompts of the long generations (τ by position band, speedup)
EVAL_LONG_TOKENS = 480   # tokens per long generation (0 = skip them)

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
             eval_long_prompts=2, eval_long_tokens=56)
