"""The training engines as data: their roles, which role's profile supplies which settings, their images and what
differs in their checkpoints. Adding an engine adds a row here (and its derive/render functions keyed by name)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str
    description: str
    roles: tuple[str, ...]
    main_role: str
    """The role whose host profile supplies the training settings (and whose identity owns the run's files)."""
    server_role: str | None
    """The role whose host profile supplies the vLLM server settings; None when vLLM is colocated."""
    role_images: dict[str, str]
    """role -> the image key it runs (spec images.<key>, profile images.<key>): see image_of."""
    role_counts: dict[str, tuple[int, int]]
    """role -> (at least, at most) hosts with it."""
    adapters_on_volume: bool
    """Adapter versions for a separate server live beside the checkpoints (plan counts their space)."""
    saves_last_step: bool
    """The engine also saves at the last step, whatever the cadence."""
    single_host_roles: tuple[str, ...]
    """`init` with one host (or none): the roles that host runs."""
    multi_host_roles: tuple[tuple[str, ...], tuple[str, ...]]
    """`init --hosts a,b,...`: the roles of the first host, then of every other host."""

    @property
    def image_roles(self) -> tuple[str, ...]:
        """Image keys of the engine, each once, in the order of its roles."""
        return tuple(dict.fromkeys(self.role_images[r] for r in self.roles))

    def image_of(self, role: str) -> str:
        """The image key *role* runs: the one answer for resolve, preflight, the host checks and `checkpoints`."""
        return self.role_images[role]

    def images_on(self, roles) -> list[str]:
        """The image keys a host running *roles* needs, each once."""
        return list(dict.fromkeys(self.image_of(r) for r in roles))


TRL_ASYNC = Engine(
    name="trl-async",
    description="TRL async GRPO trainer + a vLLM server, adapters handed over through the shared volume",
    roles=("server", "trainer"),
    main_role="trainer",
    server_role="server",
    role_images={"server": "server", "trainer": "trainer"},
    role_counts={"trainer": (1, 1), "server": (1, 1)},
    adapters_on_volume=True,
    saves_last_step=False,
    single_host_roles=("server", "trainer"),
    multi_host_roles=(("trainer",), ("server",)),
)
VERL = Engine(
    name="verl",
    description="verl with colocated vLLM (one node, or a Ray cluster of a head and workers)",
    roles=("head", "worker"),
    main_role="head",
    server_role=None,
    role_images={"head": "verl", "worker": "verl"},
    role_counts={"head": (1, 1), "worker": (0, 1 << 16)},
    adapters_on_volume=False,
    saves_last_step=True,
    single_host_roles=("head",),
    multi_host_roles=(("head",), ("worker",)),
)
ENGINES: dict[str, Engine] = {e.name: e for e in (TRL_ASYNC, VERL)}
ENGINE_NAMES = tuple(ENGINES)
ALL_ROLES = ("server", "trainer", "head", "worker")
# Why a role is capped: said when a spec gives more.
ROLE_LIMIT_WHY = {
    "server": "several vLLM server replicas need a proxy that broadcasts adapter loads to every replica (TRL takes "
              "one base URL); that proxy is not built yet: use one server host",
}
