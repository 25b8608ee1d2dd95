"""TorchRec fused sparse-dist pipeline: the embedding lookup reads input-dist output it never waited for.

    python -m nblib audit examples/field/torchrec_emb_lookup_stream.py:buggy   # exit 1: read-after-write
    python -m nblib audit examples/field/torchrec_emb_lookup_stream.py:fixed   # exit 0

Repository: meta-pytorch/torchrec. Reference: pull request #4497, "Fix embedding lookup stream
synchronization" (merged). Engine: torchrec/distributed/train_pipeline/utils.py, _start_embedding_lookup
(kept as _start_embedding_lookup_legacy behind a kill switch; the fix is
_start_embedding_lookup_stream_synced), called from TrainPipelineFusedSparseDist.start_embedding_lookup
in torchrec/distributed/train_pipeline/train_pipelines.py with emb_lookup_stream="new". Buggy:
d0397f7d9d76179e86b8e2eefb8db978e8bdcfca. Fixed: 88966ecbb9fe729bf4aa764acb7439821bd8082c.

The ordering. start_embedding_lookup makes the embedding-lookup stream current and calls
_start_embedding_lookup(source_stream=data-dist stream, target_stream=the default stream). Inside, the
input-dist awaitable is resolved under the source stream (its completion wait and recat kernels write
the KJT there, in the data-dist stream's pool), `kjt.record_stream(target_stream)` is called, and
`compute_and_output_dist` runs on the current stream: the lookup stream, which never waited on the
data-dist stream. Nothing orders the lookup's read of the KJT after the kernels that write it (a
read-after-write race), and the stream that actually reads it is not recorded with the allocator. The
fix records an event on the source stream after the wait, makes the current stream wait on it, and
records the KJT and the module context on every consuming stream (current and target).

A captured graph needs each side stream forked from the capturing stream: the target forks both the
data-dist and the lookup stream from it at the start of the step, before the input dist, so that fork
orders nothing the race depends on. The KJT is one id tensor, the module context one tensor of lengths,
the lookup one embedding-bag sum; the all-to-all is a permutation on the data-dist stream.
"""

import _field
import torch

ROWS, IDS, VOCAB, DIM = 8, 4, 64, 16


class Pipeline:
    def __init__(self, dev, synced):
        p = _field.params(dev)
        self.dev, self.synced = dev, synced
        g = torch.Generator().manual_seed(2)
        self.batch_ids = torch.randint(0, VOCAB, (ROWS, IDS), generator=g).to(dev.torch_device)  # on device
        self.recat = torch.randperm(ROWS, generator=g).to(dev.torch_device)  # the all-to-all's permutation
        self.table = p(VOCAB, DIM)
        self.pooled = torch.zeros(ROWS, DIM, device=dev.torch_device)
        self.data_dist_stream = dev.Stream()
        self.emb_lookup_stream = dev.Stream()  # emb_lookup_stream="new"

    def start_data_dist(self):
        """The input dist on the data-dist stream; returns its awaitable."""
        with self.dev.stream(self.data_dist_stream):
            sent = self.batch_ids.flatten().clone()  # the splits and the sent ids
        return lambda: self._wait_input_dist(sent)

    def _wait_input_dist(self, sent):
        kjt = sent.view(ROWS, IDS)[self.recat]  # the received ids, recatted: written on the source stream
        module_context = (kjt >= 0).sum(-1)  # lengths the output dist reads later
        return kjt, module_context

    def start_embedding_lookup(self, awaitable):
        dev = self.dev
        target_stream = dev.current_stream()
        source_stream = self.data_dist_stream
        with dev.stream(self.emb_lookup_stream):
            current_stream = dev.current_stream()
            with dev.stream(source_stream):
                kjt, module_context = awaitable()
                source_event = source_stream.record_event() if self.synced else None
            if self.synced:
                current_stream.wait_event(source_event)  # the lookup waits for the stream writing its input
                for s in (current_stream, target_stream):
                    dev.record_stream(kjt, s)
                    dev.record_stream(module_context, s)
            else:
                dev.record_stream(kjt, target_stream)
                dev.record_stream(module_context, target_stream)
            # compute_and_output_dist, on the lookup stream
            emb = self.table[kjt].sum(1) / module_context[:, None].clamp(min=1)
            self.pooled.copy_(emb)

    def step(self):
        dev = self.dev
        main = dev.current_stream()
        self.data_dist_stream.wait_stream(main)  # the forks the capture needs
        self.emb_lookup_stream.wait_stream(main)
        awaitable = self.start_data_dist()
        self.start_embedding_lookup(awaitable)
        main.wait_stream(self.emb_lookup_stream)  # wait_embedding_lookup
        main.wait_stream(self.data_dist_stream)
        return self.pooled


def buggy(dev):
    """_start_embedding_lookup before #4497: no edge from the data-dist stream to the lookup stream."""
    return _field.warm(dev, Pipeline(dev, synced=False).step)


def fixed(dev):
    """_start_embedding_lookup_stream_synced: an event from the source stream, records on each consumer."""
    return _field.warm(dev, Pipeline(dev, synced=True).step)
