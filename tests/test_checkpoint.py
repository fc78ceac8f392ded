import os
import pickle

import pytest
import torch

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8))
    tok = CharTokenizer("abcde")
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3, dtype=torch.long)).sum().backward()
    opt.step()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, tok, "food", 7, opt.state_dict(), extra={"note": "x"})
    return path, model, tok


def test_round_trip_gives_identical_logits_and_metadata(saved):
    path, model, tok = saved
    loaded, tok2, meta = load_checkpoint(path)
    x = torch.tensor([[0, 3, 4, 5]])
    assert torch.equal(loaded(x), model.eval()(x))
    assert (
        tok2 == tok
        and meta["task"] == "food"
        and meta["step"] == 7
        and meta["extra"] == {"note": "x"}
    )
    assert "state" in meta["optimizer"]


def test_save_is_atomic_and_leaves_no_temp_files(saved):
    path, model, tok = saved
    save_checkpoint(path, model, tok, task="food", step=8)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.pt"]


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


def test_truncated_file_gives_one_clear_line(saved, tmp_path):
    path, _, _ = saved
    bad = tmp_path / "cut.pt"
    bad.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="unreadable") as e:
        load_checkpoint(bad)
    assert "\n" not in str(e.value) and "cut.pt" in str(e.value)


def test_foreign_files_are_refused(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="not a minigrpo checkpoint"):
        load_checkpoint(other)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(text)


class RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def refusal(path, capfd) -> str:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "Weights only" not in msg, msg
    assert capfd.readouterr().err == "", "no warning of PyTorch's may reach the user"
    return msg


def test_each_unreadable_file_says_what_it_is(tmp_path, capfd):
    (tmp_path / "notes.pt").write_text("hello\nworld\n")
    assert "a text file, not a checkpoint" in refusal(tmp_path / "notes.pt", capfd)
    (tmp_path / "noise.pt").write_bytes(bytes(range(7, 256)) * 40)
    assert "not a torch checkpoint (unrecognised binary data)" in refusal(
        tmp_path / "noise.pt", capfd
    )
    (tmp_path / "empty.pt").write_bytes(b"")
    assert "empty file" in refusal(tmp_path / "empty.pt", capfd)
    (tmp_path / "plain.pt").write_bytes(pickle.dumps({"a": [1, 2]}, protocol=4))
    assert "a plain Python pickle" in refusal(tmp_path / "plain.pt", capfd)


def test_a_pickle_that_would_run_code_is_refused_as_such(tmp_path, capfd):
    torch.save({"model": RunsCode()}, tmp_path / "torch_code.pt")
    (tmp_path / "raw_code.pt").write_bytes(pickle.dumps({"model": RunsCode()}, protocol=4))
    for name in ("torch_code.pt", "raw_code.pt"):
        msg = refusal(tmp_path / name, capfd)
        assert (
            "not a weights-only checkpoint (it would run code); refused" in msg
            and "truncated" not in msg
        )
    assert capfd.readouterr().out == "", "the pickled code did not run"


def test_to_host_copies_every_tensor_and_keeps_the_structure():
    """lm/checkpoint.to_host (what an RL checkpoint holds of an algorithm's state and of the
    anchor): nested dicts and lists keep their shape and their non-tensors; a module's state_dict
    stays an OrderedDict with its _metadata (what load_state_dict reads), so a checkpoint's bytes do
    not change on the CPU."""
    from minigrpo.lm.checkpoint import to_host

    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8))
    tree = {"head": model.state_dict(), "beta": 0.1, "rows": [torch.arange(3), None], "none": None}
    host = to_host(tree)
    assert (
        type(host["head"]) is type(tree["head"])
        and host["head"]._metadata == tree["head"]._metadata
    )
    assert list(host["head"]) == list(tree["head"]) and host["beta"] == 0.1 and host["none"] is None
    assert all(
        torch.equal(host["head"][k], v) and host["head"][k].device.type == "cpu"
        for k, v in tree["head"].items()
    )
    assert torch.equal(host["rows"][0], tree["rows"][0]) and host["rows"][1] is None
    assert host["rows"][0].data_ptr() == tree["rows"][0].data_ptr(), (
        "a host tensor is not copied again"
    )
    if torch.cuda.is_available():  # on a GPU: every tensor on the host
        assert to_host({"x": [torch.ones(2, device="cuda")]})["x"][0].device.type == "cpu"
