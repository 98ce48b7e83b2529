"""temper.trainer"""
