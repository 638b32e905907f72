"""pipeline: Hugging Face checkpoint -> quantized, built, evaluated, packaged Triton deployment."""

__version__ = "0.1.0"
