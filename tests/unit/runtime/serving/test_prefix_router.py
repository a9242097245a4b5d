"""The prefix router alone: chained block hashes per adapter namespace, text stand-in blocks, shared templates and
blocks every replica holds not counted, a lost replica forgotten, the index bounded."""

from __future__ import annotations

from grpo_deploy.runtime.serving.prefix_router import PrefixRouter

TEMPLATE = list(range(9000, 9048))  # three whole blocks every prompt starts with, like a chat template


def tokens(seed: int, blocks: int = 3, head: list[int] | None = None) -> list[int]:
    return (head or []) + [seed * 1000 + i for i in range(16 * blocks + 5)]


def test_a_new_adapter_version_hashes_into_its_own_namespace():
    router = PrefixRouter(2)
    prompt = tokens(1)
    v1, v2 = router.hashes("trl-policy-v1", prompt), router.hashes("trl-policy-v2", prompt)
    assert len(v1) == 3  # whole blocks only: 53 tokens are 3 blocks of 16
    assert v1 == router.hashes("trl-policy-v1", list(prompt))
    assert not set(v1) & set(v2)


def test_text_prompts_hash_in_character_blocks_and_share_their_prefix():
    router = PrefixRouter(2, block_size=16)
    short, longer = "a" * 64 * 2, "a" * 64 * 2 + "b" * 70
    assert len(router.hashes("m", short)) == 2
    assert router.hashes("m", longer)[:2] == router.hashes("m", short)
    assert router.hashes("m", None) == [] and router.hashes("m", {"x": 1}) == []


def test_a_shared_template_and_its_ancestors_do_not_count():
    router = PrefixRouter(2)
    a, b, c = (router.hashes("m", tokens(s, 2, TEMPLATE)) for s in (1, 2, 3))
    router.record(a, 0)
    assert router.scores(a) == {0: 5}
    router.record(b, 0)  # the template's last block now has two continuations
    assert router.scores(c) == {}
    assert router.scores(a) == {0: 2}


def test_blocks_every_replica_holds_do_not_count_and_a_lost_replica_forgets():
    router = PrefixRouter(2)
    h = router.hashes("m", tokens(1))
    router.record(h, 0)
    router.record(h, 1)
    assert router.scores(h) == {}
    router.forget_replica(1)
    assert router.scores(h) == {0: 3}


def test_the_index_keeps_at_most_max_blocks():
    router = PrefixRouter(2, max_blocks=10)
    for seed in range(10):
        router.record(router.hashes("m", tokens(seed)), seed % 2)
    assert len(router.index) == 10
