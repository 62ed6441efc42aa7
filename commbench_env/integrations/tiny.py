"""A tiny, randomly initialised chat model and tokenizer built offline, for smoke runs of the trainer adapters.

Nothing is downloaded: the tokenizer is a byte-level BPE trained in a second on the task statements and solutions
(so prompts stay a few hundred tokens long), with the special tokens and chat template of Qwen3 (the template TRL
knows how to parse tool calls from); the model is a two-layer Qwen3 of about a million parameters. It writes
gibberish: use it to check that a training loop runs end to end, then swap in a real model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                  "</tool_call>", "<tool_response>", "</tool_response>"]


def corpus(task_ids: Iterable[str] | None = None) -> list[str]:
    """Texts to train the tokenizer on: task statements, starters and references (all tasks by default)."""
    from ..cards import list_task_ids, load_task

    texts = []
    for tid in task_ids or list_task_ids():
        task = load_task(tid)
        texts += [task.agent_view(), task.starter, task.reference_source()]
    return texts


def tiny_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 2048, chat_template: str | None = None) -> Any:
    """A PreTrainedTokenizerFast (left padding) with Qwen3's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if chat_template is None:
        from trl.chat_template_utils import qwen3_chat_template as chat_template
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts if texts is not None else corpus()), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   padding_side="left")
    fast.chat_template = chat_template
    return fast


def tiny_model(tokenizer: Any, *, hidden: int = 64, layers: int = 2, max_positions: int = 8192, seed: int = 0) -> Any:
    """A randomly initialised Qwen3ForCausalLM sized for `tokenizer`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    return Qwen3ForCausalLM(cfg)

