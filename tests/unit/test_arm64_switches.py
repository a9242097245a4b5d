"""tests/arm64_switches.py: the record says per switch whether it ran, was exact or could not run and why; the test
that makes it stays out of `make test` and has its own target."""

from __future__ import annotations

import re
from pathlib import Path

from tests import arm64_switches

ROOT = Path(__file__).resolve().parents[2]

REPORT = {
    "date": "2026-12-04", "machine": "aarch64", "device": "cpu", "versions": {"torch": "2.13.0+cu130", "triton": None},
    "speed": [
        {"switches": "today", "seconds": 1.5, "compile_s": 0.0, "graphs_warmup": 0, "recompiles_in_step": 0},
        {"switches": "bf16", "token_budget": 256, "skipped": "base_dtype bf16 needs bf16 autocast (this run is fp32)"},
        {"switches": "compile", "token_budget": 256, "failure": "BackendCompilerFailed: no g++"},
        {"switches": "compile+lora-ew", "seconds": 9.0, "compile_s": 300.0, "graphs_warmup": 9,
         "recompiles_in_step": 0},
    ],
    "exactness": {"rows": [
        {"switches": "today", "exact": True, "vs_fp32": {"loss": 1e-3, "grad": 5e-3},
         "tolerance": {"loss": 3.9e-3, "grad": 1e-2}},
        {"switches": "bf16", "exact": False, "vs_fp32": {"loss": 2e-2, "grad": 5e-3},
         "tolerance": {"loss": 3.9e-3, "grad": 1e-2}},
        {"switches": "compile+lora-ew", "failure": "InductorError: CppCompileError: C++ compile error"},
    ]},
}


def test_each_row_says_what_ran_and_what_did_not():
    lines = {label: (timed, verdict) for label, timed, verdict in arm64_switches.verdicts(REPORT)}
    assert lines["today"][0].startswith("runs: 1.50 s/step, compile 0.0 s, 0 graphs")
    assert lines["today"][1].startswith("exact under bf16 autocast: loss 1.0e-03")
    assert lines["bf16"] == ("not timed: base_dtype bf16 needs bf16 autocast (this run is fp32)",
                             lines["bf16"][1]) and lines["bf16"][1].startswith("NOT EXACT")
    assert lines["compile"] == ("not timed: BackendCompilerFailed: no g++", "not checked")
    assert lines["compile+lora-ew"][1] == ("FAILED in the exactness step: InductorError: CppCompileError: C++ "
                                           "compile error")


def test_the_record_names_the_machine_versions_and_rows():
    text = arm64_switches.record(REPORT, 321.4)
    assert "verified 2026-12-04 at " in text and "machine aarch64, device cpu" in text
    assert "versions torch 2.13.0+cu130\n" in text, "a missing package is left out, not printed as None"
    assert "bench wall 321 s under emulation" in text
    assert "compile: not timed: BackendCompilerFailed: no g++; not checked" in text


def test_make_test_leaves_it_out_and_its_target_records_it():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test: .*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    marks = re.search(r"^TEST_MARKS := (.*)$", makefile, re.M).group(1)
    assert "not arm64_switches" in marks
    pytest_lines = [line for line in recipe.splitlines() if "-m pytest" in line]
    assert len(pytest_lines) == 2 and all('-m "$(TEST_MARKS)"' in line for line in pytest_lines), pytest_lines
    target = re.search(r"^test-arm64-switches: .*## .*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-m arm64_switches tests/integration/test_arm64_switches.py" in target
    assert "python" in target.lower() and "-m tests.arm64_switches --record" in target
    module = (ROOT / "tests" / "integration" / "test_arm64_switches.py").read_text()
    assert "pytest.mark.arm64_switches" in module
