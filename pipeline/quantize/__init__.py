"""Quantization with NVIDIA ModelOpt: recipes, checks, calibration, export and the quant report.

Our code orchestrates and validates; the quantization algorithms (AWQ, SmoothQuant, FP8/INT8
max calibration) and the checkpoint writers are ModelOpt's (``modelopt.torch.quantization`` and
``modelopt.torch.export``). One module per concern, in the order the stage runs them:

* :mod:`.preflight` - the source model's facts, excluded modules, the checks before calibration;
* :mod:`.modelopt_config` - the ModelOpt ``mtq.quantize`` config of a recipe;
* :mod:`.calibrate` - the calibration loop (``mtq.quantize``), or :mod:`.auto` (``quant=auto``, ``mtq.auto_quantize``);
* :mod:`.state` - ``quant_state.json``/``.safetensors`` and :func:`pipeline.core.quant_state.load_simulated_model`;
* :mod:`.trtllm` - the TensorRT-LLM checkpoint and its checks; :mod:`.hf_export` - the unified HF checkpoint;
* :mod:`.report` - ``quant_report.json``/``.md``; :mod:`.run` - :func:`~.run.quantize`, the function the stage calls;
* :mod:`.common` - the logger, KV-cache/decoder tables and file helpers they share.

:mod:`pipeline.quantize` re-exports the public names.
"""

import warnings

# ModelOpt warnings that are expected in this pipeline and read like failures on a CPU host:
# its TensorRT-LLM config writer falls back to its own manual path when tensorrt_llm is not installed
# (the path we use and check after export), and it flags untested transformers releases.
warnings.filterwarnings("ignore", message=r"Cannot export tensorrt_llm checkpoint config")
warnings.filterwarnings("ignore", message=r"transformers .* is not tested with current version of modelopt")
