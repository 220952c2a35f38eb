#!/usr/bin/env python3
"""Conversations made from the bundled corpus, as JSON lines of {"messages": [...]}: a user turn
holding one speech ("Continue the scene after:" it) and the assistant's turn holding the next; one
to three turns a conversation, cycling.

usage: make_chat.py OUT.jsonl RECORDS [MAX_SPEECH_CHARS]   (from the repository root)"""
import json
import sys

out_path, n = sys.argv[1], int(sys.argv[2])
longest = int(sys.argv[3]) if len(sys.argv) > 3 else 0
text = open("data/tinyshakespeare.txt", encoding="utf-8").read()
speeches = [s.strip() for s in text.split("\n\n") if s.strip() and (not longest or len(s) < longest)]
with open(out_path, "w") as out:
    i = 0
    for r in range(n):
        messages = []
        for _ in range(1 + r % 3):
            messages.append({"role": "user", "content": "Continue the scene after:\n" + speeches[i % len(speeches)]})
            messages.append({"role": "assistant", "content": speeches[(i + 1) % len(speeches)]})
            i += 2
        out.write(json.dumps({"messages": messages}) + "\n")
