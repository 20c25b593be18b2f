"""python -m wam_gym.world_model: see wam_gym/world_model/evaluate.py."""

from wam_gym.world_model.evaluate import main

if __name__ == "__main__":
    main()
