"""The one host of every fold (composition root; ``docs/hosting.md``).

- :mod:`.core`: per-key slots, dedupe by event id, :class:`~.core.HostedFold`,
  :class:`~.core.FoldSet` (folds routed by topic);
- :mod:`.host`: :class:`~.host.Host` — decode once, dedupe, apply, derive, commit with
  positions — with its options: :mod:`.barrier` (the terminal barrier), a view
  (``projections.materializer``), a store (:mod:`.stores`; :mod:`.ports`);
- where it runs: :mod:`.embedded` (the processors on the embedded log), :mod:`.faust_host`
  (:mod:`.faust_topology`, :mod:`.faust_agent`, :mod:`.membership`: the processors on
  Kafka), :mod:`.read_model` and :mod:`.follow` (the projections' read model, live),
  :mod:`.replay` (:mod:`.shards`, :mod:`.sharded`, :mod:`.result`, :mod:`.audit`: one
  replay path, key-sharded).

Every host folds with the same core, so a fold hosted any way emits the same derived
events, ids included (tested).
"""
