"""Export a trained model to ONNX (dynamic batch, H and W) and check it in onnxruntime."""

from srforge.export.onnx import check_inputs, check_onnx, export_onnx, run_onnx

__all__ = ["check_inputs", "check_onnx", "export_onnx", "run_onnx"]
