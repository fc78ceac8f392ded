import pytest
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.lm.tokenizer import BOS_ID, EOS_ID, PAD_ID, CharTokenizer

ALPHABET = "abc xyz+=.0123456789"
tok = CharTokenizer(ALPHABET)


@given(st.text(alphabet=ALPHABET, max_size=40))
def test_encode_decode_round_trip(text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, bos=True, eos=True)) == text


@given(st.text(alphabet=ALPHABET, max_size=40))
def test_special_ids_never_come_from_text(text):
    ids = tok.encode(text)
    assert not {BOS_ID, EOS_ID, PAD_ID} & set(ids), "a text character was given a special id"


def test_special_tokens_are_distinct_and_outside_the_alphabet():
    assert len({BOS_ID, EOS_ID, PAD_ID}) == 3
    assert tok.vocab_size == 3 + len(set(ALPHABET))
    angle = CharTokenizer("<>eos")
    ids = angle.encode("<eos>")  # the special token's name is just five characters
    assert len(ids) == 5 and EOS_ID not in ids


def test_decode_stops_at_first_eos_and_skips_padding():
    ids = tok.encode("ab", bos=True) + [EOS_ID] + tok.encode("c") + [PAD_ID]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, stop_at_eos=False) == "abc"


def test_unknown_characters_raise_naming_them():
    with pytest.raises(ValueError, match=r"'QW'"):
        tok.encode("aQbW")


def test_from_corpus_and_plain_data_round_trip():
    t = CharTokenizer.from_corpus(["ravin likes pizza", "bob likes ice cream"])
    assert CharTokenizer.from_dict(t.to_dict()) == t
    assert t.to_dict() == {"chars": " abceiklmnoprsvz"}
