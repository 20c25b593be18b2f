"""FlowSampler against velocity fields whose exact ODE solution is known."""

from __future__ import annotations

import pytest
import torch

from agents.wam.sampling import SAMPLERS, FlowSampler, SamplerConfig

# Enough steps for each solver's discretisation error to sit well inside the tolerances
# (first-order Euler/DDIM need many more than the multistep solvers).
STEPS = {"flow_euler": 100, "ddim": 100, "unipc": 10, "dpmpp": 20}


def gaussian_velocity(mu: float, s: float):
    """Exact velocity for x0 ~ N(mu, s^2) per element under x_t = (1 - sigma) x0 + sigma eps.

    x_t is jointly Gaussian with x0: E[x_t] = a mu (a = 1 - sigma), Var[x_t] = a^2 s^2 + sigma^2,
    Cov[x0, x_t] = a s^2, so E[x0 | x_t] = mu + a s^2 / (a^2 s^2 + sigma^2) (x_t - a mu) and
    v = (x_t - E[x0 | x_t]) / sigma. s = 0 is a point mass at mu: v = (x_t - mu) / sigma.
    The ODE then carries noise eps to exactly mu + s * eps.
    """

    def v(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        a = 1.0 - sigma
        x0 = mu + a * s**2 / (a**2 * s**2 + sigma**2) * (x - a * mu)
        return (x - x0) / sigma

    return v


def field(targets: dict[str, tuple[float, float]], calls: list | None = None):
    """A `denoise` with one Gaussian target per key; records (latents, sigma) if asked."""
    fields = {k: gaussian_velocity(mu, s) for k, (mu, s) in targets.items()}

    def denoise(latents: dict[str, torch.Tensor], sigma: torch.Tensor) -> dict[str, torch.Tensor]:
        if calls is not None:
            calls.append(({k: x.clone() for k, x in latents.items()}, sigma.clone()))
        return {k: fields[k](x, sigma) for k, x in latents.items()}

    return denoise


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_matches(out: torch.Tensor, mu: float, s: float) -> None:
    assert abs(out.mean().item() - mu) < 0.02 * s, (out.mean().item(), mu)
    assert abs(out.std().item() / s - 1.0) < 0.03, (out.std().item(), s)


@pytest.mark.parametrize("name", SAMPLERS)
def test_gaussian_target(name: str) -> None:
    sampler = FlowSampler(SamplerConfig(name, STEPS[name], shift=1.0))
    noise = randn(4096, 16)
    for mu, s in [(0.7, 0.5), (-1.5, 2.0)]:
        out = sampler.sample(field({"x": (mu, s)}), {"x": noise})["x"]
        assert out.shape == noise.shape and out.dtype == noise.dtype
        assert_matches(out, mu, s)
        # Per sample, too: the exact flow map is eps -> mu + s * eps.
        assert (out - (mu + s * noise)).abs().mean().item() < 0.03 * s

    sigmas = sampler.sigmas
    assert sigmas.dtype == torch.float32 and sigmas.shape == (STEPS[name],)
    assert sampler.num_inference_steps == STEPS[name]
    assert sigmas[0].item() > 0.998  # starts from (almost exactly) pure noise
    assert (sigmas.diff() < 0).all() and sigmas[-1].item() > 0


@pytest.mark.parametrize("name", SAMPLERS)
def test_point_mass_is_recovered(name: str) -> None:
    # Default shift and 10 steps: with an exact field every solver lands on c.
    sampler = FlowSampler(SamplerConfig(name))
    c = torch.linspace(-2.0, 3.0, 24).reshape(4, 6)
    noise = randn(256, 4, 6)

    def denoise(latents, sigma):
        return {k: (x - c) / sigma for k, x in latents.items()}

    out = sampler.sample(denoise, {"x": noise})["x"]
    assert (out - c).abs().max().item() < 1e-3


@pytest.mark.parametrize("name", SAMPLERS)
def test_denoise_sees_the_advertised_sigmas(name: str) -> None:
    sampler = FlowSampler(SamplerConfig(name, 7, shift=3.0))
    calls: list = []
    sampler.sample(field({"x": (0.0, 1.0)}, calls), {"x": randn(8, 3)})
    assert len(calls) == 7
    seen = torch.stack([sigma for _, sigma in calls])
    assert all(sigma.dtype == torch.float32 and sigma.ndim == 0 for _, sigma in calls)
    assert torch.equal(seen, sampler.sigmas)
    # The first model input is the noise itself, in flow space (DDIM's VP state too).
    assert torch.allclose(calls[0][0]["x"], randn(8, 3), atol=1e-5)


@pytest.mark.parametrize("name", ["unipc", "dpmpp"])
def test_repeated_int_timesteps_do_not_skip_steps(name: str) -> None:
    # Many steps at shift 5 make the solvers' int64 timesteps repeat near sigma = 1; every
    # sigma must still be visited once, in order.
    sampler = FlowSampler(SamplerConfig(name, 300, shift=5.0))
    calls: list = []
    out = sampler.sample(field({"x": (0.5, 0.0)}, calls), {"x": randn(4, 3)})["x"]
    assert torch.equal(torch.stack([sigma for _, sigma in calls]), sampler.sigmas)
    assert (out - 0.5).abs().max().item() < 1e-3


@pytest.mark.parametrize("name", SAMPLERS)
def test_two_modalities_in_one_call(name: str) -> None:
    sampler = FlowSampler(SamplerConfig(name, STEPS[name], shift=1.0))
    targets = {"video": (0.7, 0.5), "action": (-1.5, 2.0), "action2": (3.0, 1.0)}
    noise = {
        "video": randn(512, 4, 2, 4, 4, seed=1),  # (B, C, F, H, W)
        "action": randn(512, 8, 7, seed=2),  # (B, T, A)
        "action2": randn(512, 8, 7, seed=3),  # same shape as "action", other target
    }
    calls: list = []
    joint = sampler.sample(field(targets, calls), noise)
    assert len(calls) == sampler.num_inference_steps  # one model call per step for all keys
    for k, (mu, s) in targets.items():
        assert joint[k].shape == noise[k].shape
        assert_matches(joint[k], mu, s)
        # Sampling a key alone gives the same numbers: no solver history is shared.
        alone = sampler.sample(field({k: targets[k]}), {k: noise[k]})[k]
        torch.testing.assert_close(joint[k], alone, rtol=0, atol=1e-6)


def test_ddim_adapter_equals_flow_euler() -> None:
    # Deterministic DDIM run through the flow<->VP conversion is algebraically flow Euler
    # on the same sigmas; equality checks the conversion and x0 = x - sigma * v.
    ddim = FlowSampler(SamplerConfig("ddim", 13, shift=5.0))
    euler = FlowSampler(SamplerConfig("flow_euler", 13, shift=5.0))
    torch.testing.assert_close(ddim.sigmas, euler.sigmas, rtol=0, atol=1e-5)
    noise = {"x": randn(1024, 8)}
    denoise = field({"x": (0.3, 1.7)})
    torch.testing.assert_close(
        ddim.sample(denoise, noise)["x"], euler.sample(denoise, noise)["x"], rtol=0, atol=1e-4
    )


def test_output_dtype_follows_noise_and_repeat_calls_agree() -> None:
    sampler = FlowSampler(SamplerConfig("unipc"))
    noise = {"x": randn(64, 5).to(torch.bfloat16)}
    calls: list = []
    first = sampler.sample(field({"x": (1.0, 0.0)}, calls), noise)["x"]
    assert first.dtype == torch.bfloat16
    assert calls[0][0]["x"].dtype == torch.float32  # the solver state stays float32
    assert (first.float() - 1.0).abs().max().item() < 1e-2
    # Each call starts from fresh scheduler state.
    assert torch.equal(first, sampler.sample(field({"x": (1.0, 0.0)}), noise)["x"])


@pytest.mark.parametrize("name", ["unipc", "dpmpp", "ddim"])
def test_shift_is_honoured(name: str) -> None:
    for n in (4, 10, 30):
        unshifted = FlowSampler(SamplerConfig(name, n, shift=1.0)).sigmas
        shifted = FlowSampler(SamplerConfig(name, n, shift=5.0)).sigmas
        assert (shifted - unshifted).abs().max().item() > 0.1
        for shift, sigmas in [(1.0, unshifted), (5.0, shifted)]:
            reference = FlowSampler(SamplerConfig("flow_euler", n, shift=shift)).sigmas
            # UniPC/DPM++ build their grid slightly differently (1e-3 before shifting).
            torch.testing.assert_close(sigmas, reference, rtol=0, atol=5e-3)
            u = torch.linspace(1.0, 0.0, n + 1)[:-1]
            torch.testing.assert_close(sigmas, shift * u / (1 + (shift - 1) * u), rtol=0, atol=5e-3)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown sampler 'heun'") as err:
        SamplerConfig(name="heun")
    assert all(name in str(err.value) for name in SAMPLERS)
    with pytest.raises(ValueError, match="num_inference_steps must be an int >= 1"):
        SamplerConfig(num_inference_steps=0)
    with pytest.raises(ValueError, match="shift must be > 0"):
        SamplerConfig(shift=0.0)


def test_bad_inputs() -> None:
    sampler = FlowSampler(SamplerConfig("flow_euler", 2))
    with pytest.raises(ValueError, match="ndim >= 2"):
        sampler.sample(field({"x": (0.0, 1.0)}), {"x": randn(8)})
    with pytest.raises(KeyError, match="no velocity for \\['action'\\]"):
        noise = {"x": randn(8, 2), "action": randn(8, 2)}
        sampler.sample(lambda latents, sigma: {"x": latents["x"]}, noise)
