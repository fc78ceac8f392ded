"""The members of a population run in lockstep: each is an ordinary run (rl/loop.py, its own
thread), whose models' forward passes, samplings and backward passes wait for the other members' and
go as one batch.

    batcher = Batcher()
    # in each member's thread: BATCH.set(batcher), then the run as usual; rl.Run adopts its policy:
    policy = batcher.adopt(policy)       # a MemberGPT: the same GPT, its work joins the batch

Every request (`hidden`, `linear`, `generate`, `backward`) waits until each live member has one
waiting; the server's thread then serves the requests of one kind and grad mode as one computation
(stacked.Stack, one batched matmul for the heads (GPT.linear), sampling.generate_all, one
torch.autograd.backward over the members' losses), the others wait for a later round
(Batcher._serve: which group goes first keeps the members in step). What is not a model's work
(rewards, advantages, losses, statistics, stop rules, files) stays in each member's own run, so a
member computes what its single run computes, to float rounding, at any P
(tests/test_population.py).

Each member keeps its own GPT (parameters, optimiser, checkpoints): Stack stacks the weights for
each batch, and the gradient of a member's loss reaches only its own parameters. A member whose run
fails (a NaN, a reward that raises) leaves the batch; the others go on. Departure from a fully
vectorised population (PureJaxRL): the per-member work between two batches is Python, run member
after member; it is what a single run does.
"""

from __future__ import annotations

import copy
import threading
import time

import torch
import torch.nn.functional as F

from minigrpo.lm.model import GPT
from minigrpo.population.sampling import Request, generate_all
from minigrpo.population.stacked import Stack, linear


class Batcher:
    """The barrier the members' model work waits at, and its server (see the module docstring)."""

    def __init__(self):
        self.cond = threading.Condition()
        # the threads of the live members -> [its key, requests made]
        self.members: dict[int, list[int]] = {}
        self.pending: list[dict] = []  # one request per waiting member
        # (kind, grad) -> [seconds serving, requests served] (bench)
        self.spent: dict[tuple, list[float]] = {}
        # True: wait for the GPU after each batch, so `spent` holds its time (bench)
        self.sync = False
        self.closed = False

    def serve_forever(self) -> None:
        """The server's thread (one, always the same: the autograd nodes of the batches are then
        numbered the same way each time, and a population computes the same to the bit): serve
        whenever every live member waits."""
        with self.cond:
            while not self.closed:
                if self.pending and len(self.pending) >= len(self.members):
                    self._serve()
                else:
                    self.cond.wait()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def enter(self, key: int | None = None) -> None:
        """The calling thread is a member: from now on every batch waits for it (until it leaves).
        `key` orders the members within a batch (default: the order they entered), so that a
        population computes the same each time."""
        with self.cond:
            self.members.setdefault(
                threading.get_ident(), [len(self.members) if key is None else key, 0]
            )

    def adopt(self, model: GPT) -> GPT:
        """Make `model` (and every deep copy of it: π_ref, critics) a member's: its work joins the
        batch."""
        self.enter()
        model.__class__, model.batcher = MemberGPT, self
        return model

    def leave(self) -> None:
        """The calling member's run ended: the batch no longer waits for it."""
        with self.cond:
            self.members.pop(threading.get_ident(), None)
            self.cond.notify_all()

    def submit(self, kind: str, model, *args):
        """Wait for every live member's request and the server's batch (serve_forever) -> this one's
        result."""
        req = {
            "kind": kind,
            "model": model,
            "args": args,
            "grad": torch.is_grad_enabled(),
            "done": False,
        }
        with self.cond:
            me = self.members[threading.get_ident()]
            me[1] += 1
            req["key"], req["order"] = me
            self.pending.append(req)
            self.cond.notify_all()
            while not req["done"]:
                self.cond.wait()
        if isinstance(req.get("error"), BaseException):
            raise req["error"]
        return req["result"]

    def _serve(self) -> None:
        """Serve one group of the waiting requests: those of one kind and grad mode as one
        computation. Forward passes go first, so that members whose paths differ for a while (a
        trust region halving its step, another algorithm) gather again at the next sampling or
        backward; among those, the group of the member furthest behind (fewest requests made)."""
        groups: dict[tuple, list[dict]] = {}
        for req in self.pending:  # models of another shape (another --init) never share a batch
            shape = tuple(vars(req["model"].cfg).values())
            if req["kind"] == "linear":  # an output head and a value head never share a product
                shape += (tuple(req["args"][1].shape), req["args"][2] is None)
            groups.setdefault((req["kind"], req["grad"], shape), []).append(req)
        (kind, grad, _), reqs = min(
            groups.items(),
            key=lambda g: (g[0][0] not in FORWARD, min(r["order"] for r in g[1]), -len(g[1])),
        )
        self.pending = [r for r in self.pending if all(r is not q for q in reqs)]
        # the same batch whatever order the members arrived in
        reqs = sorted(reqs, key=lambda r: r["key"])
        start = time.perf_counter()
        try:
            with torch.set_grad_enabled(grad):
                results = SERVE[kind](reqs)
            if self.sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            for req, result in zip(reqs, results):
                req["error" if isinstance(result, BaseException) else "result"] = result
        except Exception as e:  # a failure of the whole group reaches each of its members
            for req in reqs:
                req["error"] = e
        spent = self.spent.setdefault((kind, grad), [0.0, 0])
        spent[0], spent[1] = spent[0] + time.perf_counter() - start, spent[1] + len(reqs)
        for req in reqs:
            req["done"] = True
        self.cond.notify_all()


