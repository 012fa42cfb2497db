"""Values that several layers must agree on, each defined once here. This module imports nothing, so the config
layer (which loads no torch) and the models, runtime and prediction layers all read the same values."""

# The mask value that marks a pixel as "no label": the loss and every metric skip it, and AlignedCollate pads
# masks with it, so padding never counts. Masks with up to 255 classes (0..254) therefore fit in uint8.
IGNORE_INDEX = 255

# Numeric precisions for training and prediction: fp32, or autocast to bfloat16 / float16.
PRECISIONS = ("fp32", "bf16", "fp16")

# The most stride-2 stages srforge's UNet (and a config) may have: a size divisor of 2**16 = 65,536 px, beyond the
# height and width of any scan; each stage deeper doubles the padding of every scan, and depth 30 would pad a scan
# to 2**30 px a side. How deep the scans of a dataset allow is srforge.geometry's depth_problem.
MAX_DEPTH = 16

# srforge's own UNet, the default model.class; the other paths name the same class. Only it takes the UNet keys;
# any other class takes in_channels, num_classes and model.args (srforge.train.from_config.model_kwargs).
UNET_CLASS = "srforge.models.unet:UNet"
UNET_CLASSES = (UNET_CLASS, "srforge.models:UNet", "srforge:UNet")
UNET_KEYS = ("base_channels", "depth", "max_channels", "padding_aware")

# What model.norm may do to a model's normalisation layers (srforge.models.norms.apply_norm).
NORMS = ("keep", "group", "frozen", "masked")

# Test-time augmentation of a prediction (predict.py's and evaluate.py's --tta) and of self-training's teacher
# (train.self_training.tta): none, or the mean of each scan and its three mirror images (srforge.tta).
TTA_MODES = ("none", "flip")

# What model.weights may load into (model.weights_into): the whole model, or its encoder attribute.
WEIGHTS_INTO = ("model", "encoder")

# Padded pixels per batch on the CPU: 2**22 = 4.2 Mpx, one full-size 640 x 6,400 scan. Prediction's default batch
# budget there, and the most data.max_pixels: auto gives a CPU training step: on a CPU batching gains nothing (a
# batch costs about what its scans cost one by one: docs/performance.md), while more pixels only hold more memory.
CPU_PIXELS = 2**22
