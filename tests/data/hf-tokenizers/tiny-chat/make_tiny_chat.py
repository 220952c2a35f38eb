#!/usr/bin/env python3
"""Writes a tiny chat tokenizer for the fine-tuning tests: Qwen's tokenizer.json and ChatML
template with the vocabulary cut to the 256 byte tokens (no merges) plus <|endoftext|>,
<|im_start|> and <|im_end|> (ids 256-258), so that a model over it is a few hundred kilobytes.
Run from this folder: python3 make_tiny_chat.py (reads ../qwen3/)."""
import json

src = json.load(open("../qwen3/tokenizer.json"))
cfg = json.load(open("../qwen3/tokenizer_config.json"))
byte_vocab = {tok: i for tok, i in src["model"]["vocab"].items() if i < 256}
assert len(byte_vocab) == 256, len(byte_vocab)
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
added = [dict(a, id=256 + specials.index(a["content"])) for a in src["added_tokens"] if a["content"] in specials]
out = dict(src)
out["added_tokens"] = added
out["model"] = dict(src["model"], vocab=byte_vocab, merges=[])
json.dump(out, open("tokenizer.json", "w"), ensure_ascii=False, indent=1)
decoder = {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}
tiny_cfg = {k: cfg[k] for k in ("add_bos_token", "add_prefix_space", "bos_token", "clean_up_tokenization_spaces",
                                "eos_token", "errors", "pad_token", "split_special_tokens", "tokenizer_class",
                                "unk_token") if k in cfg}
tiny_cfg["added_tokens_decoder"] = decoder
tiny_cfg["additional_special_tokens"] = ["<|im_start|>", "<|im_end|>"]
tiny_cfg["model_max_length"] = 1024
tiny_cfg["chat_template"] = cfg["chat_template"]
json.dump(tiny_cfg, open("tokenizer_config.json", "w"), ensure_ascii=False, indent=1)
print("vocab", len(byte_vocab) + len(added))
