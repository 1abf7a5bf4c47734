"""lamplight on Ray Serve: several replicas of one model behind one port, with prefix-aware routing.

`lamplight serve --replicas N [--ray-address ADDR]` (launch.py), or, for people who run Ray
themselves, `serve run lamplight.distributed:build_app model=... replicas=N` (deployments.py).
Needs the `ray` extra: `pip install -c constraints.txt -e '.[ray]'`.

- deployments.py: `Replica` runs lamplight's own FastAPI app in-process (through its ASGI
  interface, so every endpoint, stream and error is a single server's); `Ingress` forwards raw
  HTTP to a replica, and answers /health, /metrics and /slots over all of them.
- routing.py: `PrefixAffinityRouter`, a Ray Serve `RequestRouter` (public interface): a request
  goes to the replica that served the longest prefix of its prompt unless that replica is
  overloaded; otherwise to the less loaded of two random replicas.
- prefix.py: the prompt-prefix block hashes the router matches on (no Ray needed).
"""


def build_app(args: dict):
    """`serve run lamplight.distributed:build_app model=... replicas=N [flag=value ...]`."""
    from .deployments import build_app as build

    return build(args)
