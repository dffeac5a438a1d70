"""Extensions of the core's batch-1 path decoding, each beside the idea it extends. The core (the top level of
nanodflash) never imports them; they import the core.

    trees          tree.py: a top-K tree of drafts verified in one target pass (greedy); sampled_tree.py: a
                   sampled tree, verified by multi-draft rejection
    batching       batch.py: many prompts decoded together; plain_batch.py: their plain decoding, also the
                   generator of the drafter's training data; ragged_cache.py: a KV cache whose rows hold
                   different lengths; drafter_rows.py: a drafter's context for many rows; batch_policy.py:
                   the batch's block size
    block sizes    block_policy.py: block_size="auto", the block a step drafts chosen from the acceptance
                   so far; step_costs.py: the cost tables it prices drafts with
    compiled       compiled.py: the drafter's block pass compiled with a static context buffer
"""
