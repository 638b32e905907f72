"""Measurement tools that drive whole pipelines (``make bench-scale``, ``make gpu-check``) and the standard benchmark
shapes they generate (:mod:`.shapes`). They sit beside the runner, above the stage packages."""
