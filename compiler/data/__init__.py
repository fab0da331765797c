"""Data shipped with Tessel: the trained digits model (`digits.onnx`) that the zoo serves and the demo runs,
and the script that trains it."""
