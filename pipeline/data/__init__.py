"""Data sets shared by stages, one floor below them: the calibration set (:mod:`.calibration`, quantize and evaluate's
fidelity probe), the business eval set and its foreign formats (:mod:`.evalset`, :mod:`.foreign`, evaluate and the
served-parity check) and the metrics an eval item names (:mod:`.metrics`)."""
