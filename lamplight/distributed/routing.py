"""`PrefixAffinityRouter`: prefix-aware routing on Ray Serve's public `RequestRouter` interface.

Policy, for each request the ingress sends with `route={"prefix": [hashes], "replica": id}`:

1. `replica` set (GET /slots?replica=ID, POST /slots/0?replica=ID&action=save, the per-replica
   fan-out of /metrics): that replica only.
2. Otherwise the replica that served the longest prefix of the request's prompt (the table below
   remembers, per prefix hash, the replica the last request with that prefix went to), unless
   it has more than `max_imbalance` requests in flight beyond the least loaded replica.
3. Otherwise (no known prefix, or the affinity replica overloaded) the power of two choices:
   two random replicas, and Ray Serve sends the request to the one with the shorter queue.
   The request's prefixes then belong to that replica.

With `policy="random"` (`lamplight serve --route random`) every request that does not name a
replica goes to a uniformly random replica instead: plain load balancing, the baseline prefix
routing is measured against (`lamplight bench --scenarios conversation`).

Knobs (`request_router_kwargs`; `lamplight serve --route prefix|random --route-imbalance N
--route-block-chars N`): `policy` (default "prefix"), `max_imbalance` (default: the replica's slot count, -np), `block_chars` (prefix.py, used by the
ingress), `table_size` (prefix hashes remembered, least recently used dropped; default 100000).
The table lives in the ingress's process (one ingress: one table).
"""

from __future__ import annotations

import importlib
import random
from collections import OrderedDict
from typing import Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

# Each router registers itself here under its application's name, so the ingress (the process
# the router runs in) can list the replicas for /metrics and /slots.
ROUTERS: dict[str, "PrefixAffinityRouter"] = {}


def route_of(pending_request: Optional[PendingRequest]) -> dict:
    if pending_request is None:
        return {}
    route = pending_request.kwargs.get("route")
    return route if isinstance(route, dict) else {}


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, max_imbalance: int = 4, table_size: int = 100_000, policy: str = "prefix",
                         **_ignored) -> None:
        self.policy = policy
        self.max_imbalance = max(0, int(max_imbalance))
        self.table_size = max(1, int(table_size))
        self.owners: OrderedDict[str, ReplicaID] = OrderedDict()  # prefix hash -> replica
        # Through the imported module: Ray Serve may deserialize this class by value, with its
        # own copy of the module's globals.
        importlib.import_module("lamplight.distributed.routing").ROUTERS[self.app_name] = self

    def replica_ids(self) -> list[str]:
        return sorted(replica_id.unique_id for replica_id in self.curr_replicas)

    def _load(self, replica: RunningReplica) -> int:
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        route = route_of(pending_request)
        target = route.get("replica")
        if target:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == target]]
        if self.policy == "random":
            return [[random.choice(candidate_replicas)]]
        by_id = {r.replica_id: r for r in candidate_replicas}
        least = min(self._load(r) for r in candidate_replicas)
        for prefix in reversed(route.get("prefix") or ()):
            owner = by_id.get(self.owners.get(prefix))
            if owner is not None:
                if self._load(owner) - least <= self.max_imbalance:
                    others = [r for r in candidate_replicas if r is not owner]
                    return [[owner], others] if others else [[owner]]
                break  # overloaded: balance instead
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        for prefix in route_of(pending_request).get("prefix") or ():
            self.owners[prefix] = replica_id
            self.owners.move_to_end(prefix)
        while len(self.owners) > self.table_size:
            self.owners.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for prefix in [p for p, owner in self.owners.items() if owner == replica_id]:
            del self.owners[prefix]
