"""What training and prediction both run on: the device and precision, the processes under torchrun, checkpoints.

Submodules: ``device`` (choosing a device, autocast), ``memory`` (bytes per pixel and pixel budgets on CUDA),
``distributed`` (torchrun's environment, read once; the process group; sums across ranks), ``checkpoint``
(the one file that resumes a run or configures prediction).
"""
