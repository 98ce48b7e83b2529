"""temper.envs"""
