"""The write phase `prepare` and `pack` share: instance files -> one plan -> packs in shards with their
manifests (datasets), the vectorised pack builder and its two streaming passes (packs), and the worker
processes that run every task (workers)."""
