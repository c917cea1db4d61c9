"""A tiny Llama checkpoint made here, from nothing: no hub, no download.

``write_tiny_model(directory)`` saves a 2-layer Llama with random weights
(hidden size 128, 2 heads of head_dim 64: vLLM's CPU attention refuses
smaller heads), float32, and a word-level tokenizer built with ``tokenizers``
whose chat template renders ``role : content`` turns.  Each token decodes to
one word (``w0`` .. ``w255`` or a prompt word), so each is one SSE chunk; the
weights are random, so any of them, special tokens too, may be generated.
Needs torch, transformers and tokenizers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
WORDS = 256
PROMPT_WORDS = ["user", "assistant", "system", ":", "hello", "tell", "me", "a", "long", "story"]
VOCABULARY_WORDS = frozenset([f"w{i}" for i in range(WORDS)] + PROMPT_WORDS)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }} : {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def write_tiny_model(directory: Path, *, seed: int = 0) -> Path:
    """Write the model and tokenizer to ``directory``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for i in range(WORDS):
        vocab[f"w{i}"] = len(vocab)
    for word in PROMPT_WORDS:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with " "
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.bos_token_id = 1
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 3
    model.save_pretrained(directory)
    return directory
