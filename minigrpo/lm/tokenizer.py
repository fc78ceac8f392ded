"""A character-level tokenizer.

Ids 0, 1, 2 are the special tokens BOS (begin), EOS (end) and PAD (padding). They are not
characters, so no text can ever produce them: "<eos>" in a string is five ordinary characters. Text
characters get ids 3.. in sorted order. PAD is distinct from EOS on purpose: a padding id equal to
the end id silently drops the end token from completion masks (a known pitfall of TRL-style trainers
that pad with EOS: the mask stops at the first pad, which is the end token itself).

The tokenizer is saved inside checkpoints as plain data: {"chars": "..."}.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIALS = ("<bos>", "<eos>", "<pad>")
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2


class CharTokenizer:
    def __init__(self, chars: Iterable[str]):
        chars = sorted(set(chars))
        bad = [c for c in chars if len(c) != 1]
        if bad:
            raise ValueError(f"tokenizer alphabet must be single characters, got {bad!r}")
        self.chars = "".join(chars)
        self.stoi = {c: i + len(SPECIALS) for i, c in enumerate(chars)}
        self.itos = {i: c for c, i in self.stoi.items()}
        self.bos_id, self.eos_id, self.pad_id = BOS_ID, EOS_ID, PAD_ID

    @classmethod
    def from_corpus(cls, lines: Iterable[str]) -> "CharTokenizer":
        """The vocabulary of every character that occurs in `lines`."""
        return cls(set("".join(lines)))

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def check(self, text: str) -> None:
        """Raise ValueError naming every character of `text` outside the vocabulary."""
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(
                f"characters not in the tokenizer's vocabulary: {''.join(unknown)!r} "
                f"(allowed: {self.chars!r})"
            )

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        self.check(text)
        ids = [self.stoi[c] for c in text]
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of `ids`; BOS and PAD are dropped; decoding stops at the first EOS (or skips it)."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                if stop_at_eos:
                    break
                continue
            if i in (BOS_ID, PAD_ID):
                continue
            out.append(self.itos[i])
        return "".join(out)

    def to_dict(self) -> dict:
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        return cls(d["chars"])

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    # equal alphabets, equal tokenizers (logprobs.scoring_batch keys on it)
    def __hash__(self) -> int:
        return hash(self.chars)
