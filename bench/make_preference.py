#!/usr/bin/env python3
"""Preference pairs (DPO, `memfit prepare --format preference`) made from the bundled corpus, as
JSON lines of {"prompt", "chosen", "rejected"}: the prompt is a passage (one speech), chosen the
corpus' true continuation (the next speech), rejected either that continuation with its words in a
seeded random order (--rejected shuffled, the default: the same words, no longer English) or a
continuation taken from elsewhere (--rejected other: the next speech of another passage, by a
seeded shuffle), so a model can learn which answer to prefer.

  --form messages (default): TRL's conversational form, a user turn ("Continue the scene after:"
      and the passage) and one assistant turn on each side, for a tokenizer with a chat template
      (data/chat-tokenizer, tests/data/hf-tokenizers/tiny-chat: ChatML);
  --form text: TRL's standard form, plain strings (the passage and a blank line, then the answer).
Passages come from the corpus (data/tinyshakespeare.txt, split into speeches at blank lines), or
with --chat from a conversation file of bench/make_chat.py: each record's first user turn is the
prompt and its assistant answer the chosen side. The same arguments give the same file.

usage: make_preference.py OUT.jsonl [--records N] [--seed S] [--form messages|text]
                          [--rejected shuffled|other] [--max-chars C] [--chat CHAT.jsonl | --corpus TEXT]"""
import argparse
import os
import json
import random
import sys

PROMPT = "Continue the scene after:\n"


def corpus_pairs(path, longest):
    """(passage, true continuation) for each speech of the corpus but the last."""
    text = open(path, encoding="utf-8").read()
    speeches = [s.strip() for s in text.split("\n\n") if s.strip()]
    pairs = list(zip(speeches, speeches[1:]))
    return [(p, c) for p, c in pairs if not longest or (len(p) < longest and len(c) < longest)]


def chat_pairs(path, longest):
    """(passage, answer) from each conversation's first user turn and the assistant turn after it."""
    pairs = []
    for line_no, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line.strip():
            continue
        messages = json.loads(line).get("messages")
        if not isinstance(messages, list):
            sys.exit(f"{path} line {line_no}: no \"messages\" list; expected bench/make_chat.py's records")
        for user, answer in zip(messages, messages[1:]):
            if user.get("role") == "user" and answer.get("role") == "assistant":
                passage = user["content"]
                passage = passage[len(PROMPT):] if passage.startswith(PROMPT) else passage
                if not longest or (len(passage) < longest and len(answer["content"]) < longest):
                    pairs.append((passage, answer["content"]))
                break
    return pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON lines file to write")
    ap.add_argument("--records", type=int, default=600, help="pairs to write (default 600; passages cycle)")
    ap.add_argument("--seed", type=int, default=0, help="the shuffle that picks each rejected answer (default 0)")
    ap.add_argument("--form", choices=["messages", "text"], default="messages",
                    help="lists of messages (conversational) or strings (standard); default messages")
    ap.add_argument("--rejected", choices=["shuffled", "other"], default="shuffled",
                    help="the rejected answer: the chosen one's words shuffled, or another passage's continuation")
    ap.add_argument("--max-chars", type=int, default=0,
                    help="leave out passages or answers this long or longer (0: none), to keep sides under --seq")
    src = ap.add_mutually_exclusive_group()
    corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tinyshakespeare.txt")
    src.add_argument("--corpus", default=os.path.normpath(corpus), help="text split into speeches at blank lines")
    src.add_argument("--chat", help="a conversation file written by bench/make_chat.py, instead of the corpus")
    a = ap.parse_args()
    if a.records < 1:
        sys.exit("--records must be at least 1")
    pairs = chat_pairs(a.chat, a.max_chars) if a.chat else corpus_pairs(a.corpus, a.max_chars)
    if len(pairs) < 2:
        sys.exit(f"{a.chat or a.corpus}: {len(pairs)} passages; a rejected answer needs at least 2 (raise --max-chars)")
    pairs = pairs[:a.records] if a.records < len(pairs) else pairs
    if len({c for _, c in pairs}) < 2:
        sys.exit(f"{a.chat or a.corpus}: every passage has the same answer; a rejected answer must differ")
    rng = random.Random(a.seed)
    # Record i takes passage i (cycling) and, as its rejected answer, the continuation of passage
    # other[i]: a shuffle of the passages, moved on where it lands on the same answer.
    other = list(range(len(pairs)))
    rng.shuffle(other)
    with open(a.out, "w", encoding="utf-8") as out:
        for i in range(a.records):
            passage, chosen = pairs[i % len(pairs)]
            j = other[i % len(other)]
            while pairs[j][1] == chosen:
                j = (j + 1) % len(pairs)
            rejected = pairs[j][1]
            if a.rejected == "shuffled":   # the chosen answer's words in another order (never the same)
                words = chosen.split(" ")
                rng_i = random.Random(a.seed * 1000003 + i)
                for _ in range(8):
                    rng_i.shuffle(words)
                    if " ".join(words) != chosen:
                        break
                rejected = " ".join(words)
                if rejected == chosen:
                    rejected = chosen[::-1]
            if a.form == "messages":
                rec = {"prompt": [{"role": "user", "content": PROMPT + passage}],
                       "chosen": [{"role": "assistant", "content": chosen}],
                       "rejected": [{"role": "assistant", "content": rejected}]}
            else:
                rec = {"prompt": passage + "\n\n", "chosen": chosen, "rejected": rejected}
            out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
