"""nanodflash: a small, readable DFlash (block-diffusion drafting for lossless speculative decoding)."""

from .checkpoint import load
from .drafter import Drafter, DrafterConfig
from .gpt import GPT, GPTConfig, KVCache
from .speculative import generate, speculative_generate
from .tokenizer import load_tokenizer, train_tokenizer

__all__ = ["load", "Drafter", "DrafterConfig", "GPT", "GPTConfig", "KVCache", "generate",
           "speculative_generate", "load_tokenizer", "train_tokenizer"]
