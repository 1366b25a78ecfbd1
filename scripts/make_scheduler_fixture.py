#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/schedulers.json: diffusers' flow-matching schedulers, as Wan uses
them, on a few configurations.

Needs torch and diffusers==0.42.1:
    python3 scripts/make_scheduler_fixture.py [--out tests/fixtures/diffusion/schedulers.json]

For each case: the scheduler config (as scheduler_config.json would hold it), the number of
inference steps, diffusers' timesteps and sigmas after set_timesteps, and a full run of step() on a
small latent: the starting sample, the model output fed at each step (seeded random numbers, not a
model) and the sample step() returned. Values are the exact float32 numbers (timesteps as diffusers
hands them to the transformer: int64 for UniPC, float32 for Euler).
"""
import argparse
import json

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

# Wan 2.1's scheduler_config.json (diffusers layout), the 480p flow shift.
WAN_UNIPC = {
    "num_train_timesteps": 1000, "solver_order": 2, "prediction_type": "flow_prediction",
    "predict_x0": True, "solver_type": "bh2", "lower_order_final": True, "use_flow_sigmas": True,
    "flow_shift": 3.0, "final_sigmas_type": "zero", "timestep_spacing": "linspace",
}

CASES = [
    ("unipc_wan480_10", UniPCMultistepScheduler, WAN_UNIPC, 10),
    ("unipc_shift5_7", UniPCMultistepScheduler, {**WAN_UNIPC, "flow_shift": 5.0}, 7),
    ("unipc_order3_8", UniPCMultistepScheduler, {**WAN_UNIPC, "solver_order": 3}, 8),
    # bh1 only with a non-zero last sigma: with sigma 0 its last step is 0 * inf, NaN in diffusers too.
    ("unipc_bh1_no_lower_final_corrector_off_6", UniPCMultistepScheduler,
     {**WAN_UNIPC, "solver_type": "bh1", "lower_order_final": False, "disable_corrector": [1, 3],
      "final_sigmas_type": "sigma_min"}, 6),
    ("unipc_shift1_1", UniPCMultistepScheduler, {**WAN_UNIPC, "flow_shift": 1.0}, 1),
    ("euler_shift3_10", FlowMatchEulerDiscreteScheduler, {"num_train_timesteps": 1000, "shift": 3.0}, 10),
    ("euler_shift5_50", FlowMatchEulerDiscreteScheduler, {"num_train_timesteps": 1000, "shift": 5.0}, 50),
    ("euler_shift1_1", FlowMatchEulerDiscreteScheduler, {"num_train_timesteps": 1000, "shift": 1.0}, 1),
]

LATENT_SHAPE = (1, 4, 2, 3, 2)


def floats(tensor):
    return [float(v) for v in tensor.flatten().tolist()]


def run_case(name, scheduler_class, config, steps, seed):
    scheduler = scheduler_class(**config)
    scheduler.set_timesteps(steps)
    scheduler.set_begin_index(0)
    generator = torch.Generator().manual_seed(seed)
    sample = torch.randn(LATENT_SHAPE, generator=generator, dtype=torch.float32)
    initial = sample.clone()
    model_outputs, samples = [], []
    for t in scheduler.timesteps:
        model_output = torch.randn(LATENT_SHAPE, generator=generator, dtype=torch.float32)
        sample = scheduler.step(model_output, t, sample, return_dict=False)[0]
        model_outputs.append(floats(model_output))
        samples.append(floats(sample))
    return {
        "name": name,
        "class_name": scheduler_class.__name__,
        "config": config,
        "num_inference_steps": steps,
        "timesteps": [float(t) for t in scheduler.timesteps.tolist()],
        "sigmas": floats(scheduler.sigmas.to(torch.float32)),
        "shape": list(LATENT_SHAPE),
        "initial_sample": floats(initial),
        "model_outputs": model_outputs,
        "samples": samples,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/diffusion/schedulers.json")
    args = parser.parse_args()
    if diffusers.__version__ != "0.42.1":
        raise SystemExit(f"diffusers 0.42.1 expected, found {diffusers.__version__}")
    cases = [run_case(*case, seed=index) for index, case in enumerate(CASES)]
    with open(args.out, "w") as f:
        json.dump({"diffusers_version": diffusers.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
