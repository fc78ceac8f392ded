"""A population's side of sampling: its members' prompts encoded at once (PromptTable: what their
lm/sampling.Request's carry) and their completions read back at once (read_completions). The
sampling itself is the single run's own loop, lm/sampling.generate_all, over the members' stacked
weights, each member drawing from its own generator as its own generate() call would.

    table = PromptTable(tok, prompts, device)
    encoded = table.encode(rows)         # rows[p]: member p's prompts -> [(ids, mask)]
    gens = generate_all(stack, [Request(ids, mask, ..., ids.size(1)) for ids, mask in encoded])
    read = read_completions(tok, gens)   # each member's (texts, finished), None where it failed
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from minigrpo.lm.sampling import Generation, encode_prompts
from minigrpo.lm.tokenizer import PAD_ID


class PromptTable:
    """Every member's step prompts encoded at once from the run's prompts encoded once: member p's
    (ids, key_mask) are lm/sampling.encode_prompts(tok, rows_p) (its rows left-padded to its own
    widest), views of one gather.

        table = PromptTable(tok, run.prompts, device)
        encoded = table.encode([rows_0, rows_1, ...])   # each member's rows (prompts of the table)
                                                        # -> [(ids, mask)]

    A member's ids are as wide as its longest prompt: its Request's prompt_len is ids.size(1).
    """

    def __init__(self, tok, prompts: list[str], device):
        self.ids, self.key_mask = encode_prompts(tok, prompts, device)  # (K, W)
        self.index = {x: i for i, x in enumerate(prompts)}
        # each prompt's real tokens, BOS included
        self.width = dict(zip(prompts, self.key_mask.sum(1).tolist()))

    def encode(self, rows: list[list[str]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # (P, N)
        pick = torch.tensor([[self.index[x] for x in r] for r in rows]).to(self.ids.device)
        ids, key_mask, W = self.ids[pick], self.key_mask[pick], self.ids.size(1)
        cut = [W - max(self.width[x] for x in r) for r in rows]
        return [(ids[p, :, c:], key_mask[p, :, c:]) for p, c in enumerate(cut)]


def read_completions(tok, gens: list) -> list:
    """Each member's completion texts and finished flags (lm/sampling.decode_completions',
    gen.finished's), every member's read back in one go, and each distinct row decoded once: rows
    repeat (a group's samples, a policy that has settled), and a row's Python decode costs more than
    its bytes' lookup; None for a member whose sampling failed."""
    ok = [g for g in gens if isinstance(g, Generation)]
    if not ok:
        return [None] * len(gens)
    # a member's rows padded on the right: decode drops PAD
    T = max(g.completion_ids.size(1) for g in ok)
    ids = torch.cat(
        [
            g.completion_ids
            if g.completion_ids.size(1) == T
            else F.pad(g.completion_ids, (0, T - g.completion_ids.size(1)), value=PAD_ID)
            for g in ok
        ]
    )
    # (R, T + 1)
    rows = torch.cat([ids, torch.cat([g.finished for g in ok])[:, None].long()], 1).cpu().numpy()
    flat, width = rows.tobytes(), rows.itemsize * rows.shape[1]
    keys = [flat[i : i + width] for i in range(0, len(flat), width)]  # each row's bytes
    read = {}
    for k in set(keys):
        *row, finished = np.frombuffer(k, rows.dtype).tolist()
        read[k] = (tok.decode(row), bool(finished))
    out, start = [], 0
    for g in gens:
        if not isinstance(g, Generation):
            out.append(None)
            continue
        mine, start = [read[k] for k in keys[start : start + g.ids.size(0)]], start + g.ids.size(0)
        out.append(([text for text, _ in mine], [finished for _, finished in mine]))
    return out
