"""A C++ extension that registers a PrivateUse1 kernel, built with torch.utils.cpp_extension as a user
builds one, and called on neuron tensors: PyTorch's dispatcher picks its neuron kernel over its CPU
kernel, and its results equal the CPU's."""

import textwrap

import pytest
import torch
from torch.utils import cpp_extension

SOURCE = textwrap.dedent("""
    #include <ATen/ATen.h>
    #include <torch/library.h>

    #include <atomic>

    namespace {
    std::atomic<int64_t> neuron_calls{0};

    // The CPU kernel: a loop over host memory.
    at::Tensor scale_add_cpu(const at::Tensor& a, const at::Tensor& b, double alpha) {
      TORCH_CHECK(a.sizes() == b.sizes(), "scale_add: a and b differ in shape");
      auto out = at::empty_like(a.contiguous());
      auto x = a.contiguous(), y = b.contiguous();
      const float* px = x.data_ptr<float>();
      const float* py = y.data_ptr<float>();
      float* po = out.data_ptr<float>();
      for (int64_t i = 0; i < out.numel(); ++i) po[i] = px[i] * static_cast<float>(alpha) + py[i];
      return out;
    }

    // The neuron kernel: device work through ATen's ops on the device, as an extension for any
    // accelerator writes it without reaching device memory from the host.
    at::Tensor scale_add_neuron(const at::Tensor& a, const at::Tensor& b, double alpha) {
      TORCH_CHECK(a.device().type() == c10::DeviceType::PrivateUse1, "scale_add: expected a neuron tensor");
      TORCH_CHECK(a.sizes() == b.sizes(), "scale_add: a and b differ in shape");
      ++neuron_calls;
      return at::add(b, a, alpha);
    }

    int64_t neuron_call_count() { return neuron_calls.load(); }
    }  // namespace

    TORCH_LIBRARY(neuron_ext, m) {
      m.def("scale_add(Tensor a, Tensor b, float alpha) -> Tensor");
      m.def("neuron_call_count() -> int", &neuron_call_count);
    }
    TORCH_LIBRARY_IMPL(neuron_ext, CPU, m) { m.impl("scale_add", &scale_add_cpu); }
    TORCH_LIBRARY_IMPL(neuron_ext, PrivateUse1, m) { m.impl("scale_add", &scale_add_neuron); }
""")


@pytest.fixture(scope="module")
def extension(tmp_path_factory):
    directory = tmp_path_factory.mktemp("neuron_ext")
    source = directory / "neuron_ext.cpp"
    source.write_text(SOURCE)
    cpp_extension.load("neuron_ext", [str(source)], build_directory=str(directory), is_python_module=False,
                       extra_cflags=["-O1"], verbose=False)
    return torch.ops.neuron_ext


def test_the_extension_kernel_runs_on_neuron_and_equals_the_cpu(extension):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    expected = extension.scale_add(a, b, 2.5)  # the CPU kernel
    before = extension.neuron_call_count()
    out = extension.scale_add(a.to("neuron"), b.to("neuron"), 2.5)
    assert extension.neuron_call_count() == before + 1
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(expected, a * 2.5 + b)


def test_the_extension_kernel_runs_under_compile(extension):
    def f(a, b):
        return extension.scale_add(a, b, 0.5).relu()

    a, b = torch.randn(8), torch.randn(8)
    out = torch.compile(f, backend="aot_eager")(a.to("neuron"), b.to("neuron"))
    torch.testing.assert_close(out.cpu(), f(a, b))


def test_the_extension_kernel_errors_are_pytorch_errors(extension):
    with pytest.raises(RuntimeError, match="differ in shape"):
        extension.scale_add(torch.ones(2, device="neuron"), torch.ones(3, device="neuron"), 1.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        extension.scale_add(torch.ones(2, device="neuron"), torch.ones(2), 1.0)
