"""The embedded default model: a tiny Llama with a character-level tokenizer, built from nothing.

It exists so that oprl runs end to end on a laptop CPU with no model hub: the architecture is an ordinary
``transformers`` ``LlamaForCausalLM`` and the tokenizer an ordinary ``PreTrainedTokenizerFast`` (built with the
``tokenizers`` library, with a chat template), so once saved, ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load the directory like any hub checkpoint. Weights come out random;
``oprl.trainer.warmstart`` teaches it the task before RL.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from oprl.models import TINY_MAX_POSITIONS

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
MAX_POSITIONS = TINY_MAX_POSITIONS

# One token per role marker, the message, then EOS: the shortest template that still separates turns, so
# arithmetic prompts stay ~10 tokens and generation is cheap on CPU.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII plus newline, with special and role tokens."""
    specials = [PAD, BOS, EOS, "<unk>", *ROLE_TOKENS]
    characters = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
    vocab = {token: index for index, token in enumerate(specials + characters)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own pre-token; special tokens are matched before this runs.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token="<unk>",
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = MAX_POSITIONS,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised Llama sized for CPU (about 0.3-0.5 M parameters at the defaults)."""
    import torch  # here, not at the top: the tokenizer alone (pre-start checks) needs neither
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
