#!/usr/bin/env python
"""The table of NKI's public names in docs/kernels.md: which torchneuron.nki provides, and why not the others.

    python scripts/nki_api_table.py            # print the table (Markdown)
    python scripts/nki_api_table.py --write    # replace it in docs/kernels.md
    python scripts/nki_api_table.py --check    # exit 1 when docs/kernels.md's table differs from the code

The names are those of AWS's API reference in aws-neuron/aws-neuron-sdk: neuronxcc 2.x's
``general/nki/api/nki*.rst`` and their stubs ``general/nki/api/nki/**/__init__.py`` at cca3784 (Neuron 2.26,
the last commit that holds them), and the newer NKI's ``nki/api/nki*.rst`` and stubs at 81ce03a. A name is
supported when torchneuron's module has it and it is not listed in UNSUPPORTED (which gives the reason).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "kernels.md"
BEGIN, END = "<!-- nki-api-table: begin (scripts/nki_api_table.py --write) -->", "<!-- nki-api-table: end -->"

_V2 = "2.x"   # neuronxcc.nki, Neuron 2.26 (aws-neuron-sdk cca3784, general/nki/api)
_NEW = "new"  # nki, aws-neuron-sdk 81ce03a (nki/api)

#: module -> {name: the API versions that list it}
NAMES: Dict[str, Dict[str, Tuple[str, ...]]] = {}


def _add(module: str, version: str, names: str) -> None:
    d = NAMES.setdefault(module, {})
    for n in names.split():
        d[n] = tuple(sorted(set(d.get(n, ())) | {version}))


_add("nki", _V2, "FrameworkKernel baremetal benchmark jit profile simulate_kernel tensor")
_add("nki", _NEW, "jit simulate")
_add("nki.language", _V2, """
abs add affine_range all all_reduce arange arctan atomic_rmw bfloat16 bfp16 bitwise_and bitwise_or bitwise_xor bool_
broadcast_to ceil copy cos device_print divide dropout ds empty_like equal erf erf_dx exp expand_dims finfo float16
float32 float8_e4m3 float8_e5m2 floor fmod fp32 full gather_flattened gelu gelu_apprx_sigmoid gelu_apprx_tanh gelu_dx
gemm_grid gemm_stationary_grid greater greater_equal hbm int16 int32 int8 invert left_shift less less_equal load
load_transpose2d log logical_and logical_not logical_or logical_xor loop_reduce matmul max maximum mean mgrid min
minimum mish mod multiply nc ndarray negative not_equal num_programs ones par_dim power private_hbm prod program_id
program_ndim psum rand random_seed reciprocal relu right_shift rms_norm rsqrt sbuf sequential_range shared_constant
shared_hbm shared_identity_matrix sigmoid sign silu silu_dx sin softmax softplus spmd_dim sqrt square static_cast
static_range store subtract sum tan tanh tfloat32 tile_size transpose trunc uint16 uint32 uint8 var where zeros
zeros_like""")
_add("nki.language", _NEW, """
DType MemoryRegion NKIObject NkiTensor abs abs_max abs_min add affine_range all arctan average bitwise_and bitwise_or
bitwise_xor broadcast_to bypass ceil copy cos device_print divide dropout ds dynamic_range empty_like equal erf erf_dx
exp expand_dims floor fmod fori_loop full gather_flattened gelu gelu_apprx_sigmoid gelu_apprx_sigmoid_dx
gelu_apprx_tanh gelu_dx greater greater_equal invert is_hbm is_on_chip is_psum is_sbuf left_shift less less_equal load
load_transpose2d log logical_and logical_not logical_or logical_xor matmul max maximum mean min minimum mish mod
multiply ndarray negative no_reorder not_equal num_programs ones power prelu prod program_id program_ndim rand
random_seed reciprocal relu right_shift rms_norm rsqrt sequential_range shared_constant shared_identity_matrix sigmoid
sign silu silu_dx sin softmax softplus sqrt square static_range store subtract sum tan tanh transpose trunc var where
while_loop zeros zeros_like psum sbuf hbm private_hbm shared_hbm bool_ int8 int16 int32 uint8 uint16 uint32 float16
float32 bfloat16 tfloat32 float8_e4m3 float8_e5m2 float8_e4m3fn float8_e8m0fnu float8_e5m2_x4 float8_e4m3fn_x4
float4_e2m1fn_x4 tile_size""")
_add("nki.isa", _V2, """
activation activation_reduce affine_select bn_aggr bn_stats builtin_custom_op dge_mode dma_copy dma_engine
dma_transpose dropout engine fp32 get_nc_version gpsimd_engine iota local_gather max8 memset nc_find_index8
nc_match_replace8 nc_matmul nc_stream_shuffle nc_transpose nc_version oob_mode range_select reciprocal reduce_cmd
scalar_engine scalar_tensor_tensor select_reduce sequence_bounds tensor_copy tensor_copy_dynamic_dst
tensor_copy_dynamic_src tensor_copy_predicated tensor_engine tensor_partition_reduce tensor_reduce tensor_scalar
tensor_scalar_reduce tensor_tensor tensor_tensor_scan unknown_engine vector_engine""")
_add("nki.isa", _NEW, """
NkiInstruction NkiValidationError VirtualRegister activate2 activation activation_reduce affine_select bn_aggr
bn_stats core_barrier dge_mode dma_compute dma_copy dma_engine dma_transpose dropout engine exponential
get_nc_sub_version get_nc_version iota local_gather matmul_perf_mode max8 memset nc_find_index8 nc_match_replace8
nc_matmul nc_matmul_mx nc_n_gather nc_stream_shuffle nc_transpose nc_version nonzero_with_count oob_mode quantize_mx
rand2 rand_get_state rand_set_state range_select reciprocal reduce_cmd register_alloc register_load register_move
register_store rng scalar_tensor_tensor select_reduce sendrecv sequence_bounds set_rng_seed tensor_copy
tensor_copy_predicated tensor_partition_reduce tensor_reduce tensor_scalar tensor_scalar_cumulative
tensor_scalar_reduce tensor_tensor tensor_tensor_scan topk""")
_add("nki.compiler", _V2, """
allocation_scope enable_stack_allocator force_auto_alloc multi_buffer no_reorder psum sbuf
skip_middle_end_transformations jit benchmark profile baremetal simulate_kernel tensor sbuf.alloc sbuf.mod_alloc
sbuf.auto_alloc psum.alloc psum.mod_alloc psum.auto_alloc""")

_HW = "needs real hardware"
#: (module, name) -> why torchneuron does not provide it.
UNSUPPORTED: Dict[Tuple[str, str], str] = {
    ("nki", "profile"): f"{_HW}: writes the NEFF/NTFF profile of a run on a NeuronDevice (use torch.profiler, "
                        "Kernel.estimate)",
    ("nki", "FrameworkKernel"): "the base class of AWS's framework bindings (torch_xla, JAX); here nki.jit "
                                "kernels take neuron tensors directly",
    ("nki.compiler", "profile"): f"{_HW} (as nki.profile)",
    ("nki.language", "all_reduce"): "a collective across the NeuronCores of an SPMD grid; one emulated core here",
    ("nki.language", "gemm_grid"): "undocumented (no description in AWS's reference)",
    ("nki.language", "gemm_stationary_grid"): "undocumented (no description in AWS's reference)",
    ("nki.language", "NkiTensor"): "the newer NKI's tensor class with view methods (slice, select, permute, view, "
                                   "ap); tiles here are Tile/TileView (indexing, reshape)",
    ("nki.language", "DType"): "the newer NKI's dtype class; dtypes here are torch dtypes",
    ("nki.language", "MemoryRegion"): "the newer NKI's buffer class; buffers here are nl.sbuf/psum/hbm objects",
    ("nki.language", "NKIObject"): "the newer NKI's base class of traced objects; nothing is traced here",
    ("nki.language", "float8_e5m2_x4"): "a packed 4 x fp8 type with no PyTorch dtype",
    ("nki.language", "float8_e4m3fn_x4"): "a packed 4 x fp8 type with no PyTorch dtype",
    ("nki.language", "float4_e2m1fn_x4"): "a packed 4 x fp4 type with no PyTorch dtype",
    ("nki.isa", "builtin_custom_op"): "runs a custom GpSimd microcode library (a binary for the device)",
    ("nki.isa", "activate2"): "not yet: the newer NKI's two-stage activation",
    ("nki.isa", "nc_matmul_mx"): "not yet: MX (microscaling) matmul, with quantize_mx",
    ("nki.isa", "quantize_mx"): "not yet: MX (microscaling) quantization",
    ("nki.isa", "nc_n_gather"): "not yet: the newer NKI's multi-partition gather",
    ("nki.isa", "core_barrier"): "synchronizes NeuronCores; one emulated core here",
    ("nki.isa", "sendrecv"): "moves data between NeuronCores; one emulated core here",
    ("nki.isa", "dma_compute"): "not yet: the newer NKI's DMA with arithmetic",
    ("nki.isa", "register_alloc"): "not yet: the newer NKI's engine registers (dynamic control flow)",
    ("nki.isa", "register_load"): "not yet: the newer NKI's engine registers",
    ("nki.isa", "register_move"): "not yet: the newer NKI's engine registers",
    ("nki.isa", "register_store"): "not yet: the newer NKI's engine registers",
    ("nki.isa", "VirtualRegister"): "not yet: the newer NKI's engine registers",
    ("nki.isa", "NkiInstruction"): "the newer NKI's handle of a traced instruction; nothing is traced here",
}

_MODULES = {"nki": "torchneuron.nki", "nki.language": "torchneuron.nki.language", "nki.isa": "torchneuron.nki.isa",
            "nki.compiler": "torchneuron.nki.compiler"}


def _has(module, name: str) -> bool:
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return obj is not None


def status() -> List[Tuple[str, str, Tuple[str, ...], bool, str]]:
    """(module, name, versions, supported, reason) for every name."""
    rows = []
    for mod, names in NAMES.items():
        m = importlib.import_module(_MODULES[mod])
        for name in sorted(names, key=str.lower):
            reason = UNSUPPORTED.get((mod, name))
            ok = reason is None and _has(m, name)
            if reason is None and not ok:
                reason = "missing (no reason recorded)"
            rows.append((mod, name, names[name], ok, reason or ""))
    return rows


def table() -> str:
    rows = status()
    out = [BEGIN, ""]
    total = sum(1 for r in rows if r[3])
    out.append(f"{total} of {len(rows)} public names supported "
               f"({', '.join(f'{m}: {sum(1 for r in rows if r[0] == m and r[3])}/{sum(1 for r in rows if r[0] == m)}' for m in NAMES)}). "
               "Names from AWS's API reference (aws-neuron-sdk): neuronxcc 2.x (`general/nki/api` at cca3784) and "
               "the newer NKI (`nki/api` at 81ce03a); a name only in one is marked (2.x) or (new).")
    out.append("")
    for mod in NAMES:
        mark = lambda r: r[1] + ("" if len(r[2]) == 2 else f" ({r[2][0]})")  # noqa: E731
        sup = [mark(r) for r in rows if r[0] == mod and r[3]]
        out.append(f"**`{mod}`**, supported ({len(sup)}): " + ", ".join(f"`{s}`" for s in sup) + ".")
        out.append("")
        uns = [r for r in rows if r[0] == mod and not r[3]]
        if uns:
            out.append("| not supported | why |")
            out.append("|---|---|")
            for r in uns:
                out.append(f"| `{mark(r)}` | {r[4]} |")
            out.append("")
    out.append(END)
    return "\n".join(out)


def _current_doc_table() -> str:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="replace the table in docs/kernels.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/kernels.md's table is stale")
    a = ap.parse_args(argv)
    t = table()
    if a.write:
        text = DOC.read_text()
        current = _current_doc_table()
        DOC.write_text(text.replace(current, t) if current else text.rstrip() + "\n\n" + t + "\n")
        return 0
    if a.check:
        if _current_doc_table() != t:
            sys.stderr.write("docs/kernels.md's NKI API table differs from the code: "
                             "run python scripts/nki_api_table.py --write\n")
            return 1
        return 0
    print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
