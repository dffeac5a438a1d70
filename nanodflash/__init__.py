"""nanodflash: a small, readable DFlash (block-diffusion drafting for lossless speculative decoding)."""

from .drafter import Drafter, DrafterConfig
from .gpt import GPT, GPTConfig, KVCache
from .speculative import generate, speculative_generate
from .store.checkpoint import load
from .store.tokenizer import load_tokenizer, train_tokenizer

__all__ = ["load", "Drafter", "DrafterConfig", "GPT", "GPTConfig", "KVCache", "generate",
           "speculative_generate", "load_tokenizer", "train_tokenizer"]
