"""Export a trained model to ONNX (dynamic batch, H and W) and check it in onnxruntime."""

from srforge.export.onnx import check_onnx, export_onnx

__all__ = ["check_onnx", "export_onnx"]
