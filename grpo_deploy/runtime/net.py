"""The network interface NCCL and Gloo use between the hosts of a cluster (Ray's nodes of a verl run, the trainer's
machines): this host's IPv4 addresses by interface, and the interface named or holding a node's address."""

from __future__ import annotations


def interface_of(ip: str, addresses: dict[str, list[str]]) -> str | None:
    """The interface holding *ip*, from {interface: [its IPv4 addresses]}."""
    return next((name for name, ips in sorted(addresses.items()) if ip in ips), None)


def local_addresses() -> dict[str, list[str]]:
    """{interface: [IPv4 addresses]} of this network namespace (the host's, under host networking)."""
    import socket

    import psutil

    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def socket_interface(ifname: str, node_ip: str, addresses: dict[str, list[str]] | None = None) -> str:
    """The interface NCCL and Gloo use between the hosts of a cluster (Ray's nodes, the trainer's machines): the one
    named, else the one holding the node's address. ValueError with the one line to say when neither is here."""
    addresses = local_addresses() if addresses is None else addresses
    name = ifname or interface_of(node_ip, addresses)
    if not name or name not in addresses:
        raise ValueError(f"no network interface {'named ' + ifname if ifname else 'holds ' + node_ip} on this host "
                         f"(it has {', '.join(sorted(addresses)) or 'none'}): set hosts[].interface in the spec")
    return name
