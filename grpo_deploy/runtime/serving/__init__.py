"""The serving side of trl-async, inside the server image: the vLLM launcher (serve), the replica proxy in front of
several servers (proxy) and its prefix router."""
