"""temper.monitor"""
