"""Write a vendored CRD schema: the openAPIV3Schema of one version of an upstream CustomResourceDefinition, without
its descriptions (upstream prose) and without status (never written by us), as YAML under a header naming the source.

    python -m tests.static.crds.vendor CRD_FILE VERSION OUT "SOURCE (repository, tag, commit, path)"
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def vendored(crd: dict, version: str) -> dict:
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strip(ver["schema"]["openAPIV3Schema"])
    schema["properties"].pop("status", None)
    return {"group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version,
            "openAPIV3Schema": schema}


def main(argv: list[str]) -> int:
    crd_file, version, out, source = argv
    (crd,) = [d for d in yaml.safe_load_all(Path(crd_file).read_text()) if d]
    header = "".join(f"# {line}\n" for line in (
        "Vendored CRD schema, from:", *source.split(", "),
        f"spec.versions[{version}].schema.openAPIV3Schema; descriptions and status removed by",
        "tests/static/crds/vendor.py. Read by tests/static/test_k8s.py."))
    Path(out).write_text(header + yaml.safe_dump(vendored(crd, version), sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
