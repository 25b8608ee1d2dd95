"""Plain references written from the definitions (a helper module, not a test file): the indexer's
logits from the cache's layout alone (no helper of kernels.logits), and the top-k contract from
torch.topk alone. The logits multiply in the torch reference's operand order (q @ k^T, then the head
sum over a contiguous copy), so they can be compared with it bit for bit."""

import torch

from kernels.paged import PAGE


def live_entries(page_table, seq_lens):
    """Where each request's entries live, from the cache's definition: entry t of request b at slot
    t % PAGE of page page_table[b, t // PAGE], for t up to the longest request (a dead entry reads
    page 0: its page id may be garbage, and its logit is masked). Returns (pages, slots, live)."""
    t = torch.arange(int(seq_lens.max()) if seq_lens.numel() else 0)
    live = t[None, :] < seq_lens[:, None]
    pages = torch.where(live, page_table[:, t // PAGE].long(), 0)
    return pages, (t % PAGE).expand_as(pages), live


def head_sum(q, k, w):
    """sum_h w[b, h] * relu(q[b, h] . k[b, t]) -> [bs, T] float32: the scores multiplied as q @ k^T
    ([bs, H, T]), the head sum from a contiguous [bs, T, H] float32 copy."""
    scores = torch.bmm(q, k.transpose(1, 2)).transpose(1, 2).float().contiguous().relu()
    return torch.bmm(scores, w.float().unsqueeze(-1)).squeeze(-1)


def masked(logits, live, max_len):
    """[bs, T] logits of the live entries in [bs, max_len], -inf everywhere else."""
    out = torch.full((logits.shape[0], max_len), float("-inf"))
    out[:, : logits.shape[1]] = logits.masked_fill(~live, float("-inf"))
    return out


def plain_ref_bf16(q, w, kcache, page_table, seq_lens, max_len):
    pages, slots, live = live_entries(page_table, seq_lens)
    k = kcache[pages, slots]  # [bs, T, D]
    return masked(head_sum(q.to(k.dtype), k, w), live, max_len)


def plain_ref_fp8(q, w, pages, page_table, seq_lens, max_len, compute_dtype=torch.bfloat16):
    """The fp8 page: PAGE * D e4m3 bytes, entry by entry, then PAGE float32 scales; the scale s > 0
    of an entry leaves relu(q . k * s) = relu(q . k) * s, so it scales the head sum."""
    ids, slots, live = live_entries(page_table, seq_lens)
    d = q.shape[-1]
    values = pages[:, : PAGE * d].view(-1, PAGE, d)[ids, slots]  # [bs, T, D] bytes
    k = values.view(torch.float8_e4m3fn).to(compute_dtype)
    scale = pages[:, PAGE * d :].view(torch.float32)[ids, slots]  # [bs, T]
    return masked(head_sum(q.to(compute_dtype), k, w) * scale, live, max_len)


def topk_contract(x, k):
    """The top-k contract from torch.topk, row by row: the indices of the k largest entries that are
    not -inf, ascending, then -1 for each -inf one."""
    vals, idx = torch.topk(x, k, dim=-1)
    rows = [sorted(i[~torch.isneginf(v)].tolist()) for v, i in zip(vals, idx)]
    return torch.tensor([r + [-1] * (k - len(r)) for r in rows], dtype=torch.int32)
