"""Tests of grpo_deploy.diagnose.base: the step events read in time order, and diagnosis_text, what `grpo-deploy
diagnose` prints with an engine's labels."""

from grpo_deploy.diagnose.base import Diagnosis, Knob, diagnosis_text, step_events

LABELS = {"step_s": ("step time", ".2f", " s"), "packing": ("packing", "", ""),
          "share": ("generation share", ".0%", "")}


def test_step_events_are_the_step_events_in_time_order():
    events = [{"event": "step", "time": 3.0, "step": 2}, {"event": "watch", "time": 1.0},
              {"event": "step", "time": 1.5, "step": 1}, {"event": "run_end", "time": 9.0}]
    assert [e["step"] for e in step_events(events)] == [1, 2]
    assert step_events([]) == []


def test_text_shows_the_labelled_evidence_the_knobs_in_order_and_what_was_not_recorded():
    d = Diagnosis("trainer-bound", "the trainer is the bottleneck",
                  evidence={"step_s": 12.345, "packing": False, "share": 0.25, "unlabelled": 1, "missing": None},
                  next_knobs=[Knob("runtime.packing", "true", "packs sequences"), Knob("lora.r", "16", "smaller")],
                  not_recorded=["perf/fwd_bwd_s"], notes=["one note"])
    text = diagnosis_text(d, LABELS)
    lines = text.splitlines()
    assert lines[:4] == ["diagnosis: trainer-bound", "  the trainer is the bottleneck", "", "evidence:"]
    assert "  step time         12.35 s" in lines and "  packing           off" in lines
    assert "  generation share  25%" in lines and "unlabelled" not in text
    assert "  1. runtime.packing: true\n     packs sequences\n  2. lora.r: 16" in text
    assert text.endswith("notes:\n  - one note\n\nnot recorded:\n  - perf/fwd_bwd_s")
    assert d.to_dict()["next_knobs"][0] == {"setting": "runtime.packing", "value": "true", "why": "packs sequences"}


def test_a_diagnosis_without_knobs_or_notes_prints_only_its_evidence():
    text = diagnosis_text(Diagnosis("balanced", "nothing waits", evidence={"step_s": 1.0}), LABELS)
    assert text == "diagnosis: balanced\n  nothing waits\n\nevidence:\n  step time         1.00 s"


def test_figures_near_the_floats_limit_are_no_figures_and_text_is_printed_without_escapes():
    from grpo_deploy.diagnose.base import is_number, mean, rounded

    assert mean([1e308, 1e308]) is None and mean([1.0, 3.0]) == 2.0  # fsum overflows: not a traceback
    assert rounded(float("inf")) is None and rounded(float("nan")) is None and rounded(1.23456) == 1.2346
    assert not is_number(10**400) and not is_number(True) and is_number(10**30)
    d = Diagnosis("balanced\x1b[2J", "no side\u202e waits\x1b]0;t\x07", evidence={"packing": "on\x9b31m"},
                  notes=["a\x07b"])
    text = diagnosis_text(d, LABELS)
    assert text.splitlines()[:2] == ["diagnosis: balanced", "  no side waits"] and "  - ab" in text
    assert "  packing           on" in text
