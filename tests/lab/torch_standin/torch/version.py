# As the real torch 2.11.0 wheel's torch/version.py (the CUDA build from PyPI): its CUDA release, which
# kpro.gpu_serving's runtime toolchain check compares with nvcc's (plugins/module_utils/container/toolchain.py torch_cuda_major).
# build_wheel.py keeps these lines and writes the wheel's version into __version__.
__version__ = "2.11.0"
cuda = "13.0"
git_version = "kpro-lab-stand-in"
hip = None
