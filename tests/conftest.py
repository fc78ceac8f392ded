"""Shared fixtures and the helpers several test files use. Tests run on one thread with tiny models
so the default run stays fast. Test files import the helpers with `from conftest import ...` (pytest
puts tests/ on sys.path: the folder has no __init__.py)."""

import os

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    """The suite runs on the CPU wherever it runs: a run's --device auto resolves to the CPU (tests
    compare numbers across runs and build CPU tensors), except in tests marked `cuda`, which skip
    without a GPU. This holds in this process only: a test whose runs go to worker processes and
    compares their numbers names --device cpu (on a machine with a GPU their auto would pick it)."""
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(params=["token-by-token", "noise-ahead"])
def noise_drawn(request, monkeypatch):
    """Both ways a generate() call draws its noise, on the CPU: a token at a time (the CPU's), and
    all of it at the first token (lm/sampling.NOISE_AHEAD: a GPU's, here on the CPU) -> which."""
    if request.param == "noise-ahead":
        from minigrpo.lm import sampling

        monkeypatch.setattr(sampling, "NOISE_AHEAD", (*sampling.NOISE_AHEAD, "cpu"))
    return request.param


# the property tests' hypothesis budget: 20 examples a property in the default suite, more where
# MINIGRPO_EXAMPLES says (the slow test_properties.py reruns every property file at 200)
EXAMPLES = int(os.environ.get("MINIGRPO_EXAMPLES", "20"))
SET = settings(deadline=None, max_examples=EXAMPLES, derandomize=True)
NAN = float("nan")


def pretrain_tiny(out, **settings):
    """Pretrain a tiny model into `out` with `settings` (PretrainConfig's fields) on the CPU,
    silently and without its loss.png (no test reads it; drawing it was a third of a fixture's
    time) -> (checkpoint path, model, tokenizer)."""
    from minigrpo import pretrain
    from minigrpo.lm.checkpoint import load_checkpoint
    from minigrpo.pretrain import PretrainConfig, train

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrain, "plot_panels", lambda *a, **k: None)
        train(PretrainConfig(out=str(out), device="cpu", **settings), log=lambda *a: None)
    model, tok, _ = load_checkpoint(out / "model.pt")
    return out / "model.pt", model, tok


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory):
    """A tiny food model pretrained for a few seconds: (checkpoint path, model, tokenizer)."""
    return pretrain_tiny(
        tmp_path_factory.mktemp("pretrain"),
        steps=150,
        batch_size=64,
        n_embd=32,
        n_head=2,
        lr=1e-2,
        n_lines=1600,
        eval_every=150,
        ckpt_every=150,
    )


@pytest.fixture(scope="session")
def tiny_sums_pretrained(tmp_path_factory):
    """A tiny sums model pretrained a few dozen steps (16 wide: it answers almost nothing yet, most
    of its mass off the support): (checkpoint path, model, tokenizer), for the commands' tests on
    the sums world."""
    return pretrain_tiny(
        tmp_path_factory.mktemp("pretrain-sums-tiny"),
        task="sums",
        steps=40,
        batch_size=64,
        n_embd=16,
        n_head=2,
        lr=1e-2,
        n_lines=1200,
        eval_every=40,
        ckpt_every=40,
        threads=1,
    )


def T(x, grad=False):
    """A float64 tensor (a leaf that requires grad with grad=True)."""
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def call(fn, *args, shape=None, **kw):
    """Call fn and check it returned a tensor (of the expected shape, when given): a deleted body
    returns None."""
    out = fn(*args, **kw)
    want = "" if shape is None else f" of shape {tuple(shape)}"
    assert isinstance(out, torch.Tensor), f"{fn.__name__} must return a tensor{want}, got {out!r}"
    if shape is not None:
        assert out.shape == tuple(shape), (
            f"{fn.__name__} returned shape {tuple(out.shape)}, expected {tuple(shape)}"
        )
    return out


def right_padded(lengths, width):
    """(B, width) bool mask: row b valid in its first lengths[b] slots."""
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def garbage(x, mask):
    """x with NaN, +1e4 and −1e4 cycling through its masked slots (in x's dtype)."""
    junk = torch.tensor([NAN, 1e4, -1e4], dtype=x.dtype).repeat(x.numel())[: x.numel()].view_as(x)
    return torch.where(mask, x, junk)


def naive_gae(rewards, values, lengths, gamma, lam):
    """A_t = Σ_k (γλ)^(k−t) δ_k, δ_k = r_k + γ V_(k+1) − V_k, with V = 0 after the last valid token.

    A double loop in float64 over plain floats; rows are valid in their first lengths[b] slots."""
    B, width = rewards.shape
    out = torch.zeros(B, width, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b])
        for t in range(n):
            for k in range(t, n):
                v_next = float(values[b, k + 1]) if k + 1 < n else 0.0
                out[b, t] += (gamma * lam) ** (k - t) * (
                    float(rewards[b, k]) + gamma * v_next - float(values[b, k])
                )
    return out


def perturbed(model, scale: float = 0.05, seed: int = 0):
    """A copy of `model` with seeded Gaussian noise of std `scale` added to every weight."""
    import copy

    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def one_line_error(main, argv, capsys):
    """Run a CLI's main on bad input: exit code 2 and exactly one line on stderr, never a
    traceback."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err
