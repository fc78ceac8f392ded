"""A population's completions read back at once (read_completions); the sampling itself is the
single run's own, lm/sampling.generate_all over the members' stacked weights."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import PAD_ID


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
