"""Reading `grpo-deploy check` output in tests: {(host, check): its line}."""


def check_lines(out: str) -> dict[tuple[str, str], str]:
    """{(host, check): the line} of each PASS/FAIL/SKIP row of `grpo-deploy check` output."""
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("PASS", "FAIL", "SKIP"):
            found[(parts[1], parts[2])] = line
    return found
