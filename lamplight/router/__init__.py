"""Router mode: several models behind one server, each loaded on demand (llama-server's router).

`lamplight serve --models-dir DIR` (or `--models-preset FILE.ini`) starts a router instead of one
model's server. It lists the models of three sources (catalog.py: the folder, the caches that
`lamplight pull` and `-hf` fill, the preset file), and runs each loaded model as its own child
process, `python -m lamplight.cli serve -m FILE --host 127.0.0.1 --port P ...` (instance.py), to
which it proxies every request that names the model (proxy.py). One process per model, as
llama-server does: a model that crashes takes nothing else down, its memory goes back to the OS
when it is unloaded, and each child is exactly the server a user would start by hand.

The router itself imports neither torch nor lamplight.server, nor what parsing the serve flags
brings in (the sampling table on numpy, the grammar): once parsed, `run_router` replaces its
process with a fresh `python -m lamplight.router.launch` that is given the settings, the command
line and the flag table as JSON (launch.py): a router of about 50 MiB whose only work is
bookkeeping and forwarding bytes.

With `--replicas N` / `--ray-address ADDR` each loaded model is a Ray Serve application of N
replicas instead of a child (ray_models.py, over lamplight/distributed/cluster.py): the router
stays the front and keeps every rule above (statuses, --models-max, idle timers, the listing,
proxying), and forwards to the model's route prefix on Serve's HTTP proxy, where the model's
ingress routes by prompt prefix to a replica. That router keeps its process: it builds each
model's application.

Layers: flag_table < presets < catalog < instance < models < ray_models < proxy < app < launch;
nothing of lamplight's below it imports it.
"""

from __future__ import annotations


def run_router(args) -> int:
    """Serve the models router mode finds for the parsed `lamplight serve` flags; the exit status."""
    from .launch import run_router as run

    return run(args)


__all__ = ["run_router"]
