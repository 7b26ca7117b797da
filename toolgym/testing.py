"""Tiny models for tests and examples, built offline: no hub, a few seconds on a CPU.

`tiny_tokenizer()` trains a byte-level BPE tokenizer with the `tokenizers` library on text in
the shape toolgym produces (chat markup, tool calls, Wordle feedback) and gives it toolgym's
ChatML tool template. `tiny_model(tokenizer)` is a randomly initialised Llama-architecture
causal LM of a few hundred thousand parameters with a matching vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>user\nLet's play Wordle. Find the secret five-letter English word.<|im_end|>\n",
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "guess", "arguments": {"word": "crane"}}\n</tool_call><|im_end|>\n',
    "<|im_start|>tool\n<tool_response>\nGuess 1/6: C(gray) R(yellow) A(green) N(gray) E(gray)\n"
    "5 guesses left.\n</tool_response><|im_end|>\n",
    "Error: invalid arguments for guess: missing required argument. Expected: guess(word: string).",
    '{"type": "function", "function": {"name": "add", "description": "Add two numbers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "number"}}, '
    '"required": ["a"]}}}',
    "Multiply 4821 and 9384. The answer is 45240264. abcdefghijklmnopqrstuvwxyz 0123456789",
]


@functools.cache
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tokenizer.to_str()


def tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer (any text encodes) with toolgym's ChatML tool template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from toolgym.agents.templates import chatml_tools_template

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    tokenizer.chat_template = chatml_tools_template()
    return tokenizer


def tiny_model(tokenizer: Any, seed: int = 0, hidden_size: int = 64, layers: int = 2) -> Any:
    """A randomly initialised Llama-architecture causal LM sized for `tokenizer`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_family_model(config_name: str, **extra: Any) -> Any:
    """A tiny randomly initialised causal LM of the family whose config class `transformers`
    names `config_name` (e.g. "Gemma2Config"), with `extra` config fields such as a family's
    logit transform (`final_logit_softcapping`, `logit_scale`, `logits_scaling`); seeded 0."""
    import torch
    import transformers

    config = getattr(transformers, config_name)(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        **extra,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()
