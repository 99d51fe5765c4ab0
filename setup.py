"""Builds torchneuron, its runtime library and its C++ core, torchneuron._C, against the installed torch.

The runtime (csrc/runtime/, the emulated NeuronCore) is a shared library of its own,
torchneuron/libtorchneuron_runtime.so: plain C++, no torch headers, its C API (neuron_runtime.h) the only
symbols it exports. _C links it and finds it beside itself (rpath $ORIGIN).

The object files live in build/temp.<platform>-<python>/ and ninja recompiles only
the sources (or the headers they include) that changed, also for an editable install,
whose build directory setuptools would otherwise make a fresh temporary one each time.
"""

import glob
import os
import sys
import sysconfig
import warnings

# Building must not load a previously built (possibly stale) torchneuron.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import Extension, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
# csrc/distributed/exit.cpp is a module of its own (torchneuron._gloo_exit): it needs gloo's names.
GLOO_EXIT = os.path.join("csrc", "distributed", "exit.cpp")
RUNTIME = os.path.join("csrc", "runtime")
RUNTIME_SOURCES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, RUNTIME, "*.cpp")))
SOURCES = sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True)
    if os.path.relpath(p, ROOT) != GLOO_EXIT and not os.path.relpath(p, ROOT).startswith(RUNTIME + os.sep)
)
# The runtime library: its extension's name, and the file it is (not a Python module's name).
RUNTIME_EXT = "torchneuron.libtorchneuron_runtime"
RUNTIME_FILE = "libtorchneuron_runtime.so"


def headers(*folders):
    """The headers under `folders`: a change to one sends the build to ninja, which recompiles what includes it."""
    return sorted(os.path.relpath(p, ROOT) for folder in folders for pattern in ("*.h", "*.inl")
                  for p in glob.glob(os.path.join(ROOT, folder, "**", pattern), recursive=True))

# TORCHNEURON_DEBUG=1: a debug build (-O0 -g, NDEBUG undefined so PyTorch's and the runtime's
# assertions are compiled in: csrc/runtime/checks.h), its objects kept apart from the release build's.
DEBUG = os.environ.get("TORCHNEURON_DEBUG", "0") == "1"
BUILD_TEMP = os.path.join(
    ROOT, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}" + ("-debug" if DEBUG else "")
)
COMPILE_ARGS = ["-std=c++20", "-fvisibility=hidden", "-Wno-unused-parameter"] + (
    ["-O0", "-g", "-UNDEBUG", "-DTORCHNEURON_DEBUG=1"] if DEBUG else ["-O2"]
)

# setuptools' notice on every editable install, that folders of the working directory named
# like the package may take precedence over it: here that folder is the package itself.
warnings.filterwarnings("ignore", message="Editable installation")

# Compile the C++ files in parallel: ninja takes MAX_JOBS, default all cores.
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))


class build_ext(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension with ninja, keeping its objects in one persistent directory."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = BUILD_TEMP

    def get_ext_filename(self, fullname):
        # The runtime is a shared library, named as one; setuptools asks by the full name and, for a
        # path in the build folder, by the last part alone.
        if fullname == RUNTIME_EXT:
            return os.path.join("torchneuron", RUNTIME_FILE)
        if fullname == RUNTIME_EXT.rpartition(".")[2]:
            return RUNTIME_FILE
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if ext.name == "torchneuron._C":
            # _C links the runtime library built just before it (the extensions build in order) and
            # finds it, at load, in its own folder.
            built = os.path.dirname(os.path.abspath(self.get_ext_fullpath(RUNTIME_EXT)))
            ext.extra_link_args = [f"-L{built}", f"-l:{RUNTIME_FILE}", "-Wl,-rpath,$ORIGIN"]
        super().build_extension(ext)

    def copy_file(self, infile, outfile, *args, **kwargs):
        """Put a built library in place as a new file (a rename), never by rewriting the old one.

        Processes that loaded the previous torchneuron/_C*.so (a test run, a notebook) map its
        pages; overwriting it in place would change the code under them.
        """
        if not str(outfile).endswith(".so") or os.path.dirname(os.path.abspath(outfile)) == os.path.dirname(
                os.path.abspath(infile)):
            return super().copy_file(infile, outfile, *args, **kwargs)
        temporary = f"{outfile}.{os.getpid()}.tmp"
        result = super().copy_file(infile, temporary, *args, **kwargs)
        os.replace(temporary, outfile)
        return (outfile, result[1]) if isinstance(result, tuple) else result


setup(
    ext_modules=[
        # The runtime: plain C++ (no torch include path), exporting its C API alone (exports.map).
        Extension(
            RUNTIME_EXT,
            RUNTIME_SOURCES,
            depends=headers(RUNTIME),
            language="c++",
            extra_compile_args={"cxx": COMPILE_ARGS},
            extra_link_args=["-pthread", f"-Wl,-soname,{RUNTIME_FILE}",
                             "-Wl,--version-script=" + os.path.join(ROOT, RUNTIME, "exports.map")],
        ),
        CppExtension(
            "torchneuron._C",
            SOURCES,
            depends=headers("csrc"),
            # Kineto's headers (the profiler's PrivateUse1 extension point) include each other by bare name.
            include_dirs=[os.path.join(p, "kineto") for p in include_paths()],
            extra_compile_args={"cxx": COMPILE_ARGS},
        ),
        CppExtension(
            "torchneuron._gloo_exit",
            [GLOO_EXIT],
            # gloo's names for ProcessGroupGloo.hpp, which the torch wheel ships without gloo's headers
            # (csrc/distributed/gloo_declarations/README.md).
            include_dirs=[os.path.join(ROOT, "csrc", "distributed", "gloo_declarations")],
            extra_compile_args={"cxx": COMPILE_ARGS},
        ),
    ],
    cmdclass={"build_ext": build_ext},
)
