"""The bench's packed step (runtime/bench/packed_step.py): the spans of each timed microbatch, from the device's
events where there are some, else from the host clock."""

from __future__ import annotations

import pytest

from grpo_deploy.runtime.bench import flops, packed_step


def test_microbatch_spans_take_the_device_events_where_there_are_some():
    class Event:
        def __init__(self, ms):
            self.ms = ms

        def elapsed_time(self, other):
            return other.ms - self.ms

    assert packed_step.microbatch_spans([(1.0, None), (1.5, None), (3.0, None)]) == {
        "microbatch_s": [0.5, 1.5], "host_microbatch_s": [0.5, 1.5]}
    spans = packed_step.microbatch_spans([(1.0, Event(0.0)), (1.25, Event(400.0)), (1.5, Event(1000.0))])
    assert spans == {"microbatch_s": [0.4, 0.6], "host_microbatch_s": [0.25, 0.25]}


def test_a_configuration_row_counts_the_work_and_the_mfu_of_its_microbatches():
    torch = pytest.importorskip("torch")
    shape = flops.ModelShape(hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)
    # one packed row: two samples of 2 and 3 tokens, the prompt tokens (index -1) forwarded but not trained
    batch = {"attention_mask": torch.ones(1, 5, dtype=torch.long),
             "token_index": torch.tensor([[-1, 0, -1, 0, 1]]),
             "tree_cu_seqlens_q": torch.tensor([[0, 2, 5, -1]]), "tree_cu_seqlens_k": torch.tensor([[0, 2, 5, -1]])}
    row = packed_step.summarise("packed", 256, False, [batch, batch], {"seconds": 2.0, "peak_gib": 1.5}, shape, 1,
                                samples=4, peak=None)
    assert (row["forwarded_tokens"], row["trained_tokens"], row["attention_pairs"]) == (10, 6, 2 * (3 + 6))
    assert row["tokens_per_s"] == 5.0 and row["trained_tokens_per_s"] == 3.0 and row["samples_per_hour"] == 7200
    assert row["microbatches"] == 2 and row["peak_gib"] == 1.5
    assert row["mfu_model"] is None and row["mfu_lora"] is None and row["mfu_trl"] is None  # no peak: no MFU
    work = flops.Work(forwarded=10, trained=6, pairs=18)
    peaked = packed_step.summarise("packed", 256, False, [batch, batch], {"seconds": 2.0, "peak_gib": None}, shape,
                                   1, samples=4, peak=1e6)
    assert peaked["mfu_model"] == pytest.approx(flops.mfu(flops.model_flops(shape, work), 2.0, 1e6))
    assert peaked["mfu_lora"] == pytest.approx(flops.mfu(flops.lora_flops(shape, work, 1), 2.0, 1e6))
    assert peaked["tflops_model"] == pytest.approx(flops.model_flops(shape, work) / 2.0 / 1e12)
