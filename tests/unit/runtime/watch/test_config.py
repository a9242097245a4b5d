"""The watcher's settings (runtime/watch/config.py): hostile knobs refused in one error naming every bad field, and
a config that survives its own JSON."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from grpo_deploy.runtime.watch.config import WatchConfig, WatchSettings


def test_hostile_knobs_refused_in_one_error():
    with pytest.raises(ValidationError) as err:
        WatchSettings(window=0, patience=-1, min_gain=float("nan"), cap_share=True, kl_max="big",
                      ratio_band=[1.5, 0.5], staleness_drop_share=2.0, action="halt")
    fields = {e["loc"][0] for e in err.value.errors()}
    assert fields == {"window", "patience", "min_gain", "cap_share", "kl_max", "ratio_band", "staleness_drop_share",
                      "action"}
    for bad in ({"window": 10**9}, {"window": True}, {"min_gain": 0.0}, {"min_gain": -0.1}, {"cap_share": 1.5},
                {"target_reward": float("inf")}, {"unknown": 1}):
        with pytest.raises(ValidationError):
            WatchSettings(**bad)
    assert WatchSettings(ratio_band=[0.9, 1.1]).ratio_band == (0.9, 1.1)
    assert WatchConfig.model_validate(json.loads(WatchConfig().model_dump_json())) == WatchConfig()