def _hidden(reqs: list[dict]) -> list[torch.Tensor]:
    """GPT.hidden of each request (idx, pos, attn_mask: GPT.inputs; no cache) -> (B, T, C) each, as
    one Stack."""
    shapes = [r["args"][0].shape for r in reqs]
    B, T = max(s[0] for s in shapes), max(s[1] for s in shapes)
    device = reqs[0]["args"][0].device
    idx = torch.zeros((len(reqs), B, T), dtype=torch.long, device=device)
    pos = torch.zeros_like(idx)
    # padding sees itself
    mask = torch.eye(T, dtype=torch.bool, device=device).repeat(len(reqs), B, 1, 1, 1)
    for p, r in enumerate(reqs):
        x, ps, attn_mask = r["args"]
        b, t = x.shape
        idx[p, :b, :t], pos[p, :b, :t] = x, ps
        if attn_mask is None:  # plain causal attention
            attn_mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        mask[p, :b, :, :t, :t] = attn_mask.expand(b, 1, t, t) if attn_mask.dim() == 4 else attn_mask
    h = Stack([r["model"] for r in reqs]).hidden(idx, pos, mask.view(len(reqs) * B, 1, T, T))
    return [h[p, : s[0], : s[1]] for p, s in enumerate(shapes)]


def _linear(reqs: list[dict]) -> list[torch.Tensor]:
    """GPT.linear of each request, x (..., in) @ weight (out, in)ᵀ + bias -> (..., out), as one
    batched matmul (the output heads; PPO's value heads). Why batch so small a product: on a GPU, a
    matmul in a member's thread gives that thread its own cuBLAS handle and workspace, which cost
    each member about 100 MB (docs/performance.md)."""
    flat = [r["args"][0].reshape(-1, r["args"][0].shape[-1]) for r in reqs]
    rows = max(f.shape[0] for f in flat)
    x = torch.stack([F.pad(f, (0, 0, 0, rows - f.shape[0])) for f in flat])  # (P, rows, in)
    bias = None if reqs[0]["args"][2] is None else torch.stack([r["args"][2] for r in reqs])
    y = linear(x, torch.stack([r["args"][1] for r in reqs]), bias)  # (P, rows, out)
    return [
        y[p, : f.shape[0]].reshape(*r["args"][0].shape[:-1], y.shape[-1])
        for p, (f, r) in enumerate(zip(flat, reqs))
    ]


def _generate(reqs: list[dict]) -> list:
    return generate_all([r["model"] for r in reqs], [Request(*r["args"]) for r in reqs])


def _backward(reqs: list[dict]) -> list[None]:
    # the losses may share one batched graph: keep it for members whose backward comes in a later
    # round
    torch.autograd.backward([r["args"][0] for r in reqs], retain_graph=True)
    return [None] * len(reqs)


SERVE = {"hidden": _hidden, "linear": _linear, "generate": _generate, "backward": _backward}
FORWARD = ("hidden", "linear")  # the forward passes, served before the other kinds (Batcher._serve)


class MemberGPT(GPT):
    """A member's GPT: the same module (parameters, state_dict, checkpoints), whose forward passes
    without a KV cache, heads (GPT.linear), samplings and backward passes go through its batcher."""

    batcher: Batcher

    def hidden(self, idx, pos=None, key_mask=None, cache=None, attn_mask=None):
        if cache is not None:  # the cached forward of the slow sampler: alone
            return super().hidden(idx, pos, key_mask, cache, attn_mask)
        return self.batcher.submit(
            "hidden", self, idx, *self.inputs(idx, pos, key_mask, None, attn_mask)
        )

    def linear(self, x, weight, bias=None):
        return self.batcher.submit("linear", self, x, weight, bias)

    def batched_generate(
        self, prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator
    ):
        """lm/sampling.generate of this member, drawn in one batch with the others'."""
        return self.batcher.submit(
            "generate",
            self,
            prompt_ids,
            prompt_mask,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            generator,
        )

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), in one pass with the other members' losses."""
        self.batcher.submit("backward", self, loss)

    # a copy (π_ref, a critic's trunk) is a member too, of the same batcher
    def __deepcopy__(self, memo):
        memo[id(self.batcher)] = self.batcher
        new = object.__new__(type(self))
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new
