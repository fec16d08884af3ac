import os

# build_wheel.py replaces this file in the wheel with a constant.  When the stand-in runs
# from the source tree (unit tests), the version can be chosen by environment.
__version__ = os.environ.get("KPRO_LAB_SGLANG_STANDIN_VERSION", "0.5.11")
