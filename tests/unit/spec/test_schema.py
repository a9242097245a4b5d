"""Tests of grpo_deploy.spec.schema: the spec's types (umasks, checkpoint paths, dataset names, strict types), each
refusal at its dotted key."""

from __future__ import annotations

from grpo_deploy import spec
from grpo_deploy.spec import resolve
from tests.specs import loaded
from tests.unit.spec.bad_specs import PAIR
from tests.unit.spec.bad_specs import line_of as _line_of
from tests.unit.spec.bad_specs import problems as _problems


def test_wrong_type_names_the_key():
    (p,) = _problems(PAIR.replace("  uid: 1000", "  uid: lots"))
    assert p.key == "run.uid" and "integer" in p.message


def test_relative_checkpoint_dir_rejected():
    (p,) = _problems(PAIR.replace("  dir: null", "  dir: checkpoints/run1"))
    assert p.key == "checkpoints.dir" and "absolute" in p.message


def test_bad_role_umask_names_the_role_key():
    (p,) = _problems(PAIR.replace("  roles: {}", "  roles: {trainer: {umask: '0088'}}"))
    assert p.key == "run.roles.trainer.umask" and "write an octal string such as '0022'" in p.message
    assert p.where == f"bad.yaml:{_line_of(PAIR, '  roles: {}')}"


def test_run_and_role_umasks_are_padded_to_four_digits():
    res = resolve.resolve(loaded(**{"run.umask": "027", "run.roles": {"trainer": {"umask": "077"}}}))
    assert res.identities["server"].umask == "0027" and res.identities["trainer"].umask == "0077"


def test_dataset_names_are_the_runtime_ones():
    from grpo_deploy.runtime.tasks.data import DATASETS

    for name in DATASETS:
        spec.loads(PAIR.replace("  name: null                        # null = the profile's", f"  name: {name} #"))
    (p,) = _problems(PAIR.replace("  name: null                        # null = the profile's", "  name: foo #"))
    assert p.key == "dataset.name" and all(repr(name) in p.message for name in DATASETS)
