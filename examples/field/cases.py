"""The field cases as a typed table: each real bug, where it lives upstream, its buggy and fixed targets,
what the capture audit is expected to say on each, and, where the audit has nothing to name, which
instrument sees the bug.

    from cases import CASES        # with examples/field on the path, or load this file by path
    for case in CASES:
        for form in case.forms: form.target, form.expect.status, form.expect.kind, form.expect.tensor

The expectations are the simulator's verdicts (tests/test_field.py checks them); scripts/field_table.py
writes each case's verdicts per backend. README.md beside this file says what could not be verified.
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

FIELD = "examples/field"
ROOT = Path(__file__).resolve().parents[2]

Status = Literal["hazards", "clean", "failed"]
Kind = Literal["read-after-write", "write-after-read", "write-after-write"]
EXIT = {"clean": 0, "hazards": 1, "failed": 2}


class Expect(BaseModel):
    """What the audit says on one form: the verdict and, for a hazard, the racing tensor (the op issued
    first reads or writes it), the line that allocates it and the line where its storage dies."""

    status: Status
    kind: Kind | None = None
    tensor: str | None = None  # the variable at the allocation line
    allocated: str | None = None  # code on that line
    freed: str | None = None  # code on the line that drops the storage (None: not freed in the capture)
    source: str | None = None  # the file holding those lines, when not the target's own

    @property
    def exit_code(self):
        return EXIT[self.status]

    def says(self):
        if self.status == "hazards":
            return f"{self.kind} on {self.tensor}"
        return "none" if self.status == "clean" else "capture fails"


class Form(BaseModel):
    role: Literal["buggy", "fixed"]
    target: str  # examples/field/x.py:function
    ref: str  # the upstream pull request this form's ordering comes from
    commit: str  # the engine's commit with this ordering, or why no id could be read
    expect: Expect

    @property
    def file(self):
        return self.target.split(":")[0]


class Check(BaseModel):
    """The instrument that sees the bug where the capture audit cannot: `function(dev, target)` in the
    case's file (or measure.py) returns one number per form."""

    function: str  # examples/field/x.py:function
    unit: str
    expect: Literal["buggy_above_fixed", "fixed_above_buggy", "buggy_nonzero_fixed_zero"]


class Case(BaseModel):
    id: str
    bug: str
    repository: str
    reference: str
    engine_files: list[str]
    forms: list[Form]
    sees_it: str  # the instrument that sees the bug
    check: Check | None = None

    def form(self, role):
        return next(f for f in self.forms if f.role == role)


def _held(expect):
    return Check(
        function=f"{FIELD}/measure.py:held_peak", unit="peak bytes held by the capture", expect=expect
    )


