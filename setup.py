"""Builds torchneuron and its C++ core, torchneuron._C, against the installed torch."""

import glob
import os

# Building must not load a previously built (possibly stale) torchneuron.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True)
)

# Compile the C++ files in parallel: ninja takes MAX_JOBS, default all cores.
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))

setup(
    ext_modules=[
        CppExtension(
            "torchneuron._C",
            SOURCES,
            extra_compile_args={"cxx": ["-O2", "-std=c++20", "-fvisibility=hidden", "-Wno-unused-parameter"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
