"""Triton model repository generation and validation (package stage).

Public entry points: :func:`pipeline.package.repository.generate_repository` / :func:`settings_from_build` fill
``triton_models/``; :func:`pipeline.package.validate.validate_repository` / :func:`check_repository` check it before
release. Archives, checksums, signing, provenance and verification live one floor down, in :mod:`pipeline.release`.
"""
