"""Release files, one floor below the stages: reproducible archives and safe unpacking (:mod:`.archive`), signing
(:mod:`.signing`), provenance (:mod:`.provenance`) and verification (:mod:`.verify`). The package stage writes them,
``pipeline serve`` and ``pipeline verify`` read them."""