CASES = [
    Case(
        id="sglang-36547",
        bug="DeepSeek-V4 fused WQ-A/WKV prepare frees qkv_a (made on main, read on the KV stream) "
        "before the join",
        repository="sgl-project/sglang",
        reference="PR #36547",
        engine_files=["python/sglang/srt/models/deepseek_v4.py: MQALayer._forward_prepare_multi_stream"],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/sglang_dsv4_qkv_a.py:buggy",
                ref="#36547 (before)",
                commit="000328a8cd54dd3aac97cd9977c39b5408034b26",
                expect=Expect(
                    status="hazards",
                    kind="write-after-read",
                    tensor="qkv_a",
                    allocated="qkv_a = self.x @ self.w_qkv_a",
                    freed="del qkv_a",
                    source="examples/audit/dsv4_attention.py",
                ),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/sglang_dsv4_qkv_a.py:fixed",
                ref="#36547",
                commit="the merge of #36547: id not recorded (README.md)",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="the audit names it",
    ),
    Case(
        id="sglang-39671",
        bug="DeepSeek-V4.1 candidate indexer records logits on the side stream but not the side-stream "
        "tensors main reads (blocks, schedule, phys_blocks, valid_lens)",
        repository="sgl-project/sglang",
        reference="PR #39671 (review)",
        engine_files=[
            "python/sglang/srt/layers/attention/dsv4/candidate_indexer_deep_gemm.py: "
            "DeepGemmCandidateIndexer.publish_decode, select_decode"
        ],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/sglang_dsv41_candidate_indexer.py:buggy",
                ref="#39671 as reviewed",
                commit="the pull request's pre-review head: id not recorded (README.md)",
                expect=Expect(status="clean"),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/sglang_dsv41_candidate_indexer.py:fixed",
                ref="#39671 as merged",
                commit="097df40dc4346e7332083e06d7530f35bcf10513 (a stored version with the fix)",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="no race in the engine's ordering (the next publish's wait_stream orders the reuse); "
        "the allocator trace shows the fix's cost",
        check=_held("fixed_above_buggy"),
    ),
    Case(
        id="vllm-ascend-13394",
        bug="sampler's q is made on the global stream, read on the current stream after wait_stream only",
        repository="vllm-project/vllm-ascend",
        reference="PR #13394 (main); backports #13396-#13406 (#13400, #13404, #13406 among them)",
        engine_files=["vllm_ascend/sample/sampler.py: random_sample"],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/vllm_ascend_sampler_q.py:buggy",
                ref="#13394 (before)",
                commit="0703581e8d530d2ae8079a740ec70843883add5f",
                expect=Expect(
                    status="hazards",
                    kind="write-after-read",
                    tensor="q",
                    allocated="q = torch.empty_like(probs)",
                    freed="out.copy_(self.random_sample(probs))",
                ),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/vllm_ascend_sampler_q.py:fixed",
                ref="#13394",
                commit="fc0ce85b58f019e5a1988dbd3f39d014052fb44b",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="the audit names it",
    ),
    Case(
        id="torchrec-4218",
        bug="memory stashing frees a storage with resize_(0) while a side-stream D2H copy still reads it",
        repository="meta-pytorch/torchrec",
        reference="PR #4218 (fix), PR #4231 (reproducer)",
        engine_files=[
            "torchrec/distributed/memory_stashing.py: MemoryStashingManager execute_stash",
            "torchrec/distributed/benchmark/benchmark_comms.py: data_copy_record_stream (#4231)",
        ],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/torchrec_stash_d2h.py:buggy",
                ref="#4218 (before)",
                commit="f3b5a9a6a64e287876cf29f6f4b2af399bd439aa",
                expect=Expect(
                    status="hazards",
                    kind="write-after-read",
                    tensor="tensor",
                    allocated="tensor = self.x @ self.w",
                    freed="tensor.data = tensor.new_empty(0)",
                ),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/torchrec_stash_d2h.py:fixed",
                ref="#4218",
                commit="f9799f4ed5040849b53783f14b26572bccdf2c73",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="the audit names it",
    ),
    Case(
        id="torchrec-4497",
        bug="fused sparse-dist pipeline's embedding lookup reads input-dist output on a stream that "
        "never waited for the data-dist stream",
        repository="meta-pytorch/torchrec",
        reference="PR #4497",
        engine_files=["torchrec/distributed/train_pipeline/utils.py: _start_embedding_lookup"],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/torchrec_emb_lookup_stream.py:buggy",
                ref="#4497 (before)",
                commit="d0397f7d9d76179e86b8e2eefb8db978e8bdcfca",
                expect=Expect(
                    status="hazards",
                    kind="read-after-write",
                    tensor="kjt",
                    allocated="kjt = sent.view(ROWS, IDS)[self.recat]",
                ),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/torchrec_emb_lookup_stream.py:fixed",
                ref="#4497",
                commit="88966ecbb9fe729bf4aa764acb7439821bd8082c",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="the audit names it",
    ),
    Case(
        id="sglang-29463-30460",
        bug="dual-stream MoE: the routed deep_gemm pre-permute's dispose_tensor empties the hidden "
        "states the shared expert reads on the side stream",
        repository="sgl-project/sglang",
        reference="PR #29142 (reverted by #29452), PR #29463, PR #30460 (with #30025)",
        engine_files=[
            "python/sglang/srt/models/deepseek_v2.py: DeepseekV2MoE.forward_normal_dual_stream",
            "python/sglang/srt/layers/moe/moe_runner/deep_gemm.py: pre_permute_standard_to_deep_gemm",
            "python/sglang/srt/utils/common.py: dispose_tensor",
        ],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/sglang_moe_dispose.py:null_pointer",
                ref="#29142",
                commit="999199f9ff4bae422b97f20ca9c0e6a9c14f6cfc",
                expect=Expect(status="failed"),
            ),
            Form(
                role="buggy",
                target=f"{FIELD}/sglang_moe_dispose.py:buggy",
                ref="#29463",
                commit="6bdecb8206b8d066e9cfb4ed6032e5a1e9b14340",
                expect=Expect(
                    status="hazards",
                    kind="write-after-read",
                    tensor="hidden_states",
                    allocated="hidden_states = xf * torch.rsqrt",
                    freed="x.data = x.new_empty(0)",
                ),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/sglang_moe_dispose.py:fixed",
                ref="#30460",
                commit="87992eeec4072995e8fa98fb2d0f3a7e5e581f2d",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="the audit names it (#29463's order); #29142's emptied tensor fails the capture "
        "(torch's shape check; the engine's kernels took its null pointer silently)",
    ),
    Case(
        id="megatron-4383",
        bug="combined 1F1B: record_stream inside a CUDA-graph capture holds each freed input until the "
        "capture ends (memory, not a race)",
        repository="NVIDIA/Megatron-LM",
        reference="PR #4383 (closed); pytorch/pytorch #175560, fixed by #175817",
        engine_files=[
            "megatron/core/pipeline_parallel/utils.py: ScheduleNode._forward, stream_acquire_context",
            "megatron/core/models/gpt/fine_grained_callables.py: should_free_input",
        ],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/megatron_1f1b_record_stream.py:buggy",
                ref="#4383 (base)",
                commit="9985e041a471c42a39aa6144da21f079694c1b65",
                expect=Expect(status="clean"),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/megatron_1f1b_record_stream.py:fixed",
                ref="#4383 (branch, not merged)",
                commit="643d4a973854dfa9507459b3e770ed1e2d55f48d",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="allocator trace of the capture (bytes held), the record_stream cost docs/audit.md "
        "describes; the audit rightly finds no race",
        check=_held("buggy_above_fixed"),
    ),
    Case(
        id="vllm-56476",
        bug="dual-batch overlap: both micro-batches write one model-wide persistent top-k buffer",
        repository="vllm-project/vllm",
        reference="PR #56476 (open)",
        engine_files=[
            "the DeepSeek-V4.1 sparse indexer's persistent top-k / candidate buffers",
            "vllm/v1/worker/ubatching.py: make_ubatch_contexts (one compute and one comm stream)",
        ],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/vllm_dbo_topk.py:buggy",
                ref="#56476 (before)",
                commit="open pull request: id not recorded (README.md)",
                expect=Expect(status="clean"),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/vllm_dbo_topk.py:fixed",
                ref="#56476",
                commit="open pull request: id not recorded (README.md)",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="micro-batched vs serial output comparison: the overwrite is ordered on one compute "
        "stream, not a race",
        check=Check(
            function=f"{FIELD}/vllm_dbo_topk.py:microbatched_vs_serial",
            unit="output rows that differ from the serial run",
            expect="buggy_nonzero_fixed_zero",
        ),
    ),
    Case(
        id="vllm-52492",
        bug="DeepSeek-V4 indexer's host-side short-context shortcut baked into the graph at capture",
        repository="vllm-project/vllm",
        reference="PR #52492",
        engine_files=["vllm/models/deepseek_v4/attention.py: DeepseekV4Indexer.forward"],
        forms=[
            Form(
                role="buggy",
                target=f"{FIELD}/vllm_dsv4_indexer_shortcut.py:buggy",
                ref="#52492 (before)",
                commit="8efa13b700 (main, per the pull request)",
                expect=Expect(status="clean"),
            ),
            Form(
                role="fixed",
                target=f"{FIELD}/vllm_dsv4_indexer_shortcut.py:fixed",
                ref="#52492",
                commit="292187dd8ca1b1bfa195f25b2886262527269999 (per local-inference-lab/vllm #429)",
                expect=Expect(status="clean"),
            ),
        ],
        sees_it="graph-vs-eager differential: a graph-vs-eager divergence with no race",
        check=Check(
            function=f"{FIELD}/vllm_dsv4_indexer_shortcut.py:graph_vs_eager",
            unit="rows whose selected set differs, replay vs eager",
            expect="buggy_nonzero_fixed_zero",
        ),
    ),
]


def check_holds(check, values):
    """Whether the per-role numbers {role: value} meet the check's expectation."""
    buggy, fixed = values["buggy"], values["fixed"]
    if check.expect == "buggy_above_fixed":
        return buggy > fixed
    if check.expect == "fixed_above_buggy":
        return fixed > buggy
    return buggy > 0 and fixed == 0
