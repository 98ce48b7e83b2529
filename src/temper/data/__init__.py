"""temper.data"""
