"""Write a tiny offline model directory for Dynamo 1.6.1's frontend (no hub, no weights).

Run: ``python benchmarks/_tiny_model.py DIR`` with the ``tokenizers`` package installed
(``setup_dynamo.sh`` runs it inside the Dynamo venv).

Dynamo's frontend tokenizes prompts and detokenizes the worker's token ids itself, so
its model deployment card needs ``config.json``, ``tokenizer.json``,
``tokenizer_config.json`` (with a chat template) and ``generation_config.json``.  The
tokenizer is a word-level one built in code: ids 0-3 are special, ids 4..4+WORDS-1 are
the words ``w0``, ``w1``, ... that the benchmark workers generate (each decodes to one
word, so every generated token is one SSE chunk), and the few words of the benchmark's
prompts follow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

WORDS = 512
"""Generated words ``w0 .. w511`` have token ids ``FIRST_WORD_ID .. FIRST_WORD_ID + 511``."""
FIRST_WORD_ID = 4
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
PROMPT_WORDS = ["user", "assistant", "system", ":", "benchmark", "hang", "up", "on", "me", "x"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }} : {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def write(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for i in range(WORDS):
        vocab[f"w{i}"] = FIRST_WORD_ID + i
    for word in PROMPT_WORDS:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with " "
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(vocab),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "max_position_embeddings": 32768,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "torch_dtype": "float16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 32768,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    generation_config = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    (directory / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    # Self-check: the generated words round-trip one token per word.
    ids = [FIRST_WORD_ID, FIRST_WORD_ID + 1, FIRST_WORD_ID + WORDS - 1]
    text = tokenizer.decode(ids)
    assert text == f"w0 w1 w{WORDS - 1}", text
    assert tokenizer.encode(text).ids == ids


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    write(Path(sys.argv[1]))
    print(f"tiny model written to {sys.argv[1]}")
