"""diffusers on neuron: a small UNet2DModel trained with the DDPM loss, then sampled with DDPMPipeline.

The UNet is built on the CPU with a seed and moved; the training data, noise and
timesteps are drawn on the CPU and moved. For sampling, diffusers' ``randn_tensor``
draws a neuron pipeline's noise on the CPU (with the given CPU generator) and
moves it, so the same generator gives the CPU's images.

Results agree to float32 rounding, not bit for bit: on neuron a convolution's output
comes back contiguous (the layout PyTorch derives for an out-of-tree device, see
docs/runtime.md), while the CPU's convolution keeps the channels-last layout that
the UNet's attention blocks hand it, and GroupNorm's CPU kernel sums in another
order for channels-last inputs. ``test_forward_differs_from_cpu_only_by_conv_layout``
shows that this is the only difference.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel  # noqa: E402

STEPS = 3
BATCH = 4
TIMESTEPS = 50


def _unet() -> UNet2DModel:
    torch.manual_seed(0)
    return UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)


def _data():
    g = torch.Generator().manual_seed(1)
    clean = torch.rand(STEPS, BATCH, 3, 16, 16, generator=g) * 2 - 1
    noise = torch.randn(STEPS, BATCH, 3, 16, 16, generator=g)
    timesteps = torch.randint(0, TIMESTEPS, (STEPS, BATCH), generator=g)
    return clean, noise, timesteps


def _train(device: str):
    unet = _unet().to(device)
    scheduler = DDPMScheduler(num_train_timesteps=TIMESTEPS)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    losses = []
    for x0, noise, t in zip(*_data()):
        x0, noise, t = x0.to(device), noise.to(device), t.to(device)
        noisy = scheduler.add_noise(x0, noise, t)
        loss = torch.nn.functional.mse_loss(unet(noisy, t).sample, noise)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    return unet.eval(), scheduler, torch.stack(losses)


def _sample(unet, scheduler, device: str) -> np.ndarray:
    pipe = DDPMPipeline(unet=unet, scheduler=scheduler).to(device)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.device.type == device
    out = pipe(batch_size=2, generator=torch.Generator("cpu").manual_seed(0), num_inference_steps=5,
               output_type="np")
    return out.images


def test_forward_differs_from_cpu_only_by_conv_layout():
    cpu = _unet()
    model = copy.deepcopy(cpu).to("neuron")
    clean, noise, t = _data()
    with torch.no_grad():
        out = model(clean[0].to("neuron"), t[0].to("neuron")).sample.cpu()
        torch.testing.assert_close(out, cpu(clean[0], t[0]).sample, rtol=1e-5, atol=1e-5)
        # The CPU with its convolutions' outputs made contiguous, as they are on neuron: bit for bit.
        for m in cpu.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.register_forward_hook(lambda mod, args, y: y.contiguous())
        torch.testing.assert_close(out, cpu(clean[0], t[0]).sample, rtol=0, atol=0)


def test_ddpm_training_and_sampling_match_cpu():
    cpu_unet, cpu_sched, cpu_losses = _train("cpu")
    unet, sched, losses = _train("neuron")

    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    cpu_state = cpu_unet.state_dict()
    for k, v in unet.state_dict().items():
        assert v.device.type == "neuron"
        torch.testing.assert_close(v.cpu(), cpu_state[k], rtol=1e-4, atol=1e-4, msg=k)

    images = _sample(unet, sched, "neuron")
    cpu_images = _sample(cpu_unet, cpu_sched, "cpu")
    assert images.shape == (2, 16, 16, 3) and images.dtype == np.float32
    assert images.std() > 0.1  # not a constant image
    torch.testing.assert_close(torch.from_numpy(images), torch.from_numpy(cpu_images), rtol=1e-4, atol=1e-4)
