"""temper.sandbox"""
