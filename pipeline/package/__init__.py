"""Triton model repository generation, validation and release files (package stage).

Public entry points:

* :func:`pipeline.package.repository.generate_repository` / :func:`settings_from_build` - fill ``triton_models/``;
* :func:`pipeline.package.validate.validate_repository` / :func:`check_repository` - checks before release;
* :func:`make_archive`, :func:`write_sha256sums`, :func:`safe_extract` - reproducible archives, safe unpacking.
"""

from .release import make_archive, safe_extract, write_sha256sums

__all__ = ["make_archive", "safe_extract", "write_sha256sums"]
