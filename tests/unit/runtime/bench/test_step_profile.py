"""Where a trainer step's time goes (runtime/bench/step_profile.py): each kernel or op put in its class, the breakdown
of profiler events (device kernels on CUDA, leaf ops' own time on CPU) with the host gaps, and a real torch profile
of a tiny matrix product on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_deploy.runtime.bench import step_profile as sp


@pytest.mark.parametrize(("kernel", "op", "shapes", "ancestors", "cls"), [
    ("aten::mm", "aten::mm", [[512, 1536], [1536, 1536]], [], "matmul"),
    ("aten::mm", "aten::mm", [[512, 1536], [1536, 8]], [], "lora thin"),  # one dim at the adapter's rank
    ("sm90_xmma_gemm_bf16", "aten::mm", [[512, 1536], [1536, 1536]], [], "matmul"),
    ("gemv2T_kernel", "aten::addmv", [], [], "lora thin"),
    ("flash_fwd_kernel", "aten::_flash_attention_forward", [], [], "attention"),
    ("aten::mm", "aten::mm", [[512, 1536], [1536, 151936]], ["aten::linear", sp.HEAD_LABEL], "log-prob head"),
    ("triton_poi_fused__to_copy_0", "", [], [], "casts/copies"),
    ("triton_red_fused_add_mean_pow_rsqrt_1", "", [], [], "elementwise"),
    ("aten::_to_copy", "aten::_to_copy", [], [], "casts/copies"),
    ("aten::silu", "aten::silu", [], [], "elementwise"),
    ("aten::embedding", "aten::embedding", [], [], "other"),
])
def test_each_kernel_falls_in_one_class(kernel, op, shapes, ancestors, cls):
    assert sp.classify(kernel, op, shapes, ancestors, rank=8) == cls


def event(name, own_us=0.0, kernels=(), children=(), parent=None, shapes=()):
    return SimpleNamespace(name=name, self_cpu_time_total=own_us, cpu_children=list(children), cpu_parent=parent,
                           kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels],
                           input_shapes=list(shapes))


def test_the_cpu_breakdown_counts_aten_ops_own_time_and_the_rest_of_the_wall_as_host_gaps():
    leaf = event("aten::mm", own_us=3000.0, shapes=[[32, 64], [64, 64]])
    copy = event("aten::_to_copy", own_us=1000.0)
    python = event("forward", own_us=9999.0)  # not an aten op: a label around the others
    result = sp.breakdown_of([leaf, copy, python], wall_us=10_000.0, rank=8, on_device=False)
    assert result["busy_s"] == pytest.approx(0.004) and result["wall_s"] == pytest.approx(0.01)
    assert result["classes"]["matmul"] == pytest.approx(0.003)
    assert result["classes"]["casts/copies"] == pytest.approx(0.001)
    assert result["classes"]["host gaps"] == pytest.approx(0.006)
    assert list(result["classes"]) == [*sp.CLASSES, "host gaps"]
    assert [k["name"] for k in result["top_kernels"]] == ["aten::mm", "aten::_to_copy"]


def test_the_device_breakdown_reads_the_kernels_and_never_has_negative_gaps():
    head = event("grpo_deploy: fused log-prob head")
    launched = event("aten::mm", kernels=[("nvjet_gemm", 5000.0)], parent=head, shapes=[[4, 64], [64, 151936]])
    lora = event("aten::mm", kernels=[("nvjet_gemm", 1000.0)], shapes=[[4, 64], [64, 8]])
    result = sp.breakdown_of([launched, lora], wall_us=4000.0, rank=8, on_device=True)
    assert result["classes"]["log-prob head"] == pytest.approx(0.005)
    assert result["classes"]["lora thin"] == pytest.approx(0.001)
    assert result["classes"]["host gaps"] == 0.0  # kernels overlapping past the wall: no negative gap


def test_a_real_profile_of_a_tiny_product_on_the_cpu():
    """A real CPU profile counts matrix products (CPU aten::mm has resolve_conj children; its self time is the
    product's): they were skipped as parent ops once, and their time went to host gaps."""
    import torch
    weight, thin = torch.randn(64, 64), torch.randn(64, 4)

    def run_one(batch):
        x = batch["x"].to(torch.float64).to(torch.float32)
        (x @ weight @ thin).sum()

    result = sp.profile_microbatches(run_one, [{"x": torch.randn(32, 64)}] * 3, "cpu", rank=4)
    assert result["microbatches"] == 3 and result["wall_s"] > 0
    assert set(result["per_microbatch_s"]) == set(result["share"]) == {*sp.CLASSES, "host gaps"}
    assert result["classes"]["casts/copies"] > 0
    assert result["classes"]["matmul"] > 0 and result["classes"]["lora thin"] > 0
