"""A Python policy for LIBERO, built by make_policy(device) in each model worker (EVALUATION.policy=module:make_policy).

It lifts the end effector to a fixed height with the gripper open: no task succeeds, but it reads and
writes every number in LIBERO's units. Replace predict's body with your model.
"""

import numpy as np

TARGET_Z = 1.25  # metres, world frame (the table top is at about 0.9)


class LiftPolicy:
    action_horizon = 8  # actions per call: the env runs all 8, then asks again

    def __init__(self, device: str):
        self.device = device  # "cpu", or "cuda:0" with MULTIRUN.num_gpus=1: build and move your model here

    def predict(self, obs, noise_seeds=None):
        # obs is a batch: one row per env whose chunk ran out (B rows, each from its own episode)
        #   obs["pixels"]["agentview"]           (B, 128, 128, 3) uint8, upright: the table from the front
        #   obs["pixels"]["robot0_eye_in_hand"]  (B, 128, 128, 3) uint8, upright: the wrist camera
        #   obs["state"]        (B, 8) float32: end-effector xyz (m), its orientation as axis-angle (rad),
        #                       the two finger joints (m; about +-0.04 open, 0 closed)
        #   obs["instruction"]  B strings: the task's instruction, as in its BDDL file
        #                       ("pick up the black bowl between the plate and the ramekin and place it on the plate")
        # noise_seeds: B ints, one per row (seed your sampler with them), or None; this policy samples nothing.
        state = np.asarray(obs["state"], np.float32)
        batch = len(obs["instruction"])
        actions = np.zeros((batch, self.action_horizon, 7), np.float32)
        # LIBERO's OSC_POSE deltas in [-1, 1]: xyz (1 asks for 5 cm in one step), rotation (1: 0.5 rad), gripper
        up = np.clip((TARGET_Z - state[:, 2]) / 0.05, -1.0, 1.0)  # the rest of the way, at most 5 cm a step
        actions[:, :, 2] = up[:, None]  # the same each step of the chunk; the arm gets there in a chunk or two
        actions[:, :, 6] = -1.0  # gripper: -1 opens, +1 closes
        return {"actions": actions}  # (B, action_horizon, 7); or the array itself


def make_policy(device: str) -> LiftPolicy:
    return LiftPolicy(device)
