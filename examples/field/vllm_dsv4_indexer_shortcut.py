"""vLLM DeepSeek-V4 indexer: a host-side short-context shortcut baked into the graph at capture.

    python -m nblib audit examples/field/vllm_dsv4_indexer_shortcut.py:buggy   # exit 0: no race to name
    python -m nblib audit examples/field/vllm_dsv4_indexer_shortcut.py:fixed   # exit 0

Repository: vllm-project/vllm. Reference: pull request #52492, "[Bugfix][DSv4] Keep indexer scoring in
breakable graphs" (merged; related: #52448, and #49486, which added the shortcut, and #51430, which
moved DeepseekV4Indexer.forward into the captured region). Engine: vllm/models/deepseek_v4/attention.py,
DeepseekV4Indexer.forward. Buggy: main at 8efa13b700 (the pull request reports the failure still
reproduces there). Fixed: 292187dd8ca1b1bfa195f25b2886262527269999, the commit of #52492 that
local-inference-lab/vllm #429 backports "exactly". Both ids come from those two pull requests' text;
vllm-project/vllm's history was not read (examples/field/README.md).

The ordering. The indexer decides on the host, from the batch's attention metadata, whether the
compressed context fits in the top-k set; if it does it skips the learned scoring and selects every
candidate. Breakable piecewise capture runs the indexer with short dummy metadata, so the capture
records the shortcut, and the graph replays it for a batch whose cached prefix is long: above 2048
tokens a C4 layer has more than 512 candidates, must score them, and the replay selects candidates 0 to
511 instead. The fix does not take the shortcut while the stream is capturing; eager execution keeps
it. There is no second stream and nothing races: the capture audit rightly finds nothing in either
form. What sees it is the graph-vs-eager differential: `graph_vs_eager(dev, spec)` captures the step
with the short metadata, replays the graph for a long context and counts the rows whose selected set
differs from the eager step's on the same inputs (every row in the buggy form, none in the fixed form).
Scaled down: compress ratio 4, top-k 8, a capture context of 16 tokens, a replay context of 256.
"""

import _field
import torch

from nblib.instruments.audit import target as audit_target

TOKENS, DIM, RATIO, TOPK = 4, 16, 4, 8
CAPTURE_CONTEXT, LONG_CONTEXT = 16, 256


class Indexer:
    def __init__(self, dev, score_while_capturing):
        p = _field.params(dev)
        self.dev, self.score_while_capturing = dev, score_while_capturing
        self.q = p(TOKENS, DIM)
        self.k_cache = p(LONG_CONTEXT // RATIO, DIM)  # the compressed index keys
        self.weights = p(TOKENS, 1)
        self.num_candidates = torch.zeros(TOKENS, 1, dtype=torch.long, device=dev.torch_device)
        self.topk_indices = torch.zeros(TOKENS, TOPK, dtype=torch.long, device=dev.torch_device)
        self.set_context(CAPTURE_CONTEXT)

    def set_context(self, tokens):
        """What the runner does before each step: the host metadata and the static device inputs."""
        self.max_candidates = tokens // RATIO  # host-side attention metadata
        self.num_candidates.fill_(tokens // RATIO)

    def forward(self):
        shortcut = self.max_candidates <= TOPK  # every candidate fits: skip the scoring
        if self.score_while_capturing and self.dev.is_current_stream_capturing():
            shortcut = False  # #52492: the graph may replay for a longer context
        slots = torch.arange(TOPK, device=self.q.device).expand(TOKENS, TOPK)
        if shortcut:
            self.topk_indices.copy_(torch.where(slots < self.num_candidates, slots, -1))
            return self.topk_indices
        scores = (self.q @ self.k_cache.T) * self.weights
        visible = torch.arange(scores.shape[1], device=scores.device) < self.num_candidates
        top = scores.masked_fill(~visible, float("-inf")).topk(TOPK, dim=-1).indices
        self.topk_indices.copy_(torch.where(slots < self.num_candidates, top, -1))
        return self.topk_indices


def buggy(dev):
    """DeepseekV4Indexer.forward before #52492: the shortcut is taken while capturing too."""
    indexer = Indexer(dev, score_while_capturing=False)
    return _field.warm(dev, indexer.forward)


def fixed(dev):
    """#52492: while capturing, the indexer always scores."""
    indexer = Indexer(dev, score_while_capturing=True)
    return _field.warm(dev, indexer.forward)


def graph_vs_eager(dev, spec):
    """Rows whose selected candidate set differs between the graph's replay for a long context and the
    eager step on the same inputs."""
    step = audit_target.load(spec).fn(dev)
    rep = audit_target.audit_step(step, dev, target=spec)
    indexer = step.__self__
    indexer.set_context(LONG_CONTEXT)
    rep.audit_report.graph.replay()
    dev.synchronize()
    replayed = indexer.topk_indices.clone().sort(-1).values
    eager = step().clone().sort(-1).values
    return int((replayed != eager).any(-1).sum())
