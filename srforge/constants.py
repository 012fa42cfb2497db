"""Values that several layers must agree on, each defined once."""

# The mask value that marks a pixel as "no label": the loss and every metric skip it, and AlignedCollate pads
# masks with it, so padding never counts. Masks with up to 255 classes (0..254) therefore fit in uint8.
IGNORE_INDEX = 255

# Numeric precisions for training and prediction: fp32, or autocast to bfloat16 / float16.
PRECISIONS = ("fp32", "bf16", "fp16")
